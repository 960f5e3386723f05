# claim_node's handoff under a live rebalance, demanding enough that a
# claim_node without the handoff exclusion fails it. Five workers, one per
# node n1..n5 of a 16-shard map (worker name = node name; n5 owns nothing at
# first and polls every 5 ms), each claiming through claim_node from two
# queues: `jobs` with ordered => true and `loose` with ordered => false
# (where nothing but the handoff keeps two nodes off one key). They hold
# each batch 30 ms before completing it. At the move the old owners' hold
# becomes 1 s: once every old owner holds a fresh batch under a live lease,
# rebalance adds n5 and the whale's pin moves from n1 to n5, while n5 (30 ms
# holds, 5 ms polls) claims eagerly and the old owners still hold jobs of
# what n5 was given for most of a second; after 1.5 s their hold is 30 ms
# again. Without the handoff exclusion n5 takes moved shards' and the
# whale's jobs at once, which the interval checks catch. An audit trigger
# records every claim and completion in one sequence, so [claim, done]
# intervals compare exactly. Checks: every job done once; in `jobs` each
# key's completions in (created, id) order and never two jobs of a key in
# flight; in both queues never two nodes working on one key at once, nor on
# one logical shard at once (the handoff rule), n5 starting each moved shard
# and the whale only after the old owner's last job of it; the move really
# happened under live leases. Bounded: workers stop after 60 s, every wait
# by count.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;
use Time::HiRes qw(time usleep);

