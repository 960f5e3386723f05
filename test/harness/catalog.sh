#!/usr/bin/env bash
# The column numbers the C++ reads the configuration tables by
# (src/pg/catalog.hpp, Anum_<table>_<column>) agree with pg_attribute of the
# tables a fresh CREATE EXTENSION makes, so that reordering or renaming a
# column in sql/install/ without updating the header fails here. Each table
# is named by a "// sharding.<table>:" line of the header; every constant
# after it must be Anum_<table>_<column> for an existing column at that
# position.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/cluster.sh
. test/lib/session.sh
DIR=$(make_cluster_dir catalog)
trap 'stop_cluster "$DIR"; rm -rf "$DIR" "$SESS_DIR"' EXIT
start_cluster "$DIR" || { echo "1..1"; echo "not ok 1 - cluster"; exit 1; }
export PGDATABASE=postgres
psql -XqAt -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION sharding' >/dev/null || { echo "1..1"; echo "not ok 1 - CREATE EXTENSION"; exit 1; }

# "table column number" for every constant of a header; "BAD name" for a
# constant not under a table's line or not named after it.
constants() {
    awk '
    match($0, /^\/\/ sharding\.[a-z_]+:/) { t = substr($0, 13, RLENGTH - 13); next }
    /constexpr int Anum_/ {
        name = $3; num = $5; sub(/;.*/, "", num)
        prefix = "Anum_" t "_"
        if (t == "" || index(name, prefix) != 1) { print "BAD", name, num; next }
        print t, substr(name, length(prefix) + 1), num
    }' "$1"
}
# "table column header installed" for every constant; installed is empty when
# the column does not exist.
compare() {
    local table column num
    while read -r table column num; do
        [ "$table" = BAD ] && continue
        echo "$table $column $num $(psql -XAtc "SELECT attnum FROM pg_catalog.pg_attribute
            WHERE attrelid = 'sharding.$table'::regclass AND attname = '$column' AND NOT attisdropped" 2>&1)"
    done < <(constants "$1")
}
count=$(constants src/pg/catalog.hpp | grep -c .)
echo "1..$((count + 3))"
tap_is "$(constants src/pg/catalog.hpp | awk '$1 == "BAD"' | wc -l)" "0" \
    "every constant of src/pg/catalog.hpp is Anum_<table>_<column> under its table's line"
while read -r table column num got; do
    tap_is "$got" "$num" "sharding.$table.$column is column $num, as Anum_${table}_${column} says"
done < <(compare src/pg/catalog.hpp)
# The check can fail: a header with two columns swapped, or a renamed one.
bad=$(mktemp)
sed 's/Anum_maps_map = 1;/Anum_maps_map = 2;/; s/Anum_maps_logical_shards = 2;/Anum_maps_logical_shards = 1;/' \
    src/pg/catalog.hpp >"$bad"
tap_is "$(compare "$bad" | awk '$3 != $4' | wc -l)" "2" "a header with sharding.maps' columns swapped gives two mismatches"
sed 's/Anum_distributed_tables_map = /Anum_distributed_tables_mapname = /' src/pg/catalog.hpp >"$bad"
tap_is "$(compare "$bad" | awk '$3 != $4' | wc -l)" "1" "a header naming a missing column gives a mismatch"
rm -f "$bad"
exit $TAP_FAILED
