#!/bin/bash
# DDL on every node (docs/ddl.md): the time of one ALTER TABLE ... ADD
# COLUMN of a distributed table on a coordinator with 1, 3 and 8 attached
# data nodes (propagated through two-phase commit), against the same
# statement on one database. All databases live on one throwaway server
# (wal_level = logical, max_prepared_transactions = 20, the library
# preloaded), so the figures are the protocol's cost (connections, the
# statement, PREPARE and COMMIT PREPARED on each node), not a network's.
#
#   SHARDING_PGROOT=/tmp/pgroot-mine bash test/bench/ddl/run.sh [runs]
# Prints the median of RUNS (default 15) interleaved runs of each, in ms,
# and the ratios against the single database.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. test/bench/lib.sh
RUNS=${1:-15}
if [ -z "${PGHOST:-}" ]; then
    ensure_packages || exit 1
    build_and_install || exit 1
    BENCHDIR=$(make_cluster_dir bench)
    trap 'stop_cluster "$BENCHDIR"; rm -rf "$BENCHDIR"' EXIT
    start_cluster "$BENCHDIR" "-c jit=off -c wal_level=logical -c max_prepared_transactions=20 \
        -c max_replication_slots=16 -c max_wal_senders=16 -c max_logical_replication_workers=14 \
        -c max_worker_processes=32 -c max_connections=150 -c wal_retrieve_retry_interval=200ms" || exit 1
fi
export PGDATABASE=postgres
dsn() { echo "host=$PGHOST port=$PGPORT dbname=$1"; }
for db in single c1 a1 c3 b1 b2 b3 c8 d1 d2 d3 d4 d5 d6 d7 d8; do psql -Xq -c "CREATE DATABASE $db" >/dev/null; done
psql -Xq -d single -c 'CREATE TABLE docs (k text PRIMARY KEY, v integer)' >/dev/null
for db in a1 b1 b2 b3 d1 d2 d3 d4 d5 d6 d7 d8; do
    psql -Xq -d "$db" -c 'CREATE EXTENSION sharding' -c 'CREATE TABLE docs (k text PRIMARY KEY, v integer)' >/dev/null
done
setup_coord() {  # setup_coord DB NODE...
    local db=$1; shift
    local nodes arr
    psql -Xq -d "$db" -c "ALTER DATABASE $db SET sharding.coordinator_dsn = '$(dsn "$db")'" >/dev/null
    psql -Xq -d "$db" -c 'CREATE EXTENSION sharding' -c 'CREATE EXTENSION dblink' \
        -c 'CREATE TABLE docs (k text PRIMARY KEY, v integer)' >/dev/null
    arr=$(printf "'%s'," "$@"); arr="ARRAY[${arr%,}]"
    for n in "$@"; do psql -Xq -d "$db" -c "SELECT sharding.add_node('$n', '$(dsn "$n")')" >/dev/null; done
    psql -Xq -d "$db" -c "SELECT sharding.create_map('m', 6, $arr)" -c "SELECT sharding.distribute('docs', 'k', 'm')" >/dev/null
    for n in "$@"; do psql -Xq -d "$db" -c "SELECT sharding.attach_node('$n')" >/dev/null; done
}
setup_coord c1 a1
setup_coord c3 b1 b2 b3
setup_coord c8 d1 d2 d3 d4 d5 d6 d7 d8
# One statement: a new column each run (catalog only, no rewrite).
once() { PGDATABASE=$1 time_ms "ALTER TABLE docs ADD COLUMN col_$2 integer"; }
declare -a single one three eight
for i in $(seq "$RUNS"); do
    single+=("$(once single "$i")")
    one+=("$(once c1 "$i")")
    three+=("$(once c3 "$i")")
    eight+=("$(once c8 "$i")")
done
for db in b3 d8; do
    check=$(psql -XAtq -d $db -c "SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname LIKE 'col\_%'")
    [ "$check" = "$RUNS" ] || { echo "$db has $check columns, expected $RUNS" >&2; exit 1; }
done
s=$(printf '%s\n' "${single[@]}" | median)
o=$(printf '%s\n' "${one[@]}" | median)
t=$(printf '%s\n' "${three[@]}" | median)
e=$(printf '%s\n' "${eight[@]}" | median)
echo "ALTER TABLE ADD COLUMN, median of $RUNS runs: one database ${s} ms; coordinator + 1 node ${o} ms; + 3 nodes ${t} ms; + 8 nodes ${e} ms"
python3 -c "import sys; s,o,t,e=map(float,sys.argv[1:]); print(f'ratios to one database: 1 node {o/s:.1f}, 3 nodes {t/s:.1f}, 8 nodes {e/s:.1f}; per added node {(e-o)/7:.1f} ms')" "$s" "$o" "$t" "$e"
