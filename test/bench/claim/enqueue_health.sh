#!/usr/bin/env bash
# Benchmark (not a test): enqueue_many and queue_health (docs/queue.md).
#  - enqueue_many of 100,000 jobs vs one INSERT ... SELECT of the same rows
#    into an identical create_queue table (same indexes, same wakeup
#    trigger); goal: at most 1.2x.
#  - queue_health on a table with 1,000,000 done rows and 1,000 pending
#    (and 100 processing); goal: under 10 ms, never scanning the done rows.
# Interleaved runs, medians, in one cluster.
#
#   SHARDING_PGROOT=/tmp/pgroot-mine bash test/bench/claim/enqueue_health.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/../../.."
. test/bench/lib.sh
RUNS=${1:-5}
bench_setup
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE EXTENSION IF NOT EXISTS sharding;
DROP TABLE IF EXISTS eq_ours, eq_base, health, keys;
SELECT sharding.create_queue('eq_ours');
SELECT sharding.create_queue('eq_base');
SELECT sharding.create_queue('health');
CREATE TABLE keys AS SELECT array_agg('tenant-' || g) AS k FROM generate_series(1, 100000) g;
INSERT INTO health (key, status, owner, attempts, claim_expires, created)
SELECT 'd' || g, 'done', 'w', 1, now() - interval '1 day', now() - interval '2 days' FROM generate_series(1, 1000000) g;
INSERT INTO health (key) SELECT 'p' || g FROM generate_series(1, 1000) g;
UPDATE health SET status = 'processing', owner = 'w', claim_expires = now() + interval '5 minutes'
 WHERE id IN (SELECT id FROM health WHERE status = 'pending' LIMIT 100);
VACUUM ANALYZE health;
SQL

ours=() base=() health=()
for _ in $(seq 1 "$RUNS"); do
    psql -XqAtc "TRUNCATE eq_ours, eq_base; CHECKPOINT" >/dev/null
    ours+=("$(time_ms "SELECT cardinality(sharding.enqueue_many('eq_ours', (SELECT k FROM keys)))")")
    base+=("$(time_ms "INSERT INTO eq_base (key) SELECT unnest((SELECT k FROM keys))")")
done
# queue_health as a monitor calls it: repeatedly on one connection (the
# first call of a new backend also pays for loading the library and its
# catalog caches: reported apart).
first=$(time_ms "SELECT * FROM sharding.queue_health('health')")
calls=()
for _ in $(seq 0 "$RUNS"); do calls+=(-c "SELECT * FROM sharding.queue_health('health')"); done
mapfile -t health < <(psql -Xq -c 'SET jit = off' -c '\timing on' "${calls[@]}" |
    sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -n "$RUNS")
mo=$(printf '%s\n' "${ours[@]}" | median)
mb=$(printf '%s\n' "${base[@]}" | median)
mh=$(printf '%s\n' "${health[@]}" | median)
echo "# median of $RUNS runs; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "enqueue_many 100,000 jobs: ${mo} ms (runs: ${ours[*]}); INSERT ... SELECT: ${mb} ms (runs: ${base[*]}); ratio $(python3 -c "print(f'{$mo / $mb:.2f}')")"
echo "queue_health, 1,000,000 done + 1,000 pending: ${mh} ms on a warm connection (runs: ${health[*]}); first call of a new connection: ${first} ms"
psql -XqAtc "SELECT pending, processing, expired FROM sharding.queue_health('health')" | sed 's/^/# pending|processing|expired: /'
