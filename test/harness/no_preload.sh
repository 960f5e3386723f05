#!/usr/bin/env bash
# Without shared_preload_libraries: routing, queues, rank guards, shard_lag
# and rebalance_by_load behave as with it; only the fan-out counters are
# absent, and fanout_stats says so in a NOTICE and shows no row.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/cluster.sh
. test/lib/session.sh
DIR=$(make_cluster_dir no-preload)
trap 'stop_cluster "$DIR"; rm -rf "$DIR" "$SESS_DIR"' EXIT
start_cluster "$DIR" -c "shared_preload_libraries=''" || { echo "not ok - cluster without preload"; exit 1; }
export PGDATABASE=postgres
q() { psql -XAtq -c "$1" 2>&1; }

echo "1..11"
tap_is "$(q 'SHOW shared_preload_libraries')" "" "the cluster preloads nothing"
psql -XqAt -v ON_ERROR_STOP=1 <<'SQL' >/dev/null || exit 1
CREATE EXTENSION sharding;
SELECT sharding.create_map('m', 8, ARRAY['a', 'b']);
CREATE TABLE orders (id bigint PRIMARY KEY, tenant text NOT NULL, status text NOT NULL);
SELECT sharding.distribute('orders', 'tenant', 'm');
INSERT INTO orders SELECT i, 't' || (i % 10), 'new' FROM generate_series(1, 100) AS i;
SQL
tap_is "$(q "SELECT sharding.node_for('m', 't1') = (SELECT node FROM sharding.shards WHERE map = 'm' AND logical = sharding.shard_of('t1', 8))")" \
    "t" "routing: node_for answers from the map"
tap_is "$(q "SELECT count(*) FROM orders WHERE tenant = 't1'")" "10" "queries on a distributed table run"
tap_is "$(psql -XAt -c 'SELECT count(*) FROM sharding.fanout_stats' 2>&1 | grep -E '^(NOTICE|HINT|[0-9])' | tr '\n' '/')" \
    "NOTICE:  fan-out counting is off: sharding is not in shared_preload_libraries/HINT:  Add 'sharding' to shared_preload_libraries in postgresql.conf and restart the server./0/" \
    "fanout_stats: a NOTICE naming shared_preload_libraries, with a hint, and no row"
tap_is "$(psql -XAt -c 'SELECT sharding.fanout_reset()' 2>&1 | head -1)" \
    "NOTICE:  fan-out counting is off: sharding is not in shared_preload_libraries" "fanout_reset: the same NOTICE, no error"

# Queue: create, enqueue, claim, complete.
psql -XqAt -v ON_ERROR_STOP=1 -c "SELECT sharding.create_queue('jobs')" \
    -c "INSERT INTO jobs (key, payload) SELECT 'k' || i, '{}' FROM generate_series(1, 5) AS i" >/dev/null
tap_is "$(q "SELECT count(*) FROM sharding.claim(NULL::jobs, 'w1', 3)")" "3" "queue: claim takes 3 jobs"
tap_is "$(q "SELECT sharding.complete('jobs', (SELECT min(id) FROM jobs WHERE status = 'processing'), 'w1')")" \
    "t" "queue: complete fences on the owner"
tap_is "$(q "SELECT sum(pending) FROM sharding.shard_lag('jobs', 4)")" "2" "shard_lag sees the 2 jobs left"

# Rank guard: a regressing update is skipped.
psql -XqAt -v ON_ERROR_STOP=1 -c "SELECT sharding.guard_rank('orders', 'status', ARRAY['new', 'paid', 'shipped'])" \
    -c "UPDATE orders SET status = 'shipped' WHERE id = 1" -c "UPDATE orders SET status = 'new' WHERE id = 1" >/dev/null
tap_is "$(q "SELECT status FROM orders WHERE id = 1")" "shipped" "rank guard: the regressing update was skipped"

# rebalance_by_load: plans and moves as with preload (on a map without
# distributed tables: with one, owner switches alone are refused).
q "SELECT sharding.undistribute('orders')" >/dev/null
tap_is "$(q "SELECT count(*) FROM sharding.rebalance_by_load('m', ARRAY['a', 'b'], ARRAY[10, 1, 1, 1, 1, 1, 1, 1]::float8[], 1.10)")" \
    "3" "rebalance_by_load moves 3 shards off the node with the heavy shard"
tap_is "$(q "SELECT string_agg(node || ':' || epoch, ',' ORDER BY logical) FROM sharding.shards WHERE map = 'm'")" \
    "a:1,b:2,b:2,b:2,b:1,b:1,b:1,b:1" "each moved shard's epoch rose"
exit $((TAP_FAILED > 0))
