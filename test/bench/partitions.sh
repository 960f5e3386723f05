#!/usr/bin/env bash
# Benchmark: inserting 1,000,000 rows into a 64-partition hash-partitioned
# table with sharding's operator class vs PostgreSQL's default hash opclass,
# for text and bigint keys. Each run TRUNCATEs and times one INSERT ... SELECT
# on the server (clock_timestamp); the two tables alternate which goes first.
# Reports the median of RUNS runs (default 5) and the ratio ours / default
# (target <= 1.05). Starts its own throwaway cluster with jit = off.
#
#   bash test/bench/partitions.sh            # RUNS=7 ROWS=1000000 to change
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/cluster.sh
RUNS=${RUNS:-5}
ROWS=${ROWS:-1000000}

build_and_install || { log "build failed"; exit 1; }
DIR=$(make_cluster_dir bench)
trap 'stop_cluster "$DIR"; rm -rf "$DIR"' EXIT
start_cluster "$DIR" -c jit=off -c shared_buffers=512MB -c max_wal_size=4GB || exit 1
export PGDATABASE=postgres
q() { psql -XqAt -v ON_ERROR_STOP=1 "$@"; }

q >/dev/null <<'SQL'
CREATE EXTENSION sharding;
CREATE TABLE ours_text (k text, v bigint) PARTITION BY HASH (k sharding.text_shard_ops);
CREATE TABLE pg_text (k text, v bigint) PARTITION BY HASH (k);
CREATE TABLE ours_int8 (k bigint, v bigint) PARTITION BY HASH (k sharding.int8_shard_ops);
CREATE TABLE pg_int8 (k bigint, v bigint) PARTITION BY HASH (k);
SELECT sharding.create_partitions(t, 64) FROM unnest('{ours_text,ours_int8}'::regclass[]) AS t;
DO $$
BEGIN
    FOR r IN 0 .. 63 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF pg_text FOR VALUES WITH (MODULUS 64, REMAINDER %s)', 'pg_text_' || r, r);
        EXECUTE format('CREATE TABLE %I PARTITION OF pg_int8 FOR VALUES WITH (MODULUS 64, REMAINDER %s)', 'pg_int8_' || r, r);
    END LOOP;
END $$;
SQL

# time_insert TABLE KEY-EXPRESSION: seconds for one INSERT of $ROWS rows.
time_insert() {
    q -c "TRUNCATE $1; CHECKPOINT" >/dev/null
    q -c "DO \$\$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN
            INSERT INTO $1 SELECT $2, i FROM generate_series(1, $ROWS) AS i;
            RAISE NOTICE 'secs=%', extract(epoch FROM clock_timestamp() - t0); END \$\$" 2>&1 |
        sed -n 's/.*secs=//p'
}
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

mkdir -p test/bench/out
out=test/bench/out/partitions.txt
{
    echo "rows=$ROWS runs=$RUNS partitions=64 $(date -u +%FT%TZ)"
    for kind in text int8; do
        expr=$([ $kind = text ] && echo "'tenant-' || i" || echo "i * 2654435761")
        ours=() pg=()
        time_insert ours_$kind "$expr" >/dev/null # warm-up
        time_insert pg_$kind "$expr" >/dev/null
        for ((r = 1; r <= RUNS; r++)); do
            if ((r % 2)); then
                ours+=("$(time_insert ours_$kind "$expr")"); pg+=("$(time_insert pg_$kind "$expr")")
            else
                pg+=("$(time_insert pg_$kind "$expr")"); ours+=("$(time_insert ours_$kind "$expr")")
            fi
        done
        mo=$(printf '%s\n' "${ours[@]}" | median)
        mp=$(printf '%s\n' "${pg[@]}" | median)
        echo "$kind keys: sharding.${kind}_shard_ops runs: ${ours[*]}"
        echo "$kind keys: PostgreSQL default     runs: ${pg[*]}"
        awk -v o="$mo" -v p="$mp" -v k="$kind" \
            'BEGIN {printf "%s keys: median ours %.3f s, default %.3f s, ratio ours/default %.3f (target <= 1.05)\n", k, o, p, o / p}'
    done
} | tee "$out"
