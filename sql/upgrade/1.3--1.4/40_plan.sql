-- A move's plan is fixed when it starts; keys by value; bounded freeze;
-- no DROP EXTENSION, detach_node or drop_node under a move in flight
-- (docs/moves.md; CONTRACT 15.1).

-- The plan, in the move's journal row.
ALTER TABLE sharding.move_journal
    ADD COLUMN plan_shards integer,
    ADD COLUMN plan_pins text[],
    ADD COLUMN plan_tables text[],
    ADD COLUMN plan_filters text[],
    ADD COLUMN plan_leaves text[];

-- @include sharding._move_refuse
-- @include sharding._refuse_drop_during_move
-- @replace sharding.drop_map
-- @replace sharding.pin
-- @replace sharding.unpin
-- @replace sharding.pin_many
-- @replace sharding.drop_node
-- @replace sharding.distribute
-- @replace sharding.undistribute
-- @replace sharding.detach_node
