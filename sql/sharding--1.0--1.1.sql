\echo Use "ALTER EXTENSION sharding UPDATE TO '1.1'" to load this file. \quit

-- 1.1: partition_for is computed in C++ from the per-backend routing cache
-- (the same cache node_for uses) instead of three queries per call in
-- PL/pgSQL; its plpgsql helper goes away. Signatures, results, privileges and
-- comments are unchanged.
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;

DROP FUNCTION sharding._partition_for(text, anyelement);
