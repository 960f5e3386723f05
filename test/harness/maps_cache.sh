#!/usr/bin/env bash
# Two sessions, one routing cache each: a change committed in one session is
# seen by the other's very next node_for / logical_shard call, whatever made
# the change (functions, direct writes, drop and re-create), and an
# uncommitted change is not.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/session.sh
export PGDATABASE=sharding_maps_cache
dropdb --if-exists "$PGDATABASE" 2>/dev/null; createdb "$PGDATABASE" || exit 1
trap 'sess_stop A; sess_stop B; dropdb --if-exists "$PGDATABASE"; rm -rf "$SESS_DIR"' EXIT
psql -XqAt -v ON_ERROR_STOP=1 -c "CREATE EXTENSION sharding" \
    -c "SELECT sharding.create_map('m', 64, ARRAY['n1', 'n2', 'n3', 'n4'])" >/dev/null || exit 1

echo "1..12"
sess_start A
sess_start B
# Owner of key k's logical shard, straight from the table (no cache).
owner() { psql -XAtc "SELECT node FROM sharding.shards WHERE map = 'm' AND logical = sharding.shard_of('$1', 64)"; }

apid=$(sess_run A "SELECT pg_backend_pid()")
bpid=$(sess_run B "SELECT pg_backend_pid()")
[ "$apid" != "$bpid" ] && [ -n "$apid" ]
tap_ok $? "two distinct backends ($apid, $bpid)"

# Warm A's cache.
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'whale')")" "$(owner whale)" "A routes from a warm cache"

sess_run B "SELECT sharding.pin('m', 'whale', 'dedicated')" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'whale')")" "dedicated" "A sees B's committed pin on its next call"

# Uncommitted changes stay invisible; the commit makes them visible.
sess_run B "BEGIN; SELECT sharding.unpin('m', 'whale')" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'whale')")" "dedicated" "A does not see B's uncommitted unpin"
sess_run B "COMMIT" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'whale')")" "$(owner whale)" "A sees the unpin once committed"

# A move, seen even inside A's open REPEATABLE READ transaction.
shard=$(psql -XAtc "SELECT sharding.shard_of('k7', 64)")
sess_run A "BEGIN ISOLATION LEVEL REPEATABLE READ" >/dev/null
before=$(sess_run A "SELECT sharding.node_for('m', 'k7')")
sess_run B "SELECT sharding.move_shard('m', $shard, 'moved-here')" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'k7')")" "moved-here" \
    "A sees B's move on its next statement, inside an open transaction (was $before)"
sess_run A "COMMIT" >/dev/null

# A direct write to the config table by an admin invalidates as well.
sess_run B "UPDATE sharding.shards SET node = 'n1' WHERE map = 'm' AND logical = $shard" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'k7')")" "n1" "A sees a direct UPDATE of sharding.shards"

# Rebalance onto five nodes: A agrees with the table for many keys.
sess_run B "SELECT count(*) FROM sharding.rebalance('m', ARRAY['n1', 'n2', 'n3', 'n4', 'n5'])" >/dev/null
mismatch=$(sess_run A "SELECT count(*) FROM generate_series(1, 5000) AS i
    WHERE sharding.node_for('m', i) <> (SELECT node FROM sharding.shards
                                         WHERE map = 'm' AND logical = sharding.shard_of(i, 64))")
tap_is "$mismatch" "0" "A routes 5000 keys as the rebalanced table says"

# Drop: A gets 42704; re-create with another shape: A sees the new shape.
sess_run B "SELECT sharding.drop_map('m')" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'k7')")" "ERROR:  42704" "A gets 42704 once the map is dropped"
sess_run B "SELECT sharding.create_map('m', 8, ARRAY['solo'])" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'k7') || ' ' || sharding.logical_shard('m', 'k7')")" \
    "solo $(psql -XAtc "SELECT sharding.shard_of('k7', 8)")" "A sees the re-created map's nodes and shard count"

# A rolled-back change in B never reaches A.
sess_run B "BEGIN; SELECT sharding.pin('m', 'k7', 'ghost'); ROLLBACK" >/dev/null
tap_is "$(sess_run A "SELECT sharding.node_for('m', 'k7')")" "solo" "a rolled-back pin is never seen"

# Many calls after warm-up do not re-read the tables: the cache is only
# rebuilt on invalidation (seq_scan + idx_scan counters stay put).
sess_run A "SELECT sharding.node_for('m', 'warm')" >/dev/null
reads() { psql -XAtc "SELECT sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)) FROM pg_stat_all_tables
                      WHERE schemaname = 'sharding' AND relname IN ('maps', 'shards', 'pins')"; }
sess_run A "SELECT pg_stat_force_next_flush()" >/dev/null
sleep 1.2
r0=$(reads)
sess_run A "SELECT count(sharding.node_for('m', i)) FROM generate_series(1, 20000) AS i; SELECT pg_stat_force_next_flush()" >/dev/null
sleep 1.2
r1=$(reads)
tap_is "$((r1 - r0))" "0" "20000 cached calls read the config tables 0 times"
exit $((TAP_FAILED > 0))
