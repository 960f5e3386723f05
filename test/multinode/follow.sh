#!/usr/bin/env bash
# Followers and guarded data nodes (contract section 8), on three live
# PostgreSQL instances. Emits TAP; run by test/run.sh, or alone:
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/multinode/follow.sh
#
# Topology: instance i1 holds the coordinator (database `coord`) and data
# node n1 (database `data`); i2 and i3 hold data nodes n2 and n3. Map `m`
# has 8 logical shards over n1..n3; tables `docs` (text key) and `items`
# (bigint key) are distributed by it, `plain` is not.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/multinode/lib.sh

if [ -z "${SHARDING_TESTDIR:-}" ]; then
    build_and_install || bail "build and install"
fi

mn_start i1 i2 i3
check "three PostgreSQL instances (wal_level = logical) on 127.0.0.1" 0 $?
[ "$fails" -eq 0 ] || bail "instances did not start"
declare -A INST=([n1]=i1 [n2]=i2 [n3]=i3)
NODES=(n1 n2 n3)
# d NODE [psql args]: the node's database; c [psql args]: the coordinator.
d() { local n=$1; shift; q "${INST[$n]}" data "$@"; }
c() { q i1 coord "$@"; }

node_schema=$(cat <<'SQL'
CREATE EXTENSION sharding;
CREATE TABLE docs (k text PRIMARY KEY, v integer);
CREATE TABLE items (k bigint PRIMARY KEY, v integer);
CREATE TABLE spare (k text PRIMARY KEY);
CREATE TABLE plain (k text, v integer);
-- A writer function: guarded writes cover what functions write too.
CREATE FUNCTION put_doc(key text, val integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO docs VALUES (key, val);
END $$;
-- SQLSTATE of a statement ('' if it succeeds).
CREATE FUNCTION sqlstate_of(query text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE query;
    RETURN '';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
SQL
)
setup=0
for n in "${NODES[@]}"; do
    q "${INST[$n]}" postgres -c 'CREATE DATABASE data' >/dev/null && d "$n" -c "$node_schema" >/dev/null &&
        setup=$((setup + 1))
done
q i1 postgres -c 'CREATE DATABASE coord' >/dev/null
q i1 postgres -c "ALTER DATABASE coord SET sharding.coordinator_dsn = 'host=127.0.0.1 port=${PORT[i1]} dbname=coord'" >/dev/null
c -c "$node_schema" -c 'CREATE EXTENSION dblink' >/dev/null && setup=$((setup + 1))
check "coordinator and three data nodes created" 4 "$setup"

# n3 had a configuration of its own before it is attached: map m at a
# version above the coordinator's, which must never fall there.
d n3 >/dev/null <<'SQL'
SELECT sharding.create_map('m', 2, ARRAY['n3']);
SELECT sharding.pin('m', 'k' || i, 'n3') FROM generate_series(1, 20) AS i;
SELECT sharding.create_map('local_only', 2, ARRAY['n3']);
SQL
n3_version_before=$(d n3 -c "SELECT sharding.cluster_version('m')")

conf=$(c 2>&1 <<SQL
SELECT sharding.add_node('n1', '${DSN[i1]}'), sharding.add_node('n2', '${DSN[i2]}'),
       sharding.add_node('n3', '${DSN[i3]}'), sharding.add_node('spare', 'host=127.0.0.1 port=1 dbname=none');
SELECT sharding.create_map('m', 8, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.distribute('docs', 'k', 'm');
SELECT sharding.distribute('items', 'k', 'm');
SQL
)
check "coordinator: nodes, map m, docs and items distributed" "" "$(echo "$conf" | grep -v '^|*$')"

# ---------------------------------------------------------------- attach
t0=$(date +%s%N)
attached=0
for n in "${NODES[@]}"; do c -c "SELECT sharding.attach_node('$n')" >/dev/null && attached=$((attached + 1)); done
attach_ms=$((($(date +%s%N) - t0) / 1000000))
check "attach_node n1, n2, n3 (${attach_ms} ms for the three)" 3 "$attached"
digest='SELECT md5(string_agg(format($$%s/%s/%s/%s$$, map, logical, node, epoch), $$,$$ ORDER BY map, logical))
          || (SELECT count(*) FROM sharding.nodes) || (SELECT count(*) FROM sharding.distributed_tables)
          || (SELECT count(*) FROM sharding.pins) FROM sharding.shards'
home=$(c -c "$digest")
for n in "${NODES[@]}"; do
    check "$n: a full copy of the coordinator's configuration, this_node() = $n" "$home|$n" \
        "$(d "$n" -c "$digest")|$(d "$n" -c 'SELECT sharding.this_node()')"
done
check "n3's own map local_only is gone (the coordinator's configuration replaced it)" 0 \
    "$(d n3 -c "SELECT count(*) FROM sharding.maps WHERE map = 'local_only'")"
n3_version_after=$(d n3 -c "SELECT sharding.cluster_version('m')")
check "cluster_version('m') did not fall on n3 when it started following ($n3_version_before -> $n3_version_after)" 1 \
    "$([ "$n3_version_after" -ge "$n3_version_before" ] && echo 1 || echo 0)"
check "this_node() is NULL on the coordinator, which was never attached" "" "$(c -c 'SELECT sharding.this_node()')"
check "repeating attach_node is harmless (one subscription, one slot)" "|1|1" \
    "$(c -c "SELECT sharding.attach_node('n2')")|$(d n2 -c "SELECT count(*) FROM pg_subscription WHERE subname = 'sharding_config_n2'")|$(c -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'sharding_config_n2'")"
check "attach_node of a node without DSN: 55000; NULL: 22023" "55000|22023" \
    "$(c -c "SELECT sqlstate_of(\$\$SELECT sharding.attach_node('ghost')\$\$) || '|' || sqlstate_of(\$\$SELECT sharding.attach_node(NULL)\$\$)")"
check "every data node guards docs and items, not plain" "n1=2 n2=2 n3=2" \
    "$(for n in "${NODES[@]}"; do printf '%s=%s ' "$n" "$(d "$n" -c "SELECT count(*) FROM pg_trigger WHERE tgname = 'zz_sharding_guard'")"; done | sed 's/ $//')"

# ---------------------------------------------------------------- following
# A change on the coordinator reaches every follower: the lag is the time
# until node_for (a pin) and epoch (a move) answer the new way there.
c -c "SELECT sharding.pin('m', 'probe', 'n3')" >/dev/null
pin_lags=
seen=0
for n in "${NODES[@]}"; do
    lag=$(mn_wait "${INST[$n]}" data "SELECT sharding.node_for('m', 'probe')" n3 30) && seen=$((seen + 1))
    pin_lags="$pin_lags $n=${lag}ms"
done
check "a pin on the coordinator is seen by node_for on every follower (lag:$pin_lags)" 3 "$seen"
c -c "SELECT sharding._switch_owner('m', 0, 'n2')" >/dev/null
move_lags=
seen=0
for n in "${NODES[@]}"; do
    lag=$(mn_wait "${INST[$n]}" data "SELECT sharding.epoch('m', 0) || '/' || sharding.shards_of('m', 'n2')::text" "2/{0,3,4,5}" 30) &&
        seen=$((seen + 1))
    move_lags="$move_lags $n=${lag}ms"
done
check "a move on the coordinator is seen by epoch and shards_of on every follower (lag:$move_lags)" 3 "$seen"
check "cluster_version is the coordinator's on every follower" "$(c -c "SELECT sharding.cluster_version('m')")x3" \
    "$(for n in "${NODES[@]}"; do d "$n" -c "SELECT sharding.cluster_version('m')"; done | sort -u)x$(for n in "${NODES[@]}"; do d "$n" -c "SELECT sharding.cluster_version('m')"; done | wc -l)"

# The same backend of a follower sees a replicated change at its next
# statement (its routing cache is invalidated by the apply).
key0=$(c -c "SELECT k FROM (SELECT 'w' || i AS k FROM generate_series(1, 1000) AS i) AS t
             WHERE sharding.logical_shard('m', k) = 0 ORDER BY k LIMIT 1")
q i2 data >"$ROOT/session.out" 2>&1 <<SQL &
SELECT 'before:' || sharding.node_for('m', '$key0');
SELECT pg_sleep(2);
SELECT 'after:' || sharding.node_for('m', '$key0');
SQL
session_pid=$!
MN_BACKGROUND+=("$session_pid")
sleep 0.5
c -c "SELECT sharding._switch_owner('m', 0, 'n1')" >/dev/null
wait "$session_pid"
check "a running session on n2 routes by the moved shard at its next statement" "before:n2 after:n1" \
    "$(grep -E '^(before|after):' "$ROOT/session.out" | paste -sd' ')"

# A node that is down while the configuration changes catches up on restart.
mn_stop i3
c >/dev/null <<'SQL'
SELECT sharding._switch_owner('m', 1, 'n3');
SELECT sharding.pin('m', 'while-down', 'n1');
SELECT sharding.unpin('m', 'probe');
SQL
mn_restart i3
lag=$(mn_wait i3 data "SELECT sharding.epoch('m', 1) || '/' || sharding.node_for('m', 'while-down') || '/' || sharding.node_for('m', 'probe')" \
    "2/n1/$(c -c "SELECT sharding.node_for('m', 'probe')")" 60)
check "n3, stopped during three changes, has all of them after its restart (${lag} ms after start)" 0 $?
check "n3's cluster_version caught up too" "$(c -c "SELECT sharding.cluster_version('m')")" \
    "$(d n3 -c "SELECT sharding.cluster_version('m')")"

# ---------------------------------------------------------------- followers refuse changes
refused=$(d n2 <<'SQL'
SELECT string_agg(s, ' ') FROM (VALUES
  (sqlstate_of($$SELECT sharding.create_map('x', 2, ARRAY['n2'])$$)),
  (sqlstate_of($$SELECT sharding.drop_map('m')$$)),
  (sqlstate_of($$SELECT sharding.pin('m', 'a', 'n2')$$)),
  (sqlstate_of($$SELECT sharding.unpin('m', 'while-down')$$)),
  (sqlstate_of($$SELECT sharding.move_shard('m', 2, 'n3')$$)),
  (sqlstate_of($$SELECT * FROM sharding.rebalance('m', ARRAY['n1', 'n2'])$$)),
  (sqlstate_of($$SELECT sharding.add_node('n9', 'dbname=x')$$)),
  (sqlstate_of($$SELECT sharding.drop_node('spare')$$)),
  (sqlstate_of($$SELECT sharding.distribute('spare', 'k', 'm')$$)),
  (sqlstate_of($$SELECT sharding.undistribute('docs')$$)),
  (sqlstate_of($$INSERT INTO sharding.maps VALUES ('y', 1)$$)),
  (sqlstate_of($$UPDATE sharding.shards SET epoch = epoch + 1$$)),
  (sqlstate_of($$DELETE FROM sharding.pins$$)),
  (sqlstate_of($$TRUNCATE sharding.map_versions CASCADE$$))) AS t(s)
SQL
)
check "a follower refuses create_map, drop_map, pin, unpin, move_shard, rebalance, add_node, drop_node, distribute, undistribute and direct writes (55000)" \
    "55000 55000 55000 55000 55000 55000 55000 55000 55000 55000 55000 55000 55000 55000" "$refused"
home_now=$(c -c "$digest")
check "... with a hint to change it on the coordinator, and nothing changed there" "1|$home_now" \
    "$(d n2 -c "SELECT sharding.pin('m', 'a', 'n2')" 2>&1 | grep -c 'HINT:  Make the change on the coordinator')|$(d n2 -c "$digest")"

# ---------------------------------------------------------------- guarded writes
# Keys by owner (as the coordinator routes them now), and the int8 keys.
keys_of() { c -c "SELECT string_agg(k, ' ') FROM (SELECT k FROM (SELECT 'key-' || i AS k FROM generate_series(1, 400) AS i) AS t
                   WHERE sharding.node_for('m', k) = '$1' ORDER BY k LIMIT $2) AS s"; }
read -r own1 own2 own3 own4 own5 <<<"$(keys_of n2 5)"
read -r foreign1 foreign2 <<<"$(keys_of n1 2)"
int_own=$(c -c "SELECT min(i) FROM generate_series(1, 400) AS i WHERE sharding.node_for('m', i::bigint) = 'n2'")
int_foreign=$(c -c "SELECT min(i) FROM generate_series(1, 400) AS i WHERE sharding.node_for('m', i::bigint) = 'n3'")
# A row n2 does not own, as a faulty load might have left it (replica role
# writes past the guard, as replication apply does).
d n2 -c "SET session_replication_role = replica; INSERT INTO docs VALUES ('$foreign2', 0)" >/dev/null

guard() { d n2 -c "SELECT sqlstate_of(\$q\$$1\$q\$)"; }
check "n2 refuses INSERT of a key n1 owns (55000)" 55000 "$(guard "INSERT INTO docs VALUES ('$foreign1', 1)")"
check "n2 refuses UPDATE of a row whose key n1 owns (55000)" 55000 "$(guard "UPDATE docs SET v = 9 WHERE k = '$foreign2'")"
check "n2 refuses DELETE of a row whose key n1 owns (55000)" 55000 "$(guard "DELETE FROM docs WHERE k = '$foreign2'")"
# copy_state NODE ROWS: the SQLSTATE of COPY docs FROM STDIN ('' if it passes).
copy_state() { printf "$2" | d "$1" -v VERBOSITY=verbose -c 'COPY docs FROM STDIN' 2>&1 | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p'; }
check "n2 refuses COPY of a key n1 owns (55000)" 55000 "$(copy_state n2 "$own1\t1\n$foreign1\t1\n")"
check "n2 refuses a write from inside a function (55000)" 55000 "$(guard "SELECT put_doc('$foreign1', 1)")"
check "n2 refuses an UPDATE moving an owned key to n1's (55000)" "|55000" \
    "$(guard "INSERT INTO docs VALUES ('$own1', 1)")|$(guard "UPDATE docs SET k = '$foreign1' WHERE k = '$own1'")"
check "n2 refuses a bigint key n3 owns, on items (55000)" 55000 "$(guard "INSERT INTO items VALUES ($int_foreign, 1)")"
check "the refusal names map, key and owner" 1 \
    "$(d n2 -c "INSERT INTO docs VALUES ('$foreign1', 1)" 2>&1 | grep -c "key \"$foreign1\" of map \"m\" belongs to node \"n1\", not to this node \"n2\"")"
check "nothing of the refused writes reached docs or items on n2" "2|0|0|0" \
    "$(d n2 -c "SELECT count(*) || '|' || min(v) FILTER (WHERE k = '$foreign2') || '|' || count(*) FILTER (WHERE k = '$foreign1') FROM docs")|$(d n2 -c 'SELECT count(*) FROM items')"
owned=$(d n2 <<SQL
SELECT string_agg(s, ',') FROM (VALUES
  (sqlstate_of(\$\$INSERT INTO docs VALUES ('$own2', 1)\$\$)),
  (sqlstate_of(\$\$UPDATE docs SET v = 2 WHERE k = '$own2'\$\$)),
  (sqlstate_of(\$\$UPDATE docs SET k = '$own3' WHERE k = '$own2'\$\$)),
  (sqlstate_of(\$\$DELETE FROM docs WHERE k = '$own3'\$\$)),
  (sqlstate_of(\$\$SELECT put_doc('$own4', 4)\$\$)),
  (sqlstate_of(\$\$INSERT INTO items VALUES ($int_own, 1)\$\$)),
  (sqlstate_of(\$\$INSERT INTO plain VALUES ('$foreign1', 1)\$\$)),
  (sqlstate_of(\$\$UPDATE plain SET v = 2\$\$)),
  (sqlstate_of(\$\$DELETE FROM plain\$\$))) AS t(s)
SQL
)
check "owned keys pass: INSERT, UPDATE, key-changing UPDATE, DELETE, function; a bigint key; plain is unaffected" ",,,,,,,," "$owned"
check "COPY of owned keys passes" "|1" "$(copy_state n2 "$own5\t5\n")|$(d n2 -c "SELECT count(*) FROM docs WHERE k = '$own5'")"

# A pin sends a key elsewhere: n1 now owns own1 on every node.
c -c "SELECT sharding.pin('m', '$own4', 'n1')" >/dev/null
mn_wait i2 data "SELECT sharding.node_for('m', '$own4')" n1 30 >/dev/null
mn_wait i1 data "SELECT sharding.node_for('m', '$own4')" n1 30 >/dev/null
check "after the coordinator pins a key to n1, n2 refuses it and n1 takes it" "55000|" \
    "$(guard "UPDATE docs SET v = 5 WHERE k = '$own4'")|$(d n1 -c "SELECT sqlstate_of(\$\$INSERT INTO docs VALUES ('$own4', 5)\$\$)")"

# A frozen shard refuses its owned keys too, on this node only, until thawed.
s5=$(c -c "SELECT sharding.logical_shard('m', '$own5')")
frozen_key=$(c -c "SELECT k FROM (SELECT 'g' || i AS k FROM generate_series(1, 400) AS i) AS t
                   WHERE sharding.logical_shard('m', k) = $s5 AND sharding.node_for('m', k) = 'n2' LIMIT 1")
d n2 -c "SELECT sharding._freeze_shard('m', $s5)" >/dev/null
check "frozen shard $s5 on n2: INSERT, UPDATE, DELETE and COPY of its owned keys get 55000; plain is unaffected" \
    "55000 55000 55000 55000 " \
    "$(guard "INSERT INTO docs SELECT k, 1 FROM (SELECT 'f' || i AS k FROM generate_series(1, 400) AS i) AS t
               WHERE sharding.logical_shard('m', k) = $s5 AND sharding.node_for('m', k) = 'n2' LIMIT 1") $(guard "UPDATE docs SET v = 6 WHERE k = '$own5'") $(guard "DELETE FROM docs WHERE k = '$own5'") $(copy_state n2 "$frozen_key\t1\n") $(guard "INSERT INTO plain VALUES ('$own5', 1)")"
check "the frozen refusal says so" 1 \
    "$(d n2 -c "UPDATE docs SET v = 6 WHERE k = '$own5'" 2>&1 | grep -c "is in logical shard $s5, which is frozen on node \"n2\"")"
check "_thaw_shard: true, then writes pass again; false the second time" "t||f" \
    "$(d n2 -c "SELECT sharding._thaw_shard('m', $s5)")|$(guard "UPDATE docs SET v = 7 WHERE k = '$own5'")|$(d n2 -c "SELECT sharding._thaw_shard('m', $s5)")"

# _freeze_shard waits for a guarded writer holding the shard's share lock.
q i2 data >"$ROOT/holder.out" 2>&1 <<SQL &
BEGIN;
UPDATE docs SET v = 8 WHERE k = '$own5';
SELECT pg_sleep(1);
COMMIT;
SQL
holder=$!
MN_BACKGROUND+=("$holder")
for _ in $(seq 100); do
    [ "$(d n2 -c "SELECT count(*) FROM pg_stat_activity WHERE datname = 'data' AND wait_event = 'PgSleep'")" = 1 ] && break
    sleep 0.05
done
t0=$(date +%s%N)
d n2 -c "SELECT sharding._freeze_shard('m', $s5)" >/dev/null
waited=$((($(date +%s%N) - t0) / 1000000))
wait "$holder"
check "_freeze_shard waited for the writer holding the share lock (${waited} ms), whose update committed" "1|8" \
    "$([ "$waited" -ge 400 ] && echo 1 || echo 0)|$(d n2 -c "SELECT v FROM docs WHERE k = '$own5'")"
d n2 -c "SELECT sharding._thaw_shard('m', $s5)" >/dev/null

# ---------------------------------------------------------------- guards follow distribute
# A table distributed on the coordinator is guarded on a node where it
# exists; a distributed table created on the node later is guarded at once;
# undistributing removes the guard.
d n2 -c "CREATE TABLE early (k text PRIMARY KEY)" >/dev/null
c -c "CREATE TABLE early (k text PRIMARY KEY); CREATE TABLE late (k uuid PRIMARY KEY)" \
  -c "SELECT sharding.distribute('early', 'k', 'm'), sharding.distribute('late', 'k', 'm')" >/dev/null
lag=$(mn_wait i2 data "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'early'::regclass AND tgname = 'zz_sharding_guard'" 1 30)
check "distribute on the coordinator guards the table on the node (${lag} ms)" 0 $?
mn_wait i2 data "SELECT count(*) FROM sharding.distributed_tables WHERE table_name = 'late'" 1 30 >/dev/null
d n2 -c "CREATE TABLE late (k uuid PRIMARY KEY)" >/dev/null
uuid_foreign=$(c -c "SELECT u FROM (SELECT md5(i::text)::uuid AS u FROM generate_series(1, 100) AS i) AS t
                     WHERE sharding.node_for('m', u) <> 'n2' LIMIT 1")
check "a distributed table created on the node afterwards is guarded at once (uuid key refused: 55000)" "1|55000" \
    "$(d n2 -c "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'late'::regclass AND tgname = 'zz_sharding_guard'")|$(guard "INSERT INTO late VALUES ('$uuid_foreign')")"
c -c "SELECT sharding.undistribute('early')" >/dev/null
lag=$(mn_wait i2 data "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'early'::regclass AND tgname = 'zz_sharding_guard'" 0 30)
check "undistribute on the coordinator removes the node's guard (${lag} ms)" 0 $?

# ---------------------------------------------------------------- attach refusals
q i2 postgres -c 'CREATE DATABASE bare' >/dev/null
slots_before=$(c -c "SELECT count(*) FROM pg_replication_slots")
c >/dev/null <<SQL
SELECT sharding.add_node('self', 'host=127.0.0.1 port=${PORT[i1]} dbname=coord');
SELECT sharding.add_node('n2again', '${DSN[i2]}');
SELECT sharding.add_node('bare', 'host=127.0.0.1 port=${PORT[i2]} dbname=bare');
SQL
check "attach_node refuses the coordinator itself, a database following as another node, one without the extension (55000)" \
    "55000|55000|55000" \
    "$(c -c "SELECT sqlstate_of(\$\$SELECT sharding.attach_node('self')\$\$) || '|' || sqlstate_of(\$\$SELECT sharding.attach_node('n2again')\$\$) || '|' || sqlstate_of(\$\$SELECT sharding.attach_node('bare')\$\$)")"
check "attach_node in a transaction that has already written: 25001 (the node's slot would wait for it)" 25001 \
    "$(c -c "BEGIN; INSERT INTO plain VALUES ('x', 1); SELECT sqlstate_of(\$\$SELECT sharding.attach_node('n2')\$\$); ROLLBACK" | head -1)"
check "... leaving no slot behind, and n2 following as n2" "$slots_before|n2|true" \
    "$(c -c "SELECT count(*) FROM pg_replication_slots")|$(d n2 -c 'SELECT node || $$|$$ || following FROM sharding.local_node')"

# ---------------------------------------------------------------- shard_checksum
# The same rows of one logical shard on n2 and n3 (copied past the guard, in
# another order) give the same checksum; one changed value changes it.
d n2 -c "SET session_replication_role = replica;
         INSERT INTO docs SELECT k, length(k) FROM (SELECT 'sum-' || i AS k FROM generate_series(1, 300) AS i) AS t
          WHERE sharding.logical_shard('m', k) = $s5 ORDER BY k" >/dev/null
rows2=$(d n2 -c "SELECT string_agg(format('(%L,%s)', k, coalesce(v::text, 'NULL')), ',' ORDER BY k DESC) FROM docs
                  WHERE sharding.logical_shard('m', k) = $s5")
d n3 -c "SET session_replication_role = replica; DELETE FROM docs; INSERT INTO docs VALUES $rows2" >/dev/null
sum2=$(d n2 -c "SELECT rows || '/' || checksum FROM sharding.shard_checksum('m', $s5, 'docs')")
sum3=$(d n3 -c "SELECT rows || '/' || checksum FROM sharding.shard_checksum('m', $s5, 'docs')")
check "shard_checksum: the same rows on n2 and n3 give the same result ($sum2)" "$sum2" "$sum3"
d n3 -c "SET session_replication_role = replica; UPDATE docs SET v = v + 1 WHERE k = (SELECT min(k) FROM docs)" >/dev/null
sum3b=$(d n3 -c "SELECT rows || '/' || checksum FROM sharding.shard_checksum('m', $s5, 'docs')")
check "one changed value changes the checksum, not the row count" "${sum2%%/*}|1" \
    "${sum3b%%/*}|$([ "$sum3b" != "$sum2" ] && echo 1 || echo 0)"
pinned_in_s5=$(c -c "SELECT k FROM (SELECT 'pin-' || i AS k FROM generate_series(1, 400) AS i) AS t
                     WHERE sharding.logical_shard('m', k) = $s5 LIMIT 1")
c -c "SELECT sharding.pin('m', '$pinned_in_s5', 'n3')" >/dev/null
mn_wait i2 data "SELECT sharding.node_for('m', '$pinned_in_s5')" n3 30 >/dev/null
d n2 -c "SET session_replication_role = replica; INSERT INTO docs VALUES ('$pinned_in_s5', 1)" >/dev/null
check "a pinned key's row is not part of its logical shard's checksum" "$sum2" \
    "$(d n2 -c "SELECT rows || '/' || checksum FROM sharding.shard_checksum('m', $s5, 'docs')")"

# ---------------------------------------------------------------- detach
v_before=$(d n3 -c "SELECT sharding.cluster_version('m')")
check "detach_node('n3')" "" "$(c -c "SELECT sharding.detach_node('n3')")"
check "n3: no subscription; the coordinator: no slot for it; this_node() still n3; guards gone" "0|0|n3|0" \
    "$(d n3 -c 'SELECT count(*) FROM pg_subscription')|$(c -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'sharding_config_n3'")|$(d n3 -c 'SELECT sharding.this_node()')|$(d n3 -c "SELECT count(*) FROM pg_trigger WHERE tgname = 'zz_sharding_guard'")"
check "n3 keeps its copy, editable again (pin, create_map), and writes any key" "|||$home_now" \
    "$(d n3 -c "SELECT sqlstate_of(\$\$SELECT sharding.pin('m', 'mine', 'n3')\$\$)")|$(d n3 -c "SELECT sqlstate_of(\$\$SELECT sharding.create_map('n3map', 2, ARRAY['n3'])\$\$)")|$(d n3 -c "SELECT sqlstate_of(\$\$INSERT INTO docs VALUES ('$foreign1', 1)\$\$)")|$home_now"
v_local=$(d n3 -c "SELECT sharding.cluster_version('m')")
check "cluster_version on the detached n3 rises above the copied one ($v_before -> $v_local)" 1 \
    "$([ "$v_local" -gt "$v_before" ] && echo 1 || echo 0)"
c -c "SELECT sharding._switch_owner('m', 2, 'n3')" >/dev/null
sleep 0.5
check "a detached node no longer sees the coordinator's changes" 1 "$(d n3 -c "SELECT sharding.epoch('m', 2)")"
check "detach_node again is harmless" "" "$(c -c "SELECT sharding.detach_node('n3')")"
c -c "SELECT sharding.attach_node('n3')" >/dev/null
check "attached again: n3 follows (coordinator's configuration, its own map gone)" "$(c -c "$digest")|0" \
    "$(d n3 -c "$digest")|$(d n3 -c "SELECT count(*) FROM sharding.maps WHERE map = 'n3map'")"
v_again=$(d n3 -c "SELECT sharding.cluster_version('m')")
check "cluster_version never fell on n3 across detach and attach ($v_before -> $v_local -> $v_again)" 1 \
    "$([ "$v_again" -ge "$v_local" ] && echo 1 || echo 0)"
check "the coordinator holds one slot per follower, all active" "3|3" \
    "$(c -c "SELECT count(*) || '|' || count(*) FILTER (WHERE active) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_config_%'")"

mn_finish
