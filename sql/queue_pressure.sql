-- Queues under pressure (docs/queue.md): run_at, priority, claim order,
-- enqueue_many, backoff, purge, queue_health, batch complete with attempts,
-- integer ids. Wakeups and queue_health's horizon holder need a second
-- session: test/tap/215_queue_pressure.pl.
CREATE EXTENSION sharding;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT sharding.create_queue('pq');

-- Claim order: highest priority, then earliest run_at, then oldest created,
-- then lowest id; returned in that order. A job whose run_at is in the
-- future is not claimed.
INSERT INTO pq (id, key, priority, run_at, created) VALUES
    (1, 'low-old',   0, '2024-01-01', '2024-01-01 00:00'),
    (2, 'low-new',   0, '2024-01-01', '2024-01-01 00:05'),
    (3, 'high',      9, '2024-01-03', '2024-01-03 00:00'),
    (4, 'mid-early', 5, '2024-01-01', '2024-01-02 00:00'),
    (5, 'mid-late',  5, '2024-01-02', '2024-01-01 00:00'),
    (6, 'future',    9, now() + interval '1 hour', '2023-01-01'),
    (7, 'low-tie',   0, '2024-01-01', '2024-01-01 00:05');
SELECT id, key, priority, status FROM sharding.claim(NULL::pq, 'w1', 3);
SELECT id, key FROM sharding.claim(NULL::pq, 'w1', 10);
SELECT id, key, status FROM pq WHERE status = 'pending';
-- Once due, it is claimed.
UPDATE pq SET run_at = now() - interval '1 second' WHERE id = 6;
SELECT id, key FROM sharding.claim(NULL::pq, 'w1', 10);

-- complete(queue, ids, worker, attempts): the ids that passed, in the
-- order given; a NULL attempt is not checked.
SELECT id, attempts FROM pq ORDER BY id;
SELECT sharding.complete('pq', ARRAY[5, 1, 2, 99, 3], 'w1', ARRAY[1, 1, 2, 1, NULL]) AS passed;
SELECT sharding.complete('pq', ARRAY[5, 4], 'w1', ARRAY[1, 1]) AS again;
SELECT sharding.complete('pq', ARRAY[4], 'other', ARRAY[1]) AS wrong_worker;
SELECT sharding.complete('pq', ARRAY[]::bigint[], 'w1', ARRAY[]::integer[]) AS empty;
SELECT pg_temp.err($$SELECT sharding.complete('pq', ARRAY[4, 6], 'w1', ARRAY[1])$$) AS lengths_differ,
       pg_temp.err($$SELECT sharding.complete('pq', ARRAY[4], 'w1', NULL::integer[])$$) AS null_attempts;
SELECT id, status FROM pq ORDER BY id;

-- Integer ids resolve to the integer forms, bigint ids to the bigint
-- forms; named notation works for both.
SELECT sharding.complete('pq', 4, 'w1') AS int_id,
       sharding.complete('pq', 4::bigint, 'w1') AS bigint_id_again,
       sharding.complete(queue => 'pq', id => 6, worker => 'w1', attempt => 1) AS named;
SELECT sharding.extend_lease('pq', 7, 'w1', '1 hour') AS int_extend,
       sharding.fail('pq', 7, 'w1', retry => false) AS int_fail,
       sharding.fail(queue => 'pq', id => 7::integer, worker => 'w1') AS already_failed;
SELECT id, status FROM pq ORDER BY id;

