#!/usr/bin/env bash
# Benchmark (not a test) of the claims of docs/ordered.md, each as a ratio against a
# baseline measured in the same run on identical data (pgbench, 8 clients,
# batch 50, claim then batch complete, -M prepared, jit off):
#
#   1. ordered:   claim_ordered vs claim, 1,000,000 jobs over 100,000 keys
#                 and one whale key with 50% of the jobs (keys
#                 interleaved); jobs/s. Target >= 0.7.
#   2. burst:     claim_ordered with a whale burst (1,000,000 jobs of one
#                 key, all older than every other job) vs without it; jobs/s
#                 of the other keys. Target >= 0.5.
#   3. node:      claim_node(map, 'n1') vs claim_shards(shards_of(map, 'n1'))
#                 on a 16-shard map over 4 nodes; jobs/s. Target >= 0.9.
#                 Then again with 24 workers of the other three nodes
#                 registered and holding 1,200 live leases, so that every
#                 claim_node also runs the handoff check (node_handoff).
#
#   SHARDING_PGROOT=/tmp/pgroot-mine bash test/bench/ordered/run.sh [seconds] [runs]
#
# BENCH_ONLY="ordered burst node node_handoff" (any of them) runs those comparisons only;
# BENCH_NO_PRELOAD=1 starts the cluster without shared_preload_libraries
# (claim_ordered then keeps a position per backend); BENCH_WAITS=1 samples
# pg_stat_activity's wait events every 0.1 s during each pgbench run and
# prints their counts (diagnosis of contention).
#
# Both tables of a comparison are made by create_queue plus
# create_ordered_indexes (the same indexes on both). Each measurement
# refills its table from a template, VACUUM ANALYZEs it, and runs pgbench
# for `seconds`; ours and the baseline alternate; the report is the median
# of `runs` runs and the ratio of the medians.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. test/bench/lib.sh
bench_args test/bench/ordered 5 3 "$@"
BATCH=50

bench_cluster -c shared_buffers=512MB ${BENCH_NO_PRELOAD:+-c shared_preload_libraries=}
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE EXTENSION sharding;
SELECT sharding.create_queue('ours');
SELECT sharding.create_queue('base');
SELECT sharding.create_ordered_indexes('ours');
SELECT sharding.create_ordered_indexes('base');
ALTER TABLE ours SET (autovacuum_enabled = false);
ALTER TABLE base SET (autovacuum_enabled = false);
SELECT sharding.create_map('bm', 16, ARRAY['n1', 'n2', 'n3', 'n4']);
-- Templates. mixed: 1,000,000 jobs, every other one the whale's, the rest
-- over 100,000 keys. others: 600,000 jobs over 100,000 keys. burst: a
-- million whale jobs older than all of others'. (400,000 and 200,000 until
-- claim_ordered took 40,000 jobs/s here: a 5 s run then emptied the other
-- keys before it ended.)
CREATE UNLOGGED TABLE t_mixed AS
SELECT CASE WHEN g % 2 = 0 THEN 'whale' ELSE 'k' || (g / 2 % 100000) END AS key,
       '2026-01-01'::timestamptz + g * interval '1 millisecond' AS created
  FROM generate_series(1, 1000000) g;
CREATE UNLOGGED TABLE t_others AS
SELECT 'k' || (g % 100000) AS key, '2026-01-02'::timestamptz + g * interval '1 millisecond' AS created
  FROM generate_series(1, 600000) g;
CREATE UNLOGGED TABLE t_burst AS
SELECT 'whale' AS key, '2026-01-01'::timestamptz + g * interval '1 microsecond' AS created
  FROM generate_series(1, 1000000) g;
CREATE UNLOGGED TABLE t_random AS
SELECT 'job-' || g AS key, '2026-01-01'::timestamptz + g * interval '1 millisecond' AS created
  FROM generate_series(1, 1200000) g;
SQL

# fill TABLE TEMPLATE...: the table holds exactly the templates' rows, pending.
fill() {
    local table=$1 sql="TRUNCATE $1;"
    shift
    for t in "$@"; do sql="$sql INSERT INTO $table (key, payload, created) SELECT key, '{\"x\": 1}', created FROM $t;"; done
    psql -XqAt -v ON_ERROR_STOP=1 -c "$sql" -c "VACUUM ANALYZE $table" -c "CHECKPOINT" >/dev/null
}

