-- A move whose clean-up at the source is left to the move cleaner
-- (sharding.move_cleanup = deferred, docs/moves.md) says so in its journal
-- row, rather than being recognised by its state (phase cleanup, no pid,
-- no error), which a crashed executor's row could also show.
ALTER TABLE sharding.move_journal
    ADD COLUMN cleanup_deferred boolean NOT NULL DEFAULT false;
