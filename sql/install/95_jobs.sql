-- Rebalance jobs (docs/rebalance.md). A job is one row of sharding.move_jobs; each
-- of its moves is a row of the move engine's journal (sharding.move_journal,
-- 90_move.sql), enqueued when the job starts. The job's moves are carried
-- out by whoever runs _job_claim/_job_execute in a loop: background runners
-- of the coordinator's server when the library is preloaded
-- (src/jobs/jobs.cpp), else CALL sharding.rebalance_run(job).
--
-- Who executes which move: a runner claims a move by taking the move
-- engine's own session advisory lock of the move
-- (hashtext('sharding.move_journal'), move % (2^31 - 1)), the one its
-- executor and recovery take, and holds it until _move_execute returns, so
-- "in flight" is exactly "locked by a live backend", also after a crash (the
-- lock dies with its process), and a move being recovered is never claimed. _job_claim runs under the job
-- row's lock, so two runners never exceed max_parallel nor take two moves
-- of one shard.
--
-- Every function below is C++ (src/jobs/jobs_run.cpp) behind its SQL
-- name: no PL/pgSQL on a move's path. The capacity checks ask the nodes
-- over the move engine's libpq helper.

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
    -- the role the job runs as: the one that started it (CONTRACT 15.2);
    -- no role but the owner may write it (column privileges below)
    runas            oid NOT NULL DEFAULT (pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER::text)))::oid,
    cancel_requested boolean NOT NULL DEFAULT false,
    created          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    started          timestamptz,
    finished         timestamptz,
    error            text,
    -- why no further move starts now (rebalance_jobs.waiting); per queued
    -- move passed over by the last claim, why it waits (move number ->
    -- reason: move_progress.waiting)
    waiting          text,
    waits            jsonb NOT NULL DEFAULT '{}',
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
-- Every column but runas (and the identity job): a job's role is whoever
-- starts it, never a value another role wrote (the runners run as it).
GRANT INSERT (map, strategy, state, nodes, loads, max_imbalance, drained, max_parallel, switched, cancel_requested,
              created, started, finished, error, waiting, waits, deferred, retried)
    ON sharding.move_jobs TO sharding_admin;
GRANT UPDATE (state, switched, cancel_requested, started, finished, error, waiting, waits, deferred, retried)
    ON sharding.move_jobs TO sharding_admin;

-- @object sharding._job_role_guard
-- Nothing a role writes makes a job run something as a role it has not the
-- privileges of (SEC-2, CONTRACT 15.2): the moves a job adds later
-- (move_jobs.deferred) and a finished job made live again need the
-- privileges of the job's role (a superuser has them; the extension's
-- owner, whose scanner looks after every job, too): 42501 otherwise. The
-- journal's rows have their own guard (_move_journal_guard).
CREATE FUNCTION sharding._job_role_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NEW.deferred IS NOT DISTINCT FROM OLD.deferred OR NEW.deferred = '[]'::jsonb THEN
        IF NOT (NEW.state IN ('queued', 'running') AND OLD.state NOT IN ('queued', 'running')) THEN
            RETURN NEW;
        END IF;
    END IF;
    IF OLD.runas IS NULL OR pg_catalog.pg_has_role(CURRENT_USER, OLD.runas, 'USAGE')
       OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                   WHERE e.extname = 'sharding' AND e.extowner = (SELECT a.oid FROM pg_catalog.pg_roles AS a
                                                                   WHERE a.rolname = CURRENT_USER)) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'permission denied to change rebalance job %, which runs as role %', OLD.job, OLD.runas::regrole
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Only a role with the privileges of the job''s role adds moves to it or makes it live again.';
END $$;
COMMENT ON FUNCTION sharding._job_role_guard() IS
    'internal: refuses (42501) a write that would make a rebalance job run something as a role the writer lacks';
CREATE TRIGGER job_role_guard BEFORE UPDATE ON sharding.move_jobs
    FOR EACH ROW EXECUTE FUNCTION sharding._job_role_guard();
-- @end

