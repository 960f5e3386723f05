-- orch (issue 24, "no PL/pgSQL on the move's path"): the move's remote
-- connections are C++ over libpq (src/nodes/remote_exec.cpp) instead of
-- PL/pgSQL over contrib's dblink; _move_journal asks _dbl_open instead of
-- dblink_get_connections. The 1.2 destination filter (_move_filter,
-- _move_key_in), unused since the decoder filters at the source, is gone:
-- CASCADE drops a filter trigger an interrupted 1.2 move left behind.
DROP FUNCTION sharding._move_filter() CASCADE;
DROP FUNCTION sharding._move_key_in(jsonb, text, text, integer, integer, text, text, text);

-- The move's remote connections, in C++ (src/nodes/remote_exec.cpp): named
-- libpq connections of this session (kept across transactions, closed by
-- _dbl_disconnect, a new _dbl_connect of the name, or the session's end).
-- Every wait is interruptible; a statement running there when the caller
-- is cancelled or fails is cancelled (PQcancel) and its results consumed
-- before the error goes on (a cancelled cutover's _freeze_shard must not
-- freeze the shard after the undo thawed it). Remote errors are raised with
-- their SQLSTATE, message, detail and hint. Remote statements run with
-- search_path = pg_catalog, pg_temp (every name in them is qualified
-- anyway), and commit synchronously: a commit whose WAL waited for the WAL
-- writer would reach walsenders, and so the destination and the followers,
-- that much later, inside the cutover's refusal window. No dblink.
CREATE OR REPLACE FUNCTION sharding._dbl_connect(conn text, dsn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_connect' LANGUAGE C VOLATILE;
CREATE OR REPLACE FUNCTION sharding._dbl_disconnect(conn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_disconnect' LANGUAGE C VOLATILE STRICT;
CREATE FUNCTION sharding._dbl_open(conn text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__dbl_open' LANGUAGE C VOLATILE STRICT;
CREATE OR REPLACE FUNCTION sharding._dbl_value(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_value' LANGUAGE C VOLATILE STRICT;
CREATE OR REPLACE FUNCTION sharding._dbl_run(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_run' LANGUAGE C VOLATILE STRICT;

REVOKE ALL ON FUNCTION sharding._dbl_connect(text, text), sharding._dbl_disconnect(text),
    sharding._dbl_open(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._dbl_connect(text, text), sharding._dbl_disconnect(text),
    sharding._dbl_open(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    TO sharding_admin;
COMMENT ON FUNCTION sharding._dbl_connect(text, text) IS 'internal: opens a named remote connection of this session (reopens one of that name)';
COMMENT ON FUNCTION sharding._dbl_disconnect(text) IS 'internal: cancels and closes a named remote connection if open';
COMMENT ON FUNCTION sharding._dbl_open(text) IS 'internal: whether a named remote connection is open';
COMMENT ON FUNCTION sharding._dbl_value(text, text) IS 'internal: first value of a query (or a command''s tag) over a named remote connection';
COMMENT ON FUNCTION sharding._dbl_run(text, text) IS 'internal: runs SQL over a named remote connection, interruptibly; the last command''s tag';

DROP FUNCTION sharding._move_dblink_schema();

CREATE OR REPLACE FUNCTION sharding._move_connect(source text, destination text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n text;
    d text;
BEGIN
    FOREACH n IN ARRAY ARRAY[destination, source] LOOP   -- the argument first
        SELECT x.dsn INTO d FROM sharding.nodes x WHERE x.node = n;
        IF d IS NULL THEN
            RAISE EXCEPTION 'node "%" has no connection string', n
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Moving a shard online connects to its source and its destination.',
                      HINT = pg_catalog.format('Call sharding.add_node(%L, ''<dsn>'') first.', n);
        END IF;
    END LOOP;
    PERFORM sharding._dbl_connect('sharding_move_self', sharding._coordinator_dsn());
    PERFORM sharding._dbl_connect('sharding_move_src', (SELECT x.dsn FROM sharding.nodes x WHERE x.node = source));
    PERFORM sharding._dbl_connect('sharding_move_dst', (SELECT x.dsn FROM sharding.nodes x WHERE x.node = destination));
END $$;
COMMENT ON FUNCTION sharding._move_connect(text, text) IS
    'internal: opens the remote connections of an online move (55000 for a node without DSN)';
COMMENT ON FUNCTION sharding._move_disconnect() IS 'internal: closes the remote connections of an online move';

CREATE OR REPLACE FUNCTION sharding._move_journal(sql text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NOT sharding._dbl_open('sharding_move_self') THEN
        PERFORM sharding._dbl_connect('sharding_move_self', sharding._coordinator_dsn());
    END IF;
    RETURN sharding._dbl_value('sharding_move_self', sql);
END $$;
