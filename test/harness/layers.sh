#!/usr/bin/env bash
# The structure the code keeps (issue 16, findings 3 and 4):
# - the pure core (Makefile: PURE) compiles without any PostgreSQL header;
# - sharding.so exports only PostgreSQL's entry points (Pg_magic_func,
#   _PG_init), sharding_* functions with their pg_finfo_ records, and the
#   old names that the frozen 1.0/1.1 scripts link to (src/pg/legacy.cpp);
# - every C function of the current install script links to a symbol that
#   sharding.so exports;
# - rank.cpp reaches PostgreSQL only through named glue functions called by
#   glue(), never through a pg_call lambda.
set -uo pipefail
cd "$(dirname "$0")/../.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
layers=$(make -s --no-print-directory check-layers PG_CONFIG=$PG_CONFIG)
npure=$(printf '%s\n' "$layers" | grep -c '^\(not \)\?ok')
echo "1..$((npure + 5))"
n=0
while IFS= read -r line; do
    n=$((n + 1))
    case $line in
        ok*) echo "ok $n ${line#ok }" ;;
        *) echo "not ok $n ${line#not ok }" ;;
    esac
done < <(printf '%s\n' "$layers" | grep '^\(not \)\?ok')

report() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }

# The check itself can fail: a core file that includes a PostgreSQL header
# makes `make check-layers` exit non-zero.
bad=$(mktemp -d)
printf '#include "postgres.h"\nint f();\n' >"$bad/bad_core.hpp"
make -s --no-print-directory check-layers PURE="$bad/bad_core.hpp" PG_CONFIG=$PG_CONFIG >"$bad/out" 2>&1
bad_rc=$?
rm -rf "$bad"
[ "$bad_rc" -ne 0 ]
report $? "make check-layers fails when a src/core/ file includes a PostgreSQL header"

[ -f sharding.so ] || make -s PG_CONFIG=$PG_CONFIG >/dev/null
legacy=$(grep -ho "'MODULE_PATHNAME', '[a-z_0-9]*'" sql/sharding--1.0.sql sql/sharding--1.0--1.1.sql sql/sharding--1.1.sql |
    sed "s/.*, '//;s/'\$//" | sort -u)
exported=$(nm -D --defined-only sharding.so | awk '{print $3}')
stray=$(printf '%s\n' "$exported" | while read -r s; do
    case $s in
        Pg_magic_func | _PG_init | _PG_output_plugin_init | sharding_* | pg_finfo_sharding_*) continue ;;
    esac
    base=${s#pg_finfo_}
    grep -qxF "$base" <<<"$legacy" || echo "$s"
done)
[ -z "$stray" ]
report $? "sharding.so exports nothing but entry points, sharding_* and the frozen scripts' names${stray:+ (stray: $(echo $stray | head -c 300))}"

grep -qx "_PG_init" <<<"$exported" && grep -qx "Pg_magic_func" <<<"$exported" &&
    [ "$(printf '%s\n' "$exported" | grep -c '^_Z')" -eq 0 ]
report $? "Pg_magic_func and _PG_init are exported, no C++ symbol is"

current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" sharding.control)
missing=$(grep -ho "'MODULE_PATHNAME', '[a-z_0-9]*'" "sql/sharding--$current.sql" | sed "s/.*, '//;s/'\$//" | sort -u |
    while read -r s; do grep -qxF "$s" <<<"$exported" || echo "$s"; done)
[ -z "$missing" ]
report $? "every C function of the $current install script links to an exported symbol${missing:+ (missing: $missing)}"

lambdas=$(grep -n 'pg_call(' src/rank/rank.cpp)
[ -z "$lambdas" ]
report $? "rank.cpp calls PostgreSQL through named glue functions, not pg_call lambdas${lambdas:+ (at: $(echo $lambdas | head -c 200))}"
