# claim_ordered under concurrency. 8 workers drain 20,000 jobs over 500
# keys, one whale key holding 40% of them, while a ninth worker is killed
# (pg_terminate_backend) holding a batch under a 2-second lease. An audit
# trigger records every claim and completion (a sequence number taken inside
# the claiming or completing transaction, so a claim that could only happen
# after a completion committed always sorts after it). Checks: every job done
# once; each key's completions follow (created, id); never two jobs of one
# key in flight, and never two of one key in a batch; the dead worker's jobs
# come back (attempt 2) after its lease; the whale does not starve the other
# keys. Bounded: workers stop after 240 s whatever happens.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;
use Time::HiRes qw(time);

my $node = queue_node('queue_ordered_workers', 'jobs');
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{
SELECT sharding.create_ordered_indexes('jobs');
-- 20,000 jobs: every 5th and 5th+1 to the whale (40%), the rest over 499
-- other keys; created strictly increasing with id, keys interleaved.
INSERT INTO jobs (id, key, created)
SELECT g, CASE WHEN g % 5 < 2 THEN 'whale' ELSE 'k' || (g * 7919 % 499) END,
       '2026-01-01'::timestamptz + g * interval '1 millisecond'
  FROM generate_series(1, 20000) g;
-- Within a key, created order differs from id order for some jobs: swap
-- created of pairs so that id order alone would be wrong.
UPDATE jobs j SET created = j.created + interval '2 milliseconds' WHERE j.id % 10 = 3 AND j.key <> 'whale';
ANALYZE jobs;

CREATE TABLE audit (
    seq bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    key text,
    event text NOT NULL,
    worker text,
    attempts integer,
    expires timestamptz,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    txid bigint NOT NULL DEFAULT txid_current()
);
CREATE FUNCTION audit_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'processing' AND NEW.attempts IS DISTINCT FROM OLD.attempts THEN
        INSERT INTO public.audit (job_id, key, event, worker, attempts, expires)
        VALUES (NEW.id, NEW.key, 'claim', NEW.owner, NEW.attempts, NEW.claim_expires);
    ELSIF NEW.status = 'done' AND OLD.status <> 'done' THEN
        INSERT INTO public.audit (job_id, key, event, worker, attempts) VALUES (NEW.id, NEW.key, 'done', OLD.owner, NEW.attempts);
    ELSIF NEW.status <> OLD.status THEN
        INSERT INTO public.audit (job_id, key, event, worker, attempts) VALUES (NEW.id, NEW.key, NEW.status, OLD.owner, NEW.attempts);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION audit_jobs();
});

# A worker: claims a batch (commit), then completes it and claims the next
# batch in one transaction (commit), until nothing is left or the time is up.
sql(timed_worker(worker => 'w text', idle => 0.02,
	batches => [ [ 'ids', 'jobs', "sharding.claim_ordered(NULL::jobs, w, 50, '60 seconds')" ] ]));

# The victim claims first (so it holds the oldest heads, the whale's among
# them) under a 2-second lease, then hangs until killed.
my ($victim, $victim_ids) = start_stuck_worker($node, 'ordered_victim',
	"SELECT array_agg(id ORDER BY id) FROM sharding.claim_ordered(NULL::jobs, 'victim', 50, '2 seconds')", 300);
$victim_ids //= '{}';

my $t0 = time;
my @workers = start_workers($node, 'postgres', map { "CALL work('w$_', 240)" } 1 .. 8);
Time::HiRes::usleep(500_000);
is(sql("SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'ordered_victim'"), 't',
	"the victim worker (holding $victim_ids) is killed mid-lease");
sharding_finish($victim);
my ($failed, @results) = finish_workers(@workers);
my $elapsed = sprintf("%.0f", time - $t0);
diag("$failed workers failed: " . join('', map { $_->[2] } @results)) if $failed;

sql("CREATE INDEX ON audit (key, seq)");
is(sql("SELECT count(*) = 20000 AND bool_and(status = 'done') FROM jobs"), 't', "all 20,000 jobs are done (${elapsed}s)");
is(sql("SELECT count(*) = 20000 AND count(DISTINCT job_id) = 20000 FROM audit WHERE event = 'done'"), 't',
	'every job was completed exactly once');
is(sql("SELECT count(*) = 0 FROM (
          SELECT job_id, lag(job_id) OVER w AS prev_job, (j.created, j.id) AS pos,
                 lag((j.created, j.id)) OVER w AS prev_pos
            FROM audit a JOIN jobs j ON j.id = a.job_id
           WHERE a.event = 'done' WINDOW w AS (PARTITION BY a.key ORDER BY a.seq)) s
         WHERE prev_pos IS NOT NULL AND NOT (prev_pos < pos)"), 't',
	"each key's completions follow (created, id) order");
# In flight: a claim must follow the completion of the key's previous job,
# or re-claim the same job once its lease has expired; a completion must
# follow the claim of the same job.
is(sql("SELECT count(*) = 0 FROM (
          SELECT event, job_id, at, lag(event) OVER w AS pe, lag(job_id) OVER w AS pj, lag(expires) OVER w AS pexp
            FROM audit WINDOW w AS (PARTITION BY key ORDER BY seq)) s
         WHERE (event = 'claim' AND NOT (pe IS NULL OR pe = 'done' OR (pe = 'claim' AND pj = job_id AND pexp < at)))
            OR (event = 'done' AND NOT (pe = 'claim' AND pj = job_id))"), 't',
	'never two jobs of one key in flight');
is(sql("SELECT count(*) = 0 FROM (SELECT txid, key FROM audit WHERE event = 'claim' GROUP BY txid, key HAVING count(*) > 1) s"), 't',
	'no claim took two jobs of one key');
is(sql("SELECT count(*) = 0 FROM (SELECT j.key, min(j.id) AS first FROM jobs j GROUP BY j.key) f
         WHERE (SELECT a.job_id FROM audit a WHERE a.key = f.key AND a.event = 'claim' ORDER BY a.seq LIMIT 1)
               <> (SELECT j.id FROM jobs j WHERE j.key = f.key ORDER BY j.created, j.id LIMIT 1)"), 't',
	"every key's first claim was its oldest job");
is(sql("SELECT count(*) = cardinality('$victim_ids'::bigint[]) AND bool_and(a.worker <> 'victim' AND a.attempts = 2)
          FROM audit a WHERE a.event = 'done' AND a.job_id = ANY ('$victim_ids'::bigint[])"), 't',
	"the killed worker's jobs were reclaimed after its lease (attempt 2) and done by others");
is(sql("SELECT count(*) = cardinality('$victim_ids'::bigint[]) AND bool_and(n.at >= v.expires)
          FROM audit v CROSS JOIN LATERAL (SELECT b.at FROM audit b WHERE b.key = v.key AND b.seq > v.seq
                                             AND b.event = 'claim' ORDER BY b.seq LIMIT 1) n
         WHERE v.worker = 'victim' AND v.event = 'claim'"), 't',
	"the victim's keys stayed blocked until its lease expired");
# Starvation: the whale's jobs can only go one at a time; the other keys'
# 12,000 must not wait behind them.
my $whale_at_others_end = sql("SELECT count(*) FROM audit WHERE event = 'done' AND key = 'whale'
                                 AND seq < (SELECT max(seq) FROM audit WHERE event = 'done' AND key <> 'whale')");
cmp_ok($whale_at_others_end, '<', 4000,
	"the other keys finished while the whale had done $whale_at_others_end of its 8,000");
is(sql("SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
                                                  AND backend_type = 'client backend'"), 't', 'no worker left behind');
done_testing();
