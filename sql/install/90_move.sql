-- Online moves (docs/moves.md). move_shard_online(map, logical, node) and
-- isolate(map, key, node) carry rows between data nodes on PostgreSQL's own
-- logical replication, driven from the coordinator over libpq connections (CREATE and
-- DROP SUBSCRIPTION cannot run in a transaction block, so every remote step
-- is its own autocommit statement on a separate connection).
--
-- How a move runs (named objects: see _move_name):
--   1. journal  a row in sharding.move_journal, committed at once through a
--               loopback connection, so that a later call knows what a
--               crashed or failed one left behind and undoes it;
--   2. source   CREATE PUBLICATION of the map's distributed tables, then a
--               row in sharding.move_decoding naming the shard, then a
--               logical replication slot made over a replication
--               connection with an exported snapshot; its output plugin is
--               this library (src/nodes/move_decoder.cpp), which wraps
--               pgoutput and drops every change outside the moving shard
--               before it is encoded;
--   3. copy     the destination pulls the shard's rows in C++
--               (_move_pull, src/nodes/move_copy.cpp): a libpq connection
--               to the source under the exported snapshot runs
--               COPY (SELECT ... WHERE <shard>) TO STDOUT, fed into the
--               local table through BeginCopyFrom, under
--               session_replication_role = replica (the guard does not
--               fire). Copy and stream never overlap: the copy sees exactly
--               what was committed before the slot's starting point;
--   4. stream   CREATE SUBSCRIPTION (copy_data = false, the slot of step 2):
--               plain PostgreSQL apply of the changes committed since;
--   5. catch up until the slot's confirmed_flush_lsn reaches the source's
--               flushed WAL position quickly (the backlog is small);
--   6. cutover  _freeze_shard at the source (waits for its in-flight
--               writers, then its guard refuses the shard's keys), wait
--               until the destination confirmed the source's last WAL
--               position, switch the owner on the coordinator (move_shard:
--               epoch + 1; isolate: pin), wait until the source shows it
--               (it follows the coordinator), thaw it (it now refuses by
--               ownership), wait until the destination shows it;
--   7. clean    drop the subscription, the slot and the publication, then
--               delete the shard's rows at the source (one transaction).
-- The refusal window is step 6 only: a few round trips and the last
-- moments of replication lag, whatever the shard's size.
--
-- The orchestration is C++ (src/nodes/move_orchestrate.cpp; the functions
-- below marked LANGUAGE C keep their SQL names as thin wrappers); its main
-- block runs in a subtransaction, as a PL/pgSQL EXCEPTION block did.
-- Failure or cancel before the switch: the handler undoes steps
-- 2-6 (drops the subscription, slot and publication, deletes what
-- the copy put at the destination, thaws) and re-raises; the old owner never
-- stopped owning. After the switch: the handler finishes step 7. If the
-- handler itself cannot (a node is down, the coordinator crashed), the
-- journal row stays and the next call for that shard, with any node, does it
-- first.

-- The move journal (docs/moves.md): one row per
-- move, of a rebalance job or of a direct move_shard_online / isolate call,
-- kept after it ends. Local to the coordinator (not followed). Every step
-- commits its phase here BEFORE it acts (through the engine's own
-- connection, not the caller's transaction), so after a crash the row says
-- what to undo or finish: phase 'queued' (nothing done), 'copying' and
-- 'catching_up' and 'cutover' (the switch has not committed: undo),
-- 'cleanup' (the switch has committed, atomically with this phase: finish),
-- then 'done', 'failed' or 'cancelled'.
-- @object sharding.move_journal
CREATE SEQUENCE sharding.move_journal_seq;
CREATE TABLE sharding.move_journal (
    move          bigint PRIMARY KEY DEFAULT pg_catalog.nextval('sharding.move_journal_seq'),
    job           bigint,             -- the rebalance job; NULL for a direct call
    map           text NOT NULL,
    logical       integer NOT NULL,
    key           text,               -- isolate: the key; NULL for a shard move
    source        text NOT NULL,
    destination   text NOT NULL,
    phase         text NOT NULL DEFAULT 'queued'
                  CHECK (phase IN ('queued', 'copying', 'catching_up', 'cutover', 'cleanup', 'done', 'failed', 'cancelled')),
    rows_copied   bigint NOT NULL DEFAULT 0,
    bytes_copied  bigint NOT NULL DEFAULT 0,
    lag_bytes     bigint,             -- WAL the destination still has to apply; NULL before catch-up
    started       timestamptz,
    phase_started timestamptz,
    finished      timestamptz,
    error         text,
    -- internal: how the error was raised (re-raised by move_shard_online)
    error_state   text,
    error_detail  text,
    error_hint    text,
    -- internal: the executing backend (its session-level advisory lock on
    -- (hashtext('sharding.move_journal'), move) says it is alive)
    pid           integer,
    new_epoch     bigint,             -- internal: the shard's epoch after the switch
    rows_moved    bigint,             -- internal: rows deleted at the source (isolate's result)
    undone        boolean NOT NULL DEFAULT false,  -- internal: the rollback has completed
    created       timestamptz NOT NULL DEFAULT pg_catalog.now()
);
-- At most one live move per shard, and per key for isolate.
CREATE UNIQUE INDEX move_journal_live_shard ON sharding.move_journal (map, logical)
    WHERE phase NOT IN ('done', 'failed', 'cancelled');
CREATE UNIQUE INDEX move_journal_live_key ON sharding.move_journal (map, key)
    WHERE key IS NOT NULL AND phase NOT IN ('done', 'failed', 'cancelled');
CREATE INDEX move_journal_job ON sharding.move_journal (job) WHERE job IS NOT NULL;
COMMENT ON TABLE sharding.move_journal IS
    'the move journal: one row per online move (of a job or a direct call), its phase, progress and error';
SELECT pg_catalog.pg_extension_config_dump('sharding.move_journal', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_journal_seq', '');
ALTER SEQUENCE sharding.move_journal_seq OWNED BY sharding.move_journal.move;
GRANT USAGE ON SEQUENCE sharding.move_journal_seq TO sharding_admin;
GRANT SELECT ON sharding.move_journal TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.move_journal TO sharding_admin;
-- @end

-- 1.2's journal, as a view of the moves in progress (or interrupted).
CREATE VIEW sharding.moves AS
    SELECT j.map, j.logical, j.key, j.source, j.destination,
           CASE j.phase WHEN 'queued' THEN 'setup' WHEN 'catching_up' THEN 'catchup'
                        WHEN 'cleanup' THEN 'switched' ELSE j.phase END AS state,
           coalesce(j.started, j.created) AS started
      FROM sharding.move_journal j
     WHERE j.phase NOT IN ('done', 'failed', 'cancelled');
COMMENT ON VIEW sharding.moves IS
    'online moves in progress (or interrupted: the next move of the shard cleans them up); see move_journal';
GRANT SELECT ON sharding.moves TO PUBLIC;

-- _refuse_owner_switch(map, fn): 55000 naming a distributed table of the
-- map: switching owners alone (move_shard, rebalance, rebalance_by_load)
-- would leave its rows on the old owner, where nothing routes any more.
-- @object sharding._refuse_owner_switch
CREATE FUNCTION sharding._refuse_owner_switch(map text, fn text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t text;
BEGIN
    -- A follower refuses configuration changes by itself (its own message).
    IF EXISTS (SELECT FROM sharding.local_node l WHERE l.following) THEN
        RETURN;
    END IF;
    SELECT pg_catalog.format('%I.%I', d.schema_name, d.table_name) INTO t
      FROM sharding.distributed_tables d WHERE d.map = $1
     ORDER BY d.schema_name, d.table_name LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '% would switch owners of map "%" without moving the rows of its distributed table %', fn, map, t
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The rows would stay on the old owner, where nothing routes any more.',
                  HINT = 'Use sharding.rebalance_start or sharding.move_shard_online, which move the rows too.';
    END IF;
END $$;
COMMENT ON FUNCTION sharding._refuse_owner_switch(text, text) IS
    'internal: 55000 if a map has distributed tables (owner switches alone would strand their rows)';
-- @end

-- _move_name(map, logical): the name of the publication, slot, subscription
-- and trigger of a move. Deterministic, so that a later call finds what a
-- crashed one left; slot names allow only [a-z0-9_], so other map names are
-- folded and told apart by a hash.
CREATE FUNCTION sharding._move_name(map text, logical integer) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT 'sharding_move_'
            || CASE WHEN $1 ~ '^[a-z0-9_]{1,24}$' THEN $1
                    ELSE pg_catalog.left(pg_catalog.regexp_replace(pg_catalog.lower($1), '[^a-z0-9_]', '_', 'g'), 16)
                         || '_' || pg_catalog.left(pg_catalog.md5($1), 8) END
            || '_' || $2::text
    $$;
COMMENT ON FUNCTION sharding._move_name(text, integer) IS
    'internal: name of the publication, slot, subscription and trigger of an online move';

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
-- @object sharding._dbl_connect
CREATE FUNCTION sharding._dbl_connect(conn text, dsn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_connect' LANGUAGE C VOLATILE;
-- @end
-- @object sharding._dbl_disconnect
CREATE FUNCTION sharding._dbl_disconnect(conn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_disconnect' LANGUAGE C VOLATILE STRICT;
-- @end
-- @object sharding._dbl_open
CREATE FUNCTION sharding._dbl_open(conn text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__dbl_open' LANGUAGE C VOLATILE STRICT;
-- @end
-- @object sharding._dbl_value
CREATE FUNCTION sharding._dbl_value(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_value' LANGUAGE C VOLATILE STRICT;
-- @end
-- @object sharding._dbl_run
CREATE FUNCTION sharding._dbl_run(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_run' LANGUAGE C VOLATILE STRICT;
-- @end

-- @object sharding._dbl_grants
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
-- @end

-- The copy and the slot, in C++ (src/nodes/move_copy.cpp): the slot is
-- created over a replication connection with an exported snapshot (held
-- open until _move_slot_close or the end of the transaction), and the
-- destination pulls the shard's rows under that snapshot with
-- COPY ... TO STDOUT fed into BeginCopyFrom: copy and stream never overlap,
-- no program runs, the source's DSN is read from sharding.nodes there.
-- @object sharding._move_slot_create
CREATE FUNCTION sharding._move_slot_create(source text, slot text, plugin text, options text,
                                           OUT lsn pg_lsn, OUT snapshot text)
    AS 'MODULE_PATHNAME', 'sharding__move_slot_create' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_slot_create(text, text, text, text) IS
    'internal: creates a move''s logical slot at the source over a replication connection, exporting its snapshot';
-- @end
-- @object sharding._move_slot_close
CREATE FUNCTION sharding._move_slot_close(slot text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_slot_close' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_slot_close(text) IS
    'internal: closes the replication connection holding a move''s exported snapshot';
-- @end
-- @object sharding._move_pull
CREATE FUNCTION sharding._move_pull(source text, snapshot text, rel regclass, columns text[], query text)
    RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding__move_pull' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_pull(text, text, regclass, text[], text) IS
    'internal: at a move''s destination, pulls COPY (query) TO STDOUT from the source under a snapshot into rel; {rows, bytes}';
-- @end
REVOKE ALL ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) TO sharding_admin;

-- What a move's decoder carries (src/nodes/move_decoder.cpp), one row per
-- slot, on the source: written before the slot is created, deleted with it.
-- A user_catalog_table: logical decoding reads it under its historic
-- snapshot. The guard refuses key changes into or out of these shards
-- while a row is here.
CREATE TABLE sharding.move_decoding (
    slot        text PRIMARY KEY,
    map         text NOT NULL,
    shards      integer NOT NULL,
    logical     integer NOT NULL,
    key         text,                       -- isolate: the one key
    pins        text[] NOT NULL DEFAULT '{}',  -- a shard move leaves these keys behind
    tables      oid[] NOT NULL,             -- the map's distributed tables here
    key_columns text[] NOT NULL             -- their key columns, in the same order
) WITH (user_catalog_table = true);
COMMENT ON TABLE sharding.move_decoding IS
    'internal: what the decoder of an online move''s slot carries (source side; one row per slot)';
GRANT SELECT ON sharding.move_decoding TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.move_decoding TO sharding_admin;
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.move_decoding
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
ALTER TABLE sharding.move_decoding ENABLE ALWAYS TRIGGER local_changed;

-- _move_tables(map): the map's distributed tables with what a move needs:
-- qualified name, key column and type, column lists, primary key.
CREATE FUNCTION sharding._move_tables(map text)
    RETURNS TABLE(rel text, key_column text, key_type regtype, cols text, coldefs text, vals text,
                  pk_match text)
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT pg_catalog.format('%I.%I', d.schema_name, d.table_name),
               d.key_column,
               (SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END::pg_catalog.regtype
                  FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
                 WHERE a.attrelid = c.oid AND a.attname = d.key_column),
               (SELECT pg_catalog.string_agg(pg_catalog.format('%I', a.attname), ', ' ORDER BY a.attnum)
                  FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
               (SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', a.attname,
                                                               pg_catalog.format_type(a.atttypid, a.atttypmod)),
                                             ', ' ORDER BY a.attnum)
                  FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
               (SELECT pg_catalog.string_agg(pg_catalog.format('($1).%I', a.attname), ', ' ORDER BY a.attnum)
                  FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
               (SELECT pg_catalog.string_agg(pg_catalog.format('t.%I OPERATOR(pg_catalog.=) ($1).%I',
                                                               a.attname, a.attname), ' AND ')
                  FROM pg_catalog.pg_index i
                  JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                 WHERE i.indrelid = c.oid AND i.indisprimary)
          FROM sharding.distributed_tables d
          JOIN pg_catalog.pg_namespace n ON n.nspname = d.schema_name
          JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = d.table_name
         WHERE d.map = $1
         ORDER BY d.schema_name, d.table_name
    $$;
COMMENT ON FUNCTION sharding._move_tables(text) IS
    'internal: the distributed tables of a map with the column lists an online move needs';

-- _move_filter_sql(rel_key_column, key_type, shards, logical, key, pins):
-- the WHERE condition selecting what a move carries, evaluated where the
-- rows are (source or destination): an unpinned key of the shard, or the
-- one key (compared in the column's type, so that an index can serve it).
CREATE FUNCTION sharding._move_filter_sql(key_column text, key_type regtype, shards integer, logical integer,
                                          key text, pins text[]) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT CASE WHEN $5 IS NOT NULL
                    THEN pg_catalog.format('%I OPERATOR(pg_catalog.=) %L::%s', $1, $5, $2::text)
                    ELSE pg_catalog.format('sharding.shard_of(%I, %s) OPERATOR(pg_catalog.=) %s', $1, $3, $4)
                         || CASE WHEN pg_catalog.cardinality($6) > 0
                                 THEN pg_catalog.format(' AND NOT (%s OPERATOR(pg_catalog.=) ANY (%L::text[]))',
                                                        sharding._key_text_sql(pg_catalog.format('%I', $1), $2), $6)
                                 ELSE '' END END
    $$;
COMMENT ON FUNCTION sharding._move_filter_sql(text, regtype, integer, integer, text, text[]) IS
    'internal: SQL condition selecting the rows an online move carries';

-- _move_drop_replication(name): drops the move's subscription at the
-- destination (connection sharding_move_dst) without contacting the source
-- (which may be down), then its slot and publication at the source
-- (connection sharding_move_src), waiting for the slot to be released.
-- @object sharding._move_drop_replication
CREATE FUNCTION sharding._move_drop_replication(name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_drop_replication' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_drop_replication(text) IS
    'internal: drops an online move''s subscription, slot and publication';
-- @end

-- _move_drop_triggers(map, name): drops the move's filter trigger from the
-- map's tables at the destination.
-- @object sharding._move_drop_triggers
CREATE FUNCTION sharding._move_drop_triggers(map text, name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_drop_triggers' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_drop_triggers(text, text) IS
    'internal: drops an online move''s filter triggers at the destination';
-- @end

-- _move_delete_rows(conn, map, logical, key): deletes what a move carries
-- from the map's tables over a connection (the source after a move, the
-- destination after a failed one), bypassing triggers and the guard (that
-- node does not own these rows); returns how many rows.
-- One plain DELETE per table, its count read from the command tag, all in
-- one remote transaction (all of it or nothing). Not a data-modifying CTE
-- with RETURNING: that stores every deleted row in a tuplestore only to
-- count it, about a third more time for a 1,000,000-row shard.
-- @object sharding._move_delete_rows
CREATE FUNCTION sharding._move_delete_rows(conn text, map text, logical integer, key text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t record;
    shards integer := sharding._require_map(map);
    pins text[];
    total bigint := 0;
    origin text := sharding._move_name(map, logical);
    tag text;
    begun boolean := false;
BEGIN
    SELECT coalesce(pg_catalog.array_agg(p.key), '{}') INTO pins FROM sharding.pins p WHERE p.map = $2;
    IF NOT EXISTS (SELECT FROM sharding._move_tables(map)) THEN
        RETURN 0;
    END IF;
    BEGIN
        -- Under a replication origin of the move's own: the decoders of
        -- other moves from that node drop changes that carry an origin, so
        -- these deletes never travel (a DELETE's old key is not in the WAL
        -- where the key is not in the replica identity, so they could not
        -- be filtered).
        begun := true;
        PERFORM sharding._dbl_run(conn, pg_catalog.format(
            'BEGIN; '
            'SET LOCAL session_replication_role = replica; '
            'SELECT pg_catalog.pg_replication_origin_session_reset() WHERE pg_catalog.pg_replication_origin_session_is_setup(); '
            'SELECT pg_catalog.pg_replication_origin_create(%L) '
            'WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_replication_origin WHERE roname = %L); '
            'SELECT pg_catalog.pg_replication_origin_session_setup(%L)',
            origin, origin, origin));
        FOR t IN SELECT * FROM sharding._move_tables(map) LOOP
            tag := sharding._dbl_value(conn, pg_catalog.format('DELETE FROM %s WHERE %s', t.rel,
                       sharding._move_filter_sql(t.key_column, t.key_type, shards, logical, key, pins)));
            IF tag IS NULL OR tag !~ '^DELETE [0-9]+$' THEN
                RAISE EXCEPTION 'unexpected answer to a DELETE on connection %: %', conn, tag
                    USING ERRCODE = 'protocol_violation';
            END IF;
            total := total + pg_catalog.substr(tag, 8)::bigint;
        END LOOP;
        PERFORM sharding._dbl_run(conn, 'COMMIT');
        begun := false;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        IF begun THEN
            BEGIN
                PERFORM sharding._dbl_run(conn, 'ROLLBACK; SELECT pg_catalog.pg_replication_origin_session_reset() '
                                                'WHERE pg_catalog.pg_replication_origin_session_is_setup()');
            EXCEPTION WHEN OTHERS THEN
                NULL;   -- the connection is gone or unusable: the caller starts from a fresh one
            END;
        END IF;
        RAISE;
    END;
    PERFORM sharding._dbl_run(conn, 'SELECT pg_catalog.pg_replication_origin_session_reset()');
    BEGIN
        PERFORM sharding._dbl_run(conn, pg_catalog.format('SELECT pg_catalog.pg_replication_origin_drop(%L)', origin));
    EXCEPTION WHEN OTHERS THEN
        NULL;   -- in use by a session not yet gone: dropped by the next move of the shard
    END;
    RETURN total;
END $$;
COMMENT ON FUNCTION sharding._move_delete_rows(text, text, integer, text) IS
    'internal: deletes the rows an online move carries on one node (bypassing its guard)';
-- @end

-- _move_call(conn, fn, map, logical): calls sharding.<fn>(map, logical)
-- there if the node has it (_freeze_shard/_thaw_shard exist where the
-- extension is 1.2).
-- @object sharding._move_call
CREATE FUNCTION sharding._move_call(conn text, fn text, map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_call' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_call(text, text, text, integer) IS
    'internal: calls sharding._freeze_shard or _thaw_shard on a node';
-- @end

-- _move_sees_switch(conn, map, logical, key, node, epoch): whether that
-- node's (followed) configuration already shows the switch. A node that
-- does not follow this coordinator counts as seeing it: it has no guard
-- to consult its copy.
-- @object sharding._move_sees_switch
CREATE FUNCTION sharding._move_sees_switch(conn text, map text, logical integer, key text, node text,
                                           new_epoch bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_sees_switch' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_sees_switch(text, text, integer, text, text, bigint) IS
    'internal: whether a node''s followed configuration shows an online move''s switch';
-- @end

-- _move_finish(map, logical, key, destination, epoch): the end of a move
-- whose switch has committed (also run by the next call after a crash):
-- waits until the source and the destination show it, thaws, drops the
-- replication objects, deletes the moved rows at the source and closes the
-- journal. Connections sharding_move_src/_dst/_self are open. Returns the
-- rows deleted at the source.
-- @object sharding._move_finish
CREATE FUNCTION sharding._move_finish(map text, logical integer, key text, destination text, new_epoch bigint)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_finish' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_finish(text, integer, text, text, bigint) IS
    'internal: completes an online move after its switch (thaw, drop replication, delete source rows)';
-- @end

-- _move_undo(map, logical, key): undoes a move whose switch has not
-- committed: drops its replication objects and triggers, deletes what it
-- copied to the destination, thaws the source, closes the journal.
-- @object sharding._move_undo
CREATE FUNCTION sharding._move_undo(map text, logical integer, key text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_undo' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_undo(text, integer, text) IS
    'internal: undoes an online move that has not switched (drops replication, deletes copies, thaws)';
-- @end

-- _move_connect(source, destination): opens sharding_move_src, _dst and
-- _self; 55000 for a node without a connection string.
-- @object sharding._move_connect
CREATE FUNCTION sharding._move_connect(source text, destination text) RETURNS void
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
-- @end

CREATE FUNCTION sharding._move_disconnect() RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._dbl_disconnect('sharding_move_src');
    PERFORM sharding._dbl_disconnect('sharding_move_dst');
    PERFORM sharding._dbl_disconnect('sharding_move_self');
END $$;
COMMENT ON FUNCTION sharding._move_disconnect() IS 'internal: closes the remote connections of an online move';

-- _move_wait_flush(name, seconds): waits until the move's slot at the
-- source has confirmed the source's flushed WAL position; returns the
-- seconds waited. 55000 after `seconds` (the apply is stuck: see the
-- destination's log). While it waits, the live move's lag_bytes in the
-- journal (WAL the destination still has to confirm) is kept current,
-- committed at once, at least every quarter of a second.
-- @object sharding._move_wait_flush
CREATE FUNCTION sharding._move_wait_flush(name text, seconds float8) RETURNS float8
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
COMMENT ON FUNCTION sharding._move_wait_flush(text, float8) IS
    'internal: waits until an online move''s destination has confirmed the source''s current WAL position';
-- @end

-- _move_online(map, logical, key, node): the engine of move_shard_online
-- (key NULL) and isolate (key given, logical its shard). See the top of
-- this file. Returns the shard's epoch afterwards and the rows deleted at
-- the source.
-- @object sharding._move_online
CREATE FUNCTION sharding._move_online(map text, logical integer, key text, node text,
                                      OUT new_epoch bigint, OUT moved bigint)
    AS 'MODULE_PATHNAME', 'sharding__move_online' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_online(text, integer, text, text) IS
    'internal: moves a logical shard (or one key) online; the engine of move_shard_online and isolate';
-- @end

-- _move_journal(sql): runs a statement on the journal through the engine's
-- own connection to this database (sharding_move_self), so that it commits
-- at once, whatever the caller's transaction does; returns its first value.
-- @object sharding._move_journal
CREATE FUNCTION sharding._move_journal(sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_journal' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_journal(text) IS
    'internal: runs a statement on the move journal in its own transaction (committed at once)';
-- @end

-- _move_phase(map, logical, phase): the live move of the shard enters a
-- phase (committed before the phase acts).
-- @object sharding._move_phase
CREATE FUNCTION sharding._move_phase(map text, logical integer, phase text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_phase' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_phase(text, integer, text) IS
    'internal: records the phase a live move enters, before it acts';
-- @end

-- _move_stop_backends(conn, name): ends every other session of that
-- node's database whose application_name is the move's name (a copy left
-- running by a cancelled or dead caller) and waits until they are gone.
-- @object sharding._move_stop_backends
CREATE FUNCTION sharding._move_stop_backends(conn text, name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_stop_backends' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_stop_backends(text, text) IS
    'internal: ends what a move''s sessions still run on a node, and waits for them';
-- @end

-- _move_switch(map, logical, node): the owner switch of an online move.
-- @object sharding._move_switch
CREATE FUNCTION sharding._move_switch(map text, logical integer, node text) RETURNS bigint
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding._switch_owner($1, $2, $3) $$;
COMMENT ON FUNCTION sharding._move_switch(text, integer, text) IS
    'internal: switches a shard''s owner at the cutover of an online move (epoch + 1)';
-- @end

-- _move_resolve(move): rolls back (or, if its switch had committed,
-- finishes) a move whose executor is gone, from its journal row; returns
-- the final phase. The caller holds the move's advisory lock.
-- @object sharding._move_resolve
CREATE FUNCTION sharding._move_resolve(id bigint, final text DEFAULT 'failed') RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
    e bigint;
BEGIN
    SELECT * INTO j FROM sharding.move_journal m WHERE m.move = $1;
    IF j.phase IN ('done', 'failed', 'cancelled') THEN
        RETURN j.phase;
    END IF;
    IF j.phase = 'queued' THEN
        PERFORM sharding._move_journal(pg_catalog.format(
            'UPDATE sharding.move_journal SET phase = %L, finished = pg_catalog.now(), pid = NULL WHERE move = %s',
            final, $1));
        RETURN final;
    END IF;
    PERFORM sharding._move_connect(j.source, j.destination);
    IF j.phase = 'cleanup' THEN
        e := coalesce(j.new_epoch, (SELECT s.epoch FROM sharding.shards s WHERE s.map = j.map AND s.logical = j.logical));
        PERFORM sharding._move_finish(j.map, j.logical, j.key, j.destination, e);
        final := 'done';
    ELSE
        BEGIN
            PERFORM sharding._move_call('sharding_move_src', '_thaw_shard', j.map, j.logical);
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
        PERFORM sharding._move_undo(j.map, j.logical, j.key);
        PERFORM sharding._move_journal(pg_catalog.format(
            'UPDATE sharding.move_journal SET phase = %L, finished = pg_catalog.now(), pid = NULL, '
            'error = coalesce(error, %L), error_state = coalesce(error_state, ''55000'') WHERE move = %s',
            final, pg_catalog.format('interrupted in phase %s, rolled back', j.phase), $1));
    END IF;
    PERFORM sharding._move_disconnect();
    RETURN final;
END $$;
COMMENT ON FUNCTION sharding._move_resolve(bigint, text) IS
    'internal: rolls back or finishes an interrupted move from its journal row';
-- @end

-- _move_enqueue(job, map, logical, key, destination): a 'queued' journal
-- row (committed at once); the source is the current owner.
-- @object sharding._move_enqueue
CREATE FUNCTION sharding._move_enqueue(job bigint, map text, logical integer, key text, destination text)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    src text;
    n text;
    d text;
    id text;
    j record;
BEGIN
    IF destination IS NULL OR destination = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(pg_catalog.quote_literal(destination), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    l := sharding._require_map(map);
    IF key IS NOT NULL THEN
        IF logical IS NULL THEN
            logical := sharding.logical_shard(map, key);
        ELSIF logical IS DISTINCT FROM sharding.logical_shard(map, key) THEN
            RAISE EXCEPTION 'key % is in logical shard %, not %', pg_catalog.quote_literal(key),
                    sharding.logical_shard(map, key), logical
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    PERFORM sharding._check_logical(map, logical, l);
    src := (SELECT s.node FROM sharding.shards s WHERE s.map = _move_enqueue.map AND s.logical = _move_enqueue.logical);
    IF key IS NOT NULL THEN
        src := coalesce((SELECT p.node FROM sharding.pins p WHERE p.map = _move_enqueue.map AND p.key = _move_enqueue.key), src);
    END IF;
    IF src IS DISTINCT FROM destination THEN
        FOREACH n IN ARRAY ARRAY[destination, src] LOOP   -- the argument first
            SELECT x.dsn INTO d FROM sharding.nodes x WHERE x.node = n;
            IF d IS NULL THEN
                RAISE EXCEPTION 'node "%" has no connection string', n
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = 'Moving a shard online connects to its source and its destination.',
                          HINT = pg_catalog.format('Call sharding.add_node(%L, ''<dsn>'') first.', n);
            END IF;
        END LOOP;
    END IF;
    SELECT m.move, m.phase, m.error INTO j FROM sharding.move_journal m
     WHERE m.map = _move_enqueue.map AND (m.logical = _move_enqueue.logical OR m.key = _move_enqueue.key)
       AND m.phase NOT IN ('done', 'failed', 'cancelled')
     LIMIT 1;
    IF FOUND AND j.error IS NOT NULL THEN
        RAISE EXCEPTION 'logical shard % of map "%" is already being moved (move %, phase %)', logical, map, j.move, j.phase
            USING ERRCODE = 'object_in_use',
                  DETAIL = pg_catalog.format('It was interrupted and could not be rolled back yet: %s', j.error),
                  HINT = 'The next sharding.move_shard_online or sharding._move_recover tries again.';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'logical shard % of map "%" is already being moved (move %, phase %)', logical, map, j.move, j.phase
            USING ERRCODE = 'object_in_use',
                  HINT = 'Wait for it, or cancel it with sharding._move_cancel.';
    END IF;
    BEGIN
        id := sharding._move_journal(pg_catalog.format(
            'INSERT INTO sharding.move_journal (job, map, logical, key, source, destination) '
            'VALUES (%s, %L, %s, %L, %L, %L) RETURNING move',
            coalesce(job::text, 'NULL'), map, logical, key, src, destination));
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'logical shard % of map "%" is already being moved', logical, map
            USING ERRCODE = 'object_in_use';
    END;
    RETURN id::bigint;
END $$;
COMMENT ON FUNCTION sharding._move_enqueue(bigint, text, integer, text, text) IS
    'internal: journals a queued online move (of a job, or a direct call) and returns its id';
-- @end

-- _move_execute(move): carries out a queued move, or resumes / rolls back
-- an interrupted one, to its end; returns 'done', 'failed' or 'cancelled'.
-- A failure is recorded (error) and returned, not raised; a cancel of the
-- caller rolls back, records 'cancelled' and is re-raised.
-- @object sharding._move_execute
CREATE FUNCTION sharding._move_execute(id bigint) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
    res record;
    final text;
    st text;
    msg text;
    det text;
    hnt text;
    lock_class integer := pg_catalog.hashtext('sharding.move_journal');
    lock_obj integer := ($1 % 2147483647)::integer;
BEGIN
    SELECT * INTO j FROM sharding.move_journal m WHERE m.move = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'move % does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    IF j.phase IN ('done', 'failed', 'cancelled') THEN
        RETURN j.phase;
    END IF;
    -- The executor's session-level lock: it says the move is alive.
    IF NOT pg_catalog.pg_try_advisory_lock(lock_class, lock_obj) THEN
        RAISE EXCEPTION 'move % is being carried out by another session', $1 USING ERRCODE = 'object_in_use';
    END IF;
    BEGIN
        IF j.phase <> 'queued' THEN
            final := sharding._move_resolve($1);
        ELSE
            final := sharding._move_journal(pg_catalog.format(
                'UPDATE sharding.move_journal SET pid = %s, started = pg_catalog.now(), phase_started = pg_catalog.now() '
                'WHERE move = %s AND phase = ''queued'' RETURNING phase', pg_catalog.pg_backend_pid(), $1));
            IF final IS NULL THEN   -- cancelled meanwhile
                PERFORM pg_catalog.pg_advisory_unlock(lock_class, lock_obj);
                RETURN (SELECT m.phase FROM sharding.move_journal m WHERE m.move = $1);
            END IF;
            res := sharding._move_online(j.map, j.logical, j.key, j.destination);
            -- Moves that copy nothing (same owner, no distributed table) end here.
            PERFORM sharding._move_journal(pg_catalog.format(
                'UPDATE sharding.move_journal SET phase = ''done'', phase_started = pg_catalog.now(), '
                'finished = pg_catalog.now(), pid = NULL, new_epoch = coalesce(new_epoch, %s), '
                'rows_moved = coalesce(rows_moved, %s) WHERE move = %s AND phase NOT IN (''done'', ''failed'', ''cancelled'')',
                coalesce(res.new_epoch::text, 'NULL'), coalesce(res.moved, 0), $1));
            final := 'done';
        END IF;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
        final := CASE WHEN st = '57014' THEN 'cancelled' ELSE 'failed' END;
        -- Rolled back (or never started): the row ends. Otherwise (the
        -- rollback or the finish could not complete) it stays in its phase
        -- for _move_recover, with the error.
        BEGIN
            PERFORM sharding._move_journal(pg_catalog.format(
                'UPDATE sharding.move_journal SET phase = CASE WHEN undone OR phase = ''queued'' THEN %L ELSE phase END, '
                'finished = CASE WHEN undone OR phase = ''queued'' THEN pg_catalog.now() END, '
                'error = %L, error_state = %L, error_detail = %L, error_hint = %L, pid = NULL '
                'WHERE move = %s AND phase NOT IN (''done'', ''failed'', ''cancelled'')',
                final, msg, st, nullif(det, ''), nullif(hnt, ''), $1));
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'could not record the end of move %: %', $1, SQLERRM;
        END;
        PERFORM pg_catalog.pg_advisory_unlock(lock_class, lock_obj);
        IF st = '57014' THEN
            RAISE EXCEPTION USING ERRCODE = 'query_canceled', MESSAGE = msg;
        END IF;
        RETURN 'failed';
    END;
    PERFORM pg_catalog.pg_advisory_unlock(lock_class, lock_obj);
    RETURN final;
END $$;
COMMENT ON FUNCTION sharding._move_execute(bigint) IS
    'internal: carries out (or resumes, or rolls back) a journaled move to its end; returns its final phase';
-- @end

-- _move_cancel(move): a queued move becomes 'cancelled'; a move in flight
-- is told to stop (its executor is cancelled and rolls back); false if it
-- had already ended.
-- @object sharding._move_cancel
CREATE FUNCTION sharding._move_cancel(id bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
    lock_class integer := pg_catalog.hashtext('sharding.move_journal');
    lock_obj integer := ($1 % 2147483647)::integer;
BEGIN
    SELECT * INTO j FROM sharding.move_journal m WHERE m.move = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'move % does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    IF j.phase IN ('done', 'failed', 'cancelled') THEN
        RETURN false;
    END IF;
    IF j.phase = 'queued' AND sharding._move_journal(pg_catalog.format(
           'UPDATE sharding.move_journal SET phase = ''cancelled'', finished = pg_catalog.now() '
           'WHERE move = %s AND phase = ''queued'' AND pid IS NULL RETURNING phase', $1)) IS NOT NULL THEN
        RETURN true;
    END IF;
    IF pg_catalog.pg_try_advisory_lock(lock_class, lock_obj) THEN
        -- Nobody runs it (its executor died): roll it back here.
        BEGIN
            PERFORM sharding._move_resolve($1, 'cancelled');
        EXCEPTION WHEN OTHERS THEN
            PERFORM pg_catalog.pg_advisory_unlock(lock_class, lock_obj);
            RAISE;
        END;
        PERFORM pg_catalog.pg_advisory_unlock(lock_class, lock_obj);
        RETURN true;
    END IF;
    PERFORM pg_catalog.pg_cancel_backend(j.pid);
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding._move_cancel(bigint) IS
    'internal: cancels a queued or running move (it rolls back); false if it had ended';
-- @end

-- _move_recover(): resumes or rolls back every move whose executor died
-- (crash, kill -9, restart); returns how many.
-- @object sharding._move_recover
CREATE FUNCTION sharding._move_recover() RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
    n integer := 0;
    lock_class integer := pg_catalog.hashtext('sharding.move_journal');
BEGIN
    FOR j IN SELECT m.move FROM sharding.move_journal m
              WHERE m.phase NOT IN ('queued', 'done', 'failed', 'cancelled')
                AND m.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
              ORDER BY m.move LOOP
        CONTINUE WHEN NOT pg_catalog.pg_try_advisory_lock(lock_class, (j.move % 2147483647)::integer);
        BEGIN
            PERFORM sharding._move_resolve(j.move);
            n := n + 1;
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'could not recover move %: %', j.move, SQLERRM
                USING HINT = 'Its journal row stays; the next call tries again.';
        END;
        PERFORM pg_catalog.pg_advisory_unlock(lock_class, (j.move % 2147483647)::integer);
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding._move_recover() IS
    'internal: rolls back or finishes every move whose executor died; returns how many';
-- @end

REVOKE ALL ON FUNCTION sharding._move_journal(text), sharding._move_phase(text, integer, text),
    sharding._move_stop_backends(text, text), sharding._move_switch(text, integer, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_journal(text), sharding._move_phase(text, integer, text),
    sharding._move_stop_backends(text, text), sharding._move_switch(text, integer, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    TO sharding_admin;

-- _move_raise(move): raises the recorded error of a move that did not end
-- 'done' (move_shard_online and isolate raise what the engine recorded).
-- @object sharding._move_raise
CREATE FUNCTION sharding._move_raise(id bigint) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
BEGIN
    SELECT * INTO j FROM sharding.move_journal m WHERE m.move = $1;
    IF j.phase = 'cleanup' THEN
        -- The move itself happened; only its tidying failed.
        RAISE EXCEPTION 'logical shard % of map "%" moved to "%" (epoch %), but finishing failed: %',
                j.logical, j.map, j.destination, j.new_epoch, j.error
            USING ERRCODE = coalesce(j.error_state, '55000'), HINT = 'Call sharding.move_shard_online again to finish.';
    END IF;
    IF j.phase NOT IN ('failed', 'cancelled') THEN
        RAISE WARNING 'could not clean up after the failed move of logical shard % of map "%"', j.logical, j.map
            USING HINT = 'The next sharding.move_shard_online or sharding.isolate of this shard cleans up first.';
    END IF;
    IF j.error_detail IS NULL AND j.error_hint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = coalesce(j.error_state, '55000'), MESSAGE = coalesce(j.error, 'move failed');
    ELSIF j.error_hint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = coalesce(j.error_state, '55000'), MESSAGE = coalesce(j.error, 'move failed'),
                              DETAIL = j.error_detail;
    ELSIF j.error_detail IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = coalesce(j.error_state, '55000'), MESSAGE = coalesce(j.error, 'move failed'),
                              HINT = j.error_hint;
    END IF;
    RAISE EXCEPTION USING ERRCODE = coalesce(j.error_state, '55000'), MESSAGE = coalesce(j.error, 'move failed'),
                          DETAIL = j.error_detail, HINT = j.error_hint;
END $$;
COMMENT ON FUNCTION sharding._move_raise(bigint) IS
    'internal: raises the recorded error of a move that failed';
-- @end

-- _move_refuse_written(): the source's slot waits for every transaction
-- holding a transaction id to end, this one included when the source
-- shares its instance: refused before anything happens.
-- @object sharding._move_refuse_written
CREATE FUNCTION sharding._move_refuse_written() RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF pg_catalog.txid_current_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'moving a shard online must run in a transaction that has not written yet'
            USING ERRCODE = 'active_sql_transaction',
                  HINT = 'Call it in its own transaction.';
    END IF;
END $$;
COMMENT ON FUNCTION sharding._move_refuse_written() IS
    'internal: 25001 in a transaction that has written (a move''s slot would wait for it)';
-- @end

-- move_shard_online(map text, logical integer, node text): contract
-- section 8. Not STRICT: NULL arguments raise 22023. A journaled move:
-- _move_execute(_move_enqueue(NULL, map, logical, NULL, node)).
-- @object sharding.move_shard_online
CREATE FUNCTION sharding.move_shard_online(map text, logical integer, node text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    cur record;
    id bigint;
BEGIN
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    l := sharding._require_map(map);
    PERFORM sharding._check_logical(map, logical, l);
    -- What an interrupted move left is cleaned up first.
    PERFORM sharding._move_recover();
    SELECT s.node, s.epoch INTO cur FROM sharding.shards s
     WHERE s.map = move_shard_online.map AND s.logical = move_shard_online.logical;
    IF cur.node = move_shard_online.node THEN
        RETURN cur.epoch;
    END IF;
    PERFORM sharding._move_refuse_written();
    id := sharding._move_enqueue(NULL, map, logical, NULL, node);
    IF sharding._move_execute(id) <> 'done' THEN
        PERFORM sharding._move_raise(id);
    END IF;
    RETURN (SELECT m.new_epoch FROM sharding.move_journal m WHERE m.move = id);
END $$;
COMMENT ON FUNCTION sharding.move_shard_online(text, integer, text) IS
    'moves a logical shard with its rows to a node while writes go on (logical replication); returns its new epoch';
-- @end

-- isolate(map text, key text, node text): contract section 8. Not STRICT.
-- @object sharding.isolate
CREATE FUNCTION sharding.isolate(map text, key text, node text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    src text;
    id bigint;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map(map);
    l := sharding.logical_shard(map, key);
    PERFORM sharding._move_recover();
    src := coalesce((SELECT p.node FROM sharding.pins p WHERE p.map = isolate.map AND p.key = isolate.key),
                    (SELECT s.node FROM sharding.shards s WHERE s.map = isolate.map AND s.logical = l));
    IF src = node THEN
        PERFORM sharding.pin(map, key, node);   -- isolate pins even where the rows already are
        RETURN 0;
    END IF;
    PERFORM sharding._move_refuse_written();
    id := sharding._move_enqueue(NULL, map, l, key, node);
    IF sharding._move_execute(id) <> 'done' THEN
        PERFORM sharding._move_raise(id);
    END IF;
    RETURN (SELECT coalesce(m.rows_moved, 0) FROM sharding.move_journal m WHERE m.move = id);
END $$;
COMMENT ON FUNCTION sharding.isolate(text, text, text) IS
    'pins a key to a node and moves its rows of every distributed table there online; returns rows moved';
-- @end

REVOKE ALL ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() TO sharding_admin;

-- Moving data between databases is an administrator's job.
REVOKE ALL ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text),
    sharding._move_finish(text, integer, text, text, bigint), sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_drop_replication(text),
    sharding._move_drop_triggers(text, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text),
    sharding._move_finish(text, integer, text, text, bigint), sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_drop_replication(text),
    sharding._move_drop_triggers(text, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    TO sharding_admin;
