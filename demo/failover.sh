#!/usr/bin/env bash
# Scene 9 of the demo, run by demo/run.sh after the others: the coordinator
# dies and its physical standby takes over while writers go on
# (docs/nodes.md, "Failover of the coordinator").
#
#   bash demo/failover.sh DIR
#
# DIR: the demo's private directory (owned by the server's OS user). The
# data nodes f1 and f2 are databases demo_f1 and demo_f2 of the demo's
# cluster (PGHOST, PGPORT, PGUSER as psql runs with); the coordinator is a
# server of its own in DIR/fo-a (database coord), its standby, made with
# pg_basebackup -R, in DIR/fo-b. Both are stopped when the scene ends.
set -uo pipefail
cd "$(dirname "$0")/.."
. test/lib/cluster.sh
dir=$1

q() { psql -XAtq -v ON_ERROR_STOP=1 "$@"; }
ms_since() { python3 -c "import time; print(round((time.time() - $1) * 1000))"; }
now() { python3 -c 'import time; print(time.time())'; }
stop_instances() {
    stop_cluster "$dir/fo-a"
    stop_cluster "$dir/fo-b"
}
trap stop_instances EXIT

echo
echo '======================================================================'
echo ' 9. The coordinator dies, its standby takes over, nobody stops writing'
echo '======================================================================'

# The coordinator: its own server (a physical standby copies a whole
# server), with what it needs in postgresql.conf, which the standby copies.
port_a=$(free_port)
port_b=$(free_port)
while [ "$port_b" = "$port_a" ]; do port_b=$(free_port); done
mkdir -p "$dir/fo-a" "$dir/fo-b"
[ "$(id -u)" -eq 0 ] && chown postgres: "$dir/fo-a" "$dir/fo-b"
chmod 700 "$dir/fo-a" "$dir/fo-b"
as_server_user "$PG_BIN/initdb" -D "$dir/fo-a/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
    >"$dir/fo-a/initdb.log" 2>&1 || { cat "$dir/fo-a/initdb.log" >&2; exit 1; }
as_server_user sh -c "cat >>'$dir/fo-a/data/postgresql.conf'" <<'CONF'
listen_addresses = ''
wal_level = logical
max_wal_senders = 20
max_replication_slots = 20
max_worker_processes = 24
max_logical_replication_workers = 12
wal_keep_size = '128MB'
fsync = off
log_min_messages = warning
shared_preload_libraries = 'sharding'
CONF
as_server_user "$PG_BIN/pg_ctl" -D "$dir/fo-a/data" -l "$dir/fo-a/server.log" -w -t 60 start \
    -o "-p $port_a -k $dir/fo-a" >/dev/null || { cat "$dir/fo-a/server.log" >&2; exit 1; }
dsn_a="host=$dir/fo-a port=$port_a dbname=coord"
dsn_b="host=$dir/fo-b port=$port_b dbname=coord"
here="host=$PGHOST port=$PGPORT"

# The data nodes, in the demo's cluster: each runs a writer that inserts,
# one row a transaction, the keys node_for says this node owns, and counts
# what it could not write.
for n in f1 f2; do
    q -d postgres -c 'SET client_min_messages = warning' -c "DROP DATABASE IF EXISTS demo_$n WITH (FORCE)" \
        -c "CREATE DATABASE demo_$n" || exit 1
    q -d "demo_$n" <<'SQL' || exit 1
SET client_min_messages = warning;
CREATE EXTENSION sharding;
CREATE TABLE orders (tenant text PRIMARY KEY, amount integer NOT NULL);
CREATE TABLE refused (tenant text, state text, message text);
CREATE TABLE stop_writing (stop boolean NOT NULL);
INSERT INTO stop_writing VALUES (false);
CREATE PROCEDURE writer(secs float8) LANGUAGE plpgsql AS $$
DECLARE
    i bigint := 0;
    k text;
    stop timestamptz := clock_timestamp() + secs * interval '1 second';
BEGIN
    WHILE clock_timestamp() < stop AND NOT (SELECT s.stop FROM stop_writing AS s) LOOP
        i := i + 1;
        k := 't' || i;
        IF sharding.node_for('fo', k) IS NOT DISTINCT FROM sharding.this_node() THEN
            BEGIN
                INSERT INTO orders VALUES (k, 7);
            EXCEPTION WHEN OTHERS THEN
                INSERT INTO refused VALUES (k, SQLSTATE, SQLERRM);
            END;
            COMMIT;
            PERFORM pg_sleep(0.002);
        END IF;
    END LOOP;
END $$;
SQL
done

# Both nodes live in one server here, whose logical replication launcher
# starts at most one worker per wal_retrieve_retry_interval (default 5 s):
# as fast as two servers would be, once take_over re-subscribes them.
q -d postgres -c "ALTER SYSTEM SET wal_retrieve_retry_interval = '200ms'" -c 'SELECT pg_reload_conf()' >/dev/null || exit 1

