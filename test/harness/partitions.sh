#!/usr/bin/env bash
# Moving one shard between databases: a partition of a table partitioned with
# sharding.*_shard_ops is detached, copied with `pg_dump -t` into another
# database and attached there to the same remainder; shard_of still holds
# for every row, routing and pruning agree, and the wrong remainder is refused.
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=sharding_part_src
DST=sharding_part_dst
N=64

. test/lib/tap.sh
q() { psql -XqAt -v ON_ERROR_STOP=1 -d "$@"; }

echo "1..20"
for db in $SRC $DST; do
    dropdb --if-exists "$db" 2>/dev/null; createdb "$db" && q "$db" -c 'CREATE EXTENSION sharding' ||
        { echo "Bail out! cannot create $db"; exit 1; }
done

# Source: text and bigint keys, 100,000 rows each, with hash indexes on the keys.
q $SRC >/dev/null <<SQL || { echo "Bail out! source setup failed"; exit 1; }
CREATE TABLE ev (k text, v int) PARTITION BY HASH (k sharding.text_shard_ops);
SELECT sharding.create_partitions('ev', $N);
INSERT INTO ev SELECT 'tenant-' || i, i FROM generate_series(1, 100000) AS i;
CREATE INDEX ev_k ON ev USING hash (k sharding.text_shard_ops);
CREATE TABLE acct (id bigint, v int) PARTITION BY HASH (id sharding.int8_shard_ops);
SELECT sharding.create_partitions('acct', $N);
INSERT INTO acct SELECT i * 7919 - 500000000, i FROM generate_series(1, 100000) AS i;
CREATE INDEX acct_id ON acct USING hash (id sharding.int8_shard_ops);
SQL

for t in ev acct; do
    key=$([ $t = ev ] && echo k || echo id)
    rows=$(q $SRC -c "SELECT count(*) FROM ${t}_17")
    ok "$(q $SRC -c "SELECT count(*) > 0 AND bool_and(sharding.shard_of($key, $N) = 17) FROM ${t}_17")" \
        "$t: source partition ${t}_17 holds only shard 17 ($rows rows)"
    q $SRC -c "ALTER TABLE $t DETACH PARTITION ${t}_17" >/dev/null
    ok "$(q $SRC -c "SELECT count(*) = $rows FROM ${t}_17")" "$t: detached ${t}_17 keeps its rows"

    # The other database: the parent only, then the dumped shard.
    cols=$([ $t = ev ] && echo "k text, v int" || echo "id bigint, v int")
    opc=$([ $t = ev ] && echo text_shard_ops || echo int8_shard_ops)
    q $DST -c "CREATE TABLE $t ($cols) PARTITION BY HASH ($key sharding.$opc)" >/dev/null
    dump=$(pg_dump -d $SRC -t "${t}_17")
    ok "$(grep -q "USING hash ($key sharding.$opc)" <<<"$dump" && echo t || echo f)" \
        "$t: pg_dump -t keeps the hash index with sharding.$opc"
    printf '%s\n' "$dump" | q $DST >/dev/null 2>&1
    ok "$(q $DST -c "SELECT count(*) = $rows FROM ${t}_17")" "$t: restored ${t}_17 in $DST with all rows"
    ok "$(q $DST -c "ALTER TABLE $t ATTACH PARTITION ${t}_17 FOR VALUES WITH (MODULUS $N, REMAINDER 17)" >/dev/null 2>&1 && echo t || echo f)" \
        "$t: attaches to remainder 17 (PostgreSQL checks every row)"
    ok "$(q $DST -c "SELECT count(*) = $rows AND bool_and(sharding.shard_of($key, $N) = 17 AND tableoid = '${t}_17'::regclass) FROM $t")" \
        "$t: every row of the moved shard satisfies shard_of($key, $N) = 17"
    probe=$(q $DST -c "SELECT $key FROM ${t}_17 ORDER BY v LIMIT 1")
    plan=$(q $DST -c "SET enable_indexscan = off; SET enable_bitmapscan = off; EXPLAIN (COSTS OFF) SELECT * FROM $t WHERE $key = '$probe'")
    ok "$(grep -q "on ${t}_17" <<<"$plan" && echo t || echo f)" "$t: WHERE $key = '$probe' prunes to ${t}_17 in $DST"
    plan=$(q $DST -c "SET enable_seqscan = off; SET enable_bitmapscan = off; EXPLAIN (COSTS OFF) SELECT * FROM ${t}_17 WHERE $key = '$probe'")
    ok "$(grep -q "Index Scan using" <<<"$plan" && [ "$(q $DST -c "SET enable_seqscan = off; SELECT count(*) FROM ${t}_17 WHERE $key = '$probe'")" = 1 ] && echo t || echo f)" \
        "$t: the restored hash index finds '$probe'"
    # A copy attached at the wrong remainder fails PostgreSQL's check (23514).
    err=$(q $DST -c "CREATE TABLE ${t}_wrong (LIKE ${t}_17); INSERT INTO ${t}_wrong SELECT * FROM ${t}_17;
                     ALTER TABLE $t ATTACH PARTITION ${t}_wrong FOR VALUES WITH (MODULUS $N, REMAINDER 18)" 2>&1)
    ok "$(grep -q "ERROR:  partition constraint of relation \"${t}_wrong\" is violated" <<<"$err" && echo t || echo f)" \
        "$t: the same rows at remainder 18 are refused"
    q $DST -c "DROP TABLE IF EXISTS ${t}_wrong" >/dev/null 2>&1
done

# New rows in the other database route by shard_of too.
ok "$(q $DST -c "INSERT INTO ev SELECT k, 0 FROM (SELECT 'new-' || i AS k FROM generate_series(1, 20000) AS i) s
                 WHERE sharding.shard_of(k, $N) = 17 RETURNING tableoid = 'ev_17'::regclass" | sort -u | tr -d '\n')" \
    "new keys of shard 17 inserted in $DST land in ev_17"
err=$(q $DST -c "INSERT INTO ev SELECT k, 0 FROM (SELECT 'new-' || i AS k FROM generate_series(1, 100) AS i) s
                 WHERE sharding.shard_of(k, $N) <> 17 LIMIT 1" 2>&1)
ok "$(grep -q 'no partition of relation "ev" found for row' <<<"$err" && echo t || echo f)" \
    "a key of another shard has no partition in $DST"

dropdb $SRC
dropdb $DST
exit $((failures > 0))
