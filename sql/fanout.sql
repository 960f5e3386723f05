-- Fan-out counting (docs/observe.md). The test cluster preloads the
-- library (test/lib/cluster.sh), so the counters are on. Each case resets
-- the counters of this database, runs statements, and reads the counts.
CREATE EXTENSION sharding;

SELECT sharding.create_map('fo_map', 8, ARRAY['a', 'b']);
CREATE TABLE fo_orders (id bigint PRIMARY KEY, tenant text NOT NULL, amount integer);
CREATE TABLE fo_items (id bigint PRIMARY KEY, tenant text NOT NULL, order_id bigint);
ALTER TABLE fo_orders REPLICA IDENTITY FULL;
ALTER TABLE fo_items REPLICA IDENTITY FULL;
CREATE TABLE fo_plain (id bigint PRIMARY KEY, tenant text);
CREATE TABLE fo_ints (id integer PRIMARY KEY, note text);
SELECT sharding.distribute('fo_orders', 'tenant', 'fo_map');
SELECT sharding.distribute('fo_items', 'tenant', 'fo_map');
-- (A map's tables share one key type: the integer keys have a map of their own.)
SELECT sharding.create_map('fo_imap', 8, ARRAY['a', 'b']);
SELECT sharding.distribute('fo_ints', 'id', 'fo_imap');
-- t2 and t9 share logical shard 0 of 8; t1 is on shard 4, t3 on shard 1.
SELECT sharding.shard_of('t1', 8) AS t1, sharding.shard_of('t2', 8) AS t2,
       sharding.shard_of('t3', 8) AS t3, sharding.shard_of('t9', 8) AS t9;
INSERT INTO fo_orders SELECT i, 't' || (i % 10), i FROM generate_series(1, 200) AS i;
INSERT INTO fo_items SELECT i, 't' || (i % 10), i FROM generate_series(1, 200) AS i;
INSERT INTO fo_ints SELECT i, 'n' FROM generate_series(1, 100) AS i;
ANALYZE fo_orders, fo_items, fo_ints;

-- The counts of this test's tables since the last reset.
CREATE FUNCTION fo_counts() RETURNS TABLE (tbl text, queries bigint, single_shard bigint, fan_out bigint)
    LANGUAGE sql AS $$
        SELECT table_name, queries, single_shard, fan_out FROM sharding.fanout_stats
         WHERE table_name LIKE 'fo\_%' ORDER BY table_name
    $$;

-- Every distributed table is listed, with zeros after a reset; since moves.
SELECT now() AS before_reset \gset
SELECT sharding.fanout_reset();
SELECT * FROM fo_counts();
SELECT bool_and(since >= :'before_reset'::timestamptz) AS since_is_the_reset
  FROM sharding.fanout_stats WHERE table_name LIKE 'fo\_%';
SELECT column_name, data_type FROM information_schema.columns
 WHERE table_schema = 'sharding' AND table_name = 'fanout_stats' ORDER BY ordinal_position;

-- = constant: single shard; no condition, range, LIKE: fan-out.
SELECT sharding.fanout_reset();
SELECT count(*) FROM fo_orders WHERE tenant = 't1';
SELECT count(*) FROM fo_orders WHERE 't3' = tenant AND amount > 5;
SELECT count(*) FROM fo_orders;
SELECT count(*) FROM fo_orders WHERE tenant > 't5';
SELECT count(*) FROM fo_orders WHERE tenant LIKE 't1%';
SELECT count(*) FROM fo_orders WHERE id = 7;          -- the primary key is not the shard key
SELECT * FROM fo_counts();

-- IN / ANY lists: one shard (t2 and t9 share one) or several.
SELECT sharding.fanout_reset();
SELECT count(*) FROM fo_orders WHERE tenant IN ('t2', 't9');
SELECT count(*) FROM fo_orders WHERE tenant = ANY (ARRAY['t2', 't9', 't2']);
SELECT count(*) FROM fo_orders WHERE tenant IN ('t1', 't2');
SELECT count(*) FROM fo_orders WHERE tenant = 't1' OR tenant = 't3';
SELECT count(*) FROM fo_orders WHERE tenant = 't2' OR tenant = 't9';
SELECT * FROM fo_counts();

-- Parameters: prepared statements count each execution, custom and generic
-- plans alike; an array parameter is looked into.
SELECT sharding.fanout_reset();
PREPARE fo_one(text) AS SELECT count(*) FROM fo_orders WHERE tenant = $1;
PREPARE fo_any(text[]) AS SELECT count(*) FROM fo_orders WHERE tenant = ANY ($1);
EXECUTE fo_one('t1');
EXECUTE fo_one('t2');
SET plan_cache_mode = force_generic_plan;
EXECUTE fo_one('t3');
EXECUTE fo_any(ARRAY['t2', 't9']);
EXECUTE fo_any(ARRAY['t1', 't2']);
RESET plan_cache_mode;
EXECUTE fo_any(ARRAY['t2', 't9']);
SELECT * FROM fo_counts();
DEALLOCATE fo_one;
DEALLOCATE fo_any;

-- Integer keys: any integer width fixes the key.
SELECT sharding.fanout_reset();
SELECT note FROM fo_ints WHERE id = 5;
SELECT note FROM fo_ints WHERE id = 5::bigint;
SELECT count(*) FROM fo_ints WHERE id IN (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
SELECT count(*) FROM fo_ints WHERE id BETWEEN 1 AND 3;
SELECT * FROM fo_counts() WHERE tbl = 'fo_ints';

-- Joins of two distributed tables: each counted once. A constant on one key
-- reaches the other through the join condition.
SELECT sharding.fanout_reset();
SELECT count(*) FROM fo_orders o JOIN fo_items i ON i.tenant = o.tenant AND i.order_id = o.id
 WHERE o.tenant = 't1';
SELECT count(*) FROM fo_orders o JOIN fo_items i ON i.order_id = o.id WHERE o.tenant = 't1';
SELECT count(*) FROM fo_orders o JOIN fo_items i ON i.tenant = o.tenant AND i.order_id = o.id;
SELECT count(*) FROM fo_orders o JOIN fo_plain p ON p.id = o.id WHERE o.tenant = 't1';
SELECT * FROM fo_counts();

-- UPDATE, DELETE, INSERT ... VALUES, INSERT ... SELECT, COPY.
SELECT sharding.fanout_reset();
UPDATE fo_orders SET amount = amount + 1 WHERE tenant = 't1';
UPDATE fo_orders SET amount = amount + 1 WHERE amount > 150;
DELETE FROM fo_orders WHERE tenant = 't3' AND id = 3;
DELETE FROM fo_orders WHERE id = 13;
INSERT INTO fo_orders VALUES (1001, 't1', 1);
INSERT INTO fo_orders VALUES (1002, 't2', 1), (1003, 't9', 1);
INSERT INTO fo_orders VALUES (1004, 't1', 1), (1005, 't2', 1);
INSERT INTO fo_orders SELECT id + 2000, tenant, order_id FROM fo_items WHERE tenant = 't1';
SELECT * FROM fo_counts();
SELECT sharding.fanout_reset();
COPY fo_orders (id, tenant, amount) FROM stdin;
3001	t1	1
3002	t3	1
\.
COPY fo_orders TO '/dev/null';
COPY (SELECT id FROM fo_orders WHERE tenant = 't5' ORDER BY id LIMIT 2) TO stdout;
SELECT * FROM fo_counts() WHERE tbl = 'fo_orders';

-- Statements inside PL/pgSQL and SQL functions count, each execution.
SELECT sharding.fanout_reset();
CREATE FUNCTION fo_total(t text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    SELECT sum(amount) INTO n FROM fo_orders WHERE tenant = t;
    PERFORM count(*) FROM fo_items;
    RETURN n;
END $$;
SELECT count(fo_total('t' || i)) FROM generate_series(1, 7) AS i;
DO $$ BEGIN UPDATE fo_items SET order_id = order_id WHERE tenant = 't4'; END $$;
CREATE FUNCTION fo_note(k integer) RETURNS text LANGUAGE sql AS $$ SELECT max(note) FROM fo_ints WHERE id = k $$;
SELECT fo_note(1), fo_note(2), fo_note(3);
SELECT * FROM fo_counts();

-- EXPLAIN alone runs nothing and counts nothing; EXPLAIN ANALYZE runs.
SELECT sharding.fanout_reset();
EXPLAIN (COSTS OFF) SELECT * FROM fo_orders;
-- (Its plan text differs between versions, so it runs inside a DO block.)
DO $$ BEGIN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM fo_orders WHERE tenant = ''t1'''; END $$;
SELECT * FROM fo_counts() WHERE tbl = 'fo_orders';

-- undistribute: no longer listed nor counted; distribute again: counted.
SELECT sharding.undistribute('fo_items');
SELECT count(*) FROM fo_items;
SELECT * FROM fo_counts();
SELECT sharding.distribute('fo_items', 'tenant', 'fo_map');
SELECT count(*) FROM fo_items WHERE tenant = 't1';
SELECT * FROM fo_counts() WHERE tbl = 'fo_items';

-- A distributed table partitioned by shard_of: scans of its partitions
-- count as the table, classified by their own key conditions.
CREATE TABLE fo_parts (tenant text NOT NULL, id bigint NOT NULL, PRIMARY KEY (tenant, id))
    PARTITION BY HASH (tenant sharding.text_shard_ops);
SELECT sharding.create_partitions('fo_parts', 4);
SELECT sharding.distribute('fo_parts', 'tenant', 'fo_map');
INSERT INTO fo_parts SELECT 't' || (i % 10), i FROM generate_series(1, 100) AS i;
SELECT sharding.fanout_reset();
SELECT count(*) FROM fo_parts WHERE tenant = 't1';
SELECT count(*) FROM fo_parts;
SELECT count(*) FROM fo_parts WHERE tenant IN ('t2', 't9');
SET plan_cache_mode = force_generic_plan;
PREPARE fo_part(text) AS SELECT count(*) FROM fo_parts WHERE tenant = $1;
EXECUTE fo_part('t3');
RESET plan_cache_mode;
DEALLOCATE fo_part;
SELECT * FROM fo_counts() WHERE tbl = 'fo_parts';
DROP TABLE fo_parts;

-- fanout_reset is an admin function; the view is readable by everyone.
CREATE ROLE fo_reader;
SET ROLE fo_reader;
SELECT count(*) > 0 AS readable FROM sharding.fanout_stats;
SELECT sharding.fanout_reset();
RESET ROLE;
DROP ROLE fo_reader;

DROP FUNCTION fo_total(text);
DROP FUNCTION fo_note(integer);
DROP FUNCTION fo_counts();
DROP TABLE fo_orders, fo_items, fo_plain, fo_ints;
SELECT sharding.drop_map('fo_map');
SELECT sharding.drop_map('fo_imap');
DROP EXTENSION sharding;
