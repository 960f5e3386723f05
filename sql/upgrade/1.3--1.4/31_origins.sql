-- Moves named per coordinator (review LK-3, docs/moves.md "Names"):
-- replication slots and origins belong to an instance, so a move's name
-- carries a tag of its coordinator, stored in its journal row. Rows
-- journaled by 1.3 keep NULL: their moves keep the name 1.3 gave them.
-- _move_name reads the stored name (no longer IMMUTABLE).
ALTER TABLE sharding.move_journal ADD COLUMN name text;
-- @replace sharding._move_name
