# Long-lived psql sessions for the TAP harnesses: each session is one backend
# fed through a FIFO, so a test can interleave statements of several
# sessions, leave one blocked and check on it later.
#
#   sess_start A                  # starts session A (PG* environment)
#   sess_send A "BEGIN"           # sends without waiting
#   out=$(sess_recv A)            # output of everything sent so far
#   out=$(sess_run A "SELECT 1")  # send + receive
#   sess_stop A
# Errors show as "ERROR:  <sqlstate>" lines (VERBOSITY sqlstate).

SESS_DIR=${SESS_DIR:-$(mktemp -d)}

sess_start() {
    local name=$1 fd
    mkfifo "$SESS_DIR/$name.in" "$SESS_DIR/$name.out"
    psql -XAtq -v ON_ERROR_STOP=0 <"$SESS_DIR/$name.in" >"$SESS_DIR/$name.out" 2>&1 &
    eval "SESS_PID_$name=$!"
    exec {fd}>"$SESS_DIR/$name.in"
    eval "SESS_IN_$name=$fd"
    exec {fd}<"$SESS_DIR/$name.out"
    eval "SESS_OUT_$name=$fd"
    sess_run "$name" '\set VERBOSITY sqlstate' >/dev/null
}

# Sends SQL followed by an end marker, without waiting for the result.
sess_send() {
    local name=$1 sql=$2 fd
    eval "fd=\$SESS_IN_$name"
    # SQL needs its terminating semicolon before the marker (a stray ';' is
    # an empty statement); a backslash command must not get one.
    case $sql in \\*) ;; *) sql="$sql;" ;; esac
    printf '%s\n\\echo __END__\n' "$sql" >&"$fd"
}

# Prints the output up to the next end marker (waits up to ${2:-30} s).
sess_recv() {
    local name=$1 timeout=${2:-30} fd line
    eval "fd=\$SESS_OUT_$name"
    while IFS= read -r -t "$timeout" -u "$fd" line; do
        [ "$line" = "__END__" ] && return 0
        printf '%s\n' "$line"
    done
    echo "TIMEOUT"
    return 1
}

sess_run() { sess_send "$1" "$2" && sess_recv "$1" "${3:-30}"; }

sess_stop() {
    local name=$1 fd pid
    eval "fd=\$SESS_IN_$name; pid=\$SESS_PID_$name"
    [ -n "$fd" ] || return 0
    # Other sessions' psql inherited this FIFO's write end, so EOF would not
    # come: ask psql to quit instead.
    printf '\\q\n' >&"$fd" 2>/dev/null
    exec {fd}>&-
    eval "fd=\$SESS_OUT_$name"
    wait "$pid" 2>/dev/null
    exec {fd}<&-
    eval "SESS_IN_$name="
}

# TAP helpers.
TAP_N=0
TAP_FAILED=0
tap_is() {  # tap_is GOT WANT DESCRIPTION
    TAP_N=$((TAP_N + 1))
    if [ "$1" = "$2" ]; then
        echo "ok $TAP_N - $3"
    else
        echo "not ok $TAP_N - $3"
        printf '#   got:  %s\n#   want: %s\n' "$1" "$2" | sed 's/^\([^#]\)/#   \1/'
        TAP_FAILED=$((TAP_FAILED + 1))
    fi
}
tap_ok() {  # tap_ok CONDITION_EXIT_STATUS DESCRIPTION
    if [ "$1" -eq 0 ]; then tap_is ok ok "$2"; else tap_is fail ok "$2"; fi
}
