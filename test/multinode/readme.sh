#!/usr/bin/env bash
# Runs the multi-node examples (```sql node=NAME``` blocks) of README.md and
# of every page of docs/ (docs/*.md, whoever wrote it), with
# test/lib/readme_examples.py in `nodes` mode. Each file with such blocks
# runs, in document order, on a fresh instance of its own; files without
# them are skipped. Emits TAP; run by test/run.sh, or alone:
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/multinode/readme.sh
#
# The instance (test/multinode/lib.sh settings: wal_level = logical, enough
# slots and workers) holds the databases the examples name: `coord` (the
# coordinator) and the data nodes `n1`, `n2`, `n3`, created empty (the
# examples install what they need). The server runs with PGHOST and PGPORT
# of its own socket in its environment, so that the examples' DSNs
# ('dbname=n1'), used by dblink, PL/Proxy and the followers' subscriptions,
# reach it.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/multinode/lib.sh

if [ -z "${SHARDING_TESTDIR:-}" ]; then
    build_and_install || bail "build and install"
fi

pages=()
for f in README.md docs/*.md; do
    [ -f "$f" ] || continue
    blocks=$(python3 test/lib/readme_examples.py list "$f") || bail "cannot list the examples of $f"
    grep -q ' sql node=' <<<"$blocks" && pages+=("$f")
done
if [ ${#pages[@]} -eq 0 ]; then
    echo "# no page has sql node=NAME blocks"
    echo "1..0"
    exit 0
fi
trap mn_cleanup EXIT
trap 'exit 130' INT TERM
rc=0
for f in "${pages[@]}"; do
    echo "# $f"
    ROOT=$(make_cluster_dir multinode-readme)
    [ "$(id -u)" -eq 0 ] && chown postgres: "$ROOT"
    chmod 755 "$ROOT"
    MN_NODES=(r)
    DIR[r]=$ROOT/r
    PORT[r]=$(free_port)
    export PGHOST=${DIR[r]} PGPORT=${PORT[r]} PGUSER=postgres
    # shellcheck disable=SC2086
    SHARDING_PORT=${PORT[r]} start_cluster "${DIR[r]}" $MN_SERVER_OPTS || bail "instance for $f did not start"
    for db in coord n1 n2 n3; do
        q r postgres -c "CREATE DATABASE $db" >/dev/null || bail "database $db for $f"
    done
    python3 test/lib/readme_examples.py nodes "$f" \
        "coord=dbname=coord" "n1=dbname=n1" "n2=dbname=n2" "n3=dbname=n3" || rc=1
    mn_cleanup
    ROOT=
done
exit $rc
