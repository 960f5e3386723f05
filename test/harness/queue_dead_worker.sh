#!/usr/bin/env bash
# A dead worker's jobs come back by themselves. Worker A claims a batch
# with a 1-second lease (the claim commits) and then hangs holding nothing
# but the lease; its backend is killed with pg_terminate_backend. Worker D
# holds other jobs with a long lease. Once A's lease lapses, worker B
# reclaims exactly A's jobs (attempts = 2), never D's; A's stale
# completions are refused by the fence.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_queue_dead
. test/lib/tap.sh
harness_tmp

echo "1..10"
queue_db jobs || exit 1
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 1
INSERT INTO jobs (key, created) SELECT 'job-' || g, now() - (100 - g) * interval '1 second' FROM generate_series(1, 30) g;
SQL

# D: a live worker with a long lease on the 10 oldest jobs.
q "SELECT array_agg(id ORDER BY id) FROM sharding.claim(NULL::jobs, 'D', 10, '1 hour')" >"$TMP/d_ids"

# A: claims 10 with a 1-second lease (committed), prints them, then hangs.
PGAPPNAME=worker_a psql -XqAt -v ON_ERROR_STOP=1 >"$TMP/a_out" 2>"$TMP/a_err" <<'SQL' &
SELECT array_agg(id ORDER BY id) FROM sharding.claim(NULL::jobs, 'A', 10, '1 second');
\o /dev/null
SELECT pg_sleep(120);
SQL
a_pid=$!
for _ in $(seq 1 100); do
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'worker_a' AND wait_event = 'PgSleep'")" = 1 ] && break
    sleep 0.1
done
a_ids=$(head -1 "$TMP/a_out")
ok "$(q "SELECT count(*) = 10 AND bool_and(owner = 'A' AND status = 'processing') FROM jobs WHERE id = ANY ('$a_ids')")" \
   "worker A holds a batch of 10 ($a_ids)"

ok "$(q "SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'worker_a'")" \
   "worker A's backend is terminated"
wait "$a_pid"
a_rc=$?
ok "$([ "$a_rc" -ne 0 ] && echo t || echo "rc $a_rc")" "worker A's session died"
ok "$(q "SELECT count(*) = 10 AND bool_and(owner = 'A' AND status = 'processing') FROM jobs WHERE id = ANY ('$a_ids')")" \
   "its jobs stay leased to A until the lease lapses"

# Wait for A's lease to lapse (1 second after its claim).
for _ in $(seq 1 50); do
    [ "$(q "SELECT bool_and(claim_expires < now()) FROM jobs WHERE id = ANY ('$a_ids')")" = t ] && break
    sleep 0.1
done
b_ids=$(q "SELECT array_agg(id ORDER BY id) FROM sharding.claim(NULL::jobs, 'B', 10, '1 hour')")
ok "$(q "SELECT '$b_ids'::bigint[] = '$a_ids'::bigint[]")" "worker B reclaims exactly A's jobs ($b_ids)"
ok "$(q "SELECT bool_and(attempts = 2 AND owner = 'B' AND claim_expires > now() + interval '59 minutes')
           FROM jobs WHERE id = ANY ('$a_ids')")" "attempts shows the second claim; B holds a fresh lease"
ok "$(q "SELECT bool_and(owner = 'D' AND attempts = 1) FROM jobs WHERE id = ANY ('$(cat "$TMP/d_ids")')")" \
   "D's live leases were not touched"
ok "$(q "SELECT bool_and(NOT sharding.complete('jobs', id, 'A') AND NOT sharding.extend_lease('jobs', id, 'A', '1 hour')
                         AND NOT sharding.fail('jobs', id, 'A') AND NOT sharding.complete('jobs', id, 'B', 1))
           FROM unnest('$a_ids'::bigint[]) AS id")" "A's late calls and a stale attempt are refused"
ok "$(q "SELECT sharding.complete('jobs', '$b_ids'::bigint[], 'B') = 10")" "B completes the reclaimed batch"
ok "$(q "SELECT count(*) FILTER (WHERE status = 'done') = 10 AND count(*) FILTER (WHERE status = 'pending') = 10
                AND count(*) FILTER (WHERE owner = 'D') = 10 FROM jobs")" "queue state: 10 done, 10 with D, 10 pending"

dropdb "$PGDATABASE"
[ "$failures" -eq 0 ]
