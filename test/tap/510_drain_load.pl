# Rebalance jobs (docs/rebalance.md): drain_node under 4 writers empties a
# node of its shards and its pinned keys (pins go to the owner of their
# shard), after which drop_node succeeds; then a job with strategy 'load'
# carries out rebalance_by_load's plan. Data exact against the writers' log
# throughout.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 10000);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

# Spread over three nodes first (a job, no writers), then pin a whale to n3.
my $j0 = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'], max_parallel => 2)");
is($q->("SELECT sharding.rebalance_wait($j0, '120 s')"), 'done', 'the map spreads over n1, n2, n3');
my $whale = $q->("SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) x
                  WHERE sharding.node_for('bank', t) = 'n1' LIMIT 1");
is($q->("SELECT sharding.isolate('bank', '$whale', 'n3') > 0"), 't', "tenant $whale is pinned to n3 with its rows");
ok(followers_agree(), 'followers agree before the drain');

my $writers = start_writers(4);
sleep 2;
my $owned = $q->("SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n3'");
my $job = $q->("SELECT sharding.drain_node('bank', 'n3', max_parallel => 2)");
is($q->("SELECT strategy || ' ' || moves_total FROM sharding.rebalance_jobs WHERE job = $job"),
	'drain ' . ($owned + 1), "drain_node plans a move per shard of n3 ($owned) and one for the pinned key");
my $final = $q->("SELECT sharding.rebalance_wait($job, '180 s')");
is($final, 'done', 'the drain job ends done');
note $q->("SELECT state, moves_total, moves_done, moves_failed, error FROM sharding.rebalance_jobs WHERE job = $job");
sleep 1;
is(stop_writers($writers), '', 'four writers ran to the end without error');

is($q->("SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n3'")
	. '/' . $q->("SELECT count(*) FROM sharding.pins WHERE map = 'bank' AND node = 'n3'"),
	'0/0', 'n3 owns no shard and holds no pin');
is($q->("SELECT p.node = s.node FROM sharding.pins p JOIN sharding.shards s
         ON s.map = p.map AND s.logical = sharding.logical_shard('bank', p.key) WHERE p.map = 'bank' AND p.key = '$whale'"),
	't', 'the pinned key went to the owner of its shard');
is($q->("SELECT string_agg(node || '=' || n, ' ' ORDER BY node) FROM
         (SELECT node, count(*) n FROM sharding.shards WHERE map = 'bank' GROUP BY node) x"),
	'n1=4 n2=4', 'the shards are count-balanced over the other owners');
ok(followers_agree(), 'followers agree after the drain');
check_data('after the drain');
is($d->safe_psql('n3', 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)'), '0', 'n3 holds no row');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');
$q->("SELECT sharding.detach_node('n3')");
my ($rc, $out, $err) = $c->psql('coord', "SELECT sharding.drop_node('n3')");
is($rc . $err, '0', 'drop_node succeeds after the drain');

# Strategy load: shard 0 is hot.
my $loads = "'{40,1,1,1,1,1,1,1}'";
my $plan = $q->("SELECT string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical)
                 FROM sharding.rebalance_by_load('bank', ARRAY['n1', 'n2'], $loads, 1.2, dry_run => true)");
ok($plan ne '', "rebalance_by_load plans moves ($plan)");
my $lj = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2'], 'load', $loads, 1.2, max_parallel => 2)");
is($q->("SELECT sharding.rebalance_wait($lj, '120 s')"), 'done', 'the load job ends done');
is($q->("SELECT strategy || ' ' || string_agg(logical || ':' || source || '>' || destination, ' ' ORDER BY logical)
         FROM sharding.move_journal m JOIN sharding.rebalance_jobs j USING (job) WHERE job = $lj GROUP BY strategy"),
	"load $plan", "the load job's moves are rebalance_by_load(dry_run)'s plan");
ok(followers_agree('n1', 'n2'), 'followers agree after the load job (n3 detached)');
check_data('after the load job');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

done_testing();
