-- One demo worker (demo/workers.sh starts four). Its name is its
-- application_name. It loops: claim up to 5 jobs with a 3-second lease,
-- commit the claim, work on each job and complete it with the fencing token
-- of this claim (attempts), committing each completion; it stops when no job
-- is left undone. Worker w4 hangs after its first claim, holding its lease,
-- until demo/workers.sh kills its backend.
DO $$
DECLARE
    me text := pg_catalog.current_setting('application_name');
    ids bigint[];
    attempts integer[];
    i integer;
BEGIN
    LOOP
        SELECT COALESCE(array_agg(c.id ORDER BY c.id), '{}'), COALESCE(array_agg(c.attempts ORDER BY c.id), '{}')
          INTO ids, attempts
          FROM sharding.claim(NULL::jobs, me, 5, '3 seconds') AS c;
        COMMIT;
        IF cardinality(ids) = 0 THEN
            EXIT WHEN NOT EXISTS (SELECT FROM jobs WHERE status <> 'done');
            PERFORM pg_sleep(0.2);  -- jobs still leased to someone: wait for them
            CONTINUE;
        END IF;
        IF me = 'w4' THEN
            PERFORM pg_sleep(600);  -- stuck: killed from outside, lease still held
        END IF;
        FOR i IN 1 .. cardinality(ids) LOOP
            PERFORM pg_sleep(0.01);  -- the work
            IF sharding.complete('jobs', ids[i], me, attempts[i]) THEN
                INSERT INTO job_log (id, worker, attempt) VALUES (ids[i], me, attempts[i]);
            END IF;
            COMMIT;
        END LOOP;
    END LOOP;
END
$$;
