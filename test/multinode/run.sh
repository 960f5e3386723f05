#!/usr/bin/env bash
# Multi-node harness (contract section 7): the shard map drives PL/Proxy
# across four live PostgreSQL instances on loopback. Emits TAP; exits
# non-zero on any failure. Run by test/run.sh, or alone:
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/multinode/run.sh
#
# Topology. Instances n1..n4, each with its own port on 127.0.0.1 and its own
# socket directory under one private temporary directory, run as the
# `postgres` OS user when we are root. Each has a database `data` holding
# `documents`; n1..n3 own the 12 logical shards of map `docs` (4 each), n4
# owns none and holds a pinned whale workspace. The database `proxy` on n1
# is the map's home: create_map, add_node, pin and move_shard happen there,
# and PL/Proxy routes from there with RUN ON sharding.partition_for(...).
#
# How the map reaches the data nodes. Every data node needs the map too: its
# writers fence against it. The harness copies the home's config tables to
# each data node once (COPY of sharding.nodes, maps, shards, pins,
# map_versions), and applies every later change with the same function call
# on each node: a shard move is made on the source node first (fencing its
# writers), then on the other nodes, then on the home (the switch that
# proxies see). Data-node writers (insert_document) fence on the local map:
# sharding.fence(map, shard, epoch) plus "node_for names me", so a node
# refuses (55000) writes for a shard it has given away.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/cluster.sh

started=$(date +%s.%N)
t=0
fails=0
ok() { t=$((t + 1)); echo "ok $t - $*"; }
not_ok() { t=$((t + 1)); fails=$((fails + 1)); echo "not ok $t - $*"; }
diag() { echo "# $*"; }
elapsed() { awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }
# check DESCRIPTION EXPECTED ACTUAL
check() {
    if [ "$2" = "$3" ]; then ok "$1"; else
        not_ok "$1"
        diag "  expected: $2"
        diag "       got: $3"
    fi
}
bail() { not_ok "$*"; echo "1..$t"; exit 1; }

# Alone, build and install first; test/run.sh has done it already.
if [ -z "${SHARDING_TESTDIR:-}" ]; then
    build_and_install || bail "build and install"
fi

