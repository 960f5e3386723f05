# Fan-out counters beyond their capacity (docs/observe.md). They
# used to have 4,096 fixed slots, never freed: tables seen later were
# silently not counted. Now sharding.fanout_max (here 16) sizes them, the
# least-used tables are evicted as pg_stat_statements evicts statements, and
# fanout_info() counts the evictions. Busy tables keep exact counts while
# one-off tables churn through the rest, also with several databases and
# concurrent sessions.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('fanout', conf => 'sharding.fanout_max = 16');

# tables(DB, PREFIX, N): N distributed tables PREFIX1..PREFIXN in DB.
sub tables
{
	my ($db, $prefix, $n) = @_;
	$node->safe_psql($db, join("\n",
		"SELECT sharding.create_map('m', 8, ARRAY['a', 'b']) WHERE NOT EXISTS (SELECT FROM sharding.maps WHERE map = 'm');",
		map { "CREATE TABLE $prefix$_ (k text PRIMARY KEY, v integer); SELECT sharding.distribute('$prefix$_', 'k', 'm');" } 1 .. $n));
}
# run(DB, TABLE, SINGLE, FANOUT): that many single-shard and fan-out statements.
sub run
{
	my ($db, $t, $single, $fanout) = @_;
	$node->safe_psql($db, join("\n",
		(map { "SELECT count(*) FROM $t WHERE k = 'key-$_';" } 1 .. $single),
		(map { "SELECT count(*) FROM $t WHERE v > $_;" } 1 .. $fanout)));
}
sub info { $node->safe_psql($_[0], "SELECT slots || '|' || used || '|' || evicted || '|' || evicted_all FROM sharding.fanout_info()") }
sub counts
{
	my ($db, $t) = @_;
	$node->safe_psql($db, "SELECT queries || '|' || single_shard || '|' || fan_out FROM sharding.fanout_stats WHERE table_name = '$t'");
}
sub entries { $node->safe_psql($_[0], "SELECT count(*) FROM sharding._fanout_counts() WHERE relid <> 0") }

is($node->safe_psql('postgres', 'SHOW sharding.fanout_max'), '16', 'sharding.fanout_max is set at server start');
is(info('postgres'), '16|0|0|0', 'fanout_info: 16 slots, none used, nothing evicted');

# Four busy tables, then thirty tables counted once each.
tables('postgres', 'hot', 4);
tables('postgres', 'cold', 30);
run('postgres', "hot$_", 15, 5) for 1 .. 4;
is(info('postgres'), '16|4|0|0', 'four tables counted, nothing evicted');
run('postgres', "cold$_", 1, 0) for 1 .. 30;
is(info('postgres'), '16|16|18|18', '34 tables through 16 slots: 18 evicted, 16 counted');
is(entries('postgres'), '16', 'this database holds the 16 entries');
is(join(',', map { counts('postgres', "hot$_") } 1 .. 4), join(',', ('20|15|5') x 4),
	'the busy tables were kept, with exact counts');
my $cold_kept = $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE queries = 1) || '/' || count(*) FILTER (WHERE queries = 0) FROM sharding.fanout_stats WHERE table_name LIKE 'cold%'");
is($cold_kept, '12/18', 'the one-off tables share the other 12 slots; the 18 evicted show zeros');
is($node->safe_psql('postgres', 'SELECT count(*) FROM sharding.fanout_stats'), '34', 'the view lists every distributed table');

# An evicted table counted again: from now on, since then.
my $gone = $node->safe_psql('postgres',
	"SELECT table_name FROM sharding.fanout_stats WHERE table_name LIKE 'cold%' AND queries = 0 ORDER BY table_name LIMIT 1");
my $before = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
run('postgres', $gone, 0, 1);
is(counts('postgres', $gone), '1|0|1', "an evicted table ($gone) is counted again");
is($node->safe_psql('postgres', "SELECT since > '$before' FROM sharding.fanout_stats WHERE table_name = '$gone'"), 't',
	'and its since is when it came back, not the reset before its eviction');
is(info('postgres'), '16|16|19|19', 'its return evicted one more table');

# A second database shares the slots.
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', 'CREATE EXTENSION sharding');
tables('other', 'o', 10);
run('other', "o$_", 1, 0) for 1 .. 10;
my ($slots, $used, $ev_other, $ev_all) = split /\|/, info('other');
my $ev_here = (split /\|/, info('postgres'))[2];
is($used, '16', 'two databases: still 16 tables counted');
is($ev_other, 10 - entries('other'), 'the other database\'s evictions: its tables counted minus those kept');
is($ev_all, $ev_here + $ev_other, 'evicted_all adds up both databases\' evictions');
is($used, entries('postgres') + entries('other'), 'used adds up both databases\' entries');
is(join(',', map { counts('postgres', "hot$_") } 1 .. 4), join(',', ('20|15|5') x 4),
	'the busy tables of the first database kept their counts');

# fanout_reset forgets this database's tables and its evictions only.
$node->safe_psql('postgres', 'SELECT sharding.fanout_reset()');
is(info('postgres'), "16|" . entries('other') . "|0|$ev_all", 'a reset frees this database\'s slots and zeroes its eviction count');
is(counts('postgres', 'hot1'), '0|0|0', 'and its counters');
is((split /\|/, info('other'))[2], $ev_other, 'the other database\'s evictions are its own');

# Concurrent sessions churn through the slots while one busy table is
# counted by all of them: none of its statements is lost or counted twice.
run('postgres', 'hot1', 50, 0);
my @s = map { $node->background_psql('postgres') } 1 .. 4;
for my $i (0 .. 3)
{
	$s[$i]->{stdin} .= "DO \$\$ DECLARE key text; BEGIN FOR i IN 1..200 LOOP
		key := 'x' || i;
		PERFORM count(*) FROM hot1 WHERE k = key;
		EXECUTE format('SELECT count(*) FROM %I WHERE v > 0', 'cold' || ((i * 7 + $i) % 30 + 1));
	END LOOP; END \$\$;\n";
	$s[$i]->{run}->pump_nb;
}
$_->query_safe('SELECT 1') for @s;
$_->quit for @s;
is(counts('postgres', 'hot1'), '850|850|0', '4 sessions x 200 statements on the busy table, amid evictions: all counted once');
my $ev_after = (split /\|/, info('postgres'))[2];
cmp_ok($ev_after, '>', 100, "the cold tables kept evicting one another meanwhile ($ev_after evictions)");
is((split /\|/, info('postgres'))[1], '16', 'and the slots stayed full, never over');

$node->stop;

# Without preload there are no counters: fanout_info says so, as the view.
my $plain = sharding_node('no_preload', preload => 0);
my ($rc, $out, $err) = $plain->psql('postgres', 'SELECT count(*) FROM sharding.fanout_info()');
is("$rc|$out", '0|0', 'without preload fanout_info returns no row');
like($err, qr/NOTICE:  fan-out counting is off: sharding is not in shared_preload_libraries/, 'and says why in a NOTICE');
$plain->stop;
done_testing();
