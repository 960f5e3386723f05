\echo Use "ALTER EXTENSION sharding UPDATE TO '1.2'" to load this file. \quit

-- Version 1.1 → 1.2. This script is assembled by the Makefile from
-- sql/upgrade/1.1--1.2/*.sql (changes to objects that 1.1 already had) and
-- the install fragments sql/install/8*.sql and 9*.sql (topics new in 1.2),
-- in order of file name. Once 1.2 is released the assembled script is frozen
-- as sql/sharding--1.1--1.2.sql, as 1.0 → 1.1 was.
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
-- 1.1 -> 1.2, issue 18 (newcomer): on a database map (a map whose nodes have
-- DSNs), create_map, pin, move_shard and rebalance refuse a node without a
-- DSN (55000, sharding._check_database_nodes). Same bodies as
-- sql/install/20_maps.sql.

CREATE OR REPLACE FUNCTION sharding.create_map(map text, logical_shards integer, nodes text[]) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    k integer;
BEGIN
    IF map IS NULL OR map = '' THEN
        RAISE EXCEPTION 'map name must not be empty or NULL, got %', coalesce(quote_literal(map), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Upper bound: the routing cache holds one slot per logical shard in
    -- every backend, and the map one row per shard.
    IF logical_shards IS NULL OR logical_shards < 1 OR logical_shards > 1048576 THEN
        RAISE EXCEPTION 'logical shard count must be between 1 and 1048576, got %',
            coalesce(logical_shards::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._check_nodes(nodes);
    k := pg_catalog.cardinality(nodes);

    INSERT INTO sharding.maps AS m (map, logical_shards) VALUES ($1, $2) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" already exists', map USING ERRCODE = 'duplicate_object';
    END IF;
    -- A database map (some node has a DSN) needs a DSN for every node.
    PERFORM sharding._check_database_nodes($1, nodes);
    INSERT INTO sharding.nodes (node) SELECT n FROM pg_catalog.unnest(nodes) AS n
        ON CONFLICT DO NOTHING;
    -- Contiguous ranges, larger first: the rule of worker_shards/worker_of.
    INSERT INTO sharding.shards (map, logical, node)
    SELECT $1, g, nodes[sharding.worker_of(g, k, $2) + 1]
      FROM pg_catalog.generate_series(0, $2 - 1) AS g;
    PERFORM sharding._touch_map($1);
END $$;

CREATE OR REPLACE FUNCTION sharding.pin(map text, key text, node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, true);
    -- On a database map, a pin to a node without DSN would break every proxied call.
    PERFORM sharding._check_database_nodes($1, ARRAY[$3]);
    INSERT INTO sharding.nodes (node) VALUES ($3) ON CONFLICT DO NOTHING;
    INSERT INTO sharding.pins AS p (map, key, node) VALUES ($1, $2, $3)
        ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
    PERFORM sharding._touch_map($1);
END $$;

CREATE OR REPLACE FUNCTION sharding.move_shard(map text, logical integer, node text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    cur record;
    e bigint;
BEGIN
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    l := sharding._require_map($1, false);
    PERFORM sharding._check_logical($1, $2, l);
    -- On a database map the new owner needs a DSN.
    PERFORM sharding._check_database_nodes($1, ARRAY[$3]);
    -- Waits for every writer fenced on the shard (and any rebalance).
    PERFORM sharding._lock_shard($1, $2);
    SELECT s.node, s.epoch INTO cur FROM sharding.shards s
     WHERE s.map = $1 AND s.logical = $2 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    -- Moving a shard to its owner changes nothing: fenced writers stay valid.
    IF cur.node = $3 THEN
        RETURN cur.epoch;
    END IF;
    INSERT INTO sharding.nodes (node) VALUES ($3) ON CONFLICT DO NOTHING;
    UPDATE sharding.shards s SET node = $3, epoch = s.epoch + 1
     WHERE s.map = $1 AND s.logical = $2 RETURNING s.epoch INTO e;
    PERFORM sharding._touch_map($1);
    RETURN e;
END $$;

CREATE OR REPLACE FUNCTION sharding.rebalance(map text, nodes text[], dry_run boolean DEFAULT false)
    RETURNS TABLE(logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    owners text[];
    mv record;
    moved integer := 0;
BEGIN
    PERFORM sharding._check_nodes(nodes);
    IF dry_run IS NULL THEN
        RAISE EXCEPTION 'dry_run must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    -- On a database map every listed node needs a DSN (a dry run says so too).
    PERFORM sharding._check_database_nodes($1, nodes);
    IF NOT dry_run THEN
        -- One map-wide lock: waits for fenced writers, keeps new ones out.
        PERFORM sharding._lock_map($1);
        PERFORM sharding._require_map($1, true);
        INSERT INTO sharding.nodes (node) SELECT n FROM pg_catalog.unnest(nodes) AS n
            ON CONFLICT DO NOTHING;
    END IF;
    SELECT pg_catalog.array_agg(s.node ORDER BY s.logical) INTO owners
      FROM sharding.shards s WHERE s.map = $1;
    FOR mv IN SELECT * FROM sharding._rebalance_plan(owners, nodes) LOOP
        IF NOT dry_run THEN
            UPDATE sharding.shards s SET node = mv.to_node, epoch = s.epoch + 1
             WHERE s.map = $1 AND s.logical = mv.logical;
        END IF;
        moved := moved + 1;
        logical := mv.logical;
        from_node := mv.from_node;
        to_node := mv.to_node;
        RETURN NEXT;
    END LOOP;
    IF NOT dry_run AND moved > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
END $$;
-- Queue changes of 1.2 to objects 1.1 had (see sql/install/30_queue.sql):
-- queue_settings gains the retry backoff; create_queue makes run_at and
-- priority, the claim index in their order and the wakeup trigger; the C
-- functions move to their sharding_ symbols and drop their per-call
-- SET search_path (their SQL is schema-qualified); complete records the
-- finish time in claim_expires; claims honour run_at and priority.

ALTER TABLE sharding.queue_settings
    ADD COLUMN backoff_base interval CHECK (backoff_base > interval '0'),
    ADD COLUMN backoff_max  interval CHECK (backoff_max > interval '0');
COMMENT ON TABLE sharding.queue_settings IS
    'per-queue settings (max_attempts, retry backoff), keyed by the queue table''s schema and name';

CREATE OR REPLACE FUNCTION sharding._queue_settings_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__queue_settings_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._queue_settings_changed() IS
    'internal: invalidates the cached plans and settings of the queue a sharding.queue_settings row names';

CREATE OR REPLACE FUNCTION sharding._create_queue(parts text[], default_schema text) RETURNS regclass
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
    q text;
BEGIN
    IF parts IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = '22023';
    ELSIF cardinality(parts) = 1 THEN
        nsp := default_schema;
        rel := parts[1];
        IF nsp IS NULL THEN
            RAISE EXCEPTION 'no schema has been selected to create queue "%" in', rel
                USING ERRCODE = '3F000';
        END IF;
    ELSIF cardinality(parts) = 2 THEN
        nsp := parts[1];
        rel := parts[2];
    ELSE
        RAISE EXCEPTION 'improper queue name "%": expected table or schema.table',
            array_to_string(parts, '.') USING ERRCODE = '22023';
    END IF;
    -- A missing schema is reported plainly, not as a failed CREATE TABLE.
    IF NOT EXISTS (SELECT FROM pg_namespace n WHERE n.nspname = nsp) THEN
        RAISE EXCEPTION 'schema "%" does not exist', nsp USING ERRCODE = 'invalid_schema_name',
            HINT = 'Create it first (CREATE SCHEMA), or name a queue in an existing schema.';
    END IF;
    q := format('%I.%I', nsp, rel);
    EXECUTE format($sql$
        CREATE TABLE %s (
            id            bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            key           text,
            payload       jsonb,
            status        text NOT NULL DEFAULT 'pending'
                          CHECK (status IN ('pending', 'processing', 'done', 'failed')),
            owner         text,
            claim_expires timestamptz,
            created       timestamptz NOT NULL DEFAULT now(),
            attempts      integer NOT NULL DEFAULT 0,
            run_at        timestamptz NOT NULL DEFAULT now(),
            priority      smallint NOT NULL DEFAULT 0
        )$sql$, q);
    EXECUTE format('CREATE INDEX ON %s (priority DESC, run_at, created, id) WHERE status = %L', q, 'pending');
    EXECUTE format('CREATE INDEX ON %s (claim_expires) WHERE status = %L', q, 'processing');
    EXECUTE format('CREATE TRIGGER sharding_notify AFTER INSERT ON %s REFERENCING NEW TABLE AS sharding_new '
                   'FOR EACH STATEMENT EXECUTE FUNCTION sharding._queue_notify()', q);
    RETURN q::regclass;
END
$$;
COMMENT ON FUNCTION sharding._create_queue(text[], text) IS
    'internal: creates a queue table from its parsed name (called by create_queue)';

CREATE OR REPLACE FUNCTION sharding.create_queue(queue text) RETURNS regclass
    LANGUAGE sql VOLATILE PARALLEL UNSAFE
    AS $$ SELECT sharding._create_queue(pg_catalog.parse_ident(queue), pg_catalog.current_schema()) $$;
COMMENT ON FUNCTION sharding.create_queue(text) IS
    'creates a queue table (id, key, payload, status, owner, claim_expires, created, attempts, run_at, priority) with its claim indexes and wakeup trigger';

CREATE OR REPLACE FUNCTION sharding.claim(queue anyelement, worker text, batch integer DEFAULT 50,
                               lease interval DEFAULT '5 minutes')
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50;
COMMENT ON FUNCTION sharding.claim(anyelement, text, integer, interval) IS
    'leases up to batch due pending or expired rows of the queue table to worker in claim order (priority, run_at, created, id; FOR UPDATE SKIP LOCKED) and returns them in that order';

CREATE OR REPLACE FUNCTION sharding.claim_shards(queue anyelement, worker text, shards integer[], shard_count integer,
                                      batch integer DEFAULT 50, lease interval DEFAULT '5 minutes',
                                      key_column name DEFAULT 'key')
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim_shards' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50;
COMMENT ON FUNCTION sharding.claim_shards(anyelement, text, integer[], integer, integer, interval, name) IS
    'as claim, only rows whose shard_of(key_column, shard_count) is one of shards';

CREATE OR REPLACE FUNCTION sharding.complete(queue regclass, id bigint, worker text, attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_complete' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, bigint, text, integer) IS
    'marks the job done if it is processing, owned by worker and (if given) in claim number attempt';

CREATE OR REPLACE FUNCTION sharding.complete(queue regclass, ids bigint[], worker text)
    RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_complete_many' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, bigint[], text) IS
    'marks done every listed job that is processing and owned by worker, in one statement; returns how many';

CREATE OR REPLACE FUNCTION sharding.fail(queue regclass, id bigint, worker text, retry boolean DEFAULT true,
                              attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_fail' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fail(regclass, bigint, text, boolean, integer) IS
    'same fence as complete; back to pending (retry, while max_attempts allows; run_at pushed back by the queue''s backoff) or failed';

CREATE OR REPLACE FUNCTION sharding.extend_lease(queue regclass, id bigint, worker text, lease interval,
                                      attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_extend_lease' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.extend_lease(regclass, bigint, text, interval, integer) IS
    'same fence as complete; sets claim_expires = now() + lease';

CREATE OR REPLACE FUNCTION sharding._queue_sql(queue regclass, kind text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__queue_sql' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding._queue_sql(regclass, text) IS
    'internal: SQL text of a queue statement as claim/complete/fail/extend_lease prepare it (for EXPLAIN)';

CREATE OR REPLACE FUNCTION sharding.set_max_attempts(queue regclass, max_attempts integer) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
    relowner oid;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = '22023';
    END IF;
    SELECT n.nspname, c.relname, c.relowner INTO nsp, rel, relowner
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = queue;
    IF NOT pg_has_role(relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of queue table %', queue USING ERRCODE = '42501';
    END IF;
    IF max_attempts IS NULL THEN
        UPDATE sharding.queue_settings s SET max_attempts = NULL WHERE s.schema_name = nsp AND s.table_name = rel;
        DELETE FROM sharding.queue_settings s
         WHERE s.schema_name = nsp AND s.table_name = rel AND s.backoff_base IS NULL AND s.max_attempts IS NULL;
        RETURN;
    END IF;
    IF max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1, got %', max_attempts USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a
                    WHERE a.attrelid = queue AND a.attname = 'attempts' AND a.atttypid = 'integer'::regtype
                      AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'queue table % has no integer column "attempts" to count against max_attempts', queue
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO sharding.queue_settings AS s (schema_name, table_name, max_attempts)
    VALUES (nsp, rel, set_max_attempts.max_attempts)
    ON CONFLICT (schema_name, table_name) DO UPDATE SET max_attempts = EXCLUDED.max_attempts;
END
$$;
COMMENT ON FUNCTION sharding.set_max_attempts(regclass, integer) IS
    'after max_attempts claims an expired or retried job goes to failed instead of pending (NULL: no limit)';
-- 1.1 -> 1.2, issue 18 (newcomer): guard_rank and unguard_rank are also
-- allowed to the table's owner. Same objects and bodies as
-- sql/install/40_rank.sql.

-- Internal: may the current user change the rank guards of table
-- schema_name.table_name? Members of sharding_admin, the extension's owner,
-- and members of the table's owning role may.
CREATE FUNCTION sharding._may_guard(schema_name text, table_name text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT pg_catalog.pg_has_role('sharding_admin', 'USAGE')
            OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                        WHERE e.extname OPERATOR(pg_catalog.=) 'sharding'
                          AND pg_catalog.pg_has_role(e.extowner, 'USAGE'))
            OR EXISTS (SELECT FROM pg_catalog.pg_class AS c
                         JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                        WHERE n.nspname OPERATOR(pg_catalog.=) $1 AND c.relname OPERATOR(pg_catalog.=) $2
                          AND pg_catalog.pg_has_role(c.relowner, 'USAGE'))
    $$;
COMMENT ON FUNCTION sharding._may_guard(text, text) IS
    'internal: whether the current user may change the rank guards of a table (its owner, sharding_admin, the extension''s owner)';

-- Internal: the row trigger of sharding.rank_guards; 42501 for a row (old
-- or new) of a table the current user may not guard. Not revoked: EXECUTE of
-- a trigger function is checked only when the trigger is created.
CREATE FUNCTION sharding._guard_registry_check() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND NOT sharding._may_guard(OLD.schema_name, OLD.table_name) THEN
        RAISE EXCEPTION 'permission denied to change the rank guards of table %', format('%I.%I', OLD.schema_name, OLD.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Rank guards are changed by the table''s owner, the extension''s owner or members of role sharding_admin.';
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NOT sharding._may_guard(NEW.schema_name, NEW.table_name) THEN
        RAISE EXCEPTION 'permission denied to change the rank guards of table %', format('%I.%I', NEW.schema_name, NEW.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Rank guards are changed by the table''s owner, the extension''s owner or members of role sharding_admin.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION sharding._guard_registry_check() IS
    'internal: keeps writes to sharding.rank_guards to tables the current user may guard';
CREATE TRIGGER may_guard BEFORE INSERT OR UPDATE OR DELETE ON sharding.rank_guards
    FOR EACH ROW EXECUTE FUNCTION sharding._guard_registry_check();
-- Table owners need the privilege; the trigger above keeps them to their tables.
GRANT INSERT, UPDATE, DELETE ON sharding.rank_guards TO PUBLIC;

-- Internal: 42501 unless the current user may change the guards of tbl.
CREATE FUNCTION sharding._require_may_guard(tbl regclass) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class AS r JOIN pg_namespace AS n ON n.oid = r.relnamespace
                    WHERE r.oid = tbl AND sharding._may_guard(n.nspname, r.relname)) THEN
        RAISE EXCEPTION 'permission denied to change the rank guards of table %', tbl
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Rank guards are changed by the table''s owner, the extension''s owner or members of role sharding_admin.',
                  HINT = 'Ask the table''s owner, or GRANT sharding_admin to this role.';
    END IF;
END
$$;
COMMENT ON FUNCTION sharding._require_may_guard(regclass) IS
    'internal: 42501 unless the current user may change the rank guards of the table';

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
    IF tbl IS NOT NULL THEN
        PERFORM sharding._require_may_guard(tbl);
    END IF;
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

CREATE OR REPLACE FUNCTION sharding.unguard_rank(tbl regclass, col name) RETURNS void
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    c record;
    trig name;
    dropped boolean := false;
BEGIN
    PERFORM sharding._require_may_guard(tbl);
    c := sharding._rank_column(tbl, col);
    FOR trig IN SELECT * FROM sharding._rank_guard_triggers(tbl, c.attnum) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trig, tbl);
        dropped := true;
    END LOOP;
    DELETE FROM sharding.rank_guards AS g
     USING pg_class AS r JOIN pg_namespace AS n ON n.oid = r.relnamespace
     WHERE r.oid = tbl AND g.schema_name = n.nspname AND g.table_name = r.relname AND g.column_name = col;
    IF NOT dropped THEN
        RAISE NOTICE 'column "%" of relation % has no rank guard, skipping', col, tbl;
    END IF;
END
$$;

GRANT EXECUTE ON FUNCTION sharding.guard_rank(regclass, name, text[], text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.unguard_rank(regclass, name) TO PUBLIC;
-- 1.1 -> 1.2, issue 13 (handoff): pin and unpin wait for claim_node calls in
-- flight on the map, for writers fenced on the key's shards and for moves
-- (sharding._lock_pin, sql/install/88_pin_lock.sql), so that a pin moving a
-- key from node A to node B never commits between a claim_node's reading of
-- the map and its claim. Same bodies as sql/install/20_maps.sql.

CREATE OR REPLACE FUNCTION sharding.pin(map text, key text, node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    -- Waits for claim_node calls in flight on the map, for writers fenced on
    -- the shards the key routes by, and for moves (sharding._lock_pin).
    PERFORM sharding._lock_pin($1, $2);
    PERFORM sharding._require_map($1, true);
    -- On a database map, a pin to a node without DSN would break every proxied call.
    PERFORM sharding._check_database_nodes($1, ARRAY[$3]);
    INSERT INTO sharding.nodes (node) VALUES ($3) ON CONFLICT DO NOTHING;
    INSERT INTO sharding.pins AS p (map, key, node) VALUES ($1, $2, $3)
        ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
    PERFORM sharding._touch_map($1);
END $$;

CREATE OR REPLACE FUNCTION sharding.unpin(map text, key text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    -- The key goes back to its shard's owner: the same waits as pin.
    PERFORM sharding._lock_pin($1, $2);
    PERFORM sharding._require_map($1, true);
    DELETE FROM sharding.pins p WHERE p.map = $1 AND p.key = $2;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM sharding._touch_map($1);
    RETURN true;
END $$;
-- 1.1 -> 1.2, copy_shard (the "move" topic): pins are compared by the
-- key's canonical text form (bytea in hex whatever bytea_output says), and
-- its comment says what it carries (inserts only). Same text as
-- sql/install/70_nodes.sql.
-- copy_shard(map, logical, tbl, key_column, from_dsn, to_dsn): a low-level
-- copy, kept from 1.1 (moves use move_shard_online since 1.2): copies the
-- rows of `tbl` whose key is in logical shard `logical` of `map` and is not
-- pinned, from the database at from_dsn to the one at to_dsn, with one
-- INSERT ... SELECT that the destination runs against the source through
-- dblink (rows go from source to destination directly). Rows already at
-- the destination are skipped (ON CONFLICT DO NOTHING), so a repeated copy
-- carries INSERTS ONLY: rows updated or deleted at the source since the
-- last copy keep their old state at the destination. Returns the number of
-- rows inserted.
--
-- Needs contrib's dblink here (to reach the destination) and at the
-- destination (to reach the source), in the same schema, and `sharding` at
-- the source (for shard_of). `tbl` must exist here, at the source and at
-- the destination with the same columns. dblink runs SQL text, not
-- parameters: every identifier is quoted with %I, every value with %L.
CREATE OR REPLACE FUNCTION sharding.copy_shard(map text, logical integer, tbl regclass, key_column name,
                                    from_dsn text, to_dsn text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    shards integer;
    dblink_schema name;
    key_type regtype;
    rel text;
    cols text;
    coldefs text;
    pinned text[];
    src_query text;
    dst_command text;
    status text;
BEGIN
    SELECT m.logical_shards INTO shards FROM sharding.maps AS m WHERE m.map = copy_shard.map;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', copy_shard.map USING ERRCODE = 'undefined_object';
    END IF;
    IF copy_shard.logical < 0 OR copy_shard.logical >= shards THEN
        RAISE EXCEPTION 'logical shard must be between 0 and % for map "%", got %',
                shards - 1, copy_shard.map, copy_shard.logical
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT a.atttypid::regtype INTO key_type
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = copy_shard.tbl AND a.attname = copy_shard.key_column
       AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', copy_shard.key_column, copy_shard.tbl
            USING ERRCODE = 'undefined_column';
    END IF;
    IF key_type NOT IN ('text'::regtype, 'bytea'::regtype, 'smallint'::regtype, 'integer'::regtype,
                        'bigint'::regtype, 'uuid'::regtype) THEN
        RAISE EXCEPTION 'key column "%" of relation % has type %, not a shard key type',
                copy_shard.key_column, copy_shard.tbl, key_type
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Shard keys are text, bytea, smallint, integer, bigint or uuid.';
    END IF;

    SELECT e.extnamespace::regnamespace::name INTO dblink_schema
      FROM pg_catalog.pg_extension AS e WHERE e.extname = 'dblink';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'copy_shard needs extension "dblink"'
            USING ERRCODE = 'undefined_function',
                  HINT = 'CREATE EXTENSION dblink here and at the destination.';
    END IF;

    -- The table by schema-qualified name (the other ends' search_path is
    -- theirs), its stored columns, and the record type dblink returns.
    SELECT format('%I.%I', n.nspname, c.relname) INTO rel
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = copy_shard.tbl;
    SELECT string_agg(format('%I', a.attname), ', ' ORDER BY a.attnum),
           string_agg(format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)), ', '
                      ORDER BY a.attnum)
      INTO cols, coldefs
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = copy_shard.tbl AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '';

    -- Pinned keys live on their pin's node, not on the shard's owner.
    SELECT coalesce(array_agg(p.key), '{}') INTO pinned
      FROM sharding.pins AS p WHERE p.map = copy_shard.map;

    -- Pins hold the key's canonical text form (bytea in hex): compare that
    -- form, not ::text, which for bytea follows the source's bytea_output.
    src_query := format('SELECT %s FROM %s WHERE sharding.shard_of(%I, %s) = %s AND NOT (%s = ANY (%L::text[]))',
                        cols, rel, copy_shard.key_column, shards, copy_shard.logical,
                        sharding._key_text_sql(format('%I', copy_shard.key_column), key_type), pinned);
    dst_command := format('INSERT INTO %s (%s) SELECT %s FROM %I.dblink(%L, %L) AS s(%s) ON CONFLICT DO NOTHING',
                          rel, cols, cols, dblink_schema, copy_shard.from_dsn, src_query, coldefs);
    EXECUTE format('SELECT %I.dblink_exec($1, $2)', dblink_schema)
       INTO status USING copy_shard.to_dsn, dst_command;
    -- The command tag: "INSERT 0 <rows>".
    RETURN split_part(status, ' ', 3)::bigint;
END
$$;
COMMENT ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) IS
    'copies the unpinned rows of one logical shard of a table from one node to another (through dblink; a repeat carries inserts only); returns rows inserted';
-- It reads and writes other databases: administrators only.
REVOKE ALL ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) TO sharding_admin;
-- Section 8 (part): distributed tables. A map's distributed tables are
-- co-located: every row of each is placed by node_for(map, key_column), so
-- moving a logical shard carries all of them (move_shard_online), data nodes
-- refuse writes of keys they do not own (guarded writes), and fanout_stats
-- counts the statements that touch them.
--
-- Recorded by schema and table name (not oid), so that pg_dump/restore and
-- logical replication to followers keep the rows meaningful.

CREATE TABLE sharding.distributed_tables (
    schema_name text NOT NULL,
    table_name  text NOT NULL,
    key_column  text NOT NULL,
    map         text NOT NULL REFERENCES sharding.maps ON DELETE CASCADE,
    PRIMARY KEY (schema_name, table_name)
);
COMMENT ON TABLE sharding.distributed_tables IS
    'tables whose rows are placed by node_for(map, key_column); a map''s tables are co-located';
SELECT pg_catalog.pg_extension_config_dump('sharding.distributed_tables', '');
GRANT SELECT ON sharding.distributed_tables TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.distributed_tables TO sharding_admin;

-- distribute(tbl regclass, key_column name, map text): records tbl as placed
-- by node_for(map, key_column). Not STRICT: a NULL argument raises 22023.
CREATE FUNCTION sharding.distribute(tbl regclass, key_column name, map text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
    typ oid;
BEGIN
    IF tbl IS NULL OR key_column IS NULL OR map IS NULL THEN
        RAISE EXCEPTION 'distribute needs a table, a key column and a map, got %, %, %',
            coalesce(tbl::text, 'NULL'), coalesce(key_column::text, 'NULL'), coalesce(map, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map(map);
    SELECT n.nspname, c.relname INTO nsp, rel
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = tbl;
    SELECT a.atttypid INTO typ FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = tbl AND a.attname = key_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of table % does not exist', key_column, tbl
            USING ERRCODE = 'undefined_column';
    END IF;
    -- The key types of section 1 (varchar is text with a length limit; a
    -- domain counts as its base type).
    SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END INTO typ
      FROM pg_catalog.pg_type t WHERE t.oid = typ;
    IF typ NOT IN ('pg_catalog.text'::pg_catalog.regtype, 'pg_catalog.varchar'::pg_catalog.regtype,
                   'pg_catalog.bytea'::pg_catalog.regtype, 'pg_catalog.int2'::pg_catalog.regtype,
                   'pg_catalog.int4'::pg_catalog.regtype, 'pg_catalog.int8'::pg_catalog.regtype,
                   'pg_catalog.uuid'::pg_catalog.regtype) THEN
        RAISE EXCEPTION 'column "%" of table % is of type %, not a shard key type', key_column, tbl,
            pg_catalog.format_type(typ, NULL)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Shard keys are text, varchar, bytea, smallint, integer, bigint or uuid.';
    END IF;
    IF EXISTS (SELECT FROM sharding.distributed_tables d WHERE d.schema_name = nsp AND d.table_name = rel) THEN
        RAISE EXCEPTION 'table % is already distributed', tbl
            USING ERRCODE = 'duplicate_object', HINT = 'Call sharding.undistribute first to change it.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = tbl AND i.indisprimary) THEN
        RAISE EXCEPTION 'table % has no primary key', tbl
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Moving a shard online replicates updates and deletes by primary key.';
    END IF;
    INSERT INTO sharding.distributed_tables (schema_name, table_name, key_column, map)
    VALUES (nsp, rel, key_column, map);
END $$;
COMMENT ON FUNCTION sharding.distribute(regclass, name, text) IS
    'records that a table''s rows are placed by node_for(map, key_column); a map''s tables are co-located';

-- undistribute(tbl regclass): whether tbl was distributed. Not STRICT: NULL
-- raises 22023 like the other configuration functions.
CREATE FUNCTION sharding.undistribute(tbl regclass) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'table must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM sharding.distributed_tables d
     USING pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = tbl AND d.schema_name = n.nspname AND d.table_name = c.relname;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION sharding.undistribute(regclass) IS
    'forgets that a table is distributed; returns whether it was';

-- Configuration changes: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding.distribute(regclass, name, text), sharding.undistribute(regclass)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.distribute(regclass, name, text), sharding.undistribute(regclass)
    TO sharding_admin;
-- Section 12: database maps. A map whose nodes have connection strings (any
-- of them) is a database map; there a node without a DSN would make every
-- proxied call fail (cluster_partitions raises 55000), so the functions that
-- hand shards or pins to a node refuse one without a DSN. Maps whose nodes
-- have no DSN (worker maps) keep accepting new names.

-- _check_database_nodes(map, nodes): 55000 naming the first node of `nodes`
-- that has no DSN, when `map` is a database map: some node owning its shards
-- or holding its pins, or some node of `nodes`, has a DSN. create_map passes
-- a map that does not exist yet: then only `nodes` decide.
CREATE FUNCTION sharding._check_database_nodes(map text, nodes text[]) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    missing text;
BEGIN
    IF NOT EXISTS (
        SELECT FROM sharding.nodes n
         WHERE n.dsn IS NOT NULL
           AND (n.node = ANY (nodes)
                OR n.node IN (SELECT s.node FROM sharding.shards s WHERE s.map = $1)
                OR n.node IN (SELECT p.node FROM sharding.pins p WHERE p.map = $1))) THEN
        RETURN;  -- a worker map: any name goes
    END IF;
    SELECT u.node INTO missing
      FROM pg_catalog.unnest(nodes) WITH ORDINALITY AS u(node, i)
      LEFT JOIN sharding.nodes n ON n.node = u.node
     WHERE n.dsn IS NULL
     ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'node "%" has no connection string, and map "%" is a database map', missing, $1
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Other nodes of the map have DSNs; PL/Proxy could not reach this one.',
                  HINT = format('Call sharding.add_node(%L, ''<dsn>'') first.', missing);
    END IF;
END $$;
COMMENT ON FUNCTION sharding._check_database_nodes(text, text[]) IS
    'internal: 55000 for a node without DSN handed shards or pins of a database map';
REVOKE ALL ON FUNCTION sharding._check_database_nodes(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._check_database_nodes(text, text[]) TO sharding_admin;
-- Section 9: order per key without giving up dynamic claims
-- (claim_ordered), and claims routed by a map with a safe handoff
-- (claim_node). src/queue_ordered.cpp.

-- The node each worker last claimed through with claim_node, per map: one
-- row per worker name (never per key). claim_node treats a live lease held
-- by a worker registered for another node as held through that node, and
-- leaves its key (and the logical shard of an unpinned key) alone
-- until the lease ends: the handoff rule. Workers register themselves on
-- every claim_node call that changes their node, so everyone may write it.
CREATE TABLE sharding.claim_node_workers (
    map    text NOT NULL,
    worker text NOT NULL,
    node   text NOT NULL,
    since  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    registered_by name NOT NULL DEFAULT CURRENT_USER,
    PRIMARY KEY (map, worker)
);
COMMENT ON TABLE sharding.claim_node_workers IS
    'the node each worker last claimed through (claim_node); a live lease of another node''s worker holds back the handoff';
COMMENT ON COLUMN sharding.claim_node_workers.registered_by IS
    'the role that registered the worker name; only it (or sharding_admin) may move the name to another node';
SELECT pg_catalog.pg_extension_config_dump('sharding.claim_node_workers', '');
GRANT SELECT, INSERT, UPDATE ON sharding.claim_node_workers TO PUBLIC;
GRANT DELETE ON sharding.claim_node_workers TO sharding_admin;
-- Row security. Moving another worker's name to node B would make its live
-- leases count as B's own, so B would claim their keys and shards at once:
-- the handoff broken by any role that may write here. So everyone reads
-- every row (the handoff compares them), a role registers names as itself
-- (registered_by) and re-registers only names it registered (claim_node
-- then fails with 42501 for a name another role holds); sharding_admin may
-- change and delete any row. Worker names remain unauthenticated within a
-- role: a role's workers must use distinct names on distinct nodes.
ALTER TABLE sharding.claim_node_workers ENABLE ROW LEVEL SECURITY;
CREATE POLICY claim_node_workers_read ON sharding.claim_node_workers FOR SELECT USING (true);
CREATE POLICY claim_node_workers_insert ON sharding.claim_node_workers FOR INSERT
    WITH CHECK (registered_by OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY claim_node_workers_update ON sharding.claim_node_workers FOR UPDATE
    USING (registered_by OPERATOR(pg_catalog.=) CURRENT_USER)
    WITH CHECK (registered_by OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY claim_node_workers_admin ON sharding.claim_node_workers TO sharding_admin
    USING (true) WITH CHECK (true);

-- claim_ordered and claim_node are not STRICT: the queue argument is
-- NULL::table by design, shards/shard_count are NULL by default; other NULL
-- arguments raise 22023.
CREATE FUNCTION sharding.claim_ordered(queue anyelement, worker text, batch integer DEFAULT 50,
                                       lease interval DEFAULT '5 minutes', key_column name DEFAULT 'key',
                                       shards integer[] DEFAULT NULL, shard_count integer DEFAULT NULL)
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim_ordered' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.claim_ordered(anyelement, text, integer, interval, name, integer[], integer) IS
    'as claim, but per key strictly in (created, id) order with at most one job of a key in flight; keys take turns, oldest head first';

CREATE FUNCTION sharding.claim_node(queue anyelement, map text, node text, worker text, batch integer DEFAULT 50,
                                    lease interval DEFAULT '5 minutes', key_column name DEFAULT 'key',
                                    ordered boolean DEFAULT false)
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim_node' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.claim_node(anyelement, text, text, text, integer, interval, name, boolean) IS
    'claims only jobs node_for(map, key) sends to node, nothing another node''s worker still holds under a live lease; ordered as claim_ordered';

CREATE FUNCTION sharding._claim_ordered_sql(queue regclass, variant integer, key_column name DEFAULT 'key')
    RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__claim_ordered_sql' LANGUAGE C STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._claim_ordered_sql(regclass, integer, name) IS
    'internal: SQL text of a claim_ordered/claim_node (ordered) statement (variant bits: 1 ordered, 2 shards, 4 node, 8 max_attempts, 16 handoff exclusion)';

-- create_ordered_indexes(queue, key_column): the indexes that keep
-- claim_ordered and claim_node an index walk, each created only when the
-- table has no index of the same definition:
--   (key_column, status, created, id) WHERE status IN ('pending', 'processing')
--       the head test: two probes per candidate, whatever the backlog;
--   ([priority DESC,] [run_at,] created, id) WHERE status = 'pending'
--       pending jobs in claim order (create_queue makes it);
--   (claim_expires) WHERE status = 'processing'
--       expired leases (create_queue makes it).
-- Returns the indexes it created. Needs ownership of the table, as CREATE
-- INDEX does. Not STRICT: a NULL argument raises 22023.
CREATE FUNCTION sharding.create_ordered_indexes(queue regclass, key_column name DEFAULT 'key')
    RETURNS SETOF regclass
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    wanted text[];
    def text;
    existing text[];
    idx oid;
    order_cols text := 'created, id';
BEGIN
    IF queue IS NULL OR key_column IS NULL THEN
        RAISE EXCEPTION 'queue and key_column must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = queue AND a.attname = key_column
                      AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'queue table % lacks key column "%"', queue, key_column
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = queue AND a.attname = 'run_at'
                  AND a.attnum > 0 AND NOT a.attisdropped) THEN
        order_cols := 'run_at, ' || order_cols;
    END IF;
    IF EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = queue AND a.attname = 'priority'
                  AND a.attnum > 0 AND NOT a.attisdropped) THEN
        order_cols := 'priority DESC, ' || order_cols;
    END IF;
    -- As pg_get_indexdef spells them after "USING ".
    wanted := ARRAY[
        format('btree (%s, status, created, id) WHERE (status = ANY (ARRAY[''pending''::text, ''processing''::text]))',
               quote_ident(key_column)),
        format('btree (%s) WHERE (status = ''pending''::text)', order_cols),
        'btree (claim_expires) WHERE (status = ''processing''::text)'];
    SELECT coalesce(array_agg(regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '')), '{}')
      INTO existing
      FROM pg_index i WHERE i.indrelid = queue;
    FOREACH def IN ARRAY wanted LOOP
        CONTINUE WHEN def = ANY (existing);
        EXECUTE format('CREATE INDEX ON %s USING %s', queue, def);
        SELECT c.oid INTO idx FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = queue
           AND regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '') = def
         ORDER BY c.oid DESC LIMIT 1;
        RETURN NEXT idx;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sharding.create_ordered_indexes(regclass, name) IS
    'creates the indexes claim_ordered and claim_node walk (head test, pending in claim order, expired leases) where missing';

CREATE FUNCTION sharding._current_version(rel oid, tid tid) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__current_version' LANGUAGE C VOLATILE STRICT PARALLEL SAFE COST 10;
COMMENT ON FUNCTION sharding._current_version(oid, tid) IS
    'internal (claim_ordered, claim_node): whether a row version is still its row''s latest committed one, checked just before FOR UPDATE';
-- Sections 10 and 12: queues that stay fast under pressure (run_at,
-- priority, batch enqueue, retry backoff, purge, health, wakeups) and the
-- 1.2 amendments of the fenced functions (src/queue.cpp).
--
-- All SECURITY INVOKER: the caller's privileges on the queue table apply.

-- complete(queue, ids, worker, attempts): the batch form fenced per id.
-- Not STRICT: a NULL argument raises 22023 naming it.
CREATE FUNCTION sharding.complete(queue regclass, ids bigint[], worker text, attempts integer[])
    RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding_complete_attempts' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, bigint[], text, integer[]) IS
    'marks done every listed job that is processing, owned by worker and in claim number attempts[i] (NULL: unchecked), in one statement; returns the ids that passed';

-- integer ids (1.2): the same functions, so that complete('jobs', 42, 'w1')
-- needs no cast. An integer literal matches these exactly; a bigint the
-- bigint forms. Not STRICT, as their bigint forms.
CREATE FUNCTION sharding.complete(queue regclass, id integer, worker text, attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_complete_int4' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, integer, text, integer) IS
    'marks the job done if it is processing, owned by worker and (if given) in claim number attempt (integer id)';

CREATE FUNCTION sharding.fail(queue regclass, id integer, worker text, retry boolean DEFAULT true,
                              attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_fail_int4' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fail(regclass, integer, text, boolean, integer) IS
    'same fence as complete; back to pending (retry, while max_attempts allows; run_at pushed back by the queue''s backoff) or failed (integer id)';

CREATE FUNCTION sharding.extend_lease(queue regclass, id integer, worker text, lease interval,
                                      attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_extend_lease_int4' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.extend_lease(regclass, integer, text, interval, integer) IS
    'same fence as complete; sets claim_expires = now() + lease (integer id)';

-- enqueue_many: one INSERT ... SELECT over the unnested arrays, ids in the
-- order of keys (identity values are drawn in the order rows are inserted).
-- Not STRICT: payloads and run_at may be NULL; a NULL queue or keys raise
-- 22023.
CREATE FUNCTION sharding.enqueue_many(queue regclass, keys text[], payloads jsonb[] DEFAULT NULL,
                                      run_at timestamptz DEFAULT NULL, priority smallint DEFAULT 0)
    RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    has_run_at boolean;
    has_priority boolean;
    ids bigint[];
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF keys IS NULL THEN
        RAISE EXCEPTION 'keys must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF priority IS NULL THEN
        RAISE EXCEPTION 'priority must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF array_ndims(keys) > 1 OR array_ndims(payloads) > 1 THEN
        RAISE EXCEPTION 'keys and payloads must be one-dimensional arrays' USING ERRCODE = 'invalid_parameter_value';
    ELSIF payloads IS NOT NULL AND cardinality(payloads) <> cardinality(keys) THEN
        RAISE EXCEPTION 'keys and payloads must have the same length, got % keys and % payloads',
            cardinality(keys), cardinality(payloads) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(bool_or(a.attname = 'run_at'), false), coalesce(bool_or(a.attname = 'priority'), false)
      INTO has_run_at, has_priority
      FROM pg_attribute a
     WHERE a.attrelid = queue AND a.attnum > 0 AND NOT a.attisdropped AND a.attname IN ('run_at', 'priority');
    IF enqueue_many.run_at IS NOT NULL AND NOT has_run_at THEN
        RAISE EXCEPTION 'queue table % has no column "run_at" for run_at %', queue, enqueue_many.run_at
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF enqueue_many.priority <> 0 AND NOT has_priority THEN
        RAISE EXCEPTION 'queue table % has no column "priority" for priority %', queue, enqueue_many.priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(keys) = 0 THEN
        RETURN '{}'::bigint[];
    END IF;
    EXECUTE format('WITH ins AS (INSERT INTO %s (key, payload%s%s) '
                   'SELECT k.key, k.payload%s%s FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) WITH ORDINALITY AS k(key, payload, ord) '
                   'ORDER BY k.ord RETURNING id) '
                   'SELECT pg_catalog.array_agg(ins.id ORDER BY ins.id) FROM ins',
                   queue,
                   CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', run_at' ELSE '' END,
                   CASE WHEN has_priority THEN ', priority' ELSE '' END,
                   CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', $3' ELSE '' END,
                   CASE WHEN has_priority THEN ', $4' ELSE '' END)
        INTO ids USING keys, payloads, enqueue_many.run_at, enqueue_many.priority;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION sharding.enqueue_many(regclass, text[], jsonb[], timestamptz, smallint) IS
    'inserts one pending job per key (payloads[i], run_at, priority) in one statement; returns their ids in order';

-- set_backoff: a retried job (fail with retry) is not claimed again before
-- now() + base * 2^(attempts - 1), capped at max. Not STRICT: a NULL base
-- removes the backoff (a retried job then keeps its run_at).
CREATE FUNCTION sharding.set_backoff(queue regclass, base interval, max interval) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
    relowner oid;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT n.nspname, c.relname, c.relowner INTO nsp, rel, relowner
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = queue;
    IF NOT pg_has_role(relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of queue table %', queue USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF base IS NULL THEN
        UPDATE sharding.queue_settings s SET backoff_base = NULL, backoff_max = NULL
         WHERE s.schema_name = nsp AND s.table_name = rel;
        DELETE FROM sharding.queue_settings s
         WHERE s.schema_name = nsp AND s.table_name = rel AND s.backoff_base IS NULL AND s.max_attempts IS NULL;
        RETURN;
    END IF;
    IF base <= interval '0' THEN
        RAISE EXCEPTION 'backoff base must be positive, got %', base USING ERRCODE = 'invalid_parameter_value';
    ELSIF max IS NULL THEN
        RAISE EXCEPTION 'backoff max must not be null (with base %)', base USING ERRCODE = 'invalid_parameter_value';
    ELSIF max < base THEN
        RAISE EXCEPTION 'backoff max must be at least base %, got %', base, max
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a
                    WHERE a.attrelid = queue AND a.attname = 'run_at' AND a.atttypid = 'timestamptz'::regtype
                      AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'queue table % has no timestamptz column "run_at" to delay retries by', queue
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'ALTER TABLE ... ADD COLUMN run_at timestamptz NOT NULL DEFAULT now()';
    END IF;
    INSERT INTO sharding.queue_settings AS s (schema_name, table_name, backoff_base, backoff_max)
    VALUES (nsp, rel, base, max)
    ON CONFLICT (schema_name, table_name)
    DO UPDATE SET backoff_base = EXCLUDED.backoff_base, backoff_max = EXCLUDED.backoff_max;
END
$$;
COMMENT ON FUNCTION sharding.set_backoff(regclass, interval, interval) IS
    'retried jobs wait base * 2^(attempts - 1), at most max, before they are claimed again (NULL base: no backoff)';

-- purge: deletes up to batch done rows finished (claim_expires, which
-- complete sets to the time it ran) more than older_than ago, skipping rows
-- other transactions hold. Not STRICT: NULL arguments raise 22023.
CREATE FUNCTION sharding.purge(queue regclass, older_than interval DEFAULT '1 day', batch integer DEFAULT 10000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n bigint;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must not be null or negative, got %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be at least 1, got %', coalesce(batch::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._queue_sql(queue, 'complete');  -- checks it is a queue table (22023) and UPDATE rights
    EXECUTE format('WITH gone AS (DELETE FROM %1$s AS q WHERE q.id = ANY (ARRAY('
                   'SELECT d.id FROM %1$s AS d WHERE d.status = %2$L AND d.claim_expires < now() - $1 '
                   'LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING 1) SELECT count(*) FROM gone', queue, 'done')
        INTO n USING older_than, batch;
    RETURN n;
END
$$;
COMMENT ON FUNCTION sharding.purge(regclass, interval, integer) IS
    'deletes up to batch done jobs finished more than older_than ago; returns how many';

-- queue_health: counts from the partial indexes create_queue makes (the
-- function disables sequential scans for its own queries, so done rows are
-- never read), table statistics, and what holds the xmin horizon back.
-- STRICT: NULL queue, NULL result. STABLE: it only reads.
CREATE FUNCTION sharding.queue_health(queue regclass,
    OUT pending bigint, OUT processing bigint, OUT expired bigint, OUT oldest_pending_age interval,
    OUT dead_tuples bigint, OUT xmin_horizon_age interval, OUT horizon_holder text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    SET enable_seqscan = off
    AS $$
BEGIN
    PERFORM sharding._queue_health_check(queue);
    EXECUTE format('SELECT count(*), now() - min(created) FROM %s WHERE status = %L', queue, 'pending')
        INTO pending, oldest_pending_age;
    EXECUTE format('SELECT count(*), count(*) FILTER (WHERE claim_expires < now()) FROM %s WHERE status = %L',
                   queue, 'processing')
        INTO processing, expired;
    dead_tuples := pg_stat_get_dead_tuples(queue);
    -- What holds the horizon back for this table: transactions of this
    -- database (and walsenders, whose feedback holds every database),
    -- prepared transactions of this database, replication slots' xmin.
    -- The oldest by transaction age wins. This session is left out.
    SELECT h.age, h.holder INTO xmin_horizon_age, horizon_holder
      FROM (SELECT greatest(age(a.backend_xmin), age(a.backend_xid)) AS xid_age,
                   now() - coalesce(a.xact_start, a.backend_start) AS age,
                   format('backend pid %s (application_name %s, %s)', a.pid,
                          quote_literal(coalesce(a.application_name, '')), coalesce(a.state, a.backend_type)) AS holder
              FROM pg_stat_activity a
             WHERE (a.datname = current_database() OR a.datid IS NULL OR a.datid = 0)
               AND a.pid <> pg_backend_pid()
               AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
            UNION ALL
            SELECT age(p.transaction), now() - p.prepared, format('prepared transaction %s', quote_literal(p.gid))
              FROM pg_prepared_xacts p
             WHERE p.database = current_database()
            UNION ALL
            SELECT age(s.xmin), NULL, format('replication slot %s', quote_literal(s.slot_name))
              FROM pg_replication_slots s
             WHERE s.xmin IS NOT NULL) AS h
     ORDER BY h.xid_age DESC NULLS LAST
     LIMIT 1;
END
$$;
COMMENT ON FUNCTION sharding.queue_health(regclass) IS
    'pending, processing and expired jobs (from the partial indexes), the oldest pending job''s age, dead tuples, and the age and holder of the xmin horizon';

-- Checks that queue_health's table is a queue (22023 naming it).
CREATE FUNCTION sharding._queue_health_check(queue regclass) RETURNS void
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    missing text;
BEGIN
    SELECT string_agg(format('%I %s', c.col, format_type(c.typ, NULL)), ', ') INTO missing
      FROM (VALUES ('status', 'text'::regtype), ('created', 'timestamptz'::regtype),
                   ('claim_expires', 'timestamptz'::regtype)) AS c(col, typ)
     WHERE NOT EXISTS (SELECT FROM pg_attribute a
                        WHERE a.attrelid = queue AND a.attname = c.col AND a.atttypid = c.typ
                          AND NOT a.attisdropped);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'queue table % lacks column(s) %', queue, missing USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
COMMENT ON FUNCTION sharding._queue_health_check(regclass) IS
    'internal: raises 22023 unless the table has the columns queue_health reads';

-- Wakeups: the statement trigger create_queue puts on a queue. After an
-- INSERT (or COPY) that adds a claimable job (pending, and due where the
-- table has run_at), it sends NOTIFY on channel sharding_<table name> with
-- the first such job's key as payload, at most once per transaction and
-- channel (a transaction-local setting remembers it). Another queue table
-- gets the same with:
--   CREATE TRIGGER sharding_notify AFTER INSERT ON t REFERENCING NEW TABLE AS sharding_new
--       FOR EACH STATEMENT EXECUTE FUNCTION sharding._queue_notify();
CREATE FUNCTION sharding._queue_notify() RETURNS trigger
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    channel text := left('sharding_' || TG_TABLE_NAME, 63);
    flag text := 'sharding_queue.notified_' || md5(left('sharding_' || TG_TABLE_NAME, 63));
    job jsonb;
BEGIN
    IF current_setting(flag, true) = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT to_jsonb(n) INTO job
      FROM sharding_new AS n
     WHERE (to_jsonb(n) ->> 'status') = 'pending'
       AND (NOT (to_jsonb(n) ? 'run_at') OR (to_jsonb(n) ->> 'run_at')::timestamptz <= now())
     LIMIT 1;
    IF job IS NOT NULL THEN
        PERFORM pg_notify(channel, coalesce(job ->> 'key', ''));
        PERFORM set_config(flag, 'on', true);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sharding._queue_notify() IS
    'internal: statement trigger of queue tables; NOTIFY sharding_<table> (payload: a new claimable job''s key), once per transaction';
-- Section 11: counting what the seeds say to count: fan-out statements, the
-- worst shard's lag, rebalancing by measured load.

-- Fan-out counters (src/fanout.cpp). They live in shared memory, which only
-- a library in shared_preload_libraries gets; without it the view is empty
-- and says so in a NOTICE.

-- Internal: this database's counters, plus a row with relid 0 whose since is
-- the last fanout_reset() here (or the server's start). VOLATILE: counters
-- move under any snapshot. PARALLEL RESTRICTED: the counters are read in the
-- leader. Not STRICT: no argument.
CREATE FUNCTION sharding._fanout_counts(OUT relid oid, OUT single_shard bigint, OUT fan_out bigint,
                                        OUT since timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'sharding__fanout_counts' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION sharding._fanout_counts() IS
    'internal: fan-out counters of this database from shared memory (NOTICE and no row without preload)';

CREATE VIEW sharding.fanout_stats AS
    WITH c AS MATERIALIZED (SELECT * FROM sharding._fanout_counts())
    SELECT d.schema_name, d.table_name,
           (COALESCE(t.single_shard, 0) OPERATOR(pg_catalog.+) COALESCE(t.fan_out, 0))::bigint AS queries,
           COALESCE(t.single_shard, 0)::bigint AS single_shard,
           COALESCE(t.fan_out, 0)::bigint AS fan_out,
           COALESCE(t.since, z.since) AS since
      FROM sharding.distributed_tables AS d
      JOIN c AS z ON z.relid OPERATOR(pg_catalog.=) 0::oid
      LEFT JOIN c AS t
        ON t.relid OPERATOR(pg_catalog.=)
           pg_catalog.to_regclass(pg_catalog.format('%I.%I', d.schema_name, d.table_name))::oid
     ORDER BY d.schema_name, d.table_name;
COMMENT ON VIEW sharding.fanout_stats IS
    'per distributed table: statements that touched it (queries), those fixed to one logical shard by their key conditions (single_shard), the others (fan_out), counted since; needs shared_preload_libraries = ''sharding''';
GRANT SELECT ON sharding.fanout_stats TO PUBLIC;

-- fanout_reset(): zeroes this database's counters. VOLATILE, PARALLEL
-- UNSAFE: it writes shared state. Everyone's picture changes, so it is an
-- admin function, as pg_stat_statements_reset is.
CREATE FUNCTION sharding.fanout_reset() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding_fanout_reset' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fanout_reset() IS
    'zeroes the fan-out counters of this database; fanout_stats.since becomes now';
REVOKE ALL ON FUNCTION sharding.fanout_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.fanout_reset() TO sharding_admin;

-- Every change to sharding.distributed_tables (distribute, undistribute, a
-- direct write, a restore, logical replication to a follower) makes every
-- backend re-read it before counting. Row triggers, enabled ALWAYS: the
-- apply worker of a follower fires only those.
CREATE FUNCTION sharding._fanout_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__fanout_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._fanout_changed() IS
    'internal: makes every backend re-read the distributed tables it counts';
CREATE TRIGGER fanout_changed AFTER INSERT OR UPDATE OR DELETE ON sharding.distributed_tables
    FOR EACH ROW EXECUTE FUNCTION sharding._fanout_changed();
CREATE TRIGGER fanout_truncated AFTER TRUNCATE ON sharding.distributed_tables
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._fanout_changed();
ALTER TABLE sharding.distributed_tables ENABLE ALWAYS TRIGGER fanout_changed;
ALTER TABLE sharding.distributed_tables ENABLE ALWAYS TRIGGER fanout_truncated;

-- shard_lag(queue, shards, key_column): per shard 0..shards-1, the claimable
-- jobs (pending and due, or processing under a lapsed lease) and how long
-- the oldest of them has waited: since it was created, or since its run_at
-- when that is later (a job scheduled for later was not waiting before). One
-- scan, one aggregate grouped by shard_of(key, shards). NULL age: nothing to
-- claim on that shard. bar draws the age relative to the worst shard.
-- STABLE (reads), STRICT (NULL queue or count: no rows), PARALLEL RESTRICTED
-- (the queue may be a temporary table).
CREATE FUNCTION sharding.shard_lag(queue regclass, shards integer, key_column name DEFAULT 'key')
    RETURNS TABLE (shard integer, pending bigint, oldest_pending_age interval, bar text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL RESTRICTED
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    col text;
    has_run_at boolean;
    due text := '';
    since text := 't.created';
BEGIN
    IF shards < 1 THEN
        RAISE EXCEPTION 'shard count must be between 1 and 2147483647, got %', shards
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH col IN ARRAY ARRAY['status', 'created', 'claim_expires'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid = queue AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped) THEN
            RAISE EXCEPTION 'table % has no column "%", so it is not a queue', queue, col
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A queue has id, status, owner, claim_expires and created (sharding.create_queue makes one).';
        END IF;
    END LOOP;
    PERFORM sharding._key_column_type(queue, key_column);
    has_run_at := EXISTS (SELECT FROM pg_catalog.pg_attribute a
                           WHERE a.attrelid = queue AND a.attname = 'run_at' AND a.attnum > 0
                             AND NOT a.attisdropped);
    IF has_run_at THEN
        due := ' AND (t.run_at IS NULL OR t.run_at <= pg_catalog.now())';
        since := 'GREATEST(t.created, t.run_at)';  -- NULL run_at: created
    END IF;
    RETURN QUERY EXECUTE format(
        $q$SELECT g.shard::integer, COALESCE(k.n, 0)::bigint, k.age,
                  sharding.bar(COALESCE(EXTRACT(epoch FROM k.age), 0)::float8,
                               max(EXTRACT(epoch FROM k.age)) OVER ()::float8, 40)
             FROM pg_catalog.generate_series(0, $1 - 1) AS g(shard)
             LEFT JOIN (SELECT sharding.shard_of(t.%1$I, $1) AS shard, pg_catalog.count(*) AS n,
                               pg_catalog.now() - min(%3$s) AS age
                          FROM %2$s AS t
                         WHERE t.%1$I IS NOT NULL
                           AND ((t.status = 'pending'%4$s)
                                OR (t.status = 'processing' AND t.claim_expires < pg_catalog.now()))
                         GROUP BY 1) AS k ON k.shard = g.shard
            ORDER BY g.shard$q$,
        key_column, queue, since, due)
    USING shards;
END
$$;
COMMENT ON FUNCTION sharding.shard_lag(regclass, integer, name) IS
    'per shard of a queue: claimable jobs and the wait of the oldest, with a bar; look at the worst shard, not the average';

-- rebalance_by_load(map, nodes, loads, max_imbalance, dry_run): moves shards
-- so that only `nodes` own them and the largest node load is at most
-- max_imbalance x the mean (or as low as the shards allow), with as few
-- moves as the planner (src/rebalance.cpp) finds. Not STRICT: NULL
-- arguments raise 22023. Locks the map as rebalance does.
CREATE FUNCTION sharding.rebalance_by_load(map text, nodes text[], loads float8[],
                                           max_imbalance float8 DEFAULT 1.10, dry_run boolean DEFAULT false)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    owners text[];
    bad integer;
    mv record;
    moved integer := 0;
BEGIN
    PERFORM sharding._check_nodes(nodes);
    IF dry_run IS NULL THEN
        RAISE EXCEPTION 'dry_run must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_imbalance IS NULL OR NOT (max_imbalance >= 1) OR max_imbalance = 'Infinity'::float8 THEN
        RAISE EXCEPTION 'max_imbalance must be a finite number of at least 1, got %',
            coalesce(max_imbalance::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It bounds the largest node load divided by the mean node load, which is never below 1.';
    END IF;
    l := sharding._require_map($1, false);
    IF loads IS NULL THEN
        RAISE EXCEPTION 'loads must list one load per logical shard of map "%", got NULL', $1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_ndims(loads) IS DISTINCT FROM 1 OR pg_catalog.cardinality(loads) <> l THEN
        RAISE EXCEPTION 'loads must list one load per logical shard of map "%" (%), got % entries',
            $1, l, pg_catalog.cardinality(loads)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'loads[i + 1] is the load of logical shard i.';
    END IF;
    SELECT u.i INTO bad FROM pg_catalog.unnest(loads) WITH ORDINALITY AS u(v, i)
     WHERE u.v IS NULL OR NOT (u.v >= 0) OR u.v = 'Infinity'::float8 ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'load of logical shard % must be a finite number >= 0, got %',
            bad - 1, coalesce(loads[bad + pg_catalog.array_lower(loads, 1) - 1]::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'loads[i + 1] is the load of logical shard i.';
    END IF;
    PERFORM sharding._check_database_nodes($1, nodes);
    IF NOT dry_run THEN
        -- One map-wide lock: waits for fenced writers, keeps new ones out.
        PERFORM sharding._lock_map($1);
        PERFORM sharding._require_map($1, true);
        INSERT INTO sharding.nodes (node) SELECT n FROM pg_catalog.unnest(nodes) AS n
            ON CONFLICT DO NOTHING;
    END IF;
    SELECT pg_catalog.array_agg(s.node ORDER BY s.logical) INTO owners
      FROM sharding.shards s WHERE s.map = $1;
    FOR mv IN SELECT * FROM sharding._rebalance_by_load_plan(owners, nodes, loads, max_imbalance) LOOP
        IF NOT dry_run THEN
            UPDATE sharding.shards s SET node = mv.to_node, epoch = s.epoch + 1
             WHERE s.map = $1 AND s.logical = mv.logical;
        END IF;
        moved := moved + 1;
        logical := mv.logical;
        from_node := mv.from_node;
        to_node := mv.to_node;
        RETURN NEXT;
    END LOOP;
    IF NOT dry_run AND moved > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
END $$;
COMMENT ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) IS
    'moves shards so the largest node load is at most max_imbalance x the mean (or as low as shards allow), fewest moves; each raises the shard''s epoch; dry_run only reports';

CREATE FUNCTION sharding._rebalance_by_load_plan(owners text[], nodes text[], loads float8[],
                                                 max_imbalance float8)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', 'sharding__rebalance_by_load_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._rebalance_by_load_plan(text[], text[], float8[], float8) IS
    'internal: the load-aware plan (src/rebalance.cpp), ordered by logical shard';

-- Changing maps: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) TO sharding_admin;
-- Section 12: identities that cannot drift. A pin is stored by the key's
-- canonical text form, and node_for on a typed key matches pins on that
-- form (src/maps.cpp key_text). Pinning through the text overload asks the
-- caller to produce exactly that form ('42', a lower-case uuid, '\x' and
-- lower-case hex for bytea whatever bytea_output says); the typed overloads
-- below produce it themselves, so that a typed pin always matches node_for
-- on the same typed key. An untyped literal still resolves to the text
-- overload (text is the preferred type of its category), as for shard_of.
--
-- SQL functions delegating to pin(map, text, node) and unpin(map, text):
-- the checks (NULL key 22023, unknown map 42704, database maps refusing a
-- node without DSN 55000, followers refusing changes) live there once. Not
-- STRICT: a NULL key must raise 22023 as the text form does.

CREATE FUNCTION sharding.pin(map text, key bytea, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, E'\\x' OPERATOR(pg_catalog.||) pg_catalog.encode($2, 'hex'), $3) $$;
COMMENT ON FUNCTION sharding.pin(text, bytea, text) IS
    'pins a bytea key (stored as \x and lower-case hex, whatever bytea_output says) to a node';

CREATE FUNCTION sharding.pin(map text, key smallint, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, smallint, text) IS
    'pins a smallint key (stored as its decimal text, as node_for matches it) to a node';

CREATE FUNCTION sharding.pin(map text, key integer, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, integer, text) IS
    'pins an integer key (stored as its decimal text, as node_for matches it) to a node';

CREATE FUNCTION sharding.pin(map text, key bigint, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, bigint, text) IS
    'pins a bigint key (stored as its decimal text, as node_for matches it) to a node';

CREATE FUNCTION sharding.pin(map text, key uuid, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, uuid, text) IS
    'pins a uuid key (stored in lower case, as node_for matches it) to a node';

CREATE FUNCTION sharding.unpin(map text, key bytea) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, E'\\x' OPERATOR(pg_catalog.||) pg_catalog.encode($2, 'hex')) $$;
COMMENT ON FUNCTION sharding.unpin(text, bytea) IS
    'removes the pin of a bytea key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key smallint) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, smallint) IS
    'removes the pin of a smallint key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key integer) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, integer) IS
    'removes the pin of an integer key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key bigint) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, bigint) IS
    'removes the pin of a bigint key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key uuid) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, uuid) IS
    'removes the pin of a uuid key; true if there was one';

-- Changing pins is an administrator's job, whatever the key's type.
REVOKE ALL ON FUNCTION sharding.pin(text, bytea, text), sharding.pin(text, smallint, text),
    sharding.pin(text, integer, text), sharding.pin(text, bigint, text), sharding.pin(text, uuid, text),
    sharding.unpin(text, bytea), sharding.unpin(text, smallint), sharding.unpin(text, integer),
    sharding.unpin(text, bigint), sharding.unpin(text, uuid)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.pin(text, bytea, text), sharding.pin(text, smallint, text),
    sharding.pin(text, integer, text), sharding.pin(text, bigint, text), sharding.pin(text, uuid, text),
    sharding.unpin(text, bytea), sharding.unpin(text, smallint), sharding.unpin(text, integer),
    sharding.unpin(text, bigint), sharding.unpin(text, uuid)
    TO sharding_admin;
-- Section 8: followers, guarded data nodes, shard_checksum.
--
-- The coordinator publishes its configuration tables (publication
-- sharding_config); each attached data node subscribes to it (subscription
-- sharding_config_<node>), so it routes, fences and guards with the
-- coordinator's maps, shards and epochs, pins, nodes and distributed tables.
-- attach_node drives both ends from the coordinator through dblink, since
-- CREATE SUBSCRIPTION cannot run in a transaction block.
--
-- How the node reaches the coordinator: the setting sharding.coordinator_dsn
-- of the coordinator (ALTER DATABASE ... SET, or postgresql.conf) when it is
-- set, else a DSN derived from the connection attach_node runs in (the
-- server address it was reached on, or its first socket directory; its port,
-- database and user).
--
-- Local (not replicated) state of a database: sharding.local_node (its node
-- name, whether it follows) and sharding.frozen_shards (shards a move is
-- cutting over). The guard trigger (src/guard.cpp) reads both from a
-- per-backend copy.

CREATE TABLE sharding.local_node (
    one_row         boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    node            text NOT NULL CHECK (node <> ''),
    coordinator_dsn text NOT NULL,
    following       boolean NOT NULL,
    attached        timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE sharding.local_node IS
    'this database''s node name and coordinator, set by attach_node (local, not replicated)';

CREATE TABLE sharding.frozen_shards (
    map     text NOT NULL,
    logical integer NOT NULL,
    since   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (map, logical)
);
COMMENT ON TABLE sharding.frozen_shards IS
    'logical shards whose guarded writes this node refuses while a move cuts them over (local, not replicated)';

SELECT pg_catalog.pg_extension_config_dump('sharding.local_node', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.frozen_shards', '');
GRANT SELECT ON sharding.local_node, sharding.frozen_shards TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.local_node, sharding.frozen_shards TO sharding_admin;

-- this_node(): NULL where this database was never attached.
CREATE FUNCTION sharding.this_node() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT l.node FROM sharding.local_node AS l $$;
COMMENT ON FUNCTION sharding.this_node() IS
    'this database''s node name (set by attach_node on the coordinator), NULL where never attached';

-- Every backend's copy of the local state is rebuilt after a change.
CREATE FUNCTION sharding._local_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding_local_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._local_changed() IS
    'internal: invalidates every backend''s copy of local_node and frozen_shards';
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.local_node
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.frozen_shards
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
ALTER TABLE sharding.local_node ENABLE ALWAYS TRIGGER local_changed;
ALTER TABLE sharding.frozen_shards ENABLE ALWAYS TRIGGER local_changed;

-- ------------------------------------------------------------------ followers
-- A follower refuses configuration changes: a statement trigger on every
-- replicated config table, in ORIGIN mode, so that the subscription's apply
-- (session_replication_role = replica) still writes. detach_node lifts it.
CREATE FUNCTION sharding._refuse_on_follower() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    me text;
    coordinator text;
BEGIN
    SELECT l.node, l.coordinator_dsn INTO me, coordinator FROM sharding.local_node AS l WHERE l.following;
    IF FOUND THEN
        RAISE EXCEPTION 'cannot change the sharding configuration on node "%": it follows its coordinator', me
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('%s on %s.%s refused; this database copies its configuration from %s.',
                                  TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, coordinator),
                  HINT = format('Make the change on the coordinator, or run sharding.detach_node(%L) there first.', me);
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._refuse_on_follower() IS
    'internal: refuses (55000) configuration changes on a database that follows a coordinator';
CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.maps
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower();
CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.nodes
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower();
CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.shards
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower();
CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.pins
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower();
CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.map_versions
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower();
CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.distributed_tables
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower();

-- Apply (and the initial copy) run with session_replication_role = replica:
-- the routing-cache invalidations of 20_maps.sql must fire there too.
ALTER TABLE sharding.maps ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.shards ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.pins ENABLE ALWAYS TRIGGER routing_changed;
-- Apply fires row triggers only: these invalidate a follower's routing
-- caches for every replicated row (REPLICA: only under apply; the statement
-- triggers of 20_maps.sql cover every other writer).
CREATE TRIGGER routing_changed_apply AFTER INSERT OR UPDATE OR DELETE ON sharding.maps
    FOR EACH ROW EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_apply AFTER INSERT OR UPDATE OR DELETE ON sharding.shards
    FOR EACH ROW EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_apply AFTER INSERT OR UPDATE OR DELETE ON sharding.pins
    FOR EACH ROW EXECUTE FUNCTION sharding._routing_changed();
ALTER TABLE sharding.maps ENABLE REPLICA TRIGGER routing_changed_apply;
ALTER TABLE sharding.shards ENABLE REPLICA TRIGGER routing_changed_apply;
ALTER TABLE sharding.pins ENABLE REPLICA TRIGGER routing_changed_apply;

-- ------------------------------------------------------------------ guards
CREATE FUNCTION sharding._guard() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding_guard' LANGUAGE C;
COMMENT ON FUNCTION sharding._guard() IS
    'internal: refuses (55000) writes of keys this data node does not own, or of frozen shards (guarded writes)';

-- Installs (or refreshes) the guard trigger zz_sharding_guard on one
-- distributed table, if it exists here. The name sorts last, so the guard
-- sees the row as other BEFORE triggers leave it. Never raises: it runs
-- inside logical-replication apply, which an error would stop; a failure is
-- a WARNING and the table stays unguarded. Returns whether it is guarded.
CREATE FUNCTION sharding._install_guard(schema_name text, table_name text, key_column text, map text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    rel regclass := pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema_name, table_name));
BEGIN
    IF rel IS NULL THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_trigger t
                WHERE t.tgrelid = rel AND t.tgname = 'zz_sharding_guard' AND t.tgnargs = 2
                  AND pg_catalog.encode(t.tgargs, 'hex')
                      = pg_catalog.encode(pg_catalog.convert_to(map, pg_catalog.getdatabaseencoding()), 'hex') || '00'
                        || pg_catalog.encode(pg_catalog.convert_to(key_column, pg_catalog.getdatabaseencoding()), 'hex')
                        || '00') THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'zz_sharding_guard') THEN
        EXECUTE pg_catalog.format('DROP TRIGGER zz_sharding_guard ON %s', rel);
    END IF;
    EXECUTE pg_catalog.format('CREATE TRIGGER zz_sharding_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '
                              'FOR EACH ROW EXECUTE FUNCTION sharding._guard(%L, %L)', rel, map, key_column);
    RETURN true;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'could not guard distributed table %: %', rel, SQLERRM;
    RETURN false;
END $$;
COMMENT ON FUNCTION sharding._install_guard(text, text, text, text) IS
    'internal: creates the guard trigger on a distributed table of this data node';

CREATE FUNCTION sharding._drop_guard(schema_name text, table_name text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    rel regclass := pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema_name, table_name));
BEGIN
    IF rel IS NOT NULL
       AND EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'zz_sharding_guard') THEN
        EXECUTE pg_catalog.format('DROP TRIGGER zz_sharding_guard ON %s', rel);
    END IF;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'could not unguard table %: %', rel, SQLERRM;
END $$;
COMMENT ON FUNCTION sharding._drop_guard(text, text) IS
    'internal: drops the guard trigger of a table';

-- Guards every distributed table of a following node; returns how many.
CREATE FUNCTION sharding._install_guards() RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n integer := 0;
    d record;
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RETURN 0;
    END IF;
    FOR d IN SELECT * FROM sharding.distributed_tables ORDER BY schema_name, table_name LOOP
        IF sharding._install_guard(d.schema_name, d.table_name, d.key_column, d.map) THEN
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding._install_guards() IS
    'internal: guards every distributed table of this data node (when it follows)';

-- Follows sharding.distributed_tables on a data node: ALWAYS, so that rows
-- arriving through the subscription guard (or unguard) the local table.
CREATE FUNCTION sharding._distributed_changed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RETURN NULL;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        PERFORM sharding._drop_guard(OLD.schema_name, OLD.table_name);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM sharding._install_guard(NEW.schema_name, NEW.table_name, NEW.key_column, NEW.map);
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._distributed_changed() IS
    'internal: guards or unguards the local table when sharding.distributed_tables changes on a data node';
CREATE TRIGGER distributed_changed AFTER INSERT OR UPDATE OR DELETE ON sharding.distributed_tables
    FOR EACH ROW EXECUTE FUNCTION sharding._distributed_changed();
ALTER TABLE sharding.distributed_tables ENABLE ALWAYS TRIGGER distributed_changed;

-- A table created on a following data node after it was distributed gets
-- its guard at once (event trigger on CREATE TABLE).
CREATE FUNCTION sharding._guard_new_tables() RETURNS event_trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    d record;
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RETURN;
    END IF;
    FOR d IN SELECT t.* FROM pg_catalog.pg_event_trigger_ddl_commands() AS c
               JOIN pg_catalog.pg_class AS r ON r.oid = c.objid
               JOIN pg_catalog.pg_namespace AS s ON s.oid = r.relnamespace
               JOIN sharding.distributed_tables AS t ON t.schema_name = s.nspname AND t.table_name = r.relname
              WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.objsubid = 0 LOOP
        PERFORM sharding._install_guard(d.schema_name, d.table_name, d.key_column, d.map);
    END LOOP;
END $$;
COMMENT ON FUNCTION sharding._guard_new_tables() IS
    'internal: guards a distributed table created on a following data node';
CREATE EVENT TRIGGER sharding_guard_new_tables ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO')
    EXECUTE FUNCTION sharding._guard_new_tables();

-- ------------------------------------------------------------------ freeze
-- _freeze_shard(map, logical): waits for guarded and fenced writers of the
-- shard (the exclusive shard lock of move_shard), then records the shard as
-- frozen: from its commit on, every guarded write of the shard's keys on
-- this node gets 55000, until _thaw_shard. Run it in its own transaction
-- (through dblink from the coordinator): the lock is held until commit.
CREATE FUNCTION sharding._freeze_shard(map text, logical integer) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
BEGIN
    l := sharding._require_map($1);
    PERFORM sharding._check_logical($1, $2, l);
    PERFORM sharding._lock_shard($1, $2);
    INSERT INTO sharding.frozen_shards AS f (map, logical) VALUES ($1, $2) ON CONFLICT DO NOTHING;
END $$;
COMMENT ON FUNCTION sharding._freeze_shard(text, integer) IS
    'internal: waits for the shard''s writers, then refuses its guarded writes on this node until _thaw_shard';

CREATE FUNCTION sharding._thaw_shard(map text, logical integer) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    DELETE FROM sharding.frozen_shards AS f WHERE f.map = $1 AND f.logical = $2;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION sharding._thaw_shard(text, integer) IS
    'internal: lifts _freeze_shard; true if the shard was frozen';

-- ------------------------------------------------------------------ attach
-- The DSN a data node's subscription uses to reach this coordinator.
CREATE FUNCTION sharding._coordinator_dsn() RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    dsn text := pg_catalog.current_setting('sharding.coordinator_dsn', true);
    host text;
BEGIN
    IF dsn IS NOT NULL AND pg_catalog.btrim(dsn) <> '' THEN
        RETURN dsn;
    END IF;
    host := pg_catalog.host(pg_catalog.inet_server_addr());
    IF host IS NULL THEN
        host := pg_catalog.btrim(pg_catalog.split_part(pg_catalog.current_setting('unix_socket_directories'), ',', 1));
    END IF;
    IF host IS NULL OR host = '' THEN
        host := 'localhost';
    END IF;
    RETURN pg_catalog.format('host=%s port=%s dbname=%s user=%s',
                             pg_catalog.quote_literal(host), pg_catalog.current_setting('port'),
                             pg_catalog.quote_literal(pg_catalog.current_database()),
                             pg_catalog.quote_literal(current_user));
END $$;
COMMENT ON FUNCTION sharding._coordinator_dsn() IS
    'internal: sharding.coordinator_dsn, or a DSN of this database derived from the current connection';

-- The schema dblink is installed in (42883 if it is not).
CREATE FUNCTION sharding._dblink_schema(purpose text) RETURNS name
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    s name;
BEGIN
    SELECT e.extnamespace::pg_catalog.regnamespace::name INTO s
      FROM pg_catalog.pg_extension AS e WHERE e.extname = 'dblink';
    IF NOT FOUND THEN
        RAISE EXCEPTION '% needs extension "dblink"', purpose
            USING ERRCODE = 'undefined_function',
                  HINT = 'CREATE EXTENSION dblink on the coordinator.';
    END IF;
    RETURN s;
END $$;
COMMENT ON FUNCTION sharding._dblink_schema(text) IS 'internal: schema of extension dblink (42883 without it)';

-- Runs a query returning one text column on another database (its own
-- transaction, through dblink) and returns the first row's value.
CREATE FUNCTION sharding._remote(dsn text, query text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    r text;
BEGIN
    EXECUTE pg_catalog.format('SELECT f.r FROM %I.dblink($1, $2) AS f(r text) LIMIT 1',
                              sharding._dblink_schema('this operation'))
       INTO r USING dsn, query;
    RETURN r;
END $$;
COMMENT ON FUNCTION sharding._remote(text, text) IS
    'internal: first value of a one-column query run on another database through dblink';

-- Runs a command that returns no rows (CREATE SUBSCRIPTION, ...) there.
CREATE FUNCTION sharding._remote_exec(dsn text, command text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    r text;
BEGIN
    EXECUTE pg_catalog.format('SELECT %I.dblink_exec($1, $2)', sharding._dblink_schema('this operation'))
       INTO r USING dsn, command;
    RETURN r;
END $$;
COMMENT ON FUNCTION sharding._remote_exec(text, text) IS
    'internal: runs a command on another database through dblink';

-- Subscription and slot names of a node's configuration feed. Slot names
-- allow only [a-z0-9_]: other node names get a sanitised name plus a hash.
CREATE FUNCTION sharding._config_subscription(node text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT 'sharding_config_' || $1 $$;
COMMENT ON FUNCTION sharding._config_subscription(text) IS
    'internal: name of the subscription through which a node follows the coordinator';
CREATE FUNCTION sharding._config_slot(node text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $1 ~ '^[a-z0-9_]{1,40}$' THEN 'sharding_config_' || $1
                ELSE 'sharding_config_' || pg_catalog.left(pg_catalog.regexp_replace(pg_catalog.lower($1), '[^a-z0-9_]', '_', 'g'), 30)
                     || '_' || pg_catalog.left(pg_catalog.md5($1), 8) END
$$;
COMMENT ON FUNCTION sharding._config_slot(text) IS
    'internal: replication slot (on the coordinator) of a node''s configuration subscription';

-- On the coordinator, in its own transaction (attach_node calls it through
-- dblink, so that its writes are committed before the node subscribes):
-- the publication, and versions above those the node already reported, so
-- that cluster_version never falls on the node when it starts following.
CREATE FUNCTION sharding._publish_config(node_maps text[], node_versions bigint[]) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t text;
    top bigint;
    m text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication p WHERE p.pubname = 'sharding_config') THEN
        CREATE PUBLICATION sharding_config FOR TABLE sharding.maps, sharding.nodes, sharding.shards,
            sharding.pins, sharding.map_versions, sharding.distributed_tables;
    ELSE
        FOREACH t IN ARRAY ARRAY['maps', 'nodes', 'shards', 'pins', 'map_versions', 'distributed_tables'] LOOP
            IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication_tables p
                            WHERE p.pubname = 'sharding_config' AND p.schemaname = 'sharding' AND p.tablename = t) THEN
                EXECUTE pg_catalog.format('ALTER PUBLICATION sharding_config ADD TABLE sharding.%I', t);
            END IF;
        END LOOP;
    END IF;
    top := (SELECT pg_catalog.max(v) FROM pg_catalog.unnest(node_versions) AS v);
    IF top IS NOT NULL THEN
        IF (SELECT s.last_value FROM sharding.version_seq AS s) < top THEN
            PERFORM pg_catalog.setval('sharding.version_seq', top);
        END IF;
        FOR m IN SELECT u.map FROM ROWS FROM (pg_catalog.unnest(node_maps), pg_catalog.unnest(node_versions)) AS u(map, version)
                  WHERE u.version >= coalesce((SELECT v.version FROM sharding.map_versions AS v WHERE v.map = u.map), 0)
                  ORDER BY u.map LOOP
            PERFORM sharding._touch_map(m);
        END LOOP;
    END IF;
END $$;
COMMENT ON FUNCTION sharding._publish_config(text[], bigint[]) IS
    'internal: creates publication sharding_config and raises versions above a joining node''s';

-- On the node (through dblink): forget its own configuration and follow.
-- Returns false when it already follows as `node` (nothing to do).
CREATE FUNCTION sharding._follow(node text, coordinator_dsn text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    cur record;
    d record;
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL THEN
        RAISE EXCEPTION 'node name and coordinator DSN must not be NULL or empty, got %, %',
                coalesce(quote_literal($1), 'NULL'), coalesce(quote_literal($2), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO cur FROM sharding.local_node;
    IF FOUND AND cur.following THEN
        IF cur.node <> $1 THEN
            RAISE EXCEPTION 'this database already follows a coordinator as node "%", not "%"', cur.node, $1
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Detach it first (sharding.detach_node on its coordinator).';
        END IF;
        IF cur.coordinator_dsn IS DISTINCT FROM $2 THEN
            UPDATE sharding.local_node SET coordinator_dsn = $2;
        END IF;
        RETURN false;
    END IF;
    -- The coordinator's copy replaces ours: unguard, then empty.
    FOR d IN SELECT * FROM sharding.distributed_tables LOOP
        PERFORM sharding._drop_guard(d.schema_name, d.table_name);
    END LOOP;
    TRUNCATE sharding.distributed_tables, sharding.pins, sharding.shards, sharding.maps, sharding.nodes,
             sharding.map_versions;
    INSERT INTO sharding.local_node AS l (node, coordinator_dsn, following) VALUES ($1, $2, true)
        ON CONFLICT (one_row) DO UPDATE SET node = EXCLUDED.node, coordinator_dsn = EXCLUDED.coordinator_dsn,
                                            following = true, attached = pg_catalog.now();
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding._follow(text, text) IS
    'internal: makes this database a follower named node (its configuration is replaced by the coordinator''s)';

-- On the node (through dblink), after its subscription is gone.
CREATE FUNCTION sharding._unfollow() RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    d record;
    top bigint;
BEGIN
    UPDATE sharding.local_node SET following = false WHERE following;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    FOR d IN SELECT * FROM sharding.distributed_tables LOOP
        PERFORM sharding._drop_guard(d.schema_name, d.table_name);
    END LOOP;
    -- The copied versions came from the coordinator's sequence: ours must
    -- continue above them, so that cluster_version never falls here.
    top := (SELECT pg_catalog.max(v.version) FROM sharding.map_versions AS v);
    IF top IS NOT NULL AND (SELECT s.last_value FROM sharding.version_seq AS s) < top THEN
        PERFORM pg_catalog.setval('sharding.version_seq', top);
    END IF;
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding._unfollow() IS
    'internal: stops following (configuration editable again, guards removed, versions continue above the copy)';

-- attach_node(node text): see the top of this file. Not STRICT: NULL raises.
CREATE FUNCTION sharding.attach_node(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    dl name;
    dsn text;
    me text;
    sub text;
    slot text;
    facts record;
    node_maps text[];
    node_versions bigint[];
    pending integer;
    deadline timestamptz;
    sub_conninfo text;
    sub_enabled boolean;
BEGIN
    IF attach_node.node IS NULL OR attach_node.node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(attach_node.node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF current_setting('wal_level') <> 'logical' THEN
        RAISE EXCEPTION 'attach_node needs wal_level = logical on the coordinator, got %', current_setting('wal_level')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Set wal_level = logical (and max_replication_slots, max_wal_senders for one slot per node) '
                         'in postgresql.conf, then restart PostgreSQL.';
    END IF;
    IF EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RAISE EXCEPTION 'this database follows a coordinator: attach node "%" there', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    SELECT n.dsn INTO dsn FROM sharding.nodes AS n WHERE n.node = attach_node.node;
    IF dsn IS NULL THEN
        RAISE EXCEPTION 'node "%" has no connection string', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Call sharding.add_node(%L, ''<dsn>'') first.', attach_node.node);
    END IF;
    -- The node's CREATE SUBSCRIPTION makes a replication slot here, which
    -- waits for every transaction holding a transaction id to end.
    IF txid_current_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'attach_node must run in a transaction that has not written yet'
            USING ERRCODE = 'active_sql_transaction',
                  HINT = 'Call it in its own transaction.';
    END IF;
    dl := sharding._dblink_schema('attach_node');
    me := sharding._coordinator_dsn();
    sub := sharding._config_subscription(attach_node.node);
    slot := sharding._config_slot(attach_node.node);

    -- The node: this extension (1.2) there, not this very database, not
    -- following as another node. Nothing has changed anywhere yet.
    EXECUTE format($q$SELECT * FROM %I.dblink($1, $2)
                        AS f(sysid bigint, db text, has_follow boolean, following_as text)$q$, dl)
       INTO facts
      USING dsn, $r$SELECT (SELECT system_identifier FROM pg_catalog.pg_control_system())::bigint,
                           pg_catalog.current_database()::text,
                           pg_catalog.to_regprocedure('sharding._follow(text,text)') IS NOT NULL,
                           NULL::text$r$;
    IF NOT facts.has_follow THEN
        RAISE EXCEPTION 'node "%" has no sharding extension of version 1.2 or later', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'CREATE EXTENSION sharding (or ALTER EXTENSION sharding UPDATE) in the node''s database.';
    END IF;
    IF facts.sysid = (SELECT system_identifier FROM pg_catalog.pg_control_system())
       AND facts.db = current_database() THEN
        RAISE EXCEPTION 'node "%" is this database: a coordinator cannot follow itself', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Its connection string %s leads back here.', dsn);
    END IF;
    facts.following_as := sharding._remote(dsn, 'SELECT node FROM sharding.local_node WHERE following');
    IF facts.following_as IS DISTINCT FROM attach_node.node AND facts.following_as IS NOT NULL THEN
        RAISE EXCEPTION 'the database of node "%" already follows a coordinator as node "%"',
                attach_node.node, facts.following_as
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Detach it first: sharding.detach_node(%L) on its coordinator.', facts.following_as);
    END IF;
    EXECUTE format($q$SELECT array_agg(f.map), array_agg(f.version) FROM %I.dblink($1, $2) AS f(map text, version bigint)$q$, dl)
       INTO node_maps, node_versions
      USING dsn, 'SELECT map, version FROM sharding.map_versions';

    -- Coordinator side, committed before the node subscribes (a publication
    -- nobody subscribes to, and versions that rose, are harmless leftovers
    -- of a failure below).
    PERFORM sharding._remote(me, format('SELECT sharding._publish_config(%L, %L)::text', node_maps, node_versions));

    -- The subscription, disabled: creating it proves the node reaches us
    -- before its configuration is touched. Its slot is made from here first:
    -- a CREATE SUBSCRIPTION that creates its slot hangs when the node lives
    -- in this same PostgreSQL instance.
    EXECUTE format($q$SELECT f.c, f.e FROM %I.dblink($1, $2) AS f(c text, e boolean)$q$, dl)
       INTO sub_conninfo, sub_enabled
      USING dsn, format($s$SELECT subconninfo, subenabled FROM pg_catalog.pg_subscription
                            WHERE subname = %L AND subdbid = (SELECT oid FROM pg_catalog.pg_database
                                                               WHERE datname = pg_catalog.current_database())$s$, sub);
    IF sub_conninfo IS NULL THEN
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots AS r WHERE r.slot_name = slot) THEN
            PERFORM sharding._remote(me, format(
                $s$SELECT slot_name::text FROM pg_catalog.pg_create_logical_replication_slot(%L, 'pgoutput')$s$, slot));
        END IF;
        BEGIN
            PERFORM sharding._remote_exec(dsn, format(
                'CREATE SUBSCRIPTION %I CONNECTION %L PUBLICATION sharding_config '
                'WITH (slot_name = %L, create_slot = false, enabled = false)', sub, me, slot));
        EXCEPTION WHEN OTHERS THEN
            -- Leave no slot behind (it would hold WAL back forever).
            PERFORM sharding._remote(me, format(
                $s$SELECT 'dropped' FROM pg_catalog.pg_drop_replication_slot(%L)$s$, slot));
            RAISE;
        END;
        sub_enabled := false;
    ELSIF sub_conninfo IS DISTINCT FROM me THEN
        PERFORM sharding._remote_exec(dsn, format('ALTER SUBSCRIPTION %I CONNECTION %L', sub, me));
    END IF;

    -- The node's configuration gives way to ours, then the copy starts.
    BEGIN
        PERFORM sharding._remote(dsn, format('SELECT sharding._follow(%L, %L)::text', attach_node.node, me));
    EXCEPTION WHEN OTHERS THEN
        IF NOT sub_enabled THEN
            PERFORM sharding._remote_exec(dsn, format('DROP SUBSCRIPTION %I', sub));
        END IF;
        RAISE;
    END;
    IF NOT sub_enabled THEN
        PERFORM sharding._remote_exec(dsn, format('ALTER SUBSCRIPTION %I ENABLE', sub));
    END IF;

    -- The full copy: wait (up to a minute) until every table is synchronised.
    deadline := clock_timestamp() + interval '60 seconds';
    LOOP
        EXECUTE format($q$SELECT f.n FROM %I.dblink($1, $2) AS f(n integer)$q$, dl)
           INTO pending
          USING dsn, format($s$SELECT (6 - count(*) FILTER (WHERE r.srsubstate IN ('r', 's')))::integer
                                 FROM pg_catalog.pg_subscription AS s
                                 JOIN pg_catalog.pg_subscription_rel AS r ON r.srsubid = s.oid
                                WHERE s.subname = %L$s$, sub);
        EXIT WHEN pending <= 0;
        IF clock_timestamp() > deadline THEN
            RAISE WARNING 'node "%" is still copying the configuration (% tables to go)', attach_node.node, pending
                USING HINT = 'It follows once the copy ends; check pg_subscription_rel on the node.';
            EXIT;
        END IF;
        PERFORM pg_sleep(0.02);
    END LOOP;
    PERFORM sharding._remote(dsn, 'SELECT sharding._install_guards()::text');
END $$;
COMMENT ON FUNCTION sharding.attach_node(text) IS
    'makes a data node follow this coordinator''s configuration through logical replication (repeating is harmless)';

-- detach_node(node text): the node stops following and keeps its copy.
CREATE FUNCTION sharding.detach_node(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    dl name;
    dsn text;
    sub text;
    n integer;
BEGIN
    IF detach_node.node IS NULL OR detach_node.node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(detach_node.node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT x.dsn INTO dsn FROM sharding.nodes AS x WHERE x.node = detach_node.node;
    IF dsn IS NULL THEN
        RAISE EXCEPTION 'node "%" has no connection string', detach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Call sharding.add_node(%L, ''<dsn>'') first.', detach_node.node);
    END IF;
    dl := sharding._dblink_schema('detach_node');
    sub := sharding._config_subscription(detach_node.node);
    BEGIN
        EXECUTE format($q$SELECT f.n FROM %I.dblink($1, $2) AS f(n integer)$q$, dl)
           INTO n
          USING dsn, format($s$SELECT count(*)::integer FROM pg_catalog.pg_subscription
                                WHERE subname = %L AND subdbid = (SELECT oid FROM pg_catalog.pg_database
                                                                   WHERE datname = pg_catalog.current_database())$s$,
                            sub);
    EXCEPTION WHEN sqlclient_unable_to_establish_sqlconnection OR connection_exception THEN
        RAISE EXCEPTION 'cannot reach node "%" to detach it: %', detach_node.node, SQLERRM
            USING ERRCODE = 'sqlclient_unable_to_establish_sqlconnection',
                  HINT = format('If the node is gone for good, drop its replication slot here: '
                                'SELECT pg_drop_replication_slot(%L);', sharding._config_slot(detach_node.node));
    END;
    IF n > 0 THEN
        -- Drops the subscription's slot here too.
        PERFORM sharding._remote_exec(dsn, format('DROP SUBSCRIPTION %I', sub));
    END IF;
    PERFORM sharding._remote(dsn, 'SELECT sharding._unfollow()::text');
END $$;
COMMENT ON FUNCTION sharding.detach_node(text) IS
    'stops a data node following this coordinator; it keeps its copy of the configuration, editable again';

-- Administrators only: these change which databases follow, guard and
-- refuse writes.
REVOKE ALL ON FUNCTION sharding.attach_node(text), sharding.detach_node(text), sharding._freeze_shard(text, integer),
    sharding._thaw_shard(text, integer), sharding._follow(text, text), sharding._unfollow(),
    sharding._publish_config(text[], bigint[]), sharding._install_guards(),
    sharding._install_guard(text, text, text, text), sharding._drop_guard(text, text),
    sharding._remote(text, text), sharding._remote_exec(text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.attach_node(text), sharding.detach_node(text), sharding._freeze_shard(text, integer),
    sharding._thaw_shard(text, integer), sharding._follow(text, text), sharding._unfollow(),
    sharding._publish_config(text[], bigint[]), sharding._install_guards(),
    sharding._install_guard(text, text, text, text), sharding._drop_guard(text, text),
    sharding._remote(text, text), sharding._remote_exec(text, text)
    TO sharding_admin;

-- ------------------------------------------------------------------ checksum
-- shard_checksum(map, logical, tbl): rows and an order-independent checksum
-- of tbl's rows whose unpinned key lies in logical shard `logical`: the sum,
-- modulo 2^64, of hash64 of each row's text form. The settings that change
-- text forms are pinned, so the same rows give the same result on any node
-- of the same PostgreSQL major version.
CREATE FUNCTION sharding.shard_checksum(map text, logical integer, tbl regclass)
    RETURNS TABLE(rows bigint, checksum bigint)
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    SET datestyle = 'ISO, YMD'
    SET intervalstyle = 'postgres'
    SET timezone = 'UTC'
    SET extra_float_digits = 1
    SET bytea_output = 'hex'
    AS $$
#variable_conflict use_column
DECLARE
    l integer;
    col text;
    has_pins boolean;
    s numeric;
BEGIN
    IF map IS NULL OR logical IS NULL OR tbl IS NULL THEN
        RAISE EXCEPTION 'shard_checksum needs a map, a logical shard and a table, got %, %, %',
            coalesce(quote_literal(map), 'NULL'), coalesce(logical::text, 'NULL'), coalesce(tbl::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    l := sharding._require_map(map);
    PERFORM sharding._check_logical(map, logical, l);
    SELECT d.key_column INTO col
      FROM sharding.distributed_tables AS d
      JOIN pg_catalog.pg_class AS c ON c.relname = d.table_name
      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = d.schema_name
     WHERE c.oid = tbl;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % is not distributed', tbl
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Record its key column with sharding.distribute(tbl, key_column, map).';
    END IF;
    has_pins := EXISTS (SELECT FROM sharding.pins AS p WHERE p.map = shard_checksum.map);
    EXECUTE format('SELECT count(*), coalesce(sum(sharding.hash64(t::text)::numeric), 0) FROM %s AS t
                     WHERE sharding.logical_shard($1, t.%I) OPERATOR(pg_catalog.=) $2 %s',
                   tbl, col,
                   CASE WHEN has_pins THEN format('AND NOT EXISTS (SELECT FROM sharding.pins AS p
                       WHERE p.map OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) t.%I::text)', col)
                   ELSE '' END)
       INTO rows, s
      USING map, logical;
    s := mod(s, 18446744073709551616);  -- takes the sign of the sum
    IF s < 0 THEN
        s := s + 18446744073709551616;
    END IF;
    IF s >= 9223372036854775808 THEN
        s := s - 18446744073709551616;
    END IF;
    checksum := s::bigint;
    RETURN NEXT;
END $$;
COMMENT ON FUNCTION sharding.shard_checksum(text, integer, regclass) IS
    'rows and order-independent checksum of a distributed table''s rows in one logical shard (unpinned keys)';
-- Section 8 (part): online moves. move_shard_online(map, logical, node) and
-- isolate(map, key, node) carry rows between data nodes on PostgreSQL's own
-- logical replication, driven from the coordinator over dblink (CREATE and
-- DROP SUBSCRIPTION cannot run in a transaction block, so every remote step
-- is its own autocommit statement on a separate connection).
--
-- How a move runs (named objects: see _move_name):
--   1. journal  a row in sharding.moves, committed at once through a
--               loopback connection, so that a later call knows what a
--               crashed or failed one left behind and undoes it;
--   2. source   CREATE PUBLICATION of the map's distributed tables, then a
--               logical replication slot (pgoutput): from here on every
--               committed change of those tables is kept for the move;
--   3. copy     the destination pulls the shard's rows from the source
--               (COPY FROM PROGRAM psql running COPY ... TO STDOUT there, or
--               INSERT ... SELECT FROM dblink where it has no psql),
--               filtered AT THE SOURCE by shard_of, so only the shard's rows
--               travel, under session_replication_role = replica (no
--               triggers fire, the guard neither);
--   4. filter   a BEFORE ROW trigger on each table at the destination,
--               ENABLE REPLICA so that it fires only for replication apply:
--               it drops changes of rows outside the moving shard (the
--               publication carries whole tables: PG 15 row filters cannot
--               call shard_of) and turns a replayed INSERT of a row the copy
--               already holds into an UPDATE;
--   5. stream   CREATE SUBSCRIPTION (copy_data = false, the slot of step 2):
--               it replays every change committed since the slot was made.
--               The copy's snapshot is newer than the slot, so some changes
--               are in both; each replayed change sets a whole row (or its
--               absence) by primary key, in commit order, so replaying them
--               over the copy ends in the source's state;
--   6. catch up until the slot's confirmed_flush_lsn reaches the source's
--               flushed WAL position quickly (the backlog is small);
--   7. cutover  _freeze_shard at the source (waits for its in-flight
--               writers, then its guard refuses the shard's keys), wait
--               until the destination confirmed the source's last WAL
--               position, switch the owner on the coordinator (move_shard:
--               epoch + 1; isolate: pin), wait until the source shows it
--               (it follows the coordinator), thaw it (it now refuses by
--               ownership), wait until the destination shows it;
--   8. clean    drop the subscription, the slot, the trigger and the
--               publication, then delete the shard's rows at the source.
-- The refusal window is step 7 only: a few round trips and the last
-- moments of replication lag, whatever the shard's size.
--
-- Failure or cancel before the switch: the EXCEPTION handler undoes steps
-- 2-7 (drops the subscription, slot, publication and trigger, deletes what
-- the copy put at the destination, thaws) and re-raises; the old owner never
-- stopped owning. After the switch: the handler finishes step 8. If the
-- handler itself cannot (a node is down, the coordinator crashed), the
-- journal row stays and the next call for that shard, with any node, does it
-- first.

-- The move journal: local to the coordinator (not followed), one row per
-- move in progress. A row left here means a move was interrupted; the next
-- move_shard_online or isolate on that shard cleans it up.
CREATE TABLE sharding.moves (
    map         text NOT NULL,
    logical     integer NOT NULL,
    key         text,               -- isolate: the key; NULL for a shard move
    source      text NOT NULL,
    destination text NOT NULL,
    state       text NOT NULL CHECK (state IN ('setup', 'copying', 'catchup', 'cutover', 'switched')),
    started     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (map, logical)
);
COMMENT ON TABLE sharding.moves IS
    'online moves in progress (or interrupted: the next move of the shard cleans them up)';
SELECT pg_catalog.pg_extension_config_dump('sharding.moves', '');
GRANT SELECT ON sharding.moves TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.moves TO sharding_admin;

-- _move_name(map, logical): the name of the publication, slot, subscription
-- and trigger of a move. Deterministic, so that a later call finds what a
-- crashed one left; slot names allow only [a-z0-9_], so other map names are
-- folded and told apart by a hash.
CREATE FUNCTION sharding._move_name(map text, logical integer) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT 'sharding_move_'
            || CASE WHEN $1 ~ '^[a-z0-9_]{1,24}$' THEN $1
                    ELSE pg_catalog.left(pg_catalog.regexp_replace(pg_catalog.lower($1), '[^a-z0-9_]', '_', 'g'), 16)
                         || '_' || pg_catalog.left(pg_catalog.md5($1), 8) END
            || '_' || $2::text
    $$;
COMMENT ON FUNCTION sharding._move_name(text, integer) IS
    'internal: name of the publication, slot, subscription and trigger of an online move';

-- _move_dblink_schema(): where contrib's dblink lives here; 55000 if nowhere.
CREATE FUNCTION sharding._move_dblink_schema() RETURNS name
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    s name;
BEGIN
    SELECT e.extnamespace::regnamespace::name INTO s FROM pg_catalog.pg_extension e WHERE e.extname = 'dblink';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'moving shards online needs extension "dblink" on the coordinator'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'CREATE EXTENSION dblink here and on every data node.';
    END IF;
    RETURN s;
END $$;
COMMENT ON FUNCTION sharding._move_dblink_schema() IS 'internal: schema of extension dblink (55000 if missing)';

-- Thin wrappers over dblink, which may live in any schema: every call is
-- qualified with it, SQL text travels as a parameter.
CREATE FUNCTION sharding._dbl_connect(conn text, dsn text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    s name := sharding._move_dblink_schema();
    open text[];
BEGIN
    EXECUTE pg_catalog.format('SELECT %I.dblink_get_connections()', s) INTO open;
    IF conn = ANY (coalesce(open, '{}')) THEN
        EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', s) USING conn;
    END IF;
    EXECUTE pg_catalog.format('SELECT %I.dblink_connect($1, $2)', s) USING conn, dsn;
    -- Remote statements run with a predictable search_path (every name in
    -- them is qualified anyway), and commit synchronously: a commit whose
    -- WAL waited for the WAL writer (synchronous_commit = off, up to
    -- wal_writer_delay) would reach walsenders, and so the destination and
    -- the followers, that much later, inside the cutover's refusal window.
    EXECUTE pg_catalog.format('SELECT %I.dblink_exec($1, $2)', s)
        USING conn, 'SET search_path = pg_catalog, pg_temp';
    EXECUTE pg_catalog.format('SELECT %I.dblink_exec($1, $2)', s)
        USING conn, 'SET synchronous_commit = on';
END $$;

CREATE FUNCTION sharding._dbl_disconnect(conn text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    s name := sharding._move_dblink_schema();
    open text[];
    busy integer;
BEGIN
    EXECUTE pg_catalog.format('SELECT %I.dblink_get_connections()', s) INTO open;
    IF conn = ANY (coalesce(open, '{}')) THEN
        BEGIN
            -- A statement still running there (we were cancelled) is
            -- cancelled too, not left to finish.
            EXECUTE pg_catalog.format('SELECT %I.dblink_is_busy($1)', s) INTO busy USING conn;
            IF busy = 1 THEN
                EXECUTE pg_catalog.format('SELECT %I.dblink_cancel_query($1)', s) USING conn;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
        EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', s) USING conn;
    END IF;
END $$;

-- _dbl_value(conn, sql): the first column of the first row of a query, as text.
CREATE FUNCTION sharding._dbl_value(conn text, sql text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v text;
BEGIN
    EXECUTE pg_catalog.format('SELECT t.v FROM %I.dblink($1, $2) AS t(v text) LIMIT 1', sharding._move_dblink_schema())
        INTO v USING conn, sql;
    RETURN v;
END $$;

-- _dbl_run(conn, sql): runs a statement there and waits for it in
-- interruptible sleeps (PG 15's dblink_exec blocks in libpq, where a cancel
-- is not seen), so that a cancel or statement_timeout stops a long copy.
-- Returns the command tag of the last statement; a remote error is raised
-- here with its SQLSTATE.
CREATE FUNCTION sharding._dbl_run(conn text, sql text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    s name := sharding._move_dblink_schema();
    busy integer;
    tag text;
    last_tag text;
    sleep float8 := 0.0005;
BEGIN
    EXECUTE pg_catalog.format('SELECT %I.dblink_send_query($1, $2)', s) USING conn, sql;
    LOOP
        EXECUTE pg_catalog.format('SELECT %I.dblink_is_busy($1)', s) INTO busy USING conn;
        EXIT WHEN busy = 0;
        PERFORM pg_catalog.pg_sleep(sleep);
        sleep := LEAST(sleep * 2, 0.02);
    END LOOP;
    -- One result per statement, then an empty one.
    LOOP
        EXECUTE pg_catalog.format('SELECT pg_catalog.count(*), pg_catalog.max(t.v) FROM %I.dblink_get_result($1) AS t(v text)', s)
            INTO busy, tag USING conn;
        EXIT WHEN busy = 0;
        last_tag := tag;
    END LOOP;
    RETURN last_tag;
END $$;

REVOKE ALL ON FUNCTION sharding._move_dblink_schema(), sharding._dbl_connect(text, text),
    sharding._dbl_disconnect(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_dblink_schema(), sharding._dbl_connect(text, text),
    sharding._dbl_disconnect(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    TO sharding_admin;
COMMENT ON FUNCTION sharding._dbl_connect(text, text) IS 'internal: opens a named dblink connection (reopens a stale one)';
COMMENT ON FUNCTION sharding._dbl_disconnect(text) IS 'internal: cancels and closes a named dblink connection if open';
COMMENT ON FUNCTION sharding._dbl_value(text, text) IS 'internal: first value of a query over a named dblink connection';
COMMENT ON FUNCTION sharding._dbl_run(text, text) IS 'internal: runs SQL over a named dblink connection, interruptibly';

-- _move_key_in(row, ...): whether a row (as jsonb) belongs to what a move
-- carries: in shard mode, an unpinned key of logical shard `logical` of
-- `shards`; in key mode, exactly `key` (canonical text form).
CREATE FUNCTION sharding._move_key_in(r jsonb, key_column text, key_type text, shards integer,
                                      logical integer, map text, mode text, key text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    k text := r OPERATOR(pg_catalog.->>) key_column;
    s integer;
BEGIN
    IF k IS NULL THEN
        RETURN false;
    END IF;
    IF mode = 'key' THEN
        RETURN k = key;
    END IF;
    s := CASE key_type
             WHEN 'bytea' THEN sharding.shard_of(pg_catalog.decode(pg_catalog.substr(k, 3), 'hex'), shards)
             WHEN 'smallint' THEN sharding.shard_of(k::bigint, shards)
             WHEN 'integer' THEN sharding.shard_of(k::bigint, shards)
             WHEN 'bigint' THEN sharding.shard_of(k::bigint, shards)
             WHEN 'uuid' THEN sharding.shard_of(k::uuid, shards)
             ELSE sharding.shard_of(k, shards) END;
    RETURN s = logical
       AND NOT EXISTS (SELECT FROM sharding.pins p WHERE p.map = _move_key_in.map AND p.key = k);
END $$;
COMMENT ON FUNCTION sharding._move_key_in(jsonb, text, text, integer, integer, text, text, text) IS
    'internal: whether a row belongs to what an online move carries (its shard''s unpinned keys, or one key)';

-- The destination's filter during a move (step 4 above), ENABLE REPLICA:
-- it fires for replication apply only. Arguments: key column, key type,
-- shard count, logical shard, map, mode ('shard' or 'key'), key, and the
-- UPDATE statement that turns a replayed INSERT of a row already there into
-- an update of it.
CREATE FUNCTION sharding._move_filter() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n integer;
BEGIN
    -- Only replication apply is filtered; anything else passes untouched
    -- (the trigger is ENABLE REPLICA: this is a second line of defence).
    IF pg_catalog.current_setting('session_replication_role') <> 'replica' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NOT sharding._move_key_in(pg_catalog.to_jsonb(NEW), TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]::integer,
                                     TG_ARGV[3]::integer, TG_ARGV[4], TG_ARGV[5], TG_ARGV[6]) THEN
            RETURN NULL;
        END IF;
        EXECUTE TG_ARGV[7] USING NEW;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            RETURN NULL;
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        IF NOT sharding._move_key_in(pg_catalog.to_jsonb(OLD), TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]::integer,
                                     TG_ARGV[3]::integer, TG_ARGV[4], TG_ARGV[5], TG_ARGV[6]) THEN
            RETURN NULL;   -- a row of another shard that happens to share the primary key
        END IF;
        IF NOT sharding._move_key_in(pg_catalog.to_jsonb(NEW), TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]::integer,
                                     TG_ARGV[3]::integer, TG_ARGV[4], TG_ARGV[5], TG_ARGV[6]) THEN
            -- The key left the shard at the source: the row is no longer ours.
            EXECUTE TG_ARGV[8] USING OLD;
            RETURN NULL;
        END IF;
        RETURN NEW;
    ELSE
        IF NOT sharding._move_key_in(pg_catalog.to_jsonb(OLD), TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]::integer,
                                     TG_ARGV[3]::integer, TG_ARGV[4], TG_ARGV[5], TG_ARGV[6]) THEN
            RETURN NULL;
        END IF;
        RETURN OLD;
    END IF;
END $$;
COMMENT ON FUNCTION sharding._move_filter() IS
    'internal: replica-only trigger at a move''s destination: keeps the moving rows, upserts replayed inserts';

-- _move_tables(map): the map's distributed tables with what a move needs:
-- qualified name, key column and type, column lists, primary key.
CREATE FUNCTION sharding._move_tables(map text)
    RETURNS TABLE(rel text, key_column text, key_type regtype, cols text, coldefs text, vals text,
                  pk_match text)
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT pg_catalog.format('%I.%I', d.schema_name, d.table_name),
               d.key_column,
               (SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END::pg_catalog.regtype
                  FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
                 WHERE a.attrelid = c.oid AND a.attname = d.key_column),
               (SELECT pg_catalog.string_agg(pg_catalog.format('%I', a.attname), ', ' ORDER BY a.attnum)
                  FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
               (SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', a.attname,
                                                               pg_catalog.format_type(a.atttypid, a.atttypmod)),
                                             ', ' ORDER BY a.attnum)
                  FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
               (SELECT pg_catalog.string_agg(pg_catalog.format('($1).%I', a.attname), ', ' ORDER BY a.attnum)
                  FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
               (SELECT pg_catalog.string_agg(pg_catalog.format('t.%I OPERATOR(pg_catalog.=) ($1).%I',
                                                               a.attname, a.attname), ' AND ')
                  FROM pg_catalog.pg_index i
                  JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                 WHERE i.indrelid = c.oid AND i.indisprimary)
          FROM sharding.distributed_tables d
          JOIN pg_catalog.pg_namespace n ON n.nspname = d.schema_name
          JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = d.table_name
         WHERE d.map = $1
         ORDER BY d.schema_name, d.table_name
    $$;
COMMENT ON FUNCTION sharding._move_tables(text) IS
    'internal: the distributed tables of a map with the column lists an online move needs';

-- _shell_quote(v): a single-quoted POSIX shell word.
CREATE FUNCTION sharding._shell_quote(v text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT '''' OPERATOR(pg_catalog.||) pg_catalog.replace($1, '''', '''\''''') OPERATOR(pg_catalog.||) '''' $$;
COMMENT ON FUNCTION sharding._shell_quote(text) IS 'internal: quotes a word for the POSIX shell (COPY FROM PROGRAM)';

-- _move_filter_sql(rel_key_column, key_type, shards, logical, key, pins):
-- the WHERE condition selecting what a move carries, evaluated where the
-- rows are (source or destination): an unpinned key of the shard, or the
-- one key (compared in the column's type, so that an index can serve it).
CREATE FUNCTION sharding._move_filter_sql(key_column text, key_type regtype, shards integer, logical integer,
                                          key text, pins text[]) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT CASE WHEN $5 IS NOT NULL
                    THEN pg_catalog.format('%I OPERATOR(pg_catalog.=) %L::%s', $1, $5, $2::text)
                    ELSE pg_catalog.format('sharding.shard_of(%I, %s) OPERATOR(pg_catalog.=) %s', $1, $3, $4)
                         || CASE WHEN pg_catalog.cardinality($6) > 0
                                 THEN pg_catalog.format(' AND NOT (%s OPERATOR(pg_catalog.=) ANY (%L::text[]))',
                                                        sharding._key_text_sql(pg_catalog.format('%I', $1), $2), $6)
                                 ELSE '' END END
    $$;
COMMENT ON FUNCTION sharding._move_filter_sql(text, regtype, integer, integer, text, text[]) IS
    'internal: SQL condition selecting the rows an online move carries';

-- _move_drop_replication(name): drops the move's subscription at the
-- destination (connection sharding_move_dst) without contacting the source
-- (which may be down), then its slot and publication at the source
-- (connection sharding_move_src), waiting for the slot to be released.
CREATE FUNCTION sharding._move_drop_replication(name text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    active_pid text;
BEGIN
    IF sharding._dbl_value('sharding_move_dst',
           pg_catalog.format('SELECT count(*) FROM pg_catalog.pg_subscription WHERE subname = %L', name)) <> '0' THEN
        PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format('ALTER SUBSCRIPTION %I DISABLE', name));
        PERFORM sharding._dbl_run('sharding_move_dst',
                                  pg_catalog.format('ALTER SUBSCRIPTION %I SET (slot_name = NONE)', name));
        PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format('DROP SUBSCRIPTION %I', name));
    END IF;
    -- The source's walsender lets go of the slot once the apply worker has
    -- gone; give it a few seconds, then end it.
    FOR i IN 1 .. 200 LOOP
        active_pid := sharding._dbl_value('sharding_move_src', pg_catalog.format(
            'SELECT coalesce(active_pid::text, ''-'') FROM pg_catalog.pg_replication_slots WHERE slot_name = %L', name));
        EXIT WHEN active_pid IS NULL;
        IF active_pid = '-' THEN
            PERFORM sharding._dbl_run('sharding_move_src',
                                      pg_catalog.format('SELECT pg_catalog.pg_drop_replication_slot(%L)', name));
            EXIT;
        END IF;
        IF i > 100 THEN
            PERFORM sharding._dbl_run('sharding_move_src',
                                      pg_catalog.format('SELECT pg_catalog.pg_terminate_backend(%s)', active_pid));
        END IF;
        PERFORM pg_catalog.pg_sleep(0.02);
    END LOOP;
    PERFORM sharding._dbl_run('sharding_move_src', pg_catalog.format('DROP PUBLICATION IF EXISTS %I', name));
END $$;
COMMENT ON FUNCTION sharding._move_drop_replication(text) IS
    'internal: drops an online move''s subscription, slot and publication';

-- _move_drop_triggers(map, name): drops the move's filter trigger from the
-- map's tables at the destination.
CREATE FUNCTION sharding._move_drop_triggers(map text, name text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM sharding._move_tables(map) LOOP
        IF sharding._dbl_value('sharding_move_dst',
               pg_catalog.format('SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgname = %L AND tgrelid = pg_catalog.to_regclass(%L)',
                                 name, t.rel)) <> '0' THEN
            PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format('DROP TRIGGER %I ON %s', name, t.rel));
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION sharding._move_drop_triggers(text, text) IS
    'internal: drops an online move''s filter triggers at the destination';

-- _move_delete_rows(conn, map, logical, key): deletes what a move carries
-- from the map's tables over a connection (the source after a move, the
-- destination after a failed one), bypassing triggers and the guard (that
-- node does not own these rows); returns how many rows.
CREATE FUNCTION sharding._move_delete_rows(conn text, map text, logical integer, key text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t record;
    shards integer := sharding._require_map(map);
    pins text[];
    tag text;
    total bigint := 0;
BEGIN
    SELECT coalesce(pg_catalog.array_agg(p.key), '{}') INTO pins FROM sharding.pins p WHERE p.map = $2;
    PERFORM sharding._dbl_run(conn, 'SET session_replication_role = replica');
    FOR t IN SELECT * FROM sharding._move_tables(map) LOOP
        tag := sharding._dbl_run(conn, pg_catalog.format('DELETE FROM %s WHERE %s', t.rel,
                   sharding._move_filter_sql(t.key_column, t.key_type, shards, logical, key, pins)));
        total := total + pg_catalog.split_part(tag, ' ', 2)::bigint;
    END LOOP;
    PERFORM sharding._dbl_run(conn, 'SET session_replication_role = origin');
    RETURN total;
END $$;
COMMENT ON FUNCTION sharding._move_delete_rows(text, text, integer, text) IS
    'internal: deletes the rows an online move carries on one node (bypassing its guard)';

-- _move_call(conn, fn, map, logical): calls sharding.<fn>(map, logical)
-- there if the node has it (_freeze_shard/_thaw_shard exist where the
-- extension is 1.2).
CREATE FUNCTION sharding._move_call(conn text, fn text, map text, logical integer) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._dbl_run(conn, pg_catalog.format('SELECT sharding.%I(%L, %s)', fn, map, logical));
END $$;
COMMENT ON FUNCTION sharding._move_call(text, text, text, integer) IS
    'internal: calls sharding._freeze_shard or _thaw_shard on a node';

-- _move_sees_switch(conn, map, logical, key, node, epoch): whether that
-- node's (followed) configuration already shows the switch. A node that
-- does not follow this coordinator counts as seeing it: it has no guard
-- to consult its copy.
CREATE FUNCTION sharding._move_sees_switch(conn text, map text, logical integer, key text, node text,
                                           new_epoch bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF sharding._dbl_value(conn, 'SELECT sharding.this_node() IS NOT NULL') IS DISTINCT FROM 't' THEN
        RETURN true;
    END IF;
    IF key IS NOT NULL THEN
        RETURN sharding._dbl_value(conn, pg_catalog.format(
            'SELECT node FROM sharding.pins WHERE map = %L AND key = %L', map, key)) IS NOT DISTINCT FROM node;
    END IF;
    RETURN sharding._dbl_value(conn, pg_catalog.format(
        'SELECT node || ''/'' || epoch FROM sharding.shards WHERE map = %L AND logical = %s', map, logical))
        IS NOT DISTINCT FROM node || '/' || new_epoch;
END $$;
COMMENT ON FUNCTION sharding._move_sees_switch(text, text, integer, text, text, bigint) IS
    'internal: whether a node''s followed configuration shows an online move''s switch';

-- _move_finish(map, logical, key, destination, epoch): the end of a move
-- whose switch has committed (also run by the next call after a crash):
-- waits until the source and the destination show it, thaws, drops the
-- replication objects, deletes the moved rows at the source and closes the
-- journal. Connections sharding_move_src/_dst/_self are open. Returns the
-- rows deleted at the source.
CREATE FUNCTION sharding._move_finish(map text, logical integer, key text, destination text, new_epoch bigint)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    name text := sharding._move_name(map, logical);
    seen boolean;
    deleted bigint;
BEGIN
    -- The source's guard must see the new owner before its shard thaws
    -- (then it refuses by ownership); the destination accepts writes once it
    -- sees it, so the call returns only then.
    FOREACH name IN ARRAY ARRAY['sharding_move_src', 'sharding_move_dst'] LOOP
        seen := false;
        FOR i IN 1 .. 3000 LOOP   -- 60 s
            seen := sharding._move_sees_switch(name, map, logical, key, destination, new_epoch);
            EXIT WHEN seen;
            PERFORM pg_catalog.pg_sleep(0.005);
        END LOOP;
        IF NOT seen THEN
            RAISE EXCEPTION 'node % of the move of logical shard % of map "%" does not show the switch after 60 s',
                    CASE name WHEN 'sharding_move_src' THEN 'source' ELSE 'destination' END, logical, map
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'The coordinator has switched; the source stays frozen until it follows.',
                      HINT = 'Check the node''s subscription sharding_config_<node>, then call sharding.move_shard_online again to finish.';
        END IF;
        IF name = 'sharding_move_src' THEN
            PERFORM sharding._move_call('sharding_move_src', '_thaw_shard', map, logical);
            RAISE DEBUG 'move %: thawed at %', sharding._move_name(map, logical), pg_catalog.clock_timestamp();
        END IF;
    END LOOP;
    RAISE DEBUG 'move %: destination follows at %', sharding._move_name(map, logical), pg_catalog.clock_timestamp();
    name := sharding._move_name(map, logical);
    PERFORM sharding._move_drop_replication(name);
    PERFORM sharding._move_drop_triggers(map, name);
    RAISE DEBUG 'move %: replication dropped at %', name, pg_catalog.clock_timestamp();
    deleted := sharding._move_delete_rows('sharding_move_src', map, logical, key);
    PERFORM sharding._dbl_run('sharding_move_self', pg_catalog.format(
        'DELETE FROM sharding.moves WHERE map = %L AND logical = %s', map, logical));
    RETURN deleted;
END $$;
COMMENT ON FUNCTION sharding._move_finish(text, integer, text, text, bigint) IS
    'internal: completes an online move after its switch (thaw, drop replication, delete source rows)';

-- _move_undo(map, logical, key): undoes a move whose switch has not
-- committed: drops its replication objects and triggers, deletes what it
-- copied to the destination, thaws the source, closes the journal.
CREATE FUNCTION sharding._move_undo(map text, logical integer, key text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    name text := sharding._move_name(map, logical);
BEGIN
    PERFORM sharding._move_drop_replication(name);
    PERFORM sharding._move_drop_triggers(map, name);
    PERFORM sharding._move_delete_rows('sharding_move_dst', map, logical, key);
    PERFORM sharding._move_call('sharding_move_src', '_thaw_shard', map, logical);
    PERFORM sharding._dbl_run('sharding_move_self', pg_catalog.format(
        'DELETE FROM sharding.moves WHERE map = %L AND logical = %s', map, logical));
END $$;
COMMENT ON FUNCTION sharding._move_undo(text, integer, text) IS
    'internal: undoes an online move that has not switched (drops replication, deletes copies, thaws)';

-- _move_connect(source, destination): opens sharding_move_src, _dst and
-- _self; 55000 for a node without a connection string.
CREATE FUNCTION sharding._move_connect(source text, destination text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n text;
    d text;
BEGIN
    FOREACH n IN ARRAY ARRAY[destination, source] LOOP   -- the argument first
        SELECT x.dsn INTO d FROM sharding.nodes x WHERE x.node = n;
        IF d IS NULL THEN
            RAISE EXCEPTION 'node "%" has no connection string', n
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Moving a shard online connects to its source and its destination.',
                      HINT = pg_catalog.format('Call sharding.add_node(%L, ''<dsn>'') first.', n);
        END IF;
    END LOOP;
    PERFORM sharding._move_dblink_schema();
    PERFORM sharding._dbl_connect('sharding_move_self', sharding._coordinator_dsn());
    PERFORM sharding._dbl_connect('sharding_move_src', (SELECT x.dsn FROM sharding.nodes x WHERE x.node = source));
    PERFORM sharding._dbl_connect('sharding_move_dst', (SELECT x.dsn FROM sharding.nodes x WHERE x.node = destination));
END $$;
COMMENT ON FUNCTION sharding._move_connect(text, text) IS
    'internal: opens the dblink connections of an online move (55000 for a node without DSN)';

CREATE FUNCTION sharding._move_disconnect() RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._dbl_disconnect('sharding_move_src');
    PERFORM sharding._dbl_disconnect('sharding_move_dst');
    PERFORM sharding._dbl_disconnect('sharding_move_self');
END $$;
COMMENT ON FUNCTION sharding._move_disconnect() IS 'internal: closes the dblink connections of an online move';

-- _move_cleanup(map, logical): finishes or undoes what an interrupted move
-- of this shard left (its journal row says which), before a new call.
CREATE FUNCTION sharding._move_cleanup(map text, logical integer) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
    e bigint;
BEGIN
    SELECT * INTO j FROM sharding.moves m WHERE m.map = $1 AND m.logical = $2;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM sharding._move_connect(j.source, j.destination);
    IF j.state = 'switched' THEN
        SELECT s.epoch INTO e FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2;
        PERFORM sharding._move_finish(map, logical, j.key, j.destination, e);
    ELSE
        PERFORM sharding._move_undo(map, logical, j.key);
    END IF;
    PERFORM sharding._move_disconnect();
END $$;
COMMENT ON FUNCTION sharding._move_cleanup(text, integer) IS
    'internal: finishes or undoes an interrupted online move of a shard, as its journal row says';

-- _move_wait_flush(name, seconds): waits until the move's slot at the
-- source has confirmed the source's flushed WAL position; returns the
-- seconds waited. 55000 after `seconds` (the apply is stuck: see the
-- destination's log).
CREATE FUNCTION sharding._move_wait_flush(name text, seconds float8) RETURNS float8
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    -- The flushed position: walsenders send no further, and everything the
    -- move must carry is there once the freeze has committed (synchronously).
    target pg_lsn := sharding._dbl_value('sharding_move_src', 'SELECT pg_catalog.pg_current_wal_flush_lsn()')::pg_lsn;
    started timestamptz := pg_catalog.clock_timestamp();
    flushed pg_lsn;
    sleep float8 := 0.001;
BEGIN
    LOOP
        flushed := sharding._dbl_value('sharding_move_src', pg_catalog.format(
            'SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = %L', name))::pg_lsn;
        EXIT WHEN flushed >= target;
        IF pg_catalog.clock_timestamp() - started > pg_catalog.make_interval(secs => seconds) THEN
            RAISE EXCEPTION 'the destination of move % did not catch up with the source within % s', name, seconds
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = pg_catalog.format('Slot %s confirmed %s, the source is at %s.', name, flushed, target),
                      HINT = 'Look for logical replication apply errors in the destination''s log.';
        END IF;
        PERFORM pg_catalog.pg_sleep(sleep);
        sleep := LEAST(sleep * 2, 0.01);
    END LOOP;
    RETURN extract(epoch FROM pg_catalog.clock_timestamp() - started);
END $$;
COMMENT ON FUNCTION sharding._move_wait_flush(text, float8) IS
    'internal: waits until an online move''s destination has confirmed the source''s current WAL position';

-- _move_online(map, logical, key, node): the engine of move_shard_online
-- (key NULL) and isolate (key given, logical its shard). See the top of
-- this file. Returns the shard's epoch afterwards and the rows deleted at
-- the source.
CREATE FUNCTION sharding._move_online(map text, logical integer, key text, node text,
                                      OUT new_epoch bigint, OUT moved bigint)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    name text := sharding._move_name(map, logical);
    shards integer := sharding._require_map(map);
    source text;
    src_dsn text;
    dst_dblink text;
    pins text[];
    t record;
    tables text;
    step text := 'setup';
    filter text;
    waited float8;
    err_state text;
    err_msg text;
    err_detail text;
    err_hint text;
    err_context text;
    copied boolean;
    copy_program boolean := true;
    dst_encoding text;
BEGIN
    -- One move per shard at a time (a transaction-level lock: a crashed
    -- caller's lock goes with it, and its journal row tells the next call).
    IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('sharding.move_shard_online'),
                                                pg_catalog.hashtext(name)) THEN
        RAISE EXCEPTION 'logical shard % of map "%" is already being moved', logical, map
            USING ERRCODE = 'object_in_use';
    END IF;
    PERFORM sharding._move_cleanup(map, logical);

    IF key IS NULL THEN
        SELECT s.node, s.epoch INTO source, new_epoch FROM sharding.shards s
         WHERE s.map = _move_online.map AND s.logical = _move_online.logical;
    ELSE
        source := coalesce((SELECT p.node FROM sharding.pins p WHERE p.map = _move_online.map AND p.key = _move_online.key),
                           (SELECT s.node FROM sharding.shards s
                             WHERE s.map = _move_online.map AND s.logical = _move_online.logical));
        new_epoch := (SELECT s.epoch FROM sharding.shards s
                       WHERE s.map = _move_online.map AND s.logical = _move_online.logical);
    END IF;
    moved := 0;
    IF source = node THEN
        IF key IS NOT NULL THEN
            PERFORM sharding.pin(map, key, node);   -- isolate pins even where the rows already are
        END IF;
        RETURN;
    END IF;

    -- The source's slot waits for every transaction holding a transaction
    -- id to end, this one included when the source shares its instance.
    IF pg_catalog.txid_current_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'moving a shard online must run in a transaction that has not written yet'
            USING ERRCODE = 'active_sql_transaction',
                  HINT = 'Call it in its own transaction.';
    END IF;
    PERFORM sharding._move_connect(source, node);
    -- Prerequisites, before anything changes anywhere. Both ends follow this
    -- coordinator: their guards refuse the shard's keys wherever the
    -- followed map says they are not the owner, which makes the cutover hold
    -- for every writer.
    FOREACH filter IN ARRAY ARRAY[source, node] LOOP
        tables := CASE filter WHEN source THEN 'sharding_move_src' ELSE 'sharding_move_dst' END;
        IF sharding._dbl_value(tables, 'SELECT pg_catalog.to_regclass(''sharding.local_node'') IS NOT NULL') <> 't'
           OR sharding._dbl_value(tables, 'SELECT l.node FROM sharding.local_node AS l WHERE l.following')
              IS DISTINCT FROM filter THEN
            PERFORM sharding._move_disconnect();
            RAISE EXCEPTION 'node "%" does not follow this coordinator', filter
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Both ends of an online move must be attached: their guards enforce the cutover.',
                      HINT = pg_catalog.format('Call sharding.attach_node(%L) first.', filter);
        END IF;
    END LOOP;
    -- Guards on every distributed table at both ends, even one created
    -- while its distribute() was still on its way (idempotent).
    PERFORM sharding._dbl_run('sharding_move_src', 'SELECT sharding._install_guards()');
    PERFORM sharding._dbl_run('sharding_move_dst', 'SELECT sharding._install_guards()');
    tables := NULL;
    IF sharding._dbl_value('sharding_move_src', 'SHOW wal_level') IS DISTINCT FROM 'logical' THEN
        PERFORM sharding._move_disconnect();
        RAISE EXCEPTION 'wal_level of node "%" is not logical', source
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Moving a shard online replicates its rows from the source with logical replication.',
                  HINT = 'Set wal_level = logical on the source (postgresql.conf) and restart it.';
    END IF;
    dst_dblink := sharding._dbl_value('sharding_move_dst',
        'SELECT e.extnamespace::regnamespace::text FROM pg_catalog.pg_extension e WHERE e.extname = ''dblink''');
    IF dst_dblink IS NULL THEN
        PERFORM sharding._move_disconnect();
        RAISE EXCEPTION 'node "%" has no extension "dblink"', node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The destination pulls the shard''s rows from the source through dblink.',
                  HINT = 'CREATE EXTENSION dblink on the destination.';
    END IF;
    FOR t IN SELECT * FROM sharding._move_tables(map) LOOP
        IF sharding._dbl_value('sharding_move_src', pg_catalog.format('SELECT pg_catalog.to_regclass(%L) IS NOT NULL', t.rel)) <> 't'
           OR sharding._dbl_value('sharding_move_dst', pg_catalog.format('SELECT pg_catalog.to_regclass(%L) IS NOT NULL', t.rel)) <> 't' THEN
            PERFORM sharding._move_disconnect();
            RAISE EXCEPTION 'table % of map "%" is missing on node "%" or "%"', t.rel, map, source, node
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Create the map''s distributed tables on every data node.';
        END IF;
        tables := coalesce(tables || ', ', '') || t.rel;
    END LOOP;
    IF tables IS NULL THEN
        -- No distributed table: nothing to carry, the switch is the move.
        PERFORM sharding._move_disconnect();
        IF key IS NULL THEN
            new_epoch := sharding.move_shard(map, logical, node);
        ELSE
            PERFORM sharding.pin(map, key, node);
        END IF;
        RETURN;
    END IF;
    SELECT coalesce(pg_catalog.array_agg(p.key), '{}') INTO pins FROM sharding.pins p WHERE p.map = _move_online.map;
    SELECT n.dsn INTO src_dsn FROM sharding.nodes n WHERE n.node = source;

    PERFORM sharding._dbl_run('sharding_move_self', pg_catalog.format(
        'INSERT INTO sharding.moves (map, logical, key, source, destination, state) VALUES (%L, %s, %L, %L, %L, ''setup'')',
        map, logical, key, source, node));
    BEGIN
        RAISE DEBUG 'move %: publication and slot at %', name, pg_catalog.clock_timestamp();
        -- 2. Publication, then the slot: changes from here on are kept.
        PERFORM sharding._dbl_run('sharding_move_src', pg_catalog.format(
            'CREATE PUBLICATION %I FOR TABLE %s WITH (publish = ''insert, update, delete'')', name, tables));
        PERFORM sharding._dbl_run('sharding_move_src', pg_catalog.format(
            'SELECT pg_catalog.pg_create_logical_replication_slot(%L, ''pgoutput'')', name));

        -- 3. Copy, filtered at the source.
        step := 'copying';
        RAISE DEBUG 'move %: copying at %', name, pg_catalog.clock_timestamp();
        PERFORM sharding._dbl_run('sharding_move_self', pg_catalog.format(
            'UPDATE sharding.moves SET state = %L WHERE map = %L AND logical = %s', step, map, logical));
        PERFORM sharding._dbl_run('sharding_move_dst', 'SET session_replication_role = replica');
        dst_encoding := sharding._dbl_value('sharding_move_dst', 'SELECT pg_catalog.getdatabaseencoding()');
        FOR t IN SELECT * FROM sharding._move_tables(map) LOOP
            filter := sharding._move_filter_sql(t.key_column, t.key_type, shards, logical, key, pins);
            -- Leftovers of the shard at the destination (it does not own them).
            PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format('DELETE FROM %s WHERE %s', t.rel, filter));
            -- COPY from the source, as fast as `psql -c 'COPY ... TO STDOUT' |
            -- psql -c 'COPY ... FROM STDIN'` because it is that: the
            -- destination's server runs psql (COPY FROM PROGRAM: a
            -- superuser's, as the move's connections are). Where it has no
            -- psql, INSERT ... SELECT FROM dblink (slower: row by row).
            copied := false;
            IF copy_program THEN
                BEGIN
                    PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format(
                        'COPY %s (%s) FROM PROGRAM %L WITH (FORMAT text, ENCODING %L)', t.rel, t.cols,
                        pg_catalog.format('PGCLIENTENCODING=%s psql -XAtq -v ON_ERROR_STOP=1 -d %s -c %s', dst_encoding,
                                          sharding._shell_quote(src_dsn),
                                          sharding._shell_quote(pg_catalog.format('COPY (SELECT %s FROM %s WHERE %s) TO STDOUT',
                                                                                  t.cols, t.rel, filter))),
                        dst_encoding));
                    copied := true;
                EXCEPTION WHEN OTHERS THEN
                    GET STACKED DIAGNOSTICS err_msg = MESSAGE_TEXT;
                    RAISE DEBUG 'move %: COPY FROM PROGRAM failed (%), copying through dblink', name, err_msg;
                    copy_program := false;
                    PERFORM sharding._dbl_connect('sharding_move_dst', (SELECT n.dsn FROM sharding.nodes n WHERE n.node = _move_online.node));
                    PERFORM sharding._dbl_run('sharding_move_dst', 'SET session_replication_role = replica');
                END;
            END IF;
            IF NOT copied THEN
                PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format(
                    'INSERT INTO %s (%s) OVERRIDING SYSTEM VALUE SELECT %s FROM %I.dblink(%L, %L) AS s(%s)',
                    t.rel, t.cols, t.cols, dst_dblink, src_dsn,
                    pg_catalog.format('SELECT %s FROM %s WHERE %s', t.cols, t.rel, filter), t.coldefs));
            END IF;
        END LOOP;
        PERFORM sharding._dbl_run('sharding_move_dst', 'SET session_replication_role = origin');

        -- 4. The destination's filter, for replication apply only.
        -- Created and switched to ENABLE REPLICA in one transaction (one
        -- multi-statement command): other sessions never see it enabled
        -- for their own writes.
        FOR t IN SELECT * FROM sharding._move_tables(map) LOOP
            PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format(
                'CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW '
                'EXECUTE FUNCTION sharding._move_filter(%L, %L, %L, %L, %L, %L, %L, %L, %L); '
                'ALTER TABLE %s ENABLE REPLICA TRIGGER %I',
                name, t.rel, t.key_column, pg_catalog.format_type(t.key_type, NULL), shards, logical, map,
                CASE WHEN key IS NULL THEN 'shard' ELSE 'key' END, coalesce(key, ''),
                pg_catalog.format('UPDATE %s AS t SET (%s) = ROW(%s) WHERE %s', t.rel, t.cols, t.vals, t.pk_match),
                pg_catalog.format('DELETE FROM %s AS t WHERE %s', t.rel, t.pk_match),
                t.rel, name));
        END LOOP;

        -- 5. Stream from the slot made before the copy. synchronous_commit
        -- on: the apply worker confirms a position only once its commit is
        -- flushed here, so with 'off' (the default for subscriptions) each
        -- confirmation would wait for the WAL writer, inside the cutover.
        PERFORM sharding._dbl_run('sharding_move_dst', pg_catalog.format(
            'CREATE SUBSCRIPTION %I CONNECTION %L PUBLICATION %I '
            'WITH (create_slot = false, slot_name = %L, copy_data = false, synchronous_commit = ''on'')',
            name, src_dsn, name, name));

        -- 6. Catch up until a round is short: the backlog left for the
        -- frozen phase is then a fraction of a second of writes.
        step := 'catchup';
        RAISE DEBUG 'move %: catchup at %', name, pg_catalog.clock_timestamp();
        PERFORM sharding._dbl_run('sharding_move_self', pg_catalog.format(
            'UPDATE sharding.moves SET state = %L WHERE map = %L AND logical = %s', step, map, logical));
        FOR i IN 1 .. 100 LOOP
            waited := sharding._move_wait_flush(name, 600);
            EXIT WHEN waited < 0.2;
        END LOOP;

        -- 7. Cutover: freeze the source (waits for its in-flight writers),
        -- let the destination apply the source's last change, switch.
        step := 'cutover';
        RAISE DEBUG 'move %: cutover at %', name, pg_catalog.clock_timestamp();
        PERFORM sharding._dbl_run('sharding_move_self', pg_catalog.format(
            'UPDATE sharding.moves SET state = %L WHERE map = %L AND logical = %s', step, map, logical));
        PERFORM sharding._move_call('sharding_move_src', '_freeze_shard', map, logical);
        RAISE DEBUG 'move %: frozen at %', name, pg_catalog.clock_timestamp();
        PERFORM sharding._move_wait_flush(name, 60);
        RAISE DEBUG 'move %: caught up at %', name, pg_catalog.clock_timestamp();
        IF key IS NULL THEN
            new_epoch := sharding._dbl_value('sharding_move_self', pg_catalog.format(
                'WITH m AS (SELECT sharding.move_shard(%L, %s, %L) AS e), '
                'j AS (UPDATE sharding.moves SET state = ''switched'' WHERE map = %L AND logical = %s) SELECT e FROM m',
                map, logical, node, map, logical))::bigint;
        ELSE
            PERFORM sharding._dbl_value('sharding_move_self', pg_catalog.format(
                'WITH m AS (SELECT sharding.pin(%L, %L::text, %L)), '
                'j AS (UPDATE sharding.moves SET state = ''switched'' WHERE map = %L AND logical = %s) SELECT 1 FROM m',
                map, key, node, map, logical));
        END IF;
        step := 'switched';
        RAISE DEBUG 'move %: switched at %', name, pg_catalog.clock_timestamp();

        -- 8. Clean up after the switch.
        moved := sharding._move_finish(map, logical, key, node, new_epoch);
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_msg = MESSAGE_TEXT,
                                err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT, err_context = PG_EXCEPTION_CONTEXT;
        RAISE DEBUG 'move % failed at step %: % (%)', name, step, err_msg, err_context;
        IF step <> 'switched' THEN
            -- First of all the source writes again, even if the destination
            -- is out of reach for the rest of the undo.
            BEGIN
                PERFORM sharding._dbl_connect('sharding_move_src', src_dsn);
                PERFORM sharding._move_call('sharding_move_src', '_thaw_shard', map, logical);
            EXCEPTION WHEN OTHERS THEN
                NULL;
            END;
        END IF;
        BEGIN
            -- Connections may be in any state: start from fresh ones.
            PERFORM sharding._move_connect(source, node);
            IF step = 'switched' THEN
                PERFORM sharding._move_finish(map, logical, key, node, new_epoch);
            ELSE
                PERFORM sharding._move_undo(map, logical, key);
            END IF;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            RAISE WARNING 'could not clean up after the failed move of logical shard % of map "%": %',
                logical, map, SQLERRM
                USING HINT = 'The next sharding.move_shard_online or sharding.isolate of this shard cleans up first.';
        END;
        BEGIN
            PERFORM sharding._move_disconnect();
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
        IF step = 'switched' THEN
            -- The move itself happened; only its tidying failed.
            RAISE EXCEPTION 'logical shard % of map "%" moved to "%" (epoch %), but finishing failed: %',
                    logical, map, node, new_epoch, err_msg
                USING ERRCODE = err_state, HINT = 'Call sharding.move_shard_online again to finish.';
        END IF;
        -- Re-raise the original error as it was (an empty DETAIL or HINT
        -- would print as an empty line).
        IF coalesce(err_detail, '') = '' AND coalesce(err_hint, '') = '' THEN
            RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg;
        ELSIF coalesce(err_hint, '') = '' THEN
            RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg, DETAIL = err_detail;
        ELSIF coalesce(err_detail, '') = '' THEN
            RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg, HINT = err_hint;
        END IF;
        RAISE EXCEPTION USING ERRCODE = err_state, MESSAGE = err_msg, DETAIL = err_detail, HINT = err_hint;
    END;
    PERFORM sharding._move_disconnect();
END $$;
COMMENT ON FUNCTION sharding._move_online(text, integer, text, text) IS
    'internal: moves a logical shard (or one key) online; the engine of move_shard_online and isolate';

-- move_shard_online(map text, logical integer, node text): contract
-- section 8. Not STRICT: NULL arguments raise 22023.
CREATE FUNCTION sharding.move_shard_online(map text, logical integer, node text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
BEGIN
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    l := sharding._require_map(map);
    PERFORM sharding._check_logical(map, logical, l);
    RETURN (sharding._move_online(map, logical, NULL, node)).new_epoch;
END $$;
COMMENT ON FUNCTION sharding.move_shard_online(text, integer, text) IS
    'moves a logical shard with its rows to a node while writes go on (logical replication); returns its new epoch';

-- isolate(map text, key text, node text): contract section 8. Not STRICT.
CREATE FUNCTION sharding.isolate(map text, key text, node text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map(map);
    RETURN (sharding._move_online(map, sharding.logical_shard(map, key), key, node)).moved;
END $$;
COMMENT ON FUNCTION sharding.isolate(text, text, text) IS
    'pins a key to a node and moves its rows of every distributed table there online; returns rows moved';

-- Moving data between databases is an administrator's job.
REVOKE ALL ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text), sharding._move_cleanup(text, integer),
    sharding._move_finish(text, integer, text, text, bigint), sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_drop_replication(text),
    sharding._move_drop_triggers(text, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text), sharding._move_cleanup(text, integer),
    sharding._move_finish(text, integer, text, text, bigint), sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_drop_replication(text),
    sharding._move_drop_triggers(text, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    TO sharding_admin;
-- Section 9 (handoff): pin and unpin serialize with claim_node, fences and
-- moves. A pin re-routes its key at once, so, like move_shard, it must not
-- commit while a claim_node of the map is between reading the map and
-- claiming (the old node would claim the key's next job while the new node,
-- seeing no committed lease of the old one, claims another), nor while a
-- writer fenced on the key's shard is writing. pin and unpin (and the typed
-- overloads, which delegate to them) call _lock_pin before changing the pin:
-- _lock_shard on every logical shard the pinned text routes a key of: the
-- text key's own shard and, when the text is the canonical form of an
-- integer, a uuid or a bytea key (the form node_for matches a typed key's
-- pin on, section 12), that key's shard. _lock_shard takes the map-level
-- tag in RowExclusiveLock (conflicting with claim_node's ShareLock and with
-- rebalance) and the shard's tag in ExclusiveLock (conflicting with fence).
-- At most two shards, locked in ascending order, so two pins never deadlock
-- on each other. Needs the map to exist (logical_shard raises 42704).
CREATE FUNCTION sharding._lock_pin(map text, key text) RETURNS void
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    shards integer[] := ARRAY[sharding.logical_shard($1, $2)];
    s integer;
BEGIN
    -- Nested IFs: a cast must never see text its test did not accept.
    IF $2 ~ '^(0|-?[1-9][0-9]{0,18})$' THEN
        IF $2::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            shards := shards || sharding.logical_shard($1, $2::bigint);
        END IF;
    ELSIF $2 ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        shards := shards || sharding.logical_shard($1, $2::uuid);
    ELSIF pg_catalog.left($2, 2) = E'\\x' THEN
        IF pg_catalog.substr($2, 3) ~ '^([0-9a-f][0-9a-f])*$' THEN
            shards := shards || sharding.logical_shard($1, pg_catalog.decode(pg_catalog.substr($2, 3), 'hex'));
        END IF;
    END IF;
    FOR s IN SELECT DISTINCT u FROM pg_catalog.unnest(shards) AS u ORDER BY u LOOP
        PERFORM sharding._lock_shard($1, s);
    END LOOP;
END $$;
COMMENT ON FUNCTION sharding._lock_pin(text, text) IS
    'internal: for pin and unpin, _lock_shard on every logical shard the pinned key text routes (waits for claim_node, fences and moves)';
REVOKE ALL ON FUNCTION sharding._lock_pin(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._lock_pin(text, text) TO sharding_admin;
