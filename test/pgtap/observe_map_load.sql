-- map_load against the real router: wherever node_for sends a row, map_load
-- counts it, for every key type, after pins, moves, rebalances and unpins.
-- Uses the maps functions (docs/maps.md), which every build has.
BEGIN;
SELECT plan(14);

CREATE TABLE obs_units (tenant text, tenant_no integer, tenant_small smallint, tenant_big bigint,
                        tenant_bytes bytea, tenant_id uuid);
INSERT INTO obs_units (tenant, tenant_no)
SELECT 't' || lpad(t::text, 3, '0'), t
  FROM generate_series(1, 40) AS t, generate_series(1, CASE WHEN t = 7 THEN 400 ELSE 10 END);
UPDATE obs_units SET tenant_small = tenant_no, tenant_big = tenant_no, tenant_id = md5(tenant)::uuid,
                     tenant_bytes = convert_to(tenant, 'UTF8');
INSERT INTO obs_units (tenant) VALUES (NULL);

-- map_load's rows per node equal node_for's, for one key column.
CREATE FUNCTION pg_temp.agrees(col text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE ok boolean;
BEGIN
    EXECUTE format(
        $q$SELECT bool_and(COALESCE(m.rows, 0) = COALESCE(r.n, 0))
                  AND sum(m.rows) = (SELECT count(%1$I) FROM obs_units)
             FROM sharding.map_load('obs_tenants', 'obs_units', %2$L) AS m
             FULL JOIN (SELECT sharding.node_for('obs_tenants', %1$I) AS node, count(*) AS n
                          FROM obs_units WHERE %1$I IS NOT NULL GROUP BY 1) AS r USING (node)$q$,
        col, col) INTO ok;
    RETURN ok;
END $$;

CREATE FUNCTION pg_temp.tests() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    c text;
BEGIN
    PERFORM sharding.create_map('obs_tenants', 8, ARRAY['n1', 'n2', 'n3']);
    PERFORM sharding.pin('obs_tenants', 't007', 'dedicated');
    PERFORM sharding.pin('obs_tenants', 'ghost', 'n2');
    RETURN NEXT ok(pg_temp.agrees('tenant'), 'text keys: map_load counts rows where node_for sends them');
    RETURN NEXT results_eq(
        $q$SELECT node, logical_shards, pinned_keys FROM sharding.map_load('obs_tenants', 'obs_units', 'tenant')$q$,
        $q$SELECT n, cardinality(sharding.shards_of('obs_tenants', n)),
                  (SELECT count(*)::integer FROM sharding.pins WHERE map = 'obs_tenants' AND node = n)
             FROM unnest(ARRAY['n1', 'n2', 'n3', 'dedicated']) AS n$q$,
        'one row per node: owners by lowest shard, then pin-only nodes; shards_of and pin counts');
    RETURN NEXT is((SELECT rows FROM sharding.map_load('obs_tenants', 'obs_units', 'tenant')
                     WHERE node = 'dedicated'), 400::bigint, 'the pinned whale lands on its dedicated node');
    PERFORM sharding.pin('obs_tenants', '7', 'dedicated');
    PERFORM sharding.pin('obs_tenants', '\x74303037', 'dedicated');
    PERFORM sharding.pin('obs_tenants', md5('t001')::uuid::text, 'n3');
    SET LOCAL bytea_output = 'escape';
    FOREACH c IN ARRAY ARRAY['tenant_no', 'tenant_small', 'tenant_big', 'tenant_bytes', 'tenant_id'] LOOP
        RETURN NEXT ok(pg_temp.agrees(c), c || ': map_load agrees with node_for (pins by text form)');
    END LOOP;
    PERFORM sharding.move_shard('obs_tenants', 0, 'n3');
    RETURN NEXT ok(pg_temp.agrees('tenant'), 'after move_shard: map_load agrees with node_for');
    PERFORM sharding.rebalance('obs_tenants', ARRAY['n1', 'n2', 'n3', 'n4']);
    RETURN NEXT ok(pg_temp.agrees('tenant'), 'after rebalance onto 4 nodes: map_load agrees with node_for');
    RETURN NEXT is((SELECT logical_shards FROM sharding.map_load('obs_tenants', 'obs_units', 'tenant')
                     WHERE node = 'n4'), 2, 'the new node owns 2 of the 8 logical shards');
    PERFORM sharding.unpin('obs_tenants', 't007');
    RETURN NEXT ok(pg_temp.agrees('tenant'), 'after unpin: the whale goes back to its shard''s owner');
    RETURN NEXT ok((SELECT rows FROM sharding.map_load('obs_tenants', 'obs_units', 'tenant')
                     WHERE node = 'dedicated') = 0, 'the dedicated node keeps its other pins but no rows');
    PERFORM sharding.drop_map('obs_tenants');
    RETURN NEXT throws_ok($q$SELECT * FROM sharding.map_load('obs_tenants', 'obs_units', 'tenant')$q$,
                          '42704', 'map "obs_tenants" does not exist', 'a dropped map is unknown');
END $$;

SELECT * FROM pg_temp.tests();
SELECT * FROM finish();
ROLLBACK;
