#!/usr/bin/env bash
# Benchmark of a move against the plain COPY pipe of the same rows, per
# table layout (docs/moves.md, docs/partitions.md; issue 38), ratios
# measured in one run on three instances (coordinator, n1, n2):
#
#   1. plain table: a BENCH_ROWS-row (default 1,000,000) move of one shard
#      with sharding.move_verify = off / the pipe
#      COPY (SELECT ... WHERE shard_of(tenant, 4) = 0) TO STDOUT | COPY ...
#      FROM STDIN into a table with the same primary key at the destination
#      (target: at most 1.2);
#   2. shard-partitioned table (PARTITION BY HASH (tenant
#      sharding.text_shard_ops), create_partitions(.., 4)): the same move /
#      the pipe of the partition, COPY parted_0 TO STDOUT | COPY FROM STDIN
#      into a table partitioned the same way at the destination (target:
#      at most 1.15);
#   2b. one shard over four plain tables (multi_1 .. multi_4, a quarter of
#      the rows each, one map): the move / the four pipes one after another,
#      and the move's copy phase (its DEBUG "copying" to "catching_up") / those
#      pipes; the copy works on one queue of every table's parts
#      (sharding.move_parallel sessions). The copy phase of the other
#      layouts is reported too.
#   3. the clean-up of each move (replication dropped to return: the
#      source-side delete, or the leaf's TRUNCATE), and each move with
#      move_verify = on / the pipe, reported.
#   4. how close move_progress.time_left's estimate was, on the untimed
#      move back (n2 -> n1) while a procedure on the coordinator samples
#      the move's journal row every 100 ms: at the first sample past the
#      middle of the copy phase, the estimate (the rows still to copy,
#      rows_expected - rows_copied, at the rate since copy_started: what
#      time_left shows, before its rounding to whole seconds) / the time
#      the copy phase actually took from then on; and rows_expected / the
#      rows the copy sent.
#
# Each layout is a map of its own (4 shards over n1 and n2), the rows in
# shard 0 at n1. Per run, for each layout: VACUUM and CHECKPOINT at both
# nodes, the pipe, then the move n1 -> n2 timed with verification off, the
# move back (untimed), the move with verification on, back again. Median
# of BENCH_RUNS runs (default 3). Not part of the test command:
#
#   SHARDING_PGROOT=/work/pgroot/you BENCH_RUNS=3 bash test/bench/move/layouts.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
. test/lib/multinode.sh
. test/bench/lib.sh

RUNS=${BENCH_RUNS:-3}
ROWS=${BENCH_ROWS:-1000000}
bench_nodes i0 i1 i2
declare -A HOST=([coord]=i0 [n1]=i1 [n2]=i2)

for n in coord n1 n2; do
    q "${HOST[$n]}" postgres -c "CREATE DATABASE $n" >/dev/null
    qn "$n" >/dev/null <<'SQL'
CREATE EXTENSION sharding; CREATE EXTENSION dblink;
CREATE TABLE plain (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant));
CREATE TABLE parted (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))
    PARTITION BY HASH (tenant sharding.text_shard_ops);
SELECT sharding.create_partitions('parted', 4);
CREATE TABLE pipe_plain (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant));
CREATE TABLE pipe_parted (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))
    PARTITION BY HASH (tenant sharding.text_shard_ops);
SELECT sharding.create_partitions('pipe_parted', 4);
SQL
    for i in 1 2 3 4; do
        qn "$n" -c "CREATE TABLE multi_$i (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))" \
            -c "CREATE TABLE pipe_multi_$i (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))" >/dev/null
    done
done
qn coord >/dev/null <<SQL
SELECT sharding.create_map('mplain', 4, ARRAY['n1', 'n2']);
SELECT sharding.create_map('mparted', 4, ARRAY['n1', 'n2']);
SELECT sharding.create_map('mmulti', 4, ARRAY['n1', 'n2']);
SELECT sharding.add_node('n1', '$(ndsn n1)'), sharding.add_node('n2', '$(ndsn n2)');
SELECT sharding.distribute('plain', 'tenant', 'mplain');
SELECT sharding.distribute('parted', 'tenant', 'mparted');
SELECT sharding.distribute('multi_' || i, 'tenant', 'mmulti') FROM generate_series(1, 4) i;
SELECT sharding.attach_node('n1');
SELECT sharding.attach_node('n2');
SQL
for m in mplain mparted mmulti; do
    [ "$(qn coord -c "SELECT node FROM sharding.shards WHERE map = '$m' AND logical = 0")" = n1 ] ||
        qn coord -c "SELECT sharding.move_shard_online('$m', 0, 'n1')" >/dev/null
