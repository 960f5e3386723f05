# TAP helpers for the bash harnesses under test/harness/.
#   ok VALUE DESCRIPTION   passes when VALUE is "t" (a psql boolean)
#   q SQL                  one psql command, unaligned, tuples only
#   fresh_db               drops and creates $PGDATABASE
# Harnesses end with: exit $failures
n=0
failures=0
ok() {
    n=$((n + 1))
    if [ "$1" = t ]; then echo "ok $n - $2"; else echo "not ok $n - $2 (got: $1)"; failures=$((failures + 1)); fi
}
q() { psql -XqAtc "$1"; }
fresh_db() { dropdb --if-exists "$PGDATABASE" 2>/dev/null; createdb "$PGDATABASE"; }
