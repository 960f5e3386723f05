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

-- Issue 16, finding 6: SQLSTATEs written as condition names.
CREATE OR REPLACE FUNCTION sharding._rank_column(tbl regclass, col name, OUT attnum smallint, OUT atttypid oid,
                                      OUT typmod integer)
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    -- Not STRICT: a NULL must be refused with a message, not ignored.
    IF tbl IS NULL OR col IS NULL THEN
        RAISE EXCEPTION 'table and column must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT a.attnum, a.atttypid, a.atttypmod INTO attnum, atttypid, typmod
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', col, tbl USING ERRCODE = 'undefined_column';
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION sharding.guard_rank(tbl regclass, col name, ranks text[] DEFAULT NULL,
                                    on_regress text DEFAULT 'skip') RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    c record;
    base oid;
    is_enum boolean;
    label text;
    canonical text;
    coltype text;
    trig name;
    args text;
BEGIN
    -- Not STRICT: ranks NULL means "the enum's declared order".
    IF on_regress IS NULL OR on_regress NOT IN ('skip', 'error') THEN
        RAISE EXCEPTION 'on_regress must be ''skip'' or ''error'', got %', coalesce(quote_literal(on_regress), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    c := sharding._rank_column(tbl, col);
    base := c.atttypid;
    WHILE (SELECT t.typtype = 'd' FROM pg_type AS t WHERE t.oid = base) LOOP
        base := (SELECT t.typbasetype FROM pg_type AS t WHERE t.oid = base);
    END LOOP;
    is_enum := (SELECT t.typtype = 'e' FROM pg_type AS t WHERE t.oid = base);
    coltype := format_type(c.atttypid, c.typmod);

    IF ranks IS NULL THEN
        IF NOT is_enum THEN
            RAISE EXCEPTION 'column "%" of relation % is of type %, not an enum, so ranks must be given', col, tbl, coltype
                USING ERRCODE = 'invalid_parameter_value', HINT = 'List the values lowest first: ranks => ARRAY[''new'', ''done''].';
        END IF;
    ELSE
        IF cardinality(ranks) = 0 THEN
            RAISE EXCEPTION 'ranks must list at least one value, got %', ranks USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF array_ndims(ranks) <> 1 THEN
            RAISE EXCEPTION 'ranks must be a one-dimensional array, got %', ranks USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR i IN 1 .. cardinality(ranks) LOOP
            label := ranks[array_lower(ranks, 1) + i - 1];
            IF label IS NULL THEN
                RAISE EXCEPTION 'ranks must not contain NULL, got %', ranks USING ERRCODE = 'invalid_parameter_value';
            ELSIF label = '' THEN
                RAISE EXCEPTION 'ranks must not contain an empty string, got %', ranks USING ERRCODE = 'invalid_parameter_value';
            ELSIF label = ANY (ranks[array_lower(ranks, 1) : array_lower(ranks, 1) + i - 2]) THEN
                RAISE EXCEPTION 'ranks list "%" twice', label USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF is_enum THEN
                IF NOT EXISTS (SELECT FROM pg_enum AS e WHERE e.enumtypid = base AND e.enumlabel = label) THEN
                    RAISE EXCEPTION 'rank "%" is not a value of enum type %', label, base::regtype
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            ELSE
                -- A rank must be a value of the column, written as the column
                -- prints it (the guard compares text forms).
                BEGIN
                    EXECUTE format('SELECT $1::%s::text', coltype) INTO canonical USING label;
                EXCEPTION WHEN data_exception THEN
                    RAISE EXCEPTION 'rank "%" is not a valid value of type %', label, coltype USING ERRCODE = 'invalid_parameter_value';
                END;
                IF canonical IS DISTINCT FROM label THEN
                    RAISE EXCEPTION 'rank "%" of type % reads back as "%"', label, coltype, canonical
                        USING ERRCODE = 'invalid_parameter_value', HINT = 'Write ranks as the column prints them.';
                END IF;
            END IF;
        END LOOP;
    END IF;

    -- Replace the column's guard, if any.
    FOR trig IN SELECT * FROM sharding._rank_guard_triggers(tbl, c.attnum) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trig, tbl);
    END LOOP;
    trig := CASE WHEN octet_length('sharding_rank_guard_' || col) <= 63 THEN 'sharding_rank_guard_' || col
                 ELSE 'sharding_rank_guard_' || md5(col) END;
    SELECT string_agg(quote_literal(a), ', ' ORDER BY n) INTO args
      FROM unnest(ARRAY[col::text, on_regress] || coalesce(ranks, '{}')) WITH ORDINALITY AS u(a, n);
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION sharding._rank_guard(%s)',
                   trig, col, tbl, args);

    INSERT INTO sharding.rank_guards AS g (schema_name, table_name, column_name, ranks, on_regress)
    SELECT n.nspname, r.relname, col, guard_rank.ranks, guard_rank.on_regress
      FROM pg_class AS r JOIN pg_namespace AS n ON n.oid = r.relnamespace
     WHERE r.oid = tbl
    ON CONFLICT (schema_name, table_name, column_name)
    DO UPDATE SET ranks = excluded.ranks, on_regress = excluded.on_regress, created = now();
END
$$;
CREATE OR REPLACE FUNCTION sharding.create_partitions(parent regclass, shards integer) RETURNS void
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
