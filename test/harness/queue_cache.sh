#!/usr/bin/env bash
# The per-backend plan cache follows changes made by other sessions: a
# worker that has already prepared its claim sees (a) a max_attempts set by
# another session and (b) a column added by another session, on its next
# call, without reconnecting.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_queue_cache

. test/lib/tap.sh
wait_for() {  # wait_for STEP: until the worker has reached STEP
    for _ in $(seq 1 200); do
        [ "$(q "SELECT step FROM flag")" = "$1" ] && return 0
        sleep 0.05
    done
    return 1
}

echo "1..5"
fresh_db || exit 1
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 1
CREATE EXTENSION sharding;
SELECT sharding.create_queue('jobs');
CREATE TABLE flag (step text);
INSERT INTO flag VALUES ('start');
CREATE TABLE seen (step text, ids bigint[], has_colour boolean);
-- Job 1: an expired lease that has used 3 attempts. Jobs 2..4: pending.
INSERT INTO jobs (id, key, status, owner, claim_expires, attempts, created)
VALUES (1, 'tired', 'processing', 'dead', now() - interval '1 minute', 3, now() - interval '1 hour');
INSERT INTO jobs (id, key, created) SELECT g, 'job-' || g, now() - (10 - g) * interval '1 minute' FROM generate_series(2, 4) g;
SQL

# The worker: one connection throughout. Claims once (job 1 comes back:
# no max_attempts yet, so this also builds its cache), then waits for the
# other session between claims.
psql -Xq -v ON_ERROR_STOP=1 -c "
DO \$\$
BEGIN
    INSERT INTO public.seen SELECT 'first', array_agg(id), false FROM sharding.claim(NULL::public.jobs, 'w', 1, '1 second');
    UPDATE public.flag SET step = 'claimed';
    COMMIT;
    LOOP
        EXIT WHEN (SELECT step FROM public.flag) = 'limit set';
        PERFORM pg_sleep(0.05);
        COMMIT;
    END LOOP;
    INSERT INTO public.seen SELECT 'after limit', array_agg(id), false FROM sharding.claim(NULL::public.jobs, 'w', 10, '1 hour');
    UPDATE public.flag SET step = 'claimed again';
    COMMIT;
    LOOP
        EXIT WHEN (SELECT step FROM public.flag) = 'column added';
        PERFORM pg_sleep(0.05);
        COMMIT;
    END LOOP;
    INSERT INTO public.seen SELECT 'after alter', array_agg(c.id), bool_and(to_jsonb(c) ? 'colour')
      FROM sharding.claim(NULL::public.jobs, 'w', 10, '1 hour') AS c;
    COMMIT;
END \$\$;" &
worker=$!

wait_for claimed || echo "# worker never claimed"
ok "$(q "SELECT ids = '{1}' FROM seen WHERE step = 'first'")" "before max_attempts the exhausted job is reclaimed (attempt 4)"
# Expire it again, then limit the queue to 4 attempts from this session.
q "UPDATE jobs SET claim_expires = now() - interval '1 second' WHERE id = 1" >/dev/null
q "SELECT sharding.set_max_attempts('jobs', 4)" >/dev/null
q "UPDATE flag SET step = 'limit set'" >/dev/null
wait_for 'claimed again' || echo "# worker never claimed again"
ok "$(q "SELECT ids = '{2,3,4}' FROM seen WHERE step = 'after limit'")" \
   "the worker's next claim applies the new max_attempts (job 1 not handed out)"
ok "$(q "SELECT status = 'failed' AND attempts = 4 FROM jobs WHERE id = 1")" "and moves the exhausted job to failed"

q "ALTER TABLE jobs ADD COLUMN colour text DEFAULT 'red'" >/dev/null
q "INSERT INTO jobs (id, key) VALUES (5, 'new')" >/dev/null
q "UPDATE flag SET step = 'column added'" >/dev/null
wait "$worker"
ok "$([ $? -eq 0 ] && echo t || echo f)" "the worker ran to the end"
ok "$(q "SELECT ids = '{5}' AND has_colour FROM seen WHERE step = 'after alter'")" \
   "after another session's ALTER TABLE the worker's claim returns the new column"

dropdb "$PGDATABASE"
[ "$failures" -eq 0 ]