# The coordinator: map fo over f1 and f2, both attached.
q -d postgres -h "$dir/fo-a" -p "$port_a" -c 'CREATE DATABASE coord' -c "ALTER DATABASE coord SET sharding.coordinator_dsn = '$dsn_a'" || exit 1
q -d "$dsn_a" >/dev/null <<SQL || exit 1
SET client_min_messages = warning;
CREATE EXTENSION sharding; CREATE EXTENSION dblink;
CREATE TABLE orders (tenant text PRIMARY KEY, amount integer NOT NULL);
SELECT sharding.add_node('f1', '$here dbname=demo_f1'), sharding.add_node('f2', '$here dbname=demo_f2');
SELECT sharding.create_map('fo', 8, ARRAY['f1', 'f2']);
SELECT sharding.distribute('orders', 'tenant', 'fo');
SELECT sharding.attach_node('f1'), sharding.attach_node('f2');
SQL
for n in f1 f2; do
    for _ in $(seq 1 100); do
        [ "$(q -d "demo_$n" -c "SELECT count(*) FROM sharding.shards WHERE map = 'fo'")" = 8 ] && break
        sleep 0.1
    done
done

# Its standby, streaming.
as_server_user "$PG_BIN/pg_basebackup" -R -X fetch -c fast -D "$dir/fo-b/data" -d "host=$dir/fo-a port=$port_a user=postgres" \
    >"$dir/fo-b/basebackup.log" 2>&1 || { cat "$dir/fo-b/basebackup.log" >&2; exit 1; }
as_server_user "$PG_BIN/pg_ctl" -D "$dir/fo-b/data" -l "$dir/fo-b/server.log" -w -t 60 start \
    -o "-p $port_b -k $dir/fo-b" >/dev/null || { cat "$dir/fo-b/server.log" >&2; exit 1; }
for _ in $(seq 1 100); do
    [ "$(q -d "$dsn_b" -c 'SELECT status FROM pg_stat_wal_receiver' 2>/dev/null)" = streaming ] && break
    sleep 0.1
done
echo 'A coordinator (its own server) with map fo over data nodes f1 and f2, and its'
echo "physical standby, made with 'pg_basebackup -R', streaming. A writer on each"
echo 'node inserts orders where node_for says, one transaction each.'
pids=()
for n in f1 f2; do
    q -d "demo_$n" -c 'CALL writer(120)' >/dev/null &
    pids+=($!)
done
sleep 1.5

echo
echo "The coordinator's server is killed (pg_ctl stop -m immediate); its standby is"
echo 'promoted and told its own address; then, on it:'
as_server_user "$PG_BIN/pg_ctl" -D "$dir/fo-a/data" -m immediate -w stop >/dev/null
t0=$(now)
as_server_user "$PG_BIN/pg_ctl" -D "$dir/fo-b/data" -w -t 60 promote >/dev/null || exit 1
q -d postgres -h "$dir/fo-b" -p "$port_b" -c "ALTER DATABASE coord SET sharding.coordinator_dsn = '$dsn_b'" || exit 1
echo
echo '  SELECT sharding.take_over();   -- how many nodes follow this server now'
psql -X -v ON_ERROR_STOP=1 -d "$dsn_b" -c 'SELECT sharding.take_over()' || exit 1
echo "(promotion to take_over done: $(ms_since "$t0") ms). A key pinned on the new coordinator"
echo 'reaches both nodes:'
q -d "$dsn_b" -c "SELECT sharding.pin('fo', 'whale', 'f2')" >/dev/null || exit 1
t1=$(now)
for n in f1 f2; do
    for _ in $(seq 1 1000); do
        [ "$(q -d "demo_$n" -c "SELECT sharding.node_for('fo', 'whale')")" = f2 ] && break
        sleep 0.01
    done
done
q -d "demo_f1" -c "SELECT 'node_for(''fo'', ''whale'') on f1: ' || sharding.node_for('fo', 'whale')"
q -d "demo_f2" -c "SELECT 'node_for(''fo'', ''whale'') on f2: ' || sharding.node_for('fo', 'whale')"
echo "(on both nodes $(ms_since "$t1") ms after the pin)"
for n in f1 f2; do q -d "demo_$n" -c 'UPDATE stop_writing SET stop = true'; done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
echo
echo 'The writers ran on throughout:'
for n in f1 f2; do
    q -d "demo_$n" -c "SELECT '$n: ' || (SELECT count(*) FROM orders) || ' orders written, '
        || (SELECT count(*) FROM refused) || ' refused, '
        || (SELECT count(*) FROM orders WHERE sharding.node_for('fo', tenant) IS DISTINCT FROM '$n') || ' on the wrong node'"
done

# Tidy: the nodes leave the coordinator (their subscriptions go).
q -d "$dsn_b" -c "SELECT sharding.detach_node('f1'), sharding.detach_node('f2')" >/dev/null 2>&1
exit $status
