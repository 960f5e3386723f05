# Without shared_preload_libraries: routing, queues, rank guards, shard_lag
# and rebalance_by_load behave as with it; only the fan-out counters are
# absent, and fanout_stats says so in a NOTICE and shows no row.
# (Was test/harness/no_preload.sh.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 11;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('np', preload => 0);
# q(SQL): the output, or "ERROR: " and psql's messages.
sub sq { return sharding_q($node, 'postgres', $_[0]); }
# messages(SQL): psql's NOTICE and HINT lines (without psql's location
# prefix) and the output, each line followed by '/'.
sub messages
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', $sql, stdout => \$out, stderr => \$err);
	my @lines = grep { /^(NOTICE|HINT|[0-9])/ } map { s/^psql:[^:]*:\d+: //r } split(/\n/, $err), split(/\n/, $out);
	return join('', map { "$_/" } @lines);
}

is(sq('SHOW shared_preload_libraries'), '', 'the cluster preloads nothing');
$node->safe_psql('postgres', <<'SQL');
SELECT sharding.create_map('m', 8, ARRAY['a', 'b']);
CREATE TABLE orders (id bigint PRIMARY KEY, tenant text NOT NULL, status text NOT NULL);
ALTER TABLE orders REPLICA IDENTITY FULL;
SELECT sharding.distribute('orders', 'tenant', 'm');
INSERT INTO orders SELECT i, 't' || (i % 10), 'new' FROM generate_series(1, 100) AS i;
SQL
is(sq("SELECT sharding.node_for('m', 't1') = (SELECT node FROM sharding.shards WHERE map = 'm' AND logical = sharding.shard_of('t1', 8))"),
	't', 'routing: node_for answers from the map');
is(sq("SELECT count(*) FROM orders WHERE tenant = 't1'"), '10', 'queries on a distributed table run');
is(messages('SELECT count(*) FROM sharding.fanout_stats'),
	"NOTICE:  fan-out counting is off: sharding is not in shared_preload_libraries/"
	  . "HINT:  Add 'sharding' to shared_preload_libraries in postgresql.conf and restart the server./0/",
	'fanout_stats: a NOTICE naming shared_preload_libraries, with a hint, and no row');
like(messages('SELECT sharding.fanout_reset()'),
	qr{^NOTICE:  fan-out counting is off: sharding is not in shared_preload_libraries/},
	'fanout_reset: the same NOTICE, no error');

# Queue: create, enqueue, claim, complete.
$node->safe_psql('postgres', "SELECT sharding.create_queue('jobs');
	INSERT INTO jobs (key, payload) SELECT 'k' || i, '{}' FROM generate_series(1, 5) AS i");
is(sq("SELECT count(*) FROM sharding.claim(NULL::jobs, 'w1', 3)"), '3', 'queue: claim takes 3 jobs');
is(sq("SELECT sharding.complete('jobs', (SELECT min(id) FROM jobs WHERE status = 'processing'), 'w1')"),
	't', 'queue: complete fences on the owner');
is(sq("SELECT sum(pending) FROM sharding.shard_lag('jobs', 4)"), '2', 'shard_lag sees the 2 jobs left');

# Rank guard: a regressing update is skipped.
$node->safe_psql('postgres', "SELECT sharding.guard_rank('orders', 'status', ARRAY['new', 'paid', 'shipped']);
	UPDATE orders SET status = 'shipped' WHERE id = 1; UPDATE orders SET status = 'new' WHERE id = 1");
is(sq('SELECT status FROM orders WHERE id = 1'), 'shipped', 'rank guard: the regressing update was skipped');

# rebalance_by_load: plans and moves as with preload (on a map without
# distributed tables: with one, owner switches alone are refused).
$node->safe_psql('postgres', "SELECT sharding.undistribute('orders')");
is(sq("SELECT count(*) FROM sharding.rebalance_by_load('m', ARRAY['a', 'b'], ARRAY[10, 1, 1, 1, 1, 1, 1, 1]::float8[], 1.10)"),
	'3', 'rebalance_by_load moves 3 shards off the node with the heavy shard');
is(sq("SELECT string_agg(node || ':' || epoch, ',' ORDER BY logical) FROM sharding.shards WHERE map = 'm'"),
	'a:1,b:2,b:2,b:2,b:1,b:1,b:1,b:1', "each moved shard's epoch rose");
