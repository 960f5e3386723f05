#!/usr/bin/env bash
# Benchmark (not a test): claims with the MVCC horizon pinned (docs/queue.md).
#
# A steady stream of inserts (pgbench -R, 2 clients, INSERT_RATE jobs/s) and
# 8 clients claiming and completing in batches of 10, for SECONDS_PER_RUN
# seconds; once as-is and once while another session holds a REPEATABLE
# READ transaction open from before the run (its snapshot pins the xmin
# horizon: no dead row of the table can be removed or marked killed). Both
# for sharding.claim + complete and for the seed's hand-written SKIP LOCKED
# statement with the index a DBA would give it, (created) WHERE status IN
# ('pending', 'processing'), in the same run on identical tables.
#
# Reported: claim calls per second (pgbench transactions, each one claim
# and one batch complete) over the last MEASURE seconds of each run, the
# jobs completed, the ratio pinned/unpinned, the median of RUNS runs, and
# the load average.
#
#   SHARDING_PGROOT=/tmp/pgroot-mine bash test/bench/horizon/run.sh [seconds] [runs] [measure]
set -euo pipefail
cd "$(dirname "$0")/../../.."
. test/bench/lib.sh
SECONDS_PER_RUN=${1:-60}
RUNS=${2:-1}
MEASURE=${3:-40}
INSERT_RATE=${INSERT_RATE:-2000}
CLIENTS=8
BATCH=10

bench_cluster
WORK=$DIR
bench_queues

for t in ours hand; do
    echo "INSERT INTO $t (key, payload) VALUES ('k' || :client_id, '{\"x\": 1}');" >"$WORK/insert_$t.sql"
done
cat >"$WORK/claim_ours.sql" <<SQL
SELECT coalesce(array_agg(id), '{}') AS ids FROM sharding.claim(NULL::ours, 'w' || :client_id, $BATCH) \gset
SELECT sharding.complete('ours', :ids::bigint[], 'w' || :client_id);
SQL
# The hand-written claim and complete: the claim benchmark's (-D batch).
cp test/bench/claim/hand.sql "$WORK/claim_hand.sql"

# run TABLE PINNED -> "claims_per_s jobs_done_per_s"
run() {
    local table=$1 pinned=$2 holder=
    psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<SQL
TRUNCATE $table;
INSERT INTO $table (key, payload) SELECT 'seed-' || g, '{"x": 1}' FROM generate_series(1, 2000) g;
VACUUM ANALYZE $table;
CHECKPOINT;
SQL
    if [ "$pinned" = 1 ]; then
        psql -XqAt -c "SET application_name = 'horizon_pin'" \
            -c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class; SELECT pg_sleep($SECONDS_PER_RUN + 60);" \
            >/dev/null 2>&1 &
        holder=$!
        sleep 1
    fi
    local before_done
    before_done=$(psql -XqAtc "SELECT count(*) FROM $table WHERE status = 'done'")
    pgbench -n -M prepared -c 2 -j 2 -R "$INSERT_RATE" -T "$SECONDS_PER_RUN" -f "$WORK/insert_$table.sql" \
        >"$WORK/insert.out" 2>&1 &
    local inserter=$!
    pgbench -n -M prepared -c $CLIENTS -j $CLIENTS -T "$SECONDS_PER_RUN" -P 1 -D batch="$BATCH" -f "$WORK/claim_$table.sql" \
        >"$WORK/claim.out" 2>&1 || { cat "$WORK/claim.out" >&2; return 1; }
    wait "$inserter" || true
    local done_jobs
    done_jobs=$(psql -XqAtc "SELECT count(*) FROM $table WHERE status = 'done'")
    if [ -n "$holder" ]; then
        psql -XqAtc "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'horizon_pin'" >/dev/null
        wait "$holder" 2>/dev/null || true
    fi
    # Mean of the per-second progress lines of the last MEASURE seconds.
    python3 - "$WORK/claim.out" "$SECONDS_PER_RUN" "$MEASURE" "$done_jobs" "$before_done" <<'PY'
import re, sys
path, total, measure, done, before = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rates = [(float(t), float(r)) for t, r in re.findall(r"progress: ([0-9.]+) s, ([0-9.]+) tps", open(path).read())]
last = [r for t, r in rates if t > total - measure]
print(round(sum(last) / max(len(last), 1)), round((done - before) / total))
PY
}

ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / max(float(sys.argv[2]), 1):.2f}')" "$1" "$2"; }

echo "# pinned horizon: $INSERT_RATE inserts/s, $CLIENTS clients claim+complete batch $BATCH, $SECONDS_PER_RUN s per run,"
echo "# claims/s over the last $MEASURE s, median of $RUNS runs; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for table in ours hand; do
    free=() pin=() free_jobs=() pin_jobs=()
    for _ in $(seq 1 "$RUNS"); do
        read -r c j < <(run "$table" 0); free+=("$c"); free_jobs+=("$j")
        read -r c j < <(run "$table" 1); pin+=("$c"); pin_jobs+=("$j")
    done
    mf=$(jobs_median "${free[@]}"); mp=$(jobs_median "${pin[@]}")
    name=$([ "$table" = ours ] && echo "sharding.claim" || echo "hand-written")
    echo "$name: unpinned ${mf} claims/s (runs: ${free[*]}; jobs done/s: ${free_jobs[*]}), pinned ${mp} claims/s (runs: ${pin[*]}; jobs done/s: ${pin_jobs[*]}), pinned/unpinned $(ratio "$mp" "$mf")"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
