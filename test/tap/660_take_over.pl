# The coordinator fails over (docs/nodes.md, "Failover of the coordinator";
# CONTRACT 15.3): take_over() on its promoted physical standby.
#
# Topology: instance c1 holds the coordinator (database coord); c2 is its
# streaming standby (pg_basebackup, has_streaming); instance d holds the
# three data nodes n1, n2, n3 (databases of those names). Map m has 12
# logical shards over n1..n3 and distributes table docs. A writer on each
# data node inserts, one transaction per row, the keys that node_for says
# that node owns, and logs every refusal.
#
# c1 is killed (stop immediate), c2 promoted and take_over() run: every node
# follows c2 (its copy of the configuration equal to c2's), a pin and a map
# made on c2 reach every node within 10 s, the writers never stopped. c1
# started again: its pins reach no node, its attach, move and take_over are
# refused (55000 naming c2) and change nothing at any node. A node whose copy
# holds a change c2 lacks makes take_over refuse, naming it, until force.
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
sub lag_text { my ($ms) = @_; return defined $ms ? "${ms}ms" : "timeout (last: $ShardingNode::last_wait)"; }

# ---------------------------------------------------------------- setup
my $node_schema = $SQLSTATE_OF . <<'SQL';
CREATE EXTENSION sharding;
CREATE TABLE docs (k text PRIMARY KEY, v integer);
-- Refusals the writer met: when, which key, what.
CREATE TABLE writer_log (at timestamptz DEFAULT clock_timestamp(), k text, state text, message text);
-- writer(secs): for secs seconds, inserts the next key this node owns by
-- node_for, one transaction per row; a refused row is logged and skipped.
CREATE PROCEDURE writer(secs float8) LANGUAGE plpgsql AS $$
DECLARE
    i bigint := 0;
    k text;
    stop timestamptz := clock_timestamp() + secs * interval '1 second';
BEGIN
    WHILE clock_timestamp() < stop LOOP
        i := i + 1;
        k := 'key-' || i;
        IF sharding.node_for('m', k) IS NOT DISTINCT FROM sharding.this_node() THEN
            BEGIN
                INSERT INTO docs VALUES (k, i);
            EXCEPTION WHEN OTHERS THEN
                INSERT INTO writer_log (k, state, message) VALUES (k, SQLSTATE, SQLERRM);
            END;
            COMMIT;
            PERFORM pg_sleep(0.003);
        END IF;
    END LOOP;
END $$;
SELECT 'ready';
SQL
n('postgres', "CREATE DATABASE $_") for @nodes;
is(join(' ', map { (split /\n/, n($_, $node_schema))[-1] } @nodes), 'ready ready ready', 'three data nodes created');

my $c1_dsn = sharding_dsn($c1, 'coord');
$c1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '$c1_dsn'");
is( (split /\n/, q1(<<"SQL"))[-1],
CREATE TABLE docs (k text PRIMARY KEY, v integer);
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}'), sharding.add_node('n3', '$dsn{n3}');
SELECT sharding.create_map('m', 12, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.distribute('docs', 'k', 'm');
SELECT sharding.pin('m', 'whale-' || i, 'n' || (1 + i % 3)) FROM generate_series(1, 30) AS i;
SELECT sharding.attach_node('n1'), sharding.attach_node('n2'), sharding.attach_node('n3');
SELECT 'configured';
SQL
	'configured', 'coordinator c1: map m over n1..n3, docs distributed, 30 pins, three nodes attached');

# The standby, streaming from c1.
$c2 = sharding_standby($c1, 'c2', 'base');
my $c2_dsn = sharding_dsn($c2, 'coord');

