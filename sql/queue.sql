-- Claiming work (docs/queue.md). Single-session behaviour; concurrency, dead
-- workers and shard-scoped workers are in test/harness/queue_*.sh.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- create_queue: unqualified, schema-qualified and quoted names.
CREATE SCHEMA "Work Q";
SELECT sharding.create_queue('jobs') AS plain,
       sharding.create_queue('"Work Q"."Big Jobs"') AS quoted,
       sharding.create_queue(queue => 'public.other') AS named;
SELECT pg_typeof(sharding.create_queue('"Work Q".second')) AS result_type;
SELECT attname, format_type(atttypid, atttypmod) AS type, attnotnull, pg_get_expr(adbin, adrelid) AS default
  FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
 WHERE attrelid = 'jobs'::regclass AND attnum > 0 ORDER BY attnum;
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indrelid = 'jobs'::regclass ORDER BY 1::text;
SELECT pg_temp.err($$SELECT sharding.create_queue('jobs')$$) AS exists,
       pg_temp.err($$SELECT sharding.create_queue('a.b.c')$$) AS three_parts,
       pg_temp.err($$SELECT sharding.create_queue(NULL)$$) AS null_name,
       pg_temp.err($$SELECT sharding.create_queue('no_such_schema.q')$$) AS no_schema;
SELECT pg_temp.err($$INSERT INTO jobs (status) VALUES ('paused')$$) AS status_check;

-- claim: oldest created first (here the highest ids), at most batch,
-- leased to the worker.
INSERT INTO jobs (id, key, created)
SELECT g, 'k' || g, timestamptz '2024-01-01' - g * interval '1 minute' FROM generate_series(1, 10) g;
SELECT id, key, status, owner, attempts, claim_expires - now() AS lease
  FROM sharding.claim(NULL::jobs, 'w1', 3);
-- The result is the table's row type, usable as such.
SELECT pg_typeof(c) AS row_type, c.id FROM sharding.claim(NULL::jobs, 'w1', 1, '1 hour') AS c;
SELECT id, key, owner, claim_expires - now() AS lease
  FROM sharding.claim(queue => NULL::jobs, worker => 'w2', batch => 2, lease => '30 seconds');
SELECT status, owner, count(*), min(id), max(id) FROM jobs GROUP BY 1, 2 ORDER BY 1, 2;
-- The default batch is 50: everything left.
SELECT count(*) AS rest, min(id), max(id), bool_and(owner = 'w3') AS all_w3
  FROM sharding.claim(NULL::jobs, 'w3');
SELECT count(*) AS nothing_left FROM sharding.claim(NULL::jobs, 'w4', 5);
-- A large (TOASTed) payload comes back whole.
INSERT INTO jobs (id, key, payload)
SELECT 50, 'big', jsonb_build_object('blob', string_agg(md5(g::text), '')) FROM generate_series(1, 5000) g;
SELECT id, pg_column_size(payload) > 8000 AS large,
       md5(payload::text) = (SELECT md5(payload::text) FROM jobs WHERE id = 50) AS intact
  FROM sharding.claim(NULL::jobs, 'big', 5);
SELECT sharding.complete('jobs', 50, 'big') AS big_done;

-- complete, with and without the attempt fence.
SELECT sharding.complete('jobs', 10, 'w1') AS own,
       sharding.complete('jobs', 10, 'w1') AS again,
       sharding.complete('jobs', 9, 'w2') AS not_owner,
       sharding.complete('jobs', 9, 'w1', 2) AS stale_attempt,
       sharding.complete(queue => 'jobs', id => 9, worker => 'w1', attempt => 1) AS right_attempt,
       sharding.complete('jobs', 999, 'w1') AS no_such_job;
-- The batch form: only rows passing the fence count; duplicates count once.
SELECT sharding.complete('jobs', ARRAY[8, 8, 7, 6, 999], 'w1') AS batch_of_w1,
       sharding.complete(queue => 'jobs', ids => '{}', worker => 'w1') AS empty;
