# Shared by the benchmarks: a throwaway cluster (unless PGHOST is already
# set), and median timing of SQL statements with psql's \timing.
. "$(dirname "${BASH_SOURCE[0]}")/../lib/cluster.sh"

bench_setup() {
    if [ -z "${PGHOST:-}" ]; then
        ensure_packages || exit 1
        build_and_install || exit 1
        BENCHDIR=$(make_cluster_dir bench)
        trap 'stop_cluster "$BENCHDIR"; rm -rf "$BENCHDIR"' EXIT
        start_cluster "$BENCHDIR" "-c shared_buffers=1GB -c jit=off -c max_parallel_workers_per_gather=0" || exit 1
    fi
    export PGDATABASE=${PGDATABASE:-postgres}
}

# time_ms SQL: runs SQL once and prints its execution time in ms.
time_ms() {
    psql -Xq -c 'SET jit = off' -c 'SET max_parallel_workers_per_gather = 0' -c '\timing on' -c "$1" |
        sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# bench_args FOLDER SECONDS RUNS [ARG...]: the command line of the pgbench
# benchmarks, `run.sh [seconds] [runs]`: SECONDS_PER_RUN and RUNS from the
# arguments ARG... (the script's "$@"), SECONDS and RUNS where they are
# missing; CLIENTS=8; HERE=FOLDER, the benchmark's own files.
bench_args() {
    HERE=$1
    SECONDS_PER_RUN=${4:-$2}
    RUNS=${5:-$3}
    CLIENTS=8
}

# pgbench_jobs TABLE SCRIPT BATCH DONE PENDING: runs $HERE/SCRIPT with
# pgbench (-M prepared, CLIENTS clients and threads, SECONDS_PER_RUN s,
# -D batch=BATCH) and prints the jobs/s it completed: TABLE's done rows
# matching the condition DONE, scaled from the transactions pgbench
# processed to its tps. Warns when no pending row matching PENDING is left
# (the table ran dry: the figure is too low).
pgbench_jobs() {
    local table=$1 script=$2 batch=$3 done_filter=$4 pending_filter=$5 out tps txns done_jobs left
    out=$(pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_PER_RUN" -D batch="$batch" \
        -f "$HERE/$script" 2>&1) || { echo "$out" >&2; return 1; }
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' <<<"$out")
    txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
    done_jobs=$(psql -XqAtc "SELECT count(*) FROM $table WHERE status = 'done' AND $done_filter")
    left=$(psql -XqAtc "SELECT count(*) FROM $table WHERE status = 'pending' AND $pending_filter")
    [ "$left" -gt 0 ] || echo "warning: $table ran dry; raise the pending rows" >&2
    python3 -c "import sys; print(round(float(sys.argv[1]) * float(sys.argv[2]) / float(sys.argv[3])))" \
        "$done_jobs" "$tps" "$txns"
}

# jobs_median N...: the median of the arguments, rounded to a whole number.
jobs_median() { python3 -c "import statistics, sys; print(round(statistics.median(map(float, sys.argv[1:]))))" "$@"; }

# bench_cluster [postgres options]: builds and installs, then starts a
# throwaway server in $DIR/pg (DIR is made here, readable by the server user,
# removed on exit with everything in it) with the settings the pgbench
# benchmarks share (jit off, 256MB shared buffers, 4GB max_wal_size) plus the
# given options; PGDATABASE=postgres. Scratch files go in $DIR.
bench_cluster() {
    build_and_install
    DIR=$(make_cluster_dir bench)
    [ "$(id -u)" -eq 0 ] && chown postgres: "$DIR"
    chmod 755 "$DIR"
    trap 'stop_cluster "$DIR/pg"; rm -rf "$DIR"' EXIT
    start_cluster "$DIR/pg" -c jit=off -c shared_buffers=256MB -c max_wal_size=4GB "$@"
    export PGDATABASE=postgres
}

# bench_queues: queues `ours` and `hand` (create_queue), `hand` with the
# partial index the hand-written SKIP LOCKED statement needs
# (test/bench/claim/hand.sql).
bench_queues() {
    psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE EXTENSION sharding;
SELECT sharding.create_queue('ours');
SELECT sharding.create_queue('hand');
CREATE INDEX ON hand (created) WHERE status IN ('pending', 'processing');
SQL
}

# Multi-node benchmarks (test/lib/multinode.sh, sourced first): bench_nodes
# INSTANCE... builds, installs and starts the instances (exits if that
# fails). With HOST mapping each database to its instance, ndsn DB is the
# database's DSN and qn DB [psql args] runs psql in it.
bench_nodes() {
    ensure_packages || exit 1
    build_and_install || exit 1
    mn_start "$@" || { echo "instances did not start"; exit 1; }
}
ndsn() { echo "host=127.0.0.1 port=${PORT[${HOST[$1]}]} dbname=$1 user=postgres"; }
qn() { local n=$1; shift; q "${HOST[$n]}" "$n" "$@"; }