-- @object sharding._move_journal_guard
-- A move runs as the role its journal row names (runas: docs/moves.md,
-- "Rights"; the engine's recovery acts on a move with that role's rights).
-- Nothing a role writes makes a move run as a role it has not the
-- privileges of (SEC-2, CONTRACT 15.2): a row it inserts, updates or
-- deletes must run as a role it has the privileges of (before and after
-- an update), and a row of a rebalance job must name a job that exists,
-- whose role the writer has the privileges of: 42501 otherwise. The
-- extension's owner (and a superuser) may write any row; the engine writes
-- the journal over its own connection (coordinator_dsn), as whichever role
-- that logs in as, naming the role of the move explicitly.
CREATE FUNCTION sharding._move_journal_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    me oid := (SELECT a.oid FROM pg_catalog.pg_roles AS a WHERE a.rolname = CURRENT_USER);
    owner boolean := EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                              WHERE e.extname = 'sharding' AND e.extowner = me);
    r oid;
    jr oid;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        r := OLD.runas;
        IF NOT (owner OR coalesce(pg_catalog.pg_has_role(me, r, 'USAGE'), false)) THEN
            RAISE EXCEPTION 'permission denied to change move %, which runs as role %', OLD.move,
                    r::pg_catalog.regrole
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Only a role with the privileges of the move''s role writes its journal row.';
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    r := NEW.runas;
    IF NOT (owner OR coalesce(pg_catalog.pg_has_role(me, r, 'USAGE'), false)) THEN
        RAISE EXCEPTION 'permission denied to journal a move that runs as role %',
                coalesce(r::pg_catalog.regrole::text, 'NULL')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'A move runs as a role its writer has the privileges of (by default the writer itself).';
    END IF;
    IF NEW.job IS NOT NULL AND (TG_OP = 'INSERT' OR NEW.job IS DISTINCT FROM OLD.job) THEN
        SELECT t.runas INTO jr FROM sharding.move_jobs AS t WHERE t.job = NEW.job;
        IF NOT FOUND THEN
            -- The extension's owner and superusers may (a restore may load
            -- the tables in any order); another role only a queued move of
            -- a job whose id the job sequence has handed out, being created
            -- in a transaction that has not committed yet: rebalance_start
            -- journals its moves over the engine's own connection, which
            -- cannot see its job before it commits. (The move still runs as
            -- its own runas, checked above, whichever job claims it.)
            IF NOT coalesce(owner OR (SELECT a.rolsuper FROM pg_catalog.pg_roles AS a WHERE a.oid = me)
                    OR (TG_OP = 'INSERT' AND NEW.phase = 'queued' AND NEW.pid IS NULL
                        AND NEW.job <= pg_catalog.pg_sequence_last_value('sharding.move_jobs_job_seq'::pg_catalog.regclass)),
                    false) THEN
                RAISE EXCEPTION 'permission denied to journal a move of rebalance job %, which does not exist', NEW.job
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
        ELSIF NOT (owner OR coalesce(pg_catalog.pg_has_role(me, jr, 'USAGE'), false)) THEN
            RAISE EXCEPTION 'permission denied to change rebalance job %, which runs as role %', NEW.job,
                    jr::pg_catalog.regrole
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Only a role with the privileges of the job''s role adds moves to it or makes it live again.';
        END IF;
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION sharding._move_journal_guard() IS
    'internal: refuses (42501) a journal row that would run a move as a role the writer lacks, or of no job';
CREATE TRIGGER move_journal_guard BEFORE INSERT OR UPDATE OR DELETE ON sharding.move_journal
    FOR EACH ROW EXECUTE FUNCTION sharding._move_journal_guard();
-- (Which job ids exist or are being created: the guard reads the sequence.)
GRANT SELECT ON SEQUENCE sharding.move_jobs_job_seq TO sharding_admin;
-- @end

-- Background runners (src/jobs/jobs.cpp).
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

