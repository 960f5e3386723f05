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
