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
