-- Fixes (docs/nodes.md, docs/observe.md) and one source for the exported
-- symbols (docs/architecture.md).

-- attach_node tells this database from a node by a probe connection seen in
-- pg_stat_activity, not by system identifier and database name, which
-- clones of a cluster share.
-- @include sharding._leads_here

-- @replace sharding.attach_node

-- partition_for links its sharding_ symbols (1.2 linked the bare names,
-- which stay exported for the frozen 1.2 script only).
-- @replace sharding.partition_for

-- Fan-out counters are sized by sharding.fanout_max and evict the least-used
-- tables; fanout_info() tells how many.
-- @include sharding.fanout_info

-- @replace sharding.fanout_reset

-- One test of what a shard key may be (sharding._key_type, shared with the
-- C++ code), used by distribute, copy_shard and _key_column_type.
-- @include sharding._key_type
-- @replace sharding.distribute
-- @replace sharding.copy_shard
-- @replace sharding._key_column_type
