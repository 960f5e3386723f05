-- Issue 16, finding 4: every C function of the extension links to a symbol
-- named sharding_<name>, so that sharding.so (loaded RTLD_GLOBAL) exports no
-- short global names. The 1.1 functions are re-pointed at the new symbols;
-- the old symbols stay exported only for databases still at 1.0 or 1.1
-- (src/legacy.cpp), whose scripts name them.

CREATE OR REPLACE FUNCTION sharding._boundary_selftest(kind text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__boundary_selftest' LANGUAGE C VOLATILE STRICT;
CREATE OR REPLACE FUNCTION sharding.hash64(key text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.shard_of(key text, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.jump_shard(key text, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.hash64(key bytea) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.shard_of(key bytea, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.jump_shard(key bytea, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.hash64(key smallint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.shard_of(key smallint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.jump_shard(key smallint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.hash64(key integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.shard_of(key integer, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.jump_shard(key integer, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.hash64(key bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.shard_of(key bigint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.jump_shard(key bigint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.hash64(key uuid) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_hash64_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.shard_of(key uuid, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_shard_of_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.jump_shard(key uuid, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_jump_shard_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.worker_shards(worker integer, workers integer, shards integer)
    RETURNS integer[]
    AS 'MODULE_PATHNAME', 'sharding_worker_shards' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.worker_of(shard integer, workers integer, shards integer)
    RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_worker_of' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding._routing_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__routing_changed' LANGUAGE C;
CREATE OR REPLACE FUNCTION sharding.fence(map text, logical integer, epoch bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding_fence' LANGUAGE C VOLATILE PARALLEL UNSAFE;
CREATE OR REPLACE FUNCTION sharding._lock_shard(map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__lock_shard' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE OR REPLACE FUNCTION sharding._lock_map(map text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__lock_map' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE OR REPLACE FUNCTION sharding._rebalance_plan(owners text[], nodes text[])
    RETURNS TABLE(logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', 'sharding__rebalance_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.logical_shard(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.node_for(map text, key text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.logical_shard(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.node_for(map text, key bytea) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.logical_shard(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.node_for(map text, key smallint) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.logical_shard(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.node_for(map text, key integer) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.logical_shard(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.node_for(map text, key bigint) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.logical_shard(map text, key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.node_for(map text, key uuid) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding._rank_guard() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__rank_guard' LANGUAGE C;
CREATE OR REPLACE FUNCTION sharding.rank_of(tbl regclass, col name, value text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_rank_of' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.advance(tbl regclass, id anyelement, new_value text, col name DEFAULT 'status')
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_advance' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
CREATE OR REPLACE FUNCTION sharding.bar(value float8, max float8, width integer DEFAULT 40) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_bar' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.imbalance(loads anyarray) RETURNS float8
    AS 'MODULE_PATHNAME', 'sharding_imbalance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash(key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash_extended(key text, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash(key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash_extended(key bytea, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash(key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash_extended(key smallint, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash(key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash_extended(key integer, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash(key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash_extended(key bigint, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash(key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_hash_extended(key uuid, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
