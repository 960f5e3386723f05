#!/usr/bin/env bash
# Benchmark of move_shard_online (docs/moves.md), ratios measured in one
# run on three live instances (coordinator, n1, n2; wal_level = logical):
#
#   1. move time: a BIG-row (1,000,000) move / the plain pipe
#      COPY (SELECT ... WHERE shard_of(key, n) = s) TO STDOUT | COPY ... FROM
#      STDIN of the same rows between the same two instances into a table
#      with the same primary key (target: at most 1.2). Also against the
#      same pipe into a table with a BEFORE ROW trigger that does not fire
#      (session_replication_role = replica, as in the move), and against
#      the floor of what the move must do that the pipe does not: the
#      engine's copy alone (_move_pull into the pipe's table) plus a plain
#      DELETE of the same rows there (the move deletes them at the source
#      after the switch). The move's phases are printed too: set-up (to
#      the copy), copy, catch-up and cutover, clean-up (mostly the delete).
#   2. refusal window, measured from a writer (paced, one write per ms): a PL/pgSQL procedure on the
#      coordinator writes the moving shard's key in a loop through dblink to
#      the node node_for names, retrying on 55000; the window is its longest
#      single write (first attempt to success, refusals and waits on the
#      freeze included) during the move. BIG-row shard / SMALL-row shard
#      (target: at most 2). The engine's own view (DEBUG: frozen -> the
#      destination follows) is printed too.
#   3. other shards (CPUs kept from idling by lowest-priority loops while
#      writers run, see spin_start): a second writer, on a key of another shard that stays
#      at the move's source, writes during the BIG move back, and during an
#      interval of the same writers without a move, about as long as the
#      move, just before it and again just after it; rate during / the
#      mean of the two without (target: at least 0.9). After / before is
#      printed as the noise of the measure. After each move the destination
#      must hold no row of that other shard (only the shard's changes are
#      decoded into the move's stream; the bench fails otherwise).
#      The same writers also write while the plain pipe copies the same
#      rows out of the node they write to: what any copy of the shard
#      costs them (pipe / without), and the move against it (move / pipe).
#   4. rows per second of the BIG move (whole call, and its copy phase).
#   5. the verification (sharding.move_verify, on by default): the BIG move
#      with it / the same move without it, and the comparison's own time
#      (the engine's DEBUG line); it runs after the switch, outside the
#      refusal window of item 2.
#   6. the clean-up deferred (sharding.move_cleanup = deferred, verification
#      off): the BIG move's return / the pipe (target: at most 1.2), and
#      how long after its return the cleaner's delete at the source ended
#      (the journal row 'done'); the source must then hold none of its rows.
#
# Every timed step starts from the same state: VACUUM of the tables and a
# CHECKPOINT on both data nodes first (settle). Without it a step paid for
# the one before it: a move into a table that still held the same keys as
# dead rows from the previous run's move (the pipe's table is truncated)
# took up to twice as long, and the writers' interval without a move came
# right after the big move, with its 2,000,000 dead rows, vacuum and WAL.
#
# Median of BENCH_RUNS runs (default 3), each run measuring pipes, moves
# and baseline writers interleaved: the pipes n1 -> n2, the small shard's
# move under writers, the big move n1 -> n2 without writers (the pipe has
# none), the writers without a move, the writers under the pipe n2 -> n1,
# the big move back n2 -> n1 under them, the writers without a move again. BENCH_VERBOSE=1 prints each
# move's phases. Not part of the test command (minutes, not seconds):
#
#   SHARDING_PGROOT=/work/pgroot/you BENCH_RUNS=5 bash test/bench/move/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
. test/lib/multinode.sh
. test/bench/lib.sh

RUNS=${BENCH_RUNS:-3}
BIG=${BENCH_BIG_ROWS:-1000000}
SMALL=${BENCH_SMALL_ROWS:-10000}
# The coordinator on an instance of its own, as in production: the
# followers' slots live there, and their WAL senders decode only its WAL.
bench_nodes i0 i1 i2
declare -A HOST=([coord]=i0 [n1]=i1 [n2]=i2)

