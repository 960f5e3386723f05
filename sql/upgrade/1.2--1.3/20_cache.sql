-- Caches follow one rule (issue 23): every call sees every configuration
-- change committed before it began (src/pg/cache.hpp, "changes").
-- epoch reads the routing cache, like node_for.
CREATE OR REPLACE FUNCTION sharding.epoch(map text, logical integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_epoch' LANGUAGE C STABLE STRICT PARALLEL SAFE;
