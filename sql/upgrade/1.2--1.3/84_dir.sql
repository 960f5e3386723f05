-- pin_many at scale (docs/directory.md, Pins at scale). The references of
-- sharding.pins to maps and nodes are checked once per statement
-- (sharding._pins_integrity) instead of by declared foreign keys, which
-- checked them row by row.
ALTER TABLE sharding.pins DROP CONSTRAINT pins_map_fkey, DROP CONSTRAINT pins_node_fkey;
-- @include sharding._pins_integrity

-- pin_many: new keys in one plain INSERT; the distinct nodes by a hash.
-- _check_database_nodes reads a map's pins only when nothing cheaper
-- decides.
-- @replace sharding.pin_many
-- @replace sharding._check_database_nodes

-- For tests: how often this backend's routing cache built or refreshed a map.
-- @include sharding._routing_cache_counts
