#!/usr/bin/env bash
# The upgrade deltas take object definitions from the install fragments
# (sql/upgrade/include.awk, run by the Makefile): `-- @object NAME` ...
# `-- @end` in sql/install/, `-- @include NAME` / `-- @replace NAME` in
# sql/upgrade/. Checked: the built scripts carry no marker and carry every
# included block as its fragment has it; @replace makes CREATE OR REPLACE
# and nothing else; each mistake (unknown name, name defined twice, nested,
# unclosed or stray block, unknown directive) fails, naming file and line.
# No server needed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/tap.sh
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
AWK="awk -f sql/upgrade/include.awk"
current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" sharding.control)
install=sql/sharding--$current.sql
# The deltas of the open version (sql/upgrade/<from>--<current>/): older
# upgrade scripts are frozen as released.
delta_dir=$(ls -d sql/upgrade/*--"$current" | head -1)
from=$(basename "$delta_dir")
from=${from%%--*}
upgrade=sql/sharding--$from--$current.sql
echo "1..13"

make -s --no-print-directory "$install" "$upgrade" PG_CONFIG=$PG_CONFIG >/dev/null
ok_rc $? "make builds $install and $upgrade"

is "$(grep -c '^-- @' "$install" "$upgrade" | tr '\n' ' ')" "$install:0 $upgrade:0 " \
    "no @object/@end/@include/@replace line reaches the built scripts"

# The install script is the fragments without their marker lines.
is "$(cat sql/install/*.sql | grep -v '^-- @\(object \|end\)' | md5sum)" "$(md5sum <"$install")" \
    "$install is sql/install/*.sql with the marker lines dropped"

# Every block a delta names stands in the upgrade script as in its fragment
# (CREATE made CREATE OR REPLACE for @replace).
names=$(grep -ho '^-- @\(include\|replace\) .*' "$delta_dir"/*.sql | sort -u)
missing=
while read -r directive name; do
    [ -n "$name" ] || continue
    block=$(awk -v n="$name" '$0 == "-- @object " n {on = 1; next} on && /^-- @end/ {exit} on' sql/install/*.sql)
    [ "$directive" = @replace ] && block=$(sed -E 's/^CREATE (FUNCTION|PROCEDURE|VIEW) /CREATE OR REPLACE \1 /' <<<"$block")
    python3 -c 'import sys; sys.exit(0 if sys.argv[1] in open(sys.argv[2]).read() else 1)' "$block" "$upgrade" ||
        missing+=" $name"
done < <(sed 's/^-- //' <<<"$names")
is "${missing:-none}" none "each of the $(wc -l <<<"$names") blocks the deltas name is in $upgrade as its fragment has it"

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat >"$T/frag.sql" <<'SQL'
-- before
-- @object f
-- doc
CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';
COMMENT ON FUNCTION f() IS 'CREATE FUNCTION stays';
-- @end
-- after
SQL
printf '%s\n' 'x' '-- @include f' 'y' >"$T/inc.sql"
printf '%s\n' '-- @replace f' >"$T/rep.sql"
is "$($AWK out=1 "$T/frag.sql")" "$(printf '%s\n' '-- before' '-- doc' \
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';" \
    "COMMENT ON FUNCTION f() IS 'CREATE FUNCTION stays';" '-- after')" \
    "an install fragment is printed without its marker lines"
is "$($AWK "$T/frag.sql" out=1 "$T/inc.sql")" "$(printf '%s\n' x '-- doc' \
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';" \
    "COMMENT ON FUNCTION f() IS 'CREATE FUNCTION stays';" y)" \
    "-- @include NAME stands for the block's lines, as they are"
is "$($AWK "$T/frag.sql" out=1 "$T/rep.sql")" "$(printf '%s\n' '-- doc' \
    "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';" \
    "COMMENT ON FUNCTION f() IS 'CREATE FUNCTION stays';")" \
    "-- @replace NAME makes a line-leading CREATE FUNCTION CREATE OR REPLACE, nothing else"

# fails WHAT EXPECTED-MESSAGE FILES...: the assembly exits non-zero and says so.
fails() {
    local what=$1 want=$2 err
    shift 2
    err=$($AWK "$@" 2>&1 >/dev/null)
    local rc=$?
    if [ "$rc" -ne 0 ] && grep -qF -- "$want" <<<"$err"; then ok t "$what"; else
        ok f "$what"; echo "#   exit $rc, said: $err"; fi
}
printf '%s\n' '-- @include g' >"$T/unknown.sql"
fails "an unknown name fails the build, naming file and line" "$T/unknown.sql:1: no -- @object g" \
    "$T/frag.sql" out=1 "$T/unknown.sql"
cp "$T/frag.sql" "$T/frag2.sql"
fails "a name defined twice fails" "is defined twice" "$T/frag.sql" "$T/frag2.sql" out=1 "$T/inc.sql"
printf '%s\n' '-- @object a' '-- @object b' '-- @end' '-- @end' >"$T/nested.sql"
fails "a nested block fails" "-- @object b inside -- @object a" "$T/nested.sql" out=1 "$T/inc.sql"
printf '%s\n' '-- @object a' 'CREATE FUNCTION a();' >"$T/open.sql"
fails "a block left open at the end of its file fails, naming where it opened" "$T/open.sql:1: -- @object a is not closed" "$T/open.sql" "$T/frag.sql" out=1 "$T/inc.sql"
printf '%s\n' '-- @end' >"$T/stray.sql"
printf '%s\n' '-- @inlcude f' >"$T/typo.sql"
fails "a stray -- @end fails" "$T/stray.sql:1: -- @end without -- @object" out=1 "$T/stray.sql"
fails "an unknown directive fails" "$T/typo.sql:1: unknown directive @inlcude" "$T/frag.sql" out=1 "$T/typo.sql"
exit $failures