my $node = queue_node('queue_ordered_handoff', 'jobs', 'loose');
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{
SELECT sharding.create_ordered_indexes('jobs');
SELECT sharding.create_map('hm', 16, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT sharding.pin('hm', 'whale', 'n1');
-- 4,000 jobs per queue: a tenth to the whale, the rest over 300 keys.
INSERT INTO jobs (id, key, created)
SELECT g, CASE WHEN g % 10 = 0 THEN 'whale' ELSE 'k' || (g * 7919 % 300) END,
       '2026-01-01'::timestamptz + g * interval '1 millisecond'
  FROM generate_series(1, 4000) g;
INSERT INTO loose (id, key, created) SELECT id, key, created FROM jobs;
ANALYZE jobs;
ANALYZE loose;

CREATE TABLE audit (
    seq bigserial PRIMARY KEY,
    q text NOT NULL,
    job_id bigint NOT NULL,
    key text,
    event text NOT NULL,
    worker text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION audit_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'processing' AND NEW.attempts IS DISTINCT FROM OLD.attempts THEN
        INSERT INTO public.audit (q, job_id, key, event, worker) VALUES (TG_TABLE_NAME, NEW.id, NEW.key, 'claim', NEW.owner);
    ELSIF NEW.status = 'done' AND OLD.status <> 'done' THEN
        INSERT INTO public.audit (q, job_id, key, event, worker) VALUES (TG_TABLE_NAME, NEW.id, NEW.key, 'done', OLD.owner);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION audit_jobs();
CREATE TRIGGER audit AFTER UPDATE ON loose FOR EACH ROW EXECUTE FUNCTION audit_jobs();

-- How long the old owners n1..n4 hold a batch (seconds); the test raises
-- it around the move.
CREATE TABLE ctl (hold float8 NOT NULL);
INSERT INTO ctl VALUES (0.03);
});

# A node's worker: claim a batch of each queue through claim_node
# (commit), work on them under a live lease for the hold, complete them
# and claim the next batches in one transaction (commit). n5, the new
# owner, keeps the short hold: it claims eagerly.
sql(timed_worker(worker => 'node text', idle => 0.005,
	batches => [
		[ 'ids', 'jobs', "sharding.claim_node(NULL::jobs, 'hm', node, node, 20, '60 seconds', ordered => true)" ],
		[ 'lids', 'loose', "sharding.claim_node(NULL::loose, 'hm', node, node, 20, '60 seconds')" ] ],
	busy => "PERFORM pg_sleep(CASE WHEN node = 'n5' THEN 0.03 ELSE (SELECT hold FROM ctl) END);"));

my $t0 = time;
# n5's worker runs from the start: it owns nothing until the rebalance, and
# then claims at once, while the old owners still hold live leases.
my @workers = start_workers($node, 'postgres', map { "CALL work('n$_', 60)" } 1 .. 5);
# Let the four work, then hold batches for a second: once each old owner
# has claimed under the long hold, move while they hold.
sharding_wait($node, 'postgres', "SELECT count(*) >= 400 FROM audit WHERE event = 'done'", 't', 10);
my $flag = sql("UPDATE ctl SET hold = 1.0; SELECT coalesce(max(seq), 0) FROM audit");
sharding_wait($node, 'postgres', "SELECT count(DISTINCT worker) = 4 FROM audit WHERE event = 'claim' AND seq > $flag
                                     AND worker IN ('n1', 'n2', 'n3', 'n4')", 't', 5);
my $done_at_move = sql("SELECT count(*) FROM audit WHERE event = 'done'");
# The move and, right after it, the live leases of moved work it happened under.
my $moves = sql(q{
SELECT string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical)
  FROM sharding.rebalance('hm', ARRAY['n1', 'n2', 'n3', 'n4', 'n5']);
});
sql(q{
CREATE TABLE moved AS SELECT s.logical FROM sharding.shards s WHERE s.map = 'hm' AND s.node = 'n5';
CREATE TABLE held_at_move AS
SELECT 'jobs' AS q, count(*) AS n FROM jobs j JOIN moved m ON m.logical = sharding.logical_shard('hm', j.key)
 WHERE j.status = 'processing' AND j.claim_expires > now() AND j.owner <> 'n5' AND j.key <> 'whale'
UNION ALL
SELECT 'loose', count(*) FROM loose j JOIN moved m ON m.logical = sharding.logical_shard('hm', j.key)
 WHERE j.status = 'processing' AND j.claim_expires > now() AND j.owner <> 'n5' AND j.key <> 'whale';
SELECT sharding.pin('hm', 'whale', 'n5');
CREATE TABLE whale_at_pin AS
SELECT 'jobs' AS q, count(*) AS n FROM jobs WHERE key = 'whale' AND status = 'processing' AND owner = 'n1'
UNION ALL
SELECT 'loose', count(*) FROM loose WHERE key = 'whale' AND status = 'processing' AND owner = 'n1';
});
usleep(1_500_000);
sql("UPDATE ctl SET hold = 0.03");
my ($failed, @results) = finish_workers(@workers);
my $elapsed = sprintf('%.0f', time - $t0);
diag("$failed workers failed: " . join('', map { $_->[2] } @results)) if $failed;

# Intervals [claim, done] of every job, by audit sequence (one sequence for
# all events, so a claim after a completion has the larger number).
sql("CREATE TABLE spans AS
       SELECT c.q, c.job_id, c.worker, c.key, sharding.logical_shard('hm', c.key) AS logical, c.seq AS s, d.seq AS e
         FROM audit c JOIN audit d ON d.q = c.q AND d.job_id = c.job_id AND d.event = 'done'
        WHERE c.event = 'claim'");

is(sql("SELECT (SELECT count(*) = 4000 AND bool_and(status = 'done') FROM jobs)
           AND (SELECT count(*) = 4000 AND bool_and(status = 'done') FROM loose)"), 't',
	"all 2 x 4,000 jobs are done (${elapsed}s; move after $done_at_move done moved $moves)");
is(sql("SELECT count(*) = 8000 AND count(DISTINCT (q, job_id)) = 8000 FROM audit WHERE event = 'done'"), 't',
	'every job was completed exactly once');
is(sql("SELECT count(*) = 8000 FROM spans"), 't', 'every claim has its completion');
is(sql("SELECT n > 0 FROM held_at_move WHERE q = 'jobs'"), 't',
	'jobs: the move happened while old owners held ' . sql("SELECT n FROM held_at_move WHERE q = 'jobs'")
	  . ' jobs of the moved shards under live leases');
is(sql("SELECT n > 0 FROM held_at_move WHERE q = 'loose'"), 't',
	'loose: the move happened while old owners held ' . sql("SELECT n FROM held_at_move WHERE q = 'loose'")
	  . ' jobs of the moved shards under live leases');
is(sql("SELECT n > 0 FROM whale_at_pin WHERE q = 'loose'"), 't',
	'loose: the pin moved while n1 held ' . sql("SELECT n FROM whale_at_pin WHERE q = 'loose'")
	  . ' whale jobs under live leases');
is(sql("SELECT count(*) = 0 FROM (
          SELECT lag((j.created, j.id)) OVER w AS prev_pos, (j.created, j.id) AS pos
            FROM audit a JOIN jobs j ON j.id = a.job_id
           WHERE a.q = 'jobs' AND a.event = 'done' WINDOW w AS (PARTITION BY a.key ORDER BY a.seq)) s
         WHERE prev_pos IS NOT NULL AND NOT (prev_pos < pos)"), 't',
	"jobs: each key's completions follow (created, id) order");
is(sql("SELECT count(*) = 0 FROM (
          SELECT event, job_id, lag(event) OVER w AS pe, lag(job_id) OVER w AS pj
            FROM audit WHERE q = 'jobs' WINDOW w AS (PARTITION BY key ORDER BY seq)) s
         WHERE (event = 'claim' AND NOT (pe IS NULL OR pe = 'done'))
            OR (event = 'done' AND NOT (pe = 'claim' AND pj = job_id))"), 't',
	'jobs: never two jobs of one key in flight');
for my $t ('jobs', 'loose')
{
	my $key_overlaps = sql("SELECT count(*) FROM spans a JOIN spans b ON a.q = b.q AND a.key = b.key AND a.worker < b.worker
	                         WHERE a.q = '$t' AND a.s < b.e AND b.s < a.e");
	is($key_overlaps, '0', "$t: no key was ever worked on by two nodes at once ($key_overlaps overlapping pairs)");
	# Unpinned keys' jobs, by logical shard: two different nodes' intervals
	# on one shard must never overlap.
	my $shard_overlaps = sql("SELECT count(*) FROM spans a JOIN spans b
	                            ON a.q = b.q AND a.logical = b.logical AND a.worker < b.worker
	                           WHERE a.q = '$t' AND a.key <> 'whale' AND b.key <> 'whale' AND a.s < b.e AND b.s < a.e");
	is($shard_overlaps, '0', "$t: no logical shard was ever worked on by two nodes at once ($shard_overlaps overlapping pairs)");
	is(sql("SELECT count(DISTINCT logical) = (SELECT count(*) FROM moved) AND count(*) > 0
	          FROM spans WHERE q = '$t' AND worker = 'n5' AND key <> 'whale'"), 't',
		"$t: n5 worked on every shard it was given (" . sql("SELECT count(*) FROM moved") . ' shards)');
	is(sql("SELECT count(*) = 0 FROM spans s JOIN moved m USING (logical)
	         WHERE s.q = '$t' AND s.worker = 'n5' AND s.key <> 'whale'
	           AND s.s < (SELECT max(o.e) FROM spans o WHERE o.q = s.q AND o.logical = s.logical
	                        AND o.key <> 'whale' AND o.worker <> 'n5' AND o.s < s.s)"), 't',
		"$t: on each moved shard, n5 started only after the old owner's last job of it was done");
	is(sql("SELECT count(*) > 0 AND bool_and(s > (SELECT max(o.e) FROM spans o WHERE o.q = '$t' AND o.key = 'whale'
	                                                                    AND o.worker = 'n1'))
	          FROM spans WHERE q = '$t' AND key = 'whale' AND worker = 'n5'"), 't',
		"$t: the whale went to n5 after its pin moved, only after n1's last whale job was done");
	is(sql("SELECT count(*) = 0 FROM audit WHERE q = '$t' AND key = 'whale' AND worker NOT IN ('n1', 'n5')"), 't',
		"$t: the pinned whale was only ever claimed by its pinned node");
}
done_testing();
