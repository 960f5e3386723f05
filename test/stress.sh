#!/usr/bin/env bash
# Repeats tests under load, to find the ones that fail now and then
# (docs/testing.md, "Repeating tests under load").
#
#   bash test/stress.sh [N] [TEST...]
#
# Runs the named tests (base names or shell patterns, as SHARDING_ONLY
# takes them: 201_ordered_concurrent, '4[0-9][0-9]_*', queue_claim; none:
# every test) N times (default 10), through test/run.sh, while one CPU hog
# per core runs at the same priority (SHARDING_STRESS_HOGS=K for K hogs,
# 0 for a quiet run). Each round's failures are printed with their file,
# check and diagnostic as test/run.sh reported them, and each failing
# round's whole output is kept under $TMPDIR/sharding-stress.<pid>/ (a failed
# Perl TAP test's logs and data under $TMPDIR/sharding-failed-tap/, as
# test/run.sh keeps them). The last lines are one per test that failed
# ("FILE: K of N rounds") and the closing "N passed, N failed" counting
# rounds; the exit status is non-zero if any round failed.
#
# SHARDING_PGROOT, SHARDING_PG and the rest of test/run.sh's environment
# pass through: several checkouts can stress at once.
set -uo pipefail
cd "$(dirname "$0")/.."

rounds=10
if [[ ${1:-} =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
if [ $# -gt 0 ]; then
    # SHARDING_ONLY takes one pattern: each name is a run of its own.
    patterns=("$@")
else
    patterns=('*')
fi
hogs=${SHARDING_STRESS_HOGS:-$(nproc)}
keep=${TMPDIR:-/tmp}/sharding-stress.$$
mkdir -p "$keep"

hog_pids=()
stop_hogs() {
    local p
    for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done
    wait "${hog_pids[@]}" 2>/dev/null
    hog_pids=()
}
trap 'stop_hogs' EXIT
trap 'stop_hogs; exit 130' INT TERM
for ((i = 0; i < hogs; i++)); do
    # A busy loop in its own process: a core's worth of competing work.
    (while :; do :; done) &
    hog_pids+=($!)
done
echo "== stress: ${patterns[*]}, $rounds rounds, $hogs CPU hogs, outputs of failing rounds in $keep"

passed=0 failed=0
declare -A fails=()
for ((r = 1; r <= rounds; r++)); do
    for pat in "${patterns[@]}"; do
        out=$keep/round-$r-${pat//[^A-Za-z0-9_]/_}.log
        t0=$(date +%s)
        SHARDING_ONLY=$pat bash test/run.sh >"$out" 2>&1
        rc=$?
        t1=$(date +%s)
        closing=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
        if [ "$rc" -eq 0 ] && [ -n "$closing" ]; then
            passed=$((passed + 1))
            echo "round $r ($pat): ${closing} in $((t1 - t0)) s"
            rm -f "$out"
            continue
        fi
        failed=$((failed + 1))
        echo "round $r ($pat): FAILED (${closing:-no closing line}) in $((t1 - t0)) s; output kept in $out"
        # Which file failed: the last "== ..." header before each failure.
        awk '/^== / { where = substr($0, 4) }
             /^not ok|^---- |FAILED|failed \(|# +(Failed|got|expected|at )/ { print "   [" where "] " $0 }' "$out" | head -n 40
        while read -r f; do
            [ -n "$f" ] && fails[$f]=$((${fails[$f]:-0} + 1))
        done < <(awk '/^== / { where = substr($0, 4) } /^not ok/ { print where }' "$out" | sort -u)
    done
done
stop_hogs
for f in "${!fails[@]}"; do echo "$f: ${fails[$f]} of $rounds rounds"; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
