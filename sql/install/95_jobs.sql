-- Rebalance jobs (docs/rebalance.md). A job is one row of sharding.move_jobs; each
-- of its moves is a row of the move engine's journal (sharding.move_journal,
-- 90_move.sql), enqueued when the job starts. The job's moves are carried
-- out by whoever runs _job_claim/_job_execute in a loop: background runners
-- of the coordinator's server when the library is preloaded
-- (src/nodes/jobs.cpp), else CALL sharding.rebalance_run(job).
--
-- Who executes which move: a runner claims a move by taking the session
-- advisory lock (1936223606, move) and holds it until _move_execute
-- returns, so "in flight" is exactly "locked by a live backend", also after
-- a crash (the lock dies with its process). _job_claim runs under the job
-- row's lock, so two runners never exceed max_parallel nor take two moves
-- of one shard.

CREATE TABLE sharding.move_jobs (
    job              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    map              text NOT NULL,
    strategy         text NOT NULL CHECK (strategy IN ('count', 'load', 'drain')),
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    nodes            text[],
    loads            float8[],
    max_imbalance    float8,
    drained          text,
    max_parallel     integer NOT NULL CHECK (max_parallel >= 1),
    switched         integer NOT NULL DEFAULT 0,
    runas            oid NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false,
    created          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    started          timestamptz,
    finished         timestamptz,
    error            text,
    waiting          text,
    -- key moves (drain's pins) enqueued once no live move of their shard
    -- remains (the journal allows one live move per shard)
    deferred         jsonb NOT NULL DEFAULT '[]',
    -- failed moves that were interrupted (their executor died: crash,
    -- restart) and rolled back by recovery, each replaced by a new move of
    -- the same shard: they do not fail the job
    retried          bigint[] NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE sharding.move_jobs IS
    'rebalance jobs (rebalance_start, drain_node), one row per job, kept after it ends; read it through the rebalance_jobs view';
-- At most one live job per map (55006 for a second one).
CREATE UNIQUE INDEX move_jobs_one_live_per_map ON sharding.move_jobs (map)
    WHERE state IN ('queued', 'running');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_jobs', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_jobs_job_seq', '');
GRANT SELECT ON sharding.move_jobs TO PUBLIC;
GRANT INSERT, UPDATE ON sharding.move_jobs TO sharding_admin;

-- Background runners (src/nodes/jobs.cpp).
CREATE FUNCTION sharding._job_launch(job bigint, runners integer, runas oid) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__job_launch' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._job_launch(bigint, integer, oid) IS
    'internal: starts runners background workers for a job when this transaction commits; false without preload';
CREATE FUNCTION sharding._job_runners(job bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_runners' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._job_runners(bigint) IS
    'internal: background runners of a job in this database now';
REVOKE ALL ON FUNCTION sharding._job_launch(bigint, integer, oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._job_launch(bigint, integer, oid) TO sharding_admin;

-- 22023 unless max_parallel >= 1.
CREATE FUNCTION sharding._job_check_parallel(max_parallel integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF max_parallel IS NULL OR max_parallel < 1 THEN
        RAISE EXCEPTION 'max_parallel must be at least 1, got %', coalesce(max_parallel::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
COMMENT ON FUNCTION sharding._job_check_parallel(integer) IS
    'internal: validates max_parallel (22023)';

-- Serialises job starts of one map and refuses a second live job (55006).
CREATE FUNCTION sharding._job_lock_map(map text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    other bigint;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(1936222818, pg_catalog.hashtext($1));
    SELECT j.job INTO other FROM sharding.move_jobs j
     WHERE j.map = $1 AND j.state IN ('queued', 'running');
    IF FOUND THEN
        RAISE EXCEPTION 'map "%" already has a rebalance job in progress (job %)', $1, other
            USING ERRCODE = 'object_in_use',
                  HINT = format('Wait for it with rebalance_wait(%s) or stop it with rebalance_cancel(%s).',
                                other, other);
    END IF;
END $$;
COMMENT ON FUNCTION sharding._job_lock_map(text) IS
    'internal: one live job per map (55006)';

CREATE FUNCTION sharding._job_has_tables(map text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT EXISTS (SELECT FROM sharding.distributed_tables d WHERE d.map = $1) $$;
COMMENT ON FUNCTION sharding._job_has_tables(text) IS
    'internal: whether a map has distributed tables (then its moves carry rows)';

-- The logical shard of a pinned key (pins are by text form): computed by
-- the type of the map's distributed key columns, as writers route it (the
-- type a key is hashed as: sharding._key_type).
CREATE FUNCTION sharding._job_key_shard(map text, key text) RETURNS integer
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    typ regtype;
    l integer;
BEGIN
    SELECT sharding._key_type(a.atttypid::regtype) INTO typ
      FROM sharding.distributed_tables d
      JOIN pg_catalog.pg_attribute a
        ON a.attrelid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', d.schema_name, d.table_name))
       AND a.attname = d.key_column
     WHERE d.map = $1
     ORDER BY d.schema_name, d.table_name LIMIT 1;
    IF typ IS NULL OR typ = 'text'::regtype THEN
        RETURN sharding.logical_shard($1, $2);
    END IF;
    EXECUTE pg_catalog.format('SELECT sharding.logical_shard($1, $2::%s)', typ) INTO l USING $1, $2;
    RETURN l;
END $$;
COMMENT ON FUNCTION sharding._job_key_shard(text, text) IS
    'internal: the logical shard of a pinned key, by the type of the map''s key columns';

-- Cancels the moves a failed start enqueued (the journal committed them).
CREATE FUNCTION sharding._job_unqueue(job bigint) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._move_cancel(m.move) FROM sharding.move_journal m
      WHERE m.job = $1 AND m.phase = 'queued' ORDER BY m.move;
END $$;
COMMENT ON FUNCTION sharding._job_unqueue(bigint) IS
    'internal: cancels the queued moves of a job whose start failed';

-- rebalance_start: plans as rebalance / rebalance_by_load (their dry runs)
-- and enqueues every planned move; a map without distributed tables is
-- rebalanced in place (owner switches) and its job is done at once.
CREATE FUNCTION sharding.rebalance_start(map text, nodes text[], strategy text DEFAULT 'count',
                                         loads float8[] DEFAULT NULL, max_imbalance float8 DEFAULT 1.10,
                                         max_parallel integer DEFAULT 1) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_variable
DECLARE
    j bigint;
    n integer := 0;
    mv record;
    me oid;
BEGIN
    IF strategy IS NULL OR strategy NOT IN ('count', 'load') THEN
        RAISE EXCEPTION 'strategy must be ''count'' or ''load'', got %', coalesce(quote_literal(strategy), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._job_check_parallel(max_parallel);
    IF strategy = 'load' AND loads IS NULL THEN
        RAISE EXCEPTION 'strategy ''load'' needs loads, one per logical shard of map "%", got NULL', $1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF strategy = 'count' AND loads IS NOT NULL THEN
        RAISE EXCEPTION 'loads are used by strategy ''load'' only, got strategy ''count'''
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    PERFORM sharding._job_lock_map($1);
    SELECT r.oid INTO me FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;

    IF NOT sharding._job_has_tables($1) THEN
        -- No rows to carry: the moves are owner switches, done now.
        IF strategy = 'count' THEN
            SELECT pg_catalog.count(*) INTO n FROM sharding.rebalance($1, nodes);
        ELSE
            SELECT pg_catalog.count(*) INTO n FROM sharding.rebalance_by_load($1, nodes, loads, max_imbalance);
        END IF;
        INSERT INTO sharding.move_jobs AS t (map, strategy, state, nodes, loads, max_imbalance, max_parallel,
                                             switched, runas, started, finished)
        VALUES ($1, strategy, 'done', nodes, loads, max_imbalance, max_parallel, n, me,
                pg_catalog.now(), pg_catalog.now())
        RETURNING t.job INTO j;
        RETURN j;
    END IF;

    INSERT INTO sharding.move_jobs AS t (map, strategy, nodes, loads, max_imbalance, max_parallel, runas)
    VALUES ($1, strategy, nodes, loads, max_imbalance, max_parallel, me)
    RETURNING t.job INTO j;
    -- The journal commits each enqueued move at once (its own connection):
    -- if a later step fails, the moves already enqueued are cancelled, so a
    -- failed start leaves no live move behind.
    BEGIN
        IF strategy = 'count' THEN
            FOR mv IN SELECT * FROM sharding.rebalance($1, nodes, dry_run => true) r ORDER BY r.logical LOOP
                PERFORM sharding._move_enqueue(j, $1, mv.logical, NULL, mv.to_node);
                n := n + 1;
            END LOOP;
        ELSE
            FOR mv IN SELECT * FROM sharding.rebalance_by_load($1, nodes, loads, max_imbalance, dry_run => true) r
                       ORDER BY r.logical LOOP
                PERFORM sharding._move_enqueue(j, $1, mv.logical, NULL, mv.to_node);
                n := n + 1;
            END LOOP;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        PERFORM sharding._job_unqueue(j);
        RAISE;
    END;
    IF n = 0 THEN
        UPDATE sharding.move_jobs t SET state = 'done', started = pg_catalog.now(), finished = pg_catalog.now()
         WHERE t.job = j;
    ELSE
        PERFORM sharding._job_launch(j, max_parallel, me);
    END IF;
    RETURN j;
END $$;
COMMENT ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer) IS
    'starts a rebalance job (strategy count or load) that moves every planned shard online, max_parallel at a time; returns its id at once';
REVOKE ALL ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer) TO sharding_admin;

-- drain_node: every shard of `node` onto the map's other shard owners
-- (count-balanced, rebalance's plan over them), every key pinned to it onto
-- the owner of the key's shard after that plan.
CREATE FUNCTION sharding.drain_node(map text, node text, max_parallel integer DEFAULT 1) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_variable
DECLARE
    j bigint;
    n integer := 0;
    others text[];
    owns integer;
    pinned integer;
    mv record;
    pinned_key record;
    l integer;
    dest text;
    plan jsonb := '{}';
    me oid;
    tables boolean;
BEGIN
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._job_check_parallel(max_parallel);
    PERFORM sharding._require_map($1, false);
    PERFORM sharding._job_lock_map($1);
    SELECT r.oid INTO me FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
    SELECT pg_catalog.count(*) INTO owns FROM sharding.shards s WHERE s.map = $1 AND s.node = $2;
    SELECT pg_catalog.count(*) INTO pinned FROM sharding.pins p WHERE p.map = $1 AND p.node = $2;
    SELECT pg_catalog.array_agg(DISTINCT s.node ORDER BY s.node) INTO others
      FROM sharding.shards s WHERE s.map = $1 AND s.node <> $2;
    IF owns + pinned = 0 THEN
        INSERT INTO sharding.move_jobs AS t (map, strategy, state, drained, max_parallel, runas, started, finished)
        VALUES ($1, 'drain', 'done', $2, max_parallel, me, pg_catalog.now(), pg_catalog.now())
        RETURNING t.job INTO j;
        RETURN j;
    END IF;
    IF others IS NULL THEN
        RAISE EXCEPTION 'node "%" is the only node of map "%": there is no node to drain it onto', $2, $1
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Add a node with rebalance_start first.';
    END IF;
    tables := sharding._job_has_tables($1);
    INSERT INTO sharding.move_jobs AS t (map, strategy, nodes, drained, max_parallel, runas)
    VALUES ($1, 'drain', others, $2, max_parallel, me)
    RETURNING t.job INTO j;
    BEGIN
        -- Shards: rebalance's plan over the other owners.
        FOR mv IN SELECT * FROM sharding.rebalance($1, others, dry_run => true) r ORDER BY r.logical LOOP
            plan := plan || jsonb_build_object(mv.logical::text, mv.to_node);
            IF tables THEN
                PERFORM sharding._move_enqueue(j, $1, mv.logical, NULL, mv.to_node);
            ELSE
                PERFORM sharding.move_shard($1, mv.logical, mv.to_node);
            END IF;
            n := n + 1;
        END LOOP;
        -- Pins: to the owner of the key's shard once the plan is carried
        -- out; a key whose shard moves too waits for that move (deferred).
        FOR pinned_key IN SELECT pp.key FROM sharding.pins pp WHERE pp.map = $1 AND pp.node = $2 ORDER BY pp.key LOOP
            l := sharding._job_key_shard($1, pinned_key.key);
            dest := coalesce(plan ->> l::text,
                             (SELECT s.node FROM sharding.shards s WHERE s.map = $1 AND s.logical = l));
            IF NOT tables THEN
                PERFORM sharding.pin($1, pinned_key.key, dest);
            ELSIF plan ? l::text THEN
                UPDATE sharding.move_jobs t
                   SET deferred = t.deferred || jsonb_build_array(jsonb_build_object(
                                      'logical', l, 'key', pinned_key.key, 'destination', dest))
                 WHERE t.job = j;
            ELSE
                PERFORM sharding._move_enqueue(j, $1, l, pinned_key.key, dest);
            END IF;
            n := n + 1;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        PERFORM sharding._job_unqueue(j);
        RAISE;
    END;
    IF NOT tables THEN
        UPDATE sharding.move_jobs t SET state = 'done', switched = n, started = pg_catalog.now(),
                                        finished = pg_catalog.now()
         WHERE t.job = j;
    ELSE
        PERFORM sharding._job_launch(j, max_parallel, me);
    END IF;
    RETURN j;
END $$;
COMMENT ON FUNCTION sharding.drain_node(text, text, integer) IS
    'starts a job moving every shard and pinned key of node onto the map''s other shard owners, online; afterwards drop_node succeeds';
REVOKE ALL ON FUNCTION sharding.drain_node(text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.drain_node(text, text, integer) TO sharding_admin;

-- The advisory lock key of a move (its claim by an executing backend).
CREATE FUNCTION sharding._job_move_key(move bigint) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT ($1 % 2147483648)::integer $$;
COMMENT ON FUNCTION sharding._job_move_key(bigint) IS
    'internal: second key of the advisory lock (1936223606, key) that marks a move as being executed';

-- Moves of a job being executed by a live backend now (claimed), with the
-- pid that holds each.
CREATE FUNCTION sharding._job_in_flight(job bigint)
    RETURNS TABLE (move bigint, logical integer, source text, destination text, phase text, pid integer)
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT m.move, m.logical, m.source, m.destination, m.phase, l.pid
      FROM sharding.move_journal m
      JOIN pg_catalog.pg_locks l
        ON l.locktype = 'advisory' AND l.granted AND l.classid = 1936223606::oid AND l.objsubid = 2
       AND l.objid = sharding._job_move_key(m.move)::oid
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
     WHERE m.job = $1 AND m.phase NOT IN ('done', 'failed', 'cancelled')
$$;
COMMENT ON FUNCTION sharding._job_in_flight(bigint) IS
    'internal: the moves of a job claimed by a live executor';

-- A value read at a node over a connection this session keeps open
-- (named by the DSN's hash), so a runner checking capacity before every
-- move does not connect each time; NULL when the node cannot answer.
CREATE FUNCTION sharding._job_ask(dsn text, sql text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    dbl name;
    conn text := 'sharding_job_' || pg_catalog.left(pg_catalog.md5($1), 12);
    answer text;
BEGIN
    SELECT n.nspname INTO dbl FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n
        ON n.oid = e.extnamespace WHERE e.extname = 'dblink';
    IF dbl IS NULL OR $1 IS NULL THEN
        RETURN NULL;
    END IF;
    BEGIN
        EXECUTE pg_catalog.format('SELECT $1 = ANY (coalesce(%I.dblink_get_connections(), ''{}''))', dbl)
           INTO STRICT answer USING conn;
        IF NOT answer::boolean THEN
            EXECUTE pg_catalog.format('SELECT %I.dblink_connect($1, $2)', dbl) USING conn, $1;
        END IF;
        EXECUTE pg_catalog.format('SELECT a FROM %I.dblink($1, $2) AS t(a text)', dbl) INTO answer USING conn, $2;
        RETURN answer;
    EXCEPTION WHEN OTHERS THEN
        BEGIN
            EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', dbl) USING conn;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
        RETURN NULL;
    END;
END $$;
COMMENT ON FUNCTION sharding._job_ask(text, text) IS
    'internal: one value read at a node over a kept connection, NULL if it cannot answer';

-- Why `source`/`destination` cannot take one more move now (NULL: they can):
-- each move needs a replication slot and a WAL sender at the source and an
-- apply worker at the destination; moves claimed but not begun count as
-- using one. A node that cannot answer is not waited for: the move itself
-- then fails and says why.
CREATE FUNCTION sharding._job_capacity(source text, destination text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    answer text;
    free_slots integer;
    free_senders integer;
    free_workers integer;
    pending integer;
BEGIN
    answer := sharding._job_ask((SELECT n.dsn FROM sharding.nodes n WHERE n.node = $1),
        'SELECT (pg_catalog.current_setting(''max_replication_slots'')::integer'
        ' - (SELECT pg_catalog.count(*) FROM pg_catalog.pg_replication_slots)::integer)'
        ' || '' '' || (pg_catalog.current_setting(''max_wal_senders'')::integer'
        ' - (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication)::integer)');
    IF answer IS NOT NULL THEN
        free_slots := pg_catalog.split_part(answer, ' ', 1)::integer;
        free_senders := pg_catalog.split_part(answer, ' ', 2)::integer;
        SELECT pg_catalog.count(*) INTO pending
          FROM sharding.move_jobs j, LATERAL sharding._job_in_flight(j.job) f
         WHERE j.state = 'running' AND f.source = $1 AND f.phase = 'queued';
        IF free_slots - pending < 1 THEN
            RETURN pg_catalog.format('source %s has no free replication slot (max_replication_slots; %s claimed moves not yet begun)',
                                     $1, pending);
        END IF;
        -- A move takes two WAL senders at its source while it sets up:
        -- the replication connection that creates its slot (and exports
        -- the copy's snapshot), and then its subscription's stream.
        IF free_senders - 2 * pending < 2 THEN
            RETURN pg_catalog.format('source %s has no free WAL sender (max_wal_senders; a move needs 2; %s claimed moves not yet begun)',
                                     $1, pending);
        END IF;
    END IF;
    answer := sharding._job_ask((SELECT n.dsn FROM sharding.nodes n WHERE n.node = $2),
        'SELECT pg_catalog.current_setting(''max_logical_replication_workers'')::integer'
        ' - (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_subscription s WHERE s.pid IS NOT NULL)::integer');
    IF answer IS NOT NULL THEN
        free_workers := answer::integer;
        SELECT pg_catalog.count(*) INTO pending
          FROM sharding.move_jobs j, LATERAL sharding._job_in_flight(j.job) f
         WHERE j.state = 'running' AND f.destination = $2 AND f.phase = 'queued';
        IF free_workers - pending < 1 THEN
            RETURN pg_catalog.format('destination %s has no free logical replication worker (max_logical_replication_workers; %s claimed moves not yet begun)',
                                     $2, pending);
        END IF;
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._job_capacity(text, text) IS
    'internal: why a node pair cannot take one more move now (replication slots, WAL senders, apply workers), NULL if it can';

-- Ends a job whose moves are all over: done, failed (the first failed
-- move's error) or cancelled.
CREATE FUNCTION sharding._job_finish(job bigint) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    st text;
    err text;
    failed boolean;
    cancelled boolean;
BEGIN
    SELECT m.error INTO err FROM sharding.move_journal m
     WHERE m.job = $1 AND m.phase = 'failed'
       AND m.move <> ALL ((SELECT t.retried FROM sharding.move_jobs t WHERE t.job = $1)::bigint[])
     ORDER BY m.finished NULLS LAST, m.move LIMIT 1;
    failed := FOUND;
    SELECT j.cancel_requested INTO cancelled FROM sharding.move_jobs j WHERE j.job = $1;
    st := CASE WHEN cancelled THEN 'cancelled' WHEN failed THEN 'failed' ELSE 'done' END;
    UPDATE sharding.move_jobs j SET state = st, finished = pg_catalog.now(), waiting = NULL,
                                    error = CASE WHEN failed THEN coalesce(err, 'a move failed') END,
                                    started = coalesce(j.started, pg_catalog.now())
     WHERE j.job = $1;
    RETURN st;
END $$;
COMMENT ON FUNCTION sharding._job_finish(bigint) IS
    'internal: ends a job whose moves are all over (done, failed or cancelled)';

-- _job_claim(job): the next move this backend should execute (and now
-- holds the claim of), 0 when none may start now (max_parallel moves in
-- flight, a node without capacity: `waiting` says why), NULL when the job is
-- over. A failed move or a cancel stops the job: moves not begun are
-- cancelled; it ends once no move is in flight.
CREATE FUNCTION sharding._job_claim(job bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_variable
DECLARE
    j record;
    c record;
    in_flight integer;
    live integer;
    reason text;
    why text := NULL;
BEGIN
    SELECT * INTO j FROM sharding.move_jobs t WHERE t.job = $1 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Claims this backend still holds on the job's moves (an execution that
    -- raised, e.g. cancelled) are over.
    PERFORM pg_catalog.pg_advisory_unlock(1936223606, sharding._job_move_key(m.move))
       FROM sharding.move_journal m
      WHERE m.job = $1 AND EXISTS (
            SELECT FROM pg_catalog.pg_locks l
             WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_catalog.pg_backend_pid()
               AND l.classid = 1936223606::oid AND l.objsubid = 2
               AND l.objid = sharding._job_move_key(m.move)::oid);
    IF j.state NOT IN ('queued', 'running') THEN
        RETURN NULL;
    END IF;
    IF j.state = 'queued' THEN
        UPDATE sharding.move_jobs t SET state = 'running', started = pg_catalog.now() WHERE t.job = $1;
    END IF;
    -- Deferred key moves whose shard has no live move any more: enqueue.
    IF j.deferred <> '[]' AND NOT j.cancel_requested THEN
        FOR c IN SELECT d.value AS v, (d.value ->> 'logical')::integer AS logical
                   FROM pg_catalog.jsonb_array_elements(j.deferred) d LOOP
            CONTINUE WHEN EXISTS (SELECT FROM sharding.move_journal m
                                   WHERE m.map = j.map AND m.logical = c.logical
                                     AND m.phase NOT IN ('done', 'failed', 'cancelled'));
            PERFORM sharding._move_enqueue($1, j.map, c.logical, c.v ->> 'key', c.v ->> 'destination');
            UPDATE sharding.move_jobs t
               SET deferred = (SELECT coalesce(pg_catalog.jsonb_agg(e.value), '[]')
                                 FROM pg_catalog.jsonb_array_elements(t.deferred) e WHERE e.value <> c.v)
             WHERE t.job = $1
             RETURNING t.deferred INTO j.deferred;
        END LOOP;
    END IF;
    -- A move interrupted by the death of its executor (crash, restart) and
    -- rolled back by recovery is carried out again: a new move of the same
    -- shard (at most 3 tries per shard).
    IF NOT j.cancel_requested THEN
        FOR c IN SELECT m.move, m.logical, m.key, m.destination FROM sharding.move_journal m
                  WHERE m.job = $1 AND m.phase = 'failed' AND m.move <> ALL (j.retried)
                    AND m.error LIKE 'interrupted in phase %, rolled back'
                    AND (SELECT pg_catalog.count(*) FROM sharding.move_journal x
                          WHERE x.job = $1 AND x.logical = m.logical AND x.key IS NOT DISTINCT FROM m.key) < 3
                  ORDER BY m.move LOOP
            CONTINUE WHEN EXISTS (SELECT FROM sharding.move_journal x
                                   WHERE x.map = j.map AND x.logical = c.logical
                                     AND x.phase NOT IN ('done', 'failed', 'cancelled'));
            PERFORM sharding._move_enqueue($1, j.map, c.logical, c.key, c.destination);
            UPDATE sharding.move_jobs t SET retried = t.retried || c.move WHERE t.job = $1
            RETURNING t.retried INTO j.retried;
        END LOOP;
    END IF;
    SELECT pg_catalog.count(*) INTO in_flight FROM sharding._job_in_flight($1);
    IF j.cancel_requested OR EXISTS (SELECT FROM sharding.move_journal m
                                      WHERE m.job = $1 AND m.phase = 'failed' AND m.move <> ALL (j.retried)) THEN
        -- Stopping: drop what has not begun, let what is in flight end.
        UPDATE sharding.move_jobs t SET deferred = '[]' WHERE t.job = $1 AND t.deferred <> '[]';
        PERFORM sharding._move_cancel(m.move) FROM sharding.move_journal m
          WHERE m.job = $1 AND m.phase = 'queued'
            AND m.move NOT IN (SELECT f.move FROM sharding._job_in_flight($1) f);
        IF in_flight = 0 AND NOT EXISTS (SELECT FROM sharding.move_journal m
                                           WHERE m.job = $1 AND m.phase NOT IN ('done', 'failed', 'cancelled')) THEN
            PERFORM sharding._job_finish($1);
            RETURN NULL;
        END IF;
        IF in_flight > 0 THEN
            RETURN 0;
        END IF;
        -- An interrupted move (no executor): resumed or rolled back below.
    END IF;
    SELECT pg_catalog.count(*) + pg_catalog.jsonb_array_length(j.deferred) INTO live FROM sharding.move_journal m
     WHERE m.job = $1 AND m.phase NOT IN ('done', 'failed', 'cancelled');
    IF live = 0 THEN
        PERFORM sharding._job_finish($1);
        RETURN NULL;
    END IF;
    IF in_flight >= j.max_parallel THEN
        UPDATE sharding.move_jobs t SET waiting = pg_catalog.format('%s moves in flight (max_parallel %s)',
                                                                      in_flight, j.max_parallel)
         WHERE t.job = $1 AND t.waiting IS DISTINCT FROM pg_catalog.format('%s moves in flight (max_parallel %s)',
                                                                          in_flight, j.max_parallel);
        RETURN 0;
    END IF;
    -- Interrupted moves first (resumed or rolled back from the journal),
    -- then queued ones in plan order; never two of one shard at once.
    FOR c IN SELECT m.move, m.logical, m.source, m.destination, m.phase FROM sharding.move_journal m
              WHERE m.job = $1 AND m.phase NOT IN ('done', 'failed', 'cancelled')
                AND m.move NOT IN (SELECT f.move FROM sharding._job_in_flight($1) f)
                AND m.logical NOT IN (SELECT f.logical FROM sharding._job_in_flight($1) f)
                AND (NOT j.cancel_requested OR m.phase <> 'queued')
              ORDER BY (m.phase = 'queued'), m.move LOOP
        IF c.phase = 'queued' THEN
            -- One move at a time into a node, per map: the engine filters
            -- what a move's subscription applies with a trigger on each
            -- table at the destination that passes only its own shard, so a
            -- second move into the same tables would have its changes
            -- dropped by the first one's trigger (seen as lost updates).
            SELECT pg_catalog.format('destination %s is receiving move %s of logical shard %s (one move into a node at a time)',
                                     c.destination, x.move, x.logical) INTO reason
              FROM sharding.move_journal x
             WHERE x.map = j.map AND x.destination = c.destination AND x.move <> c.move
               AND (x.phase IN ('copying', 'catching_up', 'cutover', 'cleanup')
                    OR x.move IN (SELECT f.move FROM sharding._job_in_flight($1) f))
             LIMIT 1;
            IF reason IS NOT NULL THEN
                why := coalesce(why, pg_catalog.format('move %s waits: %s', c.move, reason));
                CONTINUE;
            END IF;
            reason := sharding._job_capacity(c.source, c.destination);
            IF reason IS NOT NULL THEN
                why := coalesce(why, pg_catalog.format('move %s waits: %s', c.move, reason));
                CONTINUE;
            END IF;
        END IF;
        IF pg_catalog.pg_try_advisory_lock(1936223606, sharding._job_move_key(c.move)) THEN
            UPDATE sharding.move_jobs t SET waiting = NULL WHERE t.job = $1 AND t.waiting IS NOT NULL;
            RETURN c.move;
        END IF;
    END LOOP;
    IF why IS NOT NULL THEN
        UPDATE sharding.move_jobs t SET waiting = why WHERE t.job = $1 AND t.waiting IS DISTINCT FROM why;
    END IF;
    RETURN 0;
END $$;
COMMENT ON FUNCTION sharding._job_claim(bigint) IS
    'internal: claims the next move of a job for this backend (its id), 0 if none may start now, NULL once the job is over';
REVOKE ALL ON FUNCTION sharding._job_claim(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._job_claim(bigint) TO sharding_admin;

-- Executes a claimed move through the engine, then gives up the claim.
CREATE FUNCTION sharding._job_execute(job bigint, move bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._move_execute($2);
    PERFORM pg_catalog.pg_advisory_unlock(1936223606, sharding._job_move_key($2));
    RETURN $2;
END $$;
COMMENT ON FUNCTION sharding._job_execute(bigint, bigint) IS
    'internal: carries out a claimed move of a job (sharding._move_execute) and releases the claim';
REVOKE ALL ON FUNCTION sharding._job_execute(bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._job_execute(bigint, bigint) TO sharding_admin;

-- A runner whose job is over takes the oldest live job of its role that
-- lacks runners (NULL: none).
CREATE FUNCTION sharding._job_adopt() RETURNS bigint
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT j.job FROM sharding.move_jobs j
     WHERE j.state IN ('queued', 'running')
       AND j.runas = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
       AND sharding._job_runners(j.job) < j.max_parallel
     ORDER BY j.job LIMIT 1
$$;
COMMENT ON FUNCTION sharding._job_adopt() IS
    'internal: the next live job of this role that lacks background runners';

-- The launcher's scanner, at server start and when runners were short:
-- recovers moves whose executor died, then asks for runners for every
-- live job.
CREATE FUNCTION sharding._job_pickup() RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
    n integer := 0;
BEGIN
    IF EXISTS (SELECT FROM sharding.move_journal m WHERE m.phase NOT IN ('queued', 'done', 'failed', 'cancelled')) THEN
        PERFORM sharding._move_recover();
    END IF;
    FOR j IN SELECT * FROM sharding.move_jobs t WHERE t.state IN ('queued', 'running') ORDER BY t.job LOOP
        PERFORM sharding._job_launch(j.job, j.max_parallel - sharding._job_runners(j.job), j.runas);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding._job_pickup() IS
    'internal: recovers interrupted moves and starts background runners for every live job (the launcher calls it)';
REVOKE ALL ON FUNCTION sharding._job_pickup() FROM PUBLIC;

CREATE FUNCTION sharding._job_require(job bigint) RETURNS record
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'job must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO j FROM sharding.move_jobs t WHERE t.job = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'rebalance job % does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    RETURN j;
END $$;
COMMENT ON FUNCTION sharding._job_require(bigint) IS
    'internal: a job''s row, 42704 if it does not exist';

-- rebalance_wait: the job's state once it has ended, or when timeout runs
-- out. Polls (each check a new snapshot: call it in READ COMMITTED).
CREATE FUNCTION sharding.rebalance_wait(job bigint, timeout interval DEFAULT NULL) RETURNS text
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    st text;
    deadline timestamptz;
BEGIN
    PERFORM sharding._job_require($1);
    IF timeout IS NOT NULL AND timeout < interval '0' THEN
        RAISE EXCEPTION 'timeout must not be negative, got %', timeout USING ERRCODE = 'invalid_parameter_value';
    END IF;
    deadline := pg_catalog.clock_timestamp() + timeout;
    LOOP
        SELECT t.state INTO st FROM sharding.move_jobs t WHERE t.job = $1;
        IF st IN ('done', 'failed', 'cancelled') OR pg_catalog.clock_timestamp() >= deadline THEN
            RETURN st;
        END IF;
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
END $$;
COMMENT ON FUNCTION sharding.rebalance_wait(bigint, interval) IS
    'waits until a rebalance job ends (or timeout runs out) and returns its state';
REVOKE ALL ON FUNCTION sharding.rebalance_wait(bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_wait(bigint, interval) TO sharding_admin;

-- rebalance_cancel: moves not begun are dropped, the ones in flight are told
-- to roll back (the engine's _move_cancel); done ones stay done. The job
-- ends 'cancelled' as soon as no move is in flight.
CREATE FUNCTION sharding.rebalance_cancel(job bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
BEGIN
    PERFORM sharding._job_require($1);
    SELECT * INTO j FROM sharding.move_jobs t WHERE t.job = $1 FOR UPDATE;
    IF j.state NOT IN ('queued', 'running') THEN
        RETURN false;
    END IF;
    UPDATE sharding.move_jobs t SET cancel_requested = true, deferred = '[]' WHERE t.job = $1;
    PERFORM sharding._move_cancel(m.move) FROM sharding.move_journal m
      WHERE m.job = $1 AND m.phase NOT IN ('done', 'failed', 'cancelled') ORDER BY m.move;
    IF NOT EXISTS (SELECT FROM sharding._job_in_flight($1))
       AND NOT EXISTS (SELECT FROM sharding.move_journal m
                        WHERE m.job = $1 AND m.phase NOT IN ('done', 'failed', 'cancelled')) THEN
        PERFORM sharding._job_finish($1);
    END IF;
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding.rebalance_cancel(bigint) IS
    'cancels a rebalance job: moves not begun are dropped, moves in flight roll back, done moves stay; false if it had ended';
REVOKE ALL ON FUNCTION sharding.rebalance_cancel(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_cancel(bigint) TO sharding_admin;

-- rebalance_run: carries a job out in this session, one move at a time,
-- committing between steps (so it must be CALLed outside a transaction
-- block). No SET clause: a procedure with one cannot COMMIT; every name
-- below is schema-qualified instead.
CREATE PROCEDURE sharding.rebalance_run(job bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    m bigint;
BEGIN
    PERFORM sharding._job_require(job);
    COMMIT;
    LOOP
        m := sharding._job_claim(job);
        COMMIT;
        EXIT WHEN m IS NULL;
        IF m OPERATOR(pg_catalog.=) 0 THEN
            PERFORM pg_catalog.pg_sleep(0.5);
        ELSE
            BEGIN
                PERFORM sharding._job_execute(job, m);
            EXCEPTION WHEN query_canceled THEN
                -- rebalance_cancel stopped the move in flight (the engine
                -- rolled it back): the next claim ends the job. Any other
                -- cancel stops this procedure.
                IF NOT (SELECT t.cancel_requested FROM sharding.move_jobs t WHERE t.job OPERATOR(pg_catalog.=) rebalance_run.job) THEN
                    RAISE;
                END IF;
            END;
        END IF;
        COMMIT;
    END LOOP;
END $$;
COMMENT ON PROCEDURE sharding.rebalance_run(bigint) IS
    'carries out a queued or interrupted rebalance job in this session until it ends';
REVOKE ALL ON PROCEDURE sharding.rebalance_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE sharding.rebalance_run(bigint) TO sharding_admin;

-- The WAL a move's destination still has to confirm, read live at the
-- source (its slot); NULL when it cannot be read (no dblink right, node
-- down): move_progress then shows the journal's figure.
CREATE FUNCTION sharding._job_lag(source text, slot text) RETURNS bigint
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT greatest(sharding._job_ask((SELECT n.dsn FROM sharding.nodes n WHERE n.node = $1), pg_catalog.format(
               'SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint'
               ' FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = %L', $2))::bigint, 0)
$$;
COMMENT ON FUNCTION sharding._job_lag(text, text) IS
    'internal: bytes of WAL a move''s slot at the source has not had confirmed yet, NULL if unreadable';

-- rebalance_jobs: one row per job, kept after it ends. The counts are of
-- the job's journal rows (a move interrupted by a crash and carried out
-- again counts once), plus the owner switches of maps without distributed
-- tables.
CREATE VIEW sharding.rebalance_jobs AS
    SELECT j.job, j.map, j.strategy, j.state,
           (j.switched + coalesce(c.total, 0) - pg_catalog.cardinality(j.retried)
            + pg_catalog.jsonb_array_length(j.deferred))::integer AS moves_total,
           (j.switched + coalesce(c.done, 0))::integer AS moves_done,
           (coalesce(c.failed, 0) - pg_catalog.cardinality(j.retried))::integer AS moves_failed,
           j.started, j.finished, j.error,
           coalesce(c.cancelled, 0)::integer AS moves_cancelled,
           j.max_parallel, j.nodes, j.drained, j.created, j.waiting
      FROM sharding.move_jobs j
      LEFT JOIN LATERAL (
           SELECT pg_catalog.count(*) AS total,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'done') AS done,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'failed') AS failed,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'cancelled') AS cancelled
             FROM sharding.move_journal m WHERE m.job = j.job) c ON true;
COMMENT ON VIEW sharding.rebalance_jobs IS
    'rebalance jobs: state, moves total/done/failed, times and the first failed move''s error';
GRANT SELECT ON sharding.rebalance_jobs TO PUBLIC;

-- move_progress: every move planned or in flight (of a job, or a direct
-- move_shard_online/isolate call), and every move of a job still running.
-- lag_bytes is read live at the source while the move catches up. The bar
-- and time_left come from how long the job's (else the map's) finished
-- moves took: a move is expected to take their median; without history,
-- the bar shows the phase and time_left is NULL.
CREATE VIEW sharding.move_progress AS
    SELECT m.job, m.map, m.logical, m.key, m.source, m.destination, m.phase,
           m.rows_copied, m.bytes_copied,
           CASE WHEN m.phase IN ('catching_up', 'cutover')
                THEN coalesce(sharding._job_lag(m.source, sharding._move_name(m.map, m.logical)), m.lag_bytes)
                ELSE m.lag_bytes END AS lag_bytes,
           m.started, m.phase_started, m.error,
           sharding.bar(p.fraction, 1, 20) AS bar,
           pg_catalog.date_trunc('second',
               CASE WHEN m.phase IN ('done', 'failed', 'cancelled') THEN interval '0'
                    WHEN h.expected IS NULL THEN NULL
                    WHEN m.phase = 'queued' THEN greatest(h.expected, interval '1 s')
                    ELSE greatest(h.expected - (pg_catalog.clock_timestamp() - m.started), interval '1 s') END
               + interval '0.5 s') AS time_left,
           CASE WHEN m.phase = 'queued' AND j.state IN ('queued', 'running') THEN j.waiting END AS waiting,
           m.move
      FROM sharding.move_journal m
      LEFT JOIN sharding.move_jobs j ON j.job = m.job
      LEFT JOIN LATERAL (
           SELECT pg_catalog.percentile_cont(0.5) WITHIN GROUP (ORDER BY d.finished - d.started) AS expected
             FROM (SELECT x.started, x.finished FROM sharding.move_journal x
                    WHERE x.phase = 'done' AND x.started IS NOT NULL AND x.map = m.map
                      AND (x.job = m.job OR NOT EXISTS (SELECT FROM sharding.move_journal y
                                                         WHERE y.job = m.job AND y.phase = 'done'))
                    ORDER BY x.finished DESC LIMIT 20) d) h ON true
      CROSS JOIN LATERAL (
           SELECT CASE WHEN m.phase = 'done' THEN 1.0
                       WHEN m.phase IN ('queued', 'failed', 'cancelled') OR m.started IS NULL THEN 0.0
                       WHEN h.expected IS NOT NULL AND h.expected > interval '0'
                       THEN least(0.95, pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() - m.started)
                                        / pg_catalog.date_part('epoch', h.expected))
                       ELSE CASE m.phase WHEN 'copying' THEN 0.25 WHEN 'catching_up' THEN 0.6
                                         WHEN 'cutover' THEN 0.85 ELSE 0.95 END
                  END::float8 AS fraction) p
     WHERE m.phase NOT IN ('done', 'failed', 'cancelled') OR j.state IN ('queued', 'running');
COMMENT ON VIEW sharding.move_progress IS
    'moves planned or in flight (and every move of a running job): phase, rows/bytes copied, lag, bar, time left, why it waits';
GRANT SELECT ON sharding.move_progress TO PUBLIC;
