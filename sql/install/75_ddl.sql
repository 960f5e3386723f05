-- DDL on every node (docs/ddl.md, CONTRACT 15.4): run_on_nodes, the
-- coordinator's record of its two-phase transactions, their recovery, and
-- the refusal of unpropagated DDL of a distributed table.
--
-- The attached data nodes of a coordinator are the nodes with a DSN that
-- follow this database (attach_node: their configuration slot exists here).

-- @object sharding.node_transactions
-- One row per node of each two-phase transaction this coordinator ran,
-- written in the coordinator's own transaction just before the nodes
-- prepare: a row that is visible (committed) means "commit it there", none
-- (with the transaction no longer in progress) means "roll it back". Owner
-- only; recover_transactions deletes the rows of what is resolved.
CREATE TABLE sharding.node_transactions (
    gid             text PRIMARY KEY,
    node            text NOT NULL,
    coordinator_xid xid8 NOT NULL,
    created         timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE sharding.node_transactions IS
    'internal: the prepared transactions this coordinator committed on nodes (two-phase commit of run_on_nodes and propagated DDL)';
REVOKE ALL ON sharding.node_transactions FROM PUBLIC;
-- @end

-- @object sharding.run_on_nodes
-- run_on_nodes(command, nodes): the command on each node (every attached
-- data node when NULL), in one two-phase transaction with the caller's.
-- The command's names resolve on the nodes as in the caller's session
-- (its search_path, spelled out as schema names), so the function has no
-- SET search_path of its own; its own queries name everything with its
-- schema (SECURITY INVOKER: nothing runs with more rights than the caller's).
CREATE FUNCTION sharding.run_on_nodes(command text, nodes text[] DEFAULT NULL)
    RETURNS TABLE(node text, result text)
    AS 'MODULE_PATHNAME', 'sharding_run_on_nodes' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.run_on_nodes(text, text[]) IS
    'runs a command on each node named (every attached data node when NULL) in one two-phase transaction; one row per node with its command tag';
-- It connects out with the nodes' DSNs: administrators (as add_node).
REVOKE ALL ON FUNCTION sharding.run_on_nodes(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.run_on_nodes(text, text[]) TO sharding_admin;
-- @end

-- @object sharding.recover_transactions
-- recover_transactions(): commits or rolls back, as this coordinator
-- decided, every transaction it left prepared on a node; how many.
CREATE FUNCTION sharding.recover_transactions() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_recover_transactions' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.recover_transactions() IS
    'commits or rolls back the two-phase transactions this coordinator left prepared on nodes, as it decided; returns how many';
REVOKE ALL ON FUNCTION sharding.recover_transactions() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.recover_transactions() TO sharding_admin;
-- @end

-- @object sharding._ddl_wait_for_moves
-- DDL of a distributed table while a move of its map is in flight waits
-- for the move to end (a move copies the columns it knew when it started),
-- at most lock_timeout when set, then fails with 55006 naming the move
-- (_move_refuse, which also makes a move starting later wait for the DDL's
-- transaction). Called by the ProcessUtility hook before the statement.
CREATE FUNCTION sharding._ddl_wait_for_moves(map text, what text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t0 timestamptz := pg_catalog.clock_timestamp();
    timeout interval := pg_catalog.current_setting('lock_timeout')::interval;
BEGIN
    LOOP
        BEGIN
            PERFORM sharding._move_refuse($1, NULL, $2);
            RETURN;
        EXCEPTION WHEN object_in_use THEN
            IF timeout > interval '0' AND pg_catalog.clock_timestamp() - t0 >= timeout THEN
                RAISE;
            END IF;
        END;
        PERFORM pg_catalog.pg_sleep(0.1);
    END LOOP;
END $$;
COMMENT ON FUNCTION sharding._ddl_wait_for_moves(text, text) IS
    'internal: waits (at most lock_timeout) for the moves of a map to end, then 55006 naming the move';
-- @end

-- @object sharding._ddl_refuse
-- Without the library preloaded (no ProcessUtility hook), DDL of a
-- distributed table on a coordinator would change the coordinator alone:
-- refused (55000). With it preloaded the hook propagates the statement
-- (or sharding.propagate_ddl = off says not to) and this does nothing.
CREATE FUNCTION sharding._ddl_refuse() RETURNS event_trigger
    AS 'MODULE_PATHNAME', 'sharding__ddl_refuse' LANGUAGE C;
COMMENT ON FUNCTION sharding._ddl_refuse() IS
    'internal: refuses DDL of a distributed table on a coordinator where the library is not preloaded';
-- @end

-- @object sharding_ddl_refuse
CREATE EVENT TRIGGER sharding_ddl_refuse ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'CREATE INDEX', 'ALTER INDEX', 'CREATE TRIGGER', 'COMMENT')
    EXECUTE FUNCTION sharding._ddl_refuse();
-- @end

-- @object sharding_ddl_refuse_drop
CREATE EVENT TRIGGER sharding_ddl_refuse_drop ON sql_drop
    WHEN TAG IN ('DROP TABLE', 'DROP INDEX', 'DROP TRIGGER')
    EXECUTE FUNCTION sharding._ddl_refuse();
-- @end

-- @object sharding._ddl_forget_dropped
-- DROP TABLE (or DROP SCHEMA ... CASCADE, DROP OWNED) of a distributed
-- table forgets it: its row in sharding.distributed_tables goes, here and,
-- through the configuration they follow, on every data node (a follower
-- does nothing itself). A move of its map in flight: the drop waits for
-- it, at most lock_timeout, then 55006 naming the move. Dropping a
-- partition of a distributed table changes nothing. C
-- (src/ddl/forget_dropped.cpp): the row's DELETE runs as the extension's
-- owner, for the tables the statement dropped only.
CREATE FUNCTION sharding._ddl_forget_dropped() RETURNS event_trigger
    AS 'MODULE_PATHNAME', 'sharding__ddl_forget_dropped' LANGUAGE C
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._ddl_forget_dropped() IS
    'internal: removes a dropped table''s row from sharding.distributed_tables (waits for moves of its map)';
REVOKE ALL ON FUNCTION sharding._ddl_forget_dropped() FROM PUBLIC;
-- @end

-- @object sharding_ddl_unlist_dropped
-- Named to fire after sharding_ddl_refuse_drop (event triggers fire in
-- name order): a drop that trigger refuses must still find its row.
CREATE EVENT TRIGGER sharding_ddl_unlist_dropped ON sql_drop
    WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION sharding._ddl_forget_dropped();
-- @end

-- @object sharding._ddl_refuse_start
-- A distributed table is known by its schema and name (the map, the nodes'
-- copies, PL/Proxy): renaming it or moving it to another schema is refused
-- (0A000), preloaded or not. Without the library preloaded, DROP INDEX of
-- a distributed table's index is refused too (55000), while the index
-- still names its table (at sql_drop it no longer does).
CREATE FUNCTION sharding._ddl_refuse_start() RETURNS event_trigger
    AS 'MODULE_PATHNAME', 'sharding__ddl_refuse_start' LANGUAGE C;
COMMENT ON FUNCTION sharding._ddl_refuse_start() IS
    'internal: refuses renaming a distributed table (or moving it to another schema), and DROP INDEX of its index without the library preloaded';
-- @end

-- @object sharding_ddl_refuse_start
CREATE EVENT TRIGGER sharding_ddl_refuse_start ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE', 'DROP INDEX')
    EXECUTE FUNCTION sharding._ddl_refuse_start();
-- @end

-- @object sharding._ddl_table_definition
-- The statements that create a table as it is here: its schema (if
-- missing), columns (types, defaults, identity, generated, NOT NULL),
-- constraints, indexes and replica identity, names qualified. Not for a
-- partitioned table (0A000 there).
CREATE FUNCTION sharding._ddl_table_definition(rel regclass) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    qualified text;
    cols text;
    stmts text[];
    identity text;
    r record;
BEGIN
    SELECT n.nspname, pg_catalog.format('%I.%I', n.nspname, c.relname) INTO nsp, qualified
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = rel;
    SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod))
               || CASE a.attidentity WHEN 'a' THEN ' GENERATED ALWAYS AS IDENTITY'
                                     WHEN 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY' ELSE '' END
               || CASE WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_catalog.pg_get_expr(d.adbin, d.adrelid) || ') STORED'
                       WHEN d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid)
                       ELSE '' END
               || CASE WHEN a.attnotnull AND a.attidentity = '' THEN ' NOT NULL' ELSE '' END,
               ', ' ORDER BY a.attnum)
      INTO cols
      FROM pg_catalog.pg_attribute AS a
      LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped;
    stmts := ARRAY[pg_catalog.format('CREATE SCHEMA IF NOT EXISTS %I', nsp),
                   pg_catalog.format('CREATE TABLE %s (%s)', qualified, coalesce(cols, ''))];
    -- Constraints (foreign keys last: what they reference may be created
    -- by them too), then the indexes no constraint owns.
    FOR r IN SELECT c.conname, pg_catalog.pg_get_constraintdef(c.oid) AS def FROM pg_catalog.pg_constraint AS c
              WHERE c.conrelid = rel AND c.contype IN ('p', 'u', 'c', 'x', 'f')
              ORDER BY c.contype = 'f', c.conname LOOP
        stmts := stmts || pg_catalog.format('ALTER TABLE %s ADD CONSTRAINT %I %s', qualified, r.conname, r.def);
    END LOOP;
    FOR r IN SELECT pg_catalog.pg_get_indexdef(i.indexrelid) AS def FROM pg_catalog.pg_index AS i
              WHERE i.indrelid = rel
                AND NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c WHERE c.conindid = i.indexrelid AND c.conrelid = rel)
              ORDER BY i.indexrelid LOOP
        stmts := stmts || r.def;
    END LOOP;
    SELECT CASE c.relreplident WHEN 'f' THEN pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY FULL', qualified)
                               WHEN 'n' THEN pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY NOTHING', qualified)
                               WHEN 'i' THEN (SELECT pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY USING INDEX %I', qualified, ic.relname)
                                                FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS ic ON ic.oid = i.indexrelid
                                               WHERE i.indrelid = rel AND i.indisreplident) END
      INTO identity FROM pg_catalog.pg_class AS c WHERE c.oid = rel;
    IF identity IS NOT NULL THEN
        stmts := stmts || identity;
    END IF;
    RETURN stmts;
