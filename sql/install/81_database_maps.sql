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
