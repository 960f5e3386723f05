#!/usr/bin/env bash
# Runs every test of the sharding extension, from a clean clone, as root on
# Debian 12, 13 or unstable (installs what is missing) or as a user with the
# packages present. SHARDING_PG=NN picks the PostgreSQL major version
# (default: the release's own, see test/lib/cluster.sh).
#
#   bash test/run.sh
#   SHARDING_ONLY='queue*' bash test/run.sh   # only tests whose name matches
#
# pg_regress (sql/ against expected/), isolation tests (specs/ against
# expected/, via pg_isolation_regress), pgTAP (test/pgtap/*.sql, via pg_prove),
# the TAP harnesses (test/harness/*.sh: oracle vectors, concurrency) and the
# Perl TAP tests (test/tap/*.pl: multi-node, faults, dumps) all run against
# throwaway clusters. The last line is "N passed, N failed"; the exit status
# is non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
. test/lib/cluster.sh

passed=0
failed=0
skipped=0
todo=0
count() { passed=$((passed + $1)); failed=$((failed + $2)); }

# The closing line is exactly "N passed, N failed"; skipped tests (each
# named above, "ok N # skip why") are counted on the line before it.
finish() {
    [ "$skipped" -gt 0 ] && echo "$skipped skipped"
    [ "$todo" -gt 0 ] && echo "$todo failed as TODO (known broken, each named above)"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
    exit $?
}

# SHARDING_ONLY: a shell pattern; only pg_regress files, pgTAP files and
# harnesses whose base name (without .sql/.sh) matches it run. For
# developers; CI and the README command run everything.
only=${SHARDING_ONLY:-*}
selected() { local b; b=$(basename "$1"); b=${b%.*}; [[ $b == $only ]]; }

ensure_packages || { count 0 1; finish; }
build_and_install || { log "build failed"; count 0 1; finish; }

TESTDIR=$(make_cluster_dir test)
cleanup() { stop_cluster "$TESTDIR"; rm -rf "$TESTDIR"; }
trap cleanup EXIT
start_cluster "$TESTDIR" || { count 0 1; finish; }
export SHARDING_TESTDIR=$TESTDIR
start_time=$(psql -XAtqd postgres -c 'SELECT pg_postmaster_start_time()')

# Counts TAP lines of a file: "ok N" and "not ok N" (nested ones included);
# "ok N ... # SKIP" (Test::More writes "# skip") counts as skipped, not
# passed. The plans count too: every test a top-level plan ("1..N")
# announced but the file never reported is a failure, so a file that dies
# half-way fails by the tests it did not run.
tap_count() {
    local out=$1 rc=$2 ok nok skip t planned reported
    ok=$(grep -cE '^\s*ok [0-9]+' "$out")
    skip=$(grep -cE '^\s*ok [0-9]+.*# ?(SKIP|skip)' "$out")
    ok=$((ok - skip))
    skipped=$((skipped + skip))
    nok=$(grep -cE '^\s*not ok [0-9]+' "$out")
    # "not ok N ... # TODO why": a failure the test marks as known (TAP
    # TODO), named in the output, counted apart, not a failure.
    t=$(grep -cE '^\s*not ok [0-9]+.*# TODO' "$out")
    nok=$((nok - t))
    todo=$((todo + t))
    planned=$(grep -oE '^1\.\.[0-9]+' "$out" | awk -F'[.][.]' '{s += $2} END {if (NR) print s}')
    reported=$(grep -cE '^(not )?ok [0-9]+' "$out")
    if [ -n "$planned" ] && [ "$planned" -gt "$reported" ]; then
        echo "not ok - $((planned - reported)) planned test(s) never reported"
        nok=$((nok + planned - reported))
    fi
    # A script that died before reporting (bad plan, crash) is one failure.
    if [ "$rc" -ne 0 ] && [ "$nok" -eq 0 ]; then nok=1; fi
    count "$ok" "$nok"
}