# Everything a node's copy must equal: every row of every configuration table.
my $config = q{SELECT md5(string_agg(t, '|' ORDER BY t)) FROM (
    SELECT 'm:' || map || ':' || logical_shards || ':' || created FROM sharding.maps UNION ALL
    SELECT 'n:' || node || ':' || coalesce(dsn, '') FROM sharding.nodes UNION ALL
    SELECT 's:' || map || ':' || logical || ':' || node || ':' || epoch FROM sharding.shards UNION ALL
    SELECT 'p:' || map || ':' || key || ':' || node FROM sharding.pins UNION ALL
    SELECT 'v:' || map || ':' || version FROM sharding.map_versions UNION ALL
    SELECT 'd:' || schema_name || '.' || table_name || ':' || key_column || ':' || map FROM sharding.distributed_tables) AS c(t)};
sub same_everywhere
{
	my ($q, $what) = @_;
	my $home = $q->($config);
	my @differ = grep { n($_, $config) ne $home } @nodes;
	is("@differ", '', $what) or diag("home $home; " . join(', ', map { "$_ " . n($_, $config) } @nodes));
}

# c1's last changes, committed and streamed to c2 before c1 dies.
q1("SELECT sharding.pin('m', 'late-pin', 'n2'), sharding._switch_owner('m', 11, 'n1')");
$c1->wait_for_catchup($c2, 'replay', $c1->lsn('insert'));
my $late_ms = sharding_wait($d, 'n3', "SELECT sharding.node_for('m', 'late-pin')", 'n2', 30);
ok(defined $late_ms, "c1's last pin reached the nodes (" . lag_text($late_ms) . ')');
same_everywhere(\&q1, 'before the failover every node copies c1\'s configuration');

# In recovery: refused (55000), nothing changed.
like(q2('SELECT sharding.take_over()', verbose => 1), qr/ERROR:\s+55000: take_over needs a primary: this server is still in recovery/,
	'take_over on the standby still in recovery: 55000');

# ---------------------------------------------------------------- failover
my %writer = map { $_ => sharding_start($d, $_, 'CALL writer(14)') } @nodes;
sleep 2;
my $rows_before = join(' ', map { n($_, 'SELECT count(*) FROM docs') } @nodes);

# n3 is out of reach at the takeover (its database refuses new
# connections; its writer, connected already, goes on).
n('postgres', 'ALTER DATABASE n3 ALLOW_CONNECTIONS false');
$c1->stop('immediate');
my $t_kill = time;
$c2->promote;
my $t_promoted = time;
$c2->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '$c2_dsn'");
# No move before take_over: the nodes still follow c1 (fenced or blind to c2's switch).
like(q2("SELECT sharding.move_shard_online('m', 0, 'n3')", verbose => 1),
	qr/ERROR:\s+55000: no move before take_over on this server/, 'a move on the promoted standby before take_over: 55000');
my $t0 = time;
my $following = q2('SELECT sharding.take_over()', stderr => 1);
my $t_taken = time;
like($following, qr/^2\n.*WARNING:\s+node "n3" is out of reach/s, 'take_over() on the promoted standby: 2 nodes follow it, n3 out of reach')
	or diag($following);
q2("SELECT sharding.pin('m', 'after-takeover', 'n1')");
my @lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('m', 'after-takeover')", 'n1', 10)) } qw(n1 n2);
my $t_two = time;
is(scalar(grep { /ms$/ } @lags), 2, "a pin made on c2 after take_over reaches n1 and n2 within 10 s (@lags)");
is(q2('SELECT unreached FROM sharding.coordinator_identity'), '{n3}', 'c2 remembers that n3 was out of reach');

# n3 comes back: the jobs launcher re-points it by itself.
n('postgres', 'ALTER DATABASE n3 ALLOW_CONNECTIONS true');
my $t_back = time;
my $token = q2('SELECT token FROM sharding.coordinator_identity');
my $n3_ms = sharding_wait($d, 'n3', "SELECT (SELECT token::text FROM sharding.coordinator_identity) || '/' || "
	. "(SELECT subconninfo = '$c2_dsn' FROM pg_subscription WHERE subname = 'sharding_config_n3')", "$token/true", 30);
