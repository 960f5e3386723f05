# A move rolled back while its destination is out of reach (issue 35,
# review DL-7 and "two owners after a rollback"). The switch at the
# coordinator is held by a session locking the shard's row of
# sharding.shards (the move waits in its cutover with the source frozen;
# sharding.move_freeze_timeout is raised so that it waits); the destination
# is then stopped and the move cancelled. The undo cannot ask the
# destination whether the switch happened there (a coordinator restored from
# a backup that missed it, or crashed after the destination took the
# shard), so:
#   - the source stays frozen (its writes of the shard refused with 55000)
#     and the journal row stays unresolved, also through _move_recover
#     while the destination is down;
#   - once the destination answers, recovery rolls the move back: every
#     row of the shard exactly once, at the source, which writes again,
#     and nothing of the move is left.
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
my $sum = shard_sum($a, 'n1', $S);
my ($t) = shard_tenants($coord, $S);
my $live = "phase NOT IN ('queued', 'done', 'failed', 'cancelled')";

# A write of the shard at the source: 'ok' or its SQLSTATE.
my $id = 900000;
sub write_src
{
	$id++;
	my ($rc, $out, $err) = $a->psql('n1', "\\set VERBOSITY verbose\nINSERT INTO accounts VALUES ('$t', $id, 'w')");
	return 'ok' if $rc == 0;
	return $err =~ /ERROR:  (\w{5}): .*frozen/ ? "$1 frozen" : $err;
}

# The switch held: the shard's row at the coordinator locked.
my $hold = hold_switch($coord, $S);
my $mv = psql_bg($coord, 'coord', "SET sharding.move_freeze_timeout = '10min'; SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(switch_waits($coord), 'the move waits in its cutover for the switch');
is($a->safe_psql('n1', "SELECT count(*) FROM sharding.frozen_shards WHERE map = 'bank' AND logical = $S"), '1',
	'the source is frozen');
my $move = $coord->safe_psql('coord', "SELECT move FROM sharding.move_journal WHERE map = 'bank' AND logical = $S AND $live");

# The destination goes away; the move is cancelled.
$b->stop('immediate');
$coord->safe_psql('coord', "SELECT sharding._move_cancel($move)");
$mv->{h}->finish;
like(${ $mv->{err} }, qr/ERROR:  canceling statement/, 'the move is cancelled') or diag(${ $mv->{err} });
release_switch($coord, $hold);

is(write_src(), '55000 frozen', 'destination out of reach: the source still refuses writes of the shard (55000)');
is($coord->safe_psql('coord', "SELECT phase || '|' || undone FROM sharding.move_journal WHERE move = $move"),
	'cutover|false', 'the journal row stays unresolved');
my ($rc, $out, $err) = $coord->psql('coord', 'SELECT sharding._move_recover()');
is($out, '0', '_move_recover resolves nothing while the destination is down') or diag($err);
is(write_src(), '55000 frozen', 'after _move_recover: the source still refuses writes of the shard');
is($a->safe_psql('n1', "SELECT count(*) FROM sharding.frozen_shards WHERE map = 'bank' AND logical = $S"), '1',
	'the source stays frozen');

# The destination answers again: the rollback completes (by the launcher,
# preloaded, or by this call).
$b->start;
ok(wait_for_sql($coord, 'coord', "SELECT sharding._move_recover() >= 0 AND NOT EXISTS (SELECT FROM sharding.move_journal "
	  . "WHERE move = $move AND $live)", 't', 120), 'once the destination answers, the move is resolved');
is($coord->safe_psql('coord', "SELECT phase || '|' || undone FROM sharding.move_journal WHERE move = $move"),
	'failed|true', 'the move is rolled back');
is(shard_sum($a, 'n1', $S) . ' ' . shard_rows($b, 'n2', $S), "$sum 0", 'every row of the shard exactly once, at the source');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1', 'n1 owns the shard');
is(write_src(), 'ok', 'the source writes the shard again');
is(leftovers($coord, $a, $b), $clean, 'nothing of the move is left');

done_testing();