-- Backoff: a retried job is not claimed before now() + base * 2^(attempts-1),
-- capped at max. now() is fixed within a transaction, so the delays are exact.
TRUNCATE pq;
INSERT INTO pq (id, key, run_at, created) VALUES (1, 'b', '2024-01-01', '2024-01-01');
SELECT sharding.set_backoff('pq', '10 seconds', '25 seconds');
SELECT backoff_base, backoff_max FROM sharding.queue_settings WHERE table_name = 'pq';
BEGIN;
SELECT id, attempts FROM sharding.claim(NULL::pq, 'w1', 1);
SELECT sharding.fail('pq', 1, 'w1');
SELECT status, owner, attempts, run_at - now() AS delay FROM pq;
-- Not due yet: nothing to claim.
SELECT count(*) AS claimed_too_early FROM sharding.claim(NULL::pq, 'w1', 1);
UPDATE pq SET run_at = now() - interval '1 second';
SELECT id, attempts FROM sharding.claim(NULL::pq, 'w1', 1);
SELECT sharding.fail('pq', 1, 'w1');
SELECT attempts, run_at - now() AS delay FROM pq;
UPDATE pq SET run_at = now() - interval '1 second';
SELECT id, attempts FROM sharding.claim(NULL::pq, 'w1', 1);
SELECT sharding.fail('pq', 1, 'w1');
SELECT attempts, run_at - now() AS capped_delay FROM pq;
COMMIT;
-- Without backoff a retried job keeps its run_at (its place in line).
SELECT sharding.set_backoff('pq', NULL, NULL);
SELECT count(*) AS settings_rows FROM sharding.queue_settings WHERE table_name = 'pq';
UPDATE pq SET run_at = '2024-01-01';
SELECT id FROM sharding.claim(NULL::pq, 'w1', 1);
SELECT sharding.fail('pq', 1, 'w1');
SELECT status, run_at FROM pq;
-- Bad settings: 22023 naming the value; someone else's table: 42501.
SELECT pg_temp.err($$SELECT sharding.set_backoff('pq', '0 seconds', '1 minute')$$) AS zero_base,
       pg_temp.err($$SELECT sharding.set_backoff('pq', '1 minute', '1 second')$$) AS max_below_base,
       pg_temp.err($$SELECT sharding.set_backoff('pq', '1 minute', NULL)$$) AS null_max;
CREATE TABLE plain_q (id bigint PRIMARY KEY, status text, owner text, claim_expires timestamptz, created timestamptz);
SELECT pg_temp.err($$SELECT sharding.set_backoff('plain_q', '1 second', '1 minute')$$) AS no_run_at;
CREATE ROLE pq_stranger;
GRANT ALL ON pq TO pq_stranger;
SET ROLE pq_stranger;
SELECT pg_temp.err($$SELECT sharding.set_backoff('pq', '1 second', '1 minute')$$) AS not_owner;
RESET ROLE;

-- enqueue_many: one job per key, ids in the order of keys.
TRUNCATE pq;
SELECT array_length(sharding.enqueue_many('pq', ARRAY['a', 'b', 'c']), 1) AS three;
SELECT key, payload, priority, run_at = created AS run_at_is_now FROM pq ORDER BY id;
SELECT sharding.enqueue_many('pq', ARRAY['z', 'y', 'x'], ARRAY['{"n": 1}', '{"n": 2}', NULL]::jsonb[],
                              '2030-01-01', 3::smallint) AS ids \gset
SELECT array_agg(key ORDER BY array_position(:'ids'::bigint[], id)) AS keys_in_returned_order,
       array_agg(key ORDER BY id) AS keys_in_id_order
  FROM pq WHERE id = ANY (:'ids'::bigint[]);
SELECT key, payload, priority, run_at FROM pq WHERE key IN ('x', 'y', 'z') ORDER BY id;
SELECT sharding.enqueue_many('pq', ARRAY[]::text[]) AS none;
SELECT pg_temp.err($$SELECT sharding.enqueue_many('pq', ARRAY['a', 'b'], ARRAY['{}']::jsonb[])$$) AS lengths_differ,
       pg_temp.err($$SELECT sharding.enqueue_many('pq', NULL)$$) AS null_keys,
       pg_temp.err($$SELECT sharding.enqueue_many('plain_q', ARRAY['a'], run_at => '2030-01-01')$$) AS no_run_at_column;
