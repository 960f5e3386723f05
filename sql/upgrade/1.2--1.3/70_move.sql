

-- Owner switches alone refused on maps with distributed tables
-- (docs/moves.md, Owner switches alone): move_shard's switch is
-- _switch_owner, also the cutover of an online move.
-- @replace sharding._refuse_owner_switch

-- @replace sharding._switch_owner

REVOKE ALL ON FUNCTION sharding._switch_owner(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._switch_owner(text, integer, text) TO sharding_admin;
-- @replace sharding.move_shard

-- @replace sharding.rebalance

-- @replace sharding.rebalance_by_load


-- Move journal (docs/moves.md): sharding.move_journal replaces 1.2's
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

-- @include sharding.moves

-- @include sharding.move_decoding

-- The copy and the slot, in C++ (src/nodes/move_copy.cpp): the slot is
-- created over a replication connection with an exported snapshot (held
-- open until _move_slot_close or the end of the transaction), and the
-- destination pulls the shard's rows under that snapshot with
-- COPY ... TO STDOUT fed into BeginCopyFrom: copy and stream never overlap,
-- no program runs, the source's DSN is read from sharding.nodes there.
-- @include sharding._move_slot_create
-- @include sharding._move_slot_close
-- @include sharding._move_pull
-- @include sharding._move_copy_grants

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

-- @include sharding._move_journal_grants

-- _move_raise(move): raises the recorded error of a move that did not end
-- 'done' (move_shard_online and isolate raise what the engine recorded).
-- @replace sharding._move_raise

-- _move_refuse_written(): the source's slot waits for every transaction
-- holding a transaction id to end, this one included when the source
-- shares its instance: refused before anything happens.
-- @replace sharding._move_refuse_written

-- move_shard_online(map text, logical integer, node text): docs/moves.md.
-- Not STRICT: NULL arguments raise 22023. A journaled move:
-- _move_execute(_move_enqueue(NULL, map, logical, NULL, node)).
-- @replace sharding.move_shard_online

-- isolate(map text, key text, node text): docs/moves.md. Not STRICT.
-- @replace sharding.isolate

-- @include sharding._move_raise_grants

