#!/usr/bin/env bash
# Runs one benchmark for an older commit and for this checkout in turn, in
# one session, and prints each figure as this checkout's median with its
# ratio to the older commit's (docs/performance.md, "Comparing two builds"):
#
#   SHARDING_PGROOT=/work/pgroot-me bash test/bench/compare.sh REV BENCH [ROUNDS] [ARG...]
#
# BENCH: a folder of test/bench with a run.sh (move, claim, ...) or a
# script there (route). REV is checked out into a worktree of its own,
# $COMPARE_DIR/wt-<rev> (COMPARE_DIR defaults to /tmp/sharding-compare),
# which builds into its own PostgreSQL copy, $COMPARE_DIR/pgroot-<rev>
# (COMPARE_OLD_TREE and COMPARE_OLD_PGROOT name others, e.g. a worktree
# already built);
# this checkout builds into SHARDING_PGROOT (required: the system
# PostgreSQL is never installed into). Each side runs its own copy of the
# benchmark script (the same text, unless the scripts changed in between:
# the script says so), with ARG... and the environment (BENCH_RUNS, ROWS,
# ...) as given. ROUNDS (default 3) rounds, the order alternating (old then
# new, new then old, ...) so that a drift of the machine's load meets both
# alike. Every side's output is kept in $COMPARE_DIR/<bench>-<side>-<round>.
#
# The summary pairs the lines both sides print (stdout) by their text with
# the numbers taken out; each number is shown as this checkout's median
# over the rounds, followed by [new/old] where the two medians differ.
# The load average is printed with it: on a busy machine a ratio within
# the rounds' own spread is noise.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: SHARDING_PGROOT=DIR $0 REV BENCH [ROUNDS] [ARG...]" >&2; exit 2; }
[ -n "${SHARDING_PGROOT:-}" ] || { echo "SHARDING_PGROOT must name this checkout's PostgreSQL copy" >&2; exit 2; }
rev=$(git rev-parse --short "$1") || exit 2
bench=$2
rounds=${3:-3}
shift $(($# < 3 ? $# : 3))
here=$(pwd)
dir=${COMPARE_DIR:-/tmp/sharding-compare}
mkdir -p "$dir"
script=test/bench/$bench
[ -d "$script" ] && script=$script/run.sh
[ -f "$script" ] || { echo "no benchmark $script" >&2; exit 2; }

old_tree=${COMPARE_OLD_TREE:-$dir/wt-$rev}
old_root=${COMPARE_OLD_PGROOT:-$dir/pgroot-$rev}
if [ ! -d "$old_tree" ]; then
    git worktree add --detach "$old_tree" "$rev" >&2 || exit 1
fi
[ "$(git -C "$old_tree" rev-parse --short HEAD)" = "$rev" ] || { echo "$old_tree is not at $rev" >&2; exit 1; }
[ -f "$old_tree/$script" ] || { echo "$rev has no $script" >&2; exit 1; }
cmp -s "$script" "$old_tree/$script" || echo "# note: $script differs between $rev and this checkout" >&2

# run SIDE ROUND: one run of the benchmark on that side's build.
run() {
    local side=$1 round=$2 tree root out
    shift 2
    if [ "$side" = old ]; then tree=$old_tree root=$old_root; else tree=$here root=$SHARDING_PGROOT; fi
    out=$dir/$bench-$side-$round
    echo "# round $round: $side ($(cd "$tree" && git rev-parse --short HEAD)), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    (cd "$tree" && SHARDING_PGROOT=$root bash "$script" "$@") >"$out" 2>"$out.log" ||
        { echo "# $side round $round failed: $out.log" >&2; return 1; }
}

loads=()
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
    for side in $order; do run "$side" "$r" "$@" || exit 1; done
    loads+=("$(cut -d' ' -f1 /proc/loadavg)")
done

echo "# $bench: this checkout ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src sql || echo ', modified')) against $rev, medians of $rounds rounds, [new/old] where they differ"
echo "# load average after each round: ${loads[*]} on $(nproc) CPUs"
python3 - "$dir" "$bench" "$rounds" <<'PY'
import re, statistics, sys
d, bench, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
num = re.compile(r'-?\d+(?:\.\d+)?')
verdict = re.compile(r'\b(met|MISSED)\b')
def figures(side):
    # (template, its occurrence in the output) -> per round: numbers, verdicts
    by, order = {}, []
    for r in range(1, rounds + 1):
        seen = {}
        for line in open(f'{d}/{bench}-{side}-{r}'):
            line = re.sub(r'\s+', ' ', line.strip())
            t = verdict.sub('\x01', num.sub('\x00', line))
            seen[t] = seen.get(t, 0) + 1
            key = (t, seen[t])
            if key not in by:
                by[key] = []
                order.append(key)
            by[key].append(([float(x) for x in num.findall(line)], verdict.findall(line), num.findall(line)))
    return by, order
old, _ = figures('old')
new, order = figures('new')
def show(x):
    return f'{x:.0f}' if abs(x) >= 100 or x == int(x) else f'{x:.3g}'
for key in order:
    t = key[0]
    if key not in old:
        print(t.replace('\x00', '?').replace('\x01', '?') + '   (only in this checkout)')
        continue
    n = len(new[key][0][0])
    if any(len(v) != n for v, _, _ in new[key] + old[key]):
        print(t.replace('\x00', '?').replace('\x01', '?') + '   (numbers vary in count between runs)')
        continue
    parts = t.split('\x00')
    out = parts[0]
    for i in range(n):
        mn = statistics.median(v[i] for v, _, _ in new[key])
        mo = statistics.median(v[i] for v, _, _ in old[key])
        if all(v[i] == mn for v, _, _ in new[key] + old[key]):
            out += new[key][0][2][i] + parts[i + 1]  # the same everywhere: as printed
            continue
        out += show(mn)
        if mn != mo:
            out += f' [{mn / mo:.2f}]' if mo else ' [old 0]'
        out += parts[i + 1]
    # a verdict (met/MISSED) as the rounds of each side gave it
    for j in range(out.count('\x01')):
        nw = '/'.join(ws[j] for _, ws, _ in new[key])
        ow = '/'.join(ws[j] for _, ws, _ in old[key])
        out = out.replace('\x01', f'{nw} (old {ow})', 1)
    print(out)
PY
