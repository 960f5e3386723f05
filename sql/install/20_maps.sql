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
-- @object sharding.pins_node
-- The pins of a node: drop_node, add_node and the refusal to delete a node
-- that pins name (sharding._pins_integrity) look them up by node, which
-- read every pin of every map without this index.
CREATE INDEX pins_node ON sharding.pins (node);
-- @end

-- @object sharding.pin_log
-- The log of pin changes that backends read without
-- shared_preload_libraries (docs/directory.md, "When a change is seen"):
-- the routing trigger (sharding._routing_changed) writes a row per changed
-- key, or one row with key NULL when a statement changed more than 1,024
-- pins of a map (or every map: map NULL, a TRUNCATE); a backend that has
-- a map cached re-reads only the pins of the keys logged since it last
-- looked, instead of every pin of the map. Written only where the library
-- is not preloaded (shared memory does the same there). Local to each
-- database, not dumped (it is a cache's log); old rows are deleted as it
-- grows (sharding.pin_log_horizon says up to where: a backend whose view
-- is older rebuilds the map).
CREATE TABLE sharding.pin_log (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    map text,      -- NULL: every map
    key text,      -- NULL: every pin of the map
    xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id()
);
CREATE INDEX pin_log_xid ON sharding.pin_log (xid);
COMMENT ON TABLE sharding.pin_log IS
    'internal: pin changes for the routing caches of backends without shared_preload_libraries';
CREATE TABLE sharding.pin_log_horizon (
    seq bigint NOT NULL,   -- rows up to this seq may have been deleted
    xid xid8 NOT NULL      -- ... and every deleted row's xid is below this
);
INSERT INTO sharding.pin_log_horizon VALUES (0, '0');
COMMENT ON TABLE sharding.pin_log_horizon IS
    'internal: how far sharding.pin_log was trimmed';
GRANT SELECT ON sharding.pin_log, sharding.pin_log_horizon TO PUBLIC;
GRANT INSERT, DELETE ON sharding.pin_log TO sharding_admin;
GRANT UPDATE ON sharding.pin_log_horizon TO sharding_admin;
-- @end

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

-- @object sharding._routing_changed
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
-- @end

-- @object sharding._pins_integrity
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
-- @end

-- @object sharding._check_node
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
-- @end

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
-- row. Not STRICT: a NULL map raises 22023. C++ (src/routing/owner_switch.cpp).
-- @object sharding._require_map
CREATE FUNCTION sharding._require_map(map text, for_update boolean DEFAULT false) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__require_map' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._require_map(text, boolean) IS
    'internal: logical shard count of a map, 42704 if it does not exist';
-- @end

-- 22023 unless 0 <= logical < logical_shards. Not STRICT: a NULL shard
-- raises. C++ (src/routing/owner_switch.cpp).
-- @object sharding._check_logical
CREATE FUNCTION sharding._check_logical(map text, logical integer, logical_shards integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__check_logical' LANGUAGE C IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._check_logical(text, integer, integer) IS
    'internal: validates a logical shard number (22023)';
-- @end

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

-- @object sharding.drop_map
CREATE FUNCTION sharding.drop_map(map text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF map IS NULL THEN
        RAISE EXCEPTION 'map name must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Not while a move of the map is in flight (55006).
    PERFORM sharding._move_refuse(map, NULL, 'drop_map');
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
-- @end

-- @object sharding._canonical_keys
-- _canonical_key of every element of keys, in order, for pin_many: the
-- map's key type looked up once, the integer and uuid keys converted by one
-- array cast each way (a million keys in one statement); the first
-- spelling the type rejects raises its error naming it (22P02). Text keys,
-- and maps without a distributed table, stay as given.
CREATE FUNCTION sharding._canonical_keys(map text, keys text[]) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t regtype;
BEGIN
    SELECT sharding._key_type(a.atttypid::pg_catalog.regtype) INTO t
      FROM sharding.distributed_tables AS d
      JOIN pg_catalog.pg_attribute AS a
        ON a.attrelid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', d.schema_name, d.table_name))
       AND a.attname = d.key_column
     WHERE d.map = $1
     ORDER BY d.schema_name, d.table_name
     LIMIT 1;
    IF t IS NULL OR $2 IS NULL THEN
        RETURN $2;
    ELSIF t IN ('pg_catalog.int2'::pg_catalog.regtype, 'pg_catalog.int4'::pg_catalog.regtype,
                'pg_catalog.int8'::pg_catalog.regtype) THEN
        RETURN $2::pg_catalog.int8[]::pg_catalog.text[];
    ELSIF t = 'pg_catalog.uuid'::pg_catalog.regtype THEN
        RETURN $2::pg_catalog.uuid[]::pg_catalog.text[];
    ELSIF t = 'pg_catalog.bytea'::pg_catalog.regtype THEN
        RETURN ARRAY(SELECT '\x' OPERATOR(pg_catalog.||) pg_catalog.encode(u.k::pg_catalog.bytea, 'hex')
                       FROM pg_catalog.unnest($2) WITH ORDINALITY AS u(k, i) ORDER BY u.i);
    END IF;
    RETURN $2;
END $$;
COMMENT ON FUNCTION sharding._canonical_keys(text, text[]) IS
    'internal: keys converted once through their map''s key type, in order (pin_many)';
-- @end

-- @object sharding._canonical_key
-- A key as the map's key column type reads and prints it (CONTRACT 15.1,
-- "Keys by value"; the same conversion as isolate's, move_journal.cpp
-- canonical_key): '007' and ' +7' are 7, a uuid in lower case, a bytea in
-- \x hex; a spelling the type rejects raises its error (22P02). Text keys,
-- and maps without a distributed table, stay as given. One key of
-- _canonical_keys (below), which does the conversion.
CREATE FUNCTION sharding._canonical_key(map text, key text) RETURNS text
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT (sharding._canonical_keys($1, ARRAY[$2]))[1] $$;
COMMENT ON FUNCTION sharding._canonical_key(text, text) IS
    'internal: a key converted once through its map''s key type (the spelling pins and routing use)';
-- @end


-- @object sharding.pin
CREATE FUNCTION sharding.pin(map text, key text, node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    k text;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._check_node(node);
    PERFORM sharding._require_map($1, false);
    -- The key by value: converted once through the map's key type.
    k := sharding._canonical_key($1, $2);
    -- Not a key of a shard whose move is in flight (55006).
    PERFORM sharding._move_refuse($1, NULL, 'pin', ARRAY[k]);
    -- Waits for claim_node calls in flight on the map, for writers fenced on
    -- the shards the key routes by, and for moves (sharding._lock_pin).
    PERFORM sharding._lock_pin($1, k);
    PERFORM sharding._require_map($1, true);
    -- On a database map, a pin to a node without DSN would break every proxied call.
    PERFORM sharding._check_database_nodes($1, ARRAY[$3]);
    INSERT INTO sharding.nodes (node) VALUES ($3) ON CONFLICT DO NOTHING;
    INSERT INTO sharding.pins AS p (map, key, node) VALUES ($1, k, $3)
        ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
    PERFORM sharding._touch_map($1);
END $$;
COMMENT ON FUNCTION sharding.pin(text, text, text) IS
    'pins (or re-pins) one key, by value (converted through the map''s key type), to a node, overriding its logical shard';
-- @end

-- @object sharding.unpin
CREATE FUNCTION sharding.unpin(map text, key text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    k text;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    k := sharding._canonical_key($1, $2);
    -- Not a key of a shard whose move is in flight (55006).
    PERFORM sharding._move_refuse($1, NULL, 'unpin', ARRAY[k]);
    -- The key goes back to its shard's owner: the same waits as pin.
    PERFORM sharding._lock_pin($1, k);
    PERFORM sharding._require_map($1, true);
    DELETE FROM sharding.pins p WHERE p.map = $1 AND p.key = k;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM sharding._touch_map($1);
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding.unpin(text, text) IS
    'removes the pin of one key; true if there was one';
-- @end

-- move_shard(map, logical, node): the owner switch alone. On a map with a
-- distributed table a switch is refused (the rows would stay behind on the
-- old owner; a "move" to the current owner is not a switch): moves go
-- through move_shard_online or rebalance_start, whose cutover calls
-- _switch_owner.
-- @object sharding.move_shard
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
-- @end

-- _switch_owner(map, logical, node): move_shard's switch (also the cutover
-- of an online move): after the node, map and shard checks (and, on a
-- database map, the new owner's DSN), the exclusive shard lock (it waits
-- for every writer fenced on the shard, and any rebalance), then epoch + 1
-- and the new owner, unless it owns the shard already (then its epoch, and
-- fenced writers stay valid). Not STRICT: NULL arguments raise 22023. C++
-- (src/routing/owner_switch.cpp).
-- @object sharding._switch_owner
CREATE FUNCTION sharding._switch_owner(map text, logical integer, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__switch_owner' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._switch_owner(text, integer, text) IS
    'internal: switches a shard''s owner after fenced writers commit (epoch + 1); returns its epoch';
-- @end
REVOKE ALL ON FUNCTION sharding._switch_owner(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._switch_owner(text, integer, text) TO sharding_admin;

-- @object sharding._rebalance_apply
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
-- @end

-- @object sharding.rebalance
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
-- @end

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

-- @object sharding.epoch
-- From the routing cache (src/routing/maps.cpp), like node_for: a move
-- committed before the call is seen, also in a REPEATABLE READ transaction
-- or a PL/pgSQL loop.
CREATE FUNCTION sharding.epoch(map text, logical integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_epoch' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.epoch(text, integer) IS
    'epoch of a logical shard: 1 when the map is created, +1 per move';
-- @end

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

-- @object sharding._check_database_nodes
-- _check_database_nodes(map, nodes): 55000 naming the first node of `nodes`
-- that has no DSN, when `map` is a database map: some node owning its shards
-- or holding its pins, or some node of `nodes`, has a DSN. create_map passes
-- a map that does not exist yet: then only `nodes` decide. Cheapest first:
-- no DSN anywhere; a node of `nodes` or an owner of the map's shards with
-- one. Only then the map's pins (no index by node): a join that stops at
-- the first pin held by a node with a DSN. C++ (src/routing/owner_switch.cpp;
-- its statements are kept prepared: pin calls it every time).
CREATE FUNCTION sharding._check_database_nodes(map text, nodes text[]) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__check_database_nodes' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._check_database_nodes(text, text[]) IS
    'internal: 55000 for a node without DSN handed shards or pins of a database map';
REVOKE ALL ON FUNCTION sharding._check_database_nodes(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._check_database_nodes(text, text[]) TO sharding_admin;
-- @end

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

-- @object sharding._lock_pin
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
-- @end

-- @object sharding._routing_cache_counts
-- Internal, for tests (test/tap/102_directory_scale.pl): how often this
-- backend's routing cache built a map from all its rows, and refreshed one
-- in place from the keys and shards that changed.
CREATE FUNCTION sharding._routing_cache_counts() RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding__routing_cache_counts' LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION sharding._routing_cache_counts() IS
    'internal: {builds, refreshes} of this backend''s routing cache (for tests)';
-- @end

-- @object sharding.pin_many
-- pin_many(map, keys, nodes) (docs/directory.md) pins (or re-pins) keys[i] to
-- nodes[i] in one statement and returns how many keys it pinned (a key given
-- twice counts once; the last one wins, as two pin calls would). Each key by
-- value, as pin takes it (_canonical_keys: '007' and '7' are one key of an
-- integer map; a spelling the type rejects: 22P02, nothing pinned). Arrays of
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
    -- The keys by value: converted once through the map's key type.
    keys := sharding._canonical_keys($1, keys);
    -- Not keys of a shard whose move is in flight (55006).
    PERFORM sharding._move_refuse($1, NULL, 'pin_many', keys);
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
-- @end
