-- Observing load (docs/observe.md): distribution, imbalance, whales, map_load, and the bar they draw.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- bar: width characters at max, eighths in between, empty at zero, clipped
-- above max, at least one eighth for any positive value.
SELECT sharding.bar(8, 8, 1) AS full_1, sharding.bar(1, 8, 1) AS eighth, sharding.bar(7, 8, 1) AS seven,
       sharding.bar(10, 8, 2) AS clipped, sharding.bar(0.001, 8, 2) AS tiny, sharding.bar(0, 8) AS zero,
       sharding.bar(-3, 8) AS negative, sharding.bar(3, 0) AS zero_max, sharding.bar(1, 1, 0) AS width_0;
SELECT char_length(sharding.bar(5, 5)) AS default_width, sharding.bar(20, 40, 4) AS half,
       sharding.bar(value => 3, max => 4, width => 2) AS named;
-- Each step of an eighth adds one eighth block.
SELECT string_agg(sharding.bar(i, 16, 2), '|' ORDER BY i) AS eighths
  FROM generate_series(0, 16) AS i;
SELECT sharding.bar(NULL, 1) IS NULL AS strict;
SELECT pg_temp.err($$SELECT sharding.bar(1, 1, -1)$$);
SELECT pg_temp.err($$SELECT sharding.bar(1, 1, 1001)$$);

-- imbalance: max / mean.
SELECT sharding.imbalance(ARRAY[100, 100, 100, 490]) AS seed_hash,
       sharding.imbalance(ARRAY[150, 120, 120, 400]::bigint[]) AS seed_directory,
       sharding.imbalance(ARRAY[5, 5, 5]::smallint[]) AS even,
       sharding.imbalance(ARRAY[0, 0, 0, 8]::real[]) AS one_hot,
       sharding.imbalance(ARRAY[1.5, 0.5]::numeric[]) AS numeric_,
       sharding.imbalance(ARRAY[[1, 2], [3, 6]]::float8[]) AS two_dims;
-- NULL for empty or all-zero input; NULL elements are skipped like aggregates skip them.
SELECT sharding.imbalance('{}'::integer[]) IS NULL AS empty_null,
       sharding.imbalance(ARRAY[0, 0]) IS NULL AS zero_null,
       sharding.imbalance(ARRAY[NULL, NULL]::integer[]) IS NULL AS all_null,
       sharding.imbalance(NULL::integer[]) IS NULL AS strict,
       sharding.imbalance(ARRAY[4, NULL, 2]) AS nulls_skipped;
SELECT pg_temp.err($$SELECT sharding.imbalance(ARRAY['a', 'b'])$$);
SELECT pg_temp.err($$SELECT sharding.imbalance(ARRAY[now()])$$);
SELECT pg_temp.err($$SELECT sharding.imbalance(ARRAY[3, -1])$$);
SELECT pg_temp.err($$SELECT sharding.imbalance(ARRAY[1, 'NaN']::float8[])$$);
SELECT pg_temp.err($$SELECT sharding.imbalance(ARRAY[1, 'Infinity']::numeric[])$$);

-- The seed's tenants: 40 tenants of 10 units, t007 a whale of 400, one row per unit.
CREATE TABLE units (id serial PRIMARY KEY, tenant text, tenant_no integer, tenant_id uuid,
                    tenant_bytes bytea, tenant_small smallint, tenant_big bigint,
                    tenant_var varchar(10), amount numeric);
INSERT INTO units (tenant, tenant_no)
SELECT 't' || lpad(t::text, 3, '0'), t
  FROM generate_series(1, 40) AS t, generate_series(1, CASE WHEN t = 7 THEN 400 ELSE 10 END);
UPDATE units SET tenant_id = md5(tenant)::uuid, tenant_bytes = convert_to(tenant, 'UTF8'),
                 tenant_small = tenant_no, tenant_big = tenant_no * 10000000000, tenant_var = tenant;
-- Rows with a NULL key lie on no shard and are not counted.
INSERT INTO units (tenant) SELECT NULL FROM generate_series(1, 5);

