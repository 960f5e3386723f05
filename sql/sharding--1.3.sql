\echo Use "CREATE EXTENSION sharding" to load this file. \quit

-- The role that may change maps, pins, nodes and rank guards besides the
-- extension's owner. Roles are cluster-wide, so another database may have
-- created it already, or be creating it right now: an install running at
-- the same time in another database may have made it without committing
-- yet, which our check cannot see. Our CREATE ROLE then waits for that
-- install and fails on pg_authid's unique index (23505) if it commits, or
-- finds the name taken (42710) if it committed before; either way the role
-- exists, which is all we need.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sharding_admin') THEN
        BEGIN
            CREATE ROLE sharding_admin NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA sharding TO PUBLIC;

-- Internal: proves the C/C++ boundary turns every C++ exception into an
-- ERROR (see src/pg/boundary.hpp). Not for users, hence revoked.
CREATE FUNCTION sharding._boundary_selftest(kind text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__boundary_selftest' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._boundary_selftest(text) IS
    'internal: exercises the C++/PostgreSQL error boundary (regression tests only)';
-- Internal test hook; nobody but the owner needs it.
REVOKE ALL ON FUNCTION sharding._boundary_selftest(text) FROM PUBLIC;
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

-- Internal: the one test of what a shard key may be, shared with the C++
-- code (src/pg/keys.cpp, key_type_of): the type a key of type t is hashed
-- as (text for text, varchar and domains over them; bytea, smallint,
-- integer, bigint, uuid and domains over them as themselves), NULL when t is
-- not a shard key type. STABLE: it reads the type catalog (domains).
CREATE FUNCTION sharding._key_type(t regtype) RETURNS regtype
    AS 'MODULE_PATHNAME', 'sharding__key_type' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._key_type(regtype) IS
    'internal: the type a shard key of type t is hashed as (text for varchar, a domain''s base type), NULL if none';

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
-- Maps (docs/maps.md): logical-shard maps, whale pins, nodes.
--
-- Config tables. Users change them through the functions; plain roles may
-- read them. They are registered with pg_extension_config_dump so that
-- pg_dump/restore keeps maps, epochs, pins and node DSNs.

CREATE TABLE sharding.maps (
    map            text PRIMARY KEY CHECK (map <> ''),
    logical_shards integer NOT NULL CHECK (logical_shards >= 1),
    created        timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE sharding.maps IS 'one row per logical-shard map';

-- Every node a map, pin or add_node ever named; dsn is set by add_node.
CREATE TABLE sharding.nodes (
    node text PRIMARY KEY CHECK (node <> ''),
    dsn  text
);
COMMENT ON TABLE sharding.nodes IS 'physical nodes (databases) by name, with their connection strings';

CREATE TABLE sharding.shards (
    map     text NOT NULL REFERENCES sharding.maps ON DELETE CASCADE,
    logical integer NOT NULL CHECK (logical >= 0),
    node    text NOT NULL REFERENCES sharding.nodes,
    epoch   bigint NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    PRIMARY KEY (map, logical)
);
COMMENT ON TABLE sharding.shards IS 'owner and epoch of every logical shard of every map';

-- pins.map and pins.node refer to sharding.maps and sharding.nodes as foreign
-- keys would (a map's pins go with it), checked per statement by
-- sharding._pins_integrity (below), not per row: pin_many of 100,000 keys
-- spent most of its time in the row-by-row checks of declared foreign keys.
CREATE TABLE sharding.pins (
    map  text NOT NULL,
    key  text NOT NULL,
    node text NOT NULL,
    PRIMARY KEY (map, key)
);
COMMENT ON TABLE sharding.pins IS 'whale directory: keys pinned to a node, overriding their logical shard';
-- The pins of a node: drop_node, add_node and the refusal to delete a node
-- that pins name (sharding._pins_integrity) look them up by node, which
-- read every pin of every map without this index.
CREATE INDEX pins_node ON sharding.pins (node);

-- cluster_version(map): rises with every change to a map, its pins or its
-- nodes' DSNs; rows survive drop_map so the version never falls.
CREATE SEQUENCE sharding.version_seq;
CREATE TABLE sharding.map_versions (
    map     text PRIMARY KEY,
    version bigint NOT NULL
);
COMMENT ON TABLE sharding.map_versions IS 'monotonic configuration version of each map name (PL/Proxy reloads on change)';

SELECT pg_catalog.pg_extension_config_dump('sharding.maps', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.nodes', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.shards', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.pins', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.map_versions', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.version_seq', '');

GRANT SELECT ON sharding.maps, sharding.nodes, sharding.shards, sharding.pins, sharding.map_versions
    TO PUBLIC;
-- Admins change the config through the functions, which run as the caller.
GRANT INSERT, UPDATE, DELETE ON sharding.maps, sharding.nodes, sharding.shards, sharding.pins,
    sharding.map_versions TO sharding_admin;
GRANT USAGE, SELECT, UPDATE ON SEQUENCE sharding.version_seq TO sharding_admin;

-- Bumps the configuration version of a map name (cluster_version).
CREATE FUNCTION sharding._touch_map(map text) RETURNS bigint
    LANGUAGE sql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
        INSERT INTO sharding.map_versions AS v (map, version)
        VALUES ($1, pg_catalog.nextval('sharding.version_seq'))
        ON CONFLICT (map) DO UPDATE SET version = pg_catalog.nextval('sharding.version_seq')
        RETURNING v.version
    $$;
COMMENT ON FUNCTION sharding._touch_map(text) IS
    'internal: raises the configuration version of a map (called by every map, pin and DSN change)';
-- Internal: only the functions that change the config call it.
REVOKE ALL ON FUNCTION sharding._touch_map(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._touch_map(text) TO sharding_admin;

-- Routing cache changes: any change to maps, shards or pins, by the
-- functions or by a direct write, is seen by every backend's next routing
-- call (src/routing/maps.cpp, src/pg/cache.hpp "changes"). Statement-level,
-- with the changed rows as transition tables, so that only the maps (and
-- pin keys) that changed are rebuilt (or re-read) anywhere; a TRUNCATE
-- changes every map. ENABLE ALWAYS: a session under session_replication_role
-- = replica writes them too (apply itself fires the row triggers of
-- 70_distribute.sql).
CREATE FUNCTION sharding._routing_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__routing_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._routing_changed() IS
    'internal: tells every backend''s routing cache which maps, shards and pins changed';
-- The same four statement triggers on each of the three tables, all ENABLE
-- ALWAYS.
DO $$
DECLARE
    t text;
    trg record;
BEGIN
    FOREACH t IN ARRAY ARRAY['maps', 'shards', 'pins'] LOOP
        FOR trg IN VALUES ('routing_changed', 'TRUNCATE', ''),
                          ('routing_changed_insert', 'INSERT', 'REFERENCING NEW TABLE AS changed'),
                          ('routing_changed_update', 'UPDATE', 'REFERENCING OLD TABLE AS before NEW TABLE AS after'),
                          ('routing_changed_delete', 'DELETE', 'REFERENCING OLD TABLE AS changed') LOOP
            EXECUTE pg_catalog.format('CREATE TRIGGER %I AFTER %s ON sharding.%I %s '
                                      'FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed()',
                                      trg.column1, trg.column2, t, trg.column3);
            EXECUTE pg_catalog.format('ALTER TABLE sharding.%I ENABLE ALWAYS TRIGGER %I', t, trg.column1);
        END LOOP;
    END LOOP;
END $$;

-- The references of sharding.pins (map -> sharding.maps ON DELETE CASCADE,
-- node -> sharding.nodes), kept as the declared foreign keys of 1.2 kept
-- them, with their SQLSTATE (23503), messages and locks, but one check per
-- statement over its transition table instead of one query per row:
-- - pins, after INSERT or UPDATE: every map and node the new rows name is
--   locked FOR KEY SHARE (so that a concurrent delete waits for this
--   transaction, or this check for it) and must exist;
-- - maps, after DELETE: the pins of the deleted maps are deleted;
-- - maps and nodes, after UPDATE (of the name) or nodes after DELETE: a name
--   that is gone must not be named by a pin;
-- - maps or nodes, after TRUNCATE (... CASCADE): every pin goes.
-- Not fired by logical-replication apply (session_replication_role =
-- replica), as declared foreign keys are not: the publisher sends the rows.
CREATE FUNCTION sharding._pins_integrity() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    bad text;
    maps_named text[];
    nodes_named text[];
BEGIN
    IF TG_TABLE_NAME = 'pins' THEN
        -- One pass over the rows: the few distinct maps and nodes they name.
        SELECT pg_catalog.array_agg(DISTINCT g.map), pg_catalog.array_agg(DISTINCT g.node) INTO maps_named, nodes_named
          FROM (SELECT c.map, c.node FROM changed c GROUP BY c.map, c.node) g;
        PERFORM FROM sharding.maps m WHERE m.map = ANY (maps_named) FOR KEY SHARE OF m;
        SELECT u INTO bad FROM pg_catalog.unnest(maps_named) u
         WHERE NOT EXISTS (SELECT FROM sharding.maps m WHERE m.map = u) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'insert or update on table "pins" violates foreign key constraint "pins_map_fkey"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_map_fkey',
                      DETAIL = format('Key (map)=(%s) is not present in table "maps".', bad);
        END IF;
        PERFORM FROM sharding.nodes n WHERE n.node = ANY (nodes_named) FOR KEY SHARE OF n;
        SELECT u INTO bad FROM pg_catalog.unnest(nodes_named) u
         WHERE NOT EXISTS (SELECT FROM sharding.nodes n WHERE n.node = u) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'insert or update on table "pins" violates foreign key constraint "pins_node_fkey"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_node_fkey',
                      DETAIL = format('Key (node)=(%s) is not present in table "nodes".', bad);
        END IF;
    ELSIF TG_OP = 'TRUNCATE' THEN
        -- TRUNCATE maps or nodes ... CASCADE (without it, the foreign keys
        -- of sharding.shards refuse): as it took the pins with it in 1.2.
        DELETE FROM sharding.pins;
    ELSIF TG_TABLE_NAME = 'maps' AND TG_OP = 'DELETE' THEN
        DELETE FROM sharding.pins p WHERE p.map IN (SELECT c.map FROM changed c);
    ELSIF TG_TABLE_NAME = 'maps' THEN
        SELECT b.map INTO bad FROM before b
         WHERE NOT EXISTS (SELECT FROM sharding.maps m WHERE m.map = b.map)
           AND EXISTS (SELECT FROM sharding.pins p WHERE p.map = b.map) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'update or delete on table "maps" violates foreign key constraint "pins_map_fkey" on table "pins"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_map_fkey',
                      DETAIL = format('Key (map)=(%s) is still referenced from table "pins".', bad);
        END IF;
    ELSE
        IF TG_OP = 'DELETE' THEN
            SELECT b.node INTO bad FROM changed b
             WHERE EXISTS (SELECT FROM sharding.pins p WHERE p.node = b.node) LIMIT 1;
        ELSE
            SELECT b.node INTO bad FROM before b
             WHERE NOT EXISTS (SELECT FROM sharding.nodes n WHERE n.node = b.node)
               AND EXISTS (SELECT FROM sharding.pins p WHERE p.node = b.node) LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION 'update or delete on table "nodes" violates foreign key constraint "pins_node_fkey" on table "pins"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_node_fkey',
                      DETAIL = format('Key (node)=(%s) is still referenced from table "pins".', bad);
        END IF;
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._pins_integrity() IS
    'internal: the references of sharding.pins to maps and nodes (23503; a map''s pins go with it), checked per statement';
CREATE TRIGGER pins_fkey_insert AFTER INSERT ON sharding.pins REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_update AFTER UPDATE ON sharding.pins REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_delete AFTER DELETE ON sharding.maps REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_update AFTER UPDATE ON sharding.maps REFERENCING OLD TABLE AS before
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_delete AFTER DELETE ON sharding.nodes REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_update AFTER UPDATE ON sharding.nodes REFERENCING OLD TABLE AS before
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_truncate AFTER TRUNCATE ON sharding.maps
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_truncate AFTER TRUNCATE ON sharding.nodes
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();

-- Validates one node name (pin, move_shard, add_node, attach_node ...):
-- 22023 for NULL or empty. Not STRICT: NULL must raise.
CREATE FUNCTION sharding._check_node(node text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
COMMENT ON FUNCTION sharding._check_node(text) IS
    'internal: validates a node name (22023 for NULL or empty)';

-- Validates a node list for create_map and rebalance: 22023 for NULL, empty,
-- NULL-containing, empty-string, multi-dimensional or duplicate lists.
CREATE FUNCTION sharding._check_nodes(nodes text[]) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    dup text;
BEGIN
    -- Not STRICT: a NULL list must raise, not silently do nothing.
    IF nodes IS NULL OR pg_catalog.cardinality(nodes) = 0 THEN
        RAISE EXCEPTION 'nodes must list at least one node, got %', coalesce(nodes::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_ndims(nodes) > 1 THEN
        RAISE EXCEPTION 'nodes must be a one-dimensional array, got %', nodes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_position(nodes, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'nodes must not contain NULL, got %', nodes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF '' = ANY (nodes) THEN
        RAISE EXCEPTION 'node names must not be empty, got %', nodes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT n INTO dup FROM pg_catalog.unnest(nodes) AS n GROUP BY n HAVING pg_catalog.count(*) > 1
     ORDER BY n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'node "%" is listed more than once in %', dup, nodes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
COMMENT ON FUNCTION sharding._check_nodes(text[]) IS
    'internal: validates the node list of create_map and rebalance (22023)';

-- 42704 unless the map exists; the functions that change a map lock its
-- row. Not STRICT: a NULL map raises 22023. C++ (src/nodes/owner_switch.cpp).
CREATE FUNCTION sharding._require_map(map text, for_update boolean DEFAULT false) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__require_map' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._require_map(text, boolean) IS
    'internal: logical shard count of a map, 42704 if it does not exist';

-- 22023 unless 0 <= logical < logical_shards. Not STRICT: a NULL shard
-- raises. C++ (src/nodes/owner_switch.cpp).
CREATE FUNCTION sharding._check_logical(map text, logical integer, logical_shards integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__check_logical' LANGUAGE C IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._check_logical(text, integer, integer) IS
    'internal: validates a logical shard number (22023)';

-- Map-changing functions below are not STRICT: a NULL argument raises 22023
-- instead of silently changing nothing. They run as the caller (SECURITY
-- INVOKER); EXECUTE is revoked from PUBLIC and granted to sharding_admin,
-- whose members also hold the table privileges the bodies need.

CREATE FUNCTION sharding.create_map(map text, logical_shards integer, nodes text[]) RETURNS void
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
COMMENT ON FUNCTION sharding.create_map(text, integer, text[]) IS
    'creates a map of logical_shards logical shards dealt to nodes as contiguous ranges, larger ranges first';

CREATE FUNCTION sharding.drop_map(map text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF map IS NULL THEN
        RAISE EXCEPTION 'map name must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Wait for fenced writers and movers of this map.
    PERFORM sharding._lock_map(map);
    DELETE FROM sharding.maps m WHERE m.map = $1;  -- shards and pins cascade
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    -- map_versions keeps its row, so cluster_version never falls.
    PERFORM sharding._touch_map($1);
END $$;
COMMENT ON FUNCTION sharding.drop_map(text) IS
    'drops a map with its shards and pins (its configuration version lives on)';

CREATE FUNCTION sharding.pin(map text, key text, node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._check_node(node);
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
COMMENT ON FUNCTION sharding.pin(text, text, text) IS
    'pins (or re-pins) one key, by its text form, to a node, overriding its logical shard';

CREATE FUNCTION sharding.unpin(map text, key text) RETURNS boolean
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
COMMENT ON FUNCTION sharding.unpin(text, text) IS
    'removes the pin of one key; true if there was one';

-- move_shard(map, logical, node): the owner switch alone. On a map with a
-- distributed table a switch is refused (the rows would stay behind on the
-- old owner; a "move" to the current owner is not a switch): moves go
-- through move_shard_online or rebalance_start, whose cutover calls
-- _switch_owner.
CREATE FUNCTION sharding.move_shard(map text, logical integer, node text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._check_node(node);
    PERFORM sharding._check_logical($1, $2, sharding._require_map($1, false));
    -- A "move" to the current owner changes nothing (the current epoch):
    -- only a real switch is refused. The shard is locked first, as
    -- _switch_owner locks it, so that no cutover switches it in between.
    PERFORM sharding._lock_shard($1, $2);
    IF EXISTS (SELECT FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2 AND s.node IS DISTINCT FROM $3) THEN
        PERFORM sharding._refuse_owner_switch($1, 'move_shard');
    END IF;
    RETURN sharding._switch_owner($1, $2, $3);
END $$;
COMMENT ON FUNCTION sharding.move_shard(text, integer, text) IS
    'moves one logical shard to a node after fenced writers commit; returns its new epoch (unchanged when already there); refused on a map with distributed tables';

-- _switch_owner(map, logical, node): move_shard's switch (also the cutover
-- of an online move): after the node, map and shard checks (and, on a
-- database map, the new owner's DSN), the exclusive shard lock (it waits
-- for every writer fenced on the shard, and any rebalance), then epoch + 1
-- and the new owner, unless it owns the shard already (then its epoch, and
-- fenced writers stay valid). Not STRICT: NULL arguments raise 22023. C++
-- (src/nodes/owner_switch.cpp).
CREATE FUNCTION sharding._switch_owner(map text, logical integer, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__switch_owner' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._switch_owner(text, integer, text) IS
    'internal: switches a shard''s owner after fenced writers commit (epoch + 1); returns its epoch';
REVOKE ALL ON FUNCTION sharding._switch_owner(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._switch_owner(text, integer, text) TO sharding_admin;

-- What rebalance and rebalance_by_load (80_observe.sql) do once they have
-- checked their arguments: on a database map every listed node needs a DSN
-- (a dry run says so too); unless dry_run, the map-wide lock (it waits for
-- fenced writers and keeps new ones out) and the new nodes registered;
-- then the plan for the owners as they are under the lock, _rebalance_plan
-- or, when loads are given, _rebalance_by_load_plan, is carried out (each
-- move raises the shard's epoch) and returned. Before its first move,
-- caller's refusal of owner switches (a plan without moves changes
-- nothing, and is not refused).
CREATE FUNCTION sharding._rebalance_apply(map text, nodes text[], dry_run boolean, caller text,
                                          loads float8[] DEFAULT NULL, max_imbalance float8 DEFAULT NULL)
    RETURNS TABLE(logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    owners text[];
    plan refcursor;
    mv record;
    moved integer := 0;
BEGIN
    PERFORM sharding._check_database_nodes($1, nodes);
    IF NOT dry_run THEN
        PERFORM sharding._lock_map($1);
        PERFORM sharding._require_map($1, true);
        INSERT INTO sharding.nodes (node) SELECT n FROM pg_catalog.unnest(nodes) AS n
            ON CONFLICT DO NOTHING;
    END IF;
    SELECT pg_catalog.array_agg(s.node ORDER BY s.logical) INTO owners
      FROM sharding.shards s WHERE s.map = $1;
    IF loads IS NULL THEN
        OPEN plan FOR SELECT * FROM sharding._rebalance_plan(owners, nodes);
    ELSE
        OPEN plan FOR SELECT * FROM sharding._rebalance_by_load_plan(owners, nodes, loads, max_imbalance);
    END IF;
    LOOP
        FETCH plan INTO mv;
        EXIT WHEN NOT FOUND;
        IF NOT dry_run THEN
            -- Refused only when an owner would really change (a plan
            -- without moves changes nothing).
            IF moved = 0 THEN
                PERFORM sharding._refuse_owner_switch($1, caller);
            END IF;
            UPDATE sharding.shards s SET node = mv.to_node, epoch = s.epoch + 1
             WHERE s.map = $1 AND s.logical = mv.logical;
        END IF;
        moved := moved + 1;
        logical := mv.logical;
        from_node := mv.from_node;
        to_node := mv.to_node;
        RETURN NEXT;
    END LOOP;
    CLOSE plan;
    IF NOT dry_run AND moved > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
END $$;
COMMENT ON FUNCTION sharding._rebalance_apply(text, text[], boolean, text, float8[], float8) IS
    'internal: locks the map, plans the moves (by count, or by loads when given) and carries them out unless dry_run';
-- Like the functions that call it: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding._rebalance_apply(text, text[], boolean, text, float8[], float8) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._rebalance_apply(text, text[], boolean, text, float8[], float8) TO sharding_admin;

CREATE FUNCTION sharding.rebalance(map text, nodes text[], dry_run boolean DEFAULT false)
    RETURNS TABLE(logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._check_nodes(nodes);
    IF dry_run IS NULL THEN
        RAISE EXCEPTION 'dry_run must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    RETURN QUERY SELECT * FROM sharding._rebalance_apply($1, nodes, dry_run, 'rebalance');
END $$;
COMMENT ON FUNCTION sharding.rebalance(text, text[], boolean) IS
    'spreads a map evenly over nodes with the fewest moves (each raises the shard''s epoch); dry_run only reports';

-- Read side: every role may route and inspect. STRICT: NULL in, NULL out.
-- STABLE: the answer follows the config tables.

CREATE FUNCTION sharding.shards_of(map text, node text) RETURNS integer[]
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.maps m WHERE m.map = $1) THEN
        RAISE EXCEPTION 'map "%" does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    -- A node owning nothing (unknown, pin-only or drained) gets '{}'.
    RETURN (SELECT coalesce(pg_catalog.array_agg(s.logical ORDER BY s.logical), '{}')
              FROM sharding.shards s WHERE s.map = $1 AND s.node = $2);
END $$;
COMMENT ON FUNCTION sharding.shards_of(text, text) IS
    'logical shards a node owns in a map, ascending (empty array if none)';

-- From the routing cache (src/routing/maps.cpp), like node_for: a move
-- committed before the call is seen, also in a REPEATABLE READ transaction
-- or a PL/pgSQL loop.
CREATE FUNCTION sharding.epoch(map text, logical integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_epoch' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.epoch(text, integer) IS
    'epoch of a logical shard: 1 when the map is created, +1 per move';

CREATE FUNCTION sharding.fence(map text, logical integer, epoch bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding_fence' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fence(text, integer, bigint) IS
    'raises 55000 if the shard moved past epoch, else share-locks it until commit so moves wait for the writer';
-- Not STRICT: fence(NULL, ...) must raise, never silently let a writer through.

-- Internal lock helpers and planner (src/routing/maps.cpp, src/core/rebalance.cpp).
CREATE FUNCTION sharding._lock_shard(map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__lock_shard' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding._lock_shard(text, integer) IS
    'internal: exclusive shard lock for move_shard (waits for fenced writers)';
CREATE FUNCTION sharding._lock_map(map text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__lock_map' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding._lock_map(text) IS
    'internal: map-wide exclusive lock for rebalance and drop_map';
CREATE FUNCTION sharding._rebalance_plan(owners text[], nodes text[])
    RETURNS TABLE(logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', 'sharding__rebalance_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._rebalance_plan(text[], text[]) IS
    'internal: the fewest moves spreading owners evenly over nodes, ordered by logical shard';

-- Map-changing functions and their helpers: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding.create_map(text, integer, text[]), sharding.drop_map(text),
    sharding.pin(text, text, text), sharding.unpin(text, text),
    sharding.move_shard(text, integer, text), sharding.rebalance(text, text[], boolean),
    sharding._lock_shard(text, integer), sharding._lock_map(text), sharding._require_map(text, boolean)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.create_map(text, integer, text[]), sharding.drop_map(text),
    sharding.pin(text, text, text), sharding.unpin(text, text),
    sharding.move_shard(text, integer, text), sharding.rebalance(text, text[], boolean),
    sharding._lock_shard(text, integer), sharding._lock_map(text), sharding._require_map(text, boolean)
    TO sharding_admin;

-- Routing, from the per-backend cache (src/routing/maps.cpp). STABLE: follows the
-- config tables; STRICT: NULL in, NULL out; PARALLEL SAFE: workers build
-- their own cache from the query's snapshot.
CREATE FUNCTION sharding.logical_shard(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, text) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, text) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, bytea) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key bytea) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, bytea) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, smallint) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key smallint) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, smallint) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, integer) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key integer) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, integer) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, bigint) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key bigint) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, bigint) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_logical_shard_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, uuid) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key uuid) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_node_for_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, uuid) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';

-- One row per map and node: what it owns, how many keys are pinned to it.
CREATE VIEW sharding.map_overview AS
SELECT m.map, n.node, m.logical_shards,
       coalesce(s.owned, 0)::integer AS owned_shards,
       coalesce(s.shards, '{}') AS shards,
       coalesce(p.pinned, 0)::integer AS pinned_keys,
       s.max_epoch
  FROM sharding.maps m
  JOIN (SELECT map, node FROM sharding.shards UNION SELECT map, node FROM sharding.pins) AS n
    ON n.map = m.map
  LEFT JOIN (SELECT map, node, pg_catalog.count(*) AS owned, pg_catalog.array_agg(logical ORDER BY logical) AS shards,
                    pg_catalog.max(epoch) AS max_epoch
               FROM sharding.shards GROUP BY map, node) AS s
    ON s.map = n.map AND s.node = n.node
  LEFT JOIN (SELECT map, node, pg_catalog.count(*) AS pinned FROM sharding.pins GROUP BY map, node) AS p
    ON p.map = n.map AND p.node = n.node;
COMMENT ON VIEW sharding.map_overview IS
    'per map and node: logical shards owned (and which), keys pinned, highest epoch';
GRANT SELECT ON sharding.map_overview TO PUBLIC;

-- Database maps (docs/nodes.md). A map whose nodes have connection strings (any
-- of them) is a database map; there a node without a DSN would make every
-- proxied call fail (cluster_partitions raises 55000), so the functions that
-- hand shards or pins to a node refuse one without a DSN. Maps whose nodes
-- have no DSN (worker maps) keep accepting new names.

-- _check_database_nodes(map, nodes): 55000 naming the first node of `nodes`
-- that has no DSN, when `map` is a database map: some node owning its shards
-- or holding its pins, or some node of `nodes`, has a DSN. create_map passes
-- a map that does not exist yet: then only `nodes` decide. Cheapest first:
-- no DSN anywhere; a node of `nodes` or an owner of the map's shards with
-- one. Only then the map's pins (no index by node): a join that stops at
-- the first pin held by a node with a DSN. C++ (src/nodes/owner_switch.cpp;
-- its statements are kept prepared: pin calls it every time).
CREATE FUNCTION sharding._check_database_nodes(map text, nodes text[]) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__check_database_nodes' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._check_database_nodes(text, text[]) IS
    'internal: 55000 for a node without DSN handed shards or pins of a database map';
REVOKE ALL ON FUNCTION sharding._check_database_nodes(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._check_database_nodes(text, text[]) TO sharding_admin;

-- Identities that cannot drift (docs/identities.md). A pin is stored by the key's
-- canonical text form, and node_for on a typed key matches pins on that
-- form (src/routing/maps.cpp key_text). Pinning through the text overload asks the
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

-- The handoff (docs/ordered.md): pin and unpin serialize with claim_node, fences and
-- moves. A pin re-routes its key at once, so, like move_shard, it must not
-- commit while a claim_node of the map is between reading the map and
-- claiming (the old node would claim the key's next job while the new node,
-- seeing no committed lease of the old one, claims another), nor while a
-- writer fenced on the key's shard is writing. pin and unpin (and the typed
-- overloads, which delegate to them) call _lock_pin before changing the pin:
-- _lock_shard on every logical shard the pinned text routes a key of: the
-- text key's own shard and, when the text is the canonical form of an
-- integer, a uuid or a bytea key (the form node_for matches a typed key's
-- pin on, docs/identities.md), that key's shard. _lock_shard takes the map-level
-- tag in RowExclusiveLock (conflicting with claim_node's ShareLock and with
-- rebalance) and the shard's tag in ExclusiveLock (conflicting with fence).
-- At most two shards, locked in ascending order, so two pins never deadlock
-- on each other. Needs the map to exist (42704).
CREATE FUNCTION sharding._lock_pin(map text, key text) RETURNS void
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    -- shard_of over the map's shard count, not logical_shard: the same
    -- shards, without building the map's routing cache (whose pins the
    -- caller is changing).
    l integer := sharding._require_map($1, false);
    shards integer[] := ARRAY[sharding.shard_of($2, l)];
    s integer;
BEGIN
    -- Nested IFs: a cast must never see text its test did not accept.
    IF $2 ~ '^(0|-?[1-9][0-9]{0,18})$' THEN
        IF $2::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            shards := shards || sharding.shard_of($2::bigint, l);
        END IF;
    ELSIF $2 ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        shards := shards || sharding.shard_of($2::uuid, l);
    ELSIF pg_catalog.left($2, 2) = E'\\x' THEN
        IF pg_catalog.substr($2, 3) ~ '^([0-9a-f][0-9a-f])*$' THEN
            shards := shards || sharding.shard_of(pg_catalog.decode(pg_catalog.substr($2, 3), 'hex'), l);
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

-- Internal, for tests (test/tap/102_directory_scale.pl): how often this
-- backend's routing cache built a map from all its rows, and refreshed one
-- in place from the keys and shards that changed.
CREATE FUNCTION sharding._routing_cache_counts() RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding__routing_cache_counts' LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION sharding._routing_cache_counts() IS
    'internal: {builds, refreshes} of this backend''s routing cache (for tests)';

-- pin_many(map, keys, nodes) (docs/directory.md) pins (or re-pins) keys[i] to
-- nodes[i] in one statement and returns how many keys it pinned (a key given
-- twice counts once; the last one wins, as two pin calls would). Arrays of
-- different lengths, a NULL or multi-dimensional array, a NULL key: 22023,
-- nothing pinned; each node is checked as pin checks it (empty or NULL:
-- 22023; on a database map, a node without DSN: 55000); followers refuse
-- it as they refuse pin. Instead of pin's per-key shard locks it takes the
-- map's lock (_lock_map: waits for every fence, claim_node and move of the
-- map and keeps new ones out until commit), so that any number of keys costs
-- one lock and two pin_many calls cannot deadlock.
CREATE FUNCTION sharding.pin_many(map text, keys text[], nodes text[]) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n integer;
    null_at integer;
    empty_at integer;
    distinct_nodes text[];
BEGIN
    IF keys IS NULL OR nodes IS NULL THEN
        RAISE EXCEPTION 'pin_many needs arrays of keys and nodes, got NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_ndims(keys) > 1 OR pg_catalog.array_ndims(nodes) > 1 THEN
        RAISE EXCEPTION 'pin_many needs one-dimensional arrays' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.cardinality(keys) <> pg_catalog.cardinality(nodes) THEN
        RAISE EXCEPTION 'pin_many got % keys but % nodes', pg_catalog.cardinality(keys), pg_catalog.cardinality(nodes)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_position(keys, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL (keys[%])', pg_catalog.array_position(keys, NULL)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The first NULL or empty node.
    null_at := pg_catalog.array_position(nodes, NULL);
    empty_at := pg_catalog.array_position(nodes, '');
    IF null_at IS NOT NULL OR empty_at IS NOT NULL THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %',
            CASE WHEN empty_at IS NULL OR null_at < empty_at THEN 'NULL' ELSE pg_catalog.quote_literal('') END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    PERFORM sharding._lock_map($1);
    PERFORM sharding._require_map($1, true);
    -- A hash of the few distinct nodes, not a sort of every element.
    SELECT pg_catalog.array_agg(d.u) INTO distinct_nodes FROM (SELECT DISTINCT u FROM pg_catalog.unnest(nodes) u) d;
    PERFORM sharding._check_database_nodes($1, distinct_nodes);
    INSERT INTO sharding.nodes (node) SELECT u FROM pg_catalog.unnest(distinct_nodes) u ON CONFLICT DO NOTHING;
    -- Loading new keys, each given once (the common case), is one plain
    -- INSERT: no sort, no speculative insertion. A key pinned already (or
    -- given twice) makes it fail (unique_violation, before any statement
    -- trigger ran: nothing noted, rolled back with the block); then the
    -- last node given for each key wins as in a row of pin calls. The map's
    -- lock keeps pin, unpin and other pin_many calls on it out meanwhile.
    BEGIN
        INSERT INTO sharding.pins (map, key, node)
        SELECT $1, u.key, u.node FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(nodes)) AS u(key, node);
        GET DIAGNOSTICS n = ROW_COUNT;
    EXCEPTION WHEN unique_violation THEN
        INSERT INTO sharding.pins AS p (map, key, node)
        SELECT DISTINCT ON (u.key) $1, u.key, u.node
          FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(nodes)) WITH ORDINALITY AS u(key, node, i)
         ORDER BY u.key, u.i DESC
            ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
        GET DIAGNOSTICS n = ROW_COUNT;
    END;
    IF n > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding.pin_many(text, text[], text[]) IS
    'pins (or re-pins) keys[i] to nodes[i] in one statement; returns how many keys were pinned';
