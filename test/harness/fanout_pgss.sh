#!/usr/bin/env bash
# Coexistence with pg_stat_statements: a cluster preloading both libraries
# (in both orders) counts every statement in both: the hooks chain.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/cluster.sh
. test/lib/session.sh
DIR=$(make_cluster_dir fanout-pgss)
trap 'stop_cluster "$DIR/one"; stop_cluster "$DIR/two"; rm -rf "$DIR" "$SESS_DIR"' EXIT
[ "$(id -u)" -eq 0 ] && chown postgres: "$DIR"

echo "1..8"
for order in "pg_stat_statements,sharding" "sharding,pg_stat_statements"; do
    sub=$DIR/one
    [ "$order" = "sharding,pg_stat_statements" ] && sub=$DIR/two
    start_cluster "$sub" -c "shared_preload_libraries=$order" || { echo "not ok - cluster with $order"; exit 1; }
    tap_is "$(psql -XAtd postgres -c 'SHOW shared_preload_libraries')" "$order" "a cluster preloading $order"
    psql -XqAt -v ON_ERROR_STOP=1 -d postgres <<'SQL' >/dev/null || exit 1
CREATE EXTENSION pg_stat_statements;
CREATE EXTENSION sharding;
SELECT sharding.create_map('m', 8, ARRAY['a', 'b']);
CREATE TABLE events (id bigint PRIMARY KEY, tenant text NOT NULL);
SELECT sharding.distribute('events', 'tenant', 'm');
INSERT INTO events SELECT i, 't' || (i % 10) FROM generate_series(1, 100) AS i;
SELECT sharding.fanout_reset();
SELECT pg_stat_statements_reset();
SQL
    psql -XqAt -d postgres >/dev/null <<'SQL'
PREPARE one(text) AS SELECT count(*) FROM events WHERE tenant = $1;
EXECUTE one('t1');
EXECUTE one('t2');
EXECUTE one('t3');
SELECT count(*) FROM events WHERE tenant LIKE 't%';
SELECT count(*) FROM events WHERE tenant LIKE 't%';
SQL
    tap_is "$(psql -XAtd postgres -c "SELECT queries || '|' || single_shard || '|' || fan_out FROM sharding.fanout_stats WHERE table_name = 'events'")" \
        "5|3|2" "$order: fanout_stats counts 3 single-shard and 2 fan-out statements"
    tap_is "$(psql -XAtd postgres -c "SELECT string_agg(calls::text, ',' ORDER BY calls) FROM pg_stat_statements WHERE query LIKE '%FROM events WHERE%'")" \
        "2,3" "$order: pg_stat_statements counts the same statements (3 and 2 calls)"
    tap_is "$(psql -XAtd postgres -c "SELECT count(*) FROM pg_stat_statements WHERE query LIKE '%fanout_stats%'")" \
        "1" "$order: pg_stat_statements also sees the statements that read fanout_stats"
    stop_cluster "$sub"
done
exit $((TAP_FAILED > 0))
