# Shared by the bash multi-node benchmarks (test/bench/*/run.sh; multi-node
# tests are Perl TAP, test/tap/): TAP helpers and
# a set of live PostgreSQL 15 instances on loopback, each with its own port
# and socket directory under one private temporary directory, configured
# for logical replication (followers, online moves).
#
#   . test/lib/multinode.sh
#   mn_start n1 n2 n3           # DIR[n], PORT[n], DSN[n] (dbname=data)
#   q n1 data -c 'SELECT 1'     # psql on an instance, stops at the first error
#   check "what" expected actual   # is actual expected "what" (test/lib/tap.sh)
#   mn_wait n2 data "SELECT ..." expected 30   # polls; prints the ms waited
#   mn_stop n3; mn_restart n3
#   mn_finish                   # prints the plan, exit status
. test/lib/cluster.sh
# The one ok/ok_rc/is of the bash harnesses (n: tests so far, failures).
# Its q() is replaced below by the instance-aware one.
. test/lib/tap.sh

mn_started=$(date +%s.%N)
diag() { echo "# $*"; }
elapsed() { awk -v s="$mn_started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }
# check DESCRIPTION EXPECTED ACTUAL: is ACTUAL EXPECTED DESCRIPTION.
check() { is "$3" "$2" "$1"; }
# not_ok DESCRIPTION: a failure found by the caller's own test.
not_ok() { ok f "$*"; }
bail() { not_ok "$*"; echo "1..$n"; exit 1; }
mn_finish() {
    diag "$(basename "$0") took $(elapsed) s"
    echo "1..$n"
    [ "$failures" -eq 0 ]
}

# Settings of every instance: logical replication for followers
# (attach_node: one slot, one walsender and one apply worker per follower)
# and online moves (one more of each per move in flight, plus table-sync
# workers), fast retries of replication workers.
MN_SERVER_OPTS="-c listen_addresses=127.0.0.1 -c max_prepared_transactions=0 -c wal_level=logical
    -c max_replication_slots=24 -c max_wal_senders=24 -c max_logical_replication_workers=16
    -c max_sync_workers_per_subscription=4 -c max_worker_processes=32 -c wal_retrieve_retry_interval=200ms"

declare -A DIR PORT DSN
MN_NODES=()
MN_BACKGROUND=()
ROOT=
mn_cleanup() {
    local p n
    for p in "${MN_BACKGROUND[@]}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
    for n in "${MN_NODES[@]}"; do [ -n "${DIR[$n]:-}" ] && stop_cluster "${DIR[$n]}"; done
    [ -n "$ROOT" ] && rm -rf "$ROOT"
}

# q NODE DB [psql args]: psql on an instance's socket, stop at the first error.
q() {
    local n=$1 db=$2
    shift 2
    psql -XAtq -v ON_ERROR_STOP=1 -h "${DIR[$n]}" -p "${PORT[$n]}" -U postgres -d "$db" "$@"
}

# mn_start NODE...: starts one instance per name (in parallel); DSN[n] names
# database `data` on it over TCP.
mn_start() {
    local n m p dup pids=() up=0
    MN_NODES=("$@")
    ROOT=$(make_cluster_dir "multinode-$(basename "$0" .sh)")
    [ "$(id -u)" -eq 0 ] && chown postgres: "$ROOT"
    chmod 755 "$ROOT"
    trap mn_cleanup EXIT
    trap 'exit 130' INT TERM
    for n in "$@"; do
        DIR[$n]=$ROOT/$n
        while :; do
            p=$(free_port)
            dup=0
            for m in "$@"; do [ "${PORT[$m]:-}" = "$p" ] && dup=1; done
            [ $dup -eq 0 ] && break
        done
        PORT[$n]=$p
        DSN[$n]="host=127.0.0.1 port=$p dbname=data"
    done
    for n in "$@"; do
        # shellcheck disable=SC2086
        (SHARDING_PORT=${PORT[$n]} start_cluster "${DIR[$n]}" $MN_SERVER_OPTS) &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" && up=$((up + 1)); done
    [ "$up" -eq $# ] || return 1
    for n in "$@"; do
        psql -XAtq "host=127.0.0.1 port=${PORT[$n]} user=postgres dbname=postgres" -c 'SELECT 1' >/dev/null || return 1
    done
}

# Stops (fast) and restarts an instance with the same settings.
mn_stop() { as_server_user "$PG_BIN/pg_ctl" -D "${DIR[$1]}/data" -m fast -w stop >/dev/null 2>&1; }
mn_restart() {
    local n=$1
    as_server_user "$PG_BIN/pg_ctl" -D "${DIR[$n]}/data" -l "${DIR[$n]}/server.log" -w -t 60 start \
        -o "-p ${PORT[$n]} -k ${DIR[$n]} -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
            -c max_connections=120 -c log_min_messages=warning $(echo $MN_SERVER_OPTS)" >/dev/null
}

# mn_wait NODE DB QUERY EXPECTED TIMEOUT_S: polls QUERY (every 10 ms) until
# it prints EXPECTED; prints the milliseconds waited; fails on timeout.
mn_wait() {
    local n=$1 db=$2 query=$3 expected=$4 timeout=$5 t0 now out
    t0=$(date +%s%N)
    while :; do
        out=$(q "$n" "$db" -c "$query" 2>/dev/null)
        now=$(date +%s%N)
        if [ "$out" = "$expected" ]; then
            echo $(((now - t0) / 1000000))
            return 0
        fi
        [ $(((now - t0) / 1000000000)) -ge "$timeout" ] && { echo "timeout (last: $out)"; return 1; }
        sleep 0.01
    done
}
