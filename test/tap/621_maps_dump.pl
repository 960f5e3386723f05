# pg_dump | psql round trip: maps, shards with their epochs, pins, nodes and
# configuration versions survive, and the restored database routes alike.
# (Was test/harness/maps_dump.sh.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 7;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('maps_dump', db => 'src');
$node->safe_psql('src', <<'SQL');
SELECT sharding.create_map('orders', 64, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT sharding.create_map('users', 10, ARRAY['u1', 'u2']);
SELECT sharding.move_shard('orders', 7, 'n9');
SELECT sharding.move_shard('orders', 7, 'n2');
SELECT count(*) FROM sharding.rebalance('orders', ARRAY['n1', 'n2', 'n3', 'n4', 'n5']);
SELECT sharding.pin('orders', 'whale-' || i, 'dedicated') FROM generate_series(1, 50) AS i;
SELECT sharding.pin('users', '42', 'vip');
UPDATE sharding.nodes SET dsn = 'host=10.0.0.1 dbname=orders' WHERE node = 'n1';
SQL

my ($rc, $err) = sharding_dump_restore($node, 'src', 'dst');
is($rc, 0, 'pg_dump | psql restores without error') or diag($err);

sharding_same_config($node, 'src', 'dst');
sharding_same($node, 'src', 'dst', 'routing agrees for 3000 keys and every pin',
	"SELECT string_agg(sharding.node_for('orders', 'whale-' || i) || sharding.node_for('users', i), ',' ORDER BY i)
	   FROM generate_series(1, 3000) AS i");

# Versions survive and keep rising after the restore (sequence restored).
# (n1 has a DSN, so 'orders' is a database map: since 1.2 n3 needs one before a move.)
my $before = sharding_q($node, 'src', "SELECT version FROM sharding.map_versions WHERE map = 'orders'");
my $after = sharding_q($node, 'dst', "SELECT sharding.add_node('n3', 'host=10.0.0.3 dbname=orders');
	SELECT sharding.move_shard('orders', 0, 'n3') IS NOT NULL;
	SELECT version FROM sharding.map_versions WHERE map = 'orders'");
$after = (split /\n/, $after)[-1] // '';
my $epoch = sharding_q($node, 'dst', "SELECT sharding.epoch('orders', 7)");
ok($before =~ /^\d+$/ && $after =~ /^\d+$/ && $after > $before && $epoch eq '3',
	"restored versions rise on the next change ($before -> $after), epoch of shard 7 is 3 ($epoch)");
