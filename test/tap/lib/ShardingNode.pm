# Helpers for the Perl TAP tests (test/tap/*.pl), on PostgreSQL's own
# PostgreSQL::Test::Cluster: nodes with the extension installed, logical
# replication enabled and the library preloaded. test/run.sh runs every
# test/tap/*.pl with prove, as the server's OS user, with PATH leading to
# the PostgreSQL under test.
package ShardingNode;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Exporter 'import';

our @EXPORT = qw(sharding_node);

# sharding_node(NAME, %opts): a started cluster with wal_level = logical,
# sharding preloaded, a database (opts{db}, default 'postgres') with the
# extension (and dblink, which attach_node uses). opts{conf}: extra
# postgresql.conf lines; opts{preload} => 0 leaves the library unloaded.
sub sharding_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => 'logical');
	my $preload = exists $opts{preload} ? $opts{preload} : 1;
	$node->append_conf('postgresql.conf', join("\n",
		"max_replication_slots = 20",
		"max_wal_senders = 20",
		"max_logical_replication_workers = 12",
		"max_worker_processes = 24",
		"fsync = off",
		"log_min_messages = warning",
		($preload ? "shared_preload_libraries = 'sharding'" : ()),
		($opts{conf} ? $opts{conf} : ())) . "\n");
	$node->start;
	my $db = $opts{db} // 'postgres';
	$node->safe_psql('postgres', "CREATE DATABASE $db") if $db ne 'postgres';
	$node->safe_psql($db, 'CREATE EXTENSION dblink; CREATE EXTENSION sharding');
	return $node;
}

1;
