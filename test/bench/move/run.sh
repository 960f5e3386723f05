#!/usr/bin/env bash
# Benchmark of move_shard_online (docs/moves.md), ratios measured in
# one run on two live instances (wal_level = logical):
#
#   1. write-refusal window of a 1,000,000-row shard / that of a 10,000-row
#      shard (target: at most 2). The window is measured by the move itself
#      (DEBUG timings): from the source's freeze until the destination
#      follows the switch; it is the time a writer retrying on 55000 waits.
#   2. time of a 1,000,000-row move / time of copying the same rows between
#      the two instances with COPY ... TO STDOUT | COPY ... FROM STDIN into a
#      table with the same primary key (target: at most 2). Also against the
#      same pipe into a table that, like a guarded distributed table, has a
#      BEFORE ROW trigger (not firing: session_replication_role = replica, as
#      in the move): PostgreSQL's COPY does not batch inserts into such a
#      table, so this is the fastest a copy into a guarded table can be.
#
# Median of BENCH_RUNS runs (default 3); moves alternate direction (n1 -> n2,
# then back). Three instances: the coordinator, n1, n2. Not part of the test
# command (minutes, not seconds):
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/bench/move/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
. test/multinode/lib.sh
. test/bench/lib.sh

RUNS=${BENCH_RUNS:-3}
BIG=${BENCH_BIG_ROWS:-1000000}
SMALL=${BENCH_SMALL_ROWS:-10000}
ensure_packages || exit 1
build_and_install || exit 1
# The coordinator on an instance of its own, as in production: the
# followers' slots live there, and their WAL senders decode only its WAL.
mn_start i0 i1 i2 || { echo "instances did not start"; exit 1; }
declare -A HOST=([coord]=i0 [n1]=i1 [n2]=i2)
ndsn() { echo "host=127.0.0.1 port=${PORT[${HOST[$1]}]} dbname=$1 user=postgres"; }
qn() { local n=$1; shift; q "${HOST[$n]}" "$n" "$@"; }

for n in coord n1 n2; do
    q "${HOST[$n]}" postgres -c "CREATE DATABASE $n" >/dev/null
    qn "$n" -c 'CREATE EXTENSION sharding' -c 'CREATE EXTENSION dblink' \
        -c 'CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text)' \
        -c 'CREATE TABLE copy_target (tenant text NOT NULL, id bigint PRIMARY KEY, val text)' \
        -c 'CREATE TABLE copy_guarded (tenant text NOT NULL, id bigint PRIMARY KEY, val text)' \
        -c 'CREATE FUNCTION pass() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$' \
        -c 'CREATE TRIGGER pass BEFORE INSERT ON copy_guarded FOR EACH ROW EXECUTE FUNCTION pass()' >/dev/null
done
qn coord >/dev/null <<SQL
SELECT sharding.create_map('bench', 4, ARRAY['n1', 'n2']);
SELECT sharding.add_node('n1', '$(ndsn n1)'), sharding.add_node('n2', '$(ndsn n2)');
SELECT sharding.distribute('accounts', 'tenant', 'bench');
SELECT sharding.attach_node('n1');
SELECT sharding.attach_node('n2');
SQL
# Shard 0: BIG rows over 1,000 tenants; shard 1: SMALL rows over 100 tenants.
tenants() {
    echo "SELECT array_agg(t) FROM (SELECT t FROM (SELECT 'tenant-' || i AS t FROM generate_series(1, 100000) i) x
           WHERE sharding.logical_shard('bench', t) = $1 LIMIT $2) y"
}
qn n1 -c "INSERT INTO accounts SELECT (\$t\$$(qn coord -c "$(tenants 0 1000)")\$t\$::text[])[1 + i % 1000], i, md5(i::text)
            FROM generate_series(1, $BIG) i" \
      -c "INSERT INTO accounts SELECT (\$t\$$(qn coord -c "$(tenants 1 100)")\$t\$::text[])[1 + i % 100], 10000000 + i, md5(i::text)
            FROM generate_series(1, $SMALL) i" \
      -c 'VACUUM ANALYZE accounts' >/dev/null
