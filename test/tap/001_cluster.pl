# The Perl TAP harness itself: a cluster made by PostgreSQL::Test::Cluster
# runs the extension, and its map survives an immediate stop.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('n1');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'sharding'"),
	'1.4', 'the extension is installed at version 1.4');
$node->safe_psql('postgres', "SELECT sharding.create_map('m', 8, ARRAY['a', 'b'])");
is($node->safe_psql('postgres', "SELECT sharding.shards_of('m', 'a')"), '{0,1,2,3}',
	'a map deals its shards in contiguous ranges');
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', "SELECT sharding.shards_of('m', 'b')"), '{4,5,6,7}',
	'the map survives an immediate stop');
done_testing();