# regress_count FILE RC: counts the results of pg_regress or
# pg_isolation_regress in FILE and sets regress_failed. They report each test
# as "test name ... ok" (PostgreSQL 15) or as TAP, "ok 1 - name" / "not ok 1 +
# name" (16 and later; "+" marks a test of a parallel group). A non-zero RC
# with no failed test is one failure.
# show_tap FILE: what a TAP file printed, without the passing tests' lines
# but with the skipped ones' (so that every skip is named in the log).
show_tap() { awk '!/^[ \t]*ok [0-9]+/ || /# ?(SKIP|skip)/' "$1"; }

regress_failed=0
regress_count() {
    local ok
    ok=$(grep -cE '\.\.\. ok|^ok [0-9]+ +[-+] ' "$1")
    regress_failed=$(grep -cE '\.\.\. FAILED|\.\.\. failed|^not ok [0-9]+ +[-+] ' "$1")
    if [ "$2" -ne 0 ] && [ "$regress_failed" -eq 0 ]; then regress_failed=1; fi
    count "$ok" "$regress_failed"
}

# 1. pg_regress
log "pg_regress"
regress_out=$(mktemp)
regress_list=$(for f in sql/*.sql; do case $f in sql/sharding--*) continue ;; esac; selected "$f" && basename "$f" .sql; done | tr '\n' ' ')
if [ -n "$regress_list" ]; then
    make -s installcheck PG_CONFIG=$PG_CONFIG REGRESS="$regress_list" ISOLATION= >"$regress_out" 2>&1
else
    : >"$regress_out"
fi
regress_rc=$?
cat "$regress_out"
regress_count "$regress_out" "$regress_rc"
r_fail=$regress_failed
if [ -s regression.diffs ] && [ "$r_fail" -gt 0 ]; then
    echo "---- regression.diffs ----"
    cat regression.diffs
fi
rm -f "$regress_out"

# 1b. isolation tests (pg_isolation_regress: specs/ against expected/)
iso_list=$(for f in specs/*.spec; do [ -f "$f" ] && selected "$f" && basename "$f" .spec; done | tr '\n' ' ')
if [ -n "${iso_list// /}" ]; then
    log "isolation"
    iso_out=$(mktemp)
    make -s installcheck PG_CONFIG=$PG_CONFIG REGRESS= ISOLATION="$iso_list" >"$iso_out" 2>&1
    iso_rc=$?
    cat "$iso_out"
    regress_count "$iso_out" "$iso_rc"
    i_fail=$regress_failed
    if [ -s output_iso/regression.diffs ] && [ "$i_fail" -gt 0 ]; then
        echo "---- output_iso/regression.diffs ----"
        cat output_iso/regression.diffs
    fi
    rm -f "$iso_out"
fi

# 2. pgTAP
tap_files=()
for f in test/pgtap/*.sql; do [ -f "$f" ] && selected "$f" && tap_files+=("$f"); done
if [ ${#tap_files[@]} -gt 0 ]; then
    log "pgTAP"
    createdb sharding_tap &&
        psql -XqAtd sharding_tap -c 'CREATE EXTENSION pgtap; CREATE EXTENSION dblink; CREATE EXTENSION sharding' >/dev/null
    tap_out=$(mktemp)
    PGDATABASE=sharding_tap pg_prove --verbose --failures "${tap_files[@]}" >"$tap_out" 2>&1
    tap_rc=$?
    show_tap "$tap_out"
    tap_count "$tap_out" "$tap_rc"
    rm -f "$tap_out"
fi

# 3. TAP harnesses (each creates its own databases or clusters)
for h in test/harness/*.sh; do
    [ -f "$h" ] && selected "$h" || continue
    log "harness $h"
    h_out=$(mktemp)
    bash "$h" >"$h_out" 2>&1
    h_rc=$?
    show_tap "$h_out"
    tap_count "$h_out" "$h_rc"
    rm -f "$h_out"
done

# 3b. Perl TAP tests (test/tap/*.pl) on PostgreSQL's own harness,
# PostgreSQL::Test::Cluster, run with prove. Their clusters are made by
# initdb, which refuses root: as root they run as the server's OS user, from
# a copy of test/tap that user owns. PostgreSQL 15 puts each test's
# clusters and logs under TESTDIR, 16 and later under TESTDATADIR and
# TESTLOGDIR: both are set, and a failed test's logs are shown.
tap_pl=()
for t in test/tap/*.pl; do [ -f "$t" ] && selected "$t" && tap_pl+=("$(basename "$t")"); done
if [ ${#tap_pl[@]} -gt 0 ]; then
    pgxs_perl=$(dirname "$($PG_CONFIG --pgxs)")/../test/perl
    tapdir=$(mktemp -d)
    cp -r test/tap "$tapdir/"
    # The sources some tests read (src/pg/catalog.hpp, README.md and docs/
    # with test/lib/readme_examples.py, what 640_pg_upgrade.pl builds for an
    # older major), in a copy the server's OS user can read: SHARDING_REPO.
    mkdir -p "$tapdir/repo/test"
    cp -r Makefile sharding.control src sql README.md docs "$tapdir/repo/" && cp -r test/lib "$tapdir/repo/test/"
    for t in "${tap_pl[@]}"; do mkdir -p "$tapdir/tap/out/${t%.pl}"; done
    [ "$(id -u)" -eq 0 ] && chown -R postgres: "$tapdir"
    for t in "${tap_pl[@]}"; do
        log "tap test/tap/$t"
        t_out=$(mktemp)
        as_server_user_in "$tapdir/tap" env PATH="$PATH" PERL5LIB="$pgxs_perl:$tapdir/tap/lib" SHARDING_REPO="$tapdir/repo" \
            TESTDIR="$tapdir/tap/out/${t%.pl}" TESTDATADIR="$tapdir/tap/out/${t%.pl}/tmp_check" \
            TESTLOGDIR="$tapdir/tap/out/${t%.pl}/tmp_check/log" PG_REGRESS="$pgxs_perl/../regress/pg_regress" \
            prove -v "$t" >"$t_out" 2>&1
        t_rc=$?
        show_tap "$t_out"
        tap_count "$t_out" "$t_rc"
        if [ "$t_rc" -ne 0 ]; then
            # A die's message goes only to the test's own log (the harness
            # points STDERR there), under the teardown's lines: show it first.
            for l in "$tapdir/tap/out/${t%.pl}"/tmp_check/log/regress_log_*; do
                [ -f "$l" ] && { echo "---- $(basename "$l") (died at)"; grep -E ' at \S+ line [0-9]+\.?$' "$l" | tail -n 5; }
            done
            for l in "$tapdir/tap/out/${t%.pl}"/tmp_check/log/*.log; do
                [ -f "$l" ] && { echo "---- $(basename "$l") (tail)"; tail -n 30 "$l"; }
            done
            # The whole of it stays for a post-mortem on this machine.
            kept=${TMPDIR:-/tmp}/sharding-failed-tap/${t%.pl}.$$
            mkdir -p "$kept" && cp -r "$tapdir/tap/out/${t%.pl}/." "$kept/" 2>/dev/null &&
                echo "---- kept in $kept"
        fi
        rm -f "$t_out"
    done
    rm -rf "$tapdir"
fi

# 4. The server survived everything thrown at it.
now_start=$(psql -XAtqd postgres -c 'SELECT pg_postmaster_start_time()' 2>/dev/null)
if [ "$now_start" = "$start_time" ] && ! grep -q 'terminated by signal' "$TESTDIR/server.log"; then
    echo "ok - server never restarted and no backend died of a signal"
    count 1 0
else
    echo "not ok - server restarted or a backend crashed:"
    grep -B2 -A5 'terminated by signal' "$TESTDIR/server.log" | head -40
    count 0 1
fi

finish
