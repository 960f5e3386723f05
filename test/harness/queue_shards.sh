#!/usr/bin/env bash
# Shard-scoped workers: 4 workers, each its own connection, own 16 of 64
# logical shards (worker_shards) and loop claim_shards -> complete. No
# worker ever receives a job outside its shards, and together they drain
# the queue, each job once.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_queue_shards
JOBS=6000

. test/lib/tap.sh

echo "1..6"
queue_db jobs || exit 1
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<SQL || exit 1
CREATE TABLE received (worker integer, job_id bigint, key text);
-- Tenants of very different sizes, so that shards differ in load.
INSERT INTO jobs (key) SELECT 'tenant-' || (g % 500) * (g % 7) FROM generate_series(1, $JOBS) g;
SQL

# Worker i (0-based): its shards, claim_shards in batches of 20, record
# what it received, complete; stop after three empty claims in a row.
worker() {
    local i=$1
    psql -Xq -v ON_ERROR_STOP=1 -c "
DO \$\$
DECLARE
    mine integer[] := sharding.worker_shards($i, 4, 64);
    ids bigint[];
    empty integer := 0;
BEGIN
    LOOP
        WITH c AS (SELECT id, key FROM sharding.claim_shards(NULL::jobs, 'w$i', mine, 64, 20)),
             r AS (INSERT INTO public.received SELECT $i, id, key FROM c)
        SELECT array_agg(id) INTO ids FROM c;
        COMMIT;
        IF ids IS NULL THEN
            empty := empty + 1;
            EXIT WHEN empty >= 3;
            PERFORM pg_sleep(0.05);
            CONTINUE;
        END IF;
        empty := 0;
        PERFORM sharding.complete('jobs', ids, 'w$i');
        COMMIT;
    END LOOP;
END \$\$;"
}

pids=()
for i in 0 1 2 3; do
    worker "$i" &
    pids+=($!)
done
failed_workers=0
for p in "${pids[@]}"; do wait "$p" || failed_workers=$((failed_workers + 1)); done

ok "$([ $failed_workers -eq 0 ] && echo t || echo "$failed_workers failed")" "all 4 workers ran to the end"
ok "$(q "SELECT bool_and(cardinality(sharding.worker_shards(i, 4, 64)) = 16) FROM generate_series(0, 3) i")" \
   "each worker owns 16 of 64 shards"
ok "$(q "SELECT count(*) = 0 FROM received
          WHERE NOT sharding.shard_of(key, 64) = ANY (sharding.worker_shards(worker, 4, 64))")" \
   "no worker received a job outside its shards"
ok "$(q "SELECT count(*) = $JOBS AND count(DISTINCT job_id) = $JOBS FROM received")" "every job was received exactly once"
ok "$(q "SELECT count(*) = $JOBS AND bool_and(status = 'done') FROM jobs")" "the queue is drained: every job done"
ok "$(q "SELECT bool_and(j.owner = 'w' || r.worker) FROM jobs j JOIN received r ON r.job_id = j.id")" \
   "each job was completed by the worker whose shard holds it"
q "SELECT '# worker ' || worker || ': ' || count(*) || ' jobs' FROM received GROUP BY worker ORDER BY worker"

dropdb "$PGDATABASE"
[ "$failures" -eq 0 ]
