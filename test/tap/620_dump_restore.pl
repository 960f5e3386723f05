# Dump and restore of a database that uses every feature: pg_dump of the
# source restored with psql into a new database keeps maps, epochs, pins,
# node DSNs, configuration versions, rank guards (their triggers still
# guarding), queues with their settings, and shard-aligned partitions.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 14;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('dump', db => 'src');
$node->safe_psql('src', <<'SQL');
SELECT sharding.create_map('docs', 64, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT count(*) FROM sharding.rebalance('docs', ARRAY['n1', 'n2', 'n3', 'n4', 'n5']);
SELECT sharding.move_shard('docs', 3, 'n9');
SELECT sharding.pin('docs', 'ws_enterprise_42', 'dedicated');
SELECT sharding.pin('docs', '7', 'small');
SELECT sharding.add_node(n, 'host=' || n || '.example dbname=docs') FROM unnest(ARRAY['n1','n2','n3','n4','n5','n9','dedicated','small']) AS n;
-- rank guards: text ranks (skip) and enum order (error)
CREATE TYPE order_state AS ENUM ('preparing', 'shipped', 'delivered');
CREATE TABLE orders (id bigint PRIMARY KEY, status text, state order_state);
INSERT INTO orders SELECT i, 'preparing', 'preparing' FROM generate_series(1, 10) AS i;
SELECT sharding.guard_rank('orders', 'status', ARRAY['preparing', 'shipped', 'delivered']);
SELECT sharding.guard_rank('orders', 'state', NULL, 'error');
UPDATE orders SET status = 'delivered', state = 'delivered' WHERE id <= 5;
-- a queue with settings and jobs in every state
SELECT sharding.create_queue('jobs');
SELECT sharding.set_max_attempts('jobs', 3);
INSERT INTO jobs (key, payload) SELECT 'k' || i, jsonb_build_object('i', i) FROM generate_series(1, 30) AS i;
SELECT count(*) FROM sharding.claim(NULL::jobs, 'w1', 10);
SELECT sharding.complete('jobs', ARRAY(SELECT id FROM jobs WHERE owner = 'w1' ORDER BY id LIMIT 5), 'w1');
-- partitions aligned with shard_of
CREATE TABLE events (workspace text, body text) PARTITION BY HASH (workspace sharding.text_shard_ops);
SELECT sharding.create_partitions('events', 8);
INSERT INTO events SELECT 'ws-' || i, 'b' FROM generate_series(1, 500) AS i;
SQL

my ($rc, $err) = sharding_dump_restore($node, 'src', 'dst');
is($rc, 0, 'the dump restores without errors') or diag($err);

sharding_same_config($node, 'src', 'dst');
# same(DESCRIPTION, QUERY): identical, non-empty output in both databases.
sub same { sharding_same($node, 'src', 'dst', @_) }
same('cluster_version and partitions',
	"SELECT sharding.cluster_version('docs'), (SELECT string_agg(p, ',') FROM sharding.cluster_partitions('docs') p)");
same('routing of 2,000 keys, pins included',
	"SELECT md5(string_agg(sharding.node_for('docs', k), ',' ORDER BY k)) FROM (SELECT 'ws-' || i AS k FROM generate_series(1, 2000) i UNION ALL SELECT 'ws_enterprise_42' UNION ALL SELECT '7') t");
same('rank guard registry', 'SELECT schema_name, table_name, column_name FROM sharding.rank_guards ORDER BY 1, 2, 3');
same('queue rows and settings',
	"SELECT (SELECT string_agg(id || status || coalesce(owner, '-') || attempts, ',' ORDER BY id) FROM jobs), (SELECT string_agg(max_attempts::text, ',') FROM sharding.queue_settings)");
same('partition contents align with shard_of',
	"SELECT count(*), count(*) FILTER (WHERE tableoid::regclass::text = 'events_' || sharding.shard_of(workspace, 8)) FROM events");

# Behaviour in the restored database.
is( sharding_q($node, 'dst', "WITH u AS (UPDATE orders SET status = 'shipped' WHERE id = 1 RETURNING 1) SELECT count(*) FROM u;
                              SELECT status FROM orders WHERE id = 1"),
	"0\ndelivered", 'restored text guard still skips a regression (no row updated, status stays delivered)');
like(sharding_q($node, 'dst', "UPDATE orders SET state = 'shipped' WHERE id = 2") . '|' . sharding_q($node, 'dst', 'SELECT state FROM orders WHERE id = 2'),
	qr/^ERROR: .*\|delivered$/s, 'restored enum guard still raises on a regression');
is(sharding_q($node, 'dst', "SELECT count(*) FROM sharding.claim(NULL::jobs, 'w2', 100)"), '20',
	'restored queue: claim takes the 20 pending jobs');
my $stale = sharding_q($node, 'dst', "SELECT sharding.fence('docs', 3, 1)", verbose => 1);
is( sharding_q($node, 'dst', "SELECT sharding.fence('docs', 3, 2); SELECT sharding.epoch('docs', 3)") . '|'
	  . ($stale =~ /ERROR:\s+(\w{5}):/ ? $1 : $stale),
	"\n2|55000", 'restored epochs fence as before (epoch 2 passes, epoch 1 is refused: 55000)');