-- The naive answer, one query per shard count, to compare with.
CREATE FUNCTION pg_temp.naive(n integer) RETURNS TABLE (shard integer, rows bigint)
    LANGUAGE sql AS $$
    SELECT g, (SELECT count(*) FROM units WHERE sharding.shard_of(tenant, n) = g)
      FROM generate_series(0, n - 1) AS g ORDER BY g $$;

-- distribution: one row per shard, empty shards included, rows as the naive count.
SELECT count(*) AS shards, sum(d.rows) AS keyed_rows, round(sum(share)::numeric, 12) AS share_sum,
       bool_and(d.rows = n.rows) AS matches_naive
  FROM sharding.distribution('units', 'tenant', 4) AS d JOIN pg_temp.naive(4) AS n USING (shard);
SELECT count(*) AS shards, count(*) FILTER (WHERE d.rows = 0) AS empty_shards,
       count(*) FILTER (WHERE bar = '') AS empty_bars, round(sum(share)::numeric, 12) AS share_sum,
       bool_and(d.rows = n.rows) AS matches_naive, min(shard) AS first, max(shard) AS last
  FROM sharding.distribution('units', 'tenant', 64) AS d JOIN pg_temp.naive(64) AS n USING (shard);
-- The largest shard draws the full 40-character bar, the others proportionally less.
SELECT bool_and((char_length(bar) = 40) = (rows = max_rows)) AS full_bar_is_max,
       bool_and(bar = sharding.bar(rows, max_rows)) AS same_bar_as_bar_function,
       bool_and(share = rows::float8 / 790) AS shares
  FROM (SELECT *, max(rows) OVER () AS max_rows FROM sharding.distribution('units', 'tenant', 4)) AS d;
-- Its loads feed imbalance.
SELECT sharding.imbalance(array_agg(rows)) = max(rows) / avg(rows)::float8 AS imbalance_agrees
  FROM sharding.distribution('units', 'tenant', 4);
-- One shard holds everything; more shards than keys leaves most shards empty.
SELECT * FROM sharding.distribution('units', 'tenant', 1);
SELECT count(*) FILTER (WHERE rows > 0) AS non_empty, count(*) AS shards
  FROM sharding.distribution('units', 'tenant', 1000);
-- Each key type hashes with its own overload (integers widened: same shards).
SELECT c AS key_column,
       (SELECT array_agg(rows ORDER BY shard) FROM sharding.distribution('units', c, 8)) =
       (SELECT array_agg(n ORDER BY s) FROM (
            SELECT s, count(k) AS n FROM generate_series(0, 7) AS s LEFT JOIN (
                SELECT CASE c WHEN 'tenant_id' THEN sharding.shard_of(tenant_id, 8)
                              WHEN 'tenant_bytes' THEN sharding.shard_of(tenant_bytes, 8)
                              WHEN 'tenant_small' THEN sharding.shard_of(tenant_small, 8)
                              WHEN 'tenant_no' THEN sharding.shard_of(tenant_no, 8)
                              WHEN 'tenant_big' THEN sharding.shard_of(tenant_big, 8)
                              ELSE sharding.shard_of(tenant_var::text, 8) END AS k
                  FROM units) AS x ON x.k = s GROUP BY s) AS y) AS matches
  FROM unnest(ARRAY['tenant_id', 'tenant_bytes', 'tenant_small', 'tenant_no', 'tenant_big',
                    'tenant_var']) AS c;
SELECT (SELECT array_agg(rows) FROM sharding.distribution('units', 'tenant_small', 16)) =
       (SELECT array_agg(rows) FROM sharding.distribution('units', 'tenant_no', 16)) AS int2_is_int4,
       (SELECT array_agg(rows) FROM sharding.distribution('units', 'tenant_bytes', 16)) =
       (SELECT array_agg(rows) FROM sharding.distribution('units', 'tenant', 16)) AS bytes_is_text,
       (SELECT array_agg(rows) FROM sharding.distribution('units', 'tenant_var', 16)) =
       (SELECT array_agg(rows) FROM sharding.distribution('units', 'tenant', 16)) AS varchar_is_text;
