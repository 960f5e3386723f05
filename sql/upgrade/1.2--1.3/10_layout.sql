
-- Layout (src/ by layer and topic): comments that name a source file.
-- @replace sharding._rebalance_by_load_plan
