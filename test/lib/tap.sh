# TAP helpers for the bash harnesses under test/harness/ (the one ok() they
# share; new multi-node, fault and dump tests are Perl TAP, test/tap/).
#   ok VALUE DESCRIPTION   passes when VALUE is "t" (a psql boolean)
#   ok_rc STATUS DESCRIPTION   passes when STATUS (an exit status) is 0
#   is GOT WANT DESCRIPTION    passes when GOT equals WANT (prints both if not)
#   q SQL                  one psql command, unaligned, tuples only
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
