#!/usr/bin/env bash
# Section 3 of the demo, run by demo/demo.sql: four concurrent workers
# (demo/worker.sql) drain the queue `jobs`; w4 is killed while it holds a
# lease. Uses the connection settings (PGHOST, PGPORT, ...) psql runs with.
set -uo pipefail
cd "$(dirname "$0")/.."
q() { psql -XAtq -v ON_ERROR_STOP=1 -c "$1"; }

pids=()
for w in w1 w2 w3 w4; do
    PGAPPNAME=$w psql -Xq -f demo/worker.sql >/dev/null 2>&1 &
    pids+=($!)
done
echo "   started w1 w2 w3 w4 (psql processes ${pids[*]})"

# Wait for w4 to hold its first lease, then kill its backend.
for _ in $(seq 1 100); do
    held=$(q "SELECT count(*) FROM jobs WHERE owner = 'w4' AND status = 'processing'")
    [ "${held:-0}" -gt 0 ] && break
    sleep 0.1
done
ids=$(q "SELECT string_agg(id::text, ',' ORDER BY id) FROM jobs WHERE owner = 'w4' AND status = 'processing'")
q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'w4'" >/dev/null
echo "   w4 claimed jobs $ids and hung; its backend is killed now, lease still running"
left=$(q "SELECT count(*) FROM jobs WHERE status <> 'done'")
echo "   jobs not yet done at that moment: $left"

start=$(date +%s.%N)
status=0
for p in "${pids[@]:0:3}"; do wait "$p" || status=1; done
wait "${pids[3]}" 2>/dev/null  # w4: killed, its exit status is expected to be an error
secs=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
echo "   w1 w2 w3 finished ${secs}s later (the dead worker's lease had to run out first)"
exit $status
