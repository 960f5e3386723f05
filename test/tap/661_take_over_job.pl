# The coordinator fails over with a rebalance job in flight (docs/nodes.md,
# "Failover of the coordinator"; CONTRACT 15.3): c1 runs a job moving two
# shards of map m (n1, n2) to n3; its first move is held in its copy (a
# session at n3 holds a lock the copy waits for) when c1 is killed. Its
# standby c2 is promoted: until take_over, its jobs launcher leaves moves
# and jobs alone. take_over rolls the interrupted move back (its switch was
# not seen at the destination) and the job goes on by itself: it ends done,
# every planned shard moved once, every row where node_for says, none lost.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my @nodes = qw(n1 n2 n3);
my $c1 = sharding_node('c1', db => 'coord', conf => "wal_retrieve_retry_interval = 200ms\nwal_keep_size = '256MB'");
my $d = sharding_node('d', db => 'postgres', conf => 'wal_retrieve_retry_interval = 200ms');
my %dsn = map { $_ => sharding_dsn($d, $_) } @nodes;
sub n { my ($n, $sql, %o) = @_; return sharding_q($d, $n, $sql, %o); }
sub q1 { my ($sql, %o) = @_; return sharding_q($c1, 'coord', $sql, %o); }
my $c2;
sub q2 { my ($sql, %o) = @_; return sharding_q($c2, 'coord', $sql, %o); }

for my $n (@nodes)
{
	n('postgres', "CREATE DATABASE $n");
	n($n, 'CREATE EXTENSION sharding; CREATE TABLE docs (k text PRIMARY KEY, v integer)');
}
$c1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($c1, 'coord') . "'");
is( (split /\n/, q1(<<"SQL"))[-1],
CREATE TABLE docs (k text PRIMARY KEY, v integer);
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}'), sharding.add_node('n3', '$dsn{n3}');
SELECT sharding.create_map('m', 6, ARRAY['n1', 'n2']);
SELECT sharding.distribute('docs', 'k', 'm');
SELECT sharding.attach_node('n1'), sharding.attach_node('n2'), sharding.attach_node('n3');
SELECT 'configured';
SQL
	'configured', 'c1: map m over n1 and n2, three nodes attached');
# 3000 rows, each at its owner.
for my $n (qw(n1 n2))
{
	n($n, "INSERT INTO docs SELECT 'key-' || i, i FROM generate_series(1, 3000) AS i WHERE sharding.node_for('m', 'key-' || i) = '$n'");
}
my $rows = q{SELECT count(*) || '/' || coalesce(sum(v), 0) FROM docs};
sub total
{
	my ($count, $sum) = (0, 0);
	for my $n (@nodes) { my ($c, $s) = split m{/}, n($n, $rows); $count += $c; $sum += $s; }
	return "$count/$sum";
}
is(total(), '3000/4501500', '3000 rows on n1 and n2');

$c2 = sharding_standby($c1, 'c2', 'base');

# The job, its first move held in its copy at n3.
my $hold = sharding_start($d, 'n3', 'BEGIN; LOCK docs IN SHARE MODE; SELECT pg_sleep(600)', on_error_stop => 0);
sleep 1;
my $job = q1(q{SELECT sharding.rebalance_start('m', ARRAY['n1', 'n2', 'n3'])});
like($job, qr/^\d+$/, "c1 started rebalance job $job");
my $planned = q1("SELECT string_agg(logical::text, ',' ORDER BY logical) FROM sharding.move_journal WHERE job = $job");
my $t0 = time;
my $copying;
while (time - $t0 < 60)
{
	$copying = q1("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND phase = 'copying'");
	last if $copying eq '1';
	usleep(100_000);
}
is($copying, '1', "a move of the job (planned: shards $planned) is copying, held at n3");
$c1->wait_for_catchup($c2, 'replay', $c1->lsn('insert'));

$c1->stop('immediate');
$c2->promote;
$c2->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($c2, 'coord') . "'");
# Before take_over the launcher leaves the job alone.
my $waited = 0;
for (1 .. 100)
{
	$waited = 1, last if slurp_file($c2->logfile) =~ /moves and jobs wait for sharding.take_over\(\)/;
	usleep(100_000);
}
ok($waited, "c2's jobs launcher waits for take_over before it touches moves and jobs");
is(q2("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND phase = 'copying'"), '1',
	'... the interrupted move is still in its copy on c2');