echo "# shard 0: $(qn n1 -c "SELECT count(*) FROM accounts WHERE sharding.logical_shard('bench', tenant) = 0") rows, shard 1: $(qn n1 -c "SELECT count(*) FROM accounts WHERE sharding.logical_shard('bench', tenant) = 1") rows"

# move SHARD TO: prints "total_ms window_ms"
move() {
    local t0 out total f d
    t0=$(date +%s%N)
    out=$(PGOPTIONS='-c client_min_messages=debug1' qn coord -c "SELECT sharding.move_shard_online('bench', $1, '$2')" 2>&1)
    total=$((($(date +%s%N) - t0) / 1000000))
    f=$(echo "$out" | sed -n 's/.*: frozen at \(.*\)$/\1/p')
    d=$(echo "$out" | sed -n 's/.*: destination follows at \(.*\)$/\1/p')
    if [ -z "$f" ] || [ -z "$d" ]; then echo "move failed: $out" >&2; echo "0 0"; return 1; fi
    [ -n "${BENCH_VERBOSE:-}" ] && echo "$out" | grep 'DEBUG:  move' | sed 's/^DEBUG:  /#   /' >&2
    echo "$total $(qn coord -c "SELECT round(extract(epoch FROM '$d'::timestamptz - '$f'::timestamptz) * 1000, 1)")"
}
# copy SHARD FROM TO TABLE: COPY pipe of the shard's rows into TABLE; prints ms.
copy() {
    local t0
    qn "$3" -c "TRUNCATE $4"
    t0=$(date +%s%N)
    qn "$2" -c "\\copy (SELECT tenant, id, val FROM accounts WHERE sharding.logical_shard('bench', tenant) = $1) TO STDOUT" |
        qn "$3" -c 'SET session_replication_role = replica' -c "\\copy $4 FROM STDIN"
    echo $((($(date +%s%N) - t0) / 1000000))
}

small_w=(); big_w=(); big_t=(); copy_t=(); small_t=(); copyg_t=()
for r in $(seq "$RUNS"); do
    if [ $((r % 2)) -eq 1 ]; then src=n1 dst=n2; else src=n2 dst=n1; fi
    c=$(copy 0 "$src" "$dst" copy_target)
    cg=$(copy 0 "$src" "$dst" copy_guarded)
    read -r ts ws < <(move 1 "$dst")
    read -r tb wb < <(move 0 "$dst")
    echo "# run $r ($src -> $dst): copy pipe ${c} ms (into a table with a trigger ${cg} ms); ${SMALL}-row move ${ts} ms (window ${ws} ms); ${BIG}-row move ${tb} ms (window ${wb} ms); load $(cut -d' ' -f1 /proc/loadavg)"
    small_w+=("$ws"); big_w+=("$wb"); big_t+=("$tb"); copy_t+=("$c"); small_t+=("$ts"); copyg_t+=("$cg")
done
mw_s=$(printf '%s\n' "${small_w[@]}" | median)
mw_b=$(printf '%s\n' "${big_w[@]}" | median)
mt_b=$(printf '%s\n' "${big_t[@]}" | median)
mt_s=$(printf '%s\n' "${small_t[@]}" | median)
mc=$(printf '%s\n' "${copy_t[@]}" | median)
mcg=$(printf '%s\n' "${copyg_t[@]}" | median)
echo "refusal window: ${SMALL}-row shard ${mw_s} ms, ${BIG}-row shard ${mw_b} ms, ratio $(awk -v a="$mw_b" -v b="$mw_s" 'BEGIN { printf "%.2f", a / b }') (target <= 2)"
echo "move time: ${BIG}-row move ${mt_b} ms, COPY pipe ${mc} ms, ratio $(awk -v a="$mt_b" -v b="$mc" 'BEGIN { printf "%.2f", a / b }') (target <= 2); ${SMALL}-row move ${mt_s} ms"
echo "move time against the pipe into a table with a BEFORE ROW trigger: ${mcg} ms, ratio $(awk -v a="$mt_b" -v b="$mcg" 'BEGIN { printf "%.2f", a / b }')"
echo "medians of $RUNS runs; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
