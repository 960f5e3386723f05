#!/usr/bin/env bash
# claim_node's handoff under a live rebalance. Four workers (one per node
# n1..n4 of a 16-shard map, worker name = node name) claim through
# claim_node(..., ordered => true), holding each batch a few milliseconds
# before completing it. Meanwhile rebalance adds a fifth node (n5, whose
# worker then starts) and the whale's pin moves from n1 to n5. An audit
# trigger records every claim and completion. Checks: every job done once;
# each key's completions in (created, id) order; never two jobs of one key
# in flight; never two nodes working on one logical shard at once (the
# handoff rule: the new owner waits for the old owner's live leases);
# n5 took over moved shards and the whale. Bounded: workers stop after 120 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_queue_handoff
TMP=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT

. test/lib/tap.sh

echo "1..10"
fresh_db || exit 1
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 1
CREATE EXTENSION sharding;
SELECT sharding.create_queue('jobs');
SELECT sharding.create_ordered_indexes('jobs');
SELECT sharding.create_map('hm', 16, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT sharding.pin('hm', 'whale', 'n1');
-- 4,000 jobs: a tenth to the whale, the rest over 150 keys.
INSERT INTO jobs (id, key, created)
SELECT g, CASE WHEN g % 10 = 0 THEN 'whale' ELSE 'k' || (g * 7919 % 150) END,
       '2026-01-01'::timestamptz + g * interval '1 millisecond'
  FROM generate_series(1, 4000) g;
ANALYZE jobs;

CREATE TABLE audit (
    seq bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    key text,
    event text NOT NULL,
    worker text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION audit_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'processing' AND NEW.attempts IS DISTINCT FROM OLD.attempts THEN
        INSERT INTO public.audit (job_id, key, event, worker) VALUES (NEW.id, NEW.key, 'claim', NEW.owner);
    ELSIF NEW.status = 'done' AND OLD.status <> 'done' THEN
        INSERT INTO public.audit (job_id, key, event, worker) VALUES (NEW.id, NEW.key, 'done', OLD.owner);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit AFTER UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION audit_jobs();

-- A node's worker: claim a batch through claim_node (commit), work on it
-- for 30 milliseconds under a live lease, complete it and claim the
-- next batch in one transaction (commit).
CREATE PROCEDURE work(node text, seconds integer) LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    t0 timestamptz := clock_timestamp();
BEGIN
    LOOP
        IF ids IS NOT NULL THEN
            PERFORM sharding.complete('jobs', ids, node);
        END IF;
        SELECT array_agg(c.id) INTO ids
          FROM sharding.claim_node(NULL::jobs, 'hm', node, node, 20, '60 seconds', ordered => true) c;
        COMMIT;
        EXIT WHEN clock_timestamp() - t0 > seconds * interval '1 second';
        IF ids IS NULL THEN
            EXIT WHEN NOT EXISTS (SELECT FROM jobs WHERE status IN ('pending', 'processing'));
            PERFORM pg_sleep(0.005);
        ELSE
            PERFORM pg_sleep(0.03);
        END IF;
    END LOOP;
END $$;
SQL

start=$(date +%s)
# n5's worker runs from the start: it owns nothing until the rebalance, and
# then claims at once, while the old owners still hold live leases.
for nd in n1 n2 n3 n4 n5; do
    psql -XqAt -c "CALL work('$nd', 120)" >"$TMP/$nd" 2>&1 &
    pids+=($!)
done
# Let the four work, then rebalance onto five while they run.
for _ in $(seq 1 100); do
    [ "$(q "SELECT count(*) >= 400 FROM audit WHERE event = 'done'")" = t ] && break
    sleep 0.1
done
q "SELECT count(*) FROM audit WHERE event = 'done'" >"$TMP/done_at_move"
q "SELECT string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical)
     FROM sharding.rebalance('hm', ARRAY['n1', 'n2', 'n3', 'n4', 'n5'])" >"$TMP/moves"
q "CREATE TABLE moved AS SELECT s.logical FROM sharding.shards s WHERE s.map = 'hm' AND s.node = 'n5'"
sleep 0.5
q "SELECT sharding.pin('hm', 'whale', 'n5')" >/dev/null
q "SELECT max(seq) FROM audit" >"$TMP/pin_seq"
for p in "${pids[@]}"; do wait "$p"; done
elapsed=$(( $(date +%s) - start ))
cat "$TMP"/n? | grep -v '^$' | head -5 >&2

ok "$(q "SELECT count(*) = 4000 AND bool_and(status = 'done') FROM jobs")" \
   "all 4,000 jobs are done (${elapsed}s; rebalance after $(cat "$TMP/done_at_move") done moved $(cat "$TMP/moves"))"
ok "$(q "SELECT count(*) = 4000 AND count(DISTINCT job_id) = 4000 FROM audit WHERE event = 'done'")" \
   "every job was completed exactly once"
ok "$(q "SELECT count(*) = 0 FROM (
           SELECT lag((j.created, j.id)) OVER w AS prev_pos, (j.created, j.id) AS pos
             FROM audit a JOIN jobs j ON j.id = a.job_id
            WHERE a.event = 'done' WINDOW w AS (PARTITION BY a.key ORDER BY a.seq)) s
          WHERE prev_pos IS NOT NULL AND NOT (prev_pos < pos)")" \
   "each key's completions follow (created, id) order"
ok "$(q "SELECT count(*) = 0 FROM (
           SELECT event, job_id, lag(event) OVER w AS pe, lag(job_id) OVER w AS pj
             FROM audit WINDOW w AS (PARTITION BY key ORDER BY seq)) s
          WHERE (event = 'claim' AND NOT (pe IS NULL OR pe = 'done'))
             OR (event = 'done' AND NOT (pe = 'claim' AND pj = job_id))")" \
   "never two jobs of one key in flight"
ok "$(q "SELECT count(*) > 0 FROM sharding.claim_node_workers WHERE map = 'hm'")" \
   "$(q "SELECT count(*) FROM audit a JOIN moved m ON m.logical = sharding.logical_shard('hm', a.key)
           WHERE a.key <> 'whale' AND a.event = 'done' AND a.worker <> 'n5'
             AND a.seq > (SELECT min(b.seq) FROM audit b WHERE b.worker = 'n5')") jobs of moved shards were completed by their old owners after n5 began claiming"
# Intervals [claim, done] of unpinned keys' jobs, by logical shard: two
# different nodes' intervals on one shard must never overlap.
q "CREATE TABLE spans AS
     SELECT c.job_id, c.worker, sharding.logical_shard('hm', c.key) AS logical, c.seq AS s, d.seq AS e
       FROM audit c JOIN audit d ON d.job_id = c.job_id AND d.event = 'done'
      WHERE c.event = 'claim' AND c.key <> 'whale'" >/dev/null
ok "$(q "SELECT count(*) = 0 FROM spans a JOIN spans b ON a.logical = b.logical AND a.worker < b.worker
          WHERE a.s < b.e AND b.s < a.e")" \
   "no logical shard was ever worked on by two nodes at once"
ok "$(q "SELECT count(DISTINCT logical) = (SELECT count(*) FROM moved) AND count(*) > 0
           FROM spans WHERE worker = 'n5'")" "n5 worked on every shard it was given ($(q "SELECT count(*) FROM moved") shards)"
ok "$(q "SELECT count(*) = 0 FROM spans s JOIN moved m USING (logical)
          WHERE s.worker = 'n5' AND s.s < (SELECT max(o.e) FROM spans o WHERE o.logical = s.logical AND o.worker <> 'n5'
                                                                         AND o.s < s.s)")" \
   "on each moved shard, n5 started only after the old owner's last job of it was done"
ok "$(q "SELECT count(*) > 0 AND bool_and(seq > (SELECT max(seq) FROM audit a WHERE a.key = 'whale' AND a.worker = 'n1'))
           FROM audit WHERE key = 'whale' AND worker = 'n5' AND event = 'claim'")" \
   "the whale went to n5 after its pin moved, only after n1's last whale job"
ok "$(q "SELECT count(*) = 0 FROM audit WHERE key = 'whale' AND worker NOT IN ('n1', 'n5')")" \
   "the pinned whale was only ever claimed by its pinned node"

[ -n "${SHARDING_KEEP_DB:-}" ] || dropdb "$PGDATABASE"
[ "$failures" -eq 0 ]
