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
