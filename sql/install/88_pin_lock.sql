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
