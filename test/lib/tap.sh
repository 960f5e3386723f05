# TAP helpers for the bash harnesses under test/harness/ (the one ok() they
# share; new multi-node, fault and dump tests are Perl TAP, test/tap/).
#   ok VALUE DESCRIPTION   passes when VALUE is "t" (a psql boolean)
#   ok_rc STATUS DESCRIPTION   passes when STATUS (an exit status) is 0
#   is GOT WANT DESCRIPTION    passes when GOT equals WANT (prints both if not)
#   q SQL                  one psql command, unaligned, tuples only
#   fresh_db               drops and creates $PGDATABASE
# Harnesses end with: exit $failures
n=0
failures=0
ok() {
    n=$((n + 1))
    if [ "$1" = t ]; then echo "ok $n - $2"; else echo "not ok $n - $2 (got: $1)"; failures=$((failures + 1)); fi
}
ok_rc() { if [ "$1" = 0 ]; then ok t "$2"; else ok "exit status $1" "$2"; fi; }
is() {
    if [ "$1" = "$2" ]; then ok t "$3"; else
        ok f "$3"
        echo "#   got: '$1'"
        echo "#  want: '$2'"
    fi
}
q() { psql -XqAtc "$1"; }
fresh_db() { dropdb --if-exists "$PGDATABASE" 2>/dev/null; createdb "$PGDATABASE"; }
#   harness_tmp            TMP: a scratch directory; pids: background workers;
#                          on exit the workers are killed and TMP removed
#   queue_db QUEUE...      fresh_db, then CREATE EXTENSION sharding and
#                          create_queue of each QUEUE (the queue harnesses'
#                          common start)
harness_tmp() {
    TMP=$(mktemp -d)
    pids=()
    trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
}
queue_db() {
    local name
    fresh_db || return 1
    {
        echo 'CREATE EXTENSION sharding;'
        for name in "$@"; do echo "SELECT sharding.create_queue('$name');"; done
    } | psql -XqAt -v ON_ERROR_STOP=1 >/dev/null
}
