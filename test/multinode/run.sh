#!/usr/bin/env bash
# Multi-node harness (contract sections 7 and 8): the shard map drives
# PL/Proxy across four live PostgreSQL instances on loopback, and every data
# node follows the map's home through logical replication. Emits TAP; exits
# non-zero on any failure. Run by test/run.sh, or alone:
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/multinode/run.sh
#
# Topology. Instances n1..n4 (test/multinode/lib.sh: wal_level = logical),
# each with a database `data` holding `documents`; n1..n3 own the 12 logical
# shards of map `docs` (4 each), n4 owns none and holds a pinned whale
# workspace. The database `proxy` on n1 is the coordinator: create_map,
# add_node, pin, distribute and move_shard happen there, and PL/Proxy routes
# from there with RUN ON sharding.partition_for(...).
#
# How the map reaches the data nodes: sharding.attach_node on the
# coordinator makes each `data` database follow it (publication
# sharding_config, one subscription per node), so every later change reaches
# every node by itself. Each node knows its own name (sharding.this_node())
# and guards the distributed table `documents`: a write of a workspace the
# node does not own is refused (55000), so the data-node writer
# (insert_document) names no node. test/multinode/follow.sh proves the
# following and the guards in detail; this harness proves PL/Proxy on top.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/multinode/lib.sh

# Alone, build and install first; test/run.sh has done it already.
if [ -z "${SHARDING_TESTDIR:-}" ]; then
    build_and_install || bail "build and install"
fi

NODES=(n1 n2 n3 n4)
writer_pid=
inflight_pid=
mn_start "${NODES[@]}"
check "four PostgreSQL instances (wal_level = logical) listen on 127.0.0.1 (ports ${PORT[*]})" 0 $?
[ "$fails" -eq 0 ] || bail "instances did not start"
trap 'kill $writer_pid $inflight_pid 2>/dev/null; mn_cleanup' EXIT

diag "$(elapsed) s: data nodes"
# ---------------------------------------------------------------- data nodes
setup_data_node() {
    local n=$1
    q "$n" postgres -c 'CREATE DATABASE data' &&
        q "$n" data <<SQL
CREATE EXTENSION sharding;
CREATE EXTENSION dblink;
CREATE TABLE documents (workspace_id text NOT NULL, id bigint PRIMARY KEY, body text);
CREATE INDEX ON documents (workspace_id);

-- The data node's writer. No node name in it: the guard on documents
-- refuses (55000) a workspace this node does not own now, and makes a move
-- of its shard wait for the writer.
CREATE FUNCTION insert_document(workspace_id text, id bigint, body text) RETURNS void
    LANGUAGE sql AS \$\$
    INSERT INTO documents VALUES (workspace_id, id, body)
\$\$;
CREATE FUNCTION get_documents(workspace_id text) RETURNS TABLE(id bigint, body text)
    LANGUAGE sql STABLE AS \$\$
    SELECT d.id, d.body FROM documents AS d WHERE d.workspace_id = \$1 ORDER BY d.id
\$\$;
CREATE FUNCTION count_all() RETURNS bigint LANGUAGE sql STABLE AS \$\$ SELECT count(*) FROM documents \$\$;
-- Which connection string the proxy used to reach us.
CREATE FUNCTION remote_application_name(workspace_id text) RETURNS text
    LANGUAGE sql STABLE AS \$\$ SELECT current_setting('application_name') \$\$;
-- SQLSTATE of a statement ('' if it succeeds).
CREATE FUNCTION sqlstate_of(query text) RETURNS text LANGUAGE plpgsql AS \$\$
BEGIN
    EXECUTE query;
    RETURN '';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END \$\$;
SQL
}
pids=()
for n in "${NODES[@]}"; do
    setup_data_node "$n" >/dev/null &
    pids+=($!)
done
ready=0
for p in "${pids[@]}"; do wait "$p" && ready=$((ready + 1)); done
check "sharding, dblink and documents on every data node" 4 "$ready"

