# A dead worker's jobs come back by themselves. Worker A claims a batch
# with a 1-second lease (the claim commits) and then hangs holding nothing
# but the lease; its backend is killed with pg_terminate_backend. Worker D
# holds other jobs with a long lease. Once A's lease lapses, worker B
# reclaims exactly A's jobs (attempts = 2), never D's; A's stale
# completions are refused by the fence.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;

my $node = queue_node('queue_dead_worker', 'jobs');
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql("INSERT INTO jobs (key, created) SELECT 'job-' || g, now() - (100 - g) * interval '1 second' FROM generate_series(1, 30) g");

# D: a live worker with a long lease on the 10 oldest jobs.
my $d_ids = sql("SELECT array_agg(id ORDER BY id) FROM sharding.claim(NULL::jobs, 'D', 10, '1 hour')");

# A: claims 10 with a 1-second lease (committed), prints them, then hangs.
my ($a, $a_ids) = start_stuck_worker($node, 'worker_a',
	"SELECT array_agg(id ORDER BY id) FROM sharding.claim(NULL::jobs, 'A', 10, '1 second')", 120);
$a_ids //= '';
is(sql("SELECT count(*) = 10 AND bool_and(owner = 'A' AND status = 'processing') FROM jobs WHERE id = ANY ('$a_ids')"), 't',
	"worker A holds a batch of 10 ($a_ids)");

is(sql("SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'worker_a'"), 't',
	"worker A's backend is terminated");
my ($a_rc) = sharding_finish($a);
isnt($a_rc, 0, "worker A's session died (psql exit status $a_rc)");
is(sql("SELECT count(*) = 10 AND bool_and(owner = 'A' AND status = 'processing') FROM jobs WHERE id = ANY ('$a_ids')"), 't',
	'its jobs stay leased to A until the lease lapses');

# Wait for A's lease to lapse (1 second after its claim).
sharding_wait($node, 'postgres', "SELECT bool_and(claim_expires < now()) FROM jobs WHERE id = ANY ('$a_ids')", 't', 5);
my $b_ids = sql("SELECT array_agg(id ORDER BY id) FROM sharding.claim(NULL::jobs, 'B', 10, '1 hour')");
is(sql("SELECT '$b_ids'::bigint[] = '$a_ids'::bigint[]"), 't', "worker B reclaims exactly A's jobs ($b_ids)");
is(sql("SELECT bool_and(attempts = 2 AND owner = 'B' AND claim_expires > now() + interval '59 minutes')
          FROM jobs WHERE id = ANY ('$a_ids')"), 't', 'attempts shows the second claim; B holds a fresh lease');
is(sql("SELECT bool_and(owner = 'D' AND attempts = 1) FROM jobs WHERE id = ANY ('$d_ids')"), 't',
	"D's live leases were not touched");
is(sql("SELECT bool_and(NOT sharding.complete('jobs', id, 'A') AND NOT sharding.extend_lease('jobs', id, 'A', '1 hour')
                        AND NOT sharding.fail('jobs', id, 'A') AND NOT sharding.complete('jobs', id, 'B', 1))
          FROM unnest('$a_ids'::bigint[]) AS id"), 't', "A's late calls and a stale attempt are refused");
is(sql("SELECT sharding.complete('jobs', '$b_ids'::bigint[], 'B') = 10"), 't', 'B completes the reclaimed batch');
is(sql("SELECT count(*) FILTER (WHERE status = 'done') = 10 AND count(*) FILTER (WHERE status = 'pending') = 10
               AND count(*) FILTER (WHERE owner = 'D') = 10 FROM jobs"), 't', 'queue state: 10 done, 10 with D, 10 pending');
done_testing();
