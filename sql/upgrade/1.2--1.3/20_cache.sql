-- Caches follow one rule (docs/directory.md): every call sees every
-- configuration change committed before it began (src/pg/cache.hpp,
-- "changes").
-- epoch reads the routing cache, like node_for.
-- @replace sharding.epoch

-- Per-map changes (docs/directory.md). The statement triggers see the
-- changed rows (transition tables), so only the maps and pin keys that
-- changed are rebuilt or re-read.
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

-- pin_many (docs/directory.md, Pins at scale).
-- @include sharding.pin_many
