# attach_node accepts a clone of the coordinator's cluster (docs/nodes.md). A
# cluster made by pg_basebackup has the coordinator's system identifier and
# the same database names, which attach_node used to take for "this database".
# The clone here is started as a primary of its own (no standby.signal: it
# ends recovery and takes its own timeline), attached, and follows a change;
# attaching the coordinator to itself, by another connection string that leads
# back to it, is still refused.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

my $coord = sharding_node('coord');
$coord->safe_psql('postgres', "SELECT sharding.create_map('m', 8, ARRAY['a', 'b'])");

$coord->backup('clone_backup');
my $clone = PostgreSQL::Test::Cluster->new('clone');
$clone->init_from_backup($coord, 'clone_backup');
$clone->start;

my $sysid = "SELECT system_identifier FROM pg_control_system()";
is($clone->safe_psql('postgres', $sysid), $coord->safe_psql('postgres', $sysid),
	'the clone has the coordinator\'s system identifier');
is($clone->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'the clone runs as a primary of its own');
# The clone's own write, unseen by the coordinator: they are two servers.
$clone->safe_psql('postgres', "SELECT sharding.create_map('clone_only', 2, ARRAY['c'])");
is($coord->safe_psql('postgres', "SELECT count(*) FROM sharding.maps WHERE map = 'clone_only'"), '0',
	'the clone is a separate server');

my $clone_dsn = $clone->connstr('postgres');
$coord->safe_psql('postgres', "SELECT sharding.add_node('clone', \$\$$clone_dsn\$\$)");
my ($rc, $out, $err) = $coord->psql('postgres', "SELECT sharding.attach_node('clone')");
is($rc, 0, 'attach_node accepts a pg_basebackup clone of the coordinator\'s cluster')
  or diag($err);
is($clone->safe_psql('postgres', 'SELECT sharding.this_node()'), 'clone', 'the clone learnt its node name');
is($clone->safe_psql('postgres', "SELECT string_agg(map, ',' ORDER BY map) FROM sharding.maps"), 'm',
	'the clone\'s configuration was replaced by the coordinator\'s');

$coord->safe_psql('postgres', "SELECT sharding.pin('m', 'whale', 'b')");
ok($clone->poll_query_until('postgres', "SELECT sharding.node_for('m', 'whale') = 'b'"),
	'the clone follows a change made on the coordinator');
my ($crc, $cout, $cerr) = $clone->psql('postgres', "SELECT sharding.create_map('x', 2, ARRAY['a'])");
like($cerr, qr/coordinator/, 'the attached clone refuses configuration changes of its own');

# Self-attach: a connection string to the coordinator itself, spelt
# differently (host and port given), is refused with 55000.
my $self_dsn = 'host=' . $coord->host . ' port=' . $coord->port . ' dbname=postgres';
$coord->safe_psql('postgres', "SELECT sharding.add_node('self', \$\$$self_dsn\$\$)");
($rc, $out, $err) = $coord->psql('postgres', "SELECT sharding.attach_node('self')");
like($err, qr/node "self" is this database: a coordinator cannot follow itself/,
	'attaching the coordinator to itself is still refused');
my ($src, $sout, $serr) = $coord->psql('postgres', q{
	DO $$ BEGIN PERFORM sharding.attach_node('self');
	EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'sqlstate=%', SQLSTATE; END $$});
like($serr, qr/sqlstate=55000/, 'the self-attach is refused with 55000');
is($coord->safe_psql('postgres', "SELECT count(*) FROM pg_subscription") . '/'
	  . $coord->safe_psql('postgres', "SELECT coalesce(sharding.this_node(), 'none')"),
	'0/none', 'the refused self-attach changed nothing here');
# A database of the same server is another database: not "this database".
$coord->safe_psql('postgres', 'CREATE DATABASE other');
$coord->safe_psql('other', 'CREATE EXTENSION sharding');
$coord->safe_psql('postgres', "SELECT sharding.add_node('other', \$\$$self_dsn\$\$ || ' dbname=other')");
($rc, $out, $err) = $coord->psql('postgres', "SELECT sharding.attach_node('other')");
is($rc, 0, 'another database of the coordinator\'s server can be attached') or diag($err);
$coord->safe_psql('postgres', "SELECT sharding.pin('m', 'orca', 'a')");
ok($coord->poll_query_until('other', "SELECT sharding.node_for('m', 'orca') = 'a'"),
	'and it follows');
# No probe connection is left open.
is($coord->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'sharding_probe_%'"),
	'0', 'the probe connections are closed');

$clone->stop;
$coord->stop;
done_testing();
