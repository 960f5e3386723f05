-- Demo scene: a third node joins a two-node cluster under live writers
-- (docs/rebalance.md). Run by demo/run.sh after the
-- other scenes, on its throwaway cluster, which must have
-- wal_level = logical and the library preloaded:
--
--   psql -Xq -v ON_ERROR_STOP=1 -d postgres -f demo/rebalance.sql
--
-- Databases demo_coord (the coordinator, where the writers run), demo_n1,
-- demo_n2 and demo_n3 (the data nodes) are made and dropped by the scene.
\pset footer off
\set QUIET on
\set ON_ERROR_STOP on
SET client_min_messages = warning;

\echo
\echo '======================================================================'
\echo ' 8. A third node joins, nobody stops writing'
\echo '======================================================================'
SELECT current_setting('wal_level') = 'logical' AS logical_ok,
       current_setting('shared_preload_libraries') ~ 'sharding' AS preload_ok \gset
\if :logical_ok
\else
\echo 'This scene needs wal_level = logical (moves run on logical replication): skipped.'
\quit
\endif
\if :preload_ok
\else
\echo 'This scene needs shared_preload_libraries = sharding (jobs run in background workers): skipped.'
\quit
\endif

\o /dev/null
DROP DATABASE IF EXISTS demo_coord WITH (FORCE);
DROP DATABASE IF EXISTS demo_n1 WITH (FORCE);
DROP DATABASE IF EXISTS demo_n2 WITH (FORCE);
DROP DATABASE IF EXISTS demo_n3 WITH (FORCE);
CREATE DATABASE demo_coord;
CREATE DATABASE demo_n1;
CREATE DATABASE demo_n2;
CREATE DATABASE demo_n3;
SELECT format('host=%s port=%s', split_part(current_setting('unix_socket_directories'), ',', 1),
              current_setting('port')) AS here \gset

\c demo_n1
CREATE EXTENSION sharding;
\c demo_n2
CREATE EXTENSION sharding;
\c demo_n3
CREATE EXTENSION sharding;
\c demo_coord
SET client_min_messages = warning;
-- dblink is the writers' (the application's) tool below; the extension
-- itself needs none.
CREATE EXTENSION sharding; CREATE EXTENSION dblink;
SELECT sharding.create_map('shop', 8, ARRAY['n1', 'n2']);
SELECT sharding.add_node('n1', :'here' || ' dbname=demo_n1'), sharding.add_node('n2', :'here' || ' dbname=demo_n2'),
       sharding.add_node('n3', :'here' || ' dbname=demo_n3');
SELECT sharding.attach_node('n1'), sharding.attach_node('n2'), sharding.attach_node('n3');
-- The table is made here only: distribute creates it on every attached node
-- that lacks it, in one two-phase transaction (docs/ddl.md).
CREATE TABLE orders (tenant text NOT NULL, id bigint PRIMARY KEY, amount integer NOT NULL);
ALTER TABLE orders REPLICA IDENTITY FULL;  -- a move's deletes carry the key (docs/moves.md)
SELECT sharding.distribute('orders', 'tenant', 'shop');
\o
SELECT string_agg(r.node, ', ' ORDER BY r.node) AS nodes_with_orders
  FROM sharding.run_on_nodes('SELECT 1 FROM public.orders LIMIT 0') AS r \gset
\echo 'orders was created here only; distribute made it on' :nodes_with_orders 'in one two-phase transaction.'
\o /dev/null

-- 40,000 orders of 100 tenants, each on the node the map names.
DO $$
DECLARE
    n text;