for n in coord n1 n2; do
    q "${HOST[$n]}" postgres -c "CREATE DATABASE $n" >/dev/null
    qn "$n" -c 'CREATE EXTENSION sharding' -c 'CREATE EXTENSION dblink' \
        -c 'CREATE TABLE accounts (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))' \
        -c 'CREATE TABLE copy_target (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))' \
        -c 'CREATE TABLE copy_guarded (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (id, tenant))' \
        -c 'CREATE FUNCTION pass() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$' \
        -c 'CREATE TRIGGER pass BEFORE INSERT ON copy_guarded FOR EACH ROW EXECUTE FUNCTION pass()' >/dev/null
done
# The writers (item 2 and 3), on the coordinator: write TENANT's rows with
# ids from BASE through dblink to the node node_for names, retrying on
# 55000 (refused by the guard during the cutover), until bench_ctl.stop.
qn coord >/dev/null <<'SQL'
CREATE TABLE bench_ctl (stop boolean NOT NULL);
INSERT INTO bench_ctl VALUES (true);
CREATE TABLE bench_writes (who text, writes bigint, refused bigint, worst_ms float8, secs float8, worst_at timestamptz);
CREATE PROCEDURE bench_writer(who text, tenant text, base bigint, pace boolean) LANGUAGE plpgsql AS $$
DECLARE
    dest text;
    conns text[] := '{}';
    n bigint := 0;
    refused bigint := 0;
    worst float8 := 0;
    worst_at timestamptz;
    t0 timestamptz;
    started timestamptz := clock_timestamp();
BEGIN
    LOOP
        EXIT WHEN (SELECT stop FROM bench_ctl);
        t0 := clock_timestamp();
        LOOP
            dest := sharding.node_for('bench', tenant);
            IF NOT dest = ANY (conns) THEN
                PERFORM dblink_connect(who || dest, (SELECT s.dsn FROM sharding.nodes s WHERE s.node = dest));
                conns := conns || dest;
            END IF;
            BEGIN
                PERFORM dblink_exec(who || dest, format('INSERT INTO accounts VALUES (%L, %s, clock_timestamp()::text)', tenant, base + n));
                EXIT;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                refused := refused + 1;
                PERFORM pg_sleep(0.001);
            END;
        END LOOP;
        IF extract(epoch FROM clock_timestamp() - t0) * 1000 > worst THEN
            worst := extract(epoch FROM clock_timestamp() - t0) * 1000;
            worst_at := t0;
        END IF;
        n := n + 1;
        IF pace THEN PERFORM pg_sleep(0.001); END IF;
    END LOOP;
    INSERT INTO bench_writes VALUES (who, n, refused, worst, extract(epoch FROM clock_timestamp() - started), worst_at);
END $$;
SQL
qn coord >/dev/null <<SQL
SELECT sharding.create_map('bench', 4, ARRAY['n1', 'n2']);
SELECT sharding.add_node('n1', '$(ndsn n1)'), sharding.add_node('n2', '$(ndsn n2)');
SELECT sharding.distribute('accounts', 'tenant', 'bench');
SELECT sharding.attach_node('n1');
SELECT sharding.attach_node('n2');
SQL
# Each node owns one shard that does not move (2 on n1, 3 on n2): the
# other-shard writer writes to the one at the move's source. Moved while
# empty.
for s in 2 3; do
    [ "$(qn coord -c "SELECT node FROM sharding.shards WHERE map = 'bench' AND logical = $s")" = "n$((s - 1))" ] ||
        qn coord -c "SELECT sharding.move_shard_online('bench', $s, 'n$((s - 1))')" >/dev/null
done
# A tenant of shard 2 and one of shard 3 (their rows are the other-shard
# writers', item 3), and one of shard 0 and 1 for the moving-shard writer.
tenant_of() { qn coord -c "SELECT t FROM (SELECT 'tenant-' || i AS t FROM generate_series(1, 100000) i) x WHERE sharding.logical_shard('bench', t) = $1 LIMIT 1"; }
declare -A TENANT=([0]=$(tenant_of 0) [1]=$(tenant_of 1) [2]=$(tenant_of 2) [3]=$(tenant_of 3))
# Shard 0: BIG rows over 1,000 tenants; shard 1: SMALL rows over 100 tenants.
tenants() {
    echo "SELECT array_agg(t) FROM (SELECT t FROM (SELECT 'tenant-' || i AS t FROM generate_series(1, 100000) i) x
           WHERE sharding.logical_shard('bench', t) = $1 LIMIT $2) y"
}
qn n1 -c "INSERT INTO accounts SELECT (\$t\$$(qn coord -c "$(tenants 0 1000)")\$t\$::text[])[1 + i % 1000], i, md5(i::text)
            FROM generate_series(1, $BIG) i" \
      -c "INSERT INTO accounts SELECT (\$t\$$(qn coord -c "$(tenants 1 100)")\$t\$::text[])[1 + i % 100], 10000000 + i, md5(i::text)
            FROM generate_series(1, $SMALL) i" \
      -c 'VACUUM ANALYZE accounts' >/dev/null
