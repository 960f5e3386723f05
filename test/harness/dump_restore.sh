#!/usr/bin/env bash
# Dump and restore of a database that uses every feature (issue 9): pg_dump of
# the source restored with psql into a new database keeps maps, epochs, pins,
# node DSNs, configuration versions, rank guards (their triggers still
# guarding), queues with their settings, and shard-aligned partitions.
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=sharding_dump_all_src
DST=sharding_dump_all_dst
for db in $SRC $DST; do dropdb --if-exists $db 2>/dev/null; createdb $db || exit 1; done
trap 'dropdb --if-exists $SRC 2>/dev/null; dropdb --if-exists $DST 2>/dev/null' EXIT

psql -XqAtd $SRC -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || { echo "1..1"; echo "not ok 1 - setup"; exit 1; }
CREATE EXTENSION sharding;
SELECT sharding.create_map('docs', 64, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT count(*) FROM sharding.rebalance('docs', ARRAY['n1', 'n2', 'n3', 'n4', 'n5']);
SELECT sharding.move_shard('docs', 3, 'n9');
SELECT sharding.pin('docs', 'ws_enterprise_42', 'dedicated');
SELECT sharding.pin('docs', '7', 'small');
SELECT sharding.add_node(n, 'host=' || n || '.example dbname=docs') FROM unnest(ARRAY['n1','n2','n3','n4','n5','n9','dedicated','small']) AS n;
-- rank guards: text ranks (skip) and enum order (error)
CREATE TYPE order_state AS ENUM ('preparing', 'shipped', 'delivered');
CREATE TABLE orders (id bigint PRIMARY KEY, status text, state order_state);
INSERT INTO orders SELECT i, 'preparing', 'preparing' FROM generate_series(1, 10) AS i;
SELECT sharding.guard_rank('orders', 'status', ARRAY['preparing', 'shipped', 'delivered']);
SELECT sharding.guard_rank('orders', 'state', NULL, 'error');
UPDATE orders SET status = 'delivered', state = 'delivered' WHERE id <= 5;
-- a queue with settings and jobs in every state
SELECT sharding.create_queue('jobs');
SELECT sharding.set_max_attempts('jobs', 3);
INSERT INTO jobs (key, payload) SELECT 'k' || i, jsonb_build_object('i', i) FROM generate_series(1, 30) AS i;
SELECT count(*) FROM sharding.claim(NULL::jobs, 'w1', 10);
SELECT sharding.complete('jobs', ARRAY(SELECT id FROM jobs WHERE owner = 'w1' ORDER BY id LIMIT 5), 'w1');
-- partitions aligned with shard_of
CREATE TABLE events (workspace text, body text) PARTITION BY HASH (workspace sharding.text_shard_ops);
SELECT sharding.create_partitions('events', 8);
INSERT INTO events SELECT 'ws-' || i, 'b' FROM generate_series(1, 500) AS i;
SQL

dumpfile=$(mktemp)
pg_dump -d $SRC >"$dumpfile" || { echo "1..1"; echo "not ok 1 - pg_dump"; exit 1; }
restore_errors=$(psql -Xqd $DST -f "$dumpfile" 2>&1 >/dev/null | grep -c ERROR)
rm -f "$dumpfile"

echo "1..14"
n=0
fail=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi; }
same() {  # same DESCRIPTION QUERY: identical, non-empty output in both databases
    local a b
    a=$(psql -XAtd $SRC -c "$2" 2>&1)
    b=$(psql -XAtd $DST -c "$2" 2>&1)
    [ -n "$a" ] && [ "$a" = "$b" ]
    ok $? "$1"
    [ -n "$a" ] && [ "$a" = "$b" ] || diff <(echo "$a") <(echo "$b") | head -6 | sed 's/^/#   /'
}

ok "$restore_errors" "the dump restores without errors ($restore_errors)"
same "maps" "SELECT map, logical_shards FROM sharding.maps ORDER BY 1"
same "shard owners and epochs" "SELECT map, logical, node, epoch FROM sharding.shards ORDER BY 1, 2"
same "pins" "SELECT map, key, node FROM sharding.pins ORDER BY 1, 2"
same "node DSNs" "SELECT node, dsn FROM sharding.nodes ORDER BY 1"
same "cluster_version and partitions" "SELECT sharding.cluster_version('docs'), (SELECT string_agg(p, ',') FROM sharding.cluster_partitions('docs') p)"
same "routing of 2,000 keys, pins included" "SELECT md5(string_agg(sharding.node_for('docs', k), ',' ORDER BY k)) FROM (SELECT 'ws-' || i AS k FROM generate_series(1, 2000) i UNION ALL SELECT 'ws_enterprise_42' UNION ALL SELECT '7') t"
same "rank guard registry" "SELECT schema_name, table_name, column_name FROM sharding.rank_guards ORDER BY 1, 2, 3"
same "queue rows and settings" "SELECT (SELECT string_agg(id || status || coalesce(owner, '-') || attempts, ',' ORDER BY id) FROM jobs), (SELECT string_agg(max_attempts::text, ',') FROM sharding.queue_settings)"
same "partition contents align with shard_of" "SELECT count(*), count(*) FILTER (WHERE tableoid::regclass::text = 'events_' || sharding.shard_of(workspace, 8)) FROM events"

# Behaviour in the restored database.
out=$(psql -XAtd $DST -c "UPDATE orders SET status = 'shipped' WHERE id = 1" 2>&1)
[ "$out" = "UPDATE 0" ] && [ "$(psql -XAtd $DST -c "SELECT status FROM orders WHERE id = 1")" = "delivered" ]
ok $? "restored text guard still skips a regression (UPDATE 0, status stays delivered)"
out=$(psql -XAtd $DST -c "UPDATE orders SET state = 'shipped' WHERE id = 2" 2>&1)
echo "$out" | grep -q 'ERROR' && [ "$(psql -XAtd $DST -c "SELECT state FROM orders WHERE id = 2")" = "delivered" ]
ok $? "restored enum guard still raises on a regression"
got=$(psql -XAtd $DST -c "SELECT count(*) FROM sharding.claim(NULL::jobs, 'w2', 100)")
[ "$got" = "20" ]
ok $? "restored queue: claim takes the 20 pending jobs (got $got)"
got=$(psql -XAtd $DST -c "SELECT sharding.fence('docs', 3, 2)" 2>&1; psql -XAtd $DST -c "SELECT sharding.epoch('docs', 3)")
echo "$got" | tail -1 | grep -qx '2'
ok $? "restored epochs fence as before"
exit $fail