SELECT id, status, owner FROM jobs WHERE id >= 5 ORDER BY id DESC;

-- fail: back to pending with owner and lease cleared, or failed.
SELECT sharding.fail('jobs', 6, 'w2') AS retry_default,
       sharding.fail('jobs', 4, 'w3', retry => false) AS give_up,
       sharding.fail('jobs', 4, 'w3') AS already_failed,
       sharding.fail('jobs', 3, 'w2') AS not_owner,
       sharding.fail('jobs', 3, 'w3', true, 2) AS stale_attempt,
       sharding.fail(queue => 'jobs', id => 2, worker => 'w3', retry => true, attempt => 1) AS named;
SELECT id, status, owner, claim_expires IS NULL AS no_lease, attempts FROM jobs WHERE id <= 6 ORDER BY id DESC;

-- extend_lease.
SELECT sharding.extend_lease('jobs', 5, 'w2', '2 hours') AS own,
       sharding.extend_lease('jobs', 5, 'w1', '3 hours') AS not_owner,
       sharding.extend_lease('jobs', 5, 'w2', '3 hours', attempt => 2) AS stale_attempt,
       sharding.extend_lease('jobs', 6, 'w2', '3 hours') AS pending_job;
SELECT id, claim_expires - now() BETWEEN interval '1 hour 59 minutes' AND interval '2 hours' AS two_hours
  FROM jobs WHERE id IN (5, 6) ORDER BY id;
SELECT sharding.extend_lease(queue => 'jobs', id => 5, worker => 'w2', lease => '0', attempt => 1) AS named_zero;
SELECT id, claim_expires <= now() AS lapsed FROM jobs WHERE id = 5;

-- Fencing: a lease lapses, another worker reclaims the job (attempt 2);
-- the first worker's complete, fail and extend_lease all fail and change
-- nothing, and so does the new owner with the stale attempt number.
TRUNCATE jobs;
INSERT INTO jobs (id, key) VALUES (100, 'fenced');
SELECT id, owner, attempts FROM sharding.claim(NULL::jobs, 'slow', 1, '1 hour');
UPDATE jobs SET claim_expires = now() - interval '1 second' WHERE id = 100;  -- the lease lapses
SELECT id, owner, attempts FROM sharding.claim(NULL::jobs, 'fast', 1, '1 hour');
SELECT sharding.complete('jobs', 100, 'slow') AS complete_slow,
       sharding.fail('jobs', 100, 'slow') AS fail_slow,
       sharding.extend_lease('jobs', 100, 'slow', '1 day') AS extend_slow,
       sharding.complete('jobs', ARRAY[100], 'slow') AS complete_many_slow,
       sharding.complete('jobs', 100, 'fast', 1) AS complete_stale,
       sharding.fail('jobs', 100, 'fast', true, 1) AS fail_stale,
       sharding.extend_lease('jobs', 100, 'fast', '1 day', 1) AS extend_stale;
SELECT status, owner, attempts, claim_expires - now() < interval '2 hours' AS lease_untouched FROM jobs;
SELECT sharding.complete('jobs', 100, 'fast', 2) AS complete_fast;
SELECT status, owner, attempts FROM jobs;

-- A live lease is never reclaimed; an expired one comes back in created
-- order together with pending rows.
TRUNCATE jobs;
INSERT INTO jobs (id, key, created) VALUES (1, 'a', '2024-01-01'), (2, 'b', '2024-01-02'),
    (3, 'c', '2024-01-03'), (4, 'd', '2024-01-04');
SELECT count(*) FROM sharding.claim(NULL::jobs, 'x', 2, '1 hour');  -- 1 and 2
UPDATE jobs SET claim_expires = now() - interval '1 minute' WHERE id = 2;
SELECT id, owner, attempts FROM sharding.claim(NULL::jobs, 'y', 2, '1 hour') ORDER BY created;
SELECT id, status, owner, attempts FROM jobs ORDER BY id;

