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

-- Follow's _remote and _remote_exec on the same C++ helper (no dblink).
-- Follow's remote calls, on the move's libpq helper (src/nodes/remote_exec.cpp):
-- a connection for the call, the statement in its own transaction there,
-- every wait interruptible, the remote statement cancelled when the caller
-- is; a remote error is raised with its SQLSTATE, message, detail and hint.
-- _remote: the first value of a query (NULL if no row).
CREATE OR REPLACE FUNCTION sharding._remote(dsn text, query text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote(text, text) IS
    'internal: first value of a query run on another database (its own connection and transaction)';

-- _remote_exec: runs a command there (CREATE SUBSCRIPTION, ...); its tag.
CREATE OR REPLACE FUNCTION sharding._remote_exec(dsn text, command text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote_exec' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote_exec(text, text) IS
    'internal: runs a command on another database (its own connection and transaction)';


-- _move_wait_flush keeps the journal's lag_bytes current while it waits.
CREATE OR REPLACE FUNCTION sharding._move_wait_flush(name text, seconds float8) RETURNS float8
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    -- The flushed position: walsenders send no further, and everything the
    -- move must carry is there once the freeze has committed (synchronously).
    target pg_lsn := sharding._dbl_value('sharding_move_src', 'SELECT pg_catalog.pg_current_wal_flush_lsn()')::pg_lsn;
    started timestamptz := pg_catalog.clock_timestamp();
    flushed pg_lsn;
    sleep float8 := 0.001;
    noted timestamptz;
BEGIN
    LOOP
        flushed := sharding._dbl_value('sharding_move_src', pg_catalog.format(
            'SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = %L', name))::pg_lsn;
        IF noted IS NULL OR flushed >= target
           OR pg_catalog.clock_timestamp() - noted >= pg_catalog.make_interval(secs => 0.25) THEN
            -- As move_progress reads it: the source's WAL now, less what
            -- the destination confirmed (0 once caught up with the target).
            PERFORM sharding._move_journal(pg_catalog.format(
                'UPDATE sharding.move_journal SET lag_bytes = %s WHERE phase IN (''catching_up'', ''cutover'') '
                'AND sharding._move_name(map, logical) = %L',
                CASE WHEN flushed >= target THEN 0
                     ELSE GREATEST(coalesce(sharding._dbl_value('sharding_move_src', pg_catalog.format(
                              'SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint '
                              'FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = %L', name))::bigint, 0), 0) END,
                name));
            noted := pg_catalog.clock_timestamp();
        END IF;
        EXIT WHEN flushed >= target;
        IF pg_catalog.clock_timestamp() - started > pg_catalog.make_interval(secs => seconds) THEN
            RAISE EXCEPTION 'the destination of move % did not catch up with the source within % s', name, seconds
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = pg_catalog.format('Slot %s confirmed %s, the source is at %s.', name, flushed, target),
                      HINT = 'Look for logical replication apply errors in the destination''s log.';
        END IF;
        PERFORM pg_catalog.pg_sleep(sleep);
        sleep := LEAST(sleep * 2, 0.01);
    END LOOP;
    RETURN extract(epoch FROM pg_catalog.clock_timestamp() - started);
END $$;
