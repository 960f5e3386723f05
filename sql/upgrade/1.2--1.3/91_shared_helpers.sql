-- Each fact in one place (docs/architecture.md): shared helpers instead of
-- copies. Changed definitions that an earlier delta already replaces
-- (rebalance, rebalance_by_load: 70_move.sql) reach the upgrade through
-- that delta's `-- @replace`.

-- set_max_attempts and set_backoff find their queue_settings row through
-- one helper, which refuses a NULL queue (22023) and a caller who does not
-- own the table (42501).
-- @include sharding._queue_settings_key
-- @replace sharding.set_max_attempts
-- @replace sharding.set_backoff

-- rebalance and rebalance_by_load lock, plan and move through one helper.
-- @include sharding._rebalance_apply

-- One check of a node name (22023 for NULL or empty), instead of a copy in
-- each function that takes one; move_shard, _switch_owner (70_move.sql) and
-- attach_node (40_fixes.sql) arrive through their deltas' @replace.
-- @include sharding._check_node
-- @replace sharding.pin
-- @replace sharding.add_node
-- @replace sharding.detach_node

-- A node's connection string, or 55000 when it has none: one helper for
-- attach_node and detach_node (40_fixes.sql and this file replace them).
-- @include sharding._node_dsn
