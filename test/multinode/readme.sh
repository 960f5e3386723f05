#!/usr/bin/env bash
# Runs the README's multi-node examples (```sql node=NAME``` blocks) in
# document order, with test/lib/readme_examples.py in `nodes` mode. Emits
# TAP; run by test/run.sh, or alone:
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/multinode/readme.sh
#
# One instance (test/multinode/lib.sh settings: wal_level = logical, enough
# slots and workers) holds the databases the README names: `coord` (the
# coordinator) and the data nodes `n1`, `n2`, `n3`, created empty (the
# examples install what they need). The server runs with PGHOST and PGPORT
# of its own socket in its environment, so that the README's DSNs
# ('dbname=n1'), used by dblink, PL/Proxy and the followers' subscriptions,
# reach it.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/multinode/lib.sh

if [ -z "${SHARDING_TESTDIR:-}" ]; then
    build_and_install || bail "build and install"
fi

ROOT=$(make_cluster_dir multinode-readme)
[ "$(id -u)" -eq 0 ] && chown postgres: "$ROOT"
chmod 755 "$ROOT"
MN_NODES=(r)
DIR[r]=$ROOT/r
PORT[r]=$(free_port)
trap mn_cleanup EXIT
trap 'exit 130' INT TERM
export PGHOST=${DIR[r]} PGPORT=${PORT[r]} PGUSER=postgres
# shellcheck disable=SC2086
SHARDING_PORT=${PORT[r]} start_cluster "${DIR[r]}" $MN_SERVER_OPTS || bail "instance did not start"
for db in coord n1 n2 n3; do
    q r postgres -c "CREATE DATABASE $db" >/dev/null || bail "database $db"
done
python3 test/lib/readme_examples.py nodes README.md \
    "coord=dbname=coord" "n1=dbname=n1" "n2=dbname=n2" "n3=dbname=n3"
