# PostgreSQL 17's failover slots for the coordinator's configuration
# (docs/nodes.md, "Failover of the coordinator"): a measurement, skipped
# before PostgreSQL 17.
#
# c1 is the coordinator, c2 its streaming standby with a physical slot,
# hot_standby_feedback and sync_replication_slots; c1 holds back logical
# changes until c2 has them (synchronized_standby_slots). The three data
# nodes' configuration subscriptions are made failover = true, so that
# their slots are synchronised to c2. c1 is killed and c2 promoted:
#
#  a. with the synced slots, each node only points its subscription at c2
#     (ALTER SUBSCRIPTION ... CONNECTION): no new slot, no copy of the
#     configuration; a pin made on c2 then reaches every node;
#  b. then take_over() as it is (a new slot per node and the node's copy
#     replaced): the same pin check.
# The figures are printed; the checks are that each way leaves every node
# following c2 with c2's configuration, nothing lost.
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
plan skip_all => 'failover slots need PostgreSQL 17' if $c1->pg_version < 17;
my $d = sharding_node('d', db => 'postgres', conf => 'wal_retrieve_retry_interval = 200ms');
my %dsn = map { $_ => sharding_dsn($d, $_) } @nodes;
sub n { my ($n, $sql, %o) = @_; return sharding_q($d, $n, $sql, %o); }
sub q1 { my ($sql, %o) = @_; return sharding_q($c1, 'coord', $sql, %o); }
my $c2;
sub q2 { my ($sql, %o) = @_; return sharding_q($c2, 'coord', $sql, %o); }
sub lag_text { my ($ms) = @_; return defined $ms ? "${ms}ms" : "timeout (last: $ShardingNode::last_wait)"; }

n('postgres', "CREATE DATABASE $_") for @nodes;
n($_, 'CREATE EXTENSION sharding') for @nodes;
my $c1_dsn = sharding_dsn($c1, 'coord');
$c1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '$c1_dsn'");
is( (split /\n/, q1(<<"SQL"))[-1],
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}'), sharding.add_node('n3', '$dsn{n3}');
SELECT sharding.create_map('m', 12, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.pin('m', 'whale-' || i, 'n' || (1 + i % 3)) FROM generate_series(1, 30) AS i;
SELECT sharding.attach_node('n1'), sharding.attach_node('n2'), sharding.attach_node('n3');
SELECT 'configured';
SQL
	'configured', 'c1: map m over n1..n3, 30 pins, three nodes attached');

# The nodes' subscriptions made failover = true (their slots at c1 too).
for my $n (@nodes)
{
	n($n, "ALTER SUBSCRIPTION sharding_config_$n DISABLE");
	n($n, "ALTER SUBSCRIPTION sharding_config_$n SET (failover = true)");
	n($n, "ALTER SUBSCRIPTION sharding_config_$n ENABLE");
}
is(q1(q{SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_config_%' AND failover}), '3',
	"c1's three configuration slots are failover slots");

# The standby: a physical slot, feedback, slot synchronisation.
q1(q{SELECT 1 FROM pg_create_physical_replication_slot('c2_slot')});
$c1->append_conf('postgresql.conf', "synchronized_standby_slots = 'c2_slot'");
$c1->reload;
$c2 = sharding_standby($c1, 'c2', 'base', join("\n", "primary_slot_name = 'c2_slot'", 'hot_standby_feedback = on',
	'sync_replication_slots = on',
	# Copied from c1 by the backup: once promoted, c2's WAL senders would
	# wait for a standby slot that c2 does not have (logical replication
	# stalls, "replication slot c2_slot ... does not exist").
	"synchronized_standby_slots = ''", "primary_conninfo = '" . sharding_dsn($c1, 'coord') . " application_name=c2'") . "\n");
my $c2_dsn = sharding_dsn($c2, 'coord');
q1("SELECT sharding.pin('m', 'before', 'n2')");
$c1->wait_for_catchup($c2, 'replay', $c1->lsn('insert'));
my $synced = sharding_wait($c2, 'coord', q{SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_config_%' AND synced AND NOT temporary}, '3', 60);
ok(defined $synced, "the three slots are synchronised to c2 (" . lag_text($synced) . ')');
is(join(' ', map { sharding_wait($d, $_, "SELECT sharding.node_for('m', 'before')", 'n2', 10); n($_, "SELECT sharding.node_for('m', 'before')") } @nodes),
	'n2 n2 n2', "c1's last pin is on every node");
# The slots at c2 are at the nodes' positions.
q1("SELECT sharding.pin('m', 'last', 'n3')");
sharding_wait($d, $_, "SELECT sharding.node_for('m', 'last')", 'n3', 10) for @nodes;
$c1->wait_for_catchup($c2, 'replay', $c1->lsn('insert'));
usleep(500_000);

# ---------------------------------------------------------------- a. the synced slots
$c1->stop('immediate');
my $t_kill = time;
$c2->promote;
my $t_promoted = time;
$c2->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '$c2_dsn'");
n($_, "ALTER SUBSCRIPTION sharding_config_$_ CONNECTION '$c2_dsn'") for @nodes;
my $t_pointed = time;
q2("SELECT sharding.pin('m', 'after-a', 'n1')");
my @lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('m', 'after-a')", 'n1', 20)) } @nodes;
my $t_a = time;
is(scalar(grep { /ms$/ } @lags), 3, "a. re-pointed to the synced slots, a pin made on c2 reaches every node (@lags)");
my $config = q{SELECT md5(string_agg(t, '|' ORDER BY t)) FROM (
    SELECT 's:' || map || ':' || logical || ':' || node || ':' || epoch FROM sharding.shards UNION ALL
    SELECT 'p:' || map || ':' || key || ':' || node FROM sharding.pins UNION ALL
    SELECT 'v:' || map || ':' || version FROM sharding.map_versions) AS c(t)};
is(join(' ', map { n($_, $config) eq q2($config) ? 'same' : 'differs' } @nodes), 'same same same',
	"a. every node's configuration equals c2's (nothing lost, nothing doubled)");
diag(sprintf('figures a (failover slots): promote %.0f ms; re-pointing the 3 subscriptions %.0f ms; promotion to a pin seen on every node %.0f ms',
	($t_promoted - $t_kill) * 1000, ($t_pointed - $t_promoted) * 1000, ($t_a - $t_promoted) * 1000));

# ---------------------------------------------------------------- b. take_over as it is
my $t0 = time;
my $took = q2('SELECT sharding.take_over()', stderr => 1);
my $t_took = time;
like($took, qr/^3\n/, 'b. take_over() on c2: 3 nodes follow it') or diag($took);
q2("SELECT sharding.pin('m', 'after-b', 'n2')");
@lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('m', 'after-b')", 'n2', 20)) } @nodes;
my $t_b = time;
is(scalar(grep { /ms$/ } @lags), 3, "b. after take_over a pin made on c2 reaches every node (@lags)");
is(join(' ', map { n($_, $config) eq q2($config) ? 'same' : 'differs' } @nodes), 'same same same', "b. every node's configuration equals c2's");
diag(sprintf('figures b (take_over: new slots, copies replaced): take_over %.0f ms; take_over to a pin seen on every node %.0f ms',
	($t_took - $t0) * 1000, ($t_b - $t0) * 1000));

done_testing();
