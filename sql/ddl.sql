-- DDL on every node (docs/ddl.md): run_on_nodes' refusals and errors on one
-- server, each changing nothing on any node. This server runs with
-- max_prepared_transactions = 0 and no attached data node; the two-phase
-- commit itself, propagated DDL and recovery are tested by
-- test/tap/650_ddl.pl and 651_ddl_recovery.pl.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
CREATE FUNCTION pg_temp.hint(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE h text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS h = PG_EXCEPTION_HINT;
    RETURN h;
END $$;

-- A node: another database of this server (max_prepared_transactions = 0).
CREATE DATABASE ddl_node_a;
CREATE TEMP TABLE node_a AS
    SELECT format('host=%s port=%s dbname=ddl_node_a', split_part(current_setting('unix_socket_directories'), ',', 1),
                  current_setting('port')) AS dsn;
SELECT sharding.add_node('a', (SELECT dsn FROM node_a));
SELECT sharding.add_node('gone', 'host=/nonexistent dbname=gone');
SELECT sharding.create_map('ddlmap', 4, ARRAY['a']);
SELECT sharding.create_map('workers', 2, ARRAY['nodsn']);    -- a map of workers: no DSN
CREATE FUNCTION pg_temp.on_a(q text) RETURNS text LANGUAGE sql AS $$ SELECT sharding._remote((SELECT dsn FROM pg_temp.node_a), q) $$;

-- The default is every attached data node: none here, no row.
SELECT * FROM sharding.run_on_nodes('CREATE TABLE t_default (id int)');

-- An unknown node: 42704, nothing run anywhere (not even on the known one).
SELECT pg_temp.err($$SELECT * FROM sharding.run_on_nodes('CREATE TABLE t1 (id int)', ARRAY['a', 'nowhere'])$$);
SELECT pg_temp.on_a($$SELECT count(*)::text FROM pg_class WHERE relname = 't1'$$) AS t1_on_a;

-- NULL command or node name: 22004.
SELECT pg_temp.err($$SELECT * FROM sharding.run_on_nodes(NULL, ARRAY['a'])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.run_on_nodes('SELECT 1', ARRAY['a', NULL])$$);

-- A node without a connection string: 55000.
SELECT pg_temp.err($$SELECT * FROM sharding.run_on_nodes('SELECT 1', ARRAY['nodsn'])$$);

-- A node out of reach: its connection error, naming it.
SELECT regexp_replace(pg_temp.err($$SELECT * FROM sharding.run_on_nodes('SELECT 1', ARRAY['gone'])$$), ':.*', ':')
    AS unreachable_state,
       pg_temp.err($$SELECT * FROM sharding.run_on_nodes('SELECT 1', ARRAY['gone'])$$) LIKE '%node "gone": %'
    AS names_node;

-- max_prepared_transactions = 0 on the node: 55000 with a hint, nothing
-- applied anywhere (the checks run on every node before the command runs).
SELECT pg_temp.err($$SELECT * FROM sharding.run_on_nodes('CREATE TABLE t2 (id int)', ARRAY['a'])$$);
SELECT pg_temp.hint($$SELECT * FROM sharding.run_on_nodes('CREATE TABLE t2 (id int)', ARRAY['a'])$$);
SELECT pg_temp.on_a($$SELECT count(*)::text FROM pg_class WHERE relname = 't2'$$) AS t2_on_a;

-- recover_transactions: nothing in doubt on a node it reaches.
SELECT sharding.drop_node('gone');
SELECT sharding.recover_transactions();
SELECT count(*) AS records FROM sharding.node_transactions;

-- Administrators only (they connect out with the nodes' DSNs); the record
-- is the owner's.
CREATE ROLE ddl_nobody;
SET ROLE ddl_nobody;
SELECT pg_temp.err($$SELECT * FROM sharding.run_on_nodes('SELECT 1', ARRAY['a'])$$);
SELECT pg_temp.err($$SELECT sharding.recover_transactions()$$);
SELECT pg_temp.err($$SELECT * FROM sharding.node_transactions$$);
RESET ROLE;
DROP ROLE ddl_nobody;

-- sharding.propagate_ddl is on by default; sharding.ddl_fault (test only)
-- is a superuser's.
SHOW sharding.propagate_ddl;
SELECT setting, context FROM pg_settings WHERE name = 'sharding.ddl_fault';

-- Without attached data nodes, DDL of a distributed table changes this
-- database only, as in 1.3 (with or without the library preloaded).
CREATE TABLE ddl_docs (ws text, id bigint, PRIMARY KEY (ws, id));
SELECT sharding.distribute('ddl_docs', 'ws', 'ddlmap');
ALTER TABLE ddl_docs ADD COLUMN body text;
CREATE INDEX ddl_docs_body ON ddl_docs (body);
COMMENT ON TABLE ddl_docs IS 'documents';
DROP INDEX ddl_docs_body;
SELECT count(*) AS columns FROM pg_attribute WHERE attrelid = 'ddl_docs'::regclass AND attnum > 0;

-- A move of the table's map in flight (a journal entry in phase copying,
-- as the engine writes it): the DDL waits for it, at most lock_timeout,
-- then 55006 naming the move, and nothing changed.
INSERT INTO sharding.move_journal (move, map, logical, source, destination, phase)
VALUES (9001, 'ddlmap', 1, 'a', 'b', 'copying');
SET lock_timeout = '300ms';
SELECT pg_temp.err($$ALTER TABLE ddl_docs ADD COLUMN during_move text$$);
SELECT count(*) AS columns FROM pg_attribute WHERE attrelid = 'ddl_docs'::regclass AND attnum > 0;
-- Once the move has ended the DDL goes on.
UPDATE sharding.move_journal SET phase = 'done' WHERE move = 9001;
ALTER TABLE ddl_docs ADD COLUMN after_move text;
RESET lock_timeout;
SELECT count(*) AS columns FROM pg_attribute WHERE attrelid = 'ddl_docs'::regclass AND attnum > 0;
DELETE FROM sharding.move_journal WHERE move = 9001;

DROP TABLE ddl_docs;
DROP EXTENSION sharding CASCADE;
DROP DATABASE ddl_node_a;
