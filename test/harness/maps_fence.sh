#!/usr/bin/env bash
# fence against move_shard and rebalance, with two sessions: a move waits for
# the fenced writer to commit (a heavyweight lock wait, visible in
# pg_stat_activity and pg_locks), the writer presenting the old epoch
# afterwards is refused with 55000, and a writer without UPDATE privilege on
# the config tables can fence.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/session.sh
export PGDATABASE=sharding_maps_fence
dropdb --if-exists "$PGDATABASE" 2>/dev/null; createdb "$PGDATABASE" || exit 1
trap 'sess_stop W; sess_stop M; sess_stop W2; dropdb --if-exists "$PGDATABASE"; psql -XqAtd postgres -c "DROP ROLE IF EXISTS fence_writer"; rm -rf "$SESS_DIR"' EXIT
PGOPTIONS='-c client_min_messages=warning' psql -XqAt -v ON_ERROR_STOP=1 -c "CREATE EXTENSION sharding" \
    -c "DROP ROLE IF EXISTS fence_writer" -c "CREATE ROLE fence_writer LOGIN" \
    -c "SELECT sharding.create_map('m', 16, ARRAY['a', 'b'])" \
    -c "CREATE TABLE items (id int, owner text)" -c "GRANT INSERT, SELECT ON items TO fence_writer" >/dev/null || exit 1

echo "1..14"
# The writer is a plain role: no UPDATE privilege on sharding.shards.
PGUSER=fence_writer sess_start W
PGUSER=fence_writer sess_start W2
sess_start M
mpid=$(sess_run M "SELECT pg_backend_pid()")

# Waits (up to 10 s) until backend $1 waits on a heavyweight lock.
waiting_on_lock() {
    local i
    for i in $(seq 1 100); do
        [ "$(psql -XAtc "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")" = "Lock" ] && return 0
        sleep 0.1
    done
    return 1
}

tap_is "$(sess_run W "SELECT has_table_privilege('sharding.shards', 'UPDATE')")" "f" \
    "the writer has no UPDATE privilege on sharding.shards"
tap_is "$(sess_run W "BEGIN; SELECT sharding.fence('m', 3, 1); INSERT INTO items VALUES (1, 'a')")" "" \
    "the writer fences shard 3 at epoch 1 and writes"

# A second writer on the same shard is not blocked (share locks).
tap_is "$(sess_run W2 "BEGIN; SELECT sharding.fence('m', 3, 1); ROLLBACK")" "" \
    "a second writer fences the same shard without waiting"

sess_send M "SELECT sharding.move_shard('m', 3, 'c')"
waiting_on_lock "$mpid"
tap_ok $? "move_shard waits on a heavyweight lock while the writer is open"
tap_is "$(psql -XAtc "SELECT mode || ' ' || granted FROM pg_locks WHERE pid = $mpid AND NOT granted")" \
    "ExclusiveLock false" "pg_locks shows the move's ungranted ExclusiveLock"
tap_is "$(psql -XAtc "SELECT node || ' ' || epoch FROM sharding.shards WHERE map = 'm' AND logical = 3")" \
    "a 1" "the shard has not moved while the writer is open"

sess_run W "COMMIT" >/dev/null
tap_is "$(sess_recv M)" "2" "the move completes once the writer commits, returning epoch 2"

tap_is "$(sess_run W "BEGIN; SELECT sharding.fence('m', 3, 1)")" "ERROR:  55000" \
    "the writer presenting the old epoch is refused with 55000"
sess_run W "ROLLBACK" >/dev/null
tap_is "$(sess_run W "SELECT sharding.node_for('m', 'x') IS NOT NULL, sharding.epoch('m', 3)")" "t|2" \
    "the writer re-reads the epoch (2)"

# The other order: a move in progress holds writers back; once it commits
# the waiting fence re-reads the epoch and refuses.
sess_run M "BEGIN; SELECT sharding.move_shard('m', 3, 'd')" >/dev/null
wpid=$(sess_run W "SELECT pg_backend_pid()")
sess_send W "BEGIN; SELECT sharding.fence('m', 3, 2)"
waiting_on_lock "$wpid"
tap_ok $? "a fence waits while a move of its shard is uncommitted"
sess_run M "COMMIT" >/dev/null
tap_is "$(sess_recv W)" "ERROR:  55000" "after the move commits, the waiting fence sees epoch 3 and refuses"
sess_run W "ROLLBACK" >/dev/null

# Fencing another shard does not block a move (per-shard locks).
sess_run W "BEGIN; SELECT sharding.fence('m', 9, 1)" >/dev/null
tap_is "$(sess_run M "SELECT sharding.move_shard('m', 4, 'c')" 10)" "2" \
    "a move of shard 4 does not wait for a writer fenced on shard 9"

# rebalance waits for every fenced writer of the map.
sess_send M "SELECT count(*) FROM sharding.rebalance('m', ARRAY['a', 'b', 'c', 'd', 'e'])"
waiting_on_lock "$mpid"
tap_ok $? "rebalance waits for a writer fenced on the map"
sess_run W "COMMIT" >/dev/null
moved=$(sess_recv M)
[ -n "$moved" ] && [ "$moved" -gt 0 ] 2>/dev/null
tap_ok $? "rebalance completes after the writer commits ($moved moves)"
exit $((TAP_FAILED > 0))
