# move_progress.time_left from the copy's measured rate (docs/rebalance.md;
# issue 38): a shard of two tables (accounts, then events, the
# copy's order) is moved with no finished move in the journal (no history).
#   - A session at the destination holds accounts in SHARE mode: the move
#     waits in its copy phase (the delete of leftovers there, before any
#     row is copied): the rate is unknown, time_left is NULL.
#   - Released, with another session there holding the key of events'
#     first row (an uncommitted insert): accounts is copied, the copy of
#     events waits on that key. time_left is then the time the rows still
#     to copy take at the rate measured since the copy started: at least
#     1 s, at most twice the time the phase has run plus 2 s (fewer rows are
#     left than were copied).
#   - rows_expected, estimated at the source when the copy starts: within
#     20% of the rows to copy (accounts, about 3,000 blocks, from a sample of
#     256 of them, the move's DEBUG1 line says; events, under 256 blocks,
#     counted). Before the fix of the blocks' query a plain table's size
#     read as none and it was counted whole, one more scan of it.
# Before: time_left was NULL all along (no finished move to learn from).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
my $events = 'CREATE TABLE events (tenant text NOT NULL, id bigint NOT NULL, note text, PRIMARY KEY (tenant, id));';
$_->[0]->safe_psql($_->[1], $events) for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
$coord->safe_psql('coord', "SELECT sharding.distribute('events', 'tenant', 'bank')");
wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables", '2') for ([$a, 'n1'], [$b, 'n2']);

my $S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my @tenants = shard_tenants($coord, $S);
my $mine = join(',', map { "'$_'" } @tenants);
# accounts: 200,000 rows of n1's shards' tenants, about 3,000 blocks (the
# shard's rows among the others'); events: 20,000 of the shard's.
my $n1_tenants = $coord->safe_psql('coord',
	"SELECT string_agg(quote_literal(t), ',') FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) s "
	  . "WHERE sharding.node_for('bank', t) = 'n1'");
$a->safe_psql('n1', qq{
	INSERT INTO accounts SELECT (ARRAY[$n1_tenants])[1 + i % cardinality(ARRAY[$n1_tenants])], i, repeat('x', 80) || i
	  FROM generate_series(1, 200000) i;
	INSERT INTO events SELECT (ARRAY[$mine])[1 + i % cardinality(ARRAY[$mine])], i, repeat('e', 20) || i
	  FROM generate_series(1, 20000) i;
	VACUUM ANALYZE accounts, events;
});
my $acc = shard_rows($a, 'n1', $S);
my $total = $acc + 20000;
ok($acc > 10000, "shard $S holds $acc rows of accounts and 20,000 of events on n1");
is($a->safe_psql('n1', "SELECT pg_relation_size('accounts') / 8192 > 1000 AND pg_relation_size('events') / 8192 < 256"), 't',
	'accounts is sampled (over 256 blocks), events counted');
is($coord->safe_psql('coord', "SELECT count(*) FROM sharding.move_journal WHERE phase = 'done'"), '0', 'no finished move: no history');

my $lock = psql_bg($b, 'n2', "BEGIN; LOCK accounts IN SHARE MODE; SELECT pg_sleep(600)");
my $first_key = $a->safe_psql('n1', "SELECT tenant || '|' || id FROM events ORDER BY id LIMIT 1");
my ($kt, $ki) = split /\|/, $first_key;
my $row = psql_bg($b, 'n2', "BEGIN; SET session_replication_role = replica; "
	  . "INSERT INTO events VALUES ('$kt', $ki, 'holder'); SELECT pg_sleep(600)");
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%SELECT pg_sleep(600)' AND wait_event = 'PgSleep' "
	  . "AND pid <> pg_backend_pid()", '2', 60), 'n2: accounts held in SHARE mode, the key of events\' first row held');
my $progress = "SELECT coalesce(time_left::text, 'NULL') || '|' || rows_copied FROM sharding.move_progress WHERE logical = $S AND phase = 'copying'";

my $mv = psql_bg($coord, 'coord', "SET client_min_messages = debug1; SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE NOT l.granted AND c.relname = 'accounts'",
	'1', 120), 'the move waits for accounts at n2');
sleep 1;    # a progress tick or more
is($coord->safe_psql('coord', $progress), 'NULL|0', 'while it waits in its copy phase, nothing copied: time_left is NULL');

$b->safe_psql('n2', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%LOCK accounts IN SHARE MODE%' AND pid <> pg_backend_pid()");
$lock->{h}->finish;
ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted", 't', 120),
	'the copy of events waits for the held key');
ok(wait_for_sql($coord, 'coord', "SELECT rows_copied >= $acc FROM sharding.move_journal WHERE logical = $S", 't', 60),
	"the journal has accounts copied ($acc rows)");
sleep 1;
my ($left, $elapsed, $copied) = split /\|/, $coord->safe_psql('coord',
	"SELECT coalesce(extract(epoch FROM p.time_left)::text, '') || '|' || extract(epoch FROM clock_timestamp() - p.phase_started) "
	  . "|| '|' || p.rows_copied FROM sharding.move_progress p WHERE p.logical = $S AND p.phase = 'copying'");
ok(defined $left && $left ne '' && $left >= 1, "while events waits: time_left is at least 1 s (${\($left // 'none')} s)");
ok(defined $left && $left ne '' && $left <= 2 * $elapsed + 2,
	"and at most twice the time the copying phase has run plus 2 s (${\($left // 'none')} s; copying for ${elapsed} s, $copied of $total rows copied)");
diag("time_left ${\($left // 'NULL')} s after ${elapsed} s of copying, $copied of $total rows copied");
my $expected = $coord->safe_psql('coord', "SELECT rows_expected FROM sharding.move_journal WHERE logical = $S");
ok($expected ne '' && $expected >= 0.8 * $total && $expected <= 1.2 * $total,
	"rows_expected $expected: within 20% of the rows to copy ($total)");

$b->safe_psql('n2', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%''holder''); SELECT pg_sleep(600)' AND pid <> pg_backend_pid()");
$row->{h}->finish;
$mv->{h}->finish;
unlike(${ $mv->{err} }, qr/^ERROR:/m, 'the move succeeded');
like(${ $mv->{err} }, qr/rows expected from public\.accounts: \d+ \(a sample of about 256 of \d+ blocks\)/,
	'accounts: estimated from a sample (not scanned whole)');
like(${ $mv->{err} }, qr/rows expected from public\.events: 20000 \(counted, \d+ blocks\)/, 'events: counted');
is($coord->safe_psql('coord', "SELECT phase || '|' || rows_copied FROM sharding.move_journal WHERE logical = $S"),
	"done|$total", 'the journal says done with every row copied');
is(shard_rows($a, 'n1', $S) . '|' . shard_rows($b, 'n2', $S), "0|$acc", 'the shard moved');

done_testing();
