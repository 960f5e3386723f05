#!/usr/bin/env bash
# The structure the code keeps (docs/architecture.md, "Layers and topics of src/"):
# - the pure core (Makefile: PURE) compiles without any PostgreSQL header;
# - the layers (Makefile: LAYERS, test/check_layers.py): every include and
#   every call between folders of src/ goes down, no cycle, no folder named
#   like a PostgreSQL header folder, none over a quarter of src/, no file
#   over 1,500 lines, no function over 150;
# - sharding.so exports exactly the entry points PostgreSQL looks up by name
#   (the Makefile's EXPORTS_EXTRA: Pg_magic_func, _PG_init, background
#   workers' sharding_*_main) and the symbols the installable SQL scripts
#   link their C functions to, each with its pg_finfo_ record (the Makefile
#   generates the version script src/pg/exports.map from those scripts):
#   nothing stray, nothing missing, no C++ symbol;
# - the current install and upgrade scripts link sharding_* names only; the
#   old bare names are aliases only for the released (frozen) scripts
#   (src/pg/legacy.cpp, generated list), and each alias resolves;
# - rank.cpp reaches PostgreSQL only through named glue functions called by
#   glue(), never through a pg_call lambda.
set -uo pipefail
cd "$(dirname "$0")/../.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
# check-layers reads the calls between folders from the object files (the
# test command has built them; a plain make here would rebuild every object
# for its other flags).
[ -f sharding.so ] || make -s PG_CONFIG=$PG_CONFIG >/dev/null
layers=$(make -s --no-print-directory check-layers PG_CONFIG=$PG_CONFIG)
npure=$(printf '%s\n' "$layers" | grep -c '^\(not \)\?ok')
echo "1..$((npure + 12))"
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

# ... and on a copy of src/ (links to its files and objects) where a file
# runs back up the layer order: an include of a higher layer's header
# (pg/ including move/, which makes a cycle too, move/ including pg/), and
# a call hidden behind a forward declaration of a higher layer's function.
bad=$(mktemp -d)
cp -as "$PWD/src" "$bad/src"
printf '#pragma once\n#include "move/move_engine.hpp"\n' >"$bad/src/pg/bad_up.hpp"
out=$(make -s --no-print-directory check-layers PG_CONFIG=$PG_CONFIG LAYER_SRC="$bad/src" 2>&1)
grep -q '^not ok - every #include of a file of .* goes down the layer order.*pg/bad_up.hpp:2 includes move/move_engine.hpp' <<<"$out"
report $? "make check-layers fails on an #include that runs back up a layer (pg/ including move/move_engine.hpp)"
grep -q '^not ok - no include cycle between the folders of .*move -> pg\|pg -> move' <<<"$out"
report $? "make check-layers fails on an include cycle between folders (pg/ -> move/ -> pg/)"
rm "$bad/src/pg/bad_up.hpp"
printf 'namespace sharding { void jobs_init(); }\nvoid bad_call() { sharding::jobs_init(); }\n' >"$bad/src/routing/bad_call.cpp"
${CXX:-g++} -c -o "$bad/src/routing/bad_call.o" "$bad/src/routing/bad_call.cpp"
out=$(make -s --no-print-directory check-layers PG_CONFIG=$PG_CONFIG LAYER_SRC="$bad/src" 2>&1)
grep -q '^not ok - no call goes up the layer order.*routing/bad_call.cpp calls sharding::jobs_init of .*jobs/jobs.cpp' <<<"$out"
report $? "make check-layers fails on a call that runs back up a layer (routing/ calling jobs_init of jobs/ through a forward declaration)"
rm -rf "$bad"

current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" sharding.control)
# The symbols a script's C functions link to.
linked() { grep -ho "'MODULE_PATHNAME', *'[A-Za-z0-9_]*'" "$@" | sed "s/.*, *'//;s/'\$//" | LC_ALL=C sort -u; }
# Released scripts are frozen; those of the current version are built from
# sql/install/ and sql/upgrade/.
released=()
current_scripts=()
for f in sql/sharding--*.sql; do
    case $f in
        *--"$current".sql) current_scripts+=("$f") ;;
        *) released+=("$f") ;;
    esac
