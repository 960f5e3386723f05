

-- Owner switches alone refused on maps with distributed tables (contract
-- section 13): move_shard's switch is _switch_owner, also the cutover of
-- an online move.
-- @replace sharding._refuse_owner_switch

-- @replace sharding._switch_owner

REVOKE ALL ON FUNCTION sharding._switch_owner(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._switch_owner(text, integer, text) TO sharding_admin;
-- @replace sharding.move_shard

-- @replace sharding.rebalance

-- @replace sharding.rebalance_by_load


-- Move journal (issue 24): sharding.move_journal replaces 1.2's
-- sharding.moves (now a view of the live rows); moves are journaled
-- through _move_enqueue / _move_execute / _move_cancel / _move_recover.
-- @include sharding.move_journal

-- Moves 1.2 left interrupted keep their journal: the next call cleans up.
INSERT INTO sharding.move_journal (map, logical, key, source, destination, phase, started, phase_started)
SELECT m.map, m.logical, m.key, m.source, m.destination,
       CASE m.state WHEN 'setup' THEN 'copying' WHEN 'catchup' THEN 'catching_up'
                    WHEN 'switched' THEN 'cleanup' ELSE m.state END,
       m.started, m.started
  FROM sharding.moves m;
ALTER EXTENSION sharding DROP TABLE sharding.moves;
DROP TABLE sharding.moves;

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

-- The copy and the slot, in C++ (src/nodes/move_copy.cpp): the slot is
-- created over a replication connection with an exported snapshot (held
-- open until _move_slot_close or the end of the transaction), and the
-- destination pulls the shard's rows under that snapshot with
-- COPY ... TO STDOUT fed into BeginCopyFrom: copy and stream never overlap,
-- no program runs, the source's DSN is read from sharding.nodes there.
-- @include sharding._move_slot_create
-- @include sharding._move_slot_close
-- @include sharding._move_pull
REVOKE ALL ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) TO sharding_admin;

-- @replace sharding._move_drop_replication

-- @replace sharding._move_delete_rows

-- @replace sharding._move_finish

-- @replace sharding._move_undo

-- @replace sharding._move_online

DROP FUNCTION sharding._move_cleanup(text, integer);
DROP FUNCTION sharding._shell_quote(text);

-- _move_journal(sql): runs a statement on the journal through the engine's
-- own connection to this database (sharding_move_self), so that it commits
-- at once, whatever the caller's transaction does; returns its first value.
-- @replace sharding._move_journal

-- _move_phase(map, logical, phase): the live move of the shard enters a
-- phase (committed before the phase acts).
-- @replace sharding._move_phase

-- _move_stop_backends(conn, name): ends every other session of that
-- node's database whose application_name is the move's name (a copy left
-- running by a cancelled or dead caller) and waits until they are gone.
-- @replace sharding._move_stop_backends

-- _move_switch(map, logical, node): the owner switch of an online move.
-- @replace sharding._move_switch

-- _move_resolve(move): rolls back (or, if its switch had committed,
-- finishes) a move whose executor is gone, from its journal row; returns
-- the final phase. The caller holds the move's advisory lock.
-- @replace sharding._move_resolve

-- _move_enqueue(job, map, logical, key, destination): a 'queued' journal
-- row (committed at once); the source is the current owner.
-- @replace sharding._move_enqueue

-- _move_execute(move): carries out a queued move, or resumes / rolls back
-- an interrupted one, to its end; returns 'done', 'failed' or 'cancelled'.
-- A failure is recorded (error) and returned, not raised; a cancel of the
-- caller rolls back, records 'cancelled' and is re-raised.
-- @replace sharding._move_execute

-- _move_cancel(move): a queued move becomes 'cancelled'; a move in flight
-- is told to stop (its executor is cancelled and rolls back); false if it
-- had already ended.
-- @replace sharding._move_cancel

-- _move_recover(): resumes or rolls back every move whose executor died
-- (crash, kill -9, restart); returns how many.
-- @replace sharding._move_recover

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
-- @replace sharding._move_raise

-- _move_refuse_written(): the source's slot waits for every transaction
-- holding a transaction id to end, this one included when the source
-- shares its instance: refused before anything happens.
-- @replace sharding._move_refuse_written

-- move_shard_online(map text, logical integer, node text): contract
-- section 8. Not STRICT: NULL arguments raise 22023. A journaled move:
-- _move_execute(_move_enqueue(NULL, map, logical, NULL, node)).
-- @replace sharding.move_shard_online

-- isolate(map text, key text, node text): contract section 8. Not STRICT.
-- @replace sharding.isolate

REVOKE ALL ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() TO sharding_admin;

