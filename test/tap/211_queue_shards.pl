# Shard-scoped workers: 4 workers, each its own connection, own 16 of 64
# logical shards (worker_shards) and loop claim_shards -> complete. No
# worker ever receives a job outside its shards, and together they drain
# the queue, each job once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;

my $jobs = 6000;
my $node = queue_node('queue_shards', 'jobs');
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(qq{
CREATE TABLE received (worker integer, job_id bigint, key text);
-- Tenants of very different sizes, so that shards differ in load.
INSERT INTO jobs (key) SELECT 'tenant-' || (g % 500) * (g % 7) FROM generate_series(1, $jobs) g;
});

# Worker i (0-based): its shards, claim_shards in batches of 20, record
# what it received, complete; stop after three empty claims in a row
# (draining_worker).
sub worker
{
	my ($i) = @_;
	return draining_worker(
		declare => "mine integer[] := sharding.worker_shards($i, 4, 64);",
		claim => qq{WITH c AS (SELECT id, key FROM sharding.claim_shards(NULL::jobs, 'w$i', mine, 64, 20)),
             r AS (INSERT INTO public.received SELECT $i, id, key FROM c)
        SELECT array_agg(id) INTO ids FROM c;},
		complete => "PERFORM sharding.complete('jobs', ids, 'w$i');");
}

my ($failed, $seconds, @results) = run_workers($node, 'postgres', map { worker($_) } 0 .. 3);
diag("4 workers drained $jobs jobs in ${seconds}s");
diag($_->[2]) for grep { $_->[0] != 0 } @results;

is($failed, 0, 'all 4 workers ran to the end');
is(sql("SELECT bool_and(cardinality(sharding.worker_shards(i, 4, 64)) = 16) FROM generate_series(0, 3) i"), 't',
	'each worker owns 16 of 64 shards');
is(sql("SELECT count(*) = 0 FROM received
         WHERE NOT sharding.shard_of(key, 64) = ANY (sharding.worker_shards(worker, 4, 64))"), 't',
	'no worker received a job outside its shards');
is(sql("SELECT count(*) = $jobs AND count(DISTINCT job_id) = $jobs FROM received"), 't', 'every job was received exactly once');
is(sql("SELECT count(*) = $jobs AND bool_and(status = 'done') FROM jobs"), 't', 'the queue is drained: every job done');
is(sql("SELECT bool_and(j.owner = 'w' || r.worker) FROM jobs j JOIN received r ON r.job_id = j.id"), 't',
	'each job was completed by the worker whose shard holds it');
diag(sql("SELECT string_agg('worker ' || worker || ': ' || n || ' jobs', E'\\n' ORDER BY worker)
            FROM (SELECT worker, count(*) AS n FROM received GROUP BY worker) s"));
done_testing();