done
# Entry points: names, or patterns (sharding_*_main), as the Makefile lists them.
set -f
extra=($(make -s --no-print-directory print-exports-extra PG_CONFIG=$PG_CONFIG))
set +f
extra_names=$(for p in "${extra[@]}"; do case $p in *'*'*) ;; *) echo "$p" ;; esac; done)
expected=$({ printf '%s\n' $extra_names; linked "${released[@]}" "${current_scripts[@]}" | sed 'p;s/^/pg_finfo_/'; } |
    LC_ALL=C sort -u)
exported=$(nm -D --defined-only sharding.so | awk '{print $3}' | LC_ALL=C sort -u)
stray=$(LC_ALL=C comm -23 <(printf '%s\n' "$exported") <(printf '%s\n' "$expected") | while read -r s; do
    for p in "${extra[@]}"; do case $p in *'*'*) [[ $s == $p ]] && continue 2 ;; esac; done
    echo "$s"
done)
[ -z "$stray" ]
report $? "sharding.so exports nothing but entry points and what the installable scripts link${stray:+ (stray: $(echo $stray | head -c 300))}"

missing=$(LC_ALL=C comm -13 <(printf '%s\n' "$exported") <(printf '%s\n' "$expected"))
[ -z "$missing" ]
report $? "every C function of every installable script (1.0 to $current) links to an exported symbol${missing:+ (missing: $(echo $missing | head -c 300))}"

grep -qx "_PG_init" <<<"$exported" && grep -qx "Pg_magic_func" <<<"$exported" &&
    [ "$(printf '%s\n' "$exported" | grep -c '^_Z')" -eq 0 ]
report $? "Pg_magic_func and _PG_init are exported, no C++ symbol is"

# The new rule: the current scripts link sharding_* names only. The check is
# shown to fail on a script that breaks the rule (1.2 linked partition_for_*).
bare() { linked "$@" | grep -v '^sharding_'; }
current_bare=$(bare "${current_scripts[@]}")
[ -z "$current_bare" ]
report $? "the $current install and upgrade scripts link sharding_* symbols only${current_bare:+ (bare: $(echo $current_bare | head -c 300))}"
old_bare=$(bare sql/sharding--1.2.sql | tr '\n' ' ')
[ "$old_bare" = "partition_for_bytea partition_for_int2 partition_for_int4 partition_for_int8 partition_for_text partition_for_uuid " ]
report $? "the same check finds the six bare partition_for names of the frozen 1.2 script (got: $old_bare)"

# Each legacy alias calls a sharding_ function that exists (an alias of a
# name that is gone would leave an undefined symbol: the library would not
# load).
undefined=$(nm -D --undefined-only sharding.so | awk '{print $2}' | grep '^sharding_')
[ -z "$undefined" ]
report $? "every alias of an old name resolves to a sharding_ function in sharding.so${undefined:+ (undefined: $(echo $undefined | head -c 300))}"

# The generated version script itself: linked into a small library, it
# exports a background worker's entry point and a SQL-linked symbol, and
# hides everything else.
probe=$(mktemp -d)
printf 'int sharding_probe_main(void) { return 0; }\nint sharding_hash64_text(void) { return 1; }\nint helper(void) { return 2; }\n' >"$probe/p.c"
cc -shared -fPIC -Wl,--version-script=src/pg/exports.map -o "$probe/p.so" "$probe/p.c" 2>"$probe/err" &&
    probe_syms=$(nm -D --defined-only "$probe/p.so" | awk '{print $3}' | LC_ALL=C sort | tr '\n' ' ')
rm -rf "$probe"
[ "${probe_syms:-}" = "sharding_hash64_text sharding_probe_main " ]
report $? "src/pg/exports.map exports sharding_*_main and script symbols, hides the rest (got: ${probe_syms:-link failed})"

lambdas=$(grep -n 'pg_call(' src/rank/rank.cpp)
[ -z "$lambdas" ]
report $? "rank.cpp calls PostgreSQL through named glue functions, not pg_call lambdas${lambdas:+ (at: $(echo $lambdas | head -c 200))}"
