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
