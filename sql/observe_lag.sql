-- shard_lag (docs/observe.md): per shard, the claimable jobs and the
-- wait of the oldest. Timestamps are set relative to now() inside one
-- transaction, so every age is exact.
CREATE EXTENSION sharding;

-- A queue without run_at. Of 4 shards, k1 and k2 lie on shard 1, k3 and k5 on 2.
SELECT sharding.shard_of('k1', 4) AS k1, sharding.shard_of('k2', 4) AS k2, sharding.shard_of('k3', 4) AS k3,
       sharding.shard_of('k5', 4) AS k5;
CREATE TABLE lag_jobs (id bigint PRIMARY KEY, key text, status text NOT NULL DEFAULT 'pending', owner text,
                       claim_expires timestamptz, created timestamptz NOT NULL);
BEGIN;
INSERT INTO lag_jobs (id, key, status, owner, claim_expires, created) VALUES
    (1, 'k1', 'pending', NULL, NULL, now() - interval '30 minutes'),   -- the worst wait
    (2, 'k1', 'pending', NULL, NULL, now() - interval '1 minute'),
    (3, 'k2', 'pending', NULL, NULL, now() - interval '2 minutes'),
    (4, 'k2', 'processing', 'w1', now() + interval '5 minutes', now() - interval '3 hours'),  -- live lease
    (5, 'k3', 'processing', 'w2', now() - interval '1 second', now() - interval '15 minutes'), -- lapsed lease
    (6, 'k3', 'done', 'w2', NULL, now() - interval '5 hours'),
    (7, 'k3', 'failed', 'w2', NULL, now() - interval '6 hours'),
    (8, NULL, 'pending', NULL, NULL, now() - interval '9 hours');       -- no key: on no shard
-- Shard 1 is empty, and still listed.
SELECT * FROM sharding.shard_lag('lag_jobs', 4);
SELECT shard, pending, oldest_pending_age FROM sharding.shard_lag('lag_jobs', 1);
-- The worst shard, not the average.
SELECT shard, oldest_pending_age FROM sharding.shard_lag('lag_jobs', 4)
 ORDER BY oldest_pending_age DESC NULLS LAST LIMIT 1;
COMMIT;

-- Ages grow with time: the same jobs, 10 minutes older.
BEGIN;
CREATE TEMP TABLE lag_before AS SELECT * FROM sharding.shard_lag('lag_jobs', 4);
UPDATE lag_jobs SET created = created - interval '10 minutes';
SELECT a.shard, a.pending, a.oldest_pending_age - b.oldest_pending_age AS grew
  FROM sharding.shard_lag('lag_jobs', 4) AS a JOIN lag_before AS b USING (shard) ORDER BY a.shard;
ROLLBACK;

-- Another key column, of another key type.
ALTER TABLE lag_jobs ADD COLUMN tenant integer;
UPDATE lag_jobs SET tenant = id % 2;
SELECT shard, pending FROM sharding.shard_lag('lag_jobs', 2, 'tenant');
SELECT sharding.shard_of(0, 2) AS tenant0, sharding.shard_of(1, 2) AS tenant1;

-- A queue with run_at (create_queue makes it when the queue engineer's
-- columns are there; made by hand here): a job not yet due is not claimable,
-- and a job waits from its run_at when that is later than created.
CREATE TABLE lag_sched (id bigint PRIMARY KEY, key text, status text NOT NULL, owner text,
                        claim_expires timestamptz, created timestamptz NOT NULL, run_at timestamptz);
BEGIN;
INSERT INTO lag_sched VALUES
    (1, 'k1', 'pending', NULL, NULL, now() - interval '1 hour', now() - interval '10 minutes'),
    (2, 'k1', 'pending', NULL, NULL, now() - interval '2 hours', now() + interval '1 hour'),  -- not due
    (3, 'k2', 'pending', NULL, NULL, now() - interval '20 minutes', NULL),
    (4, 'k5', 'pending', NULL, NULL, now() - interval '3 hours', now() + interval '1 minute'); -- not due
SELECT shard, pending, oldest_pending_age FROM sharding.shard_lag('lag_sched', 4);
COMMIT;

-- Errors: bad shard count, missing column, not a queue, not a key type.
SELECT * FROM sharding.shard_lag('lag_jobs', 0);
SELECT * FROM sharding.shard_lag('lag_jobs', 4, 'nope');
SELECT * FROM sharding.shard_lag('lag_jobs', 4, 'created');
CREATE TABLE lag_not_a_queue (id bigint, key text);
SELECT * FROM sharding.shard_lag('lag_not_a_queue', 4);
SELECT count(*) FROM sharding.shard_lag(NULL, 4);

DROP TABLE lag_jobs, lag_sched, lag_not_a_queue;
DROP EXTENSION sharding;
