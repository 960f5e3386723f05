-- Version 1.3's amendments of the queue (docs/queue.md):
-- enqueue_many's status and SQLSTATE, wake-ups with long keys, and claims
-- that leave the planner settings of user triggers alone. claim_ordered's
-- turn order with a whale in front: test/tap/200_ordered_turns.pl.
CREATE EXTENSION sharding;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 1. enqueue_many always inserts status = 'pending': a hand-made queue
-- whose status column has no default still gets claimable jobs.
CREATE TABLE eq_plain (id bigserial PRIMARY KEY, key text, payload jsonb, status text, owner text,
                       claim_expires timestamptz, created timestamptz DEFAULT now());
SELECT sharding.enqueue_many('eq_plain', ARRAY['p1', 'p2']) AS ids;
SELECT id, key, status, payload FROM eq_plain ORDER BY id;
SELECT sharding.enqueue_many('eq_plain', ARRAY['p3'], ARRAY['{"n": 3}']::jsonb[]) AS ids;
SELECT id, key, status, payload FROM eq_plain WHERE key = 'p3';
SELECT id, key, status FROM sharding.claim(NULL::eq_plain, 'w1', 10) ORDER BY id;
-- A default other than 'pending' does not win either.
CREATE TABLE eq_held (id bigserial PRIMARY KEY, key text, payload jsonb, status text DEFAULT 'done',
                      owner text, claim_expires timestamptz, created timestamptz DEFAULT now());
SELECT cardinality(sharding.enqueue_many('eq_held', ARRAY['a', 'b', 'c'])) AS three;
SELECT status, count(*) FROM eq_held GROUP BY status;
-- A payload column is not needed without payloads (it keeps its default).
CREATE TABLE eq_nopayload (id bigserial PRIMARY KEY, key text, status text, owner text,
                           claim_expires timestamptz, created timestamptz DEFAULT now());
SELECT cardinality(sharding.enqueue_many('eq_nopayload', ARRAY['x', 'y'])) AS two;
SELECT key, status FROM eq_nopayload ORDER BY id;
-- enqueue (one job) writes status = 'pending' too, whatever the default.
SELECT sharding.enqueue('eq_plain', 'p4', '{"n": 4}') AS id;
SELECT sharding.enqueue('eq_held', 'd') IS NOT NULL AS enqueued;
SELECT key, status, payload FROM eq_plain WHERE key = 'p4';
SELECT key, status FROM eq_held WHERE key = 'd';
SELECT id, key, status FROM sharding.claim(NULL::eq_plain, 'w1', 10) ORDER BY id;

-- 2. A queue table lacking a column enqueue_many writes: 22023, as the
-- other queue functions, and nothing inserted.
CREATE TABLE eq_nokey (id bigserial PRIMARY KEY, payload jsonb, status text, owner text,
                       claim_expires timestamptz, created timestamptz DEFAULT now());
CREATE TABLE eq_nostatus (id bigserial PRIMARY KEY, key text, payload jsonb, owner text,
                          claim_expires timestamptz, created timestamptz DEFAULT now());
ALTER TABLE eq_nopayload ADD COLUMN dropped int;
ALTER TABLE eq_nopayload DROP COLUMN dropped;
SELECT pg_temp.err($$SELECT sharding.enqueue_many('eq_nokey', ARRAY['a'])$$) AS no_key,
       pg_temp.err($$SELECT sharding.enqueue_many('eq_nostatus', ARRAY['a'])$$) AS no_status,
       pg_temp.err($$SELECT sharding.enqueue_many('eq_nopayload', ARRAY['a'], ARRAY['{}']::jsonb[])$$) AS no_payload;
-- The other queue functions say the same for a missing status.
SELECT pg_temp.err($$SELECT * FROM sharding.claim(NULL::eq_nostatus, 'w1')$$) AS claim_no_status;
-- A dropped column counts as missing.
ALTER TABLE eq_nokey ADD COLUMN key text;
ALTER TABLE eq_nokey DROP COLUMN key;
SELECT pg_temp.err($$SELECT sharding.enqueue_many('eq_nokey', ARRAY['a'])$$) AS dropped_key;
SELECT (SELECT count(*) FROM eq_nokey) + (SELECT count(*) FROM eq_nostatus) AS nothing_inserted,
       (SELECT count(*) FROM eq_nopayload) AS still_two;

