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
    AS 'MODULE_PATHNAME', 'sharding_bar' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.bar(float8, float8, integer) IS
    'Unicode bar of value relative to max: width characters at max, to the nearest eighth; empty for 0';

CREATE FUNCTION sharding.imbalance(loads anyarray) RETURNS float8
    AS 'MODULE_PATHNAME', 'sharding_imbalance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
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