-- Argument errors: 22023 naming the value; nothing changes.
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'w', 0)$$) AS batch_zero,
       pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'w', -5)$$) AS batch_negative,
       pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'w', NULL)$$) AS batch_null,
       pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'w', 1, '-1 second')$$) AS lease_negative,
       pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'w', 1, '1 day -25 hours')$$) AS lease_mixed,
       pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'w', 1, NULL)$$) AS lease_null,
       pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, NULL)$$) AS worker_null;
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::integer, 'w')$$) AS not_a_row,
       pg_temp.err($$SELECT * FROM sharding.claim(NULL::int4range, 'w')$$) AS not_a_table_row;
SELECT pg_temp.err($$SELECT sharding.extend_lease('jobs', 3, 'y', '-1 minute')$$) AS extend_negative,
       pg_temp.err($$SELECT sharding.extend_lease('jobs', 3, 'y', NULL)$$) AS extend_null,
       pg_temp.err($$SELECT sharding.complete('jobs', NULL::bigint, 'y')$$) AS id_null,
       pg_temp.err($$SELECT sharding.complete('jobs', 3, NULL)$$) AS complete_worker_null,
       pg_temp.err($$SELECT sharding.complete('jobs', NULL::bigint[], 'y')$$) AS ids_null,
       pg_temp.err($$SELECT sharding.fail('jobs', 3, 'y', NULL)$$) AS retry_null,
       pg_temp.err($$SELECT sharding.fail(NULL, 3, 'y')$$) AS queue_null;
SELECT pg_temp.err($$SELECT sharding.complete('no_such_table', 3, 'y')$$) AS unknown_table,
       pg_temp.err($$SELECT sharding.complete(12345678::oid::regclass, 3, 'y')$$) AS dropped_oid;
SELECT id, status, owner, attempts FROM jobs ORDER BY id;
-- Called in the select list, claim returns composite values.
SELECT (sharding.claim(NULL::jobs, 'in_select_list')).id;
SELECT id, status, owner, attempts FROM jobs WHERE id = 4;

-- A user's own table: other column order, extra and dropped columns, no
-- attempts column, a primary key named differently.
CREATE TABLE my_tasks (
    note text,
    created timestamptz NOT NULL DEFAULT now(),
    gone integer,
    id bigint NOT NULL,
    owner text,
    status text NOT NULL DEFAULT 'pending',
    claim_expires timestamptz,
    tenant integer,
    CONSTRAINT my_tasks_id_key UNIQUE (id)
);
ALTER TABLE my_tasks DROP COLUMN gone;
INSERT INTO my_tasks (id, note, tenant, created)
SELECT g, 'task ' || g, g % 3, timestamptz '2024-06-01' + g * interval '1 second' FROM generate_series(1, 6) g;
SELECT to_jsonb(c) - 'claim_expires' AS claimed, claim_expires - now() AS lease
  FROM sharding.claim(NULL::my_tasks, 'me', 2, '10 minutes') AS c ORDER BY id;
SELECT sharding.complete('my_tasks', 1, 'me') AS done,
       sharding.fail('my_tasks', 2, 'me', false) AS failed;