ok(defined $n3_ms, 'n3, back, is re-pointed to c2 by the jobs launcher without a call (' . lag_text($n3_ms) . ' after it came back)');
my $t_all = time;
my $left = sharding_wait($c2, 'coord', 'SELECT unreached FROM sharding.coordinator_identity', '{}', 10);
ok(defined $left, '... and c2 no longer lists it as out of reach');
@lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('m', 'after-takeover')", 'n1', 10)) } @nodes;
is(scalar(grep { /ms$/ } @lags), 3, "the pin made on c2 is on every node (@lags)");
q2("SELECT sharding.create_map('after', 4, ARRAY['n2', 'n3'])");
@lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('after', 'x') IS NOT NULL", 't', 10)) } @nodes;
is(scalar(grep { /ms$/ } @lags), 3, "a map made on c2 reaches every node within 10 s (@lags)");
diag(sprintf('figures: promote %.0f ms; take_over (2 nodes, 1 out of reach) %.0f ms; promotion to n1 and n2 following '
	  . '(a pin seen there) %.0f ms; n3 re-pointed by the launcher %.0f ms after it came back',
	($t_promoted - $t_kill) * 1000, ($t_taken - $t0) * 1000, ($t_two - $t_promoted) * 1000, ($t_all - $t_back) * 1000));

same_everywhere(\&q2, "after take_over every node's configuration equals c2's (no pin, shard, epoch or node lost)");
is(q2(q{SELECT count(*) FROM sharding.pins WHERE map = 'm'}) . '|' . q2(q{SELECT node || '/' || epoch FROM sharding.shards WHERE map = 'm' AND logical = 11}),
	'32|n1/2', "c2 kept c1's last changes (30 + 2 pins, shard 11 at n1 epoch 2)");
is(join(' ', map { n($_, 'SELECT token FROM sharding.coordinator_identity') eq $token ? 'same' : 'differs' } @nodes), 'same same same',
	"every node holds c2's identity token");
is(join(' ', map { n($_, "SELECT subenabled::text || '/' || (subconninfo = '$c2_dsn')::text FROM pg_subscription WHERE subname = 'sharding_config_$_'") } @nodes),
	'true/true true/true true/true', "every node's one subscription points at c2, enabled");
