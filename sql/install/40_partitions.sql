-- Native hash partitions aligned with shard_of (docs/partitions.md).
--
-- With PARTITION BY HASH (k sharding.<type>_shard_ops) on a single column,
-- partition MODULUS n REMAINDER r holds exactly the rows with
-- shard_of(k, n) = r. The support functions are chosen so that PostgreSQL's
-- row hash for a one-column key (hash_combine64(0, extended(k, seed))) is
-- our XXH3 hash itself; see src/core/partition_hash.hpp. With several key columns
-- PostgreSQL folds the column hashes together, so alignment holds only for
-- single-column keys and create_partitions refuses the others.
--
-- Support functions: IMMUTABLE STRICT PARALLEL SAFE, like every hash
-- support function (partition routing and hash indexes depend on it; NULLs
-- never reach them).

CREATE FUNCTION sharding.partition_hash(key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(text) IS
    'hash support function 1 of sharding.text_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key text, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(text, bigint) IS
    'hash support function 2 of sharding.text_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(bytea) IS
    'hash support function 1 of sharding.bytea_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key bytea, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(bytea, bigint) IS
    'hash support function 2 of sharding.bytea_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(smallint) IS
    'hash support function 1 of sharding.int2_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key smallint, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(smallint, bigint) IS
    'hash support function 2 of sharding.int2_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(integer) IS
    'hash support function 1 of sharding.int4_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key integer, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(integer, bigint) IS
    'hash support function 2 of sharding.int4_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(bigint) IS
    'hash support function 1 of sharding.int8_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key bigint, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(bigint, bigint) IS
    'hash support function 2 of sharding.int8_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(uuid) IS
    'hash support function 1 of sharding.uuid_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key uuid, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_partition_hash_extended_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(uuid, bigint) IS
    'hash support function 2 of sharding.uuid_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

-- Not DEFAULT: PostgreSQL's own hash opclasses stay the default for these
-- types; users name ours explicitly.

CREATE OPERATOR CLASS sharding.text_shard_ops FOR TYPE text USING hash AS
    OPERATOR 1 pg_catalog.= (text, text),
    FUNCTION 1 sharding.partition_hash(text),
    FUNCTION 2 sharding.partition_hash_extended(text, bigint);
COMMENT ON OPERATOR CLASS sharding.text_shard_ops USING hash IS
    'hash partitions aligned with shard_of: MODULUS n REMAINDER r holds the rows with shard_of(key, n) = r';

CREATE OPERATOR CLASS sharding.bytea_shard_ops FOR TYPE bytea USING hash AS
    OPERATOR 1 pg_catalog.= (bytea, bytea),
    FUNCTION 1 sharding.partition_hash(bytea),
    FUNCTION 2 sharding.partition_hash_extended(bytea, bigint);
COMMENT ON OPERATOR CLASS sharding.bytea_shard_ops USING hash IS
    'hash partitions aligned with shard_of: MODULUS n REMAINDER r holds the rows with shard_of(key, n) = r';

CREATE OPERATOR CLASS sharding.uuid_shard_ops FOR TYPE uuid USING hash AS
    OPERATOR 1 pg_catalog.= (uuid, uuid),
    FUNCTION 1 sharding.partition_hash(uuid),
    FUNCTION 2 sharding.partition_hash_extended(uuid, bigint);
COMMENT ON OPERATOR CLASS sharding.uuid_shard_ops USING hash IS
    'hash partitions aligned with shard_of: MODULUS n REMAINDER r holds the rows with shard_of(key, n) = r';

-- smallint, integer and bigint form one family, like PostgreSQL's
-- integer_ops: every width hashes the value widened to int64, so equal values
-- hash alike and cross-type comparisons (bigint_key = 5) prune partitions.
CREATE OPERATOR FAMILY sharding.integer_shard_ops USING hash;
COMMENT ON OPERATOR FAMILY sharding.integer_shard_ops USING hash IS
    'int2_shard_ops, int4_shard_ops and int8_shard_ops, with cross-type equality';

CREATE OPERATOR CLASS sharding.int2_shard_ops FOR TYPE smallint USING hash
    FAMILY sharding.integer_shard_ops AS
    OPERATOR 1 pg_catalog.= (smallint, smallint),
    FUNCTION 1 sharding.partition_hash(smallint),
    FUNCTION 2 sharding.partition_hash_extended(smallint, bigint);
COMMENT ON OPERATOR CLASS sharding.int2_shard_ops USING hash IS
    'hash partitions aligned with shard_of: MODULUS n REMAINDER r holds the rows with shard_of(key, n) = r';

CREATE OPERATOR CLASS sharding.int4_shard_ops FOR TYPE integer USING hash
    FAMILY sharding.integer_shard_ops AS
    OPERATOR 1 pg_catalog.= (integer, integer),
    FUNCTION 1 sharding.partition_hash(integer),
    FUNCTION 2 sharding.partition_hash_extended(integer, bigint);
COMMENT ON OPERATOR CLASS sharding.int4_shard_ops USING hash IS
    'hash partitions aligned with shard_of: MODULUS n REMAINDER r holds the rows with shard_of(key, n) = r';

CREATE OPERATOR CLASS sharding.int8_shard_ops FOR TYPE bigint USING hash
    FAMILY sharding.integer_shard_ops AS
    OPERATOR 1 pg_catalog.= (bigint, bigint),
    FUNCTION 1 sharding.partition_hash(bigint),
    FUNCTION 2 sharding.partition_hash_extended(bigint, bigint);
COMMENT ON OPERATOR CLASS sharding.int8_shard_ops USING hash IS
    'hash partitions aligned with shard_of: MODULUS n REMAINDER r holds the rows with shard_of(key, n) = r';

ALTER OPERATOR FAMILY sharding.integer_shard_ops USING hash ADD
    OPERATOR 1 pg_catalog.= (smallint, integer),
    OPERATOR 1 pg_catalog.= (smallint, bigint),
    OPERATOR 1 pg_catalog.= (integer, smallint),
    OPERATOR 1 pg_catalog.= (integer, bigint),
    OPERATOR 1 pg_catalog.= (bigint, smallint),
    OPERATOR 1 pg_catalog.= (bigint, integer);

-- create_partitions: DDL, so VOLATILE and PARALLEL UNSAFE. STRICT: with a
-- NULL parent or count there is nothing to create. It runs as its caller,
-- who must own the parent as for CREATE TABLE ... PARTITION OF. Everything
-- is checked before the first partition is created, and the call is one
-- statement, so a failure leaves no partition behind.
CREATE FUNCTION sharding.create_partitions(parent regclass, shards integer) RETURNS void
    LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    nsp_oid     oid;
    nsp         name;
    rel         name;
    kind        "char";
    persistence "char";
    strat       "char";
    natts       smallint;
    attnum      smallint;
    opclass     oid;
    width       integer;
    prefix      text;
    taken       text;
    ntaken      bigint;
BEGIN
    IF shards < 1 THEN
        RAISE EXCEPTION 'shard count must be between 1 and 2147483647, got %', shards
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT c.relnamespace, n.nspname, c.relname, c.relkind, c.relpersistence
      INTO nsp_oid, nsp, rel, kind, persistence
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = parent;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with OID % does not exist', parent::oid USING ERRCODE = 'undefined_table';
    END IF;
    IF kind <> 'p' THEN
        RAISE EXCEPTION '% is not a partitioned table', parent
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Create it with PARTITION BY HASH (key sharding.text_shard_ops), '
                         'naming the *_shard_ops operator class of the key''s type.';
    END IF;

    SELECT pt.partstrat, pt.partnatts, pt.partattrs[0], pt.partclass[0]
      INTO strat, natts, attnum, opclass
      FROM pg_partitioned_table pt
     WHERE pt.partrelid = parent;
    IF strat <> 'h' THEN
        RAISE EXCEPTION '% is not hash-partitioned', parent
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Partitions aligned with shard_of need PARTITION BY HASH (key sharding.text_shard_ops).';
    END IF;
    IF natts <> 1 THEN
        RAISE EXCEPTION '% is hash-partitioned on % columns, not one', parent, natts
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'PostgreSQL combines the hashes of several key columns, so partitions '
                           'cannot line up with shard_of of any one of them.',
                  HINT = 'Partition on a single column with a sharding.*_shard_ops operator class.';
    END IF;
    IF attnum = 0 THEN
        RAISE EXCEPTION '% is hash-partitioned on an expression, not a column', parent
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Partition on a single column with a sharding.*_shard_ops operator class.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_opclass o
                    WHERE o.oid = opclass
                      AND o.opcnamespace = 'sharding'::regnamespace
                      AND o.opcname IN ('text_shard_ops', 'bytea_shard_ops', 'int2_shard_ops',
                                        'int4_shard_ops', 'int8_shard_ops', 'uuid_shard_ops')) THEN
        RAISE EXCEPTION '% is hash-partitioned with operator class %, not a sharding.*_shard_ops one',
                parent, (SELECT format('%I.%I', n.nspname, o.opcname)
                           FROM pg_opclass o JOIN pg_namespace n ON n.oid = o.opcnamespace
                          WHERE o.oid = opclass)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'PostgreSQL''s own hash opclasses do not agree with shard_of; '
                         'use PARTITION BY HASH (key sharding.text_shard_ops) or the one for the key''s type.';
    END IF;

    width := length((shards - 1)::text);
    prefix := rel || '_';
    IF octet_length(prefix) + width > 63 THEN
        RAISE EXCEPTION 'partition name "%" is too long', prefix || repeat('0', width)
            USING ERRCODE = 'name_too_long',
                  DETAIL = 'Partition names are <parent>_<remainder> and must fit in 63 bytes.';
    END IF;

    -- A table also creates a row type of its name: look at both catalogs.
    SELECT min(x.name), count(*) INTO taken, ntaken
      FROM (SELECT c.relname::text AS name FROM pg_class c
             WHERE c.relnamespace = nsp_oid AND starts_with(c.relname, prefix)
            UNION
            SELECT t.typname::text FROM pg_type t
             WHERE t.typnamespace = nsp_oid AND starts_with(t.typname, prefix)) AS x
     WHERE CASE WHEN substr(x.name, length(prefix) + 1) ~ '^[0-9]+$'
                     AND length(substr(x.name, length(prefix) + 1)) = width
                THEN substr(x.name, length(prefix) + 1)::bigint < shards  -- width <= 10 digits
                ELSE false END;
    IF ntaken > 0 THEN
        RAISE EXCEPTION 'relation "%" already exists', format('%I.%I', nsp, taken)
            USING ERRCODE = 'duplicate_table',
                  DETAIL = format('%s of the %s partition names are taken; nothing was created.',
                                  ntaken, shards);
    END IF;

    FOR r IN 0 .. shards - 1 LOOP
        EXECUTE format('CREATE %sTABLE %I.%I PARTITION OF %I.%I FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
                       CASE persistence WHEN 'u' THEN 'UNLOGGED ' ELSE '' END,
                       nsp, prefix || lpad(r::text, width, '0'), nsp, rel, shards, r);
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION sharding.create_partitions(regclass, integer) IS
    'creates the hash partitions <parent>_<r>, r = 0 .. shards-1, of a table partitioned on one column with a sharding.*_shard_ops opclass';