-- 3. Wake-ups never make an insert fail: a key whose NOTIFY payload would
-- not fit (at most 7999 bytes) is sent cut on a character boundary.
SELECT sharding.create_queue('wq');
-- 10,000 characters, ASCII and multibyte (2, 3 and 4 bytes per character),
-- through INSERT, enqueue and enqueue_many.
INSERT INTO wq (key) VALUES (repeat('a', 10000));
SELECT sharding.enqueue('wq', repeat('é', 10000)) IS NOT NULL AS enqueued;
SELECT cardinality(sharding.enqueue_many('wq', ARRAY[repeat('€', 10000), repeat('😀', 10000)])) AS two;
BEGIN;
INSERT INTO wq (key) VALUES ('a' || repeat('😀', 9999));
ROLLBACK;
SELECT count(*) AS four, min(length(key)) AS shortest FROM wq;
-- What is sent: the longest prefix of at most 7999 bytes, whole
-- characters only.
SELECT k.name, length(p) AS chars, octet_length(p) AS bytes, starts_with(k.key, p) AS prefix,
       octet_length(left(k.key, length(p) + 1)) > 7999 AS longest
  FROM (VALUES ('ascii', repeat('a', 10000)), ('2 bytes', repeat('é', 10000)),
               ('3 bytes', repeat('€', 10000)), ('4 bytes', repeat('😀', 10000)),
               ('mixed', 'ab' || repeat('😀', 2500)), ('mixed 2', repeat('é', 3999) || 'abc' || repeat('€', 10)))
       AS k(name, key), sharding._notify_payload(k.key) AS p;
-- Keys that fit are sent whole.
SELECT sharding._notify_payload(repeat('a', 7999)) = repeat('a', 7999) AS whole_7999,
       sharding._notify_payload('k1') AS short, sharding._notify_payload('') = '' AS empty;

-- 4. Claims leave the planner settings alone while they execute: a trigger
-- on the queue table sees the session's enable_seqscan during every claim
-- kind, also the first one of a backend (which builds the kept plans) and
-- one after an invalidation.
SELECT sharding.create_queue('tq');
CREATE TABLE seen (kind text, setting text);
CREATE FUNCTION pg_temp.record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.seen VALUES (current_setting('sharding_test.kind'), current_setting('enable_seqscan'));
    RETURN NEW;
END $$;
CREATE TRIGGER record BEFORE UPDATE ON tq FOR EACH ROW EXECUTE FUNCTION pg_temp.record();
INSERT INTO tq (key) SELECT 'k' || g FROM generate_series(1, 40) g;
SELECT sharding.create_map('tm', 4, ARRAY['n1']);
SET sharding_test.kind = 'claim';
SELECT count(*) FROM sharding.claim(NULL::tq, 'w1', 2);
SET sharding_test.kind = 'claim_shards';
SELECT count(*) FROM sharding.claim_shards(NULL::tq, 'w1', ARRAY[0, 1, 2, 3], 4, 2);
SET sharding_test.kind = 'claim_node';
SELECT count(*) FROM sharding.claim_node(NULL::tq, 'tm', 'n1', 'w1', 2);
SET sharding_test.kind = 'claim_node ordered';
SELECT count(*) FROM sharding.claim_node(NULL::tq, 'tm', 'n1', 'w1', 2, ordered => true);
SET sharding_test.kind = 'claim_ordered';
SELECT count(*) FROM sharding.claim_ordered(NULL::tq, 'w1', 2);
-- After an invalidation the plans are built again.
ANALYZE tq;
SET sharding_test.kind = 'claim after ANALYZE';
SELECT count(*) FROM sharding.claim(NULL::tq, 'w1', 2);
SET sharding_test.kind = 'complete';
SELECT sharding.complete('tq', (SELECT min(id) FROM tq WHERE status = 'processing'), 'w1');
SELECT kind, setting, count(*) FROM seen GROUP BY kind, setting ORDER BY kind, setting;
-- The same with sequential scans switched off by the session: kept off.
TRUNCATE seen;
SET enable_seqscan = off;
SET sharding_test.kind = 'claim, session off';
SELECT count(*) FROM sharding.claim(NULL::tq, 'w1', 2);
RESET enable_seqscan;
SET sharding_test.kind = 'claim, session on';
SELECT count(*) FROM sharding.claim(NULL::tq, 'w1', 2);
SELECT kind, setting, count(*) FROM seen GROUP BY kind, setting ORDER BY kind, setting;
SHOW enable_seqscan;
RESET sharding_test.kind;

DROP TABLE eq_plain, eq_held, eq_nopayload, eq_nokey, eq_nostatus, wq, tq, seen;
DROP EXTENSION sharding;
