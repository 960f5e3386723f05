#!/usr/bin/env bash
# Online moves (contract section 8: move_shard_online, isolate): TAP.
# Run by test/run.sh, or alone:
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/multinode/move.sh
#
# Topology: two instances with wal_level = logical. Instance i1 holds the
# coordinator (database coord) and data nodes n1 and n3 (databases n1, n3);
# instance i2 holds data node n2. Map `bank` has 8 logical shards over n1 and
# n2; n3 owns none (dedicated capacity for a whale). Two co-located
# distributed tables, accounts and events (tenant text, id bigint primary
# key, val text). Every data node follows the coordinator (attach_node), so
# guards refuse what a node does not own.
#
# 1. A move under load: four writers on the coordinator insert, update and
#    delete rows of both tables through dblink on the node that node_for
#    names, retrying when refused (55000), and log every operation that
#    committed. Meanwhile a shard of n1 moves to n2. Afterwards every node
#    holds exactly what the log implies, the source none of the shard's rows,
#    the epoch rose by one, and no replication object of the move is left.
# 2. A cancelled move (pg_cancel_backend while it copies) and a failure
#    injected at the cutover (the switch on the coordinator raises): nothing
#    changes, nothing is left, then a retry succeeds.
# 3. isolate moves a whale's rows to n3.
# 4. Refusals: same owner, no DSN, a node that does not follow, bad input.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/multinode/lib.sh

if [ -z "${SHARDING_TESTDIR:-}" ]; then
    build_and_install || bail "build and install"
fi

mn_start i1 i2
ok_rc $? "two PostgreSQL instances with wal_level = logical on 127.0.0.1 (ports ${PORT[i1]}, ${PORT[i2]})"
[ "$failures" -eq 0 ] || { echo "1..$n"; exit 1; }

declare -A HOST=([coord]=i1 [n1]=i1 [n3]=i1 [n2]=i2)
ndsn() { echo "host=127.0.0.1 port=${PORT[${HOST[$1]}]} dbname=$1 user=postgres"; }
qn() { local n=$1; shift; q "${HOST[$n]}" "$n" "$@"; }

