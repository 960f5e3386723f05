# Moves of a shard-partitioned table (docs/partitions.md; issue 38): table
# parts is PARTITION BY HASH (tenant sharding.text_shard_ops) with
# create_partitions(parts, 8) at every node, distributed on map bank (8
# shards) beside the plain accounts: leaf parts_<L> holds exactly logical
# shard L. A move of shard L copies parts_<L> alone at the source (COPY of
# the leaf, no condition, no other leaf read) and, once switched and
# verified, truncates it there (new storage) instead of deleting its rows.
#   1. under writers (on accounts, moving with it), two shards of n1 at
#      once, the second one's cutover held until the first has truncated
#      its leaf (its check that nobody truncated its tables must not take
#      that TRUNCATE for a user's): every row
#      where node_for says, the leaf empty at the source with new storage,
#      every parts row at the destination;
#   2. kill -9 of the caller while the source's TRUNCATE is held (a BEFORE
#      TRUNCATE trigger waiting for an advisory lock): nothing committed
#      at the source, _move_recover finishes the move by truncating, every
#      row at the destination, nothing left.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 100);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my @tenants = map { sprintf('t%02d', $_) } 0 .. 63;
load_parts($coord, $a, $b);
my $psum = sub { $_[0]->safe_psql($_[1], "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $_[2], 'parts')") };
my $filenode = sub { $_[0]->safe_psql($_[1], "SELECT pg_relation_filenode('parts_$_[2]')") };
my $owned = sub { $coord->safe_psql('coord', "SELECT string_agg(logical::text, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank' AND node = '$_[0]'") };

# 1. Two shards of n1 move to n2 at once, under writers.
my ($S1, $S2) = split / /, $owned->('n1');
my %want = map { $_ => $psum->($a, 'n1', $_) } ($S1, $S2);
my %node0 = map { $_ => $filenode->($a, 'n1', $_) } ($S1, $S2);
ok((split m{/}, $want{$S1})[0] > 0, "shard $S1 has rows of parts at n1 ($want{$S1})");
my $log_at = -s $a->logfile;
my $dlog_at = -s $b->logfile;
my $ws = start_writers($coord, 3, \@tenants);
sleep 1;
# The second move's cutover held (a session at n1 holds its shard's share
# lock: sharding.fence, no transaction id, so no slot waits for it) until
# the first move has truncated its leaf: the second move's check that its
# tables kept their storage runs after that TRUNCATE.
my $gate = $a->background_psql('n1', on_error_stop => 1);
$gate->query_safe('BEGIN');
$gate->query_safe("SELECT sharding.fence('bank', $S2, sharding.epoch('bank', $S2))");
# (A minute per attempt to freeze: the hold lasts as long as the first move.)
my @mv = map { psql_bg($coord, 'coord', "SET sharding.move_freeze_timeout = 60000; SELECT sharding.move_shard_online('bank', $_, 'n2')") } ($S1, $S2);
$mv[0]->{h}->finish;
isnt($filenode->($a, 'n1', $S1), $node0{$S1}, "the move of shard $S1 has returned: its leaf at n1 truncated");
like($coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE logical = $S2 ORDER BY move DESC LIMIT 1"),
	qr/^(copying|catching_up|cutover)$/, "the move of shard $S2 has not switched meanwhile (held at its freeze)");
$gate->query_safe('COMMIT');
$gate->quit;
$mv[1]->{h}->finish;
is(join(' | ', map { ${ $_->{err} } } @mv), ' | ', 'both moves returned without error (the second did not take the first one\'s TRUNCATE for a user\'s)');
sleep 1;
writers_kept($coord, $a, $b, $ws, 'two moves under writers: ');
for my $s ($S1, $S2)
{
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $s"), 'n2', "shard $s is n2's");
	is($psum->($b, 'n2', $s), $want{$s}, "shard $s: n2 has every row of parts (count/checksum)");
	is($a->safe_psql('n1', "SELECT count(*) FROM parts_$s"), '0', "shard $s: its leaf at n1 is empty");
	isnt($filenode->($a, 'n1', $s), $node0{$s}, "shard $s: its leaf at n1 was truncated (new storage), not deleted row by row");
	ok($a->log_contains(qr/COPY \(SELECT [^)]* FROM public\.parts_$s\) TO STDOUT/, $log_at),
		"shard $s: the copy read leaf parts_$s alone at the source");
	ok($b->log_contains(qr/sharding\._move_pull\('n1', '[^']*', 'public\.parts_$s'/, $dlog_at),
		"shard $s: and wrote into leaf parts_$s at the destination");
}
is($a->safe_psql('n1', "SELECT count(*) FROM parts WHERE sharding.node_for('bank', tenant) <> 'n1'"), '0',
	'n1 holds no parts row of a shard it does not own');
is(leftovers($coord, $a, $b), $clean, 'nothing of the moves is left');

# 2. kill -9 of the caller while the source's TRUNCATE is held.
my $S = (split / /, $owned->('n1'))[0];
my $want = $psum->($a, 'n1', $S);
my $acc = shard_sum($a, 'n1', $S);
my $node = $filenode->($a, 'n1', $S);
$a->safe_psql('n1', "CREATE FUNCTION hold_truncate() RETURNS trigger LANGUAGE plpgsql AS
                       \$\$ BEGIN PERFORM pg_advisory_lock(4242); PERFORM pg_advisory_unlock(4242); RETURN NULL; END \$\$;
                     CREATE TRIGGER hold_truncate BEFORE TRUNCATE ON parts_$S FOR EACH STATEMENT EXECUTE FUNCTION hold_truncate();
                     ALTER TABLE parts_$S ENABLE ALWAYS TRIGGER hold_truncate;");
my $holder = $a->background_psql('n1', on_error_stop => 1);
$holder->query_safe('SELECT pg_advisory_lock(4242)');
my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query = 'TRUNCATE public.parts_$S' AND wait_event_type = 'Lock'", '1', 120),
	'kill -9: the TRUNCATE of the leaf at the source waits (held by the test)');
is($coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1"), 'cleanup',
	'kill -9: the move has switched (journal cleanup)');
my $orphan = $a->safe_psql('n1', "SELECT pid FROM pg_stat_activity WHERE query = 'TRUNCATE public.parts_$S'");
kill 'KILL', mover_pid($coord);
$mv->{h}->finish;
wait_for_restart($coord);
$holder->quit;
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE pid = $orphan", '0', 60),
	'kill -9: the orphaned TRUNCATE at the source has ended');
$a->safe_psql('n1', "DROP TRIGGER hold_truncate ON parts_$S");
$coord->safe_psql('coord', 'SELECT sharding._move_recover()');
ok(wait_for_sql($coord, 'coord', "SELECT phase FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1", 'done', 60),
	'kill -9: the next call finishes the move');
is($psum->($b, 'n2', $S), $want, 'kill -9: n2 has every row of parts of the shard');
is(shard_sum($b, 'n2', $S), $acc, 'kill -9: and every row of accounts');
is($a->safe_psql('n1', "SELECT count(*) FROM parts_$S"), '0', 'kill -9: the leaf at n1 is empty');
isnt($filenode->($a, 'n1', $S), $node, 'kill -9: truncated (new storage)');
is(shard_rows($a, 'n1', $S), '0', 'kill -9: n1 holds no accounts row of the shard');
is($coord->safe_psql('coord', "SELECT rows_moved FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1"),
	(split m{/}, $want)[0] + (split m{/}, $acc)[0], 'kill -9: the journal counts every row removed at the source');
is(leftovers($coord, $a, $b), $clean, 'kill -9: nothing of the move is left');

done_testing();
