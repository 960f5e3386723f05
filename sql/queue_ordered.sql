-- claim_ordered (per-key order) and claim_node (map-routed, with handoff;
-- docs/ordered.md). Tables are built by hand (the columns of docs/queue.md),
-- one also with run_at and priority.
CREATE EXTENSION sharding;
SET client_min_messages = warning;

-- Errors as SQLSTATE and message.
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
CREATE SCHEMA ord;
CREATE TABLE ord.jobs (
    id            bigint PRIMARY KEY,
    key           text,
    status        text NOT NULL DEFAULT 'pending',
    owner         text,
    claim_expires timestamptz,
    created       timestamptz NOT NULL,
    attempts      integer NOT NULL DEFAULT 0
);
SELECT sharding.create_ordered_indexes('ord.jobs')::text AS created_index ORDER BY 1;
-- Running it again creates nothing.
SELECT count(*) FROM sharding.create_ordered_indexes('ord.jobs');

-- Key a: 1, 3, 6; key b: 2, 5; key c: 4; a NULL key: 7. Created out of id
-- order for key a's 6 and 3: order is (created, id).
INSERT INTO ord.jobs (id, key, created) VALUES
    (1, 'a', '2026-01-01 00:00:01+00'), (2, 'b', '2026-01-01 00:00:02+00'),
    (3, 'a', '2026-01-01 00:00:05+00'), (4, 'c', '2026-01-01 00:00:04+00'),
    (5, 'b', '2026-01-01 00:00:05+00'), (6, 'a', '2026-01-01 00:00:03+00'),
    (7, NULL, '2026-01-01 00:00:00+00');

-- One job per key per batch, heads only, oldest head first, in claim order.
SELECT id, key, status, owner, attempts FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 10);
-- Every key has a job in flight: nothing more.
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w2', 10);
-- done unblocks a: its next job by created is 6 (created before 3).
SELECT sharding.complete('ord.jobs', 1, 'w1');
SELECT id, key, owner FROM sharding.claim_ordered(NULL::ord.jobs, 'w2', 10);
-- failed (no retry) unblocks b.
SELECT sharding.fail('ord.jobs', 2, 'w1', false);
-- fail with retry keeps the job at the head of its key: 6 comes back, not 3.
SELECT sharding.fail('ord.jobs', 6, 'w2', true);
SELECT id, key, owner, attempts FROM sharding.claim_ordered(NULL::ord.jobs, 'w3', 10);
-- batch 1 takes the oldest head only.
SELECT sharding.complete('ord.jobs', ARRAY[4, 5, 6]::bigint[], 'w3');
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w3', 1);
-- An expired lease frees its key: the same job is claimed again.
UPDATE ord.jobs SET claim_expires = now() - interval '1 minute' WHERE id = 3;
SELECT id, key, owner, attempts FROM sharding.claim_ordered(NULL::ord.jobs, 'w4', 10);
-- The old owner's fence fails; the new one's passes.
SELECT sharding.complete('ord.jobs', 3, 'w3'), sharding.complete('ord.jobs', 3, 'w4', 2);
-- The NULL key is never claimed this way.
SELECT count(*) FROM sharding.claim_ordered(NULL::ord.jobs, 'w4', 10);
SELECT id, status FROM ord.jobs ORDER BY id;

-- A job claimed by plain claim (not a head) still blocks its key while
-- its lease is live.
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created) VALUES
    (1, 'k', '2026-01-01 00:00:01+00'), (2, 'k', '2026-01-01 00:00:02+00');
UPDATE ord.jobs SET status = 'processing', owner = 'x', claim_expires = now() + interval '1 hour' WHERE id = 2;
SELECT count(*) FROM sharding.claim_ordered(NULL::ord.jobs, 'w1');
UPDATE ord.jobs SET claim_expires = now() - interval '1 second' WHERE id = 2;
-- Expired, but 1 is older: 1 is the head, and 2 is not claimable before it.
SELECT id FROM sharding.claim_ordered(NULL::ord.jobs, 'w1');

-- An expired head and a pending head of another key compete by age.
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created) VALUES
    (1, 'p', '2026-01-01 00:00:02+00'), (2, 'e', '2026-01-01 00:00:01+00');
