#!/usr/bin/env bash
# The sharding demo: installs what is missing (as root on Debian 12), builds
# and installs the extension, starts a throwaway cluster and shows the
# extension at work, narrated. Nothing is left running afterwards.
#
#   bash demo/run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. test/lib/cluster.sh

ensure_packages || exit 1
build_and_install || { log "build failed"; exit 1; }
DEMODIR=$(make_cluster_dir demo)
trap 'stop_cluster "$DEMODIR/fo-a"; stop_cluster "$DEMODIR/fo-b"; stop_cluster "$DEMODIR"; rm -rf "$DEMODIR"' EXIT
# wal_level = logical and room for replication: scene 8 moves shards online
# (logical replication between databases of this cluster, jobs in
# background workers; max_prepared_transactions: distribute creates the
# table on the nodes in one two-phase transaction).
start_cluster "$DEMODIR" -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 -c max_prepared_transactions=10 \
    -c max_worker_processes=24 -c max_logical_replication_workers=12 || exit 1
export PGDATABASE=postgres
psql -Xq -v ON_ERROR_STOP=1 -f demo/demo.sql || exit 1
# Scenes 5-7 (fan-out counts, worst shard, load-aware rebalance).
psql -Xq -v ON_ERROR_STOP=1 -f demo/observe.sql || exit 1
# Scene 8 (a third node joins under live writers: rebalance_start).
psql -Xq -v ON_ERROR_STOP=1 -f demo/rebalance.sql || exit 1
# Scene 9 (the coordinator dies, its standby takes over: take_over).
bash demo/failover.sh "$DEMODIR" || exit 1
echo
echo 'Done. Everything above ran inside PostgreSQL; see README.md and docs/ for the reference.'
