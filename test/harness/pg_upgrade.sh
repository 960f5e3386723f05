#!/usr/bin/env bash
# pg_upgrade from an older PostgreSQL major to the one under test: a database
# upgraded in place keeps its maps, epochs, pins, rank guards and queues, and
# they keep working (routing, guarded updates, claims) on the new server.
#
# Needs a second, older PostgreSQL (server and headers) beside the one under
# test: test/versions.sh installs Debian 12's PostgreSQL 15 into the Debian 13
# root, so there this runs 15 -> 17. SHARDING_UPGRADE_FROM=NN picks the old
# major (default: the oldest installed one older than the one under test).
# Where there is none (the Debian 12 host has only 15) it is one skip.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/cluster.sh

NEW=$PG_MAJOR
OLD=${SHARDING_UPGRADE_FROM:-$(ls /usr/lib/postgresql 2>/dev/null | grep -E '^[0-9]+$' | sort -n |
    awk -v n="$NEW" '$1 < n' | head -n 1)}
if [ -z "$OLD" ] || [ ! -x "/usr/lib/postgresql/$OLD/bin/pg_ctl" ] ||
    [ ! -f "/usr/include/postgresql/$OLD/server/postgres.h" ]; then
    echo "1..1"
    if [ -n "${SHARDING_UPGRADE_FROM:-}" ]; then # asked for by name: missing is a failure
        echo "not ok 1 - PostgreSQL $OLD (server and headers) is installed for pg_upgrade"
        exit 1
    fi
    echo "ok 1 # SKIP pg_upgrade needs an older PostgreSQL server and its headers beside $NEW" \
        "(test/versions.sh trixie has 15 beside 17)"
    exit 0
fi

echo "1..12"
. test/lib/tap.sh