n('n3', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query = 'SELECT pg_sleep(600)'");
$hold->{h}->finish;

my $took = q2('SELECT sharding.take_over()', stderr => 1);
like($took, qr/^3\n/, 'take_over() on c2: 3 nodes follow it') or diag($took);

my $state;
$t0 = time;
while (time - $t0 < 180)
{
	$state = q2("SELECT state FROM sharding.move_jobs WHERE job = $job");
	last if $state =~ /^(done|failed|cancelled)$/;
	usleep(250_000);
}
my $secs = time - $t0;
is($state, 'done', sprintf('the job continued by itself and ended done (%.1f s after take_over)', $secs))
	or diag(q2("SELECT move, logical, phase, error FROM sharding.move_journal WHERE job = $job ORDER BY move")
		. "\n" . q2("SELECT error FROM sharding.move_jobs WHERE job = $job"));
is(q2("SELECT string_agg(logical::text, ',' ORDER BY logical) FROM sharding.move_journal WHERE job = $job AND phase = 'done'"),
	$planned, "every planned move done once (shards $planned)");
diag(sprintf('figures: the job ended done %.1f s after take_over; its moves (move:shard:phase): %s', $secs,
	q2("SELECT string_agg(move || ':' || logical || ':' || phase, ' ' ORDER BY move) FROM sharding.move_journal WHERE job = $job")));
is(join(' ', map { n($_, "SELECT count(*) FILTER (WHERE sharding.node_for('m', k) IS DISTINCT FROM '$_') FROM docs") } @nodes), '0 0 0',
	'every row is where node_for says');
is(total(), '3000/4501500', 'no row lost, none doubled');
is(join(' ', map { n($_, "SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move_%'")
	. n($_, "SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move_%'")
	. n($_, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move_%'") } @nodes), '000 000 000',
	'nothing of any move is left at the nodes');
my $config = q{SELECT string_agg(map || '/' || logical || '/' || node || '/' || epoch, ',' ORDER BY map, logical) FROM sharding.shards};
is(join(' ', map { n($_, $config) eq q2($config) ? 'same' : 'differs' } @nodes), 'same same same', "every node's shards equal c2's");


# ---------------------------------------------------------------- after the switch
# c2 fails over in turn, to its own standby c3, while a move it runs is past
# its switch: the move's delete at the source waits for a row lock held
# there. take_over on c3 finishes the move (the destination sees the
# switch), never undoes it.
my $c3 = sharding_standby($c2, 'c3', 'base2');
sub q3 { my ($sql, %o) = @_; return sharding_q($c3, 'coord', $sql, %o); }
my $S = q2("SELECT min(logical) FROM sharding.shards WHERE map = 'm' AND node = 'n1'");
my $key = n('n1', "SELECT min(k) FROM docs WHERE sharding.logical_shard('m', k) = $S");
my $shard_rows = n('n1', "SELECT count(*) FROM docs WHERE sharding.logical_shard('m', k) = $S");
# The copy held at n2 until n1's slot exists (its creation waits for
# transactions holding an xid, as the row lock's); then the row lock at n1,
# then the copy released.
my $hold2 = sharding_start($d, 'n2', 'BEGIN; LOCK docs IN SHARE MODE; SELECT pg_sleep(600)', on_error_stop => 0);
sleep 1;
my $move = sharding_start($c2, 'coord', "SELECT sharding.move_shard_online('m', $S, 'n2')", on_error_stop => 0);
my $phase = '';
$t0 = time;
while (time - $t0 < 60)
{
	last if q2("SELECT phase FROM sharding.move_journal WHERE job IS NULL AND logical = $S ORDER BY move DESC LIMIT 1") eq 'copying'
	  && n('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'") eq '1';
	usleep(100_000);
}
my $lock = sharding_start($d, 'n1', "BEGIN; SELECT 1 FROM docs WHERE k = '$key' FOR UPDATE; SELECT pg_sleep(600)");
sleep 1;
n('n2', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query = 'SELECT pg_sleep(600)'");
$hold2->{h}->finish;
$t0 = time;
while (time - $t0 < 60)
{
	$phase = q2("SELECT phase FROM sharding.move_journal WHERE job IS NULL AND logical = $S ORDER BY move DESC LIMIT 1");
	last if $phase eq 'cleanup'
	  && n('n1', "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%_move_delete%'") ne '0';
	usleep(100_000);
}
is($phase, 'cleanup', "c2's move of shard $S ($shard_rows rows, n1 -> n2) is past its switch, its delete at n1 waiting");
$c2->wait_for_catchup($c3, 'replay', $c2->lsn('insert'));
$c2->stop('immediate');
$move->{h}->finish;
$c3->promote;
$c3->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($c3, 'coord') . "'");
n('n1', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query = 'SELECT pg_sleep(600)'");
$lock->{h}->finish;
$t0 = time;
$took = q3('SELECT sharding.take_over()', stderr => 1);
like($took, qr/^3\n/, 'take_over() on c3 (a standby of c2): 3 nodes follow it') or diag($took);
my $done = '';
while (time - $t0 < 60)
{
	$done = q3("SELECT phase FROM sharding.move_journal WHERE job IS NULL AND logical = $S ORDER BY move DESC LIMIT 1");
	last if $done eq 'done';
	usleep(100_000);
}
my $finished = time - $t0;
is($done, 'done', sprintf('the move past its switch was finished, not undone (%.1f s after take_over began)', $finished));
diag(sprintf('figures: take_over on c3 and the move past its switch finished %.1f s after take_over began', $finished));
is(n('n1', "SELECT count(*) FROM docs WHERE sharding.logical_shard('m', k) = $S") . '/'
	  . n('n2', "SELECT count(*) FROM docs WHERE sharding.logical_shard('m', k) = $S"), "0/$shard_rows",
	"shard $S's rows are all at n2, none left at n1");
is(total(), '3000/4501500', 'no row lost, none doubled');
is(join(' ', map { n($_, "SELECT count(*) FILTER (WHERE sharding.node_for('m', k) IS DISTINCT FROM '$_') FROM docs") } @nodes), '0 0 0',
	'every row is where node_for says');
is(join(' ', map { n($_, 'SELECT timeline FROM sharding.coordinator_identity') } @nodes), '3 3 3',
	"every node follows c3's identity (timeline 3)");
is(join(' ', map { n($_, $config) eq q3($config) ? 'same' : 'differs' } @nodes), 'same same same', "every node's shards equal c3's");

done_testing();
