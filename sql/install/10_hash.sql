-- Hashing (docs/hashing.md). XXH3-64 (seed 0) over the key's canonical bytes.
-- IMMUTABLE STRICT PARALLEL SAFE: pure functions of their arguments whose
-- values are a compatibility promise, so they may back indexes, generated
-- columns and partition routing.

CREATE FUNCTION sharding.hash64(key text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(text) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key text, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(text, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key text, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(text, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key bytea) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(bytea) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key bytea, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(bytea, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key bytea, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(bytea, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key smallint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(smallint) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key smallint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(smallint, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key smallint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(smallint, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(integer) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key integer, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(integer, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key integer, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(integer, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(bigint) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key bigint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(bigint, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key bigint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(bigint, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key uuid) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(uuid) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key uuid, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(uuid, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key uuid, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(uuid, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.worker_shards(worker integer, workers integer, shards integer)
    RETURNS integer[]
    AS 'MODULE_PATHNAME', 'sharding_worker_shards' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.worker_shards(integer, integer, integer) IS
    'contiguous range of shards dealt to worker (0-based), larger ranges first';
CREATE FUNCTION sharding.worker_of(shard integer, workers integer, shards integer)
    RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_worker_of' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.worker_of(integer, integer, integer) IS
    'worker (0-based) that worker_shards deals the shard to';

-- @object sharding._key_type
-- Internal: the one test of what a shard key may be, shared with the C++
-- code (src/pg/keys.cpp, key_type_of): the type a key of type t is hashed
-- as (text for text, varchar and domains over them; bytea, smallint,
-- integer, bigint, uuid and domains over them as themselves), NULL when t is
-- not a shard key type. STABLE: it reads the type catalog (domains).
CREATE FUNCTION sharding._key_type(t regtype) RETURNS regtype
    AS 'MODULE_PATHNAME', 'sharding__key_type' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._key_type(regtype) IS
    'internal: the type a shard key of type t is hashed as (text for varchar, a domain''s base type), NULL if none';
-- @end

-- @object sharding._key_column_type
-- Internal: the type a shard key column is hashed as (sharding._key_type:
-- text for varchar, a domain's base type), or 42703 (no such column) or
-- 22023 (not a key type).
CREATE FUNCTION sharding._key_column_type(tbl regclass, key_column name) RETURNS regtype
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t regtype;
BEGIN
    SELECT a.atttypid INTO t
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = tbl AND a.attname = key_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', key_column, tbl
            USING ERRCODE = 'undefined_column';
    END IF;
    IF sharding._key_type(t) IS NULL THEN
        RAISE EXCEPTION 'column "%" of relation % has type %, which is not a shard key type',
                key_column, tbl, t
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Shard keys are text, varchar, bytea, smallint, integer, bigint or uuid.';
    END IF;
    RETURN sharding._key_type(t);
END
$$;
COMMENT ON FUNCTION sharding._key_column_type(regclass, name) IS
    'internal: type a shard key column is hashed as; 42703 if missing, 22023 if not a key type';
-- @end