BEGIN
    FOR i IN 1 .. 100 LOOP   -- the followers learn the map
        EXIT WHEN (SELECT count(*) FROM public.dblink((SELECT dsn FROM sharding.nodes WHERE node = 'n2'),
                   'SELECT count(*) FROM sharding.shards') AS t(c bigint)) = 8;
        PERFORM pg_sleep(0.1);
    END LOOP;
    FOREACH n IN ARRAY ARRAY['n1', 'n2'] LOOP
        PERFORM public.dblink_exec((SELECT dsn FROM sharding.nodes WHERE node = n),
            'INSERT INTO orders SELECT ''t'' || (i % 100), i, 1 FROM generate_series(1, 40000) i
              WHERE sharding.node_for(''shop'', ''t'' || (i % 100)) = sharding.this_node()');
    END LOOP;
END $$;

-- Four writers: each inserts orders on the node node_for names (retrying
-- when the shard is being cut over) and counts what committed.
CREATE TABLE written (writer integer PRIMARY KEY, orders bigint NOT NULL, amount bigint NOT NULL, retries bigint NOT NULL);
CREATE TABLE stop_writing (stop boolean NOT NULL);
INSERT INTO stop_writing VALUES (false);
CREATE PROCEDURE writer(w integer) LANGUAGE plpgsql AS $$
DECLARE
    tenant text; dest text; id bigint := w::bigint * 1000000000; done boolean;
    n bigint := 0; total bigint := 0; retries bigint := 0;
BEGIN
    LOOP
        EXIT WHEN (SELECT stop FROM stop_writing);
        tenant := 't' || floor(random() * 100)::int;
        id := id + 1;
        LOOP
            dest := sharding.node_for('shop', tenant);
            IF NOT 'w' || dest = ANY (coalesce(public.dblink_get_connections(), '{}')) THEN
                PERFORM public.dblink_connect('w' || dest, (SELECT dsn FROM sharding.nodes WHERE node = dest));
            END IF;
            BEGIN
                PERFORM public.dblink_exec('w' || dest, format('INSERT INTO orders VALUES (%L, %s, 7)', tenant, id));
                done := true;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                done := false;   -- refused: the shard is moving; ask the map again
            END;
            EXIT WHEN done;
            retries := retries + 1;
            COMMIT;
            PERFORM pg_sleep(0.005);
        END LOOP;
        n := n + 1;
        total := total + 7;
        INSERT INTO written VALUES (w, n, total, retries)
            ON CONFLICT (writer) DO UPDATE SET orders = EXCLUDED.orders, amount = EXCLUDED.amount, retries = EXCLUDED.retries;
        COMMIT;
        PERFORM pg_sleep(0.005);
    END LOOP;
END $$;
SELECT public.dblink_connect('writer' || w, :'here' || ' dbname=demo_coord') FROM generate_series(1, 4) w;
SELECT public.dblink_send_query('writer' || w, format('CALL writer(%s)', w)) FROM generate_series(1, 4) w;
SELECT pg_sleep(1);
\o

\echo
\echo 'Two nodes own the 8 shards of map shop; four writers insert orders.'
\echo 'A third node n3 joins: one call plans the moves and starts them in'
\echo 'background workers, two at a time at most (max_parallel => 2):'
\echo
\echo '  SELECT sharding.rebalance_start(''shop'', ARRAY[''n1'', ''n2'', ''n3''], max_parallel => 2);'
SELECT sharding.rebalance_start('shop', ARRAY['n1', 'n2', 'n3'], max_parallel => 2) AS job \gset
\echo
\echo 'It returned job' :job 'at once. While it runs, move_progress shows each move:'
SELECT pg_sleep(0.7) \g /dev/null
SELECT logical, source, destination, phase, rows_copied, lag_bytes, bar, time_left, waiting
  FROM sharding.move_progress WHERE job = :job ORDER BY move;
SELECT pg_sleep(0.7) \g /dev/null
\echo 'and a moment later:'
SELECT logical, source, destination, phase, rows_copied, lag_bytes, bar, time_left, waiting
  FROM sharding.move_progress WHERE job = :job ORDER BY move;
\echo 'rebalance_wait returns once the job has ended:'
SELECT sharding.rebalance_wait(:job, '300 s') AS state;
UPDATE stop_writing SET stop = true;
\o /dev/null
SELECT count(*) AS writers_stopped FROM generate_series(1, 4) w,
       LATERAL public.dblink_get_result('writer' || w) AS r(status text);
\o
SELECT job, strategy, state, moves_total, moves_done, moves_failed, finished - started AS took
  FROM sharding.rebalance_jobs WHERE job = :job;

\echo 'Where the orders are now, and whether the writers'' counts match:'
SELECT node, count(*) AS shards FROM sharding.shards WHERE map = 'shop' GROUP BY node ORDER BY node;
WITH counts AS (
    SELECT n.node, c.orders, c.amount
      FROM sharding.nodes n,
           LATERAL public.dblink(n.dsn, 'SELECT count(*), sum(amount) FROM orders') AS c(orders bigint, amount bigint)
     WHERE n.node IN ('n1', 'n2', 'n3'))
SELECT (SELECT string_agg(node || ': ' || orders, ', ' ORDER BY node) FROM counts) AS orders_per_node,
       (SELECT sum(orders) FROM counts) AS orders_on_nodes,
       40000 + (SELECT sum(orders) FROM written) AS orders_written,
       (SELECT sum(amount) FROM counts) = 40000 + (SELECT sum(amount) FROM written) AS amounts_match,
       (SELECT sum(retries) FROM written) AS refusals_retried;

\o /dev/null
SELECT sharding.detach_node(n) FROM unnest(ARRAY['n1', 'n2', 'n3']) n;
SELECT public.dblink_disconnect(c) FROM unnest(public.dblink_get_connections()) c;
\c postgres
DROP DATABASE demo_coord WITH (FORCE);
DROP DATABASE demo_n1 WITH (FORCE);
DROP DATABASE demo_n2 WITH (FORCE);
DROP DATABASE demo_n3 WITH (FORCE);
