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