UPDATE ord.jobs SET status = 'processing', owner = 'gone', claim_expires = now() - interval '1 second' WHERE id = 2;
SELECT id, key, owner FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 1);
SELECT id, key, owner FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 1);

-- Claimed from a function, and the rows are the table's row type.
CREATE FUNCTION ord.take(w text) RETURNS SETOF ord.jobs LANGUAGE sql AS
    $$ SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, w, 5) $$;
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created) VALUES
    (1, 'x', '2026-01-01 00:00:01+00'), (2, 'x', '2026-01-01 00:00:02+00'), (3, 'y', '2026-01-01 00:00:03+00');
SELECT id, key, owner FROM ord.take('fn');
SELECT id, key, owner FROM ord.take('fn');

-- Shards: only keys with shard_of(key, shard_count) = ANY(shards).
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created)
SELECT i, 'key-' || i, '2026-01-01'::timestamptz + i * interval '1 second' FROM generate_series(1, 12) i;
SELECT id, key, sharding.shard_of(key, 4) AS shard
  FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 50, shards => ARRAY[1, 3], shard_count => 4);
SELECT count(*) AS left_in_0_and_2 FROM ord.jobs
 WHERE status = 'pending' AND sharding.shard_of(key, 4) IN (0, 2);
-- A custom key column.
ALTER TABLE ord.jobs ADD COLUMN tenant integer;
UPDATE ord.jobs SET tenant = id % 2 WHERE status = 'pending';
SELECT id, tenant FROM sharding.claim_ordered(NULL::ord.jobs, 'w2', 50, key_column => 'tenant');
ALTER TABLE ord.jobs DROP COLUMN tenant;

-- Argument errors: 22023, naming the value; nothing changes.
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, shards => ARRAY[1])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, shard_count => 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, shards => ARRAY[1], shard_count => 0)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, shards => ARRAY[4], shard_count => 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, shards => ARRAY[NULL]::int[], shard_count => 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 0)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, '-1 second')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, NULL)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, key_column => 'nope')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, key_column => 'payload_missing')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w', 5, key_column => 'claim_expires')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::int, 'w')$$);
CREATE TABLE ord.bad (id bigint PRIMARY KEY, key text, status text, owner text, created timestamptz);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.bad, 'w')$$);
SELECT pg_temp.err($$SELECT sharding._claim_ordered_sql(4294967295::oid::regclass, 1)$$);
SELECT count(*) FILTER (WHERE status = 'processing') AS processing FROM ord.jobs;

-- max_attempts: an expired head past it goes to failed and unblocks its key.
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created) VALUES
    (1, 'm', '2026-01-01 00:00:01+00'), (2, 'm', '2026-01-01 00:00:02+00');
SELECT sharding.set_max_attempts('ord.jobs', 1);
SELECT id, attempts FROM sharding.claim_ordered(NULL::ord.jobs, 'w1');
UPDATE ord.jobs SET claim_expires = now() - interval '1 second' WHERE id = 1;
SELECT id, attempts FROM sharding.claim_ordered(NULL::ord.jobs, 'w2');
SELECT id, attempts FROM sharding.claim_ordered(NULL::ord.jobs, 'w2');
SELECT id, status, owner FROM ord.jobs ORDER BY id;
SELECT sharding.set_max_attempts('ord.jobs', NULL);

-- A blocked backlog at the front of the line: keys still take turns oldest
-- head first (docs/ordered.md), the whale's head, then 41 (o3), 42
-- (o1), 43 (o2); the walk leaves the whale's backlog out once it has seen
-- it (queue_ordered.cpp, the pick).
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created)
SELECT g, 'whale', '2026-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, 40) g;
INSERT INTO ord.jobs (id, key, created) VALUES
    (41, 'o3', '2026-01-02 00:00:01+00'), (42, 'o1', '2026-01-02 00:00:02+00'),
    (43, 'o2', '2026-01-02 00:00:03+00'), (44, 'o1', '2026-01-02 00:00:04+00');
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 1);
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 1);
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 1);
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 1);
SELECT count(*) FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 1);
SELECT sharding.complete('ord.jobs', ARRAY[1, 42]::bigint[], 'w1');
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 5);
SELECT id, key FROM sharding.claim_ordered(NULL::ord.jobs, 'w1', 5);
-- Whatever the path, a key's jobs come out in order, one at a time.
SELECT key, array_agg(id ORDER BY id) AS claimed FROM ord.jobs WHERE status = 'processing' GROUP BY key ORDER BY key;