SELECT pg_temp.err($$SELECT sharding.complete('my_tasks', 1, 'me', 1)$$) AS attempt_without_column;
-- The cached plans follow the table's changes.
ALTER TABLE my_tasks ADD COLUMN priority integer DEFAULT 7;
SELECT id, note, priority FROM sharding.claim(NULL::my_tasks, 'me', 1);
ALTER TABLE my_tasks DROP COLUMN note;
SELECT to_jsonb(c) - 'claim_expires' AS claimed FROM sharding.claim(NULL::my_tasks, 'me', 1) AS c;
ALTER TABLE my_tasks ADD COLUMN attempts integer NOT NULL DEFAULT 0;
SELECT id, attempts FROM sharding.claim(NULL::my_tasks, 'me', 1);
SELECT sharding.complete('my_tasks', 5, 'me', 1) AS with_attempts_now;
-- A missing or wrong-typed required column: 22023 naming it.
ALTER TABLE my_tasks DROP COLUMN claim_expires;
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::my_tasks, 'me')$$) AS no_claim_expires;
ALTER TABLE my_tasks ADD COLUMN claim_expires timestamp;
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::my_tasks, 'me')$$) AS wrong_type;
ALTER TABLE my_tasks ALTER COLUMN claim_expires TYPE timestamptz;
ALTER TABLE my_tasks ALTER COLUMN attempts TYPE bigint;
SELECT pg_temp.err($$SELECT sharding.complete('my_tasks', 1, 'me')$$) AS attempts_bigint;
ALTER TABLE my_tasks ALTER COLUMN attempts TYPE integer;
ALTER TABLE my_tasks DROP CONSTRAINT my_tasks_id_key;
SELECT pg_temp.err($$SELECT sharding.complete('my_tasks', 1, 'me')$$) AS no_unique_id;
CREATE UNIQUE INDEX ON my_tasks (id) WHERE tenant = 0;
SELECT pg_temp.err($$SELECT sharding.complete('my_tasks', 1, 'me')$$) AS partial_unique_id;
ALTER TABLE my_tasks ADD PRIMARY KEY (id);
SELECT pg_temp.err($$SELECT sharding.complete('my_tasks', 1, 'me')$$) AS primary_key_again;
CREATE VIEW my_view AS SELECT * FROM my_tasks;
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::my_view, 'me')$$) AS a_view;
DROP VIEW my_view;
-- Dropped and recreated under the same name: the cache notices.
DROP TABLE my_tasks;
CREATE TABLE my_tasks (id bigint PRIMARY KEY, status text, owner text, claim_expires timestamptz,
                       created timestamptz DEFAULT now(), colour text);
INSERT INTO my_tasks (id, status, colour) VALUES (1, 'pending', 'red');
SELECT id, status, owner, colour FROM sharding.claim(NULL::my_tasks, 'me');
DROP TABLE my_tasks;

-- claim_shards: only rows of the worker's shards.
TRUNCATE jobs;
INSERT INTO jobs (key) SELECT 'tenant-' || g FROM generate_series(1, 200) g;
SELECT count(*) AS claimed,
       bool_and(sharding.shard_of(key, 8) = ANY ('{1,5}')) AS all_in_shards,
       count(*) = (SELECT count(*) FROM jobs WHERE sharding.shard_of(key, 8) IN (1, 5)) AS all_of_them
  FROM sharding.claim_shards(NULL::jobs, 'sw', '{1,5}', 8, 1000);
SELECT count(*) AS limited FROM sharding.claim_shards(queue => NULL::jobs, worker => 'sw2', shards => '{0}',
    shard_count => 8, batch => 3, lease => '1 minute', key_column => 'key');
-- Another key column and type.
ALTER TABLE jobs ADD COLUMN tenant_id bigint;
UPDATE jobs SET tenant_id = id WHERE status = 'pending';
SELECT count(*) > 0 AS some, bool_and(sharding.shard_of(tenant_id, 4) = 2) AS all_shard_2
  FROM sharding.claim_shards(NULL::jobs, 'sw3', '{2}', 4, 1000, key_column => 'tenant_id');
SELECT pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', '{0}', 0)$$) AS count_zero,
       pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', '{8}', 8)$$) AS shard_too_big,
       pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', '{-1}', 8)$$) AS shard_negative,
       pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', '{1,NULL}', 8)$$) AS shard_null,
       pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', NULL, 8)$$) AS shards_null;
SELECT pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', '{0}', 8, key_column => 'nope')$$) AS no_key,
       pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', '{0}', 8, key_column => 'payload')$$) AS jsonb_key,
       pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w', '{0}', 8, 0)$$) AS batch_zero;
-- A multi-dimensional shards array is refused (22023), not flattened, by
-- claim_shards and claim_ordered alike, and nothing is claimed (pending
-- jobs of those shards are left).
SELECT pg_temp.err($$SELECT * FROM sharding.claim_shards(NULL::jobs, 'w2d', '{{0,1},{2,3}}', 8)$$) AS shards_2d,
       pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::jobs, 'w2d', shards => '{{0,1},{2,3}}', shard_count => 8)$$)
           AS ordered_shards_2d;
