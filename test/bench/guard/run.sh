#!/usr/bin/env bash
# Benchmark (not a test): the cost of guarded writes on a data node.
#
#   SHARDING_PGROOT=/tmp/pgroot-mine bash test/bench/guard/run.sh [seconds] [runs]
#
# One instance (wal_level = logical) with a coordinator database `coord` and
# a data node `data` attached to it as node n1 (sharding.attach_node), which
# owns every logical shard of map `m` (64 shards). On `data`, table docs
# (100,000 rows, text key) is distributed, so it carries the guard trigger.
# pgbench, 8 clients, -M prepared: each transaction updates one random
# existing row and inserts one new row (two guarded rows). The baseline is
# the same workload on the same tables with the guard disabled (ALTER TABLE
# ... DISABLE TRIGGER zz_sharding_guard). Guarded and baseline runs
# alternate; the report is the median transactions/s of `runs` runs of each
# and the cost ratio baseline_tps / guarded_tps (the issue's bound: 1.10),
# and, with less noise, the backend CPU time the guard adds per row.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. test/bench/lib.sh
bench_args test/bench/guard 8 5 "$@"

bench_cluster -c wal_level=logical -c max_replication_slots=4 -c max_wal_senders=4
psql -XqAt -v ON_ERROR_STOP=1 -c 'CREATE DATABASE coord' -c 'CREATE DATABASE data' >/dev/null
schema="CREATE EXTENSION sharding;
CREATE TABLE docs (k text PRIMARY KEY, v integer NOT NULL);
CREATE TABLE events (id bigserial PRIMARY KEY, k text NOT NULL, v integer NOT NULL);"
psql -XqAt -v ON_ERROR_STOP=1 -d data -c "$schema" >/dev/null
psql -XqAt -v ON_ERROR_STOP=1 -d coord >/dev/null <<SQL
$schema
CREATE EXTENSION dblink;
SELECT sharding.add_node('n1', 'host=$PGHOST port=$PGPORT dbname=data');
SELECT sharding.create_map('m', 64, ARRAY['n1']);
SELECT sharding.distribute('docs', 'k', 'm');
SELECT sharding.distribute('events', 'k', 'm');
SELECT sharding.attach_node('n1');
SQL
psql -XqAt -v ON_ERROR_STOP=1 -d data >/dev/null <<'SQL'
INSERT INTO docs SELECT 'k' || i, 0 FROM generate_series(1, 100000) AS i;
VACUUM ANALYZE docs;
SQL
guards=$(psql -XAt -d data -c "SELECT count(*) FROM pg_trigger WHERE tgname = 'zz_sharding_guard' AND tgenabled = 'O'")
[ "$guards" = 2 ] || { echo "expected 2 enabled guards on data, got $guards" >&2; exit 1; }

cat >"$DIR/write.sql" <<'SQL'
\set id random(1, 100000)
UPDATE docs SET v = v + 1 WHERE k = 'k' || :id;
INSERT INTO events (k, v) VALUES ('k' || :id, 1);
SQL

run() {
    pgbench -n -M prepared -c $CLIENTS -j 2 -T "$SECONDS_PER_RUN" -f "$DIR/write.sql" data 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}
guard() {
    psql -XqAt -d data -c "ALTER TABLE docs $1 TRIGGER zz_sharding_guard" -c "ALTER TABLE events $1 TRIGGER zz_sharding_guard"
}
guarded=()
plain=()
# Alternating ABBA, so that a drift of the machine's load (or of the
# tables' size) favours neither side.
for r in $(seq "$RUNS"); do
    if [ $((r % 2)) -eq 1 ]; then
        guard ENABLE; guarded+=("$(run)")
        guard DISABLE; plain+=("$(run)")
    else
        guard DISABLE; plain+=("$(run)")
        guard ENABLE; guarded+=("$(run)")
    fi
    echo "run $r: guarded ${guarded[-1]} tps, guard disabled ${plain[-1]} tps" >&2
done

# The guard's own cost per row, without pgbench and without the machine's
# scheduling noise: the backend's CPU time (utime + stime of
# /proc/<backend>/stat, 10 ms ticks) of one INSERT of 300,000 owned keys
# into events, guarded and not, alternating, median of `runs` each.
bulk_out=$(psql -XqAt -d data <<SQL
CREATE TEMP TABLE keys AS SELECT 'k' || i AS k FROM generate_series(1, 300000) AS i;
CREATE FUNCTION pg_temp.cpu() RETURNS bigint LANGUAGE sql AS \$\$
    SELECT split_part(s, ' ', 12)::bigint + split_part(s, ' ', 13)::bigint
      FROM (SELECT split_part(pg_read_file('/proc/self/stat'), ') ', 2) AS s) AS x \$\$;
CREATE TEMP TABLE res (guarded boolean, ticks bigint);
DO \$\$
DECLARE c0 bigint;
BEGIN
    FOR r IN 1 .. 2 * $RUNS LOOP
        EXECUTE format('ALTER TABLE events %s TRIGGER zz_sharding_guard', CASE WHEN r % 2 = 1 THEN 'ENABLE' ELSE 'DISABLE' END);
        TRUNCATE events;
        c0 := pg_temp.cpu();
        INSERT INTO events (k, v) SELECT k, 1 FROM keys;
        INSERT INTO res VALUES (r % 2 = 1, pg_temp.cpu() - c0);
    END LOOP;
END \$\$;
SELECT string_agg(m::text, ' ' ORDER BY guarded DESC)
  FROM (SELECT guarded, percentile_cont(0.5) WITHIN GROUP (ORDER BY ticks) AS m FROM res GROUP BY guarded) AS t;
SQL
)
guard ENABLE
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
pairs=()
for i in "${!guarded[@]}"; do pairs+=("$(awk -v g="${guarded[$i]}" -v p="${plain[$i]}" 'BEGIN { printf "%.4f", p / g }')"); done
g=$(median "${guarded[@]}")
p=$(median "${plain[@]}")
echo "guarded writes (UPDATE + INSERT per transaction, $CLIENTS clients, ${SECONDS_PER_RUN} s x $RUNS runs, median):"
echo "  guard enabled:  $g tps"
echo "  guard disabled: $p tps"
awk -v g="$g" -v p="$p" 'BEGIN { printf "  cost ratio (disabled tps / guarded tps): %.3f (bound 1.10)\n", p / g }'
echo "  median of the per-run ratios (each run's pair measured back to back): $(median "${pairs[@]}")"
read -r bg bp <<<"$bulk_out"
echo "backend CPU time of one INSERT of 300,000 rows (median of $RUNS): guarded $((${bg%.*} * 10)) ms, guard disabled $((${bp%.*} * 10)) ms"
awk -v g="$bg" -v p="$bp" 'BEGIN { printf "  ratio %.3f; the guard costs %.2f us of CPU per row\n", g / p, (g - p) * 10000 / 300000 }'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