-- run_at and priority (docs/ordered.md): order within a key stays (created,
-- id); a head not yet due blocks its key; heads compete by priority, then
-- run_at, then age.
CREATE TABLE ord.timed (
    id            bigint PRIMARY KEY,
    key           text,
    status        text NOT NULL DEFAULT 'pending',
    owner         text,
    claim_expires timestamptz,
    created       timestamptz NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,
    run_at        timestamptz NOT NULL DEFAULT now(),
    priority      smallint NOT NULL DEFAULT 0
);
SELECT sharding.create_ordered_indexes('ord.timed')::text AS created_index ORDER BY 1;
INSERT INTO ord.timed (id, key, created, run_at, priority) VALUES
    -- p: its head 1 is low priority; 2 (high) waits behind it.
    (1, 'p', '2026-01-01 00:00:01+00', '2026-01-01', 0),
    (2, 'p', '2026-01-01 00:00:02+00', '2026-01-01', 9),
    -- q: its head is not due: q is blocked, 4 too although due.
    (3, 'q', '2026-01-01 00:00:03+00', now() + interval '1 hour', 5),
    (4, 'q', '2026-01-01 00:00:04+00', '2026-01-01', 5),
    -- r, s, t: same priority 1; s and r by run_at; t later run_at.
    (5, 'r', '2026-01-01 00:00:05+00', '2026-01-01 00:00:02+00', 1),
    (6, 's', '2026-01-01 00:00:06+00', '2026-01-01 00:00:01+00', 1),
    (7, 't', '2026-01-01 00:00:07+00', '2026-01-01 00:00:09+00', 1),
    -- u: priority 3, newest.
    (8, 'u', '2026-01-01 00:00:08+00', '2026-01-01 00:00:09+00', 3);
SELECT id, key, priority FROM sharding.claim_ordered(NULL::ord.timed, 'w1', 10);
SELECT sharding.complete('ord.timed', ARRAY[1, 5, 6, 7, 8]::bigint[], 'w1');
SELECT id, key, priority FROM sharding.claim_ordered(NULL::ord.timed, 'w1', 10);
-- q's head becomes due: q runs 3, then 4.
UPDATE ord.timed SET run_at = now() - interval '1 second' WHERE id = 3;
SELECT id, key FROM sharding.claim_ordered(NULL::ord.timed, 'w1', 10);
SELECT sharding.complete('ord.timed', 3, 'w1');
SELECT id, key FROM sharding.claim_ordered(NULL::ord.timed, 'w1', 10);
-- A retried job whose run_at is pushed into the future (backoff) keeps its
-- key blocked until then.
SELECT sharding.complete('ord.timed', ARRAY[2, 4]::bigint[], 'w1');
INSERT INTO ord.timed (id, key, created) VALUES
    (10, 'v', '2026-01-02 00:00:01+00'), (11, 'v', '2026-01-02 00:00:02+00');
SELECT id FROM sharding.claim_ordered(NULL::ord.timed, 'w1', 10);
SELECT sharding.fail('ord.timed', 10, 'w1');
UPDATE ord.timed SET run_at = now() + interval '1 hour' WHERE id = 10;
SELECT count(*) FROM sharding.claim_ordered(NULL::ord.timed, 'w1', 10);

-- claim_node: node_for(map, key) routes, pins are honoured.
SELECT sharding.create_map('ordmap', 4, ARRAY['na', 'nb']);
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created)
SELECT i, 'key-' || i, '2026-01-01'::timestamptz + i * interval '1 second' FROM generate_series(1, 8) i;
SELECT i AS id, 'key-' || i AS key, sharding.logical_shard('ordmap', 'key-' || i) AS logical,
       sharding.node_for('ordmap', 'key-' || i) AS node
  FROM generate_series(1, 8) i ORDER BY i;
