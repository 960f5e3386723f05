-- No dblink (src/remote/remote_exec.cpp, copy_shard.cpp): attach_node and
-- detach_node no longer ask for it, copy_shard runs on the engine's own
-- connections; the helper that found its schema goes.
DROP FUNCTION sharding._dblink_schema(text);