dir=$(make_cluster_dir upgrade)
build=$(mktemp -d)
OLD_BIN=/usr/lib/postgresql/$OLD/bin
NEW_BIN=$PG_BIN
PORT_OLD=$(free_port)
PORT_NEW=$(free_port)
cleanup() {
    stop_cluster "$dir/old_cluster"
    stop_cluster "$dir/new_cluster"
    rm -rf "$dir" "$build"
}
trap cleanup EXIT
[ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
chmod 700 "$dir"

# 1. The same source, built and installed for the old major (in a copy, so
# the build for the major under test is left alone).
cp -r Makefile sharding.control src sql "$build/"
dest=()
if [ -n "${SHARDING_PGROOT:-}" ]; then
    if [ ! -x "$SHARDING_PGROOT/usr/lib/postgresql/$OLD/bin/postgres" ]; then
        mkdir -p "$SHARDING_PGROOT/usr/lib/postgresql" "$SHARDING_PGROOT/usr/share/postgresql"
        cp -a "/usr/lib/postgresql/$OLD" "$SHARDING_PGROOT/usr/lib/postgresql/" &&
            cp -a "/usr/share/postgresql/$OLD" "$SHARDING_PGROOT/usr/share/postgresql/"
    fi
    dest=(DESTDIR="$SHARDING_PGROOT")
    OLD_BIN=$SHARDING_PGROOT/usr/lib/postgresql/$OLD/bin
fi
make -s -C "$build" PG_CONFIG="/usr/lib/postgresql/$OLD/bin/pg_config" >"$build/make.log" 2>&1 &&
    make -s -C "$build" PG_CONFIG="/usr/lib/postgresql/$OLD/bin/pg_config" "${dest[@]}" install >>"$build/make.log" 2>&1
rc=$?
[ $rc -ne 0 ] && sed 's/^/#   /' "$build/make.log" | tail -n 20
ok "$([ $rc -eq 0 ] && echo t || echo f)" "the extension builds and installs for PostgreSQL $OLD"

# 2. An old cluster with every kind of state.
initdb_opts=(-U postgres --auth=trust -E UTF8 --locale=C.UTF-8)
as_server_user "$OLD_BIN/initdb" -D "$dir/old_cluster/data" "${initdb_opts[@]}" >"$dir/initdb_old.log" 2>&1 ||
    sed 's/^/#   /' "$dir/initdb_old.log"
as_server_user "$OLD_BIN/pg_ctl" -D "$dir/old_cluster/data" -l "$dir/old.log" -w -t 60 start \
    -o "-p $PORT_OLD -k $dir -c listen_addresses=''" >/dev/null || sed 's/^/#   /' "$dir/old.log"
export PGHOST=$dir PGUSER=postgres PGDATABASE=upgraded
export PGPORT=$PORT_OLD
createdb upgraded
out=$(psql -XqAt -v ON_ERROR_STOP=1 2>&1 <<'SQL'
CREATE EXTENSION sharding;
SELECT sharding.create_map('orders', 16, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.move_shard('orders', 3, 'n3');
SELECT sharding.move_shard('orders', 4, 'n9');
SELECT sharding.pin('orders', 'whale', 'dedicated');
CREATE TYPE stage AS ENUM ('new', 'open', 'closed');
CREATE TABLE tickets (id bigint PRIMARY KEY, status text, stage stage);
SELECT sharding.guard_rank('tickets', 'status', ARRAY['new', 'open', 'closed'], 'skip');
SELECT sharding.guard_rank('tickets', 'stage', NULL, 'error');
INSERT INTO tickets VALUES (1, 'closed', 'closed'), (2, 'new', 'new');
SELECT sharding.create_queue('jobs');
INSERT INTO jobs (key, payload) SELECT 'k' || i, pg_catalog.jsonb_build_object('i', i) FROM generate_series(1, 20) AS i;
SELECT count(*) FROM sharding.claim(NULL::jobs, 'w1', 5);
SQL
)
rc=$?
[ $rc -ne 0 ] && echo "$out" | sed 's/^/#   /'
ok "$([ $rc -eq 0 ] && echo t || echo f)" "PostgreSQL $OLD: maps, pins, guards and a queue set up"
snapshot() {
    psql -XAt <<'SQL'
SELECT extversion FROM pg_extension WHERE extname = 'sharding';
SELECT map, logical_shards FROM sharding.maps ORDER BY map;
SELECT map, logical, node, epoch FROM sharding.shards ORDER BY map, logical;
SELECT map, key, node FROM sharding.pins ORDER BY map, key;
SELECT sharding.node_for('orders', 'k' || i) FROM generate_series(1, 40) AS i;
SELECT sharding.node_for('orders', 'whale');
SELECT schema_name, table_name, column_name, ranks, on_regress FROM sharding.rank_guards ORDER BY 1, 2, 3;
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'tickets'::regclass ORDER BY 1;
SELECT status, count(*), count(owner) FROM jobs GROUP BY status ORDER BY status;
SELECT id, status, stage FROM tickets ORDER BY id;
SQL
}
before=$(snapshot 2>&1)
as_server_user "$OLD_BIN/pg_ctl" -D "$dir/old_cluster/data" -m fast -w stop >/dev/null

# 3. pg_upgrade into a new cluster of the major under test.
new_opts=()
# 18 turned data checksums on by default; the old cluster has none.
[ "$NEW" -ge 18 ] && new_opts+=(--no-data-checksums)
as_server_user "$NEW_BIN/initdb" -D "$dir/new_cluster/data" "${initdb_opts[@]}" "${new_opts[@]}" \
    >"$dir/initdb_new.log" 2>&1 || sed 's/^/#   /' "$dir/initdb_new.log"
(as_server_user_in "$dir" "$NEW_BIN/pg_upgrade" -b "$OLD_BIN" -B "$NEW_BIN" \
    -d "$dir/old_cluster/data" -D "$dir/new_cluster/data" -U postgres \
    -p "$PORT_OLD" -P "$PORT_NEW" -s "$dir" >"$dir/pg_upgrade.log" 2>&1)
rc=$?
[ $rc -ne 0 ] && sed 's/^/#   /' "$dir/pg_upgrade.log" | tail -n 30
ok "$([ $rc -eq 0 ] && echo t || echo f)" "pg_upgrade $OLD -> $NEW succeeds"

as_server_user "$NEW_BIN/pg_ctl" -D "$dir/new_cluster/data" -l "$dir/new.log" -w -t 60 start \
    -o "-p $PORT_NEW -k $dir -c listen_addresses=''" >/dev/null || sed 's/^/#   /' "$dir/new.log"
export PGPORT=$PORT_NEW
ok "$(psql -XAtc "SELECT pg_catalog.current_setting('server_version_num')::int / 10000 = $NEW")" \
    "the upgraded database runs on PostgreSQL $NEW"
after=$(snapshot 2>&1)
if [ -n "$before" ] && [ "$before" = "$after" ]; then
    ok t "maps, epochs, pins, routing, guards, queue rows and tickets are the same after the upgrade"
else
    ok f "maps, epochs, pins, routing, guards, queue rows and tickets are the same after the upgrade"
    diff <(echo "$before") <(echo "$after") | head -n 20 | sed 's/^/#   /'
fi

# 4. Everything still works on the new server.
ok "$(psql -XAtc "SELECT sharding.move_shard('orders', 3, 'n1') = 3 AND sharding.node_for('orders', 'whale') = 'dedicated'")" \
    "move_shard raises the epoch carried over; the pin still routes"
ok "$(psql -XAtc "WITH u AS (UPDATE tickets SET status = 'open' WHERE id = 1 RETURNING id) SELECT count(*) = 0 FROM u")" \
    "the guard still skips a regressing UPDATE"
ok "$(psql -XAtc "SELECT status = 'closed' FROM tickets WHERE id = 1")" "... and the row kept its rank"
out=$(psql -XAtc "UPDATE tickets SET stage = 'new' WHERE id = 1" 2>&1)
ok "$([[ $out == *"rank guard refuses"* ]] && echo t || echo "$out")" \
    "the enum guard still raises on a regressing UPDATE"
ok "$(psql -XAtc "SELECT sharding.advance('tickets', 2::bigint, 'open')")" "advance moves a ticket forward"
ok "$(psql -XAtc "SELECT count(*) = 5 FROM sharding.claim(NULL::jobs, 'w2', 5)")" \
    "claim takes the next five jobs"
ok "$(psql -XAtc "SELECT sharding.complete('jobs', (SELECT min(id) FROM jobs WHERE owner = 'w1'), 'w1')")" \
    "complete fences on the owner recorded before the upgrade"

exit $((failures > 0))