SELECT sharding.pin('ordmap', 'key-1', 'whale-node');
SELECT id, key, owner FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'na', 'wa', 2);
SELECT id, key, owner FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb', 50);
SELECT id, key, owner FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'whale-node', 'ww', 50);
SELECT count(*) FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nobody', 'wx', 50);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_node(NULL::ord.jobs, 'no_such_map', 'na', 'wa')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_node(NULL::ord.jobs, NULL, 'na', 'wa')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', NULL, 'wa')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'na', 'wa', 0)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'na', 'wa', 5, '-1 minute')$$);
SELECT map, worker, node FROM sharding.claim_node_workers ORDER BY worker;

-- Handoff: the shard of key-2 moves from na to nb while wa holds key-2's
-- job. nb claims nothing of that shard (key-5 is in it too) until the lease
-- ends; other shards it owns are unaffected.
SELECT sharding.complete('ord.jobs', id, owner) FROM ord.jobs WHERE status = 'processing' AND id <> 2 ORDER BY id;
UPDATE ord.jobs SET status = 'pending', owner = NULL, claim_expires = NULL WHERE status = 'done';
SELECT sharding.move_shard('ordmap', sharding.logical_shard('ordmap', 'key-2'), 'nb');
SELECT id, key, sharding.logical_shard('ordmap', key) AS logical
  FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb', 50);
SELECT id, key FROM ord.jobs WHERE status = 'pending' ORDER BY id;
-- Another worker of nb does not unblock it either; wa's completion does.
SELECT count(*) FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb2', 50);
SELECT sharding.complete('ord.jobs', 2, 'wa');
SELECT id, key FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb2', 50);
-- An expired lease of the old node no longer holds the shard back.
SELECT sharding.complete('ord.jobs', id, owner) FROM ord.jobs WHERE status = 'processing' ORDER BY id;
UPDATE ord.jobs SET status = 'pending', owner = NULL, claim_expires = NULL WHERE id IN (3, 8);
SELECT id, key FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb', 1);
SELECT sharding.move_shard('ordmap', sharding.logical_shard('ordmap', 'key-3'), 'na');
SELECT count(*) FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'na', 'wa', 50);
UPDATE ord.jobs SET claim_expires = now() - interval '1 second' WHERE status = 'processing';
SELECT id, key, owner, attempts FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'na', 'wa', 50);

-- A pin moving from one node to another: the same rule for that key.
TRUNCATE ord.jobs;
INSERT INTO ord.jobs (id, key, created) VALUES
    (1, 'whale', '2026-01-01 00:00:01+00'), (2, 'whale', '2026-01-01 00:00:02+00'),
    (3, 'whale', '2026-01-01 00:00:03+00');
SELECT sharding.pin('ordmap', 'whale', 'na');
SELECT id, key FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'na', 'wa', 1);
SELECT sharding.pin('ordmap', 'whale', 'nb');
SELECT count(*) FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb', 50);
SELECT sharding.complete('ord.jobs', 1, 'wa');
-- ordered => true: one job of the key at a time, in order.
SELECT id, key FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb', 50, ordered => true);
SELECT count(*) FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb', 50, ordered => true);
SELECT sharding.complete('ord.jobs', 2, 'wb');
SELECT id, key FROM sharding.claim_node(NULL::ord.jobs, 'ordmap', 'nb', 'wb', 50, ordered => true);

-- Privileges: a role without UPDATE on the queue is refused (42501).
CREATE ROLE ord_reader;
GRANT USAGE ON SCHEMA ord TO ord_reader;
GRANT SELECT ON ord.jobs TO ord_reader;
SET ROLE ord_reader;
SELECT pg_temp.err($$SELECT * FROM sharding.claim_ordered(NULL::ord.jobs, 'w')$$);
RESET ROLE;

DROP SCHEMA ord CASCADE;
SELECT sharding.drop_map('ordmap');
DELETE FROM sharding.claim_node_workers WHERE map = 'ordmap';
DROP OWNED BY ord_reader;
DROP ROLE ord_reader;
DROP EXTENSION sharding;
