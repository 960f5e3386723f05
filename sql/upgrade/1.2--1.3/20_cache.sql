-- Caches follow one rule (issue 23): every call sees every configuration
-- change committed before it began (src/pg/cache.hpp, "changes").
-- epoch reads the routing cache, like node_for.
-- @replace sharding.epoch

-- Issue 26: per-map changes. The statement triggers see the changed rows
-- (transition tables), so only the maps and pin keys that changed are
-- rebuilt or re-read.
DROP TRIGGER routing_changed ON sharding.maps;
DROP TRIGGER routing_changed ON sharding.shards;
DROP TRIGGER routing_changed ON sharding.pins;
-- @replace sharding._routing_changed
ALTER TABLE sharding.maps ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.shards ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.pins ENABLE ALWAYS TRIGGER routing_changed;

-- _lock_pin locks by shard_of over the map's shard count: pinning no
-- longer builds the routing cache of the map it changes.
-- @replace sharding._lock_pin

-- Section 14: pin_many.
-- @include sharding.pin_many