# ------------------------------------------------------------------ setup
TABLES="CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
        CREATE TABLE events (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
        CREATE INDEX ON accounts (tenant); CREATE INDEX ON events (tenant);"
setup_ok=0
for node in coord n1 n2 n3; do
    q "${HOST[$node]}" postgres -c "CREATE DATABASE $node" >/dev/null &&
        qn "$node" -c 'CREATE EXTENSION sharding' -c 'CREATE EXTENSION dblink' -c "$TABLES" >/dev/null &&
        setup_ok=$((setup_ok + 1))
done
check "coordinator and three data nodes with sharding, dblink and the two tables" 4 "$setup_ok"

diag "$(elapsed) s: map and followers"
out=$(qn coord 2>&1 <<SQL
SELECT sharding.create_map('bank', 8, ARRAY['n1', 'n2']);
SELECT sharding.add_node('n1', '$(ndsn n1)'), sharding.add_node('n2', '$(ndsn n2)'),
       sharding.add_node('n3', '$(ndsn n3)');
SELECT sharding.distribute('accounts', 'tenant', 'bank'), sharding.distribute('events', 'tenant', 'bank');
SELECT sharding.attach_node('n1');
SELECT sharding.attach_node('n2');
SELECT sharding.attach_node('n3');
SQL
)
check "map bank over n1 and n2, both tables distributed, n1 n2 n3 attached" "" "$(echo "$out" | grep -v '^|*$')"

# 64 tenants and a whale; 20,000 rows per table to start with, placed by
# node_for on each node (which follows the map); the whale has 3,000 + 1,000.
GEN="SELECT 't' || lpad((i % 64)::text, 2, '0') AS tenant, i::bigint AS id, 'initial-' || i AS val
       FROM generate_series(1, 20000) AS i
     UNION ALL SELECT 'whale', 100000 + i, 'initial-' || (100000 + i) FROM generate_series(1, 3000) AS i"
GEN_EV="SELECT 't' || lpad((i % 64)::text, 2, '0') AS tenant, i::bigint AS id, 'initial-' || i AS val
       FROM generate_series(1, 20000) AS i
     UNION ALL SELECT 'whale', 100000 + i, 'initial-' || (100000 + i) FROM generate_series(1, 1000) AS i"
diag "$(elapsed) s: initial rows"
for node in n1 n2; do
    qn "$node" -c "INSERT INTO accounts SELECT * FROM ($GEN) AS g WHERE sharding.node_for('bank', g.tenant) = sharding.this_node()" \
            -c "INSERT INTO events SELECT * FROM ($GEN_EV) AS g WHERE sharding.node_for('bank', g.tenant) = sharding.this_node()" >/dev/null
done
check "44,000 rows loaded where node_for places them" "44000" \
    "$(( $(qn n1 -c 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)') + \
         $(qn n2 -c 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)') ))"

# The coordinator keeps the log and runs the writers.
diag "$(elapsed) s: writers"
qn coord >/dev/null <<SQL
CREATE TABLE oplog (seq bigserial PRIMARY KEY, writer integer NOT NULL, tbl text NOT NULL, id bigint NOT NULL,
                    tenant text NOT NULL, op text NOT NULL, val text, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE writer_stats (writer integer PRIMARY KEY, committed integer, refused integer, anomalies text[]);
CREATE TABLE stop_flag (stop boolean NOT NULL);
INSERT INTO stop_flag VALUES (false);
INSERT INTO oplog (writer, tbl, id, tenant, op, val) SELECT 0, 'accounts', id, tenant, 'insert', val FROM ($GEN) AS g;
INSERT INTO oplog (writer, tbl, id, tenant, op, val) SELECT 0, 'events', id, tenant, 'insert', val FROM ($GEN_EV) AS g;

-- One writer: random inserts, updates and deletes on both tables, each an
-- autocommit statement on the node node_for names (through dblink). A
-- refusal (55000: not the owner, or frozen) is retried after re-routing.
-- Writer w owns the ids congruent to w mod 4 (initial ones included), so
-- its log is in commit order for every row it touches. 'hot' tenants (of
-- the shard that moves) get 60% of the operations.
CREATE PROCEDURE writer(w integer, hot text[], tenants text[], max_ops integer) LANGUAGE plpgsql AS \$\$
DECLARE
    t_name text; op text; r record; dest text; conn text; sql text; tag text; v text;
    next_id bigint := w * 10000000;
    committed integer := 0; refused integer := 0; anomalies text[] := '{}';
    done boolean;
BEGIN
    CREATE TEMP TABLE live ON COMMIT PRESERVE ROWS AS
        SELECT tbl, id, tenant FROM oplog WHERE writer = 0 AND id % 4 = w - 1 AND tenant <> 'whale';
    COMMIT;
    FOR i IN 1 .. max_ops LOOP
        EXIT WHEN (SELECT stop FROM stop_flag);
        t_name := CASE WHEN random() < 0.5 THEN 'accounts' ELSE 'events' END;
        r := NULL;
        IF random() >= 0.4 THEN
            SELECT l.tbl AS f1, l.id AS f2, l.tenant AS f3 INTO r FROM live l WHERE l.tbl = t_name
             ORDER BY (l.tenant = ANY (hot)) AND random() < 0.6 DESC, random() LIMIT 1;
            op := CASE WHEN random() < 0.7 THEN 'update' ELSE 'delete' END;
        END IF;
        IF r IS NULL THEN
            next_id := next_id + 1;
            SELECT t_name AS f1, next_id AS f2,
                   CASE WHEN random() < 0.6 THEN hot[1 + floor(random() * cardinality(hot))::int]
                        ELSE tenants[1 + floor(random() * cardinality(tenants))::int] END AS f3 INTO r;
            op := 'insert';
        END IF;
        v := format('w%s-op%s', w, i);
        sql := CASE op
            WHEN 'insert' THEN format('INSERT INTO %I VALUES (%L, %s, %L)', r.f1, r.f3, r.f2, v)
            WHEN 'update' THEN format('UPDATE %I SET val = %L WHERE id = %s', r.f1, v, r.f2)
            ELSE format('DELETE FROM %I WHERE id = %s', r.f1, r.f2) END;
        LOOP
            dest := sharding.node_for('bank', r.f3::text);
            conn := format('w%s_%s', w, dest);
            IF NOT conn = ANY (coalesce(public.dblink_get_connections(), '{}')) THEN
                PERFORM public.dblink_connect(conn, (SELECT n.dsn FROM sharding.nodes n WHERE n.node = dest));
            END IF;
            BEGIN
                tag := public.dblink_exec(conn, sql);
                done := true;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                done := false;
            END;
            EXIT WHEN done;
            refused := refused + 1;
            IF refused > 20000 THEN
                RAISE EXCEPTION 'writer % gave up after % refusals', w, refused;
            END IF;
            COMMIT;   -- see the map change
            PERFORM pg_sleep(0.002);
        END LOOP;
        v := CASE op WHEN 'insert' THEN 'INSERT 0 1' WHEN 'update' THEN 'UPDATE 1' ELSE 'DELETE 1' END;
        IF tag <> v THEN
            anomalies := anomalies || format('%s %s %s on %s: %s', op, r.f1, r.f2, dest, tag);
        END IF;
        INSERT INTO oplog (writer, tbl, id, tenant, op, val) VALUES (w, r.f1, r.f2, r.f3, op, format('w%s-op%s', w, i));
        IF op = 'insert' THEN
            INSERT INTO live VALUES (r.f1, r.f2, r.f3);
        ELSIF op = 'delete' THEN
            DELETE FROM live l WHERE l.tbl = r.f1 AND l.id = r.f2;
        END IF;
        committed := committed + 1;
        COMMIT;
        PERFORM pg_sleep(0.002);
    END LOOP;
    INSERT INTO writer_stats VALUES (w, committed, refused, anomalies);
END \$\$;

-- What the log implies: the last operation of every row that was not a delete.
CREATE VIEW expected AS
SELECT tbl, id, tenant, val FROM (
    SELECT DISTINCT ON (tbl, id) tbl, id, tenant, op, val FROM oplog ORDER BY tbl, id, seq DESC) AS last
 WHERE op <> 'delete';
SQL

# digest NODE FILTER: count and md5 of both tables' rows matching FILTER.
digest() {
    qn "$1" -c "SELECT count(*) || ':' || coalesce(md5(string_agg(r, ',' ORDER BY r)), '-') FROM (
                  SELECT 'accounts|' || id || '|' || tenant || '|' || val AS r FROM accounts WHERE $2
                  UNION ALL SELECT 'events|' || id || '|' || tenant || '|' || val FROM events WHERE $2) AS x"
}
expected_digest() {
    qn coord -c "SELECT count(*) || ':' || coalesce(md5(string_agg(r, ',' ORDER BY r)), '-') FROM (
                  SELECT tbl || '|' || id || '|' || tenant || '|' || val AS r FROM expected WHERE $1) AS x"
}
# leftovers: replication objects, filter triggers, frozen shards, journal rows of moves.
leftovers() {
    local n out=""
    for n in n1 n2 n3; do
        out+="$n:$(qn "$n" -c "SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
            || '/' || (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%')
            || '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
            || '/' || (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'sharding_move%')
            || '/' || (SELECT count(*) FROM sharding.frozen_shards)") "
    done
    echo "${out}coord:$(qn coord -c 'SELECT count(*) FROM sharding.moves')"
}
CLEAN="n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0"

# ------------------------------------------------------------------ 1. move under load
diag "$(elapsed) s: move under load"
S=$(qn coord -c "SELECT s.logical FROM sharding.shards s WHERE s.map = 'bank' AND s.node = 'n1'
                  AND s.logical <> sharding.logical_shard('bank', 'whale'::text) ORDER BY s.logical LIMIT 1")
HOT=$(qn coord -c "SELECT array_agg(t) FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) x
                    WHERE sharding.logical_shard('bank', t) = $S")
ALL=$(qn coord -c "SELECT array_agg('t' || lpad(i::text, 2, '0')) FROM generate_series(0, 63) i")
epoch0=$(qn coord -c "SELECT sharding.epoch('bank', $S)")
in_s="sharding.logical_shard('bank', tenant) = $S"
rows_s=$(digest n1 "$in_s")
diag "shard $S (tenants $HOT) holds ${rows_s%%:*} rows on n1 at epoch $epoch0"

wpids=()
for w in 1 2 3 4; do
    qn coord -c "CALL writer($w, '$HOT', '$ALL', 100000)" >"$ROOT/writer$w.out" 2>&1 &
    wpids+=($!)
    MN_BACKGROUND+=($!)
done
sleep 1.5
t0=$(date +%s%N)
move_out=$(PGOPTIONS='-c client_min_messages=debug1' qn coord -c "SELECT sharding.move_shard_online('bank', $S, 'n2')" 2>&1)
move_ms=$((($(date +%s%N) - t0) / 1000000))
epoch1=$(echo "$move_out" | grep -v '^DEBUG' | tail -1)
sleep 1.5
qn coord -c 'UPDATE stop_flag SET stop = true'
wfail=0
for p in "${wpids[@]}"; do wait "$p" || wfail=$((wfail + 1)); done
check "four writers ran to the end without error" "0" "$wfail$(cat "$ROOT"/writer*.out | grep -v '^$' | head -3)"
echo "$move_out" | grep -E 'DEBUG:  move sharding_move' | sed 's/^DEBUG:  /# /'
frozen_at=$(echo "$move_out" | sed -n 's/.*: frozen at \(.*\)$/\1/p')
thawed_at=$(echo "$move_out" | sed -n 's/.*: destination follows at \(.*\)$/\1/p')
window_ms=$(qn coord -c "SELECT round(extract(epoch FROM '$thawed_at'::timestamptz - '$frozen_at'::timestamptz) * 1000)")
check "move_shard_online returned the epoch raised by exactly one (${move_ms} ms; writes refused for ${window_ms} ms)" \
    "$((epoch0 + 1))" "$epoch1"
check "the coordinator names n2 as the owner at that epoch" "n2|$((epoch0 + 1))" \
    "$(qn coord -c "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S")"
check "every follower shows the switch" "n2|$((epoch0 + 1)) n2|$((epoch0 + 1)) n2|$((epoch0 + 1))" \
    "$(for n in n1 n2 n3; do printf '%s ' "$(qn "$n" -c "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S")"; done | sed 's/ $//')"
stats=$(qn coord -c "SELECT sum(committed) || '|' || sum(refused) || '|' || coalesce(sum(cardinality(anomalies)), 0) FROM writer_stats")
before_after=$(qn coord -c "SELECT count(*) FILTER (WHERE at < '$frozen_at') || '|' || count(*) FILTER (WHERE at > '$thawed_at')
                             FROM oplog WHERE writer > 0 AND sharding.logical_shard('bank', tenant) = $S")
diag "writers committed ${stats%%|*} operations, ${before_after%|*} on shard $S before the freeze and ${before_after#*|} after the thaw; refusals retried: $(echo "$stats" | cut -d'|' -f2)"
check "writers committed operations on the moving shard both before and after the cutover" "yes" \
    "$([ "${before_after%|*}" -gt 0 ] && [ "${before_after#*|}" -gt 0 ] && echo yes || echo "no ($before_after)")"
check "every update and delete found its row on the node node_for named (no lost row)" "0" \
    "$(echo "$stats" | cut -d'|' -f3)$(qn coord -c "SELECT ' ' || string_agg(a, '; ') FROM writer_stats, unnest(anomalies) a")"
check "the destination holds exactly what the log implies for shard $S (nothing lost, resurrected or stale)" \
    "$(expected_digest "$in_s")" "$(digest n2 "$in_s")"
check "the source holds none of shard $S's rows" "0:-" "$(digest n1 "$in_s")"
check "every other row is where the log says: n1" "$(expected_digest "sharding.node_for('bank', tenant) = 'n1'")" "$(digest n1 true)"
check "every other row is where the log says: n2" "$(expected_digest "sharding.node_for('bank', tenant) = 'n2'")" "$(digest n2 true)"
check "no publication, subscription, slot, filter trigger, frozen shard or journal row is left" "$CLEAN" "$(leftovers)"
check "only the configuration slots remain (all at the coordinator's instance)" "sharding_config_n1,sharding_config_n2,sharding_config_n3|" \
    "$(q i1 postgres -c "SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM pg_replication_slots")|$(q i2 postgres -c "SELECT coalesce(string_agg(slot_name, ','), '') FROM pg_replication_slots")"

# ------------------------------------------------------------------ 2. cancel and failure
diag "$(elapsed) s: a cancelled move"
S2=$(qn coord -c "SELECT s.logical FROM sharding.shards s WHERE s.map = 'bank' AND s.node = 'n1'
                   AND s.logical <> sharding.logical_shard('bank', 'whale'::text) ORDER BY s.logical LIMIT 1")
in_s2="sharding.logical_shard('bank', tenant) = $S2"
epoch2=$(qn coord -c "SELECT sharding.epoch('bank', $S2)")
sum_before=$(qn n1 -c "SELECT (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'accounts'))
                          || ' ' || (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'events'))")
# A session on the destination holds a lock that stops the copy's INSERT.
qn n2 -c "BEGIN; LOCK TABLE accounts IN SHARE MODE; SELECT pg_sleep(3); COMMIT;" >/dev/null 2>&1 &
locker=$!
MN_BACKGROUND+=($locker)
sleep 0.3
qn coord -c "SET application_name = 'mover'; SELECT sharding.move_shard_online('bank', $S2, 'n2')" >"$ROOT/cancel.out" 2>&1 &
mover=$!
MN_BACKGROUND+=($mover)
state=$(mn_wait i1 coord "SELECT state FROM sharding.moves WHERE map = 'bank' AND logical = $S2" copying 20)
sleep 0.3
qn coord -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'mover'" >/dev/null
wait "$mover"
kill "$locker" 2>/dev/null
wait "$locker" 2>/dev/null
check "a move cancelled while it copies (journal reached 'copying' after $state ms) fails with 57014" \
    "57014" "$(grep -o 'canceling statement due to user request' "$ROOT/cancel.out" >/dev/null && echo 57014 || cat "$ROOT/cancel.out")"
check "after the cancel: owner and epoch unchanged" "n1|$epoch2" \
    "$(qn coord -c "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S2")"
check "after the cancel: the source's rows are unchanged (shard_checksum of both tables)" "$sum_before" \
    "$(qn n1 -c "SELECT (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'accounts'))
                   || ' ' || (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'events'))")"
check "after the cancel: the destination holds none of the shard's rows" "0:-" "$(digest n2 "$in_s2")"
check "after the cancel: nothing of the move is left on any node" "$CLEAN" "$(leftovers)"
hot2=$(qn coord -c "SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) x
                     WHERE sharding.logical_shard('bank', t) = $S2 LIMIT 1")
check "after the cancel: the source still accepts writes to the shard" "inserted" \
    "$(qn n1 -c "INSERT INTO accounts VALUES ('$hot2', 900001, 'after cancel') RETURNING 'inserted'" 2>&1)"
sum_before=$(qn n1 -c "SELECT (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'accounts'))
                          || ' ' || (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'events'))")

diag "$(elapsed) s: a failure at the cutover"
qn coord >/dev/null <<'SQL'
CREATE FUNCTION inject_failure() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'injected failure at the switch' USING ERRCODE = 'P0001';
END $$;
CREATE TRIGGER inject_failure BEFORE UPDATE ON sharding.shards FOR EACH ROW EXECUTE FUNCTION inject_failure();
SQL
fail_out=$(PGOPTIONS='-c client_min_messages=debug1' qn coord -c "SELECT sharding.move_shard_online('bank', $S2, 'n2')" 2>&1)
check "a failure injected at the switch (after the freeze and the catch-up) fails the move" "yes" \
    "$(echo "$fail_out" | grep -q 'ERROR:  injected failure at the switch' && echo "$fail_out" | grep -q ': caught up at' && echo yes || echo "$fail_out")"
qn coord -c 'DROP TRIGGER inject_failure ON sharding.shards' >/dev/null
check "after the failure: owner and epoch unchanged" "n1|$epoch2" \
    "$(qn coord -c "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S2")"
check "after the failure: the source's rows are unchanged and the destination holds none" "$sum_before 0:-" \
    "$(qn n1 -c "SELECT (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'accounts'))
                   || ' ' || (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'events'))") $(digest n2 "$in_s2")"
check "after the failure: nothing of the move is left, the source is not frozen" "$CLEAN" "$(leftovers)"
check "after the failure: the source still accepts writes to the shard" "inserted" \
    "$(qn n1 -c "INSERT INTO accounts VALUES ('$hot2', 900002, 'after failure') RETURNING 'inserted'" 2>&1)"
sum_before=$(qn n1 -c "SELECT (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'accounts'))
                          || ' ' || (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'events'))")

check "the retry succeeds: epoch $((epoch2 + 1))" "$((epoch2 + 1))" \
    "$(qn coord -c "SELECT sharding.move_shard_online('bank', $S2, 'n2')" 2>&1)"
check "after the retry: the destination's shard_checksum equals the source's before" "$sum_before" \
    "$(qn n2 -c "SELECT (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'accounts'))
                   || ' ' || (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S2, 'events'))")"
check "after the retry: the source holds none of the shard, nothing is left" "0:- $CLEAN" "$(digest n1 "$in_s2") $(leftovers)"

# A crash of the coordinator mid-move leaves a journal row and the move's
# objects: simulated by a journal row in state 'copying' plus a publication
# and a slot at the source; the next call cleans them up first.
diag "$(elapsed) s: leftovers of a crashed move"
S3=$(qn coord -c "SELECT s.logical FROM sharding.shards s WHERE s.map = 'bank' AND s.node = 'n1' ORDER BY s.logical LIMIT 1")
epoch3=$(qn coord -c "SELECT sharding.epoch('bank', $S3)")
name3=$(qn coord -c "SELECT sharding._move_name('bank', $S3)")
qn n1 -c "CREATE PUBLICATION $name3 FOR TABLE accounts" -c "SELECT pg_create_logical_replication_slot('$name3', 'pgoutput')" \
      -c "SELECT sharding._freeze_shard('bank', $S3)" >/dev/null
qn coord -c "INSERT INTO sharding.move_journal (map, logical, source, destination, phase) VALUES ('bank', $S3, 'n1', 'n2', 'copying')"
check "a same-owner call returns the current epoch and cleans up the leftovers of a crashed move" "$epoch3 $CLEAN" \
    "$(qn coord -c "SELECT sharding.move_shard_online('bank', $S3, 'n1')") $(leftovers)"

# The same after the switch: journal state 'switched', the old source n1
# still frozen and holding stale rows of shard $S (owned by n2 since test 1),
# its publication and slot still there. The next call finishes the move.
name1=$(qn coord -c "SELECT sharding._move_name('bank', $S)")
n2_before=$(digest n2 "$in_s")
epoch_s=$(qn coord -c "SELECT sharding.epoch('bank', $S)")
qn n1 -c "SET session_replication_role = replica" \
      -c "INSERT INTO accounts SELECT tenant, 50000000 + row_number() OVER (), 'stale' FROM (SELECT unnest('$HOT'::text[]) AS tenant) t, generate_series(1, 5)" \
      -c "CREATE PUBLICATION $name1 FOR TABLE accounts" -c "SELECT pg_create_logical_replication_slot('$name1', 'pgoutput')" \
      -c "SELECT sharding._freeze_shard('bank', $S)" >/dev/null
qn coord -c "INSERT INTO sharding.move_journal (map, logical, source, destination, phase) VALUES ('bank', $S, 'n1', 'n2', 'cleanup')"
check "leftovers of a switched move in place: stale rows, a frozen shard, publication and slot at n1" \
    "$(( $(echo "$HOT" | tr ',' '\n' | wc -l) * 5 ))|1|1|1" \
    "$(qn n1 -c "SELECT (SELECT count(*) FROM accounts WHERE $in_s) || '|' || (SELECT count(*) FROM sharding.frozen_shards)
                   || '|' || (SELECT count(*) FROM pg_publication WHERE pubname = '$name1') || '|' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$name1')")"
check "a crashed move that had switched: the next call finishes it (stale rows at the old source deleted, nothing left)" \
    "$epoch_s 0:- $n2_before $CLEAN" \
    "$(qn coord -c "SELECT sharding.move_shard_online('bank', $S, 'n2')") $(digest n1 "$in_s") $(digest n2 "$in_s") $(leftovers)"

# ------------------------------------------------------------------ 3. isolate
diag "$(elapsed) s: isolate"
wsrc=$(qn coord -c "SELECT sharding.node_for('bank', 'whale'::text)")
whale_rows="tenant = 'whale'"
whale_before=$(digest "$wsrc" "$whale_rows")
moved=$(qn coord -c "SELECT sharding.isolate('bank', 'whale', 'n3')" 2>&1)
check "isolate moves the whale's 4,000 rows from $wsrc to n3 and says so" "4000" "$moved"
check "the whale is pinned to n3 on the coordinator and on every follower" "n3 n3 n3 n3" \
    "$(for n in coord n1 n2 n3; do printf '%s ' "$(qn "$n" -c "SELECT sharding.node_for('bank', 'whale'::text)")"; done | sed 's/ $//')"
check "after isolate: n3 holds the whale's rows as $wsrc held them (same digest), $wsrc none of them" "$whale_before 0:-" \
    "$(digest n3 "$whale_rows") $(digest "$wsrc" "$whale_rows")"
check "n3 holds nothing but the whale" "4000" "$(qn n3 -c 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)')"
check "after isolate: nothing is left" "$CLEAN" "$(leftovers)"
check "n3 accepts the whale's writes, $wsrc refuses them (55000)" "inserted|55000" \
    "$(qn n3 -c "INSERT INTO accounts VALUES ('whale', 990001, 'on n3') RETURNING 'inserted'" 2>&1)|$(qn "$wsrc" -c "\\set VERBOSITY sqlstate" -c "INSERT INTO accounts VALUES ('whale', 990002, 'stray')" 2>&1 | grep -o '55000')"

# ------------------------------------------------------------------ 4. refusals
sqlstate() { qn coord -c '\set VERBOSITY sqlstate' -c "$1" 2>&1 | grep -oE '[0-9A-Z]{5}' | tail -1; }
own=$(qn coord -c "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 1")
check "a move to the current owner is a no-op returning the epoch" \
    "$(qn coord -c "SELECT epoch FROM sharding.shards WHERE map = 'bank' AND logical = 1")" \
    "$(qn coord -c "SELECT sharding.move_shard_online('bank', 1, '$own')")"
check "a node without a DSN: 55000" "55000" "$(sqlstate "SELECT sharding.move_shard_online('bank', 1, 'nowhere')")"
qn coord -c "SELECT sharding.add_node('n9', 'host=127.0.0.1 port=${PORT[i1]} dbname=postgres user=postgres')" >/dev/null
check "a node that does not follow this coordinator: 55000" "55000" \
    "$(sqlstate "SELECT sharding.move_shard_online('bank', 1, 'n9')")"
check "unknown map 42704, bad shard 22023, NULL node 22023, NULL key 22023" "42704 22023 22023 22023" \
    "$(sqlstate "SELECT sharding.move_shard_online('nomap', 1, 'n2')") $(sqlstate "SELECT sharding.move_shard_online('bank', 8, 'n2')") $(sqlstate "SELECT sharding.move_shard_online('bank', 1, NULL)") $(sqlstate "SELECT sharding.isolate('bank', NULL, 'n2')")"
# A source whose wal_level is not logical: an instance of its own (i3),
# attached, owning an empty shard.
DIR[i3]=$ROOT/i3
PORT[i3]=$(free_port)
MN_NODES+=(i3)
if (SHARDING_PORT=${PORT[i3]} start_cluster "${DIR[i3]}" -c listen_addresses=127.0.0.1 -c wal_level=replica) >/dev/null 2>&1; then
    HOST[n4]=i3
    q i3 postgres -c 'CREATE DATABASE n4' >/dev/null
    qn n4 -c 'CREATE EXTENSION sharding' -c 'CREATE EXTENSION dblink' -c "$TABLES" >/dev/null
    qn coord -c "SELECT sharding.add_node('n4', '$(ndsn n4)')" -c "SELECT sharding.attach_node('n4')" \
             -c "SELECT sharding._switch_owner('bank', 7, 'n4')" >/dev/null 2>&1
    check "a source whose wal_level is not logical: 55000, and nothing changes" "55000 n4|$(qn coord -c "SELECT epoch FROM sharding.shards WHERE map = 'bank' AND logical = 7")" \
        "$(sqlstate "SELECT sharding.move_shard_online('bank', 7, 'n2')") $(qn coord -c "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = 7")"
else
    not_ok "a third instance with wal_level = replica started"
fi
check "the refused calls changed nothing and left nothing" "$CLEAN" "$(leftovers)"

# ------------------------------------------------------------------ 5. copy_shard (kept, inserts only)
# Pins hold a bytea key in hex; a source whose bytea_output is 'escape' must
# still see the pinned key as pinned.
diag "$(elapsed) s: copy_shard"
for node in coord n1 n3; do qn "$node" -c 'CREATE TABLE blobs (k bytea PRIMARY KEY, v text)' >/dev/null; done
qn n1 -c "INSERT INTO blobs SELECT decode(lpad(to_hex(i), 4, '0'), 'hex'), 'b' || i FROM generate_series(1, 400) i" \
      -c 'ALTER DATABASE n1 SET bytea_output = escape' >/dev/null
pinned_blob=$(qn coord -c "SELECT '\\x' || encode(k, 'hex') FROM (SELECT decode(lpad(to_hex(i), 4, '0'), 'hex') AS k
                             FROM generate_series(1, 400) i) x WHERE sharding.logical_shard('bank', k) = 0 LIMIT 1")
qn coord -c "SELECT sharding.pin('bank', '$pinned_blob', 'n3')" >/dev/null
in_shard0=$(qn n1 -c "SELECT count(*) FROM blobs WHERE sharding.shard_of(k, 8) = 0")
check "copy_shard skips a pinned bytea key even where bytea_output = escape ($((in_shard0 - 1)) of $in_shard0 rows)" \
    "$((in_shard0 - 1))|0" \
    "$(qn coord -c "SELECT sharding.copy_shard('bank', 0, 'blobs', 'k', '$(ndsn n1)', '$(ndsn n3)')")|$(qn n3 -c "SELECT count(*) FROM blobs WHERE '\\x' || encode(k, 'hex') = '$pinned_blob'")"

# ------------------------------------------------------------------ 6. the README's example
# The "sql node=NAME" blocks of README section "Moving a shard", on this
# harness's coordinator and data nodes (n1 and n2 have DSNs and follow).
diag "$(elapsed) s: README, Moving a shard"
awk '/^### Moving a shard/ { p = 1 } p && /^##/ && !/^### Moving a shard/ { exit } p' README.md >"$ROOT/moving.md"
readme_out=$(python3 test/lib/readme_examples.py nodes "$ROOT/moving.md" \
    "coord=$(ndsn coord)" "n1=$(ndsn n1)" "n2=$(ndsn n2)" 2>&1)
readme_rc=$?
echo "$readme_out" | grep -E '^(not ok|#)' | sed 's/^/#   /'
if [ "$readme_rc" -ne 0 ]; then
    diag "n1: $(qn n1 -c "SELECT string_agg(tgname || '/' || tgenabled, ',') FROM pg_trigger WHERE tgrelid = 'entries'::regclass") $(qn n1 -c "SELECT string_agg(logical || '=' || node || '/' || epoch, ',') FROM sharding.shards WHERE map = 'ledger'") $(qn n1 -c "SELECT string_agg(id::text, ',') FROM entries WHERE id > 20000")"
fi
check "README 'Moving a shard': every multi-node example runs as written ($(echo "$readme_out" | grep -c '^ok') checks)" \
    "0|0" "$readme_rc|$(echo "$readme_out" | grep -c '^not ok')"

mn_finish
