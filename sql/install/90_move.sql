-- Online moves (docs/moves.md). move_shard_online(map, logical, node) and
-- isolate(map, key, node) carry rows between data nodes on PostgreSQL's own
-- logical replication, driven from the coordinator over libpq connections (CREATE and
-- DROP SUBSCRIPTION cannot run in a transaction block, so every remote step
-- is its own autocommit statement on a separate connection).
--
-- How a move runs: docs/moves.md, "Steps", lists its steps once, each
-- named as the journal's phase it runs in (queued, copying, catching_up,
-- cutover, cleanup, then done, failed or cancelled; sharding.move_journal
-- below), in the order of src/move/move_online.cpp, where each is a
-- function of its own. The refusal window is from the cutover's freeze to
-- the thaw in cleanup: a few round trips and the last moments of
-- replication lag, whatever the shard's size.
--
-- The orchestration is C++ (src/move/move_orchestrate.cpp; the functions
-- below marked LANGUAGE C keep their SQL names as thin wrappers); its main
-- block runs in a subtransaction, as a PL/pgSQL EXCEPTION block did.
-- Failure or cancel before the switch (phases copying to cutover): the
-- handler undoes the move (drops the subscription, slot and publication,
-- deletes what the copy put at the destination, thaws) and re-raises; the
-- old owner never stopped owning. After the switch (cleanup): the handler
-- finishes the clean-up. If the
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
    created       timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- the role the move runs as (docs/moves.md, "Rights"): the one that
    -- started it (the job's role for a job's move); its recovery acts with
    -- that role's rights. Written by the engine; a role may write only one
    -- it has the privileges of (sharding._move_journal_guard).
    runas         oid NOT NULL DEFAULT (pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER::text)))::oid,
    -- internal: the name of the move's publication, slot, subscription and
    -- origins, unique to this coordinator (docs/moves.md, "Names"); NULL
    -- for a move journaled by 1.3 (named by _move_name)
    name          text,
    -- internal: the move's plan, fixed when it starts (docs/moves.md): the
    -- map's shard count, its pins then (the keys a shard move leaves
    -- behind), the tables with the condition selecting what the move
    -- carries, and the tables' leaf partitions at the source. The deletes
    -- after the switch, of an undo and of a recovery use it, never the
    -- configuration as it is by then.
    plan_shards   integer,
    plan_pins     text[],
    plan_tables   text[],
    plan_filters  text[],
    plan_leaves   text[],
    -- internal: what the copy is expected to send (estimated at the source
    -- when it starts) and when it started: move_progress.time_left
    rows_expected bigint,
    copy_started  timestamptz,
    -- internal: the executor left the source's delete to the move cleaner
    -- (sharding.move_cleanup = deferred; the row stays in phase cleanup)
    cleanup_deferred boolean NOT NULL DEFAULT false,
    -- internal: the machines of the move's ends and their CPUs, as each
    -- node said when the move started (sharding._move_host; NULL when it
    -- could not): moves in flight on one host share its CPUs' worth of
    -- copy and delete sessions (docs/moves.md, "Sessions")
    source_host      text,
    source_cpus      integer,
    destination_host text,
    destination_cpus integer
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

-- @object sharding.moves
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
-- @end

