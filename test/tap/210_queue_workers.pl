# Claiming under concurrency: 8 workers, each its own connection, loop
# claim -> complete over 20,000 jobs with different batch sizes. An audit
# trigger records every status change, which proves each job was claimed
# once and completed once, by the worker that claimed it; a claim log
# proves no claim returned more than its batch.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;

my $jobs = 20000;
my @batches = (1, 5, 10, 25, 50, 100, 3, 64);
my $node = queue_node('queue_workers', 'jobs');
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(qq{
CREATE TABLE audit (job_id bigint, old_status text, new_status text, owner text, attempts integer);
-- The queue functions pin search_path, so triggers on a queue table pin
-- their own (or qualify names).
CREATE FUNCTION audit_jobs() RETURNS trigger LANGUAGE plpgsql SET search_path = public AS \$\$
BEGIN
    INSERT INTO audit VALUES (NEW.id, OLD.status, NEW.status, NEW.owner, NEW.attempts);
    RETURN NULL;
END \$\$;
CREATE TRIGGER audit AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION audit_jobs();
CREATE TABLE claim_log (worker text, batch integer, claimed integer, completed integer);
CREATE TABLE ready (worker text);
INSERT INTO jobs (key, payload) SELECT 'job-' || g, jsonb_build_object('n', g) FROM generate_series(1, $jobs) g;
});

# One worker: claim (commit), complete the batch and log it (commit), until
# the queue stays empty three times in a row (draining_worker).
sub worker
{
	my ($name, $batch) = @_;
	my $n = scalar @batches;
	return draining_worker(
		declare => 'completed integer;',
		# Start together: the queue drains in about a second.
		start => qq{INSERT INTO ready VALUES ('$name');
    COMMIT;
    WHILE (SELECT count(*) FROM ready) < $n LOOP
        PERFORM pg_sleep(0.01);
        COMMIT;
    END LOOP;},
		claim => qq{SELECT array_agg(id) INTO ids FROM sharding.claim(NULL::jobs, '$name', $batch);},
		complete => qq{completed := sharding.complete('jobs', ids, '$name');
        INSERT INTO claim_log VALUES ('$name', $batch, cardinality(ids), completed);});
}

my ($failed, $seconds, @results) = run_workers($node, 'postgres', map { worker("w$_", $batches[$_]) } 0 .. $#batches);
diag("8 workers drained $jobs jobs in ${seconds}s");
diag($_->[2]) for grep { $_->[0] != 0 } @results;

is($failed, 0, 'all 8 workers ran to the end');
is(sql("SELECT count(*) = $jobs AND bool_and(status = 'done') FROM jobs"), 't', 'every job is done, none pending or processing');
is(sql("SELECT count(*) = $jobs AND count(DISTINCT job_id) = $jobs FROM audit WHERE new_status = 'processing'"), 't',
	'audit: every job was claimed exactly once');
is(sql("SELECT count(*) = $jobs AND count(DISTINCT job_id) = $jobs FROM audit WHERE new_status = 'done'"), 't',
	'audit: every job was completed exactly once');
is(sql("SELECT bool_and(d.owner = c.owner AND c.old_status = 'pending' AND d.old_status = 'processing')
          FROM audit c JOIN audit d USING (job_id) WHERE c.new_status = 'processing' AND d.new_status = 'done'"), 't',
	'audit: each job was completed by the worker that claimed it');
is(sql("SELECT coalesce(bool_and(claimed <= batch), false) FROM claim_log"), 't', 'no claim returned more than its batch');
is(sql("SELECT sum(completed) = $jobs AND bool_and(completed = claimed) FROM claim_log"), 't',
	'complete(ids) completed every claimed job of the batch');
is(sql("SELECT bool_and(attempts = 1) FROM jobs"), 't', 'attempts counts one claim per job');
is(sql("SELECT count(DISTINCT worker) = 8 FROM claim_log"), 't', 'all 8 workers got work');
diag(sql("SELECT string_agg(worker || ' batch ' || batch || ': ' || count || ' claims, ' || sum || ' jobs', E'\\n' ORDER BY worker)
            FROM (SELECT worker, batch, count(*), sum(claimed) FROM claim_log GROUP BY worker, batch) s"));
done_testing();