# foreign_leases TABLE: 8 workers on each of n2..n4 claim 50 jobs each through
# claim_node with an hour's lease (they stay registered and in flight).
foreign_leases() {
    psql -XqAt -v ON_ERROR_STOP=1 -c "SELECT count(*) FROM generate_series(2, 4) n, generate_series(1, 8) w,
        LATERAL sharding.claim_node(NULL::$1, 'bm', 'n' || n, 'far-n' || n || '-' || w, 50, '1 hour')" >/dev/null
}

# run TABLE SCRIPT COUNT_FILTER [keep] -> jobs/s of the done rows matching
# COUNT_FILTER; "keep" leaves sharding.claim_node_workers as it is.
run() {
    local table=$1 script=$2 filter=$3
    [ "${4:-}" = keep ] || psql -XqAt -c "DELETE FROM sharding.claim_node_workers" >/dev/null
    local sampler=
    if [ -n "${BENCH_WAITS:-}" ]; then
        ( for _ in $(seq 1 $((SECONDS_PER_RUN * 10))); do
              psql -XqAtc "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
                            WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                              AND state = 'active'" 2>/dev/null
              sleep 0.1
          done | sort | uniq -c | sort -rn | sed "s/^/# waits $script: /" >&2 ) &
        sampler=$!
    fi
    # (The whale's jobs do not count as left: claim_ordered takes one at a time.)
    pgbench_jobs "$table" "$script" "$BATCH" "$filter" "key <> 'whale' AND $filter"
    [ -z "$sampler" ] || wait "$sampler"
}
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }

echo "# $CLIENTS clients, batch $BATCH, $SECONDS_PER_RUN s per run, median of $RUNS runs"
echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $(psql -XqAtc 'SELECT version()' | cut -d, -f1); shared_preload_libraries '$(psql -XqAtc 'SHOW shared_preload_libraries')'"

# measure OURS BASE: RUNS alternating runs of the functions OURS and BASE,
# each of which fills its table and appends its jobs/s to the array ours or
# base; sets mo and mb to their medians.
measure() {
    ours=() base=()
    for _ in $(seq 1 "$RUNS"); do "$1"; "$2"; done
    mo=$(jobs_median "${ours[@]}") mb=$(jobs_median "${base[@]}")
}
# wanted NAME: whether the scenario NAME runs (BENCH_ONLY unset or naming it).
wanted() { [ -z "${BENCH_ONLY:-}" ] || [[ " $BENCH_ONLY " == *" $1 "* ]]; }

ordered_ours() { fill ours t_mixed; ours+=("$(run ours claim_ordered.sql true)"); }
ordered_base() { fill base t_mixed; base+=("$(run base claim.sql true)"); }
if wanted ordered; then
    measure ordered_ours ordered_base
    echo "ordered: claim_ordered ${mo} jobs/s (runs: ${ours[*]}), claim ${mb} jobs/s (runs: ${base[*]}), ratio $(ratio "$mo" "$mb")x (target 0.7)"
fi

burst_ours() { fill ours t_burst t_others; ours+=("$(run ours claim_ordered.sql "key <> 'whale'")"); }
burst_base() { fill ours t_others; base+=("$(run ours claim_ordered.sql "key <> 'whale'")"); }
if wanted burst; then
    measure burst_ours burst_base
    echo "burst: other keys' jobs/s with a 1,000,000-job whale burst ${mo} (runs: ${ours[*]}), without ${mb} (runs: ${base[*]}), ratio $(ratio "$mo" "$mb")x (target 0.5)"
fi

node_ours() { fill ours t_random; ours+=("$(run ours claim_node.sql true)"); }
node_base() { fill base t_random; base+=("$(run base claim_shards.sql true)"); }
if wanted node; then
    measure node_ours node_base
    echo "node: claim_node ${mo} jobs/s (runs: ${ours[*]}), claim_shards same shards ${mb} jobs/s (runs: ${base[*]}), ratio $(ratio "$mo" "$mb")x (target 0.9)"
fi

node_handoff_ours() {
    fill ours t_random
    psql -XqAt -c "DELETE FROM sharding.claim_node_workers" >/dev/null
    foreign_leases ours
    ours+=("$(run ours claim_node.sql "coalesce(owner, '') NOT LIKE 'far-%'" keep)")
}
if wanted node_handoff; then
    measure node_handoff_ours node_base
    echo "node_handoff: claim_node with 1,200 live leases of other nodes' workers ${mo} jobs/s (runs: ${ours[*]}), claim_shards same shards ${mb} jobs/s (runs: ${base[*]}), ratio $(ratio "$mo" "$mb")x"
fi
