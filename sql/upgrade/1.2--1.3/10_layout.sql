
-- Layout (src/ by layer and topic): comments that name a source file.
COMMENT ON FUNCTION sharding._rebalance_by_load_plan(text[], text[], double precision[], double precision) IS
    'internal: the load-aware plan (src/core/rebalance.cpp), ordered by logical shard';
