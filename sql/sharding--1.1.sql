\echo Use "CREATE EXTENSION sharding" to load this file. \quit

-- The role that may change maps, pins, nodes and rank guards besides the
-- extension's owner. Roles are cluster-wide, so another database may have
-- created it already.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sharding_admin') THEN
        CREATE ROLE sharding_admin NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA sharding TO PUBLIC;

-- Internal: proves the C/C++ boundary turns every C++ exception into an
-- ERROR (see src/boundary.hpp). Not for users, hence revoked.
CREATE FUNCTION sharding._boundary_selftest(kind text) RETURNS bigint
    AS 'MODULE_PATHNAME', '_boundary_selftest' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._boundary_selftest(text) IS
    'internal: exercises the C++/PostgreSQL error boundary (regression tests only)';
-- Internal test hook; nobody but the owner needs it.
REVOKE ALL ON FUNCTION sharding._boundary_selftest(text) FROM PUBLIC;
-- Section 1: hashing. XXH3-64 (seed 0) over the key's canonical bytes.
-- IMMUTABLE STRICT PARALLEL SAFE: pure functions of their arguments whose
-- values are a compatibility promise, so they may back indexes, generated
-- columns and partition routing.

CREATE FUNCTION sharding.hash64(key text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'hash64_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(text) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key text, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'shard_of_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(text, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key text, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'jump_shard_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(text, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key bytea) RETURNS bigint
    AS 'MODULE_PATHNAME', 'hash64_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(bytea) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key bytea, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'shard_of_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(bytea, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key bytea, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'jump_shard_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(bytea, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key smallint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'hash64_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(smallint) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key smallint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'shard_of_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(smallint, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key smallint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'jump_shard_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(smallint, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'hash64_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(integer) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key integer, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'shard_of_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(integer, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key integer, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'jump_shard_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(integer, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'hash64_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(bigint) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key bigint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'shard_of_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(bigint, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key bigint, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'jump_shard_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(bigint, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.hash64(key uuid) RETURNS bigint
    AS 'MODULE_PATHNAME', 'hash64_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.hash64(uuid) IS
    'XXH3-64 (seed 0) of the key''s canonical bytes, as a signed bigint';
CREATE FUNCTION sharding.shard_of(key uuid, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'shard_of_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.shard_of(uuid, integer) IS
    'shard of the key among n: unsigned hash64(key) mod n';
CREATE FUNCTION sharding.jump_shard(key uuid, n integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'jump_shard_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.jump_shard(uuid, integer) IS
    'Lamping-Veach jump consistent hash of the unsigned hash64(key) into n buckets';

CREATE FUNCTION sharding.worker_shards(worker integer, workers integer, shards integer)
    RETURNS integer[]
    AS 'MODULE_PATHNAME', 'worker_shards' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.worker_shards(integer, integer, integer) IS
    'contiguous range of shards dealt to worker (0-based), larger ranges first';
CREATE FUNCTION sharding.worker_of(shard integer, workers integer, shards integer)
    RETURNS integer
    AS 'MODULE_PATHNAME', 'worker_of' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.worker_of(integer, integer, integer) IS
    'worker (0-based) that worker_shards deals the shard to';
-- Section 2: logical-shard maps, whale pins, nodes.
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

CREATE TABLE sharding.pins (
    map  text NOT NULL REFERENCES sharding.maps ON DELETE CASCADE,
    key  text NOT NULL,
    node text NOT NULL REFERENCES sharding.nodes,
    PRIMARY KEY (map, key)
);
COMMENT ON TABLE sharding.pins IS 'whale directory: keys pinned to a node, overriding their logical shard';

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

-- Routing cache invalidation: any change to maps, shards or pins, by the
-- functions or by a direct write, makes every backend rebuild its routes
-- (src/maps.cpp). Statement-level: one invalidation per statement.
CREATE FUNCTION sharding._routing_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', '_routing_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._routing_changed() IS
    'internal: invalidates every backend''s routing cache when the map config changes';
CREATE TRIGGER routing_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.maps
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.shards
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.pins
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();

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

-- 42704 unless the map exists; the functions that change a map lock its row.
CREATE FUNCTION sharding._require_map(map text, for_update boolean DEFAULT false) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'map name must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF for_update THEN
        SELECT m.logical_shards INTO l FROM sharding.maps m WHERE m.map = $1 FOR UPDATE;
    ELSE
        SELECT m.logical_shards INTO l FROM sharding.maps m WHERE m.map = $1;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    RETURN l;
END $$;
COMMENT ON FUNCTION sharding._require_map(text, boolean) IS
    'internal: logical shard count of a map, 42704 if it does not exist';

-- 22023 unless 0 <= logical < logical_shards.
CREATE FUNCTION sharding._check_logical(map text, logical integer, logical_shards integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF logical IS NULL OR logical < 0 OR logical >= logical_shards THEN
        RAISE EXCEPTION 'logical shard must be between 0 and % for map "%", got %',
            logical_shards - 1, map, coalesce(logical::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
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
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, true);
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

CREATE FUNCTION sharding.move_shard(map text, logical integer, node text) RETURNS bigint
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
COMMENT ON FUNCTION sharding.move_shard(text, integer, text) IS
    'moves one logical shard to a node after fenced writers commit; returns its new epoch (unchanged when already there)';

CREATE FUNCTION sharding.rebalance(map text, nodes text[], dry_run boolean DEFAULT false)
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

CREATE FUNCTION sharding.epoch(map text, logical integer) RETURNS bigint
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    e bigint;
BEGIN
    SELECT m.logical_shards INTO l FROM sharding.maps m WHERE m.map = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', $1 USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM sharding._check_logical($1, $2, l);
    SELECT s.epoch INTO e FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2;
    RETURN e;
END $$;
COMMENT ON FUNCTION sharding.epoch(text, integer) IS
    'epoch of a logical shard: 1 when the map is created, +1 per move';

CREATE FUNCTION sharding.fence(map text, logical integer, epoch bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'fence' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fence(text, integer, bigint) IS
    'raises 55000 if the shard moved past epoch, else share-locks it until commit so moves wait for the writer';
-- Not STRICT: fence(NULL, ...) must raise, never silently let a writer through.

-- Internal lock helpers and planner (src/maps.cpp, src/rebalance.cpp).
CREATE FUNCTION sharding._lock_shard(map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', '_lock_shard' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding._lock_shard(text, integer) IS
    'internal: exclusive shard lock for move_shard (waits for fenced writers)';
CREATE FUNCTION sharding._lock_map(map text) RETURNS void
    AS 'MODULE_PATHNAME', '_lock_map' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding._lock_map(text) IS
    'internal: map-wide exclusive lock for rebalance and drop_map';
CREATE FUNCTION sharding._rebalance_plan(owners text[], nodes text[])
    RETURNS TABLE(logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', '_rebalance_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
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

-- Routing, from the per-backend cache (src/maps.cpp). STABLE: follows the
-- config tables; STRICT: NULL in, NULL out; PARALLEL SAFE: workers build
-- their own cache from the query's snapshot.
CREATE FUNCTION sharding.logical_shard(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'logical_shard_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, text) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key text) RETURNS text
    AS 'MODULE_PATHNAME', 'node_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, text) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'logical_shard_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, bytea) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key bytea) RETURNS text
    AS 'MODULE_PATHNAME', 'node_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, bytea) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'logical_shard_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, smallint) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key smallint) RETURNS text
    AS 'MODULE_PATHNAME', 'node_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, smallint) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'logical_shard_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, integer) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key integer) RETURNS text
    AS 'MODULE_PATHNAME', 'node_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, integer) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'logical_shard_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, bigint) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key bigint) RETURNS text
    AS 'MODULE_PATHNAME', 'node_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.node_for(text, bigint) IS
    'node the key routes to: its pin (matched on the key''s text form), else the owner of its logical shard';
CREATE FUNCTION sharding.logical_shard(map text, key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'logical_shard_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.logical_shard(text, uuid) IS
    'logical shard of the key in the map: shard_of(key, logical shards of the map)';
CREATE FUNCTION sharding.node_for(map text, key uuid) RETURNS text
    AS 'MODULE_PATHNAME', 'node_for_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
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
-- Section 3: claiming work with FOR UPDATE SKIP LOCKED, leases and fenced
-- completion (src/queue.cpp).
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
    PRIMARY KEY (schema_name, table_name)
);
COMMENT ON TABLE sharding.queue_settings IS
    'per-queue settings (max_attempts), keyed by the queue table''s schema and name';
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
    AS 'MODULE_PATHNAME', '_queue_settings_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._queue_settings_changed() IS
    'internal: invalidates the cached plans and settings of the queue a sharding.queue_settings row names';
-- A trigger function; nobody calls it directly.
REVOKE ALL ON FUNCTION sharding._queue_settings_changed() FROM PUBLIC;
CREATE TRIGGER queue_settings_changed AFTER INSERT OR UPDATE OR DELETE ON sharding.queue_settings
    FOR EACH ROW EXECUTE FUNCTION sharding._queue_settings_changed();

-- create_queue: the table and the two partial indexes that keep claims an
-- index scan however many done rows pile up: pending rows in claim order,
-- and live leases by expiry (so expired ones are found without a scan).
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
            attempts      integer NOT NULL DEFAULT 0
        )$sql$, q);
    EXECUTE format('CREATE INDEX ON %s (created, id) WHERE status = %L', q, 'pending');
    EXECUTE format('CREATE INDEX ON %s (claim_expires) WHERE status = %L', q, 'processing');
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
    'creates a queue table (id, key, payload, status, owner, claim_expires, created, attempts) with its claim indexes';

-- claim and claim_shards are not STRICT: the queue argument is NULL::table
-- by design; other NULL arguments raise 22023.
CREATE FUNCTION sharding.claim(queue anyelement, worker text, batch integer DEFAULT 50,
                               lease interval DEFAULT '5 minutes')
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'claim' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.claim(anyelement, text, integer, interval) IS
    'leases up to batch pending or expired rows of the queue table to worker, oldest first (FOR UPDATE SKIP LOCKED)';

CREATE FUNCTION sharding.claim_shards(queue anyelement, worker text, shards integer[], shard_count integer,
                                      batch integer DEFAULT 50, lease interval DEFAULT '5 minutes',
                                      key_column name DEFAULT 'key')
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'claim_shards' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.claim_shards(anyelement, text, integer[], integer, integer, interval, name) IS
    'as claim, only rows whose shard_of(key_column, shard_count) is one of shards';

-- The fenced functions are not STRICT: attempt DEFAULT NULL means "do not
-- check the attempt"; any other NULL argument raises 22023.
CREATE FUNCTION sharding.complete(queue regclass, id bigint, worker text, attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'complete' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.complete(regclass, bigint, text, integer) IS
    'marks the job done if it is processing, owned by worker and (if given) in claim number attempt';

CREATE FUNCTION sharding.complete(queue regclass, ids bigint[], worker text)
    RETURNS integer
    AS 'MODULE_PATHNAME', 'complete_many' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.complete(regclass, bigint[], text) IS
    'marks done every listed job that is processing and owned by worker, in one statement; returns how many';

CREATE FUNCTION sharding.fail(queue regclass, id bigint, worker text, retry boolean DEFAULT true,
                              attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'fail' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.fail(regclass, bigint, text, boolean, integer) IS
    'same fence as complete; back to pending (retry, while max_attempts allows) or failed';

CREATE FUNCTION sharding.extend_lease(queue regclass, id bigint, worker text, lease interval,
                                      attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'extend_lease' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.extend_lease(regclass, bigint, text, interval, integer) IS
    'same fence as complete; sets claim_expires = now() + lease';

CREATE FUNCTION sharding._queue_sql(queue regclass, kind text) RETURNS text
    AS 'MODULE_PATHNAME', '_queue_sql' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._queue_sql(regclass, text) IS
    'internal: SQL text of a queue statement as claim/complete/fail/extend_lease prepare it (for EXPLAIN)';

-- Extras (the contract is silent): max_attempts, queue_stats, enqueue.

-- Not STRICT: a NULL max_attempts removes the limit.
CREATE FUNCTION sharding.set_max_attempts(queue regclass, max_attempts integer) RETURNS void
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
        DELETE FROM sharding.queue_settings s WHERE s.schema_name = nsp AND s.table_name = rel;
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
    EXECUTE format('INSERT INTO %s (key, payload) VALUES ($1, $2) RETURNING id', queue)
        INTO new_id USING key, payload;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION sharding.enqueue(regclass, text, jsonb) IS
    'adds a pending job (key, payload) to a create_queue table; returns its id';
-- Section 4: rank-guarded transitions.
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
-- Admins change guards through the functions, which run as the caller.
GRANT INSERT, UPDATE, DELETE ON sharding.rank_guards TO sharding_admin;

-- The trigger function. Not revoked: PostgreSQL checks EXECUTE only when a
-- trigger is created (a restore by the table's owner must be able to), and it
-- refuses to run outside a BEFORE UPDATE row trigger.
CREATE FUNCTION sharding._rank_guard() RETURNS trigger
    AS 'MODULE_PATHNAME', '_rank_guard' LANGUAGE C;
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
        RAISE EXCEPTION 'table and column must not be NULL' USING ERRCODE = '22004';
    END IF;
    SELECT a.attnum, a.atttypid, a.atttypmod INTO attnum, atttypid, typmod
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', col, tbl USING ERRCODE = '42703';
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
    IF on_regress IS NULL OR on_regress NOT IN ('skip', 'error') THEN
        RAISE EXCEPTION 'on_regress must be ''skip'' or ''error'', got %', coalesce(quote_literal(on_regress), 'NULL')
            USING ERRCODE = '22023';
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
                USING ERRCODE = '22023', HINT = 'List the values lowest first: ranks => ARRAY[''new'', ''done''].';
        END IF;
    ELSE
        IF cardinality(ranks) = 0 THEN
            RAISE EXCEPTION 'ranks must list at least one value, got %', ranks USING ERRCODE = '22023';
        END IF;
        IF array_ndims(ranks) <> 1 THEN
            RAISE EXCEPTION 'ranks must be a one-dimensional array, got %', ranks USING ERRCODE = '22023';
        END IF;
        FOR i IN 1 .. cardinality(ranks) LOOP
            label := ranks[array_lower(ranks, 1) + i - 1];
            IF label IS NULL THEN
                RAISE EXCEPTION 'ranks must not contain NULL, got %', ranks USING ERRCODE = '22023';
            ELSIF label = '' THEN
                RAISE EXCEPTION 'ranks must not contain an empty string, got %', ranks USING ERRCODE = '22023';
            ELSIF label = ANY (ranks[array_lower(ranks, 1) : array_lower(ranks, 1) + i - 2]) THEN
                RAISE EXCEPTION 'ranks list "%" twice', label USING ERRCODE = '22023';
            END IF;
            IF is_enum THEN
                IF NOT EXISTS (SELECT FROM pg_enum AS e WHERE e.enumtypid = base AND e.enumlabel = label) THEN
                    RAISE EXCEPTION 'rank "%" is not a value of enum type %', label, base::regtype
                        USING ERRCODE = '22023';
                END IF;
            ELSE
                -- A rank must be a value of the column, written as the column
                -- prints it (the guard compares text forms).
                BEGIN
                    EXECUTE format('SELECT $1::%s::text', coltype) INTO canonical USING label;
                EXCEPTION WHEN data_exception THEN
                    RAISE EXCEPTION 'rank "%" is not a valid value of type %', label, coltype USING ERRCODE = '22023';
                END;
                IF canonical IS DISTINCT FROM label THEN
                    RAISE EXCEPTION 'rank "%" of type % reads back as "%"', label, coltype, canonical
                        USING ERRCODE = '22023', HINT = 'Write ranks as the column prints them.';
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

-- Changing guards needs the extension's owner or sharding_admin.
REVOKE ALL ON FUNCTION sharding.guard_rank(regclass, name, text[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION sharding.unguard_rank(regclass, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.guard_rank(regclass, name, text[], text) TO sharding_admin;
GRANT EXECUTE ON FUNCTION sharding.unguard_rank(regclass, name) TO sharding_admin;

CREATE FUNCTION sharding.rank_of(tbl regclass, col name, value text) RETURNS integer
    AS 'MODULE_PATHNAME', 'rank_of' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.rank_of(regclass, name, text) IS
    '0-based rank of value in the column''s guard, or in its enum''s declared order';

-- No SET search_path: a C function whose only SQL names every table, column
-- and operator with its schema (and pinning it would cost every call).
CREATE FUNCTION sharding.advance(tbl regclass, id anyelement, new_value text, col name DEFAULT 'status')
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'advance' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.advance(regclass, anyelement, text, name) IS
    'set col to new_value on the row whose primary key is id, only if that raises its rank; true if it did';
-- Section 5: observing load.
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

-- The histogram bar every observing function draws (src/observe_core.hpp).
CREATE FUNCTION sharding.bar(value float8, max float8, width integer DEFAULT 40) RETURNS text
    AS 'MODULE_PATHNAME', 'bar' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.bar(float8, float8, integer) IS
    'Unicode bar of value relative to max: width characters at max, to the nearest eighth; empty for 0';

CREATE FUNCTION sharding.imbalance(loads anyarray) RETURNS float8
    AS 'MODULE_PATHNAME', 'imbalance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.imbalance(anyarray) IS
    'max / mean of a numeric array, NULL elements skipped; NULL when empty or all zero (1.0 = perfectly even)';

-- Internal: the type of a shard key column, or 42703 (no such column) or
-- 22023 (not a key type). varchar is hashed as text, like the text it casts to.
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
    IF t NOT IN ('text'::regtype, 'character varying'::regtype, 'bytea'::regtype, 'smallint'::regtype,
                 'integer'::regtype, 'bigint'::regtype, 'uuid'::regtype) THEN
        RAISE EXCEPTION 'column "%" of relation % has type %, which is not a shard key type',
                key_column, tbl, t
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Shard keys are text, bytea, smallint, integer, bigint or uuid.';
    END IF;
    RETURN t;
END
$$;
COMMENT ON FUNCTION sharding._key_column_type(regclass, name) IS
    'internal: type of a shard key column; 42703 if missing, 22023 if not a key type';

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

-- map_load counts each row where sharding.node_for (contract section 2)
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
-- Section 6: native hash partitions aligned with shard_of.
--
-- With PARTITION BY HASH (k sharding.<type>_shard_ops) on a single column,
-- partition MODULUS n REMAINDER r holds exactly the rows with
-- shard_of(k, n) = r. The support functions are chosen so that PostgreSQL's
-- row hash for a one-column key (hash_combine64(0, extended(k, seed))) is
-- our XXH3 hash itself; see src/partition_hash.hpp. With several key columns
-- PostgreSQL folds the column hashes together, so alignment holds only for
-- single-column keys and create_partitions refuses the others.
--
-- Support functions: IMMUTABLE STRICT PARALLEL SAFE, like every hash
-- support function (partition routing and hash indexes depend on it; NULLs
-- never reach them).

CREATE FUNCTION sharding.partition_hash(key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_hash_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(text) IS
    'hash support function 1 of sharding.text_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key text, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'partition_hash_extended_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(text, bigint) IS
    'hash support function 2 of sharding.text_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_hash_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(bytea) IS
    'hash support function 1 of sharding.bytea_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key bytea, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'partition_hash_extended_bytea' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(bytea, bigint) IS
    'hash support function 2 of sharding.bytea_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_hash_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(smallint) IS
    'hash support function 1 of sharding.int2_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key smallint, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'partition_hash_extended_int2' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(smallint, bigint) IS
    'hash support function 2 of sharding.int2_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_hash_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(integer) IS
    'hash support function 1 of sharding.int4_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key integer, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'partition_hash_extended_int4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(integer, bigint) IS
    'hash support function 2 of sharding.int4_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_hash_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(bigint) IS
    'hash support function 1 of sharding.int8_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key bigint, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'partition_hash_extended_int8' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash_extended(bigint, bigint) IS
    'hash support function 2 of sharding.int8_shard_ops: hash64(key) for seed 0, aligned with shard_of for the hash partition seed';

CREATE FUNCTION sharding.partition_hash(key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_hash_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_hash(uuid) IS
    'hash support function 1 of sharding.uuid_shard_ops: the low 32 bits of hash64(key)';
CREATE FUNCTION sharding.partition_hash_extended(key uuid, seed bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'partition_hash_extended_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
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
            USING ERRCODE = '22023';
    END IF;

    SELECT c.relnamespace, n.nspname, c.relname, c.relkind, c.relpersistence
      INTO nsp_oid, nsp, rel, kind, persistence
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = parent;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation with OID % does not exist', parent::oid USING ERRCODE = '42P01';
    END IF;
    IF kind <> 'p' THEN
        RAISE EXCEPTION '% is not a partitioned table', parent
            USING ERRCODE = '22023',
                  HINT = 'Create it with PARTITION BY HASH (key sharding.text_shard_ops), '
                         'naming the *_shard_ops operator class of the key''s type.';
    END IF;

    SELECT pt.partstrat, pt.partnatts, pt.partattrs[0], pt.partclass[0]
      INTO strat, natts, attnum, opclass
      FROM pg_partitioned_table pt
     WHERE pt.partrelid = parent;
    IF strat <> 'h' THEN
        RAISE EXCEPTION '% is not hash-partitioned', parent
            USING ERRCODE = '22023',
                  HINT = 'Partitions aligned with shard_of need PARTITION BY HASH (key sharding.text_shard_ops).';
    END IF;
    IF natts <> 1 THEN
        RAISE EXCEPTION '% is hash-partitioned on % columns, not one', parent, natts
            USING ERRCODE = '22023',
                  DETAIL = 'PostgreSQL combines the hashes of several key columns, so partitions '
                           'cannot line up with shard_of of any one of them.',
                  HINT = 'Partition on a single column with a sharding.*_shard_ops operator class.';
    END IF;
    IF attnum = 0 THEN
        RAISE EXCEPTION '% is hash-partitioned on an expression, not a column', parent
            USING ERRCODE = '22023',
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
            USING ERRCODE = '22023',
                  HINT = 'PostgreSQL''s own hash opclasses do not agree with shard_of; '
                         'use PARTITION BY HASH (key sharding.text_shard_ops) or the one for the key''s type.';
    END IF;

    width := length((shards - 1)::text);
    prefix := rel || '_';
    IF octet_length(prefix) + width > 63 THEN
        RAISE EXCEPTION 'partition name "%" is too long', prefix || repeat('0', width)
            USING ERRCODE = '42622',
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
            USING ERRCODE = '42P07',
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
-- Section 7: nodes and multi-node routing through PL/Proxy.
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
-- and raise the contract's SQLSTATEs. partition_for, the one called per
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
    IF add_node.node IS NULL OR add_node.node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %',
                coalesce(quote_literal(add_node.node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
-- Changing where maps route is an administrator's job (contract: 42501 otherwise).
REVOKE ALL ON FUNCTION sharding.add_node(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.add_node(text, text) TO sharding_admin;

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
-- Changing where maps route is an administrator's job (contract: 42501 otherwise).
REVOKE ALL ON FUNCTION sharding.drop_node(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.drop_node(text) TO sharding_admin;

-- partition_for(map text, key): the PL/Proxy RUN ON function, one overload
-- per key type (an untyped literal resolves to text). C++ (since 1.1): it
-- routes from the same per-backend cache as node_for, so a pinned key matches
-- exactly as node_for matches it, and a proxied call pays a hash and a probe
-- instead of three queries. STABLE: it reads the map.
CREATE FUNCTION sharding.partition_for(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'partition_for_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
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

-- copy_shard(map, logical, tbl, key_column, from_dsn, to_dsn): step 1 of a
-- shard move (README, "Moving a shard"): copies the rows of `tbl` whose key
-- is in logical shard `logical` of `map` and is not pinned, from the
-- database at from_dsn to the one at to_dsn, with one INSERT ... SELECT
-- that the destination runs against the source through dblink (rows go
-- from source to destination directly). Rows already at the destination
-- are skipped (ON CONFLICT DO NOTHING): give `tbl` a primary key and the
-- copy can be repeated to pick up rows written since the last one. Returns
-- the number of rows inserted.
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

    src_query := format('SELECT %s FROM %s WHERE sharding.shard_of(%I, %s) = %s AND NOT (%I::text = ANY (%L::text[]))',
                        cols, rel, copy_shard.key_column, shards, copy_shard.logical,
                        copy_shard.key_column, pinned);
    dst_command := format('INSERT INTO %s (%s) SELECT %s FROM %I.dblink(%L, %L) AS s(%s) ON CONFLICT DO NOTHING',
                          rel, cols, cols, dblink_schema, copy_shard.from_dsn, src_query, coldefs);
    EXECUTE format('SELECT %I.dblink_exec($1, $2)', dblink_schema)
       INTO status USING copy_shard.to_dsn, dst_command;
    -- The command tag: "INSERT 0 <rows>".
    RETURN split_part(status, ' ', 3)::bigint;
END
$$;
COMMENT ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) IS
    'copies the unpinned rows of one logical shard of a table from one node to another (through dblink); returns rows inserted';
-- It reads and writes other databases: administrators only.
REVOKE ALL ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) TO sharding_admin;