SELECT count(*) AS rows_after_errors FROM pq;

-- purge: only done rows finished more than older_than ago, at most batch.
TRUNCATE pq;
INSERT INTO pq (id, status, claim_expires) VALUES
    (1, 'done', now() - interval '3 days'), (2, 'done', now() - interval '2 days'),
    (3, 'done', now() - interval '1 hour'), (4, 'failed', now() - interval '3 days'),
    (5, 'pending', now() - interval '3 days'), (6, 'processing', now() - interval '3 days'),
    (7, 'done', now() - interval '5 days');
SELECT sharding.purge('pq', batch => 2) AS first, sharding.purge('pq') AS second, sharding.purge('pq') AS third;
SELECT id, status FROM pq ORDER BY id;
SELECT sharding.purge('pq', '30 minutes') AS recent;
SELECT pg_temp.err($$SELECT sharding.purge('pq', '-1 day')$$) AS negative,
       pg_temp.err($$SELECT sharding.purge('pq', batch => 0)$$) AS zero_batch;
-- complete records when a job finished: purge goes by it.
INSERT INTO pq (id, key) VALUES (10, 'fresh');
SELECT id FROM sharding.claim(NULL::pq, 'w1');
SELECT sharding.complete('pq', 10, 'w1');
SELECT sharding.purge('pq', '1 hour') AS too_recent, sharding.purge('pq', '0 seconds') AS finished;

-- queue_health: counts from the partial indexes, never a sequential scan
-- of the table (so done rows are never read).
BEGIN;
TRUNCATE pq;
INSERT INTO pq (id, status, claim_expires, created)
SELECT g, CASE WHEN g <= 3 THEN 'pending' WHEN g <= 5 THEN 'processing' ELSE 'done' END,
       CASE WHEN g = 4 THEN now() - interval '1 minute' WHEN g = 5 THEN now() + interval '1 hour' END,
       now() - g * interval '1 hour'
  FROM generate_series(1, 1000) g;
ANALYZE pq;
SELECT pg_stat_get_xact_numscans('pq'::regclass) AS seq_scans_before,
       pg_stat_get_xact_tuples_returned('pq'::regclass) AS seq_rows_before \gset
SELECT pending, processing, expired, oldest_pending_age,
       dead_tuples = pg_stat_get_dead_tuples('pq'::regclass) AS dead_tuples_from_stats
  FROM sharding.queue_health('pq');
SELECT pg_stat_get_xact_numscans('pq'::regclass) - :seq_scans_before AS seq_scans,
       pg_stat_get_xact_tuples_returned('pq'::regclass) - :seq_rows_before AS seq_rows;
COMMIT;
-- dead_tuples counts what the statistics collector knows: 100 deleted rows
-- (below autovacuum's threshold for 1,000 rows) once the counters are flushed.
DELETE FROM pq WHERE id > 900;
SELECT pg_stat_force_next_flush();
SELECT dead_tuples FROM sharding.queue_health('pq');
SELECT pg_temp.err($$SELECT * FROM sharding.queue_health('plain_q'::regclass)$$) AS plain_ok,
       pg_temp.err($$SELECT * FROM sharding.queue_health('pg_class'::regclass)$$) AS not_a_queue;
SELECT * FROM sharding.queue_health(NULL);

-- A 1.1-style queue (no run_at, no priority) keeps created order.
CREATE TABLE old_q (id bigint PRIMARY KEY, status text DEFAULT 'pending', owner text,
                    claim_expires timestamptz, created timestamptz, priority integer);
INSERT INTO old_q (id, created, priority) VALUES (1, '2024-01-02', 9), (2, '2024-01-01', 0), (3, '2024-01-03', 5);
SELECT id FROM sharding.claim(NULL::old_q, 'w1', 3);

DROP TABLE pq, plain_q, old_q;
DROP ROLE pq_stranger;
DROP EXTENSION sharding;
