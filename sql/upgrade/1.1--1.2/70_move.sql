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
