#!/usr/bin/env bash
# Claiming under concurrency: 8 workers, each its own connection, loop
# claim -> complete over 20,000 jobs with different batch sizes. An audit
# trigger records every status change, which proves each job was claimed
# once and completed once, by the worker that claimed it; a claim log
# proves no claim returned more than its batch.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_queue_workers
JOBS=20000
BATCHES=(1 5 10 25 50 100 3 64)

. test/lib/tap.sh

echo "1..9"
queue_db jobs || exit 1
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<SQL || exit 1
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
INSERT INTO jobs (key, payload) SELECT 'job-' || g, jsonb_build_object('n', g) FROM generate_series(1, $JOBS) g;
SQL

# One worker: claim (commit), complete the batch (commit), until the queue
# stays empty three times in a row.
worker() {
    local name=$1 batch=$2
    psql -Xq -v ON_ERROR_STOP=1 -c "
DO \$\$
DECLARE
    ids bigint[];
    claimed integer;
    completed integer;
    empty integer := 0;
BEGIN
    -- Start together: the queue drains in about a second.
    INSERT INTO ready VALUES ('$name');
    COMMIT;
    WHILE (SELECT count(*) FROM ready) < ${#BATCHES[@]} LOOP
        PERFORM pg_sleep(0.01);
        COMMIT;
    END LOOP;
    LOOP
        SELECT array_agg(id) INTO ids FROM sharding.claim(NULL::jobs, '$name', $batch);
        claimed := coalesce(cardinality(ids), 0);
        COMMIT;
        IF claimed = 0 THEN
            empty := empty + 1;
            EXIT WHEN empty >= 3;
            PERFORM pg_sleep(0.05);
            CONTINUE;
        END IF;
        empty := 0;
        completed := sharding.complete('jobs', ids, '$name');
        INSERT INTO claim_log VALUES ('$name', $batch, claimed, completed);
        COMMIT;
    END LOOP;
END \$\$;"
}

start=$(date +%s.%N)
pids=()
for i in "${!BATCHES[@]}"; do
    worker "w$i" "${BATCHES[$i]}" &
    pids+=($!)
done
failed_workers=0
for p in "${pids[@]}"; do wait "$p" || failed_workers=$((failed_workers + 1)); done
elapsed=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
echo "# 8 workers drained $JOBS jobs in ${elapsed}s"

ok "$([ $failed_workers -eq 0 ] && echo t || echo "$failed_workers failed")" "all 8 workers ran to the end"
ok "$(q "SELECT count(*) = $JOBS AND bool_and(status = 'done') FROM jobs")" "every job is done, none pending or processing"
ok "$(q "SELECT count(*) = $JOBS AND count(DISTINCT job_id) = $JOBS FROM audit WHERE new_status = 'processing'")" \
   "audit: every job was claimed exactly once"
ok "$(q "SELECT count(*) = $JOBS AND count(DISTINCT job_id) = $JOBS FROM audit WHERE new_status = 'done'")" \
   "audit: every job was completed exactly once"
ok "$(q "SELECT bool_and(d.owner = c.owner AND c.old_status = 'pending' AND d.old_status = 'processing')
           FROM audit c JOIN audit d USING (job_id) WHERE c.new_status = 'processing' AND d.new_status = 'done'")" \
   "audit: each job was completed by the worker that claimed it"
ok "$(q "SELECT coalesce(bool_and(claimed <= batch), false) FROM claim_log")" "no claim returned more than its batch"
ok "$(q "SELECT sum(completed) = $JOBS AND bool_and(completed = claimed) FROM claim_log")" \
   "complete(ids) completed every claimed job of the batch"
ok "$(q "SELECT bool_and(attempts = 1) FROM jobs")" "attempts counts one claim per job"
ok "$(q "SELECT count(DISTINCT worker) = 8 FROM claim_log")" "all 8 workers got work"
q "SELECT '# ' || worker || ' batch ' || batch || ': ' || count(*) || ' claims, ' || sum(claimed) || ' jobs'
     FROM claim_log GROUP BY worker, batch ORDER BY worker"

dropdb "$PGDATABASE"
[ "$failures" -eq 0 ]