-- _move_refuse(map, logical, what, keys, node): 55006 naming the move when
-- a move in flight (its plan fixed: phase copying to cleanup) is one that
-- `what` would change the plan of (docs/moves.md, "A move's plan is fixed
-- when it starts"): a move of `map` (any map when NULL), of shard `logical`
-- (any when NULL), of the shard of one of `keys` by the map's key type,
-- with `node` as its source or destination. The move's own switch passes
-- (sharding_move.own, set by the engine to the move's id). Takes the map's
-- plan lock in share mode until commit: a move fixing its plan waits for
-- the caller, and a caller after it sees the move.
-- @object sharding._move_refuse
CREATE FUNCTION sharding._move_refuse(map text, logical integer, what text, keys text[] DEFAULT NULL,
                                      node text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    m record;
    k text;
    l integer;
    own text := pg_catalog.current_setting('sharding_move.own', true);
BEGIN
    IF $1 IS NOT NULL THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtext('sharding.move_plan'), pg_catalog.hashtext($1));
    END IF;
    FOR m IN SELECT j.move, j.map, j.logical, j.key, j.source, j.destination, j.phase
               FROM sharding.move_journal j
              WHERE ($1 IS NULL OR j.map = $1) AND ($2 IS NULL OR j.logical = $2)
                AND ($5 IS NULL OR $5 IN (j.source, j.destination))
                AND j.phase NOT IN ('queued', 'done', 'failed', 'cancelled')
                AND j.move::text IS DISTINCT FROM own
              ORDER BY j.move LOOP
        IF $4 IS NOT NULL THEN
            -- Only keys of the moving shard, by the map's key type (a key
            -- the type rejects: by its text form).
            l := NULL;
            FOREACH k IN ARRAY $4 LOOP
                BEGIN
                    l := sharding._job_key_shard(m.map, k);
                EXCEPTION WHEN data_exception THEN
                    l := sharding.shard_of(k, sharding._require_map(m.map));
                END;
                EXIT WHEN l = m.logical;
            END LOOP;
            CONTINUE WHEN l IS DISTINCT FROM m.logical;
        END IF;
        RAISE EXCEPTION '% refused: move % of logical shard % of map "%" (% to %) is in flight', $3, m.move,
                m.logical, m.map, m.source, m.destination
            USING ERRCODE = 'object_in_use',
                  DETAIL = format('Phase %s; the move acts on the plan it fixed when it started.', m.phase),
                  HINT = format('Wait for the move to end, or cancel it: SELECT sharding._move_cancel(%s);', m.move);
    END LOOP;
END $$;
COMMENT ON FUNCTION sharding._move_refuse(text, integer, text, text[], text) IS
    'internal: 55006 naming the move when a move in flight would be changed by what the caller does';
-- @end

-- DROP EXTENSION sharding (or DROP SCHEMA sharding) while a move is in
-- flight would leave its slot, publication, subscription and frozen shard
-- at the nodes with no record of them anywhere: refused, 55006 naming the
-- move (_move_refuse). An event trigger at ddl_command_start sees the
-- statement, not its objects: it refuses such a statement that names
-- sharding (current_query()), whatever else it drops.
-- @object sharding._refuse_drop_during_move
CREATE FUNCTION sharding._refuse_drop_during_move() RETURNS event_trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF pg_catalog.current_query() ~* 'sharding' THEN
        PERFORM sharding._move_refuse(NULL, NULL, tg_tag);
    END IF;
END $$;
COMMENT ON FUNCTION sharding._refuse_drop_during_move() IS
    'internal: refuses DROP EXTENSION sharding (or DROP SCHEMA) while a move is in flight (55006)';
CREATE EVENT TRIGGER sharding_refuse_drop_during_move ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA')
    EXECUTE FUNCTION sharding._refuse_drop_during_move();
-- @end

-- _refuse_owner_switch(map, fn): 55000 naming a distributed table of the
-- map: switching owners alone (move_shard, rebalance, rebalance_by_load)
-- would leave its rows on the old owner, where nothing routes any more. On
-- a follower it passes (the caller refuses there with its own message).
-- C++ (src/move/move_journal.cpp).
-- @object sharding._refuse_owner_switch
CREATE FUNCTION sharding._refuse_owner_switch(map text, fn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__refuse_owner_switch' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._refuse_owner_switch(text, text) IS
    'internal: 55000 if a map has distributed tables (owner switches alone would strand their rows)';
-- @end

-- _move_name(map, logical): the name of the publication, slot, subscription
-- and replication origin of a move: the live move's, as its journal row
-- stores it, else the one a move of that shard gets from this coordinator,
-- sharding_move_<tag>_<map>_<logical> (docs/moves.md, "Names": the tag
-- tells coordinators apart whose nodes share an instance; a row journaled
-- by 1.3 keeps its name, without one). Stored, so that a later call finds
-- what a crashed one left; slot names allow only [a-z0-9_], so other
-- map names are folded (lower case, other characters '_', 16 characters)
-- and told apart by the first 8 hex digits of their md5. C++
-- (src/move/move_orchestrate.cpp).
-- @object sharding._move_name
CREATE FUNCTION sharding._move_name(map text, logical integer) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_name' LANGUAGE C STABLE STRICT PARALLEL RESTRICTED
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_name(text, integer) IS
    'internal: name of the publication, slot, subscription and trigger of an online move';
-- @end

-- The move's remote connections, in C++ (src/remote/remote_exec.cpp): named
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
-- that much later, inside the cutover's refusal window.
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

-- The copy and the slot, in C++ (src/datanode/move_copy.cpp): the slot is
-- created over a replication connection with an exported snapshot (held
-- open until the end of the transaction), and the
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
-- @object sharding._move_pull
CREATE FUNCTION sharding._move_pull(source text, snapshot text, rel regclass, columns text[], query text)
    RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding__move_pull' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_pull(text, text, regclass, text[], text) IS
    'internal: at a move''s destination, pulls COPY (query) TO STDOUT from the source under a snapshot into rel; {rows, bytes}';
-- @end
-- @object sharding._move_copy_grants
REVOKE ALL ON FUNCTION sharding._move_slot_create(text, text, text, text),
    sharding._move_pull(text, text, regclass, text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_slot_create(text, text, text, text),
    sharding._move_pull(text, text, regclass, text[], text) TO sharding_admin;
-- @end
-- @object sharding._move_nice
-- _move_nice(step): a session of a move's copy lowers its own priority
-- (sharding.move_nice, src/datanode/move_copy.cpp).
CREATE FUNCTION sharding._move_nice(step integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__move_nice' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_nice(integer) IS
    'internal: raises this backend''s nice value by step (0-19) for a move''s copy; returns the new value';
REVOKE ALL ON FUNCTION sharding._move_nice(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_nice(integer) TO sharding_admin;
-- @end

-- @object sharding._move_host
-- _move_host(): the machine this node runs on (the kernel's boot id, which
-- every instance and container of one host shares) and the CPUs its
-- backends may use (their affinity mask, or fewer where a cgroup's CPU
-- quota allows less). A move asks both ends when it starts (its journal
-- row): moves in flight on one host share its CPUs (move_share,
-- src/move/move_orchestrate.cpp).
CREATE FUNCTION sharding._move_host(OUT host text, OUT cpus integer)
    AS 'MODULE_PATHNAME', 'sharding__move_host' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_host() IS
    'internal: this node''s host (its kernel''s boot id) and the CPUs its backends may use (affinity, cgroup CPU quota), for the sharing of a move''s sessions';
REVOKE ALL ON FUNCTION sharding._move_host() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_host() TO sharding_admin;
-- @end

-- @object sharding.move_decoding
-- What a move's decoder carries (src/datanode/move_decoder.cpp), one row per
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
-- Written only by the engine's sessions at the source (the DSN's user),
-- never by sharding_admin directly (SEC-2).
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.move_decoding
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
ALTER TABLE sharding.move_decoding ENABLE ALWAYS TRIGGER local_changed;
-- @end

-- _move_tables(map): the map's distributed tables that exist here, with what
-- a move needs: qualified name, key column and type (a domain's base
-- type), column lists (generated columns left out), primary key. Read from
-- the catalogs in C++ (src/move/move_orchestrate.cpp), without locking the
-- tables.
-- @object sharding._move_tables
CREATE FUNCTION sharding._move_tables(map text)
    RETURNS TABLE(rel text, key_column text, key_type regtype, cols text, coldefs text, vals text,
                  pk_match text)
    AS 'MODULE_PATHNAME', 'sharding__move_tables' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_tables(text) IS
    'internal: the distributed tables of a map with the column lists an online move needs';
-- @end

-- _move_filter_sql(rel_key_column, key_type, shards, logical, key, pins):
-- the WHERE condition selecting what a move carries, evaluated where the
-- rows are (source or destination): an unpinned key of the shard, or the
-- one key (compared in the column's type, so that an index can serve it).
-- Not STRICT: key NULL selects the shard, pins NULL leaves none out. C++
-- (src/move/move_orchestrate.cpp); the pins' text form is
-- sharding._key_text_sql's.
-- @object sharding._move_filter_sql
CREATE FUNCTION sharding._move_filter_sql(key_column text, key_type regtype, shards integer, logical integer,
                                          key text, pins text[]) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_filter_sql' LANGUAGE C IMMUTABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_filter_sql(text, regtype, integer, integer, text, text[]) IS
    'internal: SQL condition selecting the rows an online move carries';
-- @end

-- _move_delete_rows(conn, map, logical, key): deletes what a move carries
-- from the map's tables over a connection (the source after a move, the
-- destination after a failed one), bypassing triggers and the guard (that
-- node does not own these rows); returns how many rows. C++
-- (src/move/move_delete.cpp): one remote transaction under a replication
-- origin of the move's own, one _move_delete_local call per table there.
-- Not STRICT: key is NULL for a shard move.
-- @object sharding._move_delete_rows
CREATE FUNCTION sharding._move_delete_rows(conn text, map text, logical integer, key text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_delete_rows' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_delete_rows(text, text, integer, text) IS
    'internal: deletes the rows an online move carries on one node (bypassing its guard)';
-- @end

-- _move_delete_local(rel, filter): on that node, DELETE FROM rel WHERE
-- filter (one condition), with the BEFORE ROW DELETE triggers that cannot
-- fire in the session (the guard's, under session_replication_role =
-- replica) left out for the statement: PostgreSQL would lock every row
-- before finding that none fires. Returns the rows deleted.
-- @object sharding._move_delete_local
CREATE FUNCTION sharding._move_delete_local(rel regclass, filter text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_delete_local' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_delete_local(regclass, text) IS
    'internal: deletes a move''s rows of one table on this node, idle row triggers left out';
REVOKE ALL ON FUNCTION sharding._move_delete_local(regclass, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_delete_local(regclass, text) TO sharding_admin;
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
-- _self; 55000 for a node without a connection string (the destination is
-- checked first).
-- @object sharding._move_connect
CREATE FUNCTION sharding._move_connect(source text, destination text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_connect' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_connect(text, text) IS
    'internal: opens the remote connections of an online move (55000 for a node without DSN)';
-- @end

-- @object sharding._move_disconnect
CREATE FUNCTION sharding._move_disconnect() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_disconnect' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_disconnect() IS 'internal: closes the remote connections of an online move';
-- @end

-- _move_wait_flush(name, seconds): waits until the move's slot at the
-- source has confirmed the source's flushed WAL position; returns the
-- seconds waited (seconds NULL: no limit). 55000 after `seconds` (the
-- apply is stuck: see the destination's log). While it waits, the live
-- move's lag_bytes in the journal (WAL the destination still has to
-- confirm) is kept current, committed at once, at least every quarter of a
-- second. Interruptible: a cancel ends it between two polls, and a poll
-- running at the source is cancelled there.
-- @object sharding._move_wait_flush
CREATE FUNCTION sharding._move_wait_flush(name text, seconds float8) RETURNS float8
    AS 'MODULE_PATHNAME', 'sharding__move_wait_flush' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
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

-- (1.3's _move_journal(sql), which ran any statement over that connection,
-- as whichever role coordinator_dsn names, is gone: SEC-2. The engine
-- builds every statement on the journal itself.)

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

-- _move_watch(subscription): at a move's destination, the coordinator's
-- connection (the move's controller) watches the move's subscription until
-- it ends or calls _move_watch(NULL): a session that ends first (the
-- coordinator crashed, was killed or stopped) stops the subscription's
-- apply worker, and with it what the worker had received but not applied.
-- The source's decoder sends nothing more once the controller is gone
-- there too (src/datanode/move_controller.hpp). The caller must own the
-- subscription. Not STRICT: NULL stops watching.
-- @object sharding._move_watch
CREATE FUNCTION sharding._move_watch(subscription text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_watch' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_watch(text) IS
    'internal: at a move''s destination, stops the subscription''s worker when this session (the controller''s) ends';
REVOKE ALL ON FUNCTION sharding._move_watch(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_watch(text) TO sharding_admin;
-- @end

-- The journal interface, in C++ (src/move/move_journal.cpp). The executor
-- of a move holds the session-level advisory lock
-- (hashtext('sharding.move_journal'), move): a move whose lock is free and
-- whose phase is not final was interrupted.

-- _move_resolve(move): rolls back (or, if its switch had committed,
-- finishes) a move whose executor is gone, from its journal row; returns
-- the final phase. The caller holds the move's advisory lock.
-- @object sharding._move_resolve
CREATE FUNCTION sharding._move_resolve(id bigint, final text DEFAULT 'failed') RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_resolve' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_resolve(bigint, text) IS
    'internal: rolls back or finishes an interrupted move from its journal row';
-- @end

-- _move_enqueue(job, map, logical, key, destination): a 'queued' journal
-- row (committed at once); the source is the current owner (for a key, its
-- pinned node). 55006 while the shard (or the key) has a live move.
-- @object sharding._move_enqueue
CREATE FUNCTION sharding._move_enqueue(job bigint, map text, logical integer, key text, destination text)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_enqueue' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_enqueue(bigint, text, integer, text, text) IS
    'internal: journals a queued online move (of a job, or a direct call) and returns its id';
-- @end

-- _move_execute(move): carries out a queued move, or resumes / rolls back
-- an interrupted one, to its end; returns 'done', 'failed' or 'cancelled'.
-- A failure is recorded (error) and returned, not raised; a cancel of the
-- caller rolls back, records 'cancelled' and is re-raised.
-- @object sharding._move_execute
CREATE FUNCTION sharding._move_execute(id bigint) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_execute' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_execute(bigint) IS
    'internal: carries out (or resumes, or rolls back) a journaled move to its end; returns its final phase';
-- @end

-- _move_cancel(move): a queued move becomes 'cancelled'; a move in flight
-- is told to stop (its executor is cancelled and rolls back); one whose
-- executor died is rolled back here; false if it had already ended.
-- @object sharding._move_cancel
CREATE FUNCTION sharding._move_cancel(id bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_cancel' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_cancel(bigint) IS
    'internal: cancels a queued or running move (it rolls back); false if it had ended';
-- @end

-- _move_recover(): resumes or rolls back every move whose executor died
-- (crash, kill -9, restart); returns how many. A move it cannot resolve
-- now (a node is down) stays, with a WARNING.
-- @object sharding._move_recover
CREATE FUNCTION sharding._move_recover() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__move_recover' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_recover() IS
    'internal: rolls back or finishes every move whose executor died; returns how many';
-- @end

-- move_abandon(map, logical, force DEFAULT false): ends the live move of a
-- shard whose source or destination is gone for good (docs/moves.md, "A
-- node gone for good"), which recovery and _move_cancel cannot end: they
-- need both nodes. Refused (55000) while both nodes answer (cancel or
-- recover it instead), 55006 while its executor is alive. The shard stays
-- with the owner the coordinator's configuration names once the answering
-- node's copy agrees (never undoing a switch it has seen); otherwise 55000
-- unless force, which acts on the coordinator's word. The move's objects
-- at the answering node are dropped (and the source thawed when it keeps
-- the shard); no row is deleted anywhere. The journal row ends 'failed',
-- its error naming what is left at the node gone (also in a WARNING).
-- Returns the node that owns the shard. C++ (src/move/move_abandon.cpp).
-- @object sharding.move_abandon
CREATE FUNCTION sharding.move_abandon(map text, logical integer, force boolean DEFAULT false) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_move_abandon' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.move_abandon(text, integer, boolean) IS
    'ends the live move of a shard whose source or destination is gone for good; returns the shard''s owner';
REVOKE ALL ON FUNCTION sharding.move_abandon(text, integer, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.move_abandon(text, integer, boolean) TO sharding_admin;
-- @end

-- @object sharding._move_journal_grants
REVOKE ALL ON FUNCTION sharding._move_stop_backends(text, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_stop_backends(text, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    TO sharding_admin;
-- @end

-- move_shard_online(map text, logical integer, node text): docs/moves.md.
-- Not STRICT: NULL arguments raise 22023. A journaled move
-- (_move_enqueue, then _move_execute) carried out in this session, after
-- _move_recover; C++ (src/move/move_journal.cpp).
-- @object sharding.move_shard_online
CREATE FUNCTION sharding.move_shard_online(map text, logical integer, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_move_shard_online' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.move_shard_online(text, integer, text) IS
    'moves a logical shard with its rows to a node while writes go on (logical replication); returns its new epoch';
-- @end

-- isolate(map text, key text, node text): docs/moves.md. Not STRICT.
-- @object sharding.isolate
CREATE FUNCTION sharding.isolate(map text, key text, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_isolate' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.isolate(text, text, text) IS
    'pins a key to a node and moves its rows of every distributed table there online; returns rows moved';
-- @end


-- Moving data between databases is an administrator's job.
REVOKE ALL ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text),
    sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text),
    sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    TO sharding_admin;