NODES=(n1 n2 n3 n4)
declare -A DIR PORT DSN
ROOT=$(make_cluster_dir multinode)
[ "$(id -u)" -eq 0 ] && chown postgres: "$ROOT"
chmod 755 "$ROOT"
writer_pid=
inflight_pid=
cleanup() {
    [ -n "$writer_pid" ] && kill "$writer_pid" 2>/dev/null
    [ -n "$inflight_pid" ] && kill "$inflight_pid" 2>/dev/null
    for n in "${NODES[@]}"; do [ -n "${DIR[$n]:-}" ] && stop_cluster "${DIR[$n]}"; done
    rm -rf "$ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# q NODE DB [psql args]: psql on an instance's socket, stop at the first error.
q() {
    local n=$1 db=$2
    shift 2
    psql -XAtq -v ON_ERROR_STOP=1 -h "${DIR[$n]}" -p "${PORT[$n]}" -U postgres -d "$db" "$@"
}

# ---------------------------------------------------------------- instances
for n in "${NODES[@]}"; do
    DIR[$n]=$ROOT/$n
    while :; do
        p=$(free_port)
        dup=0
        for m in "${NODES[@]}"; do [ "${PORT[$m]:-}" = "$p" ] && dup=1; done
        [ $dup -eq 0 ] && break
    done
    PORT[$n]=$p
    DSN[$n]="host=127.0.0.1 port=$p dbname=data"
done
pids=()
for n in "${NODES[@]}"; do
    (SHARDING_PORT=${PORT[$n]} start_cluster "${DIR[$n]}" -c listen_addresses=127.0.0.1 \
        -c max_prepared_transactions=0) &
    pids+=($!)
done
up=0
for p in "${pids[@]}"; do wait "$p" && up=$((up + 1)); done
check "four PostgreSQL instances listen on 127.0.0.1 (ports ${PORT[*]})" 4 "$up"
[ "$up" -eq 4 ] || bail "instances did not start"
for n in "${NODES[@]}"; do
    if ! psql -XAtq "host=127.0.0.1 port=${PORT[$n]} user=postgres dbname=postgres" -c 'SELECT 1' >/dev/null; then
        bail "instance $n reachable over TCP"
    fi
done

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
CREATE FUNCTION this_node() RETURNS text LANGUAGE sql IMMUTABLE AS \$\$ SELECT '$n'::text \$\$;

-- The data node's writer: fenced on the local copy of the map, so that a
-- move of the shard waits for it, and refused (55000) once the shard or the
-- workspace's pin belongs to another node.
CREATE FUNCTION insert_document(workspace_id text, id bigint, body text) RETURNS void
    LANGUAGE plpgsql AS \$\$
DECLARE
    s integer := sharding.logical_shard('docs', insert_document.workspace_id);
    owner text;
BEGIN
    PERFORM sharding.fence('docs', s, sharding.epoch('docs', s));
    owner := sharding.node_for('docs', insert_document.workspace_id);
    IF owner <> this_node() THEN
        RAISE EXCEPTION 'workspace % belongs to node %, not %', insert_document.workspace_id, owner, this_node()
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    INSERT INTO documents VALUES (insert_document.workspace_id, insert_document.id, insert_document.body);
END \$\$;
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
proxy_setup=$(
    q n1 proxy 2>&1 <<SQL
CREATE EXTENSION plproxy;
CREATE EXTENSION sharding;
SELECT sharding.create_map('docs', 12, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.add_node('n1', '${DSN[n1]}'), sharding.add_node('n2', '${DSN[n2]}'),
       sharding.add_node('n3', '${DSN[n3]}'), sharding.add_node('n4', '${DSN[n4]}');
SELECT sharding.pin('docs', 'whale', 'n4');
SELECT sharding.plproxy_install();

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

# Copy the map to every data node (see the header).
copy_map() {
    local n=$1 tbl
    for tbl in nodes maps shards pins map_versions; do
        q n1 proxy -c "\\copy sharding.$tbl TO STDOUT" | q "$n" data -c "\\copy sharding.$tbl FROM STDIN" || return 1
    done
}
map_digest='SELECT md5(string_agg(format($$%s/%s/%s/%s$$, map, logical, node, epoch), $$,$$ ORDER BY map, logical)) FROM sharding.shards'
copied=0
home_digest=$(q n1 proxy -c "$map_digest")
for n in "${NODES[@]}"; do
    copy_map "$n" && [ "$(q "$n" data -c "$map_digest")" = "$home_digest" ] && copied=$((copied + 1))
done
check "the home's map is copied to every data node" 4 "$copied"

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
    m=$(q "$n" data -c "SELECT count(*) FROM documents WHERE sharding.node_for('docs', workspace_id) <> this_node()")
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

# 1. Copy: n2 pulls shard 0's rows from n1 (the writer keeps writing to n1).
copied1=$(q n2 data -c "SELECT sharding.copy_shard('docs', $SHARD, 'documents', 'workspace_id', '${DSN[n1]}', '${DSN[n2]}')")
check "copy_shard copied shard $SHARD's rows to n2" 1 "$([ "${copied1:-0}" -ge "$before_shard" ] && echo 1 || echo 0)"

# A writer in flight on n1, fenced on shard 0, that commits a second later.
q n1 data >"$ROOT/inflight.out" 2>&1 <<SQL &
BEGIN;
SELECT insert_document('$first_ws', 40000, 'in flight during the move');
SELECT pg_sleep(1);
COMMIT;
SQL
inflight_pid=$!
# Until it holds the fence (it is sleeping inside its transaction).
for _ in $(seq 100); do
    [ "$(q n1 data -c "SELECT count(*) FROM pg_stat_activity WHERE datname = 'data' AND wait_event = 'PgSleep'")" = 1 ] && break
    sleep 0.05
done

# 2. Fence/switch on the source: waits for the in-flight writer; from then
#    on n1 refuses writes to shard 0.
t0=$(date +%s%N)
epoch_n1=$(q n1 data -c "SELECT sharding.move_shard('docs', $SHARD, 'n2')")
waited_ms=$((($(date +%s%N) - t0) / 1000000))
check "move_shard on the source waited for the fenced writer (${waited_ms} ms)" 1 "$([ "$waited_ms" -ge 400 ] && echo 1 || echo 0)"
wait "$inflight_pid"
inflight_rc=$?
inflight_pid=
check "the fenced in-flight writer committed" 0 "$inflight_rc"

# 3. Copy what was written since the first copy, then switch everyone else;
#    the home last (that is when proxies reroute).
copied2=$(q n2 data -c "SELECT sharding.copy_shard('docs', $SHARD, 'documents', 'workspace_id', '${DSN[n1]}', '${DSN[n2]}')")
epochs="$epoch_n1"
for n in n2 n3 n4; do epochs="$epochs $(q "$n" data -c "SELECT sharding.move_shard('docs', $SHARD, 'n2')")"; done
epochs="$epochs $(q n1 proxy -c "SELECT sharding.move_shard('docs', $SHARD, 'n2')")"
check "every copy of the map moved shard $SHARD to epoch 2" "2 2 2 2 2" "$epochs"
diag "copied $copied1 rows, then $copied2 written meanwhile"

# 4. Verify: every row of shard 0 on n1 is on n2.
missing=$(q n2 data -c "SELECT count(*) FROM dblink('${DSN[n1]}',
            'SELECT id FROM documents WHERE sharding.logical_shard(''docs'', workspace_id) = $SHARD') AS a(id bigint)
          WHERE NOT EXISTS (SELECT FROM documents AS d WHERE d.id = a.id)")
src_count=$(q n1 data -c "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $SHARD")
dst_count=$(q n2 data -c "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $SHARD")
check "verify: all $src_count rows of shard $SHARD on n1 are on n2 ($dst_count there)" 0 "$missing"

# 5. Delete from the source what it no longer owns.
deleted=$(q n1 data -c "WITH d AS (DELETE FROM documents WHERE sharding.node_for('docs', workspace_id) <> this_node() RETURNING 1)
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
    m=$(q "$n" data -c "SELECT count(*) FROM documents WHERE sharding.node_for('docs', workspace_id) <> this_node()")
    misplaced=$((misplaced + m))
done
check "after the move, still no row outside the instance node_for names" 0 "$misplaced"

# ---------------------------------------------------------------- fencing on the data node
check "on n1, a writer fenced on the old epoch is refused (55000)" 55000 \
    "$(q n1 data -c "SELECT sqlstate_of(\$\$SELECT sharding.fence('docs', $SHARD, 1)\$\$)")"
check "on n1, a direct write to the moved shard is refused (55000)" 55000 \
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

diag "multinode harness took $(elapsed) s"
echo "1..$t"
[ "$fails" -eq 0 ]
