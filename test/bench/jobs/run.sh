#!/usr/bin/env bash
# Benchmark of rebalance jobs (docs/rebalance.md), ratios
# measured in one run:
#
#   1. parallel moves, one source and one destination: a job of 4 moves
#      from n1 to n2 with max_parallel => 2, against the same 4 moves one
#      after another (a job with max_parallel => 1) (target: at most 0.8);
#   2. the same with two destinations: 4 moves over n1..n4, two into n3
#      and two into n4 (target: at most 0.8);
#   3. overhead: a job's time (rebalance_start until rebalance_wait returns)
#      against the sum of its moves' own times (journal: finished - started)
#      (target: at most 1.1).
#
# Topology: the coordinator on instance i0; data nodes n1 and n3 on i1, n2
# and n4 on i2. Map `bench` has 8 shards over n1 and n2, one distributed
# table of BENCH_ROWS rows (default 2,000,000: 250,000 per shard). Each
# round times each job with max_parallel 1 and with 2 (order alternating),
# moving each shard back to where it started in between (untimed; both jobs
# of a round make the same moves, checked). Median of BENCH_RUNS rounds
# (default 3). BENCH_APART=1 puts each data node on an instance of its own
# (i1..i4). Not part of the test command:
#
#   SHARDING_PGROOT=/tmp/pgroot bash test/bench/jobs/run.sh
#
# Figures: docs/performance.md. What limits the parallel gain on 2 cores:
# the copy of a move is CPU-bound (source backend, the pipe, destination
# backend), so two at once each take longer; what overlaps is the catch-up
# and cutover waits (WAL flush, followers seeing the switch), and a slot of
# one move waits for the clean-up delete of another at its source (a
# logical slot is created once every writing transaction there has ended).
# Moves in flight at the same nodes share sharding.move_parallel's sessions
# (two moves at once each copy in one). BENCH_TIMELINE=1 prints each timed
# job's moves step by step, BENCH_ONLY=one (or two) runs one scenario,
# BENCH_KEEP_LOGS=DIR keeps the instances' logs (docs/performance.md).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. test/lib/multinode.sh
. test/bench/lib.sh

RUNS=${BENCH_RUNS:-3}
ROWS=${BENCH_ROWS:-2000000}
# BENCH_APART=1: each data node on an instance of its own (i1..i4), so
# that no move of the two-destination scenario stays within one instance.
if [ -n "${BENCH_APART:-}" ]; then
    DATA_INSTANCES=(i1 i2 i3 i4)
    declare -A HOST=([coord]=i0 [n1]=i1 [n2]=i2 [n3]=i3 [n4]=i4)
else
    DATA_INSTANCES=(i1 i2)
    declare -A HOST=([coord]=i0 [n1]=i1 [n3]=i1 [n2]=i2 [n4]=i2)
fi
bench_nodes i0 "${DATA_INSTANCES[@]}"

for n in coord n1 n2 n3 n4; do
    q "${HOST[$n]}" postgres -c "CREATE DATABASE $n" >/dev/null
    qn "$n" -c 'CREATE EXTENSION sharding' -c 'CREATE EXTENSION dblink' \
        -c 'CREATE TABLE accounts (tenant text NOT NULL, id bigint, val text, PRIMARY KEY (id, tenant))' >/dev/null
done
qn coord >/dev/null <<SQL
SELECT sharding.create_map('bench', 8, ARRAY['n1', 'n2']);
SELECT sharding.add_node('n1', '$(ndsn n1)'), sharding.add_node('n2', '$(ndsn n2)'),
       sharding.add_node('n3', '$(ndsn n3)'), sharding.add_node('n4', '$(ndsn n4)');
SELECT sharding.distribute('accounts', 'tenant', 'bench');
SELECT sharding.attach_node('n1'); SELECT sharding.attach_node('n2');
SELECT sharding.attach_node('n3'); SELECT sharding.attach_node('n4');
SQL
for n in n1 n2; do
    mn_wait "${HOST[$n]}" "$n" "SELECT count(*) FROM sharding.shards WHERE map = 'bench'" 8 30 >/dev/null
    qn "$n" -c "INSERT INTO accounts SELECT 't' || (i % 512), i, repeat('x', 100) FROM generate_series(1, $ROWS) i
                WHERE sharding.node_for('bench', 't' || (i % 512)) = sharding.this_node()" >/dev/null
    qn "$n" -c 'VACUUM ANALYZE accounts' >/dev/null