END $$;
COMMENT ON FUNCTION sharding._ddl_table_definition(regclass) IS
    'internal: the statements that create a table as it is here (columns, constraints, indexes, replica identity)';
-- @end

-- @object sharding._ddl_nodes_lacking
-- _ddl_nodes_lacking(qualified): the attached data nodes where
-- to_regclass(qualified) is NULL, each asked outside any transaction block
-- (no two-phase commit, so no max_prepared_transactions needed there).
CREATE FUNCTION sharding._ddl_nodes_lacking(qualified text) RETURNS text[]
    AS 'MODULE_PATHNAME', 'sharding_ddl_nodes_lacking' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding._ddl_nodes_lacking(text) IS
    'internal: the attached data nodes that lack a table (distribute creates it there only)';
REVOKE ALL ON FUNCTION sharding._ddl_nodes_lacking(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._ddl_nodes_lacking(text) TO sharding_admin;
-- @end

-- @object sharding._ddl_create_on_nodes
-- distribute (a row inserted into sharding.distributed_tables here, not by
-- a follower's apply) creates the table on every attached data node that
-- lacks it, in the caller's two-phase transaction (run_on_nodes): a node
-- that has it already keeps its own and takes no part (when every node has
-- it, no remote transaction at all, as in 1.3); a node that fails fails
-- distribute, and no node keeps anything.
CREATE FUNCTION sharding._ddl_create_on_nodes() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    rel regclass := pg_catalog.to_regclass(pg_catalog.format('%I.%I', NEW.schema_name, NEW.table_name));
    body text := '';
    s text;
    lacking text[];
BEGIN
    -- sharding.propagate_ddl = off: the nodes' tables are left to them.
    IF rel IS NULL OR pg_catalog.current_setting('sharding.propagate_ddl', true)::boolean IS FALSE OR NOT EXISTS (
        SELECT FROM sharding.nodes AS n WHERE n.dsn IS NOT NULL AND EXISTS (
            SELECT FROM pg_catalog.pg_replication_slots AS r
             WHERE r.slot_name = sharding._config_slot_here(n.node) AND r.database = pg_catalog.current_database())) THEN
        RETURN NULL;
    END IF;
    lacking := sharding._ddl_nodes_lacking(pg_catalog.format('%I.%I', NEW.schema_name, NEW.table_name));
    IF pg_catalog.cardinality(lacking) = 0 THEN
        RETURN NULL;
    END IF;
    IF (SELECT c.relkind FROM pg_catalog.pg_class AS c WHERE c.oid = rel) = 'p' THEN
        body := pg_catalog.format('RAISE EXCEPTION %L USING ERRCODE = %L;',
                    pg_catalog.format('create partitioned table %s on this node first: distribute creates plain tables only', rel::text),
                    'feature_not_supported');
    ELSE
        FOREACH s IN ARRAY sharding._ddl_table_definition(rel) LOOP
            body := body || pg_catalog.format('EXECUTE %L;', s) || E'\n';
        END LOOP;
    END IF;
    PERFORM sharding.run_on_nodes(pg_catalog.format(
        'DO %s BEGIN IF pg_catalog.to_regclass(%L) IS NULL THEN %s END IF; END %s',
        '$sharding_ddl$', pg_catalog.format('%I.%I', NEW.schema_name, NEW.table_name), body, '$sharding_ddl$'),
        lacking);
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._ddl_create_on_nodes() IS
    'internal: distribute creates the table on every attached data node that lacks it, in the same two-phase transaction';
-- @end

-- @object sharding.distributed_tables.create_on_nodes
CREATE TRIGGER create_on_nodes AFTER INSERT ON sharding.distributed_tables
    FOR EACH ROW EXECUTE FUNCTION sharding._ddl_create_on_nodes();
-- @end
