# Rebalance jobs (docs/rebalance.md, Where jobs run) without
# shared_preload_libraries: rebalance_start still returns a job, nothing runs
# it in the background, and CALL sharding.rebalance_run(job) carries it out in
# the session.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 5000, preload => 0);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

is($q->("SHOW shared_preload_libraries"), '', 'the library is not preloaded on the coordinator');
my $plan = $q->("SELECT string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical)
                 FROM sharding.rebalance('bank', ARRAY['n1', 'n2', 'n3'], dry_run => true)");
my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'], max_parallel => 2)");
is($q->("SELECT sharding.rebalance_wait($job, '3 s')"), 'queued', 'without preload the job waits, queued');
is($q->("SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'sharding move%'"), '0', 'no background worker');
my $writers = start_writers(2);
my ($rc, $out, $err) = $c->psql('coord', "CALL sharding.rebalance_run($job)");
is($rc . $err, '0', 'CALL sharding.rebalance_run(job) returns without error');
is(stop_writers($writers), '', 'two writers ran to the end without error');
is($q->("SELECT state || ' ' || moves_done || '/' || moves_total FROM sharding.rebalance_jobs WHERE job = $job"),
	'done ' . scalar(split(/ /, $plan)) . '/' . scalar(split(/ /, $plan)), 'the job is done, every move');
is($q->("SELECT string_agg(logical || ':' || source || '>' || destination, ' ' ORDER BY logical)
         FROM sharding.move_journal WHERE job = $job"), $plan, "its moves are rebalance(dry_run)'s plan");
ok(followers_agree(), 'followers agree');
check_data('after rebalance_run');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');
($rc, $out, $err) = $c->psql('coord', "CALL sharding.rebalance_run($job)");
is($rc . $err, '0', 'running an ended job again returns at once');
($rc, $out, $err) = $c->psql('coord', "BEGIN; CALL sharding.rebalance_run($job); COMMIT;");
ok($rc == 0 || $err =~ /invalid transaction termination/, 'inside a transaction block it cannot commit between moves (or has nothing to do)');

done_testing();
