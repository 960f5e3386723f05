# Coexistence with pg_stat_statements: a cluster preloading both libraries
# (in both orders) counts every statement in both: the hooks chain.
# (Was test/harness/fanout_pgss.sh.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 8;
use lib 'lib';
use ShardingNode;

my $i = 0;
for my $order ('pg_stat_statements,sharding', 'sharding,pg_stat_statements')
{
	my $node = sharding_node('pgss' . ++$i, preload => 0, conf => "shared_preload_libraries = '$order'");
	my $sq = sub { return sharding_q($node, 'postgres', $_[0]); };
	is($sq->('SHOW shared_preload_libraries'), $order, "a cluster preloading $order");
	$node->safe_psql('postgres', <<'SQL');
CREATE EXTENSION pg_stat_statements;
SELECT sharding.create_map('m', 8, ARRAY['a', 'b']);
CREATE TABLE events (id bigint PRIMARY KEY, tenant text NOT NULL);
ALTER TABLE events REPLICA IDENTITY FULL;
SELECT sharding.distribute('events', 'tenant', 'm');
INSERT INTO events SELECT i, 't' || (i % 10) FROM generate_series(1, 100) AS i;
SELECT sharding.fanout_reset();
SELECT pg_stat_statements_reset();
SQL
	$node->safe_psql('postgres', <<'SQL');
PREPARE one(text) AS SELECT count(*) FROM events WHERE tenant = $1;
EXECUTE one('t1');
EXECUTE one('t2');
EXECUTE one('t3');
SELECT count(*) FROM events WHERE tenant LIKE 't%';
SELECT count(*) FROM events WHERE tenant LIKE 't%';
SQL
	is($sq->("SELECT queries || '|' || single_shard || '|' || fan_out FROM sharding.fanout_stats WHERE table_name = 'events'"),
		'5|3|2', "$order: fanout_stats counts 3 single-shard and 2 fan-out statements");
	is($sq->("SELECT string_agg(calls::text, ',' ORDER BY calls) FROM pg_stat_statements WHERE query LIKE '%FROM events WHERE%'"),
		'2,3', "$order: pg_stat_statements counts the same statements (3 and 2 calls)");
	is($sq->("SELECT count(*) FROM pg_stat_statements WHERE query LIKE '%fanout_stats%'"),
		'1', "$order: pg_stat_statements also sees the statements that read fanout_stats");
	$node->stop;
}
