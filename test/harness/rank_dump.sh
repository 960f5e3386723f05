#!/usr/bin/env bash
# Rank guards survive pg_dump/restore: a plain dump restored into a fresh
# database, a custom-format dump through pg_restore, and a dump of one table
# alone into a database that only has the extension. The restored guards skip
# or raise exactly as the originals did; sharding.rank_guards comes along.
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=sharding_rank_dump_src
DBS="sharding_rank_dump_plain sharding_rank_dump_custom sharding_rank_dump_table"
WORK=$(mktemp -d)
cleanup() { for d in $SRC $DBS; do dropdb --if-exists "$d" 2>/dev/null; done; rm -rf "$WORK"; }
trap cleanup EXIT

. test/lib/tap.sh
echo "1..21"

for d in $SRC $DBS; do dropdb --if-exists "$d" 2>/dev/null; done
createdb $SRC || exit 1
psql -XqAt -v ON_ERROR_STOP=1 -d $SRC >/dev/null <<'SQL' || { echo "Bail out! setup failed"; exit 1; }
CREATE EXTENSION sharding;
CREATE TABLE orders (id bigint PRIMARY KEY, status text);
INSERT INTO orders VALUES (1, 'placed'), (2, 'shipped');
SELECT sharding.guard_rank('orders', 'status', ARRAY['placed', 'shipped', 'delivered']);
-- Replaced once: only the last guard may survive.
SELECT sharding.guard_rank('orders', 'status', ARRAY['placed', 'paid', 'shipped', 'delivered']);

CREATE TYPE state AS ENUM ('placed', 'shipped', 'delivered');
ALTER TYPE state ADD VALUE 'packed' BEFORE 'shipped';
CREATE TABLE eorders (id int PRIMARY KEY, status state);
INSERT INTO eorders VALUES (1, 'packed'), (2, 'shipped');
SELECT sharding.guard_rank('eorders', 'status', on_regress => 'error');

-- Names that need quoting, ranks that need escaping.
CREATE SCHEMA "Shop Floor";
CREATE TABLE "Shop Floor"."Line Items" (k text PRIMARY KEY, "Stage" text);
INSERT INTO "Shop Floor"."Line Items" VALUES ('a', 'it''s new');
SELECT sharding.guard_rank('"Shop Floor"."Line Items"', 'Stage', ARRAY['it''s new', 'back\slash', 'done "quoted"']);
SQL

pg_dump -d $SRC >"$WORK/plain.sql" && pg_dump -Fc -d $SRC -f "$WORK/custom.dump" &&
    pg_dump -d $SRC -t orders >"$WORK/orders.sql"
ok_rc $? "pg_dump (plain, custom, one table)"

createdb sharding_rank_dump_plain && psql -XqAt -v ON_ERROR_STOP=1 -d sharding_rank_dump_plain -f "$WORK/plain.sql" \
    >/dev/null 2>"$WORK/plain.err"
ok_rc $? "plain dump restores into a fresh database without error"
sed 's/^/# /' "$WORK/plain.err" | head -5
createdb sharding_rank_dump_custom && pg_restore --exit-on-error -d sharding_rank_dump_custom "$WORK/custom.dump" \
    2>"$WORK/custom.err"
ok_rc $? "custom dump restores with pg_restore without error"
sed 's/^/# /' "$WORK/custom.err" | head -5

config() { psql -XqAt -d "$1" -c "SELECT schema_name, table_name, column_name, ranks, on_regress FROM sharding.rank_guards ORDER BY 1, 2, 3"; }
triggers() { psql -XqAt -d "$1" -c "SELECT tgrelid::regclass, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1::text, 2"; }
want_config=$(config $SRC)
want_triggers=$(triggers $SRC)
is "$(echo "$want_triggers" | grep -c _rank_guard)" 3 "source: one guard trigger per guarded column"

for db in sharding_rank_dump_plain sharding_rank_dump_custom; do
    q() { psql -XqAt -d $db -c "$1" 2>&1; }
    is "$(config $db)" "$want_config" "$db: sharding.rank_guards restored"
    is "$(triggers $db)" "$want_triggers" "$db: guard triggers restored"
    is "$(q "UPDATE orders SET status = 'paid' WHERE id = 2")" "" "$db: text guard skips shipped -> paid"
    is "$(q "SELECT string_agg(status, ',' ORDER BY id) FROM orders")" "placed,shipped" "$db: text rows unchanged"
    is "$(q "SELECT sharding.advance('orders', 1, 'paid')::text || sharding.rank_of('orders', 'status', 'shipped')")" "true2" \
        "$db: advance and rank_of use the restored ranks"
    is "$(q "UPDATE eorders SET status = 'packed' WHERE id = 2" | grep -o 'ERROR: .*')" \
        'ERROR:  rank guard refuses to lower column "status" of relation "eorders" from "shipped" to "packed"' \
        "$db: enum guard raises 23514; 'packed' (added BEFORE 'shipped') still ranks below it"
    is "$(q "SELECT sharding.rank_of('\"Shop Floor\".\"Line Items\"', 'Stage', 'done \"quoted\"')")" "2" \
        "$db: quoted names and escaped ranks restored"
done

# One table alone, into a database that only has the extension: the trigger
# carries its configuration, so the guard works without a config row.
createdb sharding_rank_dump_table && psql -XqAt -d sharding_rank_dump_table -c 'CREATE EXTENSION sharding' >/dev/null &&
    psql -XqAt -v ON_ERROR_STOP=1 -d sharding_rank_dump_table -f "$WORK/orders.sql" >/dev/null 2>"$WORK/table.err"
ok_rc $? "a one-table dump restores"
db=sharding_rank_dump_table
is "$(psql -XqAt -d $db -c "UPDATE orders SET status = 'placed' RETURNING id")" "1" \
    "one-table restore: the guard skips shipped -> placed, lets placed through"
is "$(psql -XqAt -d $db -c "SELECT sharding.rank_of('orders', 'status', 'delivered')")" "3" \
    "one-table restore: rank_of reads the ranks from the restored trigger"

exit $((failures > 0))