-- An empty table: every shard empty, share NULL (0 / 0), no bar.
CREATE TABLE nothing (k bigint);
SELECT * FROM sharding.distribution('nothing', 'k', 3);
-- Named notation; a quoted column name and a schema-qualified table.
CREATE SCHEMA "Odd Schema";
CREATE TABLE "Odd Schema"."Odd Table" ("Key Col" text);
INSERT INTO "Odd Schema"."Odd Table" VALUES ('a'), ('b'), ('b');
SELECT sum(rows) AS rows FROM sharding.distribution(shards => 2, key_column => 'Key Col',
                                                    tbl => '"Odd Schema"."Odd Table"');
-- STRICT: NULL arguments describe nothing.
SELECT count(*) AS rows_for_null FROM sharding.distribution('units', 'tenant', NULL);
-- Errors name the bad value.
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('units', 'no_such', 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('units', 'amount', 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('units', 'tenant', 0)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('units', 'tenant', -5)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('no_such_table', 'tenant', 4)$$);
ALTER TABLE units ADD COLUMN dropped text;
ALTER TABLE units DROP COLUMN dropped;
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('units', 'dropped', 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('units', 'ctid', 4)$$);

-- One scan of the table per call, however many shards.
BEGIN;
SELECT seq_scan AS before FROM pg_stat_xact_user_tables WHERE relid = 'units'::regclass \gset
SELECT count(*) AS shards FROM sharding.distribution('units', 'tenant', 64);
SELECT count(*) AS whales FROM sharding.whales('units', 'tenant', 64);
SELECT seq_scan - :before AS scans_for_two_calls FROM pg_stat_xact_user_tables
 WHERE relid = 'units'::regclass;
COMMIT;

-- whales: the seed's whale, found; its share of its shard and of the table.
SELECT key, rows, shard = sharding.shard_of('t007', 4) AS right_shard,
       share_of_shard = 400.0 / (SELECT rows FROM sharding.distribution('units', 'tenant', 4)
                                  WHERE shard = sharding.shard_of('t007', 4)) AS shard_share,
       share_of_total = 400.0 / 790 AS total_share
  FROM sharding.whales('units', 'tenant', 4) LIMIT 1;
-- Over 4 shards a normal tenant holds far less than half of its shard.
SELECT key, rows FROM sharding.whales('units', 'tenant', 4, 0.5);
-- min_share 0 lists every key, largest first; min_share 1 only keys alone on their shard.
SELECT count(*) AS keys, sum(rows) AS rows, (array_agg(key))[1] AS first,
       bool_and(share_of_shard >= 0 AND share_of_shard <= 1) AS shares_ok,
       round(sum(share_of_total)::numeric, 12) AS total_share
  FROM sharding.whales('units', 'tenant', 4, 0);
SELECT key, rows, share_of_shard FROM sharding.whales('units', 'tenant', 1000, 1) WHERE key = 't007';
-- With 40 shards, every key holds at least its share of its shard: the list
-- agrees with a direct computation.
SELECT (SELECT count(*) FROM sharding.whales('units', 'tenant_no', 40, 0.4)) =
       (SELECT count(*) FROM (SELECT tenant_no, count(*) AS n,
                                     sum(count(*)) OVER (PARTITION BY sharding.shard_of(tenant_no, 40)) AS s
                                FROM units WHERE tenant_no IS NOT NULL GROUP BY tenant_no) AS x
         WHERE n / s >= 0.4) AS agrees;
-- Keys come back as text: bytea in its hex form, uuid printed.
SELECT key FROM sharding.whales('units', 'tenant_bytes', 4) LIMIT 1;
-- The hex form, whatever bytea_output says (pins match on it).
SET bytea_output = 'escape';
SELECT key FROM sharding.whales('units', 'tenant_bytes', 4) LIMIT 1;
RESET bytea_output;
SELECT key = md5('t007') FROM (SELECT replace(key, '-', '') AS key
                                 FROM sharding.whales('units', 'tenant_id', 4) LIMIT 1) AS w;
SELECT count(*) AS whales_in_empty FROM sharding.whales('nothing', 'k', 4);
SELECT pg_temp.err($$SELECT * FROM sharding.whales('units', 'tenant', 4, 1.5)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.whales('units', 'tenant', 4, -0.1)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.whales('units', 'tenant', 4, 'NaN')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.whales('units', 'tenant', 0)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.whales('units', 'nope', 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.whales('units', 'amount', 4)$$);

-- The caller needs SELECT on the table (SECURITY INVOKER).
CREATE ROLE regress_observe_reader;
SET ROLE regress_observe_reader;
SELECT pg_temp.err($$SELECT * FROM sharding.distribution('units', 'tenant', 4)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.whales('units', 'tenant', 4)$$);
SELECT sharding.imbalance(ARRAY[1, 3]) AS anyone_may;
RESET ROLE;
GRANT SELECT ON units TO regress_observe_reader;
SET ROLE regress_observe_reader;
SELECT sum(rows) AS granted FROM sharding.distribution('units', 'tenant', 4);
RESET ROLE;
REVOKE ALL ON units FROM regress_observe_reader;
DROP ROLE regress_observe_reader;

-- Volatility, strictness and parallel safety, on purpose.
SELECT p.oid::regprocedure AS function, p.provolatile, p.proisstrict, p.proparallel, p.prosecdef,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
  FROM pg_proc AS p
 WHERE p.pronamespace = 'sharding'::regnamespace
   AND p.proname IN ('bar', 'imbalance', 'distribution', 'whales', 'map_load')
 ORDER BY p.proname;

-- map_load: where node_for sends the rows. A map of 8 logical shards over
-- three nodes (3, 3, 2), the whale pinned to a dedicated node, and a pin for
-- a key the table does not hold.
SELECT sharding.create_map('tenants', 8, ARRAY['n1', 'n2', 'n3']) AS ok \gset
SELECT sharding.pin('tenants', 't007', 'dedicated'), sharding.pin('tenants', 'ghost', 'n2') \gset
-- The routing rule spelled out from the config tables, to compare with
-- (test/pgtap/observe_map_load.sql compares with node_for itself).
CREATE FUNCTION pg_temp.route(k text) RETURNS text LANGUAGE sql AS $$
    SELECT COALESCE((SELECT node FROM sharding.pins WHERE map = 'tenants' AND key = k),
                    (SELECT node FROM sharding.shards
                      WHERE map = 'tenants' AND logical = sharding.shard_of(k, 8))) $$;
SELECT node, logical_shards, pinned_keys, rows, char_length(bar) AS bar_length
  FROM sharding.map_load('tenants', 'units', 'tenant');
SELECT bool_and(m.rows = COALESCE(r.n, 0)) AS rows_match_routing, sum(m.rows) AS total,
       round(sum(m.share)::numeric, 12) AS share_sum
  FROM sharding.map_load('tenants', 'units', 'tenant') AS m
  LEFT JOIN (SELECT pg_temp.route(tenant) AS node, count(*) AS n FROM units
              WHERE tenant IS NOT NULL GROUP BY 1) AS r USING (node);
-- Integer keys are pinned by their text form ('7'); pins never match other keys.
SELECT sharding.pin('tenants', '7', 'dedicated') \gset
SELECT node, rows FROM sharding.map_load('tenants', 'units', 'tenant_no') WHERE node = 'dedicated';
SELECT node, rows FROM sharding.map_load('tenants', 'units', 'tenant_big') WHERE node = 'dedicated';
-- bytea keys are pinned by their hex text form, whatever bytea_output says.
SELECT sharding.pin('tenants', '\x74303037', 'dedicated') \gset
SET bytea_output = 'escape';
SELECT node, rows FROM sharding.map_load('tenants', 'units', 'tenant_bytes') WHERE node = 'dedicated';
RESET bytea_output;
-- An empty table: every node listed, no rows, share NULL.
SELECT node, rows, share, bar FROM sharding.map_load('tenants', 'nothing', 'k');
SELECT pg_temp.err($$SELECT * FROM sharding.map_load('no_such_map', 'units', 'tenant')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.map_load('tenants', 'units', 'nope')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.map_load('tenants', 'units', 'amount')$$);
SELECT sharding.drop_map('tenants') \gset

DROP TABLE units, nothing;
DROP SCHEMA "Odd Schema" CASCADE;
DROP EXTENSION sharding;
