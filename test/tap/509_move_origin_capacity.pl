# Origin states at the source (review RB-9, issue 35): an origin set up or
# advanced takes one of max_replication_slots origin states
# (max_active_replication_origins from PostgreSQL 18) until it is dropped.
# A move's delete at the source after its switch runs under origins, one per
# part (up to sharding.move_parallel). Before, a source without a free
# state had the move switch and then fail its delete: "moved, but finishing
# failed", the source keeping a stale copy of the shard and the journal row
# live. Now:
#   1. no free state at the source when the move starts: refused (53400)
#      before anything changes, nothing left, every row where it was;
#   2. the states taken while the move copies: the move fails at its
#      cutover (53400), before the switch, rolled back, nothing left;
#   3. states freed: the move succeeds, every row at the destination, and
#      no origin of it is left;
#   4. a rebalance job (drain of n1) with no free state at n1: its moves
#      wait, saying why ("no free replication origin state"), none starts
#      or fails; with states free again the job ends done.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 50);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my $S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $want = shard_sum($a, 'n1', $S);
my $free = "SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_origin_status)";
# take_all(): origins filler_<i> at n1, each advanced (holding a state),
# until no state is free.
my $take_all = q{DO $$ BEGIN
	FOR i IN 1 .. 100 LOOP
	    BEGIN
	        PERFORM pg_replication_origin_create('filler_' || i)
	          WHERE NOT EXISTS (SELECT FROM pg_replication_origin WHERE roname = 'filler_' || i);
	        PERFORM pg_replication_origin_advance('filler_' || i, '0/1');
	    EXCEPTION WHEN configuration_limit_exceeded THEN
	        EXIT;
	    END;
	END LOOP; END $$};
my $origins = "SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'sharding_move%'";
# where(what): the shard n1's with every row, none at n2, nothing left.
sub unmoved
{
	my $what = shift;
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1', "$what: the shard is still n1's");
	is(shard_sum($a, 'n1', $S), $want, "$what: n1 has every row of the shard");
	is(shard_rows($b, 'n2', $S), '0', "$what: n2 has none");
	is(leftovers($coord, $a, $b), $clean, "$what: nothing of the move is left");
	is($a->safe_psql('n1', $origins) . '/' . $b->safe_psql('n2', $origins), '0/0', "$what: no origin of the move is left");
}

# 1. No free state when the move starts.
$a->safe_psql('n1', $take_all);
is($a->safe_psql('n1', $free), '0', 'no free origin state at n1');
my ($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding.move_shard_online('bank', $S, 'n2')");
like($err, qr/ERROR:\s+53400: node "n1" has 0 free replication origin states/, 'no free state: the move is refused with 53400');
unlike($err, qr/moved to|finishing failed/, 'no free state: before its switch');
unmoved('no free state');
$a->safe_psql('n1', "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname LIKE 'filler_%'");

# 2. The states taken while the move copies (held at the destination).
my ($ht, $hid) = split /\|/, $a->safe_psql('n1',
	"SELECT tenant || '|' || id FROM accounts WHERE sharding.logical_shard('bank', tenant) = $S ORDER BY id DESC LIMIT 1");
my $hold = hold_row($b, 'n2', $ht, $hid);
my ($mout, $merr) = ('', '');
my $mv = { out => \$mout, err => \$merr };
$mv->{h} = IPC::Run::start([ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $coord->connstr('coord'), '-c',
		"SELECT sharding.move_shard_online('bank', $S, 'n2')" ], '>', \$mout, '2>', \$merr);
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT sharding._move_pull(%' AND wait_event_type = 'Lock'", '1', 120),
	'taken meanwhile: the copy waits for the held key');
$a->safe_psql('n1', $take_all);
is($a->safe_psql('n1', $free), '0', 'taken meanwhile: no free origin state at n1');
release_row($b, 'n2', $hold);
$mv->{h}->finish;
like($merr, qr/ERROR:\s+53400: node "n1" has no free replication origin state/, 'taken meanwhile: the move fails with 53400');
unlike($merr, qr/moved to|finishing failed/, 'taken meanwhile: before its switch');
unmoved('taken meanwhile');
$a->safe_psql('n1', "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname LIKE 'filler_%'");

# 3. Free states: the move succeeds.
($rc, $out, $err) = $coord->psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
is($err, '', 'freed: the move succeeds');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n2', 'freed: the shard is n2\'s');
is(shard_sum($b, 'n2', $S), $want, 'freed: n2 has every row of the shard');
is(shard_rows($a, 'n1', $S), '0', 'freed: n1 has none');
is(leftovers($coord, $a, $b), $clean, 'freed: nothing of the move is left');
is($a->safe_psql('n1', $origins) . '/' . $b->safe_psql('n2', $origins), '0/0', 'freed: no origin of the move is left');

# 4. A job (drain of n1) with no free state at n1: its moves wait, saying
# why, and the job does not fail; once states are free it ends done.
$a->safe_psql('n1', $take_all);
my $job = $coord->safe_psql('coord', "SELECT sharding.drain_node('bank', 'n1')");
ok(wait_for_sql($coord, 'coord', "SELECT count(*) > 0 FROM sharding.move_progress WHERE job = $job AND waiting LIKE '%no free replication origin state%'",
	't', 60), 'job: its move waits: "source n1 has no free replication origin state"');
is($coord->safe_psql('coord', "SELECT count(*) FROM sharding.move_journal WHERE job = $job AND phase NOT IN ('queued', 'done')"), '0',
	'job: no move of it has started, none failed');
$a->safe_psql('n1', "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname LIKE 'filler_%'");
is($coord->safe_psql('coord', "SELECT sharding.rebalance_wait($job, '180 s')"), 'done', 'job: with states free, it ends done');
is($coord->safe_psql('coord', "SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'"), '0', 'job: n1 owns nothing');
is($a->safe_psql('n1', 'SELECT count(*) FROM accounts'), '0', 'job: n1 holds no row');
is($b->safe_psql('n2', 'SELECT count(*)::text FROM accounts'), $coord->safe_psql('coord', 'SELECT count(*) FROM oplog'),
	'job: n2 holds every row');
is(leftovers($coord, $a, $b), $clean, 'job: nothing of the moves is left');
is($a->safe_psql('n1', $origins) . '/' . $b->safe_psql('n2', $origins), '0/0', 'job: no origin of the moves is left');

done_testing();