done

# BENCH_TIMELINE=1: each timed job's moves, step by step (the engine's DEBUG
# lines "move NAME: STEP at TIME" in the coordinator's log, and the waits
# for locks and transactions, log_lock_waits after 50 ms, in the data
# nodes' logs), as ms since the job's start. Where parallel moves wait for
# each other shows here (docs/performance.md).
if [ -n "${BENCH_TIMELINE:-}" ]; then
    # (log_min_messages is set on the instances' command line: the
    # database's setting applies to the job's workers.)
    qn coord -c 'ALTER DATABASE coord SET log_min_messages = debug1' >/dev/null
    for i in "${DATA_INSTANCES[@]}"; do
        q "$i" postgres -c 'ALTER SYSTEM SET log_lock_waits = on' -c "ALTER SYSTEM SET deadlock_timeout = '50ms'" \
            -c 'SELECT pg_reload_conf()' >/dev/null
    done
fi
# timeline JOB T0: the steps of JOB's moves (T0: the job's start, epoch s).
timeline() {
    local j=$1 t0=$2 m
    for m in $(qn coord -c "SELECT move || ':' || logical || ':' || source || ':' || destination
                              FROM sharding.move_journal WHERE job = $j ORDER BY move"); do
        IFS=: read -r id lg src dst <<<"$m"
        printf '#   move %s (shard %s, %s -> %s):' "$id" "$lg" "$src" "$dst"
        grep -a "move sharding_move_[0-9a-f]*_\?bench_$lg: .* at 20" "${DIR[i0]}/server.log" |
            sed -n 's/.*move sharding_move_[0-9a-f]*_\?bench_[0-9]*: \(.*\) at \(20[0-9-]* [0-9:.+]*\)$/\2|\1/p' |
            while IFS='|' read -r when what; do
                awk -v a="$t0" -v b="$(date -d "$when" +%s.%N)" -v w="$what" \
                    'BEGIN { if (b >= a) printf " %s +%.0f;", w, (b - a) * 1000 }'
            done
        printf ' done +%s\n' "$(qn coord -c "SELECT round((extract(epoch FROM finished) - $t0) * 1000) FROM sharding.move_journal WHERE move = $id")"
    done
    for i in "${DATA_INSTANCES[@]}"; do
        grep -a 'still waiting for\|acquired .* after' "${DIR[$i]}/server.log" | tail -n 40 |
            while read -r d t z rest; do
                awk -v a="$t0" -v b="$(date -d "$d $t $z" +%s.%N)" -v i="$i" -v r="$rest" \
                    'BEGIN { if (b >= a) printf "#   %s +%.0f %s\n", i, (b - a) * 1000, substr(r, 1, 160) }'
            done
    done
}
# sampler_start / sampler_stop: with BENCH_TIMELINE, what the data nodes'
# sessions are doing, sampled every 50 ms during a timed job (active ones
# by wait event; "CPU" where they wait for none), and the CPUs' idle share
# (vmstat), printed by sampler_stop.
sampler_start() {
    [ -n "${BENCH_TIMELINE:-}" ] || return 0
    : >"$ROOT/samples"
    (
        while :; do
            for i in "${DATA_INSTANCES[@]}"; do
                q "$i" postgres -F ' ' -c "SELECT '$i', coalesce(wait_event_type || ':' || wait_event, 'CPU'),
                                                  left(regexp_replace(coalesce(nullif(application_name, ''), backend_type), '[0-9]+', 'N', 'g'), 30)
                                             FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()
                                               OR backend_type IN ('walsender', 'logical replication worker') AND wait_event IS NULL" 2>/dev/null
            done >>"$ROOT/samples"
            sleep 0.05
        done
    ) &
    SAMPLER=$!
    vmstat 1 >"$ROOT/vmstat" &
    VMSTAT=$!
}
sampler_stop() {
    [ -n "${BENCH_TIMELINE:-}" ] || return 0
    kill "$SAMPLER" "$VMSTAT" 2>/dev/null
    wait "$SAMPLER" "$VMSTAT" 2>/dev/null
    sort "$ROOT/samples" | uniq -c | sort -rn | head -n 25 | sed 's/^/#   sampled: /'
    awk 'NR > 3 { n++; idle += $15; wa += $16 } END { if (n) printf "#   CPU idle %.0f%%, I/O wait %.0f%% (vmstat, %d s)\n", idle / n, wa / n, n }' "$ROOT/vmstat"
}
# settle: every timed job starts from the same state, the data nodes'
# tables vacuumed and their WAL checkpointed (as test/bench/move/run.sh
# does). Without it each job paid for the ones before it: the moves back
# and forth leave the shards' rows dead at both ends, so a round's second
# job scanned more of them than its first (a job of 4 sequential moves took
# 6-8 s in the first round and 16-22 s in the second and third of one run),
# and the alternating order of the jobs (1 2, 2 1, 1 2) favoured the
# parallel job in two rounds of three.
settle() {
    local n
    for n in n1 n2 n3 n4; do qn "$n" -c 'VACUUM accounts' >/dev/null; done
    for n in "${DATA_INSTANCES[@]}"; do q "$n" postgres -c 'CHECKPOINT' >/dev/null; done
}
# job NODES PARALLEL: runs a job, prints "wall_ms sum_of_moves_ms moves
# server_ms": wall time from the client's rebalance_start to rebalance_wait's
# return, the sum of its moves' own times, how many, and the job's time in
# the server (created until finished).
job() {
    local t0 j wall
    sampler_start
    t0=$(date +%s%N)
    j=$(qn coord -c "SELECT sharding.rebalance_start('bench', ARRAY[$1], max_parallel => $2)")
    qn coord -c "SELECT sharding.rebalance_wait($j, '600 s')" >/dev/null
    wall=$((($(date +%s%N) - t0) / 1000000))
    sampler_stop >&2
    [ -n "${BENCH_TIMELINE:-}" ] && timeline "$j" "$(awk -v t="$t0" 'BEGIN { printf "%.3f", t / 1e9 }')" >&2
    moves "$j" >"$ROOT/last_moves"
    echo "$wall $(qn coord -c "SELECT round(sum(extract(epoch FROM m.finished - m.started)) * 1000)::bigint || ' ' || count(*)
                                   || ' ' || round(extract(epoch FROM max(j.finished) - max(j.created)) * 1000)::bigint
                                   FROM sharding.move_journal m JOIN sharding.move_jobs j USING (job)
                                  WHERE m.job = $j AND m.phase = 'done'")"
}
# The placement the timed jobs start from, restored after each (untimed):
# every shard not on its first node moved back there, one after another.
# (A rebalancing job back over n1 and n2, as before, left the shards in a
# different placement each time, so the two jobs of a round planned
# different moves: in one run the sequential job moved n2 -> n3 and
# n1 -> n4, each between two instances, the parallel one n1 -> n3 and
# n2 -> n4, each within one instance, whose slot decodes the move's own
# copy into the destination: 0.6-2 s of catch-up the other job did not
# have.)
PLACEMENT=$(qn coord -c "SELECT string_agg(logical || ':' || node, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bench'")
restore() {
    local l n ln
    for ln in $PLACEMENT; do
        l=${ln%%:*} n=${ln#*:}
        [ "$(qn coord -c "SELECT node FROM sharding.shards WHERE map = 'bench' AND logical = $l")" = "$n" ] ||
            qn coord -c "SELECT sharding.move_shard_online('bench', $l, '$n')" >/dev/null
    done
    [ "$(qn coord -c "SELECT string_agg(logical || ':' || node, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bench'")" = "$PLACEMENT" ] ||
        { echo "the placement was not restored" >&2; exit 1; }
}
# moves JOB: the job's moves, "source>destination" in the order of their shards.
moves() {
    qn coord -c "SELECT string_agg(logical || ':' || source || '>' || destination, ' ' ORDER BY logical, move) FROM sharding.move_journal WHERE job = $1"
}
# Scenarios: name, nodes of the timed job.
SCENARIOS=("one 'n2'" "two 'n1','n2','n3','n4'")
# BENCH_ONLY=one (or two): that scenario alone.
[ -n "${BENCH_ONLY:-}" ] && for i in "${!SCENARIOS[@]}"; do [ "${SCENARIOS[$i]%% *}" = "$BENCH_ONLY" ] || unset "SCENARIOS[$i]"; done
for r in $(seq 1 "$RUNS"); do
    if [ $((r % 2)) -eq 1 ]; then order="1 2"; else order="2 1"; fi
    for sc in "${SCENARIOS[@]}"; do
        read -r name there <<<"$sc"
        for p in $order; do
            # BENCH_P2_SET='sharding.x = v': set for the coordinator's
            # database during the jobs with max_parallel 2 (a trial), and
            # reset before the shards are moved back.
            [ -n "${BENCH_P2_SET:-}" ] && [ "$p" = 2 ] && qn coord -c "ALTER DATABASE coord SET $BENCH_P2_SET" >/dev/null
            settle
            res=$(job "$there" "$p")
            [ -n "${BENCH_P2_SET:-}" ] && qn coord -c "ALTER DATABASE coord RESET ${BENCH_P2_SET%%=*}" >/dev/null
            echo "# round $r, $name destination(s), max_parallel $p: job ${res%% *} ms (in the server $(echo "$res" | cut -d' ' -f4) ms), its moves $(echo "$res" | cut -d' ' -f2) ms in total ($(echo "$res" | cut -d' ' -f3) moves)"
            echo "$res" >"$ROOT/$name.r$r.p$p"
            mv "$ROOT/last_moves" "$ROOT/$name.r$r.p$p.moves"
            echo "#   its moves (shard:from>to): $(cat "$ROOT/$name.r$r.p$p.moves")"
            restore
        done
        # Both jobs of a round are to make the same moves.
        cmp -s "$ROOT/$name.r$r.p1.moves" "$ROOT/$name.r$r.p2.moves" ||
            { echo "round $r, $name: the two jobs planned different moves" >&2; exit 1; }
    done
done
# Ratios per round (both jobs of a round ran back to back), then the median.
ratio() { for r in $(seq 1 "$RUNS"); do paste -d' ' "$ROOT/$1.r$r.p2" "$ROOT/$1.r$r.p1" | awk '{print $1 / $5}'; done | median; }
[ -e "$ROOT/two.r1.p1" ] && over=$(for r in $(seq 1 "$RUNS"); do awk '{print $1 / $2}' "$ROOT/two.r$r.p1"; done | median)
[ -e "$ROOT/two.r1.p1" ] && over_server=$(for r in $(seq 1 "$RUNS"); do awk '{print $4 / $2}' "$ROOT/two.r$r.p1"; done | median)
[ -e "$ROOT/one.r1.p1" ] && echo "parallel, one source and one destination: job with max_parallel 2 / the same 4 moves one after another = $(printf '%.2f' "$(ratio one)") (median of $RUNS rounds; target <= 0.8)"
[ -e "$ROOT/two.r1.p1" ] && echo "parallel, two destinations: job with max_parallel 2 / the same 4 moves one after another = $(printf '%.2f' "$(ratio two)") (median of $RUNS rounds; target <= 0.8)"
[ -e "$ROOT/two.r1.p1" ] && echo "overhead: job time / sum of its moves (max_parallel 1) = $(printf '%.3f' "$over") from the client, $(printf '%.3f' "$over_server") in the server (target <= 1.1)"
echo "nproc: $(nproc)"
# BENCH_KEEP_LOGS=DIR: the instances' server logs copied there.
if [ -n "${BENCH_KEEP_LOGS:-}" ]; then
    mkdir -p "$BENCH_KEEP_LOGS"
    for i in i0 "${DATA_INSTANCES[@]}"; do cp "${DIR[$i]}/server.log" "$BENCH_KEEP_LOGS/$i.log"; done
fi