is(q2(q{SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_config_%'}), '3', 'c2 holds one slot per node');

# The writers never stopped.
my %done = map { $_ => [ sharding_finish($writer{$_}) ] } @nodes;
is(join(' ', map { $done{$_}[0] } @nodes), '0 0 0', 'the writers ran to their end') or diag(join("\n", map { $done{$_}[2] } @nodes));
is(join(' ', map { n($_, 'SELECT count(*) FROM writer_log') } @nodes), '0 0 0', 'no write was refused on any node')
	or diag(join("\n", map { n($_, 'SELECT * FROM writer_log LIMIT 5') } @nodes));
my $rows_after = join(' ', map { n($_, 'SELECT count(*) FROM docs') } @nodes);
my @placed = map { n($_, "SELECT count(*) FILTER (WHERE sharding.node_for('m', k) IS DISTINCT FROM '$_') FROM docs") } @nodes;
is("@placed", '0 0 0', "every committed row is where node_for says (rows before the kill: $rows_before; at the end: $rows_after)");

# ---------------------------------------------------------------- repeating
my $subs = join(' ', map { n($_, "SELECT oid FROM pg_subscription WHERE subname = 'sharding_config_$_'") } @nodes);
like(q2('SELECT sharding.take_over()', stderr => 1), qr/^3\n/, 'take_over() again: 3');
is(join(' ', map { n($_, "SELECT oid FROM pg_subscription WHERE subname = 'sharding_config_$_'") } @nodes) . '|'
	  . q2('SELECT token FROM sharding.coordinator_identity'), "$subs|$token",
	'repeating is harmless: the same subscriptions, the same token');
same_everywhere(\&q2, '... and the same configuration everywhere');

# ---------------------------------------------------------------- the old coordinator comes back
$c1->start;
my $c1_pin = q1("SELECT 'pinned' FROM sharding.pin('m', 'from-old', 'n3'); SELECT sharding.node_for('m', 'from-old')");
is($c1_pin, "pinned\nn3", 'c1 started again and pinned a key in its own configuration');
like(q1("SELECT sharding.attach_node('n1')", verbose => 1),
	qr/ERROR:\s+55000: (remote: )?database "n1" follows coordinator host=\S+ port=${\ $c2->port} dbname=coord since/,
	"c1's attach_node is refused by the node (55000 naming c2)");
like(q1("SELECT sharding.move_shard_online('m', 0, 'n2')", verbose => 1), qr/ERROR:\s+55000: .*follows coordinator host=\S+ port=${\ $c2->port}/,
	"c1's move_shard_online is refused (55000 naming c2)");
like(q1('SELECT sharding.take_over()', verbose => 1), qr/ERROR:\s+55000: node "n1" follows coordinator .* does not succeed it/,
	"c1's take_over is refused: c2 (a later timeline) has the nodes");
sleep 2;
is(join(' ', map { n($_, "SELECT count(*) FROM sharding.pins WHERE key = 'from-old'") } @nodes), '0 0 0', "c1's pin reached no node");
is(join(' ', map { n($_, "SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move_%'")
	. n($_, "SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move_%'") } @nodes), '00 00 00',
	"c1's move left nothing at any node");
same_everywhere(\&q2, "every node still copies c2's configuration");
q2("SELECT sharding.pin('m', 'still-c2', 'n2')");
@lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('m', 'still-c2')", 'n2', 10)) } @nodes;
is(scalar(grep { /ms$/ } @lags), 3, "c2's changes still reach every node (@lags)");

# ---------------------------------------------------------------- a node ahead
# n2 holds a change c2 lacks (as when an asynchronous standby missed one):
# its version of map m and epoch of shard 3 are above c2's.
n('n2', "SET session_replication_role = replica; UPDATE sharding.map_versions SET version = version + 1000 WHERE map = 'm';
          UPDATE sharding.shards SET epoch = epoch + 50 WHERE map = 'm' AND logical = 3");
my $n2_version = n('n2', "SELECT version FROM sharding.map_versions WHERE map = 'm'");
my $n2_epoch = n('n2', "SELECT epoch FROM sharding.shards WHERE map = 'm' AND logical = 3");
my $ident = q2('SELECT token || since FROM sharding.coordinator_identity');
like(q2('SELECT sharding.take_over()', verbose => 1),
	qr/ERROR:\s+55000: take_over refused: node "n2" holds map "m" at version $n2_version \(here \d+\), a configuration change this server lacks/,
	'take_over refuses while n2 holds a change c2 lacks, naming the node and the change');
is(q2('SELECT token || since FROM sharding.coordinator_identity') . '|' . n('n2', "SELECT version FROM sharding.map_versions WHERE map = 'm'"),
	"$ident|$n2_version", '... and changed nothing');
like(q2('SELECT sharding.take_over(force => true)', stderr => 1), qr/^3\n/, 'take_over(force => true): 3');
same_everywhere(\&q2, "after force every node's configuration equals c2's");
cmp_ok(q2("SELECT min(epoch) - 1 FROM sharding.shards WHERE map = 'm' AND logical = 3"), '>=', $n2_epoch,
	"force raised shard 3's epoch above n2's ($n2_epoch)");
cmp_ok(q2("SELECT version FROM sharding.map_versions WHERE map = 'm'"), '>', $n2_version,
	"... and map m's version above n2's ($n2_version): cluster_version never falls on n2");
q2("SELECT sharding.pin('m', 'after-force', 'n3')");
@lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('m', 'after-force')", 'n3', 10)) } @nodes;
is(scalar(grep { /ms$/ } @lags), 3, "after force, changes reach every node (@lags)");

done_testing();
