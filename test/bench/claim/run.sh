#!/usr/bin/env bash
# Benchmark (not a test): claim-then-complete throughput with pgbench, 8
# clients, batch 1 and batch 50: sharding.claim + sharding.complete against
# the hand-written SKIP LOCKED statement (the classic
#   UPDATE ... WHERE id IN (SELECT ... WHERE status = 'pending' OR (status =
#   'processing' AND claim_expires < now()) ORDER BY created LIMIT n
#   FOR UPDATE SKIP LOCKED) RETURNING *
# plus the same fenced batch UPDATE to complete), in the same run, on
# identical tables: both made by create_queue, both with a pile of done
# rows, and both also carrying the partial index the hand-written statement
# needs ((created) WHERE status IN ('pending', 'processing')).
#
#   SHARDING_PGROOT=/tmp/pgroot-mine bash test/bench/claim/run.sh [seconds] [runs]
#
# Two situations: nothing else in flight, and 2,000 older jobs held by slow
# workers under live leases (long-running jobs: the hand-written statement's
# index scan has to step over them on every claim; claim's separate index
# paths for pending and expired rows do not see them).
#
# Each measurement refills the table, VACUUM ANALYZEs it and runs pgbench
# -M prepared for `seconds`; ours and the baseline alternate; the report is
# the median jobs/s of `runs` runs and the ratio of the medians. jit = off.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. test/bench/lib.sh
bench_args test/bench/claim 8 3 "$@"
DONE_ROWS=200000

bench_cluster
bench_queues
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE INDEX ON ours (created) WHERE status IN ('pending', 'processing');
ALTER TABLE ours SET (autovacuum_enabled = false);
ALTER TABLE hand SET (autovacuum_enabled = false);
SQL

# fill TABLE PENDING IN_FLIGHT: DONE_ROWS old done rows, then PENDING
# pending rows, the IN_FLIGHT oldest of them leased to a slow worker.
fill() {
    psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<SQL
TRUNCATE $1;
INSERT INTO $1 (key, payload, status, owner, created, attempts)
SELECT 'done-' || g, '{"x": 1}', 'done', 'old', now() - interval '1 day', 1 FROM generate_series(1, $DONE_ROWS) g;
INSERT INTO $1 (key, payload) SELECT 'job-' || g, '{"x": 1}' FROM generate_series(1, $2) g;
-- (older than every pending job, as long-running jobs are)
UPDATE $1 SET status = 'processing', owner = 'slow', claim_expires = now() + interval '1 hour', attempts = 1,
       created = now() - interval '1 hour'
 WHERE id IN (SELECT id FROM $1 WHERE status = 'pending' ORDER BY created, id LIMIT $3);
VACUUM ANALYZE $1;
CHECKPOINT;
SQL
}

# measure TABLE SCRIPT BATCH PENDING IN_FLIGHT -> jobs/s
measure() {
    local table=$1 script=$2 batch=$3 pending=$4 in_flight=$5
    fill "$table" "$pending" "$in_flight"
    pgbench_jobs "$table" "$script" "$batch" "owner NOT IN ('old', 'slow')" true
}

echo "# claim-then-complete, $CLIENTS clients, $SECONDS_PER_RUN s per run, median of $RUNS runs, $DONE_ROWS done rows"
echo "# $(nproc) cores; $(psql -XqAtc 'SELECT version()' | cut -d, -f1)"
for in_flight in 0 2000; do
    for batch in 1 50; do
        pending=$((batch == 1 ? 60000 : 600000))
        ours=() hand=()
        for _ in $(seq 1 "$RUNS"); do
            ours+=("$(measure ours ours.sql "$batch" "$pending" "$in_flight")")
            hand+=("$(measure hand hand.sql "$batch" "$pending" "$in_flight")")
        done
        mo=$(jobs_median "${ours[@]}")
        mh=$(jobs_median "${hand[@]}")
        ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$mo" "$mh")
        echo "batch $batch, $in_flight in flight: sharding.claim ${mo} jobs/s (runs: ${ours[*]}), hand-written ${mh} jobs/s (runs: ${hand[*]}), ratio ${ratio}x"
    done
done
