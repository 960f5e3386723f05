-- SQL wrappers of the move engine's C++ that nothing calls (the engine
-- calls the C++ directly; no node runs them remotely, neither 1.3's engine
-- nor 1.4's): the SQL surface is the interface. Their C symbols stay for
-- 1.3's frozen install script.
DROP FUNCTION sharding._move_slot_close(text);
DROP FUNCTION sharding._move_drop_replication(text);
DROP FUNCTION sharding._move_drop_triggers(text, text);
DROP FUNCTION sharding._move_finish(text, integer, text, text, bigint);
DROP FUNCTION sharding._move_phase(text, integer, text);
DROP FUNCTION sharding._move_raise(bigint);
DROP FUNCTION sharding._move_refuse_written();
