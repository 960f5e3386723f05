#!/usr/bin/env bash
# pg_dump | psql round trip: maps, shards with their epochs, pins, nodes and
# configuration versions survive, and the restored database routes alike.
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=sharding_maps_dump_src
DST=sharding_maps_dump_dst
for db in $SRC $DST; do dropdb --if-exists $db 2>/dev/null; createdb $db || exit 1; done
trap 'dropdb --if-exists $SRC; dropdb --if-exists $DST' EXIT

psql -XqAtd $SRC -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 1
CREATE EXTENSION sharding;
SELECT sharding.create_map('orders', 64, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT sharding.create_map('users', 10, ARRAY['u1', 'u2']);
SELECT sharding.move_shard('orders', 7, 'n9');
SELECT sharding.move_shard('orders', 7, 'n2');
SELECT count(*) FROM sharding.rebalance('orders', ARRAY['n1', 'n2', 'n3', 'n4', 'n5']);
SELECT sharding.pin('orders', 'whale-' || i, 'dedicated') FROM generate_series(1, 50) AS i;
SELECT sharding.pin('users', '42', 'vip');
UPDATE sharding.nodes SET dsn = 'host=10.0.0.1 dbname=orders' WHERE node = 'n1';
SQL

echo "1..7"
n=0
fail=0
check() {  # check DESCRIPTION QUERY: same output in both databases, not empty
    n=$((n + 1))
    local a b
    a=$(psql -XAtd $SRC -c "$2" 2>&1)
    b=$(psql -XAtd $DST -c "$2" 2>&1)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then
        echo "ok $n - $1"
    else
        echo "not ok $n - $1"
        diff <(echo "$a") <(echo "$b") | head -10 | sed 's/^/#   /'
        fail=1
    fi
}

n=$((n + 1))
if pg_dump $SRC | psql -XqAtd $DST -v ON_ERROR_STOP=1 >/dev/null 2>/tmp/maps_dump_err.$$; then
    echo "ok $n - pg_dump | psql restores without error"
else
    echo "not ok $n - pg_dump | psql restores without error"
    sed 's/^/#   /' /tmp/maps_dump_err.$$ | head -10
    fail=1
fi
rm -f /tmp/maps_dump_err.$$

check "maps are kept" "SELECT map, logical_shards, created FROM sharding.maps ORDER BY map"
check "shards, owners and epochs are kept" \
    "SELECT map, logical, node, epoch FROM sharding.shards ORDER BY map, logical"
check "pins are kept" "SELECT map, key, node FROM sharding.pins ORDER BY map, key"
check "nodes and DSNs are kept" "SELECT node, dsn FROM sharding.nodes ORDER BY node"
check "routing agrees for 3000 keys and every pin" \
    "SELECT string_agg(sharding.node_for('orders', 'whale-' || i) || sharding.node_for('users', i), ',' ORDER BY i)
       FROM generate_series(1, 3000) AS i"

# Versions survive and keep rising after the restore (sequence restored).
n=$((n + 1))
before=$(psql -XAtd $SRC -c "SELECT version FROM sharding.map_versions WHERE map = 'orders'")
# (n1 has a DSN, so 'orders' is a database map: since 1.2 n3 needs one before a move.)
after=$(psql -XAtd $DST -c "SELECT sharding.add_node('n3', 'host=10.0.0.3 dbname=orders');
                             SELECT sharding.move_shard('orders', 0, 'n3') IS NOT NULL;
                             SELECT version FROM sharding.map_versions WHERE map = 'orders'" | tail -1)
epoch=$(psql -XAtd $DST -c "SELECT sharding.epoch('orders', 7)")
if [ -n "$before" ] && [ "$after" -gt "$before" ] 2>/dev/null && [ "$epoch" = "3" ]; then
    echo "ok $n - restored versions rise on the next change ($before -> $after), epoch of shard 7 is 3"
else
    echo "not ok $n - restored versions rise on the next change ($before -> $after), epoch $epoch"
    fail=1
fi
exit $fail
