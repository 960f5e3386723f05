-- Caches follow one rule (issue 23): every call sees every configuration
-- change committed before it began (src/pg/cache.hpp, "changes").
-- epoch reads the routing cache, like node_for.
CREATE OR REPLACE FUNCTION sharding.epoch(map text, logical integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_epoch' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- Issue 26: per-map changes. The statement triggers see the changed rows
-- (transition tables), so only the maps and pin keys that changed are
-- rebuilt or re-read.
COMMENT ON FUNCTION sharding._routing_changed() IS
    'internal: tells every backend''s routing cache which maps, shards and pins changed';
DROP TRIGGER routing_changed ON sharding.maps;
CREATE TRIGGER routing_changed AFTER TRUNCATE ON sharding.maps
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_insert AFTER INSERT ON sharding.maps REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_update AFTER UPDATE ON sharding.maps REFERENCING OLD TABLE AS before NEW TABLE AS after
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_delete AFTER DELETE ON sharding.maps REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
ALTER TABLE sharding.maps ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.maps ENABLE ALWAYS TRIGGER routing_changed_insert;
ALTER TABLE sharding.maps ENABLE ALWAYS TRIGGER routing_changed_update;
ALTER TABLE sharding.maps ENABLE ALWAYS TRIGGER routing_changed_delete;
DROP TRIGGER routing_changed ON sharding.shards;
CREATE TRIGGER routing_changed AFTER TRUNCATE ON sharding.shards
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_insert AFTER INSERT ON sharding.shards REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_update AFTER UPDATE ON sharding.shards REFERENCING OLD TABLE AS before NEW TABLE AS after
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_delete AFTER DELETE ON sharding.shards REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
ALTER TABLE sharding.shards ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.shards ENABLE ALWAYS TRIGGER routing_changed_insert;
ALTER TABLE sharding.shards ENABLE ALWAYS TRIGGER routing_changed_update;
ALTER TABLE sharding.shards ENABLE ALWAYS TRIGGER routing_changed_delete;
DROP TRIGGER routing_changed ON sharding.pins;
CREATE TRIGGER routing_changed AFTER TRUNCATE ON sharding.pins
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_insert AFTER INSERT ON sharding.pins REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_update AFTER UPDATE ON sharding.pins REFERENCING OLD TABLE AS before NEW TABLE AS after
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
CREATE TRIGGER routing_changed_delete AFTER DELETE ON sharding.pins REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed();
ALTER TABLE sharding.pins ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.pins ENABLE ALWAYS TRIGGER routing_changed_insert;
ALTER TABLE sharding.pins ENABLE ALWAYS TRIGGER routing_changed_update;
ALTER TABLE sharding.pins ENABLE ALWAYS TRIGGER routing_changed_delete;

-- _lock_pin locks by shard_of over the map's shard count: pinning no
-- longer builds the routing cache of the map it changes.
CREATE OR REPLACE FUNCTION sharding._lock_pin(map text, key text) RETURNS void
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    -- shard_of over the map's shard count, not logical_shard: the same
    -- shards, without building the map's routing cache (whose pins the
    -- caller is changing: issue 26).
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

-- Section 14: pin_many.
CREATE FUNCTION sharding.pin_many(map text, keys text[], nodes text[]) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    bad text;
    n integer;
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
    SELECT coalesce(pg_catalog.quote_literal(u.node), 'NULL') INTO bad
      FROM pg_catalog.unnest(nodes) AS u(node) WHERE u.node IS NULL OR u.node = '' LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', bad USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    PERFORM sharding._lock_map($1);
    PERFORM sharding._require_map($1, true);
    PERFORM sharding._check_database_nodes($1, (SELECT pg_catalog.array_agg(DISTINCT u) FROM pg_catalog.unnest(nodes) u));
    INSERT INTO sharding.nodes (node) SELECT DISTINCT u FROM pg_catalog.unnest(nodes) u ON CONFLICT DO NOTHING;
    INSERT INTO sharding.pins AS p (map, key, node)
    SELECT DISTINCT ON (u.key) $1, u.key, u.node
      FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(nodes)) WITH ORDINALITY AS u(key, node, i)
     ORDER BY u.key, u.i DESC
        ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding.pin_many(text, text[], text[]) IS
    'pins (or re-pins) keys[i] to nodes[i] in one statement; returns how many keys were pinned';
REVOKE ALL ON FUNCTION sharding.pin_many(text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.pin_many(text, text[], text[]) TO sharding_admin;
