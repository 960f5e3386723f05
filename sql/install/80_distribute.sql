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
