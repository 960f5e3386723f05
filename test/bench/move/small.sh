#!/usr/bin/env bash
# The fixed cost of a move (issue 38): BENCH_MOVES (default 16) moves of a
# small shard (about BENCH_SMALL_ROWS / 4 of its rows, default 8,000 / 4)
# back and forth between two nodes, sharding.move_verify = off, on three
# instances (coordinator, n1, n2); prints each move's milliseconds and
# their median. What a move costs beyond its rows: its sessions (each
# about 15 ms to connect, plus its checks there), its set-up and its
# switch. A ratio needs two builds measured one after the other on the
# same machine: run it in a checkout of each (docs/performance.md, round
# 12). Not part of the test command:
#
#   SHARDING_PGROOT=/work/pgroot/you bash test/bench/move/small.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
. test/lib/multinode.sh
. test/bench/lib.sh

MOVES=${BENCH_MOVES:-16}
ROWS=${BENCH_SMALL_ROWS:-8000}
bench_nodes i0 i1 i2 >/dev/null
declare -A HOST=([coord]=i0 [n1]=i1 [n2]=i2)
for n in coord n1 n2; do
    q "${HOST[$n]}" postgres -c "CREATE DATABASE $n" >/dev/null
    qn "$n" -c 'CREATE EXTENSION sharding' \
        -c 'CREATE TABLE accounts (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))' >/dev/null
done
qn coord >/dev/null <<SQL
SELECT sharding.create_map('bench', 4, ARRAY['n1', 'n2']);
SELECT sharding.add_node('n1', '$(ndsn n1)'), sharding.add_node('n2', '$(ndsn n2)');
SELECT sharding.distribute('accounts', 'tenant', 'bench');
SELECT sharding.attach_node('n1');
SELECT sharding.attach_node('n2');
SQL
from=$(qn coord -c "SELECT node FROM sharding.shards WHERE map = 'bench' AND logical = 0")
qn "$from" -c "SET session_replication_role = replica" -c "INSERT INTO accounts SELECT 't' || g, g, 'x'
    FROM generate_series(1, $ROWS) g WHERE sharding.shard_of('t' || g, 4) = 0" >/dev/null
rows=$(qn "$from" -c "SELECT count(*) FROM accounts")
to=n2
[ "$from" = n2 ] && to=n1
ms=()
for _ in $(seq 1 "$MOVES"); do
    t0=$(date +%s%N)
    qn coord -c "SET sharding.move_verify = off" -c "SELECT sharding.move_shard_online('bench', 0, '$to')" >/dev/null ||
        { echo "a move failed"; exit 1; }
    ms+=($((($(date +%s%N) - t0) / 1000000)))
    t=$to to=$from from=$t
done
echo "moves of a $rows-row shard, ms: ${ms[*]}"
echo "median $(printf '%s\n' "${ms[@]}" | median) ms; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