done
mn_wait i1 n1 "SELECT count(*) FROM sharding.shards WHERE node = 'n1' AND logical = 0" 3 30 >/dev/null
# ROWS rows over 1,000 tenants of shard 0.
for t in plain parted; do
    qn n1 -c "INSERT INTO $t SELECT t, i, repeat('x', 100) FROM
                (SELECT array_agg(t) AS ts FROM (SELECT 'tenant-' || i AS t FROM generate_series(1, 10000) i) x
                  WHERE sharding.shard_of(t, 4) = 0) a, LATERAL (SELECT ts[1 + i % 1000] AS t, i FROM generate_series(1, $ROWS) i) g" >/dev/null
done
for i in 1 2 3 4; do
    qn n1 -c "INSERT INTO multi_$i SELECT t, i, repeat('x', 100) FROM
                (SELECT array_agg(t) AS ts FROM (SELECT 'tenant-' || i AS t FROM generate_series(1, 10000) i) x
                  WHERE sharding.shard_of(t, 4) = 0) a, LATERAL (SELECT ts[1 + i % 1000] AS t, i FROM generate_series(1, $ROWS / 4) i) g" >/dev/null
done

qn coord >/dev/null <<'SQL'
CREATE TABLE tl_samples (map text, at timestamptz, phase text, rows_copied bigint, rows_expected bigint,
    copy_started timestamptz);
CREATE PROCEDURE tl_sample(m text) LANGUAGE plpgsql AS $$
DECLARE seen boolean := false; p text;
BEGIN
    FOR i IN 1 .. 6000 LOOP   -- 600 s at most
        p := NULL;
        INSERT INTO tl_samples SELECT m, clock_timestamp(), j.phase, j.rows_copied, j.rows_expected, j.copy_started
          FROM sharding.move_journal j WHERE j.map = m AND j.logical = 0 AND j.phase NOT IN ('done', 'failed', 'cancelled')
        RETURNING phase INTO p;
        COMMIT;
        EXIT WHEN p IS NULL AND (seen OR i > 300);
        seen := seen OR p IS NOT NULL;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SQL
