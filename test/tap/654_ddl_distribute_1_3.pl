# distribute on a coordinator with attached data nodes that all have the
# table already (docs/ddl.md): no node takes part, no remote transaction at
# all, so it works as in 1.3 with max_prepared_transactions = 0 on the
# nodes. A node that lacks the table is the only one involved: 55000 with
# the hint (its max_prepared_transactions is 0), nothing created anywhere.
#
# One instance (max_prepared_transactions = 0): the coordinator's database
# coord and data nodes n1 and n2 (databases data1 and data2).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 5;
use lib 'lib';
use ShardingNode;

my $i1 = sharding_node('i1', db => 'data1', conf => "max_prepared_transactions = 0\nwal_retrieve_retry_interval = 200ms");
$i1->safe_psql('postgres', q{CREATE DATABASE data2; CREATE DATABASE coord});
$i1->safe_psql('data2', 'CREATE EXTENSION dblink; CREATE EXTENSION sharding');
$i1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($i1, 'coord') . "'");
my %db = (n1 => 'data1', n2 => 'data2');
sub d { my ($n, $sql, %o) = @_; return sharding_q($i1, $db{$n}, $sql, %o); }
sub c { my ($sql, %o) = @_; return sharding_q($i1, 'coord', $sql, %o); }

my $table = "CREATE TABLE t (k text PRIMARY KEY, v integer);\n";
d($_, $table) for qw(n1 n2);
is((split /\n/, c(<<"SQL"))[-1], 'attached', 'coordinator: n1, n2 attached');
CREATE EXTENSION dblink; CREATE EXTENSION sharding;
SELECT sharding.add_node('n1', '@{[ sharding_dsn($i1, 'data1') ]}'), sharding.add_node('n2', '@{[ sharding_dsn($i1, 'data2') ]}');
SELECT sharding.attach_node('n1'), sharding.attach_node('n2');
SELECT sharding.create_map('m', 4, ARRAY['n1', 'n2']);
$table
SELECT 'attached';
SQL
my $out = c(q{SELECT sharding.distribute('t', 'k', 'm'); SELECT 'distributed'}, verbose => 1);
like($out, qr/distributed$/, 'every node has t: distribute works without max_prepared_transactions (as in 1.3)');
is(c(q{SELECT count(*) FROM sharding.distributed_tables WHERE table_name = 't'}), '1', '... t is distributed');

d('n1', 'CREATE TABLE u (k text PRIMARY KEY)');
c('CREATE TABLE u (k text PRIMARY KEY)');
$out = c(q{SELECT sharding.distribute('u', 'k', 'm')}, verbose => 1);
like($out, qr/ERROR:\s+55000: node "n2" has max_prepared_transactions = 0/,
	'n2 lacks u: only n2 is involved, 55000 naming it');
is(join(' ', d('n2', q{SELECT count(*) FROM pg_class WHERE relname = 'u'}),
		c(q{SELECT count(*) FROM sharding.distributed_tables WHERE table_name = 'u'})), '0 0',
	'... and nothing created or recorded');