SELECT count(*) FILTER (WHERE owner = 'w2d') AS claimed_2d,
       count(*) FILTER (WHERE status = 'pending' AND sharding.shard_of(key, 8) IN (0, 1, 2, 3)) > 0 AS pending_left
  FROM jobs;
ALTER TABLE jobs DROP COLUMN tenant_id;

-- max_attempts (extra): an expired job that used up its attempts goes to
-- failed at the next claim instead of to a worker; so does a retried one.
TRUNCATE jobs;
INSERT INTO jobs (id, key, created) VALUES (1, 'a', '2024-01-01'), (2, 'b', '2024-01-02'), (3, 'c', '2024-01-03');
SELECT sharding.set_max_attempts('jobs', 2);
SELECT * FROM sharding.queue_settings;
SELECT count(*) FROM sharding.claim(NULL::jobs, 'm1', 3, '1 hour');
UPDATE jobs SET claim_expires = now() - interval '1 second';
SELECT id, attempts FROM sharding.claim(NULL::jobs, 'm2', 1, '1 hour');  -- attempt 2 of job 1
SELECT sharding.fail('jobs', 1, 'm2') AS retried_at_limit;
UPDATE jobs SET claim_expires = now() - interval '1 second' WHERE status = 'processing';
UPDATE jobs SET attempts = 2 WHERE id = 3;
SELECT id, attempts FROM sharding.claim(NULL::jobs, 'm3', 5, '1 hour');  -- job 2 only
SELECT id, status, owner, attempts FROM jobs ORDER BY id;
SELECT sharding.set_max_attempts('jobs', NULL);
SELECT count(*) AS settings_left FROM sharding.queue_settings;
SELECT pg_temp.err($$SELECT sharding.set_max_attempts('jobs', 0)$$) AS zero,
       pg_temp.err($$SELECT sharding.set_max_attempts(NULL, 3)$$) AS null_queue;
CREATE TABLE no_attempts (id bigint PRIMARY KEY, status text, owner text, claim_expires timestamptz, created timestamptz);
SELECT pg_temp.err($$SELECT sharding.set_max_attempts('no_attempts', 3)$$) AS no_attempts_column;
DROP TABLE no_attempts;

-- queue_stats and enqueue (extras).
TRUNCATE jobs;
SELECT sharding.enqueue('jobs', 'e1', '{"n": 1}') > 0 AS enqueued,
       sharding.enqueue(queue => 'jobs', key => 'e2') > 0 AS named;
INSERT INTO jobs (key, status, created) VALUES ('old', 'pending', now() - interval '1 hour'),
    ('d', 'done', now()), ('f', 'failed', now()), ('x', 'processing', now());
UPDATE jobs SET claim_expires = now() - interval '1 minute' WHERE status = 'processing';
SELECT pending, processing, expired, done, failed, oldest_pending_age >= interval '1 hour' AS age_ok
  FROM sharding.queue_stats('jobs');
SELECT key, payload FROM jobs WHERE key LIKE 'e%' ORDER BY key;
SELECT sharding.queue_stats(NULL) IS NULL AS strict;