# estimate MAP ROWS: "estimate/actual rows_expected/rows" of the sampled move.
estimate() {
    qn coord -c "TRUNCATE tl_samples" >/dev/null
    qn coord -c "CALL tl_sample('$1')" >/dev/null &
    local sampler=$!
    move "$1" n1 off >/dev/null
    wait "$sampler"
    qn coord -F ' ' -c "WITH s AS (SELECT * FROM tl_samples WHERE map = '$1'),
        c AS (SELECT min(at) FILTER (WHERE phase = 'copying') AS c0,
                     min(at) FILTER (WHERE phase NOT IN ('queued', 'copying')) AS c1 FROM s),
        mid AS (SELECT s.* FROM s, c WHERE s.phase = 'copying' AND s.rows_copied > 0 AND s.rows_expected IS NOT NULL
                   AND s.at >= c.c0 + (c.c1 - c.c0) / 2 ORDER BY s.at LIMIT 1)
        SELECT round((extract(epoch FROM mid.at - mid.copy_started) * greatest(mid.rows_expected - mid.rows_copied, 0)
                      / mid.rows_copied / extract(epoch FROM c.c1 - mid.at))::numeric, 2),
               round(mid.rows_expected::numeric / $2, 3)
          FROM mid, c"
}
settle() { for n in n1 n2; do qn "$n" -c 'VACUUM ANALYZE' -c 'CHECKPOINT' >/dev/null; done; }
ts() { date -d "$1" +%s.%N; }
# move MAP TO VERIFY: prints "total_ms cleanup_ms copy_ms" (clean-up:
# replication dropped to return; copy: "copying" to "catching_up").
move() {
    local t0 t1 out x c k
    t0=$(date +%s.%N)
    out=$(PGOPTIONS="-c client_min_messages=debug1 -c sharding.move_verify=$3" qn coord -c "SELECT sharding.move_shard_online('$1', 0, '$2')" 2>&1)
    t1=$(date +%s.%N)
    x=$(echo "$out" | sed -n 's/.*: replication dropped at \(.*\)$/\1/p')
    c=$(echo "$out" | sed -n 's/.*: copying at \(.*\)$/\1/p')
    k=$(echo "$out" | sed -n 's/.*: catching_up at \(.*\)$/\1/p')
    [ -n "$x" ] && [ -n "$c" ] && [ -n "$k" ] || { echo "move failed: $out" >&2; exit 1; }
    awk -v a="$t0" -v b="$t1" -v x="$(ts "$x")" -v c="$(ts "$c")" -v k="$(ts "$k")" \
        'BEGIN { printf "%.0f %.0f %.0f\n", (b - a) * 1000, (b - x) * 1000, (k - c) * 1000 }'
}
# pipe QUERY TABLE: COPY (QUERY) TO STDOUT at n1 | COPY TABLE FROM STDIN at n2; ms.
pipe() {
    local t0
    qn n2 -c "TRUNCATE $2" >/dev/null
    t0=$(date +%s%N)
    qn n1 -c "\\copy ($1) TO STDOUT" | qn n2 -c "\\copy $2 FROM STDIN"
    echo $((($(date +%s%N) - t0) / 1000000))
    qn n2 -c "TRUNCATE $2" >/dev/null
}
LAYOUTS=${BENCH_LAYOUTS:-plain parted multi}
for r in $(seq 1 "$RUNS"); do
    for layout in $LAYOUTS; do
        settle
        if [ "$layout" = multi ]; then
            p=0
            for i in 1 2 3 4; do
                p=$((p + $(pipe "SELECT tenant, id, val FROM multi_$i WHERE sharding.shard_of(tenant, 4) = 0" "pipe_multi_$i")))
            done
        else
            if [ "$layout" = plain ]; then query="SELECT tenant, id, val FROM plain WHERE sharding.shard_of(tenant, 4) = 0"
            else query="SELECT tenant, id, val FROM parted_0"; fi
            p=$(pipe "$query" "pipe_$layout")
        fi
        settle
        read -r m mc mcp <<<"$(move "m$layout" n2 off)"
        read -r e er <<<"$(estimate "m$layout" "$ROWS")"
        settle
        read -r v vc vcp <<<"$(move "m$layout" n2 on)"
        move "m$layout" n1 off >/dev/null
        echo "# run $r, $layout: pipe $p ms; move (verify off) $m ms, copy phase $mcp ms, clean-up $mc ms; move (verify on) $v ms, copy phase $vcp ms, clean-up $vc ms; time_left mid-copy / actual ${e:-none}, rows_expected / rows ${er:-none}; load $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "$p $m $mc $v $vc ${e:-0} ${er:-0} $mcp $vcp" >"$ROOT/$layout.r$r"
    done
done
med() { for r in $(seq 1 "$RUNS"); do awk "{print $2}" "$ROOT/$1.r$r"; done | median; }
for layout in $LAYOUTS; do
    target=$([ "$layout" = parted ] && echo 1.15 || echo 1.2)
    echo "$layout: move (move_verify off) / pipe = $(printf '%.2f' "$(med "$layout" '$2 / $1')") (target <= $target); with verification $(printf '%.2f' "$(med "$layout" '$4 / $1')"); median pipe $(med "$layout" '$1') ms, move $(med "$layout" '$2') ms, clean-up $(med "$layout" '$3') ms (verify on: $(med "$layout" '$5') ms)"
    echo "$layout: copy phase / pipe = $(printf '%.2f' "$(med "$layout" '$8 / $1')") (median copy phase $(med "$layout" '$8') ms)"
    echo "$layout: time_left at mid-copy / the copy's actual rest = $(med "$layout" '$6'); rows_expected / rows = $(med "$layout" '$7')"
done
echo "rows: $ROWS; nproc: $(nproc)"
