#!/bin/bash
# DDL on every node (docs/ddl.md): the time of one ALTER TABLE ... ADD
# COLUMN of a distributed table on a coordinator with 1 and with 3 attached
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
        -c max_replication_slots=10 -c max_wal_senders=10 -c max_logical_replication_workers=8 \
        -c max_worker_processes=24 -c wal_retrieve_retry_interval=200ms" || exit 1
fi
export PGDATABASE=postgres
dsn() { echo "host=$PGHOST port=$PGPORT dbname=$1"; }
for db in single c1 a1 c3 b1 b2 b3; do psql -Xq -c "CREATE DATABASE $db" >/dev/null; done
psql -Xq -d single -c 'CREATE TABLE docs (k text PRIMARY KEY, v integer)' >/dev/null
for db in a1 b1 b2 b3; do
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
# One statement: a new column each run (catalog only, no rewrite).
once() { PGDATABASE=$1 time_ms "ALTER TABLE docs ADD COLUMN col_$2 integer"; }
declare -a single one three
for i in $(seq "$RUNS"); do
    single+=("$(once single "$i")")
    one+=("$(once c1 "$i")")
    three+=("$(once c3 "$i")")
done
check=$(psql -XAtq -d b3 -c "SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname LIKE 'col\_%'")
[ "$check" = "$RUNS" ] || { echo "b3 has $check columns, expected $RUNS" >&2; exit 1; }
s=$(printf '%s\n' "${single[@]}" | median)
o=$(printf '%s\n' "${one[@]}" | median)
t=$(printf '%s\n' "${three[@]}" | median)
echo "ALTER TABLE ADD COLUMN, median of $RUNS runs: one database ${s} ms; coordinator + 1 node ${o} ms; coordinator + 3 nodes ${t} ms"
python3 -c "import sys; s,o,t=map(float,sys.argv[1:]); print(f'ratios: 1 node / one database {o/s:.1f}, 3 nodes / one database {t/s:.1f}, 3 nodes / 1 node {t/o:.2f}')" "$s" "$o" "$t"