-- Claims stay index scans with many done rows: the statement claim
-- prepares, as a generic plan (what a kept plan becomes) and a custom one.
TRUNCATE jobs;
INSERT INTO jobs (key, status, created) SELECT 'd' || g, 'done', now() - interval '1 day' FROM generate_series(1, 50000) g;
INSERT INTO jobs (key) SELECT 'p' || g FROM generate_series(1, 100) g;
ANALYZE jobs;
SELECT format('PREPARE claim_stmt(text, integer, interval, integer) AS %s', sharding._queue_sql('jobs', 'claim')) \gexec
SET plan_cache_mode = force_generic_plan;
-- The scan nodes of a plan, one per line.
CREATE FUNCTION pg_temp.scans(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    line text;
BEGIN
    FOR line IN EXECUTE q LOOP
        IF line ~ 'Scan' THEN
            RETURN NEXT btrim(regexp_replace(line, '^[ ->]*', ''));
        END IF;
    END LOOP;
END $$;
SELECT pg_temp.scans($$EXPLAIN (COSTS OFF) EXECUTE claim_stmt('w', 10, '5 minutes', NULL)$$) AS generic;
SET plan_cache_mode = force_custom_plan;
SELECT pg_temp.scans($$EXPLAIN (COSTS OFF) EXECUTE claim_stmt('w', 10, '5 minutes', 3)$$) AS custom;
-- With max_attempts the claim also moves exhausted expired jobs to failed:
-- one more index path.
SELECT sharding.set_max_attempts('jobs', 3);
SELECT format('PREPARE claim_max(text, integer, interval, integer) AS %s', sharding._queue_sql('jobs', 'claim')) \gexec
SET plan_cache_mode = force_generic_plan;
SELECT pg_temp.scans($$EXPLAIN (COSTS OFF) EXECUTE claim_max('w', 10, '5 minutes', 3)$$) AS generic_max_attempts;
SELECT sharding.set_max_attempts('jobs', NULL);
RESET plan_cache_mode;
DEALLOCATE claim_stmt;
DEALLOCATE claim_max;
-- And the real calls scan no table sequentially.
SELECT pg_stat_force_next_flush();
SELECT seq_scan AS seq_before FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass \gset
SELECT count(*) FROM sharding.claim(NULL::jobs, 'w', 10);
SELECT sharding.complete('jobs', array_agg(id), 'w') FROM sharding.claim(NULL::jobs, 'w', 10);
SELECT pg_stat_force_next_flush();
SELECT seq_scan - :seq_before AS seq_scans FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass;

-- Privileges: SECURITY INVOKER, so the caller's rights on the table apply.
CREATE ROLE queue_reader;
CREATE ROLE queue_worker;
GRANT SELECT ON jobs TO queue_reader;
GRANT SELECT, UPDATE ON jobs TO queue_worker;
SET ROLE queue_reader;
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'r', 1)$$) AS claim_denied,
       pg_temp.err($$SELECT sharding.complete('jobs', 1, 'r')$$) AS complete_denied,
       pg_temp.err($$SELECT sharding.complete('jobs', ARRAY[1], 'r')$$) AS complete_many_denied,
       pg_temp.err($$SELECT sharding.fail('jobs', 1, 'r')$$) AS fail_denied,
       pg_temp.err($$SELECT sharding.extend_lease('jobs', 1, 'r', '1 minute')$$) AS extend_denied,
       pg_temp.err($$SELECT sharding.set_max_attempts('jobs', 3)$$) AS settings_denied,
       pg_temp.err($$INSERT INTO sharding.queue_settings VALUES ('public', 'jobs', 3)$$) AS settings_row_denied;
SET ROLE queue_worker;
SELECT count(*) AS worker_claims FROM sharding.claim(NULL::jobs, 'ok', 2);
RESET ROLE;
SELECT count(*) AS unchanged FROM jobs WHERE owner = 'r';
-- Column privileges suffice when they cover what the statements write.
CREATE ROLE queue_columns;
GRANT SELECT, UPDATE (status, owner, claim_expires, attempts) ON jobs TO queue_columns;
SET ROLE queue_columns;
SELECT count(*) AS column_grant_claims FROM sharding.claim(NULL::jobs, 'cols', 2);
SELECT sharding.complete('jobs', ARRAY(SELECT id FROM jobs WHERE owner = 'cols'), 'cols') AS column_grant_completes;
RESET ROLE;
REVOKE UPDATE (attempts) ON jobs FROM queue_columns;
SET ROLE queue_columns;
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::jobs, 'cols', 2)$$) AS attempts_not_granted;
RESET ROLE;
REVOKE ALL ON jobs FROM queue_reader, queue_worker, queue_columns;
DROP ROLE queue_reader;
DROP ROLE queue_worker;
DROP ROLE queue_columns;