# ---------------------------------------------------------------- the proxy
q n1 postgres -c 'CREATE DATABASE proxy' >/dev/null
# The coordinator's own DSN, which the data nodes' subscriptions use.
q n1 postgres -c "ALTER DATABASE proxy SET sharding.coordinator_dsn = 'host=127.0.0.1 port=${PORT[n1]} dbname=proxy'" >/dev/null
proxy_setup=$(
    q n1 proxy 2>&1 <<SQL
CREATE EXTENSION plproxy;
CREATE EXTENSION sharding;
CREATE EXTENSION dblink;
SELECT sharding.add_node('n1', '${DSN[n1]}'), sharding.add_node('n2', '${DSN[n2]}'),
       sharding.add_node('n3', '${DSN[n3]}'), sharding.add_node('n4', '${DSN[n4]}');
SELECT sharding.create_map('docs', 12, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.pin('docs', 'whale', 'n4');
SELECT sharding.plproxy_install();
-- The table's definition, to distribute it (its rows live on the nodes).
CREATE TABLE documents (workspace_id text NOT NULL, id bigint PRIMARY KEY, body text);
SELECT sharding.distribute('documents', 'workspace_id', 'docs');

CREATE FUNCTION insert_document(workspace_id text, id bigint, body text) RETURNS void
    LANGUAGE plproxy AS \$\$
    CLUSTER 'docs';
    RUN ON sharding.partition_for('docs', workspace_id);
\$\$;
CREATE FUNCTION get_documents(workspace_id text) RETURNS TABLE(id bigint, body text)
    LANGUAGE plproxy AS \$\$
    CLUSTER 'docs';
    RUN ON sharding.partition_for('docs', workspace_id);
\$\$;
CREATE FUNCTION count_all() RETURNS SETOF bigint
    LANGUAGE plproxy AS \$\$
    CLUSTER 'docs';
    RUN ON ALL;
\$\$;
CREATE FUNCTION remote_application_name(workspace_id text) RETURNS text
    LANGUAGE plproxy AS \$\$
    CLUSTER 'docs';
    RUN ON sharding.partition_for('docs', workspace_id);
\$\$;

-- A client that keeps writing while a shard moves: one backend, one commit
-- per document; a write refused by a fence (55000) is retried, and the
-- retry goes wherever the proxy routes by then.
CREATE PROCEDURE write_docs(first_id bigint, n integer, workspaces text[], INOUT retries integer DEFAULT 0)
    LANGUAGE plpgsql AS \$\$
DECLARE
    done boolean;
BEGIN
    FOR i IN 0 .. n - 1 LOOP
        LOOP
            BEGIN
                PERFORM insert_document(workspaces[1 + i % cardinality(workspaces)], first_id + i, 'concurrent');
                done := true;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                done := false;
            END;
            COMMIT;
            EXIT WHEN done;
            retries := retries + 1;
            IF retries > 3000 THEN
                RAISE EXCEPTION 'gave up after % retries', retries;
            END IF;
            PERFORM pg_sleep(0.005);
        END LOOP;
        PERFORM pg_sleep(0.003);
    END LOOP;
END \$\$;
SQL
)
rc=$?
check "proxy database: map docs, node DSNs, whale pin, plproxy_install, PL/Proxy functions" 0 "$rc"
[ "$rc" -eq 0 ] || { echo "$proxy_setup" | sed 's/^/# /'; bail "proxy setup"; }

# Every data node follows the coordinator.
attached=0
for n in "${NODES[@]}"; do
    q n1 proxy -c "SELECT sharding.attach_node('$n')" >/dev/null && attached=$((attached + 1))
done
check "attach_node: the four data nodes follow the coordinator" 4 "$attached"
map_digest='SELECT md5(string_agg(format($$%s/%s/%s/%s$$, map, logical, node, epoch), $$,$$ ORDER BY map, logical)) FROM sharding.shards'
home_digest=$(q n1 proxy -c "$map_digest")
same=0
for n in "${NODES[@]}"; do
    [ "$(q "$n" data -c "$map_digest")|$(q "$n" data -c 'SELECT sharding.this_node()')" = "$home_digest|$n" ] && same=$((same + 1))
done
check "every data node has the coordinator's map and knows its own name (this_node)" 4 "$same"
check "every data node guards documents" "n1=1 n2=1 n3=1 n4=1" \
    "$(for n in "${NODES[@]}"; do printf '%s=%s ' "$n" "$(q "$n" data -c "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'documents'::regclass AND tgname = 'zz_sharding_guard'")"; done | sed 's/ $//')"

check "13 PL/Proxy partitions: 12 logical shards, then the pin-only node n4" \
    "13|${DSN[n1]}|${DSN[n4]}|12" \
    "$(q n1 proxy -c "SELECT count(*), (array_agg(p))[1], (array_agg(p))[13], sharding.partition_for('docs', 'whale')
                       FROM plproxy.get_cluster_partitions('docs') AS p")"

diag "$(elapsed) s: 10,000 documents"
# ---------------------------------------------------------------- 10,000 documents
ws_expr="'ws-' || lpad((i % 200)::text, 3, '0')"
load_out=$(q n1 proxy 2>&1 <<SQL
DO \$\$
BEGIN
    FOR i IN 1 .. 10000 LOOP
        PERFORM insert_document($ws_expr, i, 'document ' || i);
    END LOOP;
    FOR i IN 20001 .. 20300 LOOP
        PERFORM insert_document('whale', i, 'whale document ' || i);
    END LOOP;
END \$\$;
SQL
)
check "10,000 documents over 200 workspaces and 300 whale documents inserted through the proxy" "" "$load_out"

expected_counts=$(q n1 proxy -c "
    SELECT string_agg(node || '=' || c, ' ' ORDER BY node)
      FROM (SELECT sharding.node_for('docs', ws) AS node, count(*) AS c
              FROM (SELECT $ws_expr FROM generate_series(1, 10000) AS i
                    UNION ALL SELECT 'whale' FROM generate_series(1, 300)) AS t(ws)
             GROUP BY 1) AS per_node")
actual_counts=$(for n in "${NODES[@]}"; do printf '%s=%s ' "$n" "$(q "$n" data -c 'SELECT count(*) FROM documents')"; done)
check "each instance holds exactly the rows node_for sends it" "$expected_counts" "${actual_counts% }"
misplaced=0
for n in "${NODES[@]}"; do
    m=$(q "$n" data -c "SELECT count(*) FROM documents WHERE sharding.node_for('docs', workspace_id) <> sharding.this_node()")
    misplaced=$((misplaced + m))
done
check "no row lives on an instance node_for does not name" 0 "$misplaced"

check "get_documents finds every document of every workspace" "10000|10000|t" \
    "$(q n1 proxy -c "SELECT count(*), count(DISTINCT d.id), bool_and(d.id % 200 = w)
                       FROM generate_series(0, 199) AS w,
                            LATERAL get_documents('ws-' || lpad(w::text, 3, '0')) AS d")"
check "count_all runs once per instance (RUN ON ALL) and sums to 10,300" "4|10300" \
    "$(q n1 proxy -c 'SELECT count(*), sum(c) FROM count_all() AS c')"

diag "$(elapsed) s: the whale"
# ---------------------------------------------------------------- the whale
whale=$(for n in "${NODES[@]}"; do printf '%s=%s ' "$n" "$(q "$n" data -c "SELECT count(*) FROM documents WHERE workspace_id = 'whale'")"; done)
check "the pinned whale lands only on n4, which owns no logical shard" "n1=0 n2=0 n3=0 n4=300" "${whale% }"
check "n4 holds nothing but the whale, and get_documents finds all of it" "300|300" \
    "$(q n4 data -c 'SELECT count(*) FROM documents')|$(q n1 proxy -c "SELECT count(*) FROM get_documents('whale')")"

# A new DSN reaches a running proxy session on its next call: the same
# backend asks n4 which application_name it connected with, before and after
# add_node changes n4's connection string.
dsn_seen=$(q n1 proxy <<SQL | paste -sd'|'
SELECT '[' || remote_application_name('whale') || ']';
SELECT sharding.add_node('n4', '${DSN[n4]} application_name=relocated');
SELECT '[' || remote_application_name('whale') || ']';
SQL
)
check "add_node's new DSN for n4 is used by a running proxy session on its next call" "[]||[relocated]" "$dsn_seen"

# ---------------------------------------------------------------- moving shard 0 (n1 -> n2) under writes
SHARD=0
ws_list=$(q n1 proxy -c "SELECT string_agg(ws, ',' ORDER BY ws) FROM (SELECT DISTINCT $ws_expr AS ws FROM generate_series(0, 199) AS i) AS t
                         WHERE sharding.logical_shard('docs', ws) = $SHARD")
first_ws=${ws_list%%,*}
check "shard $SHARD is owned by n1 at epoch 1" "n1|1" \
    "$(q n1 proxy -c "SELECT node, epoch FROM sharding.shards WHERE map = 'docs' AND logical = $SHARD")"
before_shard=$(q n1 data -c "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $SHARD")

# The writer: 800 documents into shard 0's workspaces through one proxy
# backend, then (same backend, after the switch) one more.
writer_out=$ROOT/writer.out
q n1 proxy >"$writer_out" 2>&1 <<SQL &
CALL write_docs(30001, 800, string_to_array('$ws_list', ','));
DO \$\$
BEGIN
    FOR i IN 1 .. 6000 LOOP
        EXIT WHEN (SELECT node FROM sharding.shards WHERE map = 'docs' AND logical = $SHARD) = 'n2';
        PERFORM pg_sleep(0.01);
    END LOOP;
END \$\$;
SELECT insert_document('$first_ws', 39999, 'after the switch');
SQL
writer_pid=$!
sleep 0.3

# A writer in flight on n1: its guarded insert holds shard 0's share lock
# until it commits, a second later.
q n1 data >"$ROOT/inflight.out" 2>&1 <<SQL &
BEGIN;
SELECT insert_document('$first_ws', 40000, 'in flight during the move');
SELECT pg_sleep(1);
COMMIT;
SQL
inflight_pid=$!
# Until it holds the lock (it is sleeping inside its transaction).
for _ in $(seq 100); do
    [ "$(q n1 data -c "SELECT count(*) FROM pg_stat_activity WHERE datname = 'data' AND wait_event = 'PgSleep'")" = 1 ] && break
    sleep 0.05
done

# This harness moves the shard by hand, the way move_shard_online cuts over
# (without its online copy): freeze at the source, copy, switch the owner on
# the coordinator, thaw.
# 1. Freeze shard 0 on n1: waits for the in-flight writer; from then on n1
#    refuses every write of the shard, whoever writes.
t0=$(date +%s%N)
q n1 data -c "SELECT sharding._freeze_shard('docs', $SHARD)" >/dev/null
waited_ms=$((($(date +%s%N) - t0) / 1000000))
check "_freeze_shard on the source waited for the writer holding the shard's share lock (${waited_ms} ms)" 1 \
    "$([ "$waited_ms" -ge 400 ] && echo 1 || echo 0)"
wait "$inflight_pid"
inflight_rc=$?
inflight_pid=
check "the in-flight writer committed" 0 "$inflight_rc"
check "n1 now refuses a write of its own (frozen) shard $SHARD: 55000" 55000 \
    "$(q n1 data -c "SELECT sqlstate_of(\$\$SELECT insert_document('$first_ws', 50001, 'frozen')\$\$)")"

# 2. Copy the shard's rows to n2 as replication apply writes them
#    (session_replication_role = replica: the guard stands aside).
copied=$(q n2 data -c "SET session_replication_role = replica;
    WITH c AS (INSERT INTO documents
               SELECT * FROM dblink('${DSN[n1]}',
                   'SELECT workspace_id, id, body FROM documents
                     WHERE sharding.logical_shard(''docs'', workspace_id) = $SHARD
                       AND workspace_id NOT IN (SELECT key FROM sharding.pins WHERE map = ''docs'')')
                   AS d(workspace_id text, id bigint, body text)
               RETURNING 1)
    SELECT count(*) FROM c")
src_count=$(q n1 data -c "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $SHARD")
check "all $src_count rows of shard $SHARD copied to n2" "$src_count" "$copied"
sum1=$(q n1 data -c "SELECT rows || '/' || checksum FROM sharding.shard_checksum('docs', $SHARD, 'documents')")
sum2=$(q n2 data -c "SELECT rows || '/' || checksum FROM sharding.shard_checksum('docs', $SHARD, 'documents')")
check "shard_checksum of shard $SHARD is the same on n1 and n2 ($sum1)" "$sum1" "$sum2"

# 3. Switch on the coordinator: every follower sees the new owner and epoch.
check "move_shard on the coordinator: epoch 2" 2 "$(q n1 proxy -c "SELECT sharding._switch_owner('docs', $SHARD, 'n2')")"
lags=
seen=0
for n in "${NODES[@]}"; do
    lag=$(mn_wait "$n" data "SELECT sharding.node_for('docs', '$first_ws') || '/' || sharding.epoch('docs', $SHARD)" "n2/2" 30) &&
        seen=$((seen + 1))
    lags="$lags $n=${lag}ms"
done
check "every follower routes shard $SHARD to n2 at epoch 2 (seen after:$lags)" 4 "$seen"

# 4. Thaw, and delete at the source what it no longer owns (replica role:
#    the guard refuses these keys now).
check "_thaw_shard on n1" t "$(q n1 data -c "SELECT sharding._thaw_shard('docs', $SHARD)")"
deleted=$(q n1 data -c "SET session_replication_role = replica;
    WITH d AS (DELETE FROM documents WHERE sharding.node_for('docs', workspace_id) <> sharding.this_node() RETURNING 1)
    SELECT count(*) FROM d")
check "the source deleted exactly the moved rows" "$src_count" "$deleted"

wait "$writer_pid"
writer_rc=$?
writer_pid=
retries=$(sed -n 's/^\([0-9][0-9]*\)$/\1/p' "$writer_out" | head -1)
check "the concurrent writer finished (retried ${retries:-?} refused writes)" 0 "$writer_rc"
[ "$writer_rc" -eq 0 ] || sed 's/^/#   /' "$writer_out"

placed=$(for n in "${NODES[@]}"; do printf '%s=%s ' "$n" "$(q "$n" data -c 'SELECT count(*) FROM documents WHERE id BETWEEN 30001 AND 40000')"; done)
check "no row lost: all 802 concurrent, in-flight and post-switch writes are on n2, once" \
    "n1=0 n2=802 n3=0 n4=0" "${placed% }"
check "the proxy routed the same backend's write after the switch to n2, without a restart" "1|0" \
    "$(q n2 data -c 'SELECT count(*) FROM documents WHERE id = 39999')|$(q n1 data -c 'SELECT count(*) FROM documents WHERE id = 39999')"
check "n1 keeps no row of shard $SHARD" 0 \
    "$(q n1 data -c "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $SHARD")"
check "through the proxy: every document is still found (count_all, get_documents of shard $SHARD)" \
    "11102|$((before_shard + 802))" \
    "$(q n1 proxy -c 'SELECT sum(c) FROM count_all() AS c')|$(q n1 proxy -c "SELECT count(*) FROM unnest(string_to_array('$ws_list', ',')) AS w, LATERAL get_documents(w)")"
misplaced=0
for n in "${NODES[@]}"; do
    m=$(q "$n" data -c "SELECT count(*) FROM documents WHERE sharding.node_for('docs', workspace_id) <> sharding.this_node()")
    misplaced=$((misplaced + m))
done
check "after the move, still no row outside the instance node_for names" 0 "$misplaced"

# ---------------------------------------------------------------- fencing on the data node
check "on n1, a writer fenced on the old epoch is refused (55000)" 55000 \
    "$(q n1 data -c "SELECT sqlstate_of(\$\$SELECT sharding.fence('docs', $SHARD, 1)\$\$)")"
check "on n1, a direct write to the moved shard is refused by the guard (55000)" 55000 \
    "$(q n1 data -c "SELECT sqlstate_of(\$\$SELECT insert_document('$first_ws', 50000, 'stale')\$\$)")"
check "on n2, the new epoch passes the fence and the old one does not" "|55000" \
    "$(q n2 data -c "SELECT sqlstate_of(\$\$SELECT sharding.fence('docs', $SHARD, 2)\$\$) || '|' || sqlstate_of(\$\$SELECT sharding.fence('docs', $SHARD, 1)\$\$)")"

diag "$(elapsed) s: latency"
# ---------------------------------------------------------------- latency
# Median of 3 pgbench runs of 1,000 calls each: get_documents of one
# workspace (50 rows) through the proxy, and the same call directly on the
# data node that owns it.
ws_bench=ws-005
owner=$(q n1 proxy -c "SELECT sharding.node_for('docs', '$ws_bench')")
echo "SELECT * FROM get_documents('$ws_bench');" >"$ROOT/bench.sql"
median_latency() {
    local n=$1 db=$2 runs=()
    for _ in 1 2 3; do
        runs+=("$(pgbench -n -t 1000 -f "$ROOT/bench.sql" -h "${DIR[$n]}" -p "${PORT[$n]}" -U postgres "$db" 2>/dev/null |
            sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')")
    done
    printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p
}
via_proxy=$(median_latency n1 proxy)
direct=$(median_latency "$owner" data)
if [ -n "$via_proxy" ] && [ -n "$direct" ]; then
    ratio=$(awk -v a="$via_proxy" -v b="$direct" 'BEGIN { printf "%.1f", a / b }')
    ok "latency per call: ${via_proxy} ms through the proxy, ${direct} ms direct on $owner (ratio ${ratio}; load average $(cut -d' ' -f1 /proc/loadavg) on $(nproc) CPUs)"
else
    not_ok "latency measured with pgbench (proxy '${via_proxy}', direct '${direct}')"
fi

mn_finish
