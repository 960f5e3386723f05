# Rebalance jobs (docs/rebalance.md): a third node joins a two-node map of 8
# shards with two distributed tables under 4 writers. rebalance_start(...,
# max_parallel => 2) returns at once; sampled move_progress never shows more
# than 2 moves in flight nor two of one shard; rebalance_wait returns done;
# the moves are rebalance(..., dry_run => true)'s plan; every row matches the
# writers' log on its owner only; epochs rose by one per moved shard;
# followers agree; no replication object is left. Then a second job of the map
# is refused (55006) while one runs, changing nothing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 20000);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

my $plan = $q->("SELECT string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical)
                 FROM sharding.rebalance('bank', ARRAY['n1', 'n2', 'n3'], dry_run => true)");
my $epochs0 = $q->("SELECT string_agg(logical || '\@' || epoch, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'");
note "plan: $plan";

my $writers = start_writers(4);
sleep 2;
my $t0 = time;
my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'], max_parallel => 2)");
my $start_s = time - $t0;
my $state0 = $q->("SELECT state FROM sharding.rebalance_jobs WHERE job = $job");
ok($start_s < 3 && $state0 =~ /^(queued|running)$/,
	sprintf('rebalance_start returned job %s at once (%.2f s), state %s', $job, $start_s, $state0));

# A sampler: move_progress every 50 ms, while the job runs.
my $sampler = start_sampler($job,
	'in_flight integer' => "count(*) FILTER (WHERE $IN_FLIGHT)",
	'shards integer' => "count(DISTINCT logical) FILTER (WHERE $IN_FLIGHT)",
	'rows integer' => 'count(*)');

# 55006: a second job of the map while this one runs; nothing changes.
my ($rc, $out, $err) = $c->psql('coord', "SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2'])");
like($err, qr/already has a rebalance job in progress/, 'a second job of the map is refused');
($rc, $out, $err) = $c->psql('coord', "SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2'])",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55006/, '... with SQLSTATE 55006');
($rc, $out, $err) = $c->psql('coord', "SELECT sharding.drain_node('bank', 'n1')", extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/55006/, 'drain_node of the same map too (55006)');
is($q->("SELECT count(*) FROM sharding.move_jobs"), '1', 'the refused starts left no job');

# The progress view while the job runs: shown twice.
for my $i (1, 2)
{
	usleep(700_000);
	note "move_progress ($i):\n"
	  . $q->("SELECT logical, source, destination, phase, rows_copied, lag_bytes, bar, time_left, waiting
	         FROM sharding.move_progress WHERE job = $job ORDER BY move");
}

my $final = $q->("SELECT sharding.rebalance_wait($job, '180 s')");
my $job_s = time - $t0;
is($final, 'done', sprintf('rebalance_wait returns done (%.1f s)', $job_s));
is(finish_sampler($sampler), '', 'the sampler ran without error');
sleep 1;
my $werr = stop_writers($writers);
is($werr, '', 'four writers ran to the end without error');

my $samples = $q->("SELECT count(*) || ' ' || coalesce(max(in_flight), -1) || ' ' || count(*) FILTER (WHERE in_flight <> shards) FROM samples");
my ($n_samples, $max_in_flight, $dup_shard) = split / /, $samples;
note "samples: $n_samples, most moves in flight at once: $max_in_flight";
ok($n_samples >= 5, "move_progress was sampled while the job ran ($n_samples samples)");
ok($max_in_flight >= 1 && $max_in_flight <= 2, "never more than max_parallel = 2 moves in flight (at most $max_in_flight seen)");
is($dup_shard, '0', 'never two moves of one shard in flight');

is($q->("SELECT string_agg(logical || ':' || source || '>' || destination, ' ' ORDER BY logical)
         FROM sharding.move_journal WHERE job = $job"), $plan, "the job's moves are rebalance(dry_run)'s plan");
is($q->("SELECT moves_total || '/' || moves_done || '/' || moves_failed FROM sharding.rebalance_jobs WHERE job = $job"),
	scalar(split(/ /, $plan)) . '/' . scalar(split(/ /, $plan)) . '/0', 'rebalance_jobs counts every move done');

my %moved = map { (split /:/)[0] => 1 } split / /, $plan;
my $want_epochs = join ' ', map { my ($l, $e) = split /\@/; "$l\@" . ($e + ($moved{$l} ? 1 : 0)) } split / /, $epochs0;
is($q->("SELECT string_agg(logical || '\@' || epoch, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'"),
	$want_epochs, 'epochs rose by exactly one per moved shard');
is($q->("SELECT count(DISTINCT node) FROM sharding.shards WHERE map = 'bank' AND node = 'n3'"), '1', 'n3 owns shards now');
ok(followers_agree(), 'every follower shows the new owners and epochs');

my $stats = $q->("SELECT sum(committed) || ' ' || sum(refused) || ' ' || coalesce(sum(cardinality(anomalies)), 0) FROM writer_stats");
my ($committed, $refused, $anomalies) = split / /, $stats;
note "writers committed $committed operations, $refused refusals retried";
ok($committed > 100, "the writers kept writing during the job ($committed operations)");
is($anomalies, '0', 'every update and delete found its row where node_for said');
check_data('after the job');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'no replication object, trigger, frozen shard or live move is left');

# After the job, a new one may start (nothing to do: done at once).
my $j2 = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'])");
is($q->("SELECT state || ' ' || moves_total FROM sharding.rebalance_jobs WHERE job = $j2"), 'done 0',
	'once the job ended, a new job of the map starts (balanced already: done with no move)');

done_testing();
