#!/usr/bin/env bash
# The pg_regress suite against a server running under Valgrind memcheck: the
# memory-error check that stands in for AddressSanitizer, which cannot run
# with Debian's postgres (see test/sanitize.sh). Not part of CI: it takes
# several minutes.
#
#   bash test/memcheck.sh        (or: make memcheck)
#
# PostgreSQL itself is not built for Valgrind, so memcheck also reports
# PostgreSQL's own known noise (uninitialised padding written to WAL, the
# dynamic loader's strncmp). The run fails only on error records whose stack
# passes through our library (a frame "(in .../sharding.so)", or, with debug
# information, a frame in one of our .cpp/.hpp files), and prints them.
set -uo pipefail
cd "$(dirname "$0")/.."
. test/lib/cluster.sh
command -v valgrind >/dev/null || { [ "$(id -u)" -eq 0 ] && apt-get install -y -qq valgrind >/dev/null; }
ensure_packages || exit 1
build_and_install || exit 1
logs=$(mktemp -d /tmp/sharding-memcheck.XXXXXX)
chmod 777 "$logs"
DIR=$(make_cluster_dir memcheck)
trap 'stop_cluster "$DIR"; rm -rf "$DIR"' EXIT
export SHARDING_SERVER_WRAPPER="valgrind --quiet --trace-children=yes --num-callers=40 --error-limit=no --log-file=$logs/vg.%p"
start_cluster "$DIR" "-c max_connections=20 -c max_locks_per_transaction=512" || exit 1
make -s installcheck PG_CONFIG=$PG_CONFIG 2>&1 | grep -E '^test |tests? (passed|failed)'
regress_rc=${PIPESTATUS[0]}
stop_cluster "$DIR"
# One error record = the lines from "==pid== <headline>" to the next blank "==pid== ".
ours=$(awk '/^==[0-9]+== [A-Z]/ {rec = $0 "\n"; inrec = 1; next}
            inrec && /^==[0-9]+== *$/ {if (rec ~ /sharding\.so|\.(cpp|hpp):[0-9]+\)/) printf "%s\n", rec; inrec = 0; next}
            inrec {rec = rec $0 "\n"}' "$logs"/vg.* 2>/dev/null)
total=$(grep -h '^==[0-9]*== [A-Z]' "$logs"/vg.* 2>/dev/null | wc -l)
n=$(printf '%s' "$ours" | grep -c '^==[0-9]*== [A-Z]')
echo "memcheck: $total error records in all, $n with sharding.so on the stack (logs in $logs)"
[ -n "$ours" ] && printf '%s\n' "$ours" | head -80
[ "$n" -eq 0 ] && [ "$regress_rc" -eq 0 ]
