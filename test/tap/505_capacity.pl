# Rebalance jobs (docs/rebalance.md, Parallelism and limits): a job respects
# the replication limits of its nodes. The data nodes' instance allows two WAL
# senders (max_wal_senders = 2), one move's worth (its slot's set-up
# connection, then its stream), so one move can set up at a time from it: a
# drain whose moves go to two destinations (and could run two at once with
# max_parallel => 2) makes a move wait while another is in flight, says why in
# move_progress.waiting (each queued move its own reason), and does not fail.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 40000, data_conf => "max_wal_senders = 2\n");
my $q = sub { return $c->safe_psql('coord', $_[0]); };
is($d->safe_psql('postgres', 'SHOW max_wal_senders'), '2', 'the data nodes allow two WAL senders');

my $j0 = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'])");
is($q->("SELECT sharding.rebalance_wait($j0, '120 s')"), 'done', 'the map spreads over n1, n2, n3 (one move at a time)');

my $plan = $q->("SELECT string_agg(DISTINCT to_node, ',' ORDER BY to_node) FROM sharding.rebalance('bank', ARRAY['n2', 'n3'], dry_run => true)");
is($plan, 'n2,n3', 'draining n1 moves shards into two destinations');
my $job = $q->("SELECT sharding.drain_node('bank', 'n1', max_parallel => 2)");
my $sampler = start_sampler($job,
	'in_flight integer' => "count(*) FILTER (WHERE $IN_FLIGHT)",
	'waiting text' => "string_agg(waiting, '; ')",
	'own boolean' => "bool_and(waiting IS NULL OR waiting LIKE '%moves in flight%' "
	  . "OR waiting LIKE '%source ' || source || ' %' OR waiting LIKE '%destination ' || destination || ' %')");
is($q->("SELECT sharding.rebalance_wait($job, '180 s')"), 'done', 'the job does not fail: it ends done');
finish_sampler($sampler);
is($q->("SELECT count(*) > 0 FROM samples WHERE in_flight >= 1 AND waiting ~ 'no free WAL sender'"), 't',
	'a move waited for WAL senders while another was in flight');
like($q->("SELECT string_agg(DISTINCT waiting, ' | ') FROM samples WHERE waiting IS NOT NULL"),
	qr/no free WAL sender \(max_wal_senders/, 'a waiting move says the source has no free WAL sender');
is($q->("SELECT count(*) FILTER (WHERE NOT own) || '/' || count(*) FROM samples WHERE waiting IS NOT NULL"), '0/'
	  . $q->("SELECT count(*) FROM samples WHERE waiting IS NOT NULL"),
	'each waiting move gives its own reason (about its own source or destination)');
is($q->("SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'"), '0', 'n1 owns nothing');
check_data('after the drain');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

done_testing();
