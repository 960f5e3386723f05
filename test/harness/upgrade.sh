#!/usr/bin/env bash
# Upgrades (docs/upgrades.md): CREATE EXTENSION sharding VERSION '1.0', use it, then
# ALTER EXTENSION sharding UPDATE; the result must equal a fresh install of
# the current version (every catalog object the extension owns, compared
# attribute by attribute, and psql's \df sharding.*), and the data and the
# routing of the old database must survive the update.
set -uo pipefail
cd "$(dirname "$0")/../.."
OLD=sharding_upgrade_old
NEW=sharding_upgrade_new
current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" sharding.control)
# Every released version upgrades to the current one.
FROMS="1.0 1.1 1.2 1.3"
echo "1..$((9 * $(echo $FROMS | wc -w) + 1))"
. test/lib/tap.sh
trap 'dropdb --if-exists $OLD 2>/dev/null; dropdb --if-exists $NEW 2>/dev/null' EXIT

# upgrade_from VERSION: install VERSION, use it, update, compare with a fresh install.
upgrade_from() {
local from=$1
for db in $OLD $NEW; do dropdb --if-exists $db 2>/dev/null; createdb $db || exit 1; done


psql -XqAtd $OLD -v ON_ERROR_STOP=1 -c "CREATE EXTENSION sharding VERSION '$from'" >/dev/null &&
psql -XqAtd $OLD -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
SELECT sharding.create_map('docs', 32, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.pin('docs', 'whale', 'dedicated');
SELECT sharding.pin('docs', '42', 'n2');
SELECT sharding.move_shard('docs', 5, 'n3');
SELECT sharding.add_node(n, 'host=' || n) FROM unnest(ARRAY['n1', 'n2', 'n3', 'dedicated']) AS n;
SELECT sharding.add_node('n3', 'host=n3 user=u password=pw3');
CREATE TABLE orders (id bigint PRIMARY KEY, status text);
INSERT INTO orders VALUES (1, 'delivered');
SELECT sharding.guard_rank('orders', 'status', ARRAY['new', 'shipped', 'delivered']);
SELECT sharding.create_queue('jobs');
INSERT INTO jobs (key) SELECT 'k' || i FROM generate_series(1, 5) AS i;
SQL
ok_rc $? "version $from installs and works"

# The move engine's SQL wrappers that 1.4 drops (sql/upgrade/1.3--1.4/
# 34_unused.sql): a database still at 1.3 that calls one is told, each with
# 0A000, to update (src/pg/legacy.cpp), and nothing else happens.
if [ "$from" = 1.3 ]; then
    bad=
    for call in "_move_slot_close('x')" "_move_drop_replication('x')" "_move_drop_triggers('x', 'x')" \
                "_move_finish('x', 0, NULL, 'x', NULL)" "_move_phase('x', 0, 'x')" "_move_raise(1)" \
                "_move_refuse_written()"; do
        name=${call%%(*}
        got=$(psql -XAtd $OLD -v VERBOSITY=verbose -c "SELECT sharding.$call" 2>&1 | grep -E '^(ERROR|HINT)' | tr '\n' ' ')
        want="ERROR:  0A000: function sharding.$name was retired in version 1.4 HINT:  Run ALTER EXTENSION sharding UPDATE. "
        [ "$got" = "$want" ] || bad="$bad
#   sharding.$call: got: $got"
    done
    [ -z "$bad" ]
    ok_rc $? "1.3's seven retired move wrappers raise 0A000 telling to update"
    [ -z "$bad" ] || echo "$bad" | sed 1d
fi

routes="SELECT string_agg(sharding.partition_for('docs', k)::text || '/' || sharding.node_for('docs', k), ',' ORDER BY k)
          FROM (SELECT 'key-' || i AS k FROM generate_series(1, 300) i UNION ALL SELECT 'whale' UNION ALL SELECT '42') t"
before=$(psql -XAtd $OLD -c "$routes")
data="SELECT (SELECT string_agg(map || logical || node || epoch, ',' ORDER BY map, logical) FROM sharding.shards),
             (SELECT string_agg(key || node, ',' ORDER BY key) FROM sharding.pins),
             (SELECT string_agg(node || regexp_replace(coalesce(dsn, ''), 'password=\S+', 'password=********'), ',' ORDER BY node) FROM sharding.nodes),
             (SELECT count(*) FROM jobs), sharding.cluster_version('docs')"
data_before=$(psql -XAtd $OLD -c "$data")

psql -XqAtd $OLD -v ON_ERROR_STOP=1 -c 'ALTER EXTENSION sharding UPDATE' >/dev/null
ok_rc $? "ALTER EXTENSION sharding UPDATE from $from"
psql -XqAtd $NEW -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION sharding' >/dev/null
got=$(psql -XAtd $OLD -c "SELECT extversion FROM pg_extension WHERE extname = 'sharding'")
[ "$got" = "$current" ]
ok_rc $? "the updated extension is at version $current (got $got)"

# Every object the extension owns, with the attributes users depend on.
catalog=$(cat <<'SQL'
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'sharding'),
members AS (SELECT d.classid, d.objid FROM pg_depend d, ext WHERE d.refobjid = ext.oid AND d.deptype = 'e')
SELECT 'member ' || pg_describe_object(classid, objid, 0) FROM members
UNION ALL
SELECT format('function %s(%s) returns %s lang=%s vol=%s strict=%s par=%s secdef=%s config=%s src=%s bin=%s acl=%s comment=%s',
              p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
              l.lanname, p.provolatile, p.proisstrict, p.proparallel, p.prosecdef, p.proconfig,
              md5(p.prosrc), p.probin, p.proacl, obj_description(p.oid, 'pg_proc'))
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
UNION ALL
SELECT format('relation %s kind=%s acl=%s comment=%s', c.relname, c.relkind, c.relacl, obj_description(c.oid, 'pg_class'))
  FROM pg_class c WHERE c.relnamespace = 'sharding'::regnamespace
UNION ALL
SELECT format('column %s.%s %s notnull=%s default=%s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
              a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid))
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
 WHERE c.relnamespace = 'sharding'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT format('constraint %s.%s %s', c.relname, k.conname, pg_get_constraintdef(k.oid))
  FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid WHERE c.relnamespace = 'sharding'::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'sharding'::regnamespace
UNION ALL
SELECT format('trigger %s %s', t.tgname, pg_get_triggerdef(t.oid))
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'sharding'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT format('view %s %s', c.relname, md5(pg_get_viewdef(c.oid)))
  FROM pg_class c WHERE c.relnamespace = 'sharding'::regnamespace AND c.relkind = 'v'
UNION ALL
SELECT format('opclass %s family=%s type=%s default=%s', oc.opcname, f.opfname, oc.opcintype::regtype, oc.opcdefault)
  FROM pg_opclass oc JOIN pg_opfamily f ON f.oid = oc.opcfamily WHERE oc.opcnamespace = 'sharding'::regnamespace
UNION ALL
SELECT format('amproc %s %s %s %s', f.opfname, ap.amproclefttype::regtype, ap.amprocnum, ap.amproc::regprocedure)
  FROM pg_amproc ap JOIN pg_opfamily f ON f.oid = ap.amprocfamily WHERE f.opfnamespace = 'sharding'::regnamespace
UNION ALL
SELECT format('amop %s %s %s', f.opfname, ao.amopstrategy, ao.amopopr::regoperator)
  FROM pg_amop ao JOIN pg_opfamily f ON f.oid = ao.amopfamily WHERE f.opfnamespace = 'sharding'::regnamespace
UNION ALL
SELECT 'config ' || array_to_string(ARRAY(SELECT c::regclass::text FROM unnest(extconfig) c ORDER BY 1), ',')
  FROM pg_extension WHERE extname = 'sharding'
UNION ALL
SELECT format('schema acl=%s', nspacl) FROM pg_namespace WHERE nspname = 'sharding'
ORDER BY 1
SQL
)
a=$(psql -XAtd $OLD -c "$catalog" 2>&1)
b=$(psql -XAtd $NEW -c "$catalog" 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ]
ok_rc $? "catalog after update equals a fresh install ($(echo "$b" | wc -l) objects and attributes compared)"
[ -n "$a" ] && [ "$a" = "$b" ] || diff <(echo "$a") <(echo "$b") | head -20 | sed 's/^/#   /'

a=$(psql -Xd $OLD -c '\df+ sharding.*' | grep -v 'Owner\|^-' | sed 's/|[^|]*| *postgres *|/|/')
b=$(psql -Xd $NEW -c '\df+ sharding.*' | grep -v 'Owner\|^-' | sed 's/|[^|]*| *postgres *|/|/')
[ "$(echo "$a" | wc -l)" -gt 100 ] && [ "$a" = "$b" ]
ok_rc $? "\\df+ sharding.* is the same ($(echo "$b" | wc -l) lines)"
[ "$a" = "$b" ] || diff <(echo "$a") <(echo "$b") | head -10 | sed 's/^/#   /'

after=$(psql -XAtd $OLD -c "$routes")
[ -n "$before" ] && [ "$before" = "$after" ]
ok_rc $? "partition_for and node_for route 302 keys (pins included) as before the update"
data_after=$(psql -XAtd $OLD -c "$data")
[ -n "$data_before" ] && [ "$data_before" = "$data_after" ]
ok_rc $? "maps, epochs, pins, DSNs, queue rows and cluster_version survive the update"
# A DSN's password (CONTRACT 15.2): kept whole for the owner, shown masked.
got=$(psql -XAtd $OLD -c "SELECT n.dsn || ' | ' || s.dsn FROM sharding.nodes n JOIN sharding.node_secrets s USING (node) WHERE node = 'n3'")
[ "$got" = "host=n3 user=u password=******** | host=n3 user=u password=pw3" ]
ok_rc $? "a DSN's password survives the update in sharding.node_secrets, shown masked in sharding.nodes (got $got)"
got=$(psql -XAtd $OLD -c "UPDATE orders SET status = 'new' WHERE id = 1" -c "SELECT status FROM orders WHERE id = 1" 2>&1 | tail -1)
[ "$got" = "delivered" ]
ok_rc $? "the rank guard installed under $from still guards after the update"
}

for v in $FROMS; do upgrade_from "$v"; done
exit $((failures > 0))