REVOKE ALL ON FUNCTION sharding.pin_many(text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.pin_many(text, text[], text[]) TO sharding_admin;
-- Nodes and multi-node routing through PL/Proxy (docs/nodes.md).
--
-- A map's PL/Proxy cluster has one partition per logical shard (in order,
-- each pointing at its owner's DSN) followed by one partition per node that
-- only holds pins, ordered by name (byte order, COLLATE "C", so that every
-- database and every client agrees). Several partitions sharing a DSN share
-- one connection in PL/Proxy, and cluster_config sets modular_mapping, so a
-- map of any size is a valid cluster. cluster_version follows
-- sharding.map_versions, which every change to a map, its pins or its
-- nodes' DSNs raises (sharding._touch_map), so a running proxy reloads on
-- its next call.
--
-- The functions are plpgsql: they read the config tables with cached plans
-- and raise the SQLSTATEs docs/nodes.md lists. partition_for, the one called per
-- proxied request, costs one C++ routing-cache lookup (logical_shard) and
-- one index probe of sharding.pins.

-- add_node(node text, dsn text): set or replace a node's connection string.
-- Not STRICT: a NULL argument is a mistake worth an error, not a silent
-- no-op.
CREATE FUNCTION sharding.add_node(node text, dsn text) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    changed boolean := false;
BEGIN
    PERFORM sharding._check_node(add_node.node);
    IF add_node.dsn IS NULL OR btrim(add_node.dsn) = '' THEN
        RAISE EXCEPTION 'connection string of node "%" must not be empty or NULL, got %',
                add_node.node, coalesce(quote_literal(add_node.dsn), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO sharding.nodes AS n (node, dsn)
    VALUES (add_node.node, add_node.dsn)
    ON CONFLICT ON CONSTRAINT nodes_pkey DO UPDATE SET dsn = EXCLUDED.dsn
        WHERE n.dsn IS DISTINCT FROM EXCLUDED.dsn
    RETURNING true INTO changed;

    -- A new DSN changes the PL/Proxy cluster of every map that routes to the
    -- node: raise their versions (in name order, as every writer does) so
    -- that running proxies reload.
    IF changed THEN
        PERFORM sharding._touch_map(u.map)
           FROM (SELECT s.map FROM sharding.shards AS s WHERE s.node = add_node.node
                 UNION
                 SELECT p.map FROM sharding.pins AS p WHERE p.node = add_node.node) AS u
          ORDER BY u.map;
    END IF;
END
$$;
COMMENT ON FUNCTION sharding.add_node(text, text) IS
    'sets (or replaces) the connection string of a node; raises the cluster version of every map using it';
-- Changing where maps route is an administrator's job (42501 otherwise: docs/nodes.md).
REVOKE ALL ON FUNCTION sharding.add_node(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.add_node(text, text) TO sharding_admin;

-- The connection string of a node that must have one (attach_node,
-- detach_node): 55000 naming the node when it has none or is unknown.
CREATE FUNCTION sharding._node_dsn(node text) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    dsn text;
BEGIN
    SELECT n.dsn INTO dsn FROM sharding.nodes AS n WHERE n.node = _node_dsn.node;
    IF dsn IS NULL THEN
        RAISE EXCEPTION 'node "%" has no connection string', node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Call sharding.add_node(%L, ''<dsn>'') first.', node);
    END IF;
    RETURN dsn;
END $$;
COMMENT ON FUNCTION sharding._node_dsn(text) IS
    'internal: a node''s connection string, 55000 if it has none';

-- drop_node(node text): forget a node. Not STRICT, for the same reason.
CREATE FUNCTION sharding.drop_node(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    owned integer;
    pinned integer;
    used_by text;
BEGIN
    IF drop_node.node IS NULL THEN
        RAISE EXCEPTION 'node name must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- FOR UPDATE conflicts with the key-share lock the foreign keys of
    -- sharding.shards and sharding.pins take, so no move or pin to this
    -- node can commit between the check and the delete.
    PERFORM FROM sharding.nodes AS n WHERE n.node = drop_node.node FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'node "%" does not exist', drop_node.node
            USING ERRCODE = 'undefined_object';
    END IF;

    SELECT count(*) INTO owned FROM sharding.shards AS s WHERE s.node = drop_node.node;
    SELECT count(*) INTO pinned FROM sharding.pins AS p WHERE p.node = drop_node.node;
    IF owned > 0 OR pinned > 0 THEN
        SELECT string_agg(quote_ident(u.map), ', ' ORDER BY u.map) INTO used_by
          FROM (SELECT s.map FROM sharding.shards AS s WHERE s.node = drop_node.node
                UNION
                SELECT p.map FROM sharding.pins AS p WHERE p.node = drop_node.node) AS u;
        RAISE EXCEPTION 'node "%" still owns % logical shards and % pins', drop_node.node, owned, pinned
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Maps using it: %s.', used_by),
                  HINT = 'Move its shards away (sharding.move_shard or sharding.rebalance) and unpin its keys first.';
    END IF;

    DELETE FROM sharding.nodes AS n WHERE n.node = drop_node.node;
END
$$;
COMMENT ON FUNCTION sharding.drop_node(text) IS
    'forgets a node; refused (55000) while it owns logical shards or pins';
-- Changing where maps route is an administrator's job (42501 otherwise: docs/nodes.md).
REVOKE ALL ON FUNCTION sharding.drop_node(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.drop_node(text) TO sharding_admin;

-- partition_for(map text, key): the PL/Proxy RUN ON function, one overload
-- per key type (an untyped literal resolves to text). C++ (since 1.1): it
-- routes from the same per-backend cache as node_for, so a pinned key matches
-- exactly as node_for matches it, and a proxied call pays a hash and a probe
-- instead of three queries. STABLE: it reads the map.
CREATE FUNCTION sharding.partition_for(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_for(text, text) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, bytea) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, smallint) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, integer) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, bigint) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, uuid) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';

-- cluster_partitions(map text): the DSNs of the map's PL/Proxy partitions.
CREATE FUNCTION sharding.cluster_partitions(map text) RETURNS SETOF text
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    shards integer;
    part record;
BEGIN
    SELECT m.logical_shards INTO shards FROM sharding.maps AS m WHERE m.map = cluster_partitions.map;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', cluster_partitions.map
            USING ERRCODE = 'undefined_object';
    END IF;

    FOR part IN
        SELECT g.logical AS part_no, s.node, n.dsn
          FROM pg_catalog.generate_series(0, shards - 1) AS g(logical)
          LEFT JOIN sharding.shards AS s ON s.map = cluster_partitions.map AND s.logical = g.logical
          LEFT JOIN sharding.nodes AS n ON n.node = s.node
        UNION ALL
        SELECT shards - 1 + row_number() OVER (ORDER BY po.node COLLATE "C"), po.node, n.dsn
          FROM (SELECT DISTINCT p.node
                  FROM sharding.pins AS p
                 WHERE p.map = cluster_partitions.map
                   AND NOT EXISTS (SELECT FROM sharding.shards AS s
                                    WHERE s.map = p.map AND s.node = p.node)) AS po
          JOIN sharding.nodes AS n ON n.node = po.node
         ORDER BY 1
    LOOP
        IF part.node IS NULL THEN
            RAISE EXCEPTION 'logical shard % of map "%" has no owner', part.part_no, cluster_partitions.map
                USING ERRCODE = 'data_corrupted';
        END IF;
        IF part.dsn IS NULL THEN
            RAISE EXCEPTION 'node "%" of map "%" has no connection string', part.node, cluster_partitions.map
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Set one with sharding.add_node(node, dsn).';
        END IF;
        RETURN NEXT part.dsn;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sharding.cluster_partitions(text) IS
    'PL/Proxy partitions of a map: the owner''s DSN of each logical shard, then one per pin-only node by name';

-- cluster_version(map text): PL/Proxy calls it on every request.
CREATE FUNCTION sharding.cluster_version(map text) RETURNS integer
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    found_map text;
    v bigint;
BEGIN
    SELECT m.map, mv.version INTO found_map, v
      FROM sharding.maps AS m
      LEFT JOIN sharding.map_versions AS mv ON mv.map = m.map
     WHERE m.map = cluster_version.map;
    IF found_map IS NULL THEN
        RAISE EXCEPTION 'map "%" does not exist', cluster_version.map
            USING ERRCODE = 'undefined_object';
    END IF;
    -- PL/Proxy takes an int4. Wrapping would make the version fall, so a
    -- version past the range is an error rather than a silent reset.
    IF v > 2147483647 THEN
        RAISE EXCEPTION 'cluster version % of map "%" is out of range for integer', v, cluster_version.map
            USING ERRCODE = 'numeric_value_out_of_range',
                  HINT = 'PL/Proxy cluster versions are int4; sharding.version_seq has passed 2147483647.';
    END IF;
    -- A map whose rows were written directly, without _touch_map, has no
    -- version yet: 0 still loads once, and its first touch raises it.
    RETURN coalesce(v, 0)::integer;
END
$$;
COMMENT ON FUNCTION sharding.cluster_version(text) IS
    'PL/Proxy configuration version of a map: rises with every change to the map, its pins or its nodes'' DSNs';

-- cluster_config(map text): PL/Proxy settings of a map's cluster.
-- PL/Proxy rejects unknown keys, so only settings it knows are returned.
CREATE FUNCTION sharding.cluster_config(map text) RETURNS TABLE(key text, val text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
BEGIN
    PERFORM FROM sharding.maps AS m WHERE m.map = cluster_config.map;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', cluster_config.map
            USING ERRCODE = 'undefined_object';
    END IF;
    -- modular_mapping: any partition count, not only powers of two.
    -- connection_lifetime: reconnect every 30 minutes, so that a node's
    -- server-side settings and DNS changes are picked up eventually.
    RETURN QUERY VALUES ('modular_mapping'::text, '1'::text),
                        ('connection_lifetime', '1800');
END
$$;
COMMENT ON FUNCTION sharding.cluster_config(text) IS
    'PL/Proxy settings of a map''s cluster (modular_mapping = 1, connection_lifetime)';

-- plproxy_install(): the opt-in bridge from PL/Proxy's cluster
-- configuration API to the three functions above. The functions it creates
-- carry a marker comment; anything else with their names is the user's and
-- is never replaced.
CREATE FUNCTION sharding.plproxy_install() RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    marker constant text := 'created by sharding.plproxy_install(): PL/Proxy cluster configuration from sharding maps';
    fn text;
    existing regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY['plproxy.get_cluster_version(text)',
                              'plproxy.get_cluster_partitions(text)',
                              'plproxy.get_cluster_config(text)'] LOOP
        existing := to_regprocedure(fn);
        IF existing IS NOT NULL AND obj_description(existing, 'pg_proc') IS DISTINCT FROM marker THEN
            RAISE EXCEPTION 'function % already exists and was not created by sharding.plproxy_install()', fn
                USING ERRCODE = 'duplicate_function',
                      HINT = 'Drop or rename it to let sharding configure PL/Proxy, or keep configuring PL/Proxy yourself.';
        END IF;
    END LOOP;

    IF to_regnamespace('plproxy') IS NULL THEN
        CREATE SCHEMA plproxy;
    END IF;

    -- Plain SQL bodies without SET clauses, so that the planner inlines them
    -- into PL/Proxy's prepared queries; everything in them is
    -- schema-qualified and exactly typed.
    CREATE OR REPLACE FUNCTION plproxy.get_cluster_version(cluster_name text) RETURNS integer
        LANGUAGE sql STABLE STRICT
        AS 'SELECT sharding.cluster_version(cluster_name)';
    CREATE OR REPLACE FUNCTION plproxy.get_cluster_partitions(cluster_name text) RETURNS SETOF text
        LANGUAGE sql STABLE STRICT
        AS 'SELECT sharding.cluster_partitions(cluster_name)';
    CREATE OR REPLACE FUNCTION plproxy.get_cluster_config(IN cluster_name text, OUT key text, OUT val text)
        RETURNS SETOF record
        LANGUAGE sql STABLE STRICT
        AS 'SELECT c.key, c.val FROM sharding.cluster_config(cluster_name) AS c';

    EXECUTE format('COMMENT ON FUNCTION plproxy.get_cluster_version(text) IS %L', marker);
    EXECUTE format('COMMENT ON FUNCTION plproxy.get_cluster_partitions(text) IS %L', marker);
    EXECUTE format('COMMENT ON FUNCTION plproxy.get_cluster_config(text) IS %L', marker);
END
$$;
COMMENT ON FUNCTION sharding.plproxy_install() IS
    'creates plproxy.get_cluster_version/partitions/config so that every map is a PL/Proxy cluster of the same name';
-- It creates a schema and functions other roles call: administrators only.
REVOKE ALL ON FUNCTION sharding.plproxy_install() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.plproxy_install() TO sharding_admin;

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
CREATE FUNCTION sharding.copy_shard(map text, logical integer, tbl regclass, key_column name,
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

    -- As it is hashed (varchar as text, a domain as its base); 42703 or 22023.
    key_type := sharding._key_column_type(copy_shard.tbl, copy_shard.key_column);

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
-- The queue (docs/queue.md): claiming work with FOR UPDATE SKIP LOCKED, leases and fenced
-- completion (src/queue/queue.cpp).
--
-- Every function is SECURITY INVOKER: the caller's privileges on the queue
-- table apply. All of them write, so they are VOLATILE and PARALLEL UNSAFE,
-- except queue_stats, which only reads.

-- Per-queue settings, keyed by the table's schema and NAME (oids change
-- across dump and restore). A table's owner (or a member of the owning
-- role) may change its row; everyone may read (claim reads it). Changes
-- reach every backend through the trigger's relcache invalidation.
CREATE TABLE sharding.queue_settings (
    schema_name  text NOT NULL,
    table_name   text NOT NULL,
    max_attempts integer CHECK (max_attempts >= 1),
    PRIMARY KEY (schema_name, table_name),
    -- 1.2: retry backoff (set_backoff); both set or both NULL.
    backoff_base interval CHECK (backoff_base > interval '0'),
    backoff_max  interval CHECK (backoff_max > interval '0')
);
COMMENT ON TABLE sharding.queue_settings IS
    'per-queue settings (max_attempts, retry backoff), keyed by the queue table''s schema and name';
SELECT pg_catalog.pg_extension_config_dump('sharding.queue_settings', '');

-- Whether the current user owns (is a member of the owner of) a table.
CREATE FUNCTION sharding._owns_queue(schema_name text, table_name text) RETURNS boolean
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT coalesce(bool_or(pg_has_role(c.relowner, 'USAGE')), false)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2
    $$;
COMMENT ON FUNCTION sharding._owns_queue(text, text) IS
    'internal: whether the current user owns the named table (row security of sharding.queue_settings)';

ALTER TABLE sharding.queue_settings ENABLE ROW LEVEL SECURITY;
CREATE POLICY queue_settings_read ON sharding.queue_settings FOR SELECT USING (true);
CREATE POLICY queue_settings_insert ON sharding.queue_settings FOR INSERT
    WITH CHECK (sharding._owns_queue(schema_name, table_name));
CREATE POLICY queue_settings_update ON sharding.queue_settings FOR UPDATE
    USING (sharding._owns_queue(schema_name, table_name))
    WITH CHECK (sharding._owns_queue(schema_name, table_name));
CREATE POLICY queue_settings_delete ON sharding.queue_settings FOR DELETE
    USING (sharding._owns_queue(schema_name, table_name));
GRANT SELECT, INSERT, UPDATE, DELETE ON sharding.queue_settings TO PUBLIC;

CREATE FUNCTION sharding._queue_settings_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__queue_settings_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._queue_settings_changed() IS
    'internal: invalidates the cached plans and settings of the queue a sharding.queue_settings row names';
-- A trigger function; nobody calls it directly.
REVOKE ALL ON FUNCTION sharding._queue_settings_changed() FROM PUBLIC;
CREATE TRIGGER queue_settings_changed AFTER INSERT OR UPDATE OR DELETE ON sharding.queue_settings
    FOR EACH ROW EXECUTE FUNCTION sharding._queue_settings_changed();

-- create_queue: the table and the two partial indexes that keep claims an
-- index scan however many done rows pile up: pending rows in claim order
-- (priority DESC, run_at, created, id), and live leases by expiry (so
-- expired ones are found without a scan); and the statement trigger that
-- sends the wakeup NOTIFY (sharding._queue_notify).
-- Trade-off: claim_expires is indexed, so extend_lease is not a HOT update
-- (it adds one entry to the primary key and one to the small lease index).
CREATE FUNCTION sharding._create_queue(parts text[], default_schema text) RETURNS regclass
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

-- Not STRICT (a NULL name is an error, not a NULL table) and search_path
-- not pinned on purpose: an unqualified name goes where the caller's own
-- CREATE TABLE would put it. Every call inside is schema-qualified.
CREATE FUNCTION sharding.create_queue(queue text) RETURNS regclass
    LANGUAGE sql VOLATILE PARALLEL UNSAFE
    AS $$ SELECT sharding._create_queue(pg_catalog.parse_ident(queue), pg_catalog.current_schema()) $$;
COMMENT ON FUNCTION sharding.create_queue(text) IS
    'creates a queue table (id, key, payload, status, owner, claim_expires, created, attempts, run_at, priority) with its claim indexes and wakeup trigger';

-- claim and claim_shards are not STRICT: the queue argument is NULL::table
-- by design; other NULL arguments raise 22023. The C functions of this file
-- pin no search_path (a GUC save and restore per call on the hottest path,
-- and user triggers on the queue would run under pg_catalog): every name and
-- operator of the SQL they generate is schema-qualified instead.
CREATE FUNCTION sharding.claim(queue anyelement, worker text, batch integer DEFAULT 50,
                               lease interval DEFAULT '5 minutes')
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50;
COMMENT ON FUNCTION sharding.claim(anyelement, text, integer, interval) IS
    'leases up to batch due pending or expired rows of the queue table to worker in claim order (priority, run_at, created, id; FOR UPDATE SKIP LOCKED) and returns them in that order';

CREATE FUNCTION sharding.claim_shards(queue anyelement, worker text, shards integer[], shard_count integer,
                                      batch integer DEFAULT 50, lease interval DEFAULT '5 minutes',
                                      key_column name DEFAULT 'key')
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim_shards' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50;
COMMENT ON FUNCTION sharding.claim_shards(anyelement, text, integer[], integer, integer, interval, name) IS
    'as claim, only rows whose shard_of(key_column, shard_count) is one of shards';

-- The fenced functions are not STRICT: attempt DEFAULT NULL means "do not
-- check the attempt"; any other NULL argument raises 22023.
CREATE FUNCTION sharding.complete(queue regclass, id bigint, worker text, attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_complete' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, bigint, text, integer) IS
    'marks the job done if it is processing, owned by worker and (if given) in claim number attempt';

CREATE FUNCTION sharding.complete(queue regclass, ids bigint[], worker text)
    RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_complete_many' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, bigint[], text) IS
    'marks done every listed job that is processing and owned by worker, in one statement; returns how many';

CREATE FUNCTION sharding.fail(queue regclass, id bigint, worker text, retry boolean DEFAULT true,
                              attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_fail' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fail(regclass, bigint, text, boolean, integer) IS
    'same fence as complete; back to pending (retry, while max_attempts allows; run_at pushed back by the queue''s backoff) or failed';

CREATE FUNCTION sharding.extend_lease(queue regclass, id bigint, worker text, lease interval,
                                      attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_extend_lease' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.extend_lease(regclass, bigint, text, interval, integer) IS
    'same fence as complete; sets claim_expires = now() + lease';

CREATE FUNCTION sharding._queue_sql(queue regclass, kind text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__queue_sql' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding._queue_sql(regclass, text) IS
    'internal: SQL text of a queue statement as claim/complete/fail/extend_lease prepare it (for EXPLAIN)';

-- Extras (the contract is silent): max_attempts, queue_stats, enqueue.

-- The key of a queue's row in sharding.queue_settings (its schema and table
-- name), for set_max_attempts and set_backoff: a NULL queue is 22023, a
-- caller who does not own the table (is not a member of its owner) 42501.
-- Not STRICT: NULL raises.
CREATE FUNCTION sharding._queue_settings_key(queue regclass, OUT schema_name text, OUT table_name text)
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    relowner oid;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT n.nspname, c.relname, c.relowner INTO schema_name, table_name, relowner
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = queue;
    IF NOT pg_has_role(relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of queue table %', queue USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
COMMENT ON FUNCTION sharding._queue_settings_key(regclass) IS
    'internal: schema and table name of a queue the caller owns (its sharding.queue_settings key)';

-- Not STRICT: a NULL max_attempts removes the limit.
CREATE FUNCTION sharding.set_max_attempts(queue regclass, max_attempts integer) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
BEGIN
    SELECT k.schema_name, k.table_name INTO nsp, rel FROM sharding._queue_settings_key(queue) k;
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

-- STRICT: NULL queue, NULL result. Scans the whole table.
CREATE FUNCTION sharding.queue_stats(queue regclass,
    OUT pending bigint, OUT processing bigint, OUT expired bigint, OUT done bigint, OUT failed bigint,
    OUT oldest_pending_age interval)
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    EXECUTE format($sql$
        SELECT count(*) FILTER (WHERE status = 'pending'),
               count(*) FILTER (WHERE status = 'processing'),
               count(*) FILTER (WHERE status = 'processing' AND claim_expires < now()),
               count(*) FILTER (WHERE status = 'done'),
               count(*) FILTER (WHERE status = 'failed'),
               now() - min(created) FILTER (WHERE status = 'pending')
          FROM %s$sql$, queue)
    INTO pending, processing, expired, done, failed, oldest_pending_age;
END
$$;
COMMENT ON FUNCTION sharding.queue_stats(regclass) IS
    'job counts by status (expired: processing with a lapsed lease) and the age of the oldest pending job';

-- Not STRICT: key and payload may be NULL; a NULL queue raises 22023.
CREATE FUNCTION sharding.enqueue(queue regclass, key text, payload jsonb DEFAULT NULL) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    new_id bigint;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = '22023';
    END IF;
    -- status always written, as enqueue_many does: a hand-made queue whose
    -- status column has no default still gets a claimable job.
    EXECUTE format('INSERT INTO %s (key, payload, status) VALUES ($1, $2, ''pending'') RETURNING id', queue)
        INTO new_id USING key, payload;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION sharding.enqueue(regclass, text, jsonb) IS
    'adds a pending job (key, payload) to a create_queue table; returns its id';

-- Ordered claims (docs/ordered.md): order per key without giving up dynamic claims
-- (claim_ordered), and claims routed by a map with a safe handoff
-- (claim_node). src/queue/queue_ordered.cpp.

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
    'internal: SQL text of a claim_ordered/claim_node (ordered) statement: a round''s pick (variant bits: 2 shards, 4 node, 8 max_attempts, 16 handoff exclusion, 32 resume) or, with 64, the UPDATE';

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

-- Queues that stay fast under pressure (docs/queue.md; run_at,
-- priority, batch enqueue, retry backoff, purge, health, wakeups) and the
-- 1.2 amendments of the fenced functions (src/queue/queue.cpp).
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
    has_key boolean;
    has_status boolean;
    has_payload boolean;
    has_run_at boolean;
    has_priority boolean;
    ids bigint[];
    cols text := 'key, status';
    vals text := 'k.key, ''pending''';
    arrays text := 'pg_catalog.unnest($1)';
    fields text := 'key';
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
    SELECT coalesce(bool_or(a.attname = 'key'), false), coalesce(bool_or(a.attname = 'status'), false),
           coalesce(bool_or(a.attname = 'payload'), false),
           coalesce(bool_or(a.attname = 'run_at'), false), coalesce(bool_or(a.attname = 'priority'), false)
      INTO has_key, has_status, has_payload, has_run_at, has_priority
      FROM pg_attribute a
     WHERE a.attrelid = queue AND a.attnum > 0 AND NOT a.attisdropped
       AND a.attname IN ('key', 'status', 'payload', 'run_at', 'priority');
    IF enqueue_many.run_at IS NOT NULL AND NOT has_run_at THEN
        RAISE EXCEPTION 'queue table % has no column "run_at" for run_at %', queue, enqueue_many.run_at
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF enqueue_many.priority <> 0 AND NOT has_priority THEN
        RAISE EXCEPTION 'queue table % has no column "priority" for priority %', queue, enqueue_many.priority
            USING ERRCODE = 'invalid_parameter_value';
    -- The columns it writes, checked as the other queue functions check
    -- theirs (22023, not the INSERT's 42703).
    ELSIF NOT has_key OR NOT has_status OR (payloads IS NOT NULL AND NOT has_payload) THEN
        RAISE EXCEPTION 'queue table % lacks column "%"', queue,
            CASE WHEN NOT has_key THEN 'key' WHEN NOT has_status THEN 'status' ELSE 'payload' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(keys) = 0 THEN
        RETURN '{}'::bigint[];
    END IF;
    -- status is always written: a table whose status column has no default
    -- still gets claimable jobs. payload only where payloads are given (its
    -- default otherwise), run_at only where given, priority where the table
    -- has it.
    IF payloads IS NOT NULL THEN
        cols := cols || ', payload';
        vals := vals || ', k.payload';
        arrays := arrays || ', pg_catalog.unnest($2)';
        fields := fields || ', payload';
    END IF;
    IF enqueue_many.run_at IS NOT NULL THEN
        cols := cols || ', run_at';
        vals := vals || ', $3';
    END IF;
    IF has_priority THEN
        cols := cols || ', priority';
        vals := vals || ', $4';
    END IF;
    EXECUTE format('WITH ins AS (INSERT INTO %s (%s) '
                   'SELECT %s FROM ROWS FROM (%s) WITH ORDINALITY AS k(%s, ord) '
                   'ORDER BY k.ord RETURNING id) '
                   'SELECT pg_catalog.array_agg(ins.id ORDER BY ins.id) FROM ins',
                   queue, cols, vals, arrays, fields)
        INTO ids USING keys, payloads, enqueue_many.run_at, enqueue_many.priority;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION sharding.enqueue_many(regclass, text[], jsonb[], timestamptz, smallint) IS
    'inserts one pending job per key (status pending; payloads[i], run_at, priority) in one statement; returns their ids in order';

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
BEGIN
    SELECT k.schema_name, k.table_name INTO nsp, rel FROM sharding._queue_settings_key(queue) k;
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
-- The payload of a wake-up: the key, or, when it would not fit (NOTIFY
-- takes at most 7999 bytes), its longest prefix that fits, cut on a
-- character boundary. Each round drops at most the excess (a character has
-- at most 4 bytes), so it ends on that prefix, in a few rounds.
CREATE FUNCTION sharding._notify_payload(key text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    payload text := key;
BEGIN
    IF octet_length(payload) > 7999 THEN
        payload := left(payload, 7999);
        WHILE octet_length(payload) > 7999 LOOP
            payload := left(payload, length(payload) - greatest(1, (octet_length(payload) - 7999) / 4));
        END LOOP;
    END IF;
    RETURN payload;
END
$$;
COMMENT ON FUNCTION sharding._notify_payload(text) IS
    'internal: a wake-up''s payload: the key, cut on a character boundary to the 7999 bytes NOTIFY takes';

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
        -- A wake-up never makes the insert fail (a long key is cut).
        PERFORM pg_notify(channel, sharding._notify_payload(coalesce(job ->> 'key', '')));
        PERFORM set_config(flag, 'on', true);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sharding._queue_notify() IS
    'internal: statement trigger of queue tables; NOTIFY sharding_<table> (payload: a new claimable job''s key), once per transaction';
-- Rank-guarded transitions (docs/rank.md).
--
-- A guard is a C trigger, sharding._rank_guard, installed on the table as
-- BEFORE UPDATE OF col FOR EACH ROW, so every write path is checked and
-- updates of other columns pay nothing. Its arguments (col, on_regress,
-- ranks...) carry the whole configuration: the trigger needs no lookup per
-- row and keeps working after pg_dump/restore of the table alone.
-- sharding.rank_guards records the same configuration by name (not oid, which
-- changes across dump/restore); guard_rank and unguard_rank keep both in step.

CREATE TABLE sharding.rank_guards (
    schema_name text NOT NULL,
    table_name  text NOT NULL,
    column_name text NOT NULL,
    ranks       text[] CHECK (ranks IS NULL OR pg_catalog.cardinality(ranks) > 0),
    on_regress  text NOT NULL CHECK (on_regress IN ('skip', 'error')),
    created     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (schema_name, table_name, column_name)
);
COMMENT ON TABLE sharding.rank_guards IS
    'rank guards by table and column name; ranks NULL: the column is an enum ranked by its declared order';
COMMENT ON COLUMN sharding.rank_guards.ranks IS 'values lowest first; NULL: the enum''s declared order';
SELECT pg_catalog.pg_extension_config_dump('sharding.rank_guards', '');
GRANT SELECT ON sharding.rank_guards TO PUBLIC;
-- Guards are changed through guard_rank/unguard_rank, which run as the
-- caller: the extension's owner, members of sharding_admin and (since 1.2)
-- the guarded table's owner. A row trigger lets an owner write only the rows
-- of tables it owns (sharding._may_guard). Not row-level security: that
-- would make every pg_dump by a non-superuser fail on this config table.
GRANT INSERT, UPDATE, DELETE ON sharding.rank_guards TO sharding_admin;

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

-- The trigger function. Not revoked: PostgreSQL checks EXECUTE only when a
-- trigger is created (a restore by the table's owner must be able to), and it
-- refuses to run outside a BEFORE UPDATE row trigger.
CREATE FUNCTION sharding._rank_guard() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__rank_guard' LANGUAGE C;
COMMENT ON FUNCTION sharding._rank_guard() IS
    'internal: the rank guard trigger; arguments (column, on_regress, ranks lowest first...)';

-- Internal: the guard trigger(s) of one column of a table, found by function
-- and column number, so renamed tables and columns are still found.
CREATE FUNCTION sharding._rank_guard_triggers(tbl regclass, attnum smallint) RETURNS SETOF name
    LANGUAGE sql STABLE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT t.tgname FROM pg_catalog.pg_trigger AS t
         WHERE t.tgrelid = $1 AND t.tgfoid = 'sharding._rank_guard()'::pg_catalog.regprocedure
           AND pg_catalog.cardinality(t.tgattr::pg_catalog.int2[]) = 1
           AND $2 = ANY (t.tgattr::pg_catalog.int2[]) AND NOT t.tgisinternal
    $$;
COMMENT ON FUNCTION sharding._rank_guard_triggers(regclass, smallint) IS
    'internal: names of the rank guard triggers on one column';

-- Internal: a user column of tbl (42703 otherwise). Shared by guard_rank and unguard_rank.
CREATE FUNCTION sharding._rank_column(tbl regclass, col name, OUT attnum smallint, OUT atttypid oid,
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
COMMENT ON FUNCTION sharding._rank_column(regclass, name) IS
    'internal: number and type of a user column, or 42703';

CREATE FUNCTION sharding.guard_rank(tbl regclass, col name, ranks text[] DEFAULT NULL,
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
COMMENT ON FUNCTION sharding.guard_rank(regclass, name, text[], text) IS
    'guard a column: every UPDATE that would lower its rank is skipped (''skip'') or raises 23514 (''error'')';

CREATE FUNCTION sharding.unguard_rank(tbl regclass, col name) RETURNS void
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
COMMENT ON FUNCTION sharding.unguard_rank(regclass, name) IS 'remove the rank guard of a column';

-- Changing guards needs the extension's owner, sharding_admin, or (since
-- 1.2) the table's owner: EXECUTE for everyone, and the functions refuse
-- anyone else with 42501 (sharding._require_may_guard). The grants are
-- written as 1.1's followed by 1.2's, so that a fresh install and an
-- updated 1.1 hold the same ACL.
REVOKE ALL ON FUNCTION sharding.guard_rank(regclass, name, text[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION sharding.unguard_rank(regclass, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.guard_rank(regclass, name, text[], text) TO sharding_admin;
GRANT EXECUTE ON FUNCTION sharding.unguard_rank(regclass, name) TO sharding_admin;
GRANT EXECUTE ON FUNCTION sharding.guard_rank(regclass, name, text[], text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.unguard_rank(regclass, name) TO PUBLIC;

CREATE FUNCTION sharding.rank_of(tbl regclass, col name, value text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_rank_of' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.rank_of(regclass, name, text) IS
    '0-based rank of value in the column''s guard, or in its enum''s declared order';

-- No SET search_path: a C function whose only SQL names every table, column
-- and operator with its schema (and pinning it would cost every call).
CREATE FUNCTION sharding.advance(tbl regclass, id anyelement, new_value text, col name DEFAULT 'status')
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_advance' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.advance(regclass, anyelement, text, name) IS
    'set col to new_value on the row whose primary key is id, only if that raises its rank; true if it did';
-- Distributed tables (docs/nodes.md). A map's distributed tables are
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
    -- The column must exist (42703) and be of a shard key type (22023).
    PERFORM sharding._key_column_type(tbl, key_column);
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

-- Followers, guarded data nodes, shard_checksum (docs/nodes.md).
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
-- cutting over). The guard trigger (src/nodes/guard.cpp) reads both from a
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
-- The configuration tables a follower copies, in schema sharding: the one
-- list. _publish_config publishes them (publication sharding_config), a
-- node empties them before it follows (_follow), and attach_node waits
-- until the node has synchronised each of them.
CREATE FUNCTION sharding._config_tables() RETURNS name[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT ARRAY['maps', 'nodes', 'shards', 'pins', 'map_versions', 'distributed_tables']::name[] $$;
COMMENT ON FUNCTION sharding._config_tables() IS
    'internal: the configuration tables (schema sharding) that followers copy through publication sharding_config';

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
-- On every table a follower copies (_config_tables, the one list).
DO $$
DECLARE
    t name;
BEGIN
    FOREACH t IN ARRAY sharding._config_tables() LOOP
        EXECUTE pg_catalog.format('CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE '
                                  'ON sharding.%I FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower()', t);
    END LOOP;
END $$;

-- Apply (and the initial copy) run with session_replication_role = replica:
-- the routing-cache invalidations of 20_maps.sql fire there too (ENABLE
-- ALWAYS), but apply fires row triggers only: these invalidate a follower's
-- routing caches for every replicated row (REPLICA: only under apply; the
-- statement triggers of 20_maps.sql cover every other writer).
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['maps', 'shards', 'pins'] LOOP
        EXECUTE pg_catalog.format('CREATE TRIGGER routing_changed_apply AFTER INSERT OR UPDATE OR DELETE ON sharding.%I '
                                  'FOR EACH ROW EXECUTE FUNCTION sharding._routing_changed()', t);
        EXECUTE pg_catalog.format('ALTER TABLE sharding.%I ENABLE REPLICA TRIGGER routing_changed_apply', t);
    END LOOP;
END $$;

-- ------------------------------------------------------------------ guards
CREATE FUNCTION sharding._guard() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding_guard' LANGUAGE C;
COMMENT ON FUNCTION sharding._guard() IS
    'internal: refuses (55000) writes of keys this data node does not own, or of frozen shards (guarded writes)';

-- Installs (or refreshes) the guard trigger zz_sharding_guard on one
-- distributed table, if it exists here. The name sorts last, so the guard
-- sees the row as other BEFORE triggers leave it. Never raises once the
-- table is found: it runs inside logical-replication apply, which an error
-- would stop; a failure is a WARNING and the table stays unguarded. Returns
-- whether it is guarded. C++ (src/nodes/node_steps.cpp).
CREATE FUNCTION sharding._install_guard(schema_name text, table_name text, key_column text, map text)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__install_guard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
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
-- C++ (src/nodes/node_steps.cpp).
CREATE FUNCTION sharding._install_guards() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__install_guards' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
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
-- (over a connection from the coordinator): the lock is held until commit.
-- C++ (src/nodes/node_steps.cpp), as _thaw_shard.
CREATE FUNCTION sharding._freeze_shard(map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__freeze_shard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._freeze_shard(text, integer) IS
    'internal: waits for the shard''s writers, then refuses its guarded writes on this node until _thaw_shard';

CREATE FUNCTION sharding._thaw_shard(map text, logical integer) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__thaw_shard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._thaw_shard(text, integer) IS
    'internal: lifts _freeze_shard; true if the shard was frozen';

-- ------------------------------------------------------------------ attach
-- The DSN a data node's subscription uses to reach this coordinator:
-- sharding.coordinator_dsn if set, else host (the address this session
-- reached the server at, the first Unix socket directory, or localhost),
-- port, database and user of this session. C++ (src/nodes/owner_switch.cpp).
CREATE FUNCTION sharding._coordinator_dsn() RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__coordinator_dsn' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
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

-- Follow's remote calls, on the move's libpq helper (src/nodes/remote_exec.cpp):
-- a connection for the call, the statement in its own transaction there,
-- every wait interruptible, the remote statement cancelled when the caller
-- is; a remote error is raised with its SQLSTATE, message, detail and hint.
-- _remote: the first value of a query (NULL if no row).
CREATE FUNCTION sharding._remote(dsn text, query text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote(text, text) IS
    'internal: first value of a query run on another database (its own connection and transaction)';

-- _remote_exec: runs a command there (CREATE SUBSCRIPTION, ...); its tag.
CREATE FUNCTION sharding._remote_exec(dsn text, command text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote_exec' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote_exec(text, text) IS
    'internal: runs a command on another database (its own connection and transaction)';

-- Whether a connection string leads to this very database (the same
-- server and database, whatever host, port or user it names). A clone of
-- this cluster (pg_basebackup, a copied disk image) has the same system
-- identifier and database name, so those prove nothing; instead a
-- connection is opened, marked with a random application_name, and looked
-- for in this server's pg_stat_activity, which lists every backend of this
-- server and none of another's. The application_name of every backend is
-- visible to every role.
CREATE FUNCTION sharding._leads_here(dsn text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    dl name := sharding._dblink_schema('this operation');
    token text := 'sharding_probe_' || pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '');
    here boolean;
BEGIN
    EXECUTE pg_catalog.format('SELECT %I.dblink_connect($1, $2)', dl) USING token, dsn;
    BEGIN
        EXECUTE pg_catalog.format('SELECT f.v FROM %I.dblink($1, $2) AS f(v text)', dl)
          USING token, pg_catalog.format('SELECT pg_catalog.set_config(%L, %L, false)', 'application_name', token);
        -- This transaction may have read pg_stat_activity before: read it anew.
        PERFORM pg_catalog.pg_stat_clear_snapshot();
        here := EXISTS (SELECT FROM pg_catalog.pg_stat_activity AS a
                         WHERE a.application_name = token AND a.datname = pg_catalog.current_database());
    EXCEPTION WHEN OTHERS THEN
        EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', dl) USING token;
        RAISE;
    END;
    EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', dl) USING token;
    RETURN here;
END $$;
COMMENT ON FUNCTION sharding._leads_here(text) IS
    'internal: whether a connection string leads back to this database (a probe connection seen in pg_stat_activity)';
-- For administrators, as attach_node, which calls it: it connects out.
REVOKE ALL ON FUNCTION sharding._leads_here(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._leads_here(text) TO sharding_admin;

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
        CREATE PUBLICATION sharding_config;
    END IF;
    -- Also a publication made by an older version gets every table.
    FOREACH t IN ARRAY sharding._config_tables() LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication_tables p
                        WHERE p.pubname = 'sharding_config' AND p.schemaname = 'sharding' AND p.tablename = t) THEN
            EXECUTE pg_catalog.format('ALTER PUBLICATION sharding_config ADD TABLE sharding.%I', t);
        END IF;
    END LOOP;
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
    EXECUTE 'TRUNCATE ' || (SELECT pg_catalog.string_agg(pg_catalog.format('sharding.%I', t), ', ')
                              FROM pg_catalog.unnest(sharding._config_tables()) AS t);
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
    PERFORM sharding._check_node(attach_node.node);
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
    dsn := sharding._node_dsn(attach_node.node);
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

    -- The node: not this very database, this extension (1.2) there, not
    -- following as another node. Nothing has changed anywhere yet.
    IF sharding._leads_here(dsn) THEN
        RAISE EXCEPTION 'node "%" is this database: a coordinator cannot follow itself', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Its connection string %s leads back here.', dsn);
    END IF;
    EXECUTE format($q$SELECT * FROM %I.dblink($1, $2) AS f(has_follow boolean, following_as text)$q$, dl)
       INTO facts
      USING dsn, $r$SELECT pg_catalog.to_regprocedure('sharding._follow(text,text)') IS NOT NULL, NULL::text$r$;
    IF NOT facts.has_follow THEN
        RAISE EXCEPTION 'node "%" has no sharding extension of version 1.2 or later', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'CREATE EXTENSION sharding (or ALTER EXTENSION sharding UPDATE) in the node''s database.';
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
          USING dsn, format($s$SELECT (%s - count(*) FILTER (WHERE r.srsubstate IN ('r', 's')))::integer
                                 FROM pg_catalog.pg_subscription AS s
                                 JOIN pg_catalog.pg_subscription_rel AS r ON r.srsubid = s.oid
                                WHERE s.subname = %L$s$, cardinality(sharding._config_tables()), sub);
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
    PERFORM sharding._check_node(detach_node.node);
    dsn := sharding._node_dsn(detach_node.node);
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
-- Observing load (docs/observe.md).
--
-- distribution, whales and map_load each read the table once: one scan, one
-- aggregate grouped by the key (or by sharding.shard_of(key, n)), with the
-- key column in its own type so that the right shard_of overload hashes it.
-- They are plpgsql because the query names the caller's table and column:
-- identifiers go through format('%I') / regclass output, values are passed
-- as parameters. All run as the caller (SECURITY INVOKER), who needs SELECT
-- on the table. STABLE: they only read. PARALLEL RESTRICTED: they may scan a
-- temporary table, which a parallel worker cannot. STRICT: a NULL table,
-- column or count describes nothing, so no rows. Rows whose key is NULL lie
-- on no shard (shard_of(NULL) is NULL) and are not counted.

-- The histogram bar every observing function draws (src/core/observe_core.hpp).
CREATE FUNCTION sharding.bar(value float8, max float8, width integer DEFAULT 40) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_bar' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.bar(float8, float8, integer) IS
    'Unicode bar of value relative to max: width characters at max, to the nearest eighth; empty for 0';

CREATE FUNCTION sharding.imbalance(loads anyarray) RETURNS float8
    AS 'MODULE_PATHNAME', 'sharding_imbalance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.imbalance(anyarray) IS
    'max / mean of a numeric array, NULL elements skipped; NULL when empty or all zero (1.0 = perfectly even)';

-- Internal: SQL for the text form of a key expression of type t, the form
-- pins match on and whales reports: bytea always in hex (\x...), whatever
-- bytea_output says; the other key types as their ::text.
CREATE FUNCTION sharding._key_text_sql(expr text, t regtype) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT CASE WHEN t = 'bytea'::regtype
                    THEN pg_catalog.format('pg_catalog.concat(pg_catalog.chr(92), ''x'', pg_catalog.encode(%s, ''hex''))', expr)
                    ELSE pg_catalog.format('(%s)::text', expr) END
    $$;
COMMENT ON FUNCTION sharding._key_text_sql(text, regtype) IS
    'internal: SQL of a key''s text form (bytea as hex whatever bytea_output says)';

CREATE FUNCTION sharding.distribution(tbl regclass, key_column name, shards integer)
    RETURNS TABLE (shard integer, rows bigint, share float8, bar text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL RESTRICTED
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF shards < 1 THEN
        RAISE EXCEPTION 'shard count must be between 1 and 2147483647, got %', shards
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._key_column_type(tbl, key_column);
    -- share is NULL when the table has no keyed row: 0 / 0 has no share.
    RETURN QUERY EXECUTE format(
        $q$SELECT c.shard, c.n, c.n::float8 / NULLIF(sum(c.n) OVER (), 0)::float8,
                  sharding.bar(c.n, max(c.n) OVER (), 40)
             FROM (SELECT g.shard::integer AS shard, COALESCE(k.n, 0)::bigint AS n
                     FROM pg_catalog.generate_series(0, $1 - 1) AS g(shard)
                     LEFT JOIN (SELECT sharding.shard_of(t.%1$I, $1) AS shard, pg_catalog.count(*) AS n
                                  FROM %2$s AS t
                                 WHERE t.%1$I IS NOT NULL
                                 GROUP BY 1) AS k USING (shard)) AS c
            ORDER BY c.shard$q$,
        key_column, tbl)
    USING shards;
END
$$;
COMMENT ON FUNCTION sharding.distribution(regclass, name, integer) IS
    'rows of tbl on each shard 0..shards-1 by shard_of(key_column, shards), with share and a bar; one scan';

CREATE FUNCTION sharding.whales(tbl regclass, key_column name, shards integer,
                                min_share float8 DEFAULT 0.25)
    RETURNS TABLE (key text, rows bigint, shard integer, share_of_shard float8, share_of_total float8)
    LANGUAGE plpgsql STABLE STRICT PARALLEL RESTRICTED
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t regtype;
BEGIN
    IF shards < 1 THEN
        RAISE EXCEPTION 'shard count must be between 1 and 2147483647, got %', shards
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (min_share >= 0 AND min_share <= 1) THEN
        RAISE EXCEPTION 'min_share must be between 0 and 1, got %', min_share
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    t := sharding._key_column_type(tbl, key_column);
    -- Grouped by key (which decides the shard): each key is hashed once.
    RETURN QUERY EXECUTE format(
        $q$SELECT w.key, w.n, w.shard, w.n::float8 / w.shard_n::float8, w.n::float8 / w.total_n::float8
             FROM (SELECT s.key, s.n, s.shard,
                          sum(s.n) OVER (PARTITION BY s.shard) AS shard_n,
                          sum(s.n) OVER () AS total_n
                     FROM (SELECT %3$s AS key, k.n, sharding.shard_of(k.key, $1) AS shard
                             FROM (SELECT t.%1$I AS key, pg_catalog.count(*) AS n
                                     FROM %2$s AS t
                                    WHERE t.%1$I IS NOT NULL
                                    GROUP BY 1) AS k) AS s) AS w
            WHERE w.n::float8 / w.shard_n::float8 >= $2
            ORDER BY w.n DESC, w.shard, w.key COLLATE "C"$q$,
        key_column, tbl, sharding._key_text_sql('k.key', t))
    USING shards, min_share;
END
$$;
COMMENT ON FUNCTION sharding.whales(regclass, name, integer, float8) IS
    'keys of tbl holding at least min_share of their shard''s rows, largest first; one scan';

-- map_load counts each row where sharding.node_for (docs/maps.md)
-- sends it, in one scan grouped by node_for(map, key): the router's own
-- per-backend cache decides, so the picture can never disagree with routing.
-- (Measured: as fast as a plain GROUP BY shard_of, and faster than joining
-- the pins in SQL.) node_for is looked up when map_load runs, so this file
-- installs in any order. Every node owning shards or pins of the map is
-- listed, also with no rows: first the owners by their lowest logical shard,
-- then pin-only nodes by name (the PL/Proxy partition order).
CREATE FUNCTION sharding.map_load(map text, tbl regclass, key_column name)
    RETURNS TABLE (node text, logical_shards integer, pinned_keys integer, rows bigint, share float8,
                   bar text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL RESTRICTED
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.maps AS m WHERE m.map = map_load.map) THEN
        RAISE EXCEPTION 'map "%" does not exist', map USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM sharding._key_column_type(tbl, key_column);
    RETURN QUERY EXECUTE format(
        $q$WITH routed AS (
                SELECT sharding.node_for($1, t.%1$I) AS node, pg_catalog.count(*) AS n
                  FROM %2$s AS t
                 WHERE t.%1$I IS NOT NULL
                 GROUP BY 1),
            nodes AS (
                SELECT x.node, sum(x.owned)::integer AS owned, sum(x.pinned)::integer AS pinned,
                       min(x.first) AS first
                  FROM (SELECT s.node, 1 AS owned, 0 AS pinned, s.logical AS first
                          FROM sharding.shards AS s WHERE s.map = $1
                        UNION ALL
                        SELECT p.node, 0, 1, NULL FROM sharding.pins AS p WHERE p.map = $1
                        UNION ALL
                        SELECT r.node, 0, 0, NULL FROM routed AS r) AS x
                 GROUP BY x.node)
            SELECT d.node, d.owned, d.pinned, COALESCE(r.n, 0)::bigint,
                   COALESCE(r.n, 0)::float8 / NULLIF(sum(r.n) OVER (), 0)::float8,
                   sharding.bar(COALESCE(r.n, 0), max(COALESCE(r.n, 0)) OVER (), 40)
              FROM nodes AS d
              LEFT JOIN routed AS r ON r.node IS NOT DISTINCT FROM d.node
             ORDER BY d.first NULLS LAST, d.node COLLATE "C"$q$,
        key_column, tbl)
    USING map;
END
$$;
COMMENT ON FUNCTION sharding.map_load(text, regclass, name) IS
    'rows of tbl per node of the map, routed as node_for routes them (pins first), with shards, pins, share and bar';

-- What docs/observe.md counts beyond load: fan-out statements, the
-- worst shard's lag, rebalancing by measured load.

-- Fan-out counters (src/observe/fanout.cpp). They live in shared memory, which only
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

-- fanout_info(): the counters' capacity and evictions. sharding.fanout_max
-- (a server setting, 4096 by default) entries hold the counters of as many
-- (database, distributed table) pairs; when all are taken, the least-used
-- tables are evicted, as pg_stat_statements evicts statements: an evicted
-- table shows zeros in fanout_stats until it is counted again, from then
-- on. slots: sharding.fanout_max; used: tables counted now, all databases;
-- evicted: tables of this database evicted since its last fanout_reset()
-- (or the server's start); evicted_all: evictions in all databases since the
-- server started. VOLATILE: shared counters. PARALLEL RESTRICTED: read in
-- the leader. Not STRICT: no argument. Without preload: a NOTICE, no row.
CREATE FUNCTION sharding.fanout_info(OUT slots integer, OUT used integer, OUT evicted bigint,
                                     OUT evicted_all bigint)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'sharding_fanout_info' LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 1;
COMMENT ON FUNCTION sharding.fanout_info() IS
    'fan-out counters: slots (sharding.fanout_max), used, tables of this database evicted since the last reset, evictions in all databases';

-- fanout_reset(): zeroes this database's counters. VOLATILE, PARALLEL
-- UNSAFE: it writes shared state. Everyone's picture changes, so it is an
-- admin function, as pg_stat_statements_reset is.
CREATE FUNCTION sharding.fanout_reset() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding_fanout_reset' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fanout_reset() IS
    'zeroes the fan-out counters of this database; fanout_stats.since becomes now, fanout_info().evicted zero';
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
-- moves as the planner (src/core/rebalance.cpp) finds. Not STRICT: NULL
-- arguments raise 22023. Locks the map as rebalance does.
CREATE FUNCTION sharding.rebalance_by_load(map text, nodes text[], loads float8[],
                                           max_imbalance float8 DEFAULT 1.10, dry_run boolean DEFAULT false)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    bad integer;
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
    RETURN QUERY SELECT * FROM sharding._rebalance_apply($1, nodes, dry_run, 'rebalance_by_load', loads, max_imbalance);
END $$;
COMMENT ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) IS
    'moves shards so the largest node load is at most max_imbalance x the mean (or as low as shards allow), fewest moves; each raises the shard''s epoch; dry_run only reports';

CREATE FUNCTION sharding._rebalance_by_load_plan(owners text[], nodes text[], loads float8[],
                                                 max_imbalance float8)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', 'sharding__rebalance_by_load_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._rebalance_by_load_plan(text[], text[], float8[], float8) IS
    'internal: the load-aware plan (src/core/rebalance.cpp), ordered by logical shard';

-- Changing maps: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) TO sharding_admin;
-- Online moves (docs/moves.md). move_shard_online(map, logical, node) and
-- isolate(map, key, node) carry rows between data nodes on PostgreSQL's own
-- logical replication, driven from the coordinator over libpq connections (CREATE and
-- DROP SUBSCRIPTION cannot run in a transaction block, so every remote step
-- is its own autocommit statement on a separate connection).
--
-- How a move runs (named objects: see _move_name):
--   1. journal  a row in sharding.move_journal, committed at once through a
--               loopback connection, so that a later call knows what a
--               crashed or failed one left behind and undoes it;
--   2. source   CREATE PUBLICATION of the map's distributed tables, then a
--               row in sharding.move_decoding naming the shard, then a
--               logical replication slot made over a replication
--               connection with an exported snapshot; its output plugin is
--               this library (src/nodes/move_decoder.cpp), which wraps
--               pgoutput and drops every change outside the moving shard
--               before it is encoded;
--   3. copy     the destination pulls the shard's rows in C++
--               (_move_pull, src/nodes/move_copy.cpp): a libpq connection
--               to the source under the exported snapshot runs
--               COPY (SELECT ... WHERE <shard>) TO STDOUT, fed into the
--               local table through BeginCopyFrom, under
--               session_replication_role = replica (the guard does not
--               fire). Copy and stream never overlap: the copy sees exactly
--               what was committed before the slot's starting point;
--   4. stream   CREATE SUBSCRIPTION (copy_data = false, the slot of step 2):
--               plain PostgreSQL apply of the changes committed since;
--   5. catch up until the slot's confirmed_flush_lsn reaches the source's
--               flushed WAL position quickly (the backlog is small);
--   6. cutover  _freeze_shard at the source (waits for its in-flight
--               writers, then its guard refuses the shard's keys), wait
--               until the destination confirmed the source's last WAL
--               position, switch the owner on the coordinator (move_shard:
--               epoch + 1; isolate: pin), wait until the source shows it
--               (it follows the coordinator), thaw it (it now refuses by
--               ownership), wait until the destination shows it;
--   7. clean    drop the subscription, the slot and the publication, then
--               delete the shard's rows at the source (one transaction).
-- The refusal window is step 6 only: a few round trips and the last
-- moments of replication lag, whatever the shard's size.
--
-- The orchestration is C++ (src/nodes/move_orchestrate.cpp; the functions
-- below marked LANGUAGE C keep their SQL names as thin wrappers); its main
-- block runs in a subtransaction, as a PL/pgSQL EXCEPTION block did.
-- Failure or cancel before the switch: the handler undoes steps
-- 2-6 (drops the subscription, slot and publication, deletes what
-- the copy put at the destination, thaws) and re-raises; the old owner never
-- stopped owning. After the switch: the handler finishes step 7. If the
-- handler itself cannot (a node is down, the coordinator crashed), the
-- journal row stays and the next call for that shard, with any node, does it
-- first.

-- The move journal (docs/moves.md): one row per
-- move, of a rebalance job or of a direct move_shard_online / isolate call,
-- kept after it ends. Local to the coordinator (not followed). Every step
-- commits its phase here BEFORE it acts (through the engine's own
-- connection, not the caller's transaction), so after a crash the row says
-- what to undo or finish: phase 'queued' (nothing done), 'copying' and
-- 'catching_up' and 'cutover' (the switch has not committed: undo),
-- 'cleanup' (the switch has committed, atomically with this phase: finish),
-- then 'done', 'failed' or 'cancelled'.
CREATE SEQUENCE sharding.move_journal_seq;
CREATE TABLE sharding.move_journal (
    move          bigint PRIMARY KEY DEFAULT pg_catalog.nextval('sharding.move_journal_seq'),
    job           bigint,             -- the rebalance job; NULL for a direct call
    map           text NOT NULL,
    logical       integer NOT NULL,
    key           text,               -- isolate: the key; NULL for a shard move
    source        text NOT NULL,
    destination   text NOT NULL,
    phase         text NOT NULL DEFAULT 'queued'
                  CHECK (phase IN ('queued', 'copying', 'catching_up', 'cutover', 'cleanup', 'done', 'failed', 'cancelled')),
    rows_copied   bigint NOT NULL DEFAULT 0,
    bytes_copied  bigint NOT NULL DEFAULT 0,
    lag_bytes     bigint,             -- WAL the destination still has to apply; NULL before catch-up
    started       timestamptz,
    phase_started timestamptz,
    finished      timestamptz,
    error         text,
    -- internal: how the error was raised (re-raised by move_shard_online)
    error_state   text,
    error_detail  text,
    error_hint    text,
    -- internal: the executing backend (its session-level advisory lock on
    -- (hashtext('sharding.move_journal'), move) says it is alive)
    pid           integer,
    new_epoch     bigint,             -- internal: the shard's epoch after the switch
    rows_moved    bigint,             -- internal: rows deleted at the source (isolate's result)
    undone        boolean NOT NULL DEFAULT false,  -- internal: the rollback has completed
    created       timestamptz NOT NULL DEFAULT pg_catalog.now()
);
-- At most one live move per shard, and per key for isolate.
CREATE UNIQUE INDEX move_journal_live_shard ON sharding.move_journal (map, logical)
    WHERE phase NOT IN ('done', 'failed', 'cancelled');
CREATE UNIQUE INDEX move_journal_live_key ON sharding.move_journal (map, key)
    WHERE key IS NOT NULL AND phase NOT IN ('done', 'failed', 'cancelled');
CREATE INDEX move_journal_job ON sharding.move_journal (job) WHERE job IS NOT NULL;
COMMENT ON TABLE sharding.move_journal IS
    'the move journal: one row per online move (of a job or a direct call), its phase, progress and error';
SELECT pg_catalog.pg_extension_config_dump('sharding.move_journal', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_journal_seq', '');
ALTER SEQUENCE sharding.move_journal_seq OWNED BY sharding.move_journal.move;
GRANT USAGE ON SEQUENCE sharding.move_journal_seq TO sharding_admin;
GRANT SELECT ON sharding.move_journal TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.move_journal TO sharding_admin;

-- 1.2's journal, as a view of the moves in progress (or interrupted).
CREATE VIEW sharding.moves AS
    SELECT j.map, j.logical, j.key, j.source, j.destination,
           CASE j.phase WHEN 'queued' THEN 'setup' WHEN 'catching_up' THEN 'catchup'
                        WHEN 'cleanup' THEN 'switched' ELSE j.phase END AS state,
           coalesce(j.started, j.created) AS started
      FROM sharding.move_journal j
     WHERE j.phase NOT IN ('done', 'failed', 'cancelled');
COMMENT ON VIEW sharding.moves IS
    'online moves in progress (or interrupted: the next move of the shard cleans them up); see move_journal';
GRANT SELECT ON sharding.moves TO PUBLIC;

-- _refuse_owner_switch(map, fn): 55000 naming a distributed table of the
-- map: switching owners alone (move_shard, rebalance, rebalance_by_load)
-- would leave its rows on the old owner, where nothing routes any more. On
-- a follower it passes (the caller refuses there with its own message).
-- C++ (src/nodes/move_journal.cpp).
CREATE FUNCTION sharding._refuse_owner_switch(map text, fn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__refuse_owner_switch' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._refuse_owner_switch(text, text) IS
    'internal: 55000 if a map has distributed tables (owner switches alone would strand their rows)';

-- _move_name(map, logical): the name of the publication, slot, subscription
-- and replication origin of a move. Deterministic, so that a later call
-- finds what a crashed one left; slot names allow only [a-z0-9_], so other
-- map names are folded (lower case, other characters '_', 16 characters)
-- and told apart by the first 8 hex digits of their md5. C++
-- (src/nodes/move_orchestrate.cpp).
CREATE FUNCTION sharding._move_name(map text, logical integer) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_name' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_name(text, integer) IS
    'internal: name of the publication, slot, subscription and trigger of an online move';

-- The move's remote connections, in C++ (src/nodes/remote_exec.cpp): named
-- libpq connections of this session (kept across transactions, closed by
-- _dbl_disconnect, a new _dbl_connect of the name, or the session's end).
-- Every wait is interruptible; a statement running there when the caller
-- is cancelled or fails is cancelled (PQcancel) and its results consumed
-- before the error goes on (a cancelled cutover's _freeze_shard must not
-- freeze the shard after the undo thawed it). Remote errors are raised with
-- their SQLSTATE, message, detail and hint. Remote statements run with
-- search_path = pg_catalog, pg_temp (every name in them is qualified
-- anyway), and commit synchronously: a commit whose WAL waited for the WAL
-- writer would reach walsenders, and so the destination and the followers,
-- that much later, inside the cutover's refusal window. No dblink.
CREATE FUNCTION sharding._dbl_connect(conn text, dsn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_connect' LANGUAGE C VOLATILE;
CREATE FUNCTION sharding._dbl_disconnect(conn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_disconnect' LANGUAGE C VOLATILE STRICT;
CREATE FUNCTION sharding._dbl_open(conn text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__dbl_open' LANGUAGE C VOLATILE STRICT;
CREATE FUNCTION sharding._dbl_value(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_value' LANGUAGE C VOLATILE STRICT;
CREATE FUNCTION sharding._dbl_run(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_run' LANGUAGE C VOLATILE STRICT;

REVOKE ALL ON FUNCTION sharding._dbl_connect(text, text), sharding._dbl_disconnect(text),
    sharding._dbl_open(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._dbl_connect(text, text), sharding._dbl_disconnect(text),
    sharding._dbl_open(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    TO sharding_admin;
COMMENT ON FUNCTION sharding._dbl_connect(text, text) IS 'internal: opens a named remote connection of this session (reopens one of that name)';
COMMENT ON FUNCTION sharding._dbl_disconnect(text) IS 'internal: cancels and closes a named remote connection if open';
COMMENT ON FUNCTION sharding._dbl_open(text) IS 'internal: whether a named remote connection is open';
COMMENT ON FUNCTION sharding._dbl_value(text, text) IS 'internal: first value of a query (or a command''s tag) over a named remote connection';
COMMENT ON FUNCTION sharding._dbl_run(text, text) IS 'internal: runs SQL over a named remote connection, interruptibly; the last command''s tag';

-- The copy and the slot, in C++ (src/nodes/move_copy.cpp): the slot is
-- created over a replication connection with an exported snapshot (held
-- open until _move_slot_close or the end of the transaction), and the
-- destination pulls the shard's rows under that snapshot with
-- COPY ... TO STDOUT fed into BeginCopyFrom: copy and stream never overlap,
-- no program runs, the source's DSN is read from sharding.nodes there.
CREATE FUNCTION sharding._move_slot_create(source text, slot text, plugin text, options text,
                                           OUT lsn pg_lsn, OUT snapshot text)
    AS 'MODULE_PATHNAME', 'sharding__move_slot_create' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_slot_create(text, text, text, text) IS
    'internal: creates a move''s logical slot at the source over a replication connection, exporting its snapshot';
CREATE FUNCTION sharding._move_slot_close(slot text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_slot_close' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_slot_close(text) IS
    'internal: closes the replication connection holding a move''s exported snapshot';
CREATE FUNCTION sharding._move_pull(source text, snapshot text, rel regclass, columns text[], query text)
    RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding__move_pull' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_pull(text, text, regclass, text[], text) IS
    'internal: at a move''s destination, pulls COPY (query) TO STDOUT from the source under a snapshot into rel; {rows, bytes}';
REVOKE ALL ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) TO sharding_admin;
-- _move_nice(step): a session of a move's copy lowers its own priority
-- (sharding.move_nice, src/nodes/move_copy.cpp).
CREATE FUNCTION sharding._move_nice(step integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__move_nice' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_nice(integer) IS
    'internal: raises this backend''s nice value by step (0-19) for a move''s copy; returns the new value';
REVOKE ALL ON FUNCTION sharding._move_nice(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_nice(integer) TO sharding_admin;

-- What a move's decoder carries (src/nodes/move_decoder.cpp), one row per
-- slot, on the source: written before the slot is created, deleted with it.
-- A user_catalog_table: logical decoding reads it under its historic
-- snapshot. The guard refuses key changes into or out of these shards
-- while a row is here.
CREATE TABLE sharding.move_decoding (
    slot        text PRIMARY KEY,
    map         text NOT NULL,
    shards      integer NOT NULL,
    logical     integer NOT NULL,
    key         text,                       -- isolate: the one key
    pins        text[] NOT NULL DEFAULT '{}',  -- a shard move leaves these keys behind
    tables      oid[] NOT NULL,             -- the map's distributed tables here
    key_columns text[] NOT NULL             -- their key columns, in the same order
) WITH (user_catalog_table = true);
COMMENT ON TABLE sharding.move_decoding IS
    'internal: what the decoder of an online move''s slot carries (source side; one row per slot)';
GRANT SELECT ON sharding.move_decoding TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.move_decoding TO sharding_admin;
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.move_decoding
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
ALTER TABLE sharding.move_decoding ENABLE ALWAYS TRIGGER local_changed;

-- _move_tables(map): the map's distributed tables that exist here, with what
-- a move needs: qualified name, key column and type (a domain's base
-- type), column lists (generated columns left out), primary key. Read from
-- the catalogs in C++ (src/nodes/move_orchestrate.cpp), without locking the
-- tables.
CREATE FUNCTION sharding._move_tables(map text)
    RETURNS TABLE(rel text, key_column text, key_type regtype, cols text, coldefs text, vals text,
                  pk_match text)
    AS 'MODULE_PATHNAME', 'sharding__move_tables' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_tables(text) IS
    'internal: the distributed tables of a map with the column lists an online move needs';

-- _move_filter_sql(rel_key_column, key_type, shards, logical, key, pins):
-- the WHERE condition selecting what a move carries, evaluated where the
-- rows are (source or destination): an unpinned key of the shard, or the
-- one key (compared in the column's type, so that an index can serve it).
-- Not STRICT: key NULL selects the shard, pins NULL leaves none out. C++
-- (src/nodes/move_orchestrate.cpp); the pins' text form is
-- sharding._key_text_sql's.
CREATE FUNCTION sharding._move_filter_sql(key_column text, key_type regtype, shards integer, logical integer,
                                          key text, pins text[]) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_filter_sql' LANGUAGE C IMMUTABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_filter_sql(text, regtype, integer, integer, text, text[]) IS
    'internal: SQL condition selecting the rows an online move carries';

-- _move_drop_replication(name): drops the move's subscription at the
-- destination (connection sharding_move_dst) without contacting the source
-- (which may be down), then its slot and publication at the source
-- (connection sharding_move_src), waiting for the slot to be released.
CREATE FUNCTION sharding._move_drop_replication(name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_drop_replication' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_drop_replication(text) IS
    'internal: drops an online move''s subscription, slot and publication';

-- _move_drop_triggers(map, name): drops the move's filter trigger from the
-- map's tables at the destination.
CREATE FUNCTION sharding._move_drop_triggers(map text, name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_drop_triggers' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_drop_triggers(text, text) IS
    'internal: drops an online move''s filter triggers at the destination';

-- _move_delete_rows(conn, map, logical, key): deletes what a move carries
-- from the map's tables over a connection (the source after a move, the
-- destination after a failed one), bypassing triggers and the guard (that
-- node does not own these rows); returns how many rows. C++
-- (src/nodes/move_delete.cpp): one remote transaction under a replication
-- origin of the move's own, one _move_delete_local call per table there.
-- Not STRICT: key is NULL for a shard move.
CREATE FUNCTION sharding._move_delete_rows(conn text, map text, logical integer, key text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_delete_rows' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_delete_rows(text, text, integer, text) IS
    'internal: deletes the rows an online move carries on one node (bypassing its guard)';

-- _move_delete_local(rel, filter): on that node, DELETE FROM rel WHERE
-- filter (one condition), with the BEFORE ROW DELETE triggers that cannot
-- fire in the session (the guard's, under session_replication_role =
-- replica) left out for the statement: PostgreSQL would lock every row
-- before finding that none fires. Returns the rows deleted.
CREATE FUNCTION sharding._move_delete_local(rel regclass, filter text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_delete_local' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_delete_local(regclass, text) IS
    'internal: deletes a move''s rows of one table on this node, idle row triggers left out';
REVOKE ALL ON FUNCTION sharding._move_delete_local(regclass, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_delete_local(regclass, text) TO sharding_admin;

-- _move_call(conn, fn, map, logical): calls sharding.<fn>(map, logical)
-- there if the node has it (_freeze_shard/_thaw_shard exist where the
-- extension is 1.2).
CREATE FUNCTION sharding._move_call(conn text, fn text, map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_call' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_call(text, text, text, integer) IS
    'internal: calls sharding._freeze_shard or _thaw_shard on a node';

-- _move_sees_switch(conn, map, logical, key, node, epoch): whether that
-- node's (followed) configuration already shows the switch. A node that
-- does not follow this coordinator counts as seeing it: it has no guard
-- to consult its copy.
CREATE FUNCTION sharding._move_sees_switch(conn text, map text, logical integer, key text, node text,
                                           new_epoch bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_sees_switch' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
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
    AS 'MODULE_PATHNAME', 'sharding__move_finish' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_finish(text, integer, text, text, bigint) IS
    'internal: completes an online move after its switch (thaw, drop replication, delete source rows)';

-- _move_undo(map, logical, key): undoes a move whose switch has not
-- committed: drops its replication objects and triggers, deletes what it
-- copied to the destination, thaws the source, closes the journal.
CREATE FUNCTION sharding._move_undo(map text, logical integer, key text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_undo' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_undo(text, integer, text) IS
    'internal: undoes an online move that has not switched (drops replication, deletes copies, thaws)';

-- _move_connect(source, destination): opens sharding_move_src, _dst and
-- _self; 55000 for a node without a connection string (the destination is
-- checked first).
CREATE FUNCTION sharding._move_connect(source text, destination text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_connect' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_connect(text, text) IS
    'internal: opens the remote connections of an online move (55000 for a node without DSN)';

CREATE FUNCTION sharding._move_disconnect() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_disconnect' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_disconnect() IS 'internal: closes the remote connections of an online move';

-- _move_wait_flush(name, seconds): waits until the move's slot at the
-- source has confirmed the source's flushed WAL position; returns the
-- seconds waited (seconds NULL: no limit). 55000 after `seconds` (the
-- apply is stuck: see the destination's log). While it waits, the live
-- move's lag_bytes in the journal (WAL the destination still has to
-- confirm) is kept current, committed at once, at least every quarter of a
-- second. Interruptible: a cancel ends it between two polls, and a poll
-- running at the source is cancelled there.
CREATE FUNCTION sharding._move_wait_flush(name text, seconds float8) RETURNS float8
    AS 'MODULE_PATHNAME', 'sharding__move_wait_flush' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_wait_flush(text, float8) IS
    'internal: waits until an online move''s destination has confirmed the source''s current WAL position';

-- _move_online(map, logical, key, node): the engine of move_shard_online
-- (key NULL) and isolate (key given, logical its shard). See the top of
-- this file. Returns the shard's epoch afterwards and the rows deleted at
-- the source.
CREATE FUNCTION sharding._move_online(map text, logical integer, key text, node text,
                                      OUT new_epoch bigint, OUT moved bigint)
    AS 'MODULE_PATHNAME', 'sharding__move_online' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_online(text, integer, text, text) IS
    'internal: moves a logical shard (or one key) online; the engine of move_shard_online and isolate';

-- _move_journal(sql): runs a statement on the journal through the engine's
-- own connection to this database (sharding_move_self), so that it commits
-- at once, whatever the caller's transaction does; returns its first value.
CREATE FUNCTION sharding._move_journal(sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_journal' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_journal(text) IS
    'internal: runs a statement on the move journal in its own transaction (committed at once)';

-- _move_phase(map, logical, phase): the live move of the shard enters a
-- phase (committed before the phase acts).
CREATE FUNCTION sharding._move_phase(map text, logical integer, phase text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_phase' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_phase(text, integer, text) IS
    'internal: records the phase a live move enters, before it acts';

-- _move_stop_backends(conn, name): ends every other session of that
-- node's database whose application_name is the move's name (a copy left
-- running by a cancelled or dead caller) and waits until they are gone.
CREATE FUNCTION sharding._move_stop_backends(conn text, name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_stop_backends' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_stop_backends(text, text) IS
    'internal: ends what a move''s sessions still run on a node, and waits for them';

-- _move_watch(subscription): at a move's destination, the coordinator's
-- connection (the move's controller) watches the move's subscription until
-- it ends or calls _move_watch(NULL): a session that ends first (the
-- coordinator crashed, was killed or stopped) stops the subscription's
-- apply worker, and with it what the worker had received but not applied.
-- The source's decoder sends nothing more once the controller is gone
-- there too (src/nodes/move_controller.hpp). The caller must own the
-- subscription. Not STRICT: NULL stops watching.
CREATE FUNCTION sharding._move_watch(subscription text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_watch' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_watch(text) IS
    'internal: at a move''s destination, stops the subscription''s worker when this session (the controller''s) ends';
REVOKE ALL ON FUNCTION sharding._move_watch(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_watch(text) TO sharding_admin;

-- The journal interface, in C++ (src/nodes/move_journal.cpp). The executor
-- of a move holds the session-level advisory lock
-- (hashtext('sharding.move_journal'), move): a move whose lock is free and
-- whose phase is not final was interrupted.

-- _move_resolve(move): rolls back (or, if its switch had committed,
-- finishes) a move whose executor is gone, from its journal row; returns
-- the final phase. The caller holds the move's advisory lock.
CREATE FUNCTION sharding._move_resolve(id bigint, final text DEFAULT 'failed') RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_resolve' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_resolve(bigint, text) IS
    'internal: rolls back or finishes an interrupted move from its journal row';

-- _move_enqueue(job, map, logical, key, destination): a 'queued' journal
-- row (committed at once); the source is the current owner (for a key, its
-- pinned node). 55006 while the shard (or the key) has a live move.
CREATE FUNCTION sharding._move_enqueue(job bigint, map text, logical integer, key text, destination text)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_enqueue' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_enqueue(bigint, text, integer, text, text) IS
    'internal: journals a queued online move (of a job, or a direct call) and returns its id';

-- _move_execute(move): carries out a queued move, or resumes / rolls back
-- an interrupted one, to its end; returns 'done', 'failed' or 'cancelled'.
-- A failure is recorded (error) and returned, not raised; a cancel of the
-- caller rolls back, records 'cancelled' and is re-raised.
CREATE FUNCTION sharding._move_execute(id bigint) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_execute' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_execute(bigint) IS
    'internal: carries out (or resumes, or rolls back) a journaled move to its end; returns its final phase';

-- _move_cancel(move): a queued move becomes 'cancelled'; a move in flight
-- is told to stop (its executor is cancelled and rolls back); one whose
-- executor died is rolled back here; false if it had already ended.
CREATE FUNCTION sharding._move_cancel(id bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_cancel' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_cancel(bigint) IS
    'internal: cancels a queued or running move (it rolls back); false if it had ended';

-- _move_recover(): resumes or rolls back every move whose executor died
-- (crash, kill -9, restart); returns how many. A move it cannot resolve
-- now (a node is down) stays, with a WARNING.
CREATE FUNCTION sharding._move_recover() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__move_recover' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_recover() IS
    'internal: rolls back or finishes every move whose executor died; returns how many';

REVOKE ALL ON FUNCTION sharding._move_journal(text), sharding._move_phase(text, integer, text),
    sharding._move_stop_backends(text, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_journal(text), sharding._move_phase(text, integer, text),
    sharding._move_stop_backends(text, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    TO sharding_admin;

-- _move_raise(move): raises the recorded error of a move that did not end
-- 'done' (move_shard_online and isolate raise what the engine recorded).
CREATE FUNCTION sharding._move_raise(id bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_raise' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_raise(bigint) IS
    'internal: raises the recorded error of a move that failed';

-- _move_refuse_written(): the source's slot waits for every transaction
-- holding a transaction id to end, this one included when the source
-- shares its instance: refused (25001) before anything happens.
CREATE FUNCTION sharding._move_refuse_written() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_refuse_written' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_refuse_written() IS
    'internal: 25001 in a transaction that has written (a move''s slot would wait for it)';

-- move_shard_online(map text, logical integer, node text): docs/moves.md.
-- Not STRICT: NULL arguments raise 22023. A journaled move
-- (_move_enqueue, then _move_execute) carried out in this session, after
-- _move_recover; C++ (src/nodes/move_journal.cpp).
CREATE FUNCTION sharding.move_shard_online(map text, logical integer, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_move_shard_online' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.move_shard_online(text, integer, text) IS
    'moves a logical shard with its rows to a node while writes go on (logical replication); returns its new epoch';

-- isolate(map text, key text, node text): docs/moves.md. Not STRICT.
CREATE FUNCTION sharding.isolate(map text, key text, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_isolate' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.isolate(text, text, text) IS
    'pins a key to a node and moves its rows of every distributed table there online; returns rows moved';

REVOKE ALL ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() TO sharding_admin;

-- Moving data between databases is an administrator's job.
REVOKE ALL ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text),
    sharding._move_finish(text, integer, text, text, bigint), sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_drop_replication(text),
    sharding._move_drop_triggers(text, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.move_shard_online(text, integer, text), sharding.isolate(text, text, text),
    sharding._move_online(text, integer, text, text),
    sharding._move_finish(text, integer, text, text, bigint), sharding._move_undo(text, integer, text),
    sharding._move_connect(text, text), sharding._move_disconnect(), sharding._move_wait_flush(text, float8),
    sharding._move_delete_rows(text, text, integer, text), sharding._move_drop_replication(text),
    sharding._move_drop_triggers(text, text), sharding._move_call(text, text, text, integer),
    sharding._move_sees_switch(text, text, integer, text, text, bigint),
    sharding._move_tables(text)
    TO sharding_admin;
-- Rebalance jobs (docs/rebalance.md). A job is one row of sharding.move_jobs; each
-- of its moves is a row of the move engine's journal (sharding.move_journal,
-- 90_move.sql), enqueued when the job starts. The job's moves are carried
-- out by whoever runs _job_claim/_job_execute in a loop: background runners
-- of the coordinator's server when the library is preloaded
-- (src/nodes/jobs.cpp), else CALL sharding.rebalance_run(job).
--
-- Who executes which move: a runner claims a move by taking the move
-- engine's own session advisory lock of the move
-- (hashtext('sharding.move_journal'), move % (2^31 - 1)), the one its
-- executor and recovery take, and holds it until _move_execute returns, so
-- "in flight" is exactly "locked by a live backend", also after a crash (the
-- lock dies with its process), and a move being recovered is never claimed. _job_claim runs under the job
-- row's lock, so two runners never exceed max_parallel nor take two moves
-- of one shard.
--
-- Every function below is C++ (src/nodes/jobs_run.cpp) behind its SQL
-- name: no PL/pgSQL on a move's path. The capacity checks ask the nodes
-- over the move engine's libpq helper, not dblink.

CREATE TABLE sharding.move_jobs (
    job              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    map              text NOT NULL,
    strategy         text NOT NULL CHECK (strategy IN ('count', 'load', 'drain')),
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    nodes            text[],
    loads            float8[],
    max_imbalance    float8,
    drained          text,
    max_parallel     integer NOT NULL CHECK (max_parallel >= 1),
    switched         integer NOT NULL DEFAULT 0,
    runas            oid NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false,
    created          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    started          timestamptz,
    finished         timestamptz,
    error            text,
    -- why no further move starts now (rebalance_jobs.waiting); per queued
    -- move passed over by the last claim, why it waits (move number ->
    -- reason: move_progress.waiting)
    waiting          text,
    waits            jsonb NOT NULL DEFAULT '{}',
    -- key moves (drain's pins) enqueued once no live move of their shard
    -- remains (the journal allows one live move per shard)
    deferred         jsonb NOT NULL DEFAULT '[]',
    -- failed moves that were interrupted (their executor died: crash,
    -- restart) and rolled back by recovery, each replaced by a new move of
    -- the same shard: they do not fail the job
    retried          bigint[] NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE sharding.move_jobs IS
    'rebalance jobs (rebalance_start, drain_node), one row per job, kept after it ends; read it through the rebalance_jobs view';
-- At most one live job per map (55006 for a second one).
CREATE UNIQUE INDEX move_jobs_one_live_per_map ON sharding.move_jobs (map)
    WHERE state IN ('queued', 'running');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_jobs', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_jobs_job_seq', '');
GRANT SELECT ON sharding.move_jobs TO PUBLIC;
GRANT INSERT, UPDATE ON sharding.move_jobs TO sharding_admin;

-- Background runners (src/nodes/jobs.cpp).
CREATE FUNCTION sharding._job_launch(job bigint, runners integer, runas oid) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__job_launch' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._job_launch(bigint, integer, oid) IS
    'internal: starts runners background workers for a job when this transaction commits; false without preload';
CREATE FUNCTION sharding._job_runners(job bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_runners' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._job_runners(bigint) IS
    'internal: background runners of a job in this database now';
REVOKE ALL ON FUNCTION sharding._job_launch(bigint, integer, oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._job_launch(bigint, integer, oid) TO sharding_admin;

-- The logical shard of a pinned key (pins are by text form): computed by
-- the type of the map's distributed key columns, as writers route it (the
-- type a key is hashed as: sharding._key_type).
CREATE FUNCTION sharding._job_key_shard(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_key_shard' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_key_shard(text, text) IS
    'internal: the logical shard of a pinned key, by the type of the map''s key columns';

-- rebalance_start: plans as rebalance / rebalance_by_load (their dry runs)
-- and enqueues every planned move; a map without distributed tables is
-- rebalanced in place (owner switches) and its job is done at once. A
-- start that fails (or is cancelled) cancels the moves it had enqueued.
CREATE FUNCTION sharding.rebalance_start(map text, nodes text[], strategy text DEFAULT 'count',
                                         loads float8[] DEFAULT NULL, max_imbalance float8 DEFAULT 1.10,
                                         max_parallel integer DEFAULT 1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_rebalance_start' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer) IS
    'starts a rebalance job (strategy count or load) that moves every planned shard online, max_parallel at a time; returns its id at once';

-- drain_node: every shard of `node` onto the map's other shard owners
-- (count-balanced, rebalance's plan over them), every key pinned to it onto
-- the owner of the key's shard after that plan.
CREATE FUNCTION sharding.drain_node(map text, node text, max_parallel integer DEFAULT 1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_drain_node' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.drain_node(text, text, integer) IS
    'starts a job moving every shard and pinned key of node onto the map''s other shard owners, online; afterwards drop_node succeeds';

-- _job_claim(job): the next move this backend should execute (and now
-- holds the claim of), 0 when none may start now (max_parallel moves in
-- flight, one move into a node at a time per map, a node without capacity
-- (replication slots, WAL senders, apply workers, counting moves claimed
-- but not begun): `waiting` says why), NULL when the job is over. A failed
-- move or a cancel stops the job: moves not begun are cancelled; it ends
-- once no move is in flight. A move rolled back by recovery is carried out
-- again (at most 3 tries per shard); deferred key moves are enqueued once
-- their shard has no live move.
CREATE FUNCTION sharding._job_claim(job bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_claim' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_claim(bigint) IS
    'internal: claims the next move of a job for this backend (its id), 0 if none may start now, NULL once the job is over';

-- Executes a claimed move through the engine, then gives up the claim.
CREATE FUNCTION sharding._job_execute(job bigint, move bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_execute' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_execute(bigint, bigint) IS
    'internal: carries out a claimed move of a job (sharding._move_execute) and releases the claim';

-- A runner whose job is over takes the oldest live job of its role that
-- lacks runners (NULL: none).
CREATE FUNCTION sharding._job_adopt() RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_adopt' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_adopt() IS
    'internal: the next live job of this role that lacks background runners';

-- The launcher's scanner, at server start and when runners were short:
-- recovers moves whose executor died, then asks for runners for every
-- live job.
CREATE FUNCTION sharding._job_pickup() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_pickup' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_pickup() IS
    'internal: recovers interrupted moves and starts background runners for every live job (the launcher calls it)';

-- rebalance_wait: the job's state once it has ended, or when timeout runs
-- out. Polls (each check a new snapshot: call it in READ COMMITTED).
CREATE FUNCTION sharding.rebalance_wait(job bigint, timeout interval DEFAULT NULL) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_rebalance_wait' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_wait(bigint, interval) IS
    'waits until a rebalance job ends (or timeout runs out) and returns its state';

-- rebalance_cancel: moves not begun are dropped, the ones in flight are told
-- to roll back (the engine's _move_cancel); done ones stay done. The job
-- ends 'cancelled' as soon as no move is in flight.
CREATE FUNCTION sharding.rebalance_cancel(job bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_rebalance_cancel' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_cancel(bigint) IS
    'cancels a rebalance job: moves not begun are dropped, moves in flight roll back, done moves stay; false if it had ended';

-- rebalance_run: carries a job out in this session, one move at a time,
-- committing between steps (so it must be CALLed outside a transaction
-- block). No SET clause: a procedure with one cannot COMMIT; it pins
-- search_path itself for each step.
CREATE PROCEDURE sharding.rebalance_run(job bigint)
    AS 'MODULE_PATHNAME', 'sharding_rebalance_run' LANGUAGE C;
COMMENT ON PROCEDURE sharding.rebalance_run(bigint) IS
    'carries out a queued or interrupted rebalance job in this session until it ends';

REVOKE ALL ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer),
    sharding.drain_node(text, text, integer), sharding._job_claim(bigint), sharding._job_execute(bigint, bigint),
    sharding.rebalance_wait(bigint, interval), sharding.rebalance_cancel(bigint), sharding._job_pickup()
    FROM PUBLIC;
REVOKE ALL ON PROCEDURE sharding.rebalance_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer),
    sharding.drain_node(text, text, integer), sharding._job_claim(bigint), sharding._job_execute(bigint, bigint),
    sharding.rebalance_wait(bigint, interval), sharding.rebalance_cancel(bigint)
    TO sharding_admin;
GRANT EXECUTE ON PROCEDURE sharding.rebalance_run(bigint) TO sharding_admin;

-- The WAL a move's destination still has to confirm, read live at the
-- source (its slot) over the move engine's libpq helper; NULL when it
-- cannot be read (node down, no password in the node's DSN for a role that
-- is not a superuser), and for a role that is neither a superuser nor a
-- member of sharding_admin (nothing connects on its behalf):
-- move_progress then shows the journal's figure. Executable by PUBLIC:
-- move_progress, readable by all, calls it, and a view's function calls are
-- checked for its reader.
CREATE FUNCTION sharding._job_lag(source text, slot text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_lag' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_lag(text, text) IS
    'internal: bytes of WAL a move''s slot at the source has not had confirmed yet, NULL if unreadable';

-- rebalance_jobs: one row per job, kept after it ends. The counts are of
-- the job's journal rows (a move interrupted by a crash and carried out
-- again counts once), plus the owner switches of maps without distributed
-- tables.
CREATE VIEW sharding.rebalance_jobs AS
    SELECT j.job, j.map, j.strategy, j.state,
           (j.switched + coalesce(c.total, 0) - pg_catalog.cardinality(j.retried)
            + pg_catalog.jsonb_array_length(j.deferred))::integer AS moves_total,
           (j.switched + coalesce(c.done, 0))::integer AS moves_done,
           (coalesce(c.failed, 0) - pg_catalog.cardinality(j.retried))::integer AS moves_failed,
           j.started, j.finished, j.error,
           coalesce(c.cancelled, 0)::integer AS moves_cancelled,
           j.max_parallel, j.nodes, j.drained, j.created, j.waiting
      FROM sharding.move_jobs j
      LEFT JOIN LATERAL (
           SELECT pg_catalog.count(*) AS total,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'done') AS done,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'failed') AS failed,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'cancelled') AS cancelled
             FROM sharding.move_journal m WHERE m.job = j.job) c ON true;
COMMENT ON VIEW sharding.rebalance_jobs IS
    'rebalance jobs: state, moves total/done/failed, times and the first failed move''s error';
GRANT SELECT ON sharding.rebalance_jobs TO PUBLIC;

-- move_progress: every move planned or in flight (of a job, or a direct
-- move_shard_online/isolate call), and every move of a job still running.
-- lag_bytes is read live at the source while the move catches up. The bar
-- and time_left come from how long the job's (else the map's) finished
-- moves took: a move is expected to take their median; without history,
-- the bar shows the phase and time_left is NULL.
CREATE VIEW sharding.move_progress AS
    SELECT m.job, m.map, m.logical, m.key, m.source, m.destination, m.phase,
           m.rows_copied, m.bytes_copied,
           CASE WHEN m.phase IN ('catching_up', 'cutover')
                THEN coalesce(sharding._job_lag(m.source, sharding._move_name(m.map, m.logical)), m.lag_bytes)
                ELSE m.lag_bytes END AS lag_bytes,
           m.started, m.phase_started, m.error,
           sharding.bar(p.fraction, 1, 20) AS bar,
           pg_catalog.date_trunc('second',
               CASE WHEN m.phase IN ('done', 'failed', 'cancelled') THEN interval '0'
                    WHEN h.expected IS NULL THEN NULL
                    WHEN m.phase = 'queued' THEN greatest(h.expected, interval '1 s')
                    ELSE greatest(h.expected - (pg_catalog.clock_timestamp() - m.started), interval '1 s') END
               + interval '0.5 s') AS time_left,
           CASE WHEN m.phase = 'queued' AND j.state IN ('queued', 'running')
                THEN coalesce(j.waits ->> m.move::text, CASE WHEN j.waits = '{}' THEN j.waiting END) END AS waiting,
           m.move
      FROM sharding.move_journal m
      LEFT JOIN sharding.move_jobs j ON j.job = m.job
      LEFT JOIN LATERAL (
           SELECT pg_catalog.percentile_cont(0.5) WITHIN GROUP (ORDER BY d.finished - d.started) AS expected
             FROM (SELECT x.started, x.finished FROM sharding.move_journal x
                    WHERE x.phase = 'done' AND x.started IS NOT NULL AND x.map = m.map
                      AND (x.job = m.job OR NOT EXISTS (SELECT FROM sharding.move_journal y
                                                         WHERE y.job = m.job AND y.phase = 'done'))
                    ORDER BY x.finished DESC LIMIT 20) d) h ON true
      CROSS JOIN LATERAL (
           SELECT CASE WHEN m.phase = 'done' THEN 1.0
                       WHEN m.phase IN ('queued', 'failed', 'cancelled') OR m.started IS NULL THEN 0.0
                       WHEN h.expected IS NOT NULL AND h.expected > interval '0'
                       THEN least(0.95, pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() - m.started)
                                        / pg_catalog.date_part('epoch', h.expected))
                       ELSE CASE m.phase WHEN 'copying' THEN 0.25 WHEN 'catching_up' THEN 0.6
                                         WHEN 'cutover' THEN 0.85 ELSE 0.95 END
                  END::float8 AS fraction) p
     WHERE m.phase NOT IN ('done', 'failed', 'cancelled') OR j.state IN ('queued', 'running');
COMMENT ON VIEW sharding.move_progress IS
    'moves planned or in flight (and every move of a running job): phase, rows/bytes copied, lag, bar, time left, why it waits';
GRANT SELECT ON sharding.move_progress TO PUBLIC;