-- The signatures, parameter names and defaults docs/queue.md documents.
SELECT p.proname || '(' || pg_get_function_arguments(p.oid) || ') -> ' || pg_get_function_result(p.oid) AS signature,
       p.provolatile AS vol, p.proisstrict AS strict, p.proparallel AS par
  FROM pg_proc p
 WHERE p.pronamespace = 'sharding'::regnamespace
   AND p.proname IN ('create_queue', 'claim', 'claim_shards', 'complete', 'fail', 'extend_lease',
                     'set_max_attempts', 'queue_stats', 'enqueue')
 ORDER BY 1;
-- Every function of this section has a comment. The SQL-language helpers pin
-- search_path; the C functions do not (their generated SQL is qualified:
-- test/pgtap/search_path.sql), nor does create_queue (it resolves its name
-- against the caller's path on purpose).
SELECT p.oid::regprocedure AS function, obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented,
       coalesce(array_to_string(p.proconfig, ','), '') AS config, p.prosecdef AS definer
  FROM pg_proc p
 WHERE p.pronamespace = 'sharding'::regnamespace
   AND p.proname IN ('create_queue', 'claim', 'claim_shards', 'complete', 'fail', 'extend_lease',
                     'set_max_attempts', 'queue_stats', 'enqueue')
 ORDER BY 1::text;

-- A renamed schema: the cached statements must follow the table, never the
-- old name (a new table under the old name is a decoy that must stay untouched).
CREATE SCHEMA qs1;
SELECT sharding.create_queue('qs1.q');
INSERT INTO qs1.q (key, created) VALUES ('real-1', now() - interval '2 s'), ('real-2', now() - interval '1 s');
SELECT key FROM sharding.claim(NULL::qs1.q, 'w', 1);
ALTER SCHEMA qs1 RENAME TO qs2;
CREATE SCHEMA qs1;
SELECT sharding.create_queue('qs1.q');
INSERT INTO qs1.q (key) VALUES ('decoy');
SELECT key FROM sharding.claim(NULL::qs2.q, 'w', 5);
SELECT sharding.complete('qs2.q', (SELECT id FROM qs2.q WHERE key = 'real-1'), 'w') AS completed_in_renamed;
SELECT key, status FROM qs1.q;
DROP SCHEMA qs1, qs2 CASCADE;

-- A trigger on the queue that claims again (a nested call, with another key
-- column) while the outer claim_shards is running: the outer call's plan
-- must stay alive, and both claims take distinct rows.
SELECT sharding.create_queue('nest_jobs');
INSERT INTO nest_jobs (key, created)
SELECT 'n' || i, now() - (10 - i) * interval '1 s' FROM generate_series(1, 6) AS i;
CREATE FUNCTION public.nest_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.owner = 'outer' THEN
        PERFORM count(*) FROM sharding.claim_shards(NULL::public.nest_jobs, 'inner', ARRAY[0], 1, 1,
                                                    '1 minute', 'status');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER nest AFTER UPDATE ON nest_jobs FOR EACH ROW EXECUTE FUNCTION public.nest_claim();
SELECT key FROM sharding.claim_shards(NULL::nest_jobs, 'outer', ARRAY[0], 1, 2, '1 minute', 'key') ORDER BY key;
SELECT owner, count(*) FROM nest_jobs GROUP BY owner ORDER BY owner;
SELECT key FROM sharding.claim_shards(NULL::nest_jobs, 'outer', ARRAY[0], 1, 1, '1 minute', 'key');
SELECT owner, count(*) FROM nest_jobs GROUP BY owner ORDER BY owner;
DROP TABLE nest_jobs;
DROP FUNCTION public.nest_claim();

DROP TABLE jobs, other, "Work Q"."Big Jobs", "Work Q".second;
DROP SCHEMA "Work Q";
DROP EXTENSION sharding;