-- The logical shard of a pinned key (pins are by text form): computed by
-- the type of the map's distributed key columns, as writers route it (the
-- type a key is hashed as: sharding._key_type).
CREATE FUNCTION sharding._job_key_shard(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_key_shard' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_key_shard(text, text) IS
    'internal: the logical shard of a pinned key, by the type of the map''s key columns';

-- rebalance_start: plans as rebalance / rebalance_by_load (their dry runs)
-- and enqueues every planned move; a map without distributed tables is
-- rebalanced in place (owner switches) and its job is done at once. A
-- start that fails (or is cancelled) cancels the moves it had enqueued.
CREATE FUNCTION sharding.rebalance_start(map text, nodes text[], strategy text DEFAULT 'count',
                                         loads float8[] DEFAULT NULL, max_imbalance float8 DEFAULT 1.10,
                                         max_parallel integer DEFAULT 1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_rebalance_start' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer) IS
    'starts a rebalance job (strategy count or load) that moves every planned shard online, max_parallel at a time; returns its id at once';

-- drain_node: every shard of `node` onto the map's other shard owners
-- (count-balanced, rebalance's plan over them), every key pinned to it onto
-- the owner of the key's shard after that plan.
CREATE FUNCTION sharding.drain_node(map text, node text, max_parallel integer DEFAULT 1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_drain_node' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.drain_node(text, text, integer) IS
    'starts a job moving every shard and pinned key of node onto the map''s other shard owners, online; afterwards drop_node succeeds';

-- _job_claim(job): the next move this backend should execute (and now
-- holds the claim of), 0 when none may start now (max_parallel moves in
-- flight, one move into a node at a time per map, a node without capacity
-- (replication slots, WAL senders, apply workers, counting moves claimed
-- but not begun): `waiting` says why), NULL when the job is over. A failed
-- move or a cancel stops the job: moves not begun are cancelled; it ends
-- once no move is in flight. A move rolled back by recovery is carried out
-- again (at most 3 tries per shard); deferred key moves are enqueued once
-- their shard has no live move.
CREATE FUNCTION sharding._job_claim(job bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_claim' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_claim(bigint) IS
    'internal: claims the next move of a job for this backend (its id), 0 if none may start now, NULL once the job is over';

-- Executes a claimed move through the engine, then gives up the claim.
CREATE FUNCTION sharding._job_execute(job bigint, move bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_execute' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_execute(bigint, bigint) IS
    'internal: carries out a claimed move of a job (sharding._move_execute) and releases the claim';

-- A runner whose job is over takes the oldest live job of its role that
-- lacks runners (NULL: none).
CREATE FUNCTION sharding._job_adopt() RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_adopt' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_adopt() IS
    'internal: the next live job of this role that lacks background runners';

-- The launcher's scanner, at server start and when runners were short:
-- recovers moves whose executor died, then asks for runners for every
-- live job.
CREATE FUNCTION sharding._job_pickup() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_pickup' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_pickup() IS
    'internal: recovers interrupted moves and starts background runners for every live job (the launcher calls it)';

-- rebalance_wait: the job's state once it has ended, or when timeout runs
-- out. Polls (each check a new snapshot: call it in READ COMMITTED).
CREATE FUNCTION sharding.rebalance_wait(job bigint, timeout interval DEFAULT NULL) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_rebalance_wait' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_wait(bigint, interval) IS
    'waits until a rebalance job ends (or timeout runs out) and returns its state';

-- rebalance_cancel: moves not begun are dropped, the ones in flight are told
-- to roll back (the engine's _move_cancel); done ones stay done. The job
-- ends 'cancelled' as soon as no move is in flight.
CREATE FUNCTION sharding.rebalance_cancel(job bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_rebalance_cancel' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_cancel(bigint) IS
    'cancels a rebalance job: moves not begun are dropped, moves in flight roll back, done moves stay; false if it had ended';

-- rebalance_run: carries a job out in this session, one move at a time,
-- committing between steps (so it must be CALLed outside a transaction
-- block). No SET clause: a procedure with one cannot COMMIT; it pins
-- search_path itself for each step.
CREATE PROCEDURE sharding.rebalance_run(job bigint)
    AS 'MODULE_PATHNAME', 'sharding_rebalance_run' LANGUAGE C;
COMMENT ON PROCEDURE sharding.rebalance_run(bigint) IS
    'carries out a queued or interrupted rebalance job in this session until it ends';

REVOKE ALL ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer),
    sharding.drain_node(text, text, integer), sharding._job_claim(bigint), sharding._job_execute(bigint, bigint),
    sharding.rebalance_wait(bigint, interval), sharding.rebalance_cancel(bigint), sharding._job_pickup()
    FROM PUBLIC;
REVOKE ALL ON PROCEDURE sharding.rebalance_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer),
    sharding.drain_node(text, text, integer), sharding._job_claim(bigint), sharding._job_execute(bigint, bigint),
    sharding.rebalance_wait(bigint, interval), sharding.rebalance_cancel(bigint)
    TO sharding_admin;
GRANT EXECUTE ON PROCEDURE sharding.rebalance_run(bigint) TO sharding_admin;

-- The WAL a move's destination still has to confirm, read live at the
-- source (its slot) over the move engine's libpq helper; NULL when it
-- cannot be read (node down, no password in the node's DSN for a role that
-- is not a superuser), and for a role that is neither a superuser nor a
-- member of sharding_admin (nothing connects on its behalf):
-- move_progress then shows the journal's figure. Executable by PUBLIC:
-- move_progress, readable by all, calls it, and a view's function calls are
-- checked for its reader.
CREATE FUNCTION sharding._job_lag(source text, slot text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_lag' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_lag(text, text) IS
    'internal: bytes of WAL a move''s slot at the source has not had confirmed yet, NULL if unreadable';

-- @object sharding.move_progress
-- move_progress: every move planned or in flight (of a job, or a direct
-- move_shard_online/isolate call), every move of a job still running, and
-- every move whose copies differed (error_state XX001: the source kept its
-- copy of the shard for an operator, docs/moves.md).
-- lag_bytes is read live at the source while the move catches up. While
-- a move copies, once it has copied a row, time_left is the time its copy
-- needs for the rows still to copy (rows_expected, estimated at the source
-- when the copy started, less rows_copied) at the rate measured since it
-- started. Otherwise the bar and time_left come from how long the job's
-- (else the map's) finished moves took: a move is expected to take their
-- median; without history, the bar shows the phase and time_left is NULL.
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
                    WHEN m.phase = 'copying' AND m.rows_copied > 0 AND m.rows_expected IS NOT NULL
                         AND m.copy_started IS NOT NULL
                    THEN greatest((pg_catalog.clock_timestamp() - m.copy_started)
                                  * (greatest(m.rows_expected - m.rows_copied, 0)::float8 / m.rows_copied),
                                  interval '1 s')
                    WHEN h.expected IS NULL THEN NULL
                    WHEN m.phase = 'queued' THEN greatest(h.expected, interval '1 s')
                    ELSE greatest(h.expected - (pg_catalog.clock_timestamp() - m.started), interval '1 s') END
               + interval '0.5 s') AS time_left,
           CASE WHEN m.phase = 'queued' AND j.state IN ('queued', 'running')
                THEN coalesce(j.waits ->> m.move::text, CASE WHEN j.waits = '{}' THEN j.waiting END) END AS waiting,
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
     WHERE m.phase NOT IN ('done', 'failed', 'cancelled') OR j.state IN ('queued', 'running')
        OR (m.phase = 'failed' AND m.error_state = 'XX001');
COMMENT ON VIEW sharding.move_progress IS
    'moves planned or in flight (and every move of a running job, and those whose copies differed): phase, rows/bytes copied, lag, bar, time left, why it waits';
GRANT SELECT ON sharding.move_progress TO PUBLIC;
-- @end

-- @object sharding.rebalance_jobs
-- rebalance_jobs: one row per job, kept after it ends. The counts are of
-- the job's journal rows (a move interrupted by a crash and carried out
-- again counts once), plus the owner switches of maps without distributed
-- tables. expected_end (1.4): a job that ended, when it did; one that runs,
-- now plus its moves' time_left (move_progress: the copy's measured rate,
-- else the median of finished moves) summed, the moves it will add later
-- counted at their average, shared among its max_parallel workers; NULL
-- while a move of it has no estimate yet.
CREATE VIEW sharding.rebalance_jobs AS
    SELECT j.job, j.map, j.strategy, j.state,
           (j.switched + coalesce(c.total, 0) - pg_catalog.cardinality(j.retried)
            + pg_catalog.jsonb_array_length(j.deferred))::integer AS moves_total,
           (j.switched + coalesce(c.done, 0))::integer AS moves_done,
           (coalesce(c.failed, 0) - pg_catalog.cardinality(j.retried))::integer AS moves_failed,
           j.started, j.finished, j.error,
           coalesce(c.cancelled, 0)::integer AS moves_cancelled,
           j.max_parallel, j.nodes, j.drained, j.created, j.waiting,
           CASE WHEN j.state IN ('done', 'failed', 'cancelled') THEN j.finished
                ELSE (SELECT CASE WHEN pg_catalog.count(*) = 0
                                       OR pg_catalog.count(*) FILTER (WHERE p.time_left IS NULL) > 0 THEN NULL
                                  ELSE pg_catalog.clock_timestamp()
                                       + (pg_catalog.sum(p.time_left)
                                          + pg_catalog.avg(p.time_left) * pg_catalog.jsonb_array_length(j.deferred))
                                         / greatest(j.max_parallel, 1) END
                        FROM sharding.move_progress p
                       WHERE p.job = j.job AND p.phase NOT IN ('done', 'failed', 'cancelled')) END AS expected_end
      FROM sharding.move_jobs j
      LEFT JOIN LATERAL (
           SELECT pg_catalog.count(*) AS total,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'done') AS done,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'failed') AS failed,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'cancelled') AS cancelled
             FROM sharding.move_journal m WHERE m.job = j.job) c ON true;
COMMENT ON VIEW sharding.rebalance_jobs IS
    'rebalance jobs: state, moves total/done/failed, times, the first failed move''s error and the expected end';
GRANT SELECT ON sharding.rebalance_jobs TO PUBLIC;
-- @end