echo "# shard 0: $(qn n1 -c "SELECT count(*) FROM accounts WHERE sharding.logical_shard('bench', tenant) = 0") rows, shard 1: $(qn n1 -c "SELECT count(*) FROM accounts WHERE sharding.logical_shard('bench', tenant) = 1") rows"


owner() { qn coord -c "SELECT node FROM sharding.shards WHERE map = 'bench' AND logical = $1"; }
# writers_start SHARD OTHER BASE: the moving-shard writer on SHARD's tenant
# and the other-shard writer on OTHER's, ids from BASE.
# While writers run, one busy loop per CPU at the lowest priority (nice
# 19) keeps the CPUs from going idle, as a move keeps them busy: on this
# (virtual) machine a writer that waits for each answer runs about a third
# faster when the CPUs do not idle between its round trips (median of 10
# pairs of 3-second samples, loops on and off), so a baseline taken with
# idle CPUs made a move look like a gain for the other shards (1.65, 1.14
# at load 1.5-1.8). The loops yield to any other process.
spin_start() {
    local i
    SPIN=()
    for i in $(seq "$(nproc)"); do
        nice -n 19 sh -c 'while :; do :; done' &
        SPIN+=($!)
        MN_BACKGROUND+=($!)
    done
}
spin_stop() {
    kill "${SPIN[@]}" 2>/dev/null
    wait "${SPIN[@]}" 2>/dev/null
    SPIN=()
}
writers_start() {
    spin_start
    qn coord -c 'TRUNCATE bench_writes' -c 'UPDATE bench_ctl SET stop = false'
    qn coord -c "CALL bench_writer('mover', '${TENANT[$1]}', $3, true)" &
    W1=$!
    qn coord -c "CALL bench_writer('other', '${TENANT[$2]}', $(($3 + 10000000)), false)" &
    W2=$!
    sleep 0.5
}
# writers_stop: prints "worst_ms_of_mover refused_of_mover other_rate"
writers_stop() {
    qn coord -c 'UPDATE bench_ctl SET stop = true'
    wait "$W1" "$W2"
    spin_stop
    [ -n "${BENCH_VERBOSE:-}" ] && qn coord -F ' ' -c "SELECT '#   writer', who, writes, 'writes, worst', round(worst_ms::numeric, 1), 'ms from', worst_at FROM bench_writes" >&2
    qn coord -F ' ' -c "SELECT round(max(worst_ms) FILTER (WHERE who = 'mover')::numeric, 1),
                               max(refused) FILTER (WHERE who = 'mover'),
                               round(max(writes / secs) FILTER (WHERE who = 'other')::numeric, 1) FROM bench_writes"
}
ts() { date -d "$1" +%s.%N; }
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", (b - a) * 1000 }'; }
# phases T0 OUT TOTAL_MS: with BENCH_VERBOSE, a move's steps (the DEBUG
# lines in OUT) in ms after T0, and its return.
phases() {
    [ -n "${BENCH_VERBOSE:-}" ] || return 0
    echo "$2" | sed -n 's/^DEBUG:  move [^:]*: \(.*\) at \(.*\)$/\2|\1/p' |
        while IFS='|' read -r when what; do
            printf '#     %8.0f ms  %s\n' "$(awk -v a="$1" -v b="$(ts "$when")" 'BEGIN { print (b - a) * 1000 }')" "$what" >&2
        done
    printf '#     %8s ms  returned\n' "$3" >&2
}
# move SHARD TO: prints "total_ms engine_window_ms copy_ms setup_ms cleanup_ms"
# (set-up: call to copy; clean-up: replication dropped to return, mostly
# the source-side delete); phases with BENCH_VERBOSE.
move() {
    local t0 t1 out total f d c k x
    t0=$(date +%s.%N)
    # The caller's PGOPTIONS (e.g. -c sharding.move_parallel=1) are kept.
    out=$(PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=debug1" qn coord -c "SELECT sharding.move_shard_online('bench', $1, '$2')" 2>&1)
    t1=$(date +%s.%N)
    total=$(ms_between "$t0" "$t1")
    f=$(echo "$out" | sed -n 's/.*: frozen at \(.*\)$/\1/p')
    d=$(echo "$out" | sed -n 's/.*: destination follows at \(.*\)$/\1/p')
    c=$(echo "$out" | sed -n 's/.*: copying at \(.*\)$/\1/p')
    k=$(echo "$out" | sed -n 's/.*: catching_up at \(.*\)$/\1/p')
    x=$(echo "$out" | sed -n 's/.*: replication dropped at \(.*\)$/\1/p')
    if [ -z "$f" ] || [ -z "$d" ] || [ -z "$c" ] || [ -z "$k" ] || [ -z "$x" ]; then echo "move failed: $out" >&2; echo "0 0 0 0 0"; return 1; fi
    phases "$t0" "$out" "$total"
    echo "$total $(awk -v a="$(ts "$f")" -v b="$(ts "$d")" 'BEGIN { printf "%.1f", (b - a) * 1000 }') $(ms_between "$(ts "$c")" "$(ts "$k")") $(ms_between "$t0" "$(ts "$c")") $(ms_between "$(ts "$x")" "$t1") $t0 $(ts "$k") $(ts "$x") $t1"
}
# move_timed SHARD TO: prints "total_ms verify_ms" (the comparison of the
# copies, sharding.move_verify, from the engine's DEBUG line; 0 when off).
move_timed() {
    local t0 t1 out v
    t0=$(date +%s.%N)
    out=$(PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=debug1" qn coord -c "SELECT sharding.move_shard_online('bench', $1, '$2')" 2>&1) ||
        { echo "move failed: $out" >&2; echo "0 0"; return 1; }
    t1=$(date +%s.%N)
    v=$(echo "$out" | sed -n 's/.*: verified in \([0-9.]*\) s at .*/\1/p')
    phases "$t0" "$out" "$(ms_between "$t0" "$t1")"
    echo "$(ms_between "$t0" "$t1") $(awk -v v="${v:-0}" 'BEGIN { printf "%.0f", v * 1000 }')"
}
# phase_rates NODE TENANT FROM TO T0 TK TX T1: the writes/s of TENANT's rows
# with ids FROM..TO on NODE (each row's val is its write's time) in the
# move's phases: set-up and copy [T0, TK), catch-up and cutover [TK, TX),
# clean-up [TX, T1] (mostly the delete at the source); prints three rates.
phase_rates() {
    qn "$1" -F ' ' -c "SELECT round((count(*) FILTER (WHERE w < to_timestamp($6)) / ($6 - $5))::numeric, 1),
                              round((count(*) FILTER (WHERE w >= to_timestamp($6) AND w < to_timestamp($7)) / greatest($7 - $6, 0.001))::numeric, 1),
                              round((count(*) FILTER (WHERE w >= to_timestamp($7)) / greatest($8 - $7, 0.001))::numeric, 1)
                         FROM (SELECT val::timestamptz AS w FROM accounts
                                WHERE tenant = '$2' AND id BETWEEN $3 AND $4) x
                        WHERE w >= to_timestamp($5) AND w <= to_timestamp($8)"
}
# The shard's rows, as the move selects them.
shard_query() { echo "SELECT tenant, id, val FROM public.accounts WHERE sharding.shard_of(tenant, 4) = $1"; }
# copy SHARD FROM TO TABLE: COPY pipe of the shard's rows into TABLE; prints ms.
copy() {
    local t0
    qn "$3" -c "TRUNCATE $4"
    t0=$(date +%s%N)
    qn "$2" -c "\\copy ($(shard_query "$1")) TO STDOUT" |
        qn "$3" -c 'SET session_replication_role = replica' -c "\\copy $4 FROM STDIN"
    echo $((($(date +%s%N) - t0) / 1000000))
}
# floor SHARD FROM TO: the engine's copy alone (_move_pull into the pipe's
# table, in one session: without a snapshot it copies in no parts) and a
# plain DELETE of those rows there (what the move's clean-up does at the
# source, in one session); prints "copy_ms delete_ms".
floor() {
    local t0 t1 t2
    qn "$3" -c 'TRUNCATE copy_target'
    t0=$(date +%s%N)
    qn "$3" -c 'SET session_replication_role = replica' \
        -c "SELECT sharding._move_pull('$2', NULL, 'copy_target', '{tenant,id,val}', \$q\$$(shard_query "$1")\$q\$)" >/dev/null
    t1=$(date +%s%N)
    qn "$3" -c "DELETE FROM copy_target WHERE sharding.shard_of(tenant, 4) = $1"
    t2=$(date +%s%N)
    echo "$(((t1 - t0) / 1000000)) $(((t2 - t1) / 1000000))"
}
# settle: the data nodes' tables vacuumed and their WAL checkpointed, so that
# the next timed step does not pay for the last one.
settle() {
    local n
    for n in n1 n2; do qn "$n" -c 'VACUUM accounts, copy_target, copy_guarded' -c 'CHECKPOINT'; done
}
# stray OTHER NODE: rows of shard OTHER on NODE (must be 0 where it is not owned).
stray() { qn "$2" -c "SELECT count(*) FROM accounts WHERE sharding.logical_shard('bench', tenant) = $1"; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
rate_p=(); rate_mp=(); small_w=(); big_w=(); big_t=(); copy_t=(); small_t=(); copyg_t=(); small_e=(); big_e=(); rate_r=(); rate_aa=(); big_c=()
big_s=(); big_x=(); pull_t=(); del_t=(); move_r=(); ph_c=(); ph_k=(); ph_x=(); verify_r=(); verify_t=(); verify_off=()
deferred_r=(); deferred_t=(); deferred_x=()
bad=0
for r in $(seq "$RUNS"); do
    # The big shard goes src -> dst without writers (timed), then back
    # under writers; the small one goes to the node that does not own it.
    src=$(owner 0)
    if [ "$src" = n1 ]; then dst=n2; else dst=n1; fi
    if [ "$(owner 1)" = n1 ]; then sdst=n2; else sdst=n1; fi
    # The other shard: 2 or 3, whichever the small shard's source owns.
    if [ "$(owner 2)" != "$sdst" ]; then other=2; else other=3; fi
    base=$((r * 100000000))
    settle
    c=$(copy 0 "$src" "$dst" copy_target)
    cg=$(copy 0 "$src" "$dst" copy_guarded)
    read -r pl dl < <(floor 0 "$src" "$dst")
    qn "$dst" -c 'TRUNCATE copy_target, copy_guarded'
    settle
    writers_start 1 "$other" "$base"
    read -r ts ws cs _ _ _ < <(move 1 "$sdst")
    read -r sw_s _ _ < <(writers_stop)
    # The big move's time without writers (as the pipe is measured).
    settle
    read -r tb _ cb sb xb _ < <(move 0 "$dst")
    # The same writers without a move, about as long as that move took,
    # the big move back under them (window and other-shard rate), and the
    # writers without a move again.
    if [ "$(owner 2)" = "$dst" ]; then back_other=2; else back_other=3; fi
    secs=$(awk -v t="$tb" 'BEGIN { printf "%.1f", t / 1000 }')
    settle
    writers_start 0 "$back_other" $((base + 20000000))
    sleep "$secs"
    read -r _ _ rate0 < <(writers_stop)
    # The same writers while the plain pipe copies the same rows out of
    # the node they write to (what any copy of the shard costs them).
    settle
    writers_start 0 "$back_other" $((base + 80000000))
    cw=$(copy 0 "$dst" "$src" copy_target)
    read -r _ _ ratep < <(writers_stop)
    qn "$src" -c 'TRUNCATE copy_target'
    settle
    writers_start 0 "$back_other" $((base + 40000000))
    read -r tw wb _ _ _ p0 pk px p1 < <(move 0 "$src")
    read -r sw_b refused_b rate1 < <(writers_stop)
    read -r rc rk rx < <(phase_rates "$dst" "${TENANT[$back_other]}" $((base + 50000000)) $((base + 59999999)) "$p0" "$pk" "$px" "$p1")
    settle
    writers_start 0 "$back_other" $((base + 60000000))
    sleep "$secs"
    read -r _ _ rate2 < <(writers_stop)
    n=$(stray "$back_other" "$src")
    [ "$n" = 0 ] || { echo "# run $r: $n rows of shard $back_other reached $src" >&2; bad=1; }
    echo "# run $r ($src -> $dst): pipe ${c} ms (into a table with a trigger ${cg} ms; the engine's copy alone ${pl} ms, a DELETE of those rows ${dl} ms); ${SMALL}-row move ${ts} ms (writer's window ${sw_s} ms, engine's ${ws} ms); ${BIG}-row move ${tb} ms: set-up ${sb} ms, copy ${cb} ms, clean-up ${xb} ms; back under writers ${tw} ms (writer's window ${sw_b} ms after ${refused_b} refusals, engine's ${wb} ms; other shard ${rate1} writes/s during, ${rate0} before and ${rate2} after without, ${ratep} during the pipe of ${cw} ms); load $(cut -d' ' -f1 /proc/loadavg)"
    small_w+=("$sw_s"); big_w+=("$sw_b"); small_e+=("$ws"); big_e+=("$wb"); big_t+=("$tb"); copy_t+=("$c"); small_t+=("$ts"); copyg_t+=("$cg")
    rate_r+=("$(awk -v d="$rate1" -v a="$rate0" -v b="$rate2" 'BEGIN { if (a + b > 0) printf "%.3f", 2 * d / (a + b); else print 0 }')")
    rate_aa+=("$(ratio "$rate2" "$rate0")")
    rate_p+=("$(awk -v d="$ratep" -v a="$rate0" -v b="$rate2" 'BEGIN { if (a + b > 0) printf "%.3f", 2 * d / (a + b); else print 0 }')")
    rate_mp+=("$(ratio "$rate1" "$ratep")")
    without() { awk -v d="$1" -v a="$rate0" -v b="$rate2" 'BEGIN { if (a + b > 0) printf "%.3f", 2 * d / (a + b); else print 0 }'; }
    ph_c+=("$(without "$rc")"); ph_k+=("$(without "$rk")"); ph_x+=("$(without "$rx")")
    echo "# run $r: other shard by phase of the move back, writes/s: set-up and copy $rc, catch-up and cutover $rk, clean-up $rx"
    big_c+=("$cb"); big_s+=("$sb"); big_x+=("$xb"); pull_t+=("$pl"); del_t+=("$dl"); move_r+=("$(ratio "$tb" "$c")")
    # The verification's cost: the big move once more with it (the
    # default) and back without it (sharding.move_verify = off).
    settle
    read -r tv vv < <(move_timed 0 "$dst")
    settle
    read -r to _ < <(PGOPTIONS="${PGOPTIONS:-} -c sharding.move_verify=off" move_timed 0 "$src")
    echo "# run $r: ${BIG}-row move with the verification ${tv} ms (the comparison ${vv} ms), without ${to} ms"
    verify_r+=("$(ratio "$tv" "$to")"); verify_t+=("$vv"); verify_off+=("$to")
    # The clean-up deferred (sharding.move_cleanup, item 6): the big move
    # src -> dst (the pipe's direction) without the verification, timed to
    # its return and to its journal row's 'done' (the cleaner's delete at
    # the source); the source must then hold none of the shard's rows.
    settle
    t0=$(date +%s%N)
    out=$(PGOPTIONS="${PGOPTIONS:-} -c sharding.move_verify=off -c sharding.move_cleanup=deferred -c client_min_messages=debug1" \
        qn coord -c "SELECT sharding.move_shard_online('bench', 0, '$dst')" 2>&1) || { echo "# run $r: the deferred move failed: $out" >&2; bad=1; }
    t1=$(date +%s%N)
    phases "$(awk -v n="$t0" 'BEGIN { printf "%.9f", n / 1e9 }')" "$out" $(((t1 - t0) / 1000000))
    for _ in $(seq 1200); do
        [ "$(qn coord -c "SELECT phase FROM sharding.move_journal WHERE map = 'bench' AND logical = 0 ORDER BY move DESC LIMIT 1")" = done ] && break
        sleep 0.05
    done
    t2=$(date +%s%N)
    n=$(qn "$src" -c "SELECT count(*) FROM accounts WHERE sharding.shard_of(tenant, 4) = 0")
    [ "$n" = 0 ] || { echo "# run $r: $n rows of the deferred move left at $src" >&2; bad=1; }
    echo "# run $r: ${BIG}-row move without the verification, clean-up deferred: returned in $(((t1 - t0) / 1000000)) ms, cleaned $(((t2 - t0) / 1000000)) ms after the call (pipe ${c} ms)"
    deferred_r+=("$(ratio $(((t1 - t0) / 1000000)) "$c")"); deferred_t+=("$(((t1 - t0) / 1000000))"); deferred_x+=("$(((t2 - t1) / 1000000))")
done
med() { printf '%s\n' "$@" | median; }
mw_s=$(med "${small_w[@]}"); mw_b=$(med "${big_w[@]}"); me_s=$(med "${small_e[@]}"); me_b=$(med "${big_e[@]}")
mt_b=$(med "${big_t[@]}"); mt_s=$(med "${small_t[@]}"); mc=$(med "${copy_t[@]}"); mcg=$(med "${copyg_t[@]}")
mr=$(med "${rate_r[@]}"); maa=$(med "${rate_aa[@]}"); mcb=$(med "${big_c[@]}"); msb=$(med "${big_s[@]}"); mxb=$(med "${big_x[@]}")
mrp=$(med "${rate_p[@]}"); mrmp=$(med "${rate_mp[@]}")
mpl=$(med "${pull_t[@]}"); mdl=$(med "${del_t[@]}"); mmr=$(med "${move_r[@]}")
echo "move time: ${BIG}-row move ${mt_b} ms, COPY pipe ${mc} ms, ratio $(ratio "$mt_b" "$mc") (target <= 1.2; median of the per-run ratios $(ratio "$mmr" 1)); against the pipe into a table with a BEFORE ROW trigger ${mcg} ms: $(ratio "$mt_b" "$mcg"); ${SMALL}-row move ${mt_s} ms"
echo "where the move's time goes: set-up ${msb} ms, copy ${mcb} ms ($(ratio "$mcb" "$mc") of the pipe), clean-up ${mxb} ms, the rest (catch-up, cutover) $((mt_b - msb - mcb - mxb)) ms (medians of each)"
echo "floor in one session: the engine's copy alone (_move_pull, one session: no snapshot, so no parts) ${mpl} ms ($(ratio "$mpl" "$mc") of the pipe) + a plain DELETE of the same rows ${mdl} ms = $(ratio $((mpl + mdl)) "$mc") of the pipe"
echo "refusal window (writer's longest write): ${SMALL}-row shard ${mw_s} ms, ${BIG}-row shard ${mw_b} ms, ratio $(ratio "$mw_b" "$mw_s") (target <= 2); engine's freeze-to-follow ${me_s} ms and ${me_b} ms, ratio $(ratio "$me_b" "$me_s")"
echo "other shards: write rate during the move / without (mean of just before and just after), median of per-run ratios $(ratio "${mr}" 1) (target >= 0.9); after / before without a move: $(ratio "$maa" 1)"
echo "other shards by phase of the move, during / without: set-up and copy $(ratio "$(med "${ph_c[@]}")" 1), catch-up and cutover $(ratio "$(med "${ph_k[@]}")" 1), clean-up (mostly the delete) $(ratio "$(med "${ph_x[@]}")" 1) (medians of per-run ratios)"
echo "other shards during the plain pipe of the same rows out of their node: pipe / without $(ratio "$mrp" 1); move / pipe $(ratio "$mrmp" 1) (medians of per-run ratios)"
echo "rows/s: $(awk -v n="$BIG" -v t="$mt_b" 'BEGIN { printf "%.0f", n / t * 1000 }') over the whole move, $(awk -v n="$BIG" -v t="$mcb" 'BEGIN { printf "%.0f", n / t * 1000 }') in its copy phase (${mcb} ms); the pipe $(awk -v n="$BIG" -v t="$mc" 'BEGIN { printf "%.0f", n / t * 1000 }') (Citus quotes ~2.6 M rows/s)"
echo "verification (sharding.move_verify): ${BIG}-row move with / without it $(ratio "$(med "${verify_r[@]}")" 1) (median of per-run ratios); the comparison itself $(med "${verify_t[@]}") ms; the move without it / the pipe $(ratio "$(med "${verify_off[@]}")" "$mc")"
echo "clean-up deferred (sharding.move_cleanup = deferred, verification off): the ${BIG}-row move returns in $(med "${deferred_t[@]}") ms, / the pipe $(ratio "$(med "${deferred_r[@]}")" 1) (median of per-run ratios; target <= 1.2); the cleaner done $(med "${deferred_x[@]}") ms after the return"
echo "medians of $RUNS runs; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
exit "$bad"
