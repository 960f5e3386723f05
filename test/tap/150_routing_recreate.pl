# DROP EXTENSION and CREATE EXTENSION by another backend drop every map
# without firing the config tables' triggers: no change is noted and no
# shared counter moves. A backend that keeps a map cached must still see
# that the map is gone (42704), and see a map re-created under the same
# name with other nodes. The other backend is a dblink connection, so the
# routing backend (this psql session) keeps its cache across the steps.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('n1');
my $dsn = sharding_dsn($node, 'postgres');
$node->safe_psql('postgres', "SELECT sharding.create_map('rd', 4, ARRAY['a'])");

my ($ret, $out, $err) = $node->psql('postgres', qq{
\\set VERBOSITY sqlstate
SELECT 'before:' || sharding.node_for('rd', 'k');
SELECT dblink_exec('$dsn', 'DROP EXTENSION sharding');
SELECT dblink_exec('$dsn', 'CREATE EXTENSION sharding');
SELECT 'gone:' || sharding.node_for('rd', 'k');
SELECT dblink_exec('$dsn', 'DO \$d\$ BEGIN PERFORM sharding.create_map(''rd'', 4, ARRAY[''b'']); END \$d\$');
SELECT 'again:' || sharding.node_for('rd', 'k');
}, on_error_stop => 0);
like($out, qr/^before:a$/m, 'the map is cached with its first owner');
unlike($out, qr/^gone:/m, 'after DROP and CREATE EXTENSION elsewhere the dropped map does not route');
like($err, qr/42704/, 'routing the dropped map fails with 42704');
like($out, qr/^again:b$/m, 'the map re-created with the same name routes to its new node');

# The same with a map stamp that other changes moved meanwhile (a pin of
# another map): the drop must still be seen.
$node->safe_psql('postgres', "SELECT sharding.create_map('other', 4, ARRAY['x'])");
($ret, $out, $err) = $node->psql('postgres', qq{
\\set VERBOSITY sqlstate
SELECT 'before:' || sharding.node_for('rd', 'k');
SELECT dblink_exec('$dsn', 'DROP EXTENSION sharding');
SELECT dblink_exec('$dsn', 'CREATE EXTENSION sharding');
SELECT dblink_exec('$dsn', 'DO \$d\$ BEGIN PERFORM sharding.create_map(''other'', 4, ARRAY[''y'']); END \$d\$');
SELECT 'gone:' || sharding.node_for('rd', 'k');
}, on_error_stop => 0);
like($out, qr/^before:b$/m, 'cached again');
unlike($out, qr/^gone:/m, 'a change of another map does not hide the drop');
done_testing();
