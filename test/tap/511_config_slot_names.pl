# Configuration slots named per coordinator (review LK-3 on the
# configuration feed, issue 35): a node follows its coordinator through a
# replication slot on the coordinator's instance, and slots belong to the
# instance, not to one of its databases. Two coordinators (databases ca and
# cb of one instance) call their nodes alike, n1 and n2, distinct databases
# of one other instance (a_n1, a_n2 and b_n1, b_n2):
#   1. both attach their nodes: four slots, two in each coordinator's
#      database, each active;
#   2. each node follows its own coordinator: a map made at A reaches A's
#      nodes and not B's, and the other way round;
#   3. A detaches its n1, B its n2: the other's node of that name keeps its
#      slot and goes on following; each one's DDL reaches its attached node
#      alone;
#   4. a node attached under 1.3 (old slot name sharding_config_<node>) keeps
#      working after ALTER EXTENSION sharding UPDATE: DDL reaches it, and
#      detach drops its slot;
#   5. names: the tags, the length and characters of slot names, and the
#      slots _config_slot_here finds (another tag: yes; another node's 1.3
#      name or another database's slot: no);
#   6. take_over on a promoted standby of the coordinators' instance: each
#      takes over its own n1 and n2, under its own (unchanged) tag.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my $coord = sharding_node('coord', db => 'ca');
$coord->safe_psql('postgres', 'CREATE DATABASE cb');
$coord->safe_psql('cb', 'CREATE EXTENSION dblink; CREATE EXTENSION sharding');
my $data = sharding_node('data', conf => 'max_prepared_transactions = 20');
my $tables = 'CREATE TABLE accounts (tenant text NOT NULL, id bigint, val text, PRIMARY KEY (tenant, id));';
my %co = (a => 'ca', b => 'cb');
my $slots_sql = sub {
	"SELECT count(*) || '/' || count(*) FILTER (WHERE active) FROM pg_replication_slots"
	  . " WHERE slot_name LIKE 'sharding_config%' AND database = '$_[0]'";
};
my $slots = sub { $coord->safe_psql('postgres', $slots_sql->($_[0])) };
# attach(x, n): attach_node at coordinator x, its error output ('' if none).
sub attach
{
	my ($x, $n) = @_;
	my ($rc, $out, $err) = $coord->psql($co{$x}, "SET statement_timeout = '150s'; SELECT sharding.attach_node('$n')");
	return $err;
}
for my $x ('a', 'b')
{
	my $c = $co{$x};
	for my $n ('n1', 'n2')
	{
		$data->safe_psql('postgres', "CREATE DATABASE ${x}_$n");
		$data->safe_psql("${x}_$n", "CREATE EXTENSION dblink; CREATE EXTENSION sharding; $tables");
	}
	$coord->safe_psql($c, $tables);
	$coord->safe_psql($c, "SELECT sharding.create_map('bank', 8, ARRAY['n1', 'n2']);
		SELECT sharding.add_node('n1', '" . sharding_dsn($data, "${x}_n1") . "'), sharding.add_node('n2', '" . sharding_dsn($data, "${x}_n2") . "');
		SELECT sharding.distribute('accounts', 'tenant', 'bank');");
}

# 1. Both attach their nodes.
for my $x ('a', 'b')
{
	is(attach($x, $_), '', "attach: coordinator $x attaches its $_") for ('n1', 'n2');
}
ok(wait_for_sql($coord, 'postgres', "SELECT (" . $slots_sql->('ca') . ") || ' ' || (" . $slots_sql->('cb') . ")", '2/2 2/2', 30),
	'attach: two active configuration slots in each coordinator\'s database');

# 2. Each node follows its own coordinator.
$coord->safe_psql('ca', "SELECT sharding.create_map('only_a', 4, ARRAY['n1', 'n2'])");
$coord->safe_psql('cb', "SELECT sharding.create_map('only_b', 4, ARRAY['n1', 'n2'])");
my $maps = "SELECT coalesce(string_agg(map, ',' ORDER BY map), '') FROM sharding.maps";
for my $x ('a', 'b')
{
	for my $n ('n1', 'n2')
	{
		ok(wait_for_sql($data, "${x}_$n", $maps, "bank,only_$x", 30), "follow: ${x}_$n has its coordinator's maps, none of the other's");
	}
}

# 3. A detaches its n1: B's n1 keeps its slot and follows.
my ($rc, $out, $err) = $coord->psql('ca', "SET statement_timeout = '60s'; SELECT sharding.detach_node('n1')");
is($err, '', 'detach: A detaches its n1');
is($data->safe_psql('a_n1', "SELECT count(*) FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = 'a_n1')"), '0', 'detach: A\'s n1 has no subscription left');
ok(wait_for_sql($coord, 'postgres', $slots_sql->('ca'), '1/1', 30), 'detach: A keeps one slot (its n2\'s)');
is($slots->('cb'), '2/2', 'detach: B keeps both slots, active');
$coord->safe_psql('cb', "SELECT sharding.create_map('more_b', 4, ARRAY['n1', 'n2'])");
ok(wait_for_sql($data, 'b_n1', $maps, 'bank,more_b,only_b', 30), 'detach: B\'s n1 follows B still');
is($data->safe_psql('a_n1', $maps), 'bank,only_a', 'detach: A\'s n1 keeps its copy, no more of B\'s');
# B detaches its n2: A's n2 keeps its slot and follows.
($rc, $out, $err) = $coord->psql('cb', "SET statement_timeout = '60s'; SELECT sharding.detach_node('n2')");
is($err, '', 'detach: B detaches its n2');
ok(wait_for_sql($coord, 'postgres', $slots_sql->('cb'), '1/1', 30), 'detach: B keeps one slot (its n1\'s)');
is($slots->('ca'), '1/1', 'detach: A keeps its n2\'s slot, active');
$coord->safe_psql('ca', "SELECT sharding.create_map('more_a', 4, ARRAY['n1', 'n2'])");
ok(wait_for_sql($data, 'a_n2', $maps, 'bank,more_a,only_a', 30), 'detach: A\'s n2 follows A still');
# A's DDL: reaches its n2 (attached), not B's nodes.
($rc, $out, $err) = $coord->psql('ca', "SET statement_timeout = '60s'; ALTER TABLE accounts ADD COLUMN note_a text");
is($err, '', 'ddl: A alters its distributed table');
my $col = sub { $data->safe_psql($_[0], "SELECT count(*) FROM pg_attribute WHERE attrelid = 'accounts'::regclass AND attname = '$_[1]'") };
is(join(' ', map { $col->($_, 'note_a') } qw(a_n1 a_n2 b_n1 b_n2)), '0 1 0 0', 'ddl: A\'s column reaches A\'s attached n2 alone');
($rc, $out, $err) = $coord->psql('cb', "SET statement_timeout = '60s'; ALTER TABLE accounts ADD COLUMN note_b text");
is($err, '', 'ddl: B alters its distributed table');
is(join(' ', map { $col->($_, 'note_b') } qw(a_n1 a_n2 b_n1 b_n2)), '0 0 1 0', 'ddl: B\'s column reaches B\'s attached n1 alone');

# 4. A node attached under 1.3 (slot sharding_config_m1), then the update.
$coord->safe_psql('postgres', 'CREATE DATABASE c13');
$coord->safe_psql('c13', "CREATE EXTENSION dblink; CREATE EXTENSION sharding VERSION '1.3'; $tables");
$data->safe_psql('postgres', 'CREATE DATABASE c13_m1');
$data->safe_psql('c13_m1', "CREATE EXTENSION dblink; CREATE EXTENSION sharding VERSION '1.3'; $tables");
$coord->safe_psql('c13', "SELECT sharding.create_map('bank', 8, ARRAY['m1']);
	SELECT sharding.add_node('m1', '" . sharding_dsn($data, 'c13_m1') . "');
	SELECT sharding.distribute('accounts', 'tenant', 'bank');
	SELECT sharding.attach_node('m1');");
is($coord->safe_psql('postgres', "SELECT string_agg(slot_name, ',') FROM pg_replication_slots WHERE database = 'c13'"),
	'sharding_config_m1', '1.3: the slot has the name 1.3 gives it');
$coord->safe_psql('c13', 'ALTER EXTENSION sharding UPDATE');
$data->safe_psql('c13_m1', 'ALTER EXTENSION sharding UPDATE');
$coord->safe_psql('c13', "SELECT sharding.create_map('after', 4, ARRAY['m1'])");
ok(wait_for_sql($data, 'c13_m1', $maps, 'after,bank', 30), '1.3: m1 follows after the update');
($rc, $out, $err) = $coord->psql('c13', "SET statement_timeout = '60s'; ALTER TABLE accounts ADD COLUMN note_13 text");
is($err, '', '1.3: the coordinator alters its distributed table');
is($col->('c13_m1', 'note_13'), '1', '1.3: DDL reaches m1 (its old slot counts as attached)');
($rc, $out, $err) = $coord->psql('c13', "SET statement_timeout = '60s'; SELECT sharding.detach_node('m1')");
is($err, '', '1.3: detach m1 after the update');
is($coord->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots WHERE database = 'c13'"), '0',
	'1.3: its old slot is dropped');
is($slots->('ca') . ' ' . $slots->('cb'), '1/1 1/1', '1.3: A\'s and B\'s slots are untouched');

# 5. Names: A's and B's tags differ, and are their moves' tags; a slot name
# stays within 63 characters of [a-z0-9_]; a slot with another tag (the
# system identifier changed: pg_upgrade) is found, another node's 1.3 name
# is not.
my %tag = map { $_ => $coord->safe_psql($co{$_}, 'SELECT sharding._coordinator_tag()') } ('a', 'b');
like($tag{a}, qr/^[0-9a-f]{6}$/, "names: A's tag has six hex digits ($tag{a})");
isnt($tag{a}, $tag{b}, "names: B's tag differs ($tag{b})");
is($coord->safe_psql('ca', "SELECT sharding._config_slot('n2') || ' ' || (sharding._move_name('bank', 1) LIKE 'sharding_move_' || sharding._coordinator_tag() || '_bank_1')"),
	"sharding_config_$tag{a}_n2 true", 'names: A\'s n2 slot carries A\'s tag, as A\'s move names do');
is($coord->safe_psql('ca', "SELECT string_agg((length(s) <= 63 AND s ~ '^[a-z0-9_]+\$')::text, ' ') FROM (SELECT sharding._config_slot(x) AS s"
	  . " FROM unnest(ARRAY[repeat('a', 40), repeat('b', 41), 'Node-X ü', repeat('Ü', 63)]) AS x) AS q"),
	'true true true true', 'names: at most 63 characters of [a-z0-9_], whatever the node name');
$coord->safe_psql('c13', "SELECT sharding.add_node('m2', '" . sharding_dsn($data, 'c13_m1') . "'), sharding.add_node('abcdef_m3', '" . sharding_dsn($data, 'c13_m1') . "');
	SELECT pg_create_logical_replication_slot('sharding_config_abcdef_m2', 'pgoutput');
	SELECT pg_create_logical_replication_slot('sharding_config_abcdef_m3', 'pgoutput');");
is($coord->safe_psql('c13', "SELECT sharding._config_slot_here('m2') || ' ' || sharding._config_slot_here('m3') || ' ' || sharding._config_slot_here('abcdef_m3')"),
	'sharding_config_abcdef_m2 ' . $coord->safe_psql('c13', "SELECT sharding._config_slot('m3')") . ' sharding_config_abcdef_m3',
	'names: m2\'s slot of another tag is found; abcdef_m3\'s 1.3 slot is its, not m3\'s');
is($coord->safe_psql('ca', "SELECT sharding._config_slot_here('m2')"), "sharding_config_$tag{a}_m2", 'names: not from another database');
$coord->safe_psql('c13', "SELECT pg_drop_replication_slot('sharding_config_abcdef_m2'), pg_drop_replication_slot('sharding_config_abcdef_m3')");

# 6. take_over on a promoted standby of the coordinators' instance (the
# same system identifier and database OIDs: the same tags): each
# coordinator takes its n1 and n2 over and no other's.
is(attach('a', 'n1') . attach('b', 'n2'), '', 'take_over: A attaches its n1 again, B its n2');
my $standby = sharding_standby($coord, 'standby', 'base');
ok(wait_for_sql($standby, 'cb', "SELECT count(*) FROM sharding.nodes", '2', 60), 'take_over: the standby has caught up');
$coord->stop('immediate');
$standby->promote;
ok(wait_for_sql($standby, 'postgres', 'SELECT NOT pg_is_in_recovery()', 't', 60), 'take_over: the standby is promoted');
$standby->safe_psql('postgres', "ALTER DATABASE $_ SET sharding.coordinator_dsn = '" . sharding_dsn($standby, $_) . "'") for ('ca', 'cb');
for my $x ('a', 'b')
{
	($rc, $out, $err) = $standby->psql($co{$x}, "SET statement_timeout = '120s'; SELECT sharding.take_over()");
	is("$out|$err", '2|', "take_over: coordinator $x takes over its two nodes");
}
ok(wait_for_sql($standby, 'postgres', "SELECT (" . $slots_sql->('ca') . ") || ' ' || (" . $slots_sql->('cb') . ")", '2/2 2/2', 30),
	'take_over: two active configuration slots in each coordinator\'s database');
is(join(' ', map { $standby->safe_psql('postgres', "SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM pg_replication_slots WHERE database = '$co{$_}'") } ('a', 'b')),
	"sharding_config_$tag{a}_n1,sharding_config_$tag{a}_n2 sharding_config_$tag{b}_n1,sharding_config_$tag{b}_n2",
	'take_over: each coordinator\'s slots carry its tag (the same as before the promotion)');
$standby->safe_psql($co{$_}, "SELECT sharding.create_map('taken_$_', 2, ARRAY['n1', 'n2'])") for ('a', 'b');
for my $x ('a', 'b')
{
	ok(wait_for_sql($data, "${x}_$_", "SELECT string_agg(map, ',' ORDER BY map) FROM sharding.maps WHERE map LIKE 'taken%'", "taken_$x", 30),
		"take_over: ${x}_$_ follows its coordinator's new server, not the other's") for ('n1', 'n2');
}

done_testing();
