# DROP TABLE of a distributed table forgets it (issue 35): its row in
# sharding.distributed_tables goes, at the coordinator and, through the
# configuration the nodes follow, at every data node; a table created later
# under the same name is not distributed. Plain and partitioned tables,
# with the library preloaded (the drop propagates to the nodes) and without
# it (a coordinator with no attached node). While a move of the map is in
# flight the drop waits for it, at most lock_timeout, then 55006 naming the
# move, and the table stays distributed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

# Propagated DDL commits on the nodes by two-phase commit.
my ($coord, $a, $b) = move_cluster(node_conf => 'max_prepared_transactions = 10');
load_rows($coord, $a, $b, 20);
my $rows = "SELECT coalesce(string_agg(table_name, ',' ORDER BY table_name), '-') FROM sharding.distributed_tables";

# Plain: distribute creates it on the nodes; DROP TABLE drops it there too.
$coord->safe_psql('coord', "CREATE TABLE ledger (tenant text NOT NULL, id bigint, PRIMARY KEY (tenant, id));
                            SELECT sharding.distribute('ledger', 'tenant', 'bank')");
wait_for_sql($_->[0], $_->[1], $rows, 'accounts,ledger') for ([$a, 'n1'], [$b, 'n2']);
$coord->safe_psql('coord', 'DROP TABLE ledger');
is($coord->safe_psql('coord', $rows), 'accounts', 'preloaded, plain: DROP TABLE removes its row at the coordinator');
ok(wait_for_sql($a, 'n1', $rows, 'accounts', 30) && wait_for_sql($b, 'n2', $rows, 'accounts', 30),
	'preloaded, plain: and at every data node');
$coord->safe_psql('coord', 'CREATE TABLE ledger (tenant text NOT NULL, id bigint, PRIMARY KEY (tenant, id))');
is($coord->safe_psql('coord', $rows), 'accounts', 'a table created again under the name is not distributed');

# Partitioned (created on every node first, as docs/partitions.md says).
my $part = "CREATE TABLE events (tenant text NOT NULL, id bigint, PRIMARY KEY (tenant, id)) PARTITION BY HASH (tenant);
            CREATE TABLE events_0 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 0);
            CREATE TABLE events_1 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 1);";
$_->[0]->safe_psql($_->[1], $part) for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
$coord->safe_psql('coord', "SELECT sharding.distribute('events', 'tenant', 'bank')");
wait_for_sql($_->[0], $_->[1], $rows, 'accounts,events') for ([$a, 'n1'], [$b, 'n2']);
$coord->safe_psql('coord', 'DROP TABLE events_1');
is($coord->safe_psql('coord', $rows), 'accounts,events', 'preloaded, partitioned: dropping one partition keeps the table distributed');
$coord->safe_psql('coord', 'DROP TABLE events');
is($coord->safe_psql('coord', $rows), 'accounts', 'preloaded, partitioned: DROP TABLE removes its row at the coordinator');
ok(wait_for_sql($a, 'n1', $rows, 'accounts', 30) && wait_for_sql($b, 'n2', $rows, 'accounts', 30),
	'preloaded, partitioned: and at every data node');
is($a->safe_psql('n1', "SELECT to_regclass('events') IS NULL"), 't', 'the drop ran on the nodes');

# During a move of the map: held in its copy by a session at the
# destination locking accounts (the move's first delete there waits).
$coord->safe_psql('coord', "CREATE TABLE ledger2 (tenant text NOT NULL, id bigint, PRIMARY KEY (tenant, id));
                            SELECT sharding.distribute('ledger2', 'tenant', 'bank')");
my $S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $h = hold_table($b, 'n2', 'accounts');
my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name LIKE 'sharding_move_%' "
	  . "AND wait_event_type = 'Lock'", 't', 120), 'a move of the map held in its copy');
my ($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\nSET lock_timeout = '2s'; DROP TABLE ledger2");
like($err, qr/ERROR:  55006: .*move \d+ of logical shard $S of map "bank"/, 'DROP TABLE during a move of its map: 55006 naming the move')
  or diag($err);
is($coord->safe_psql('coord', $rows), 'accounts,ledger2', 'the table stays, distributed');
release_table($b, 'n2', $h);
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move completes');
$coord->safe_psql('coord', 'DROP TABLE ledger2');
is($coord->safe_psql('coord', $rows), 'accounts', 'after the move, DROP TABLE removes its row');

# Without the library preloaded: a coordinator with no attached node (with
# nodes, unpropagated DDL of a distributed table is refused, docs/ddl.md).
my $solo = sharding_node('solo', db => 'solo', preload => 0);
$solo->safe_psql('solo', "SELECT sharding.create_map('m', 4, ARRAY['x', 'y']);
                          CREATE TABLE t (k text PRIMARY KEY);
                          CREATE TABLE p (k text PRIMARY KEY) PARTITION BY HASH (k);
                          CREATE TABLE p_0 PARTITION OF p FOR VALUES WITH (MODULUS 1, REMAINDER 0);
                          SELECT sharding.distribute('t', 'k', 'm'), sharding.distribute('p', 'k', 'm');");
$solo->safe_psql('solo', 'DROP TABLE t');
is($solo->safe_psql('solo', $rows), 'p', 'not preloaded, plain: DROP TABLE removes its row');
$solo->safe_psql('solo', 'DROP TABLE p');
is($solo->safe_psql('solo', $rows), '-', 'not preloaded, partitioned: DROP TABLE removes its row');
$solo->safe_psql('solo', 'CREATE TABLE t (k text PRIMARY KEY)');
is($solo->safe_psql('solo', $rows), '-', 'not preloaded: a table created again under the name is not distributed');
# The table's owner, a role that may not change the configuration, drops it.
$solo->safe_psql('solo', "CREATE ROLE app LOGIN; GRANT CREATE ON SCHEMA public TO app;
                          SET ROLE app; CREATE TABLE owned (k text PRIMARY KEY); RESET ROLE;
                          SELECT sharding.distribute('owned', 'k', 'm');");
($rc, $out, $err) = $solo->psql('solo', "SET ROLE app; DELETE FROM sharding.distributed_tables");
like($err, qr/permission denied for table distributed_tables/, 'the owner cannot change sharding.distributed_tables itself');
$solo->safe_psql('solo', 'SET ROLE app; DROP TABLE owned');
is($solo->safe_psql('solo', $rows), '-', 'its owner drops a distributed table: the row goes');

done_testing();
