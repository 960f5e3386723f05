-- Observing load (docs/observe.md).
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

-- The histogram bar every observing function draws (src/core/observe_core.hpp).
CREATE FUNCTION sharding.bar(value float8, max float8, width integer DEFAULT 40) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_bar' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.bar(float8, float8, integer) IS
    'Unicode bar of value relative to max: width characters at max, to the nearest eighth; empty for 0';

CREATE FUNCTION sharding.imbalance(loads anyarray) RETURNS float8
    AS 'MODULE_PATHNAME', 'sharding_imbalance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.imbalance(anyarray) IS
    'max / mean of a numeric array, NULL elements skipped; NULL when empty or all zero (1.0 = perfectly even)';

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

-- map_load counts each row where sharding.node_for (docs/maps.md)
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

-- What docs/observe.md counts beyond load: fan-out statements, the
-- worst shard's lag, rebalancing by measured load.

-- Fan-out counters (src/observe/fanout.cpp). They live in shared memory, which only
-- a library in shared_preload_libraries gets; without it the view is empty
-- and says so in a NOTICE.

-- Internal: this database's counters, plus a row with relid 0 whose since is
-- the last fanout_reset() here (or the server's start). VOLATILE: counters
-- move under any snapshot. PARALLEL RESTRICTED: the counters are read in the
-- leader. Not STRICT: no argument.
CREATE FUNCTION sharding._fanout_counts(OUT relid oid, OUT single_shard bigint, OUT fan_out bigint,
                                        OUT since timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'sharding__fanout_counts' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION sharding._fanout_counts() IS
    'internal: fan-out counters of this database from shared memory (NOTICE and no row without preload)';

CREATE VIEW sharding.fanout_stats AS
    WITH c AS MATERIALIZED (SELECT * FROM sharding._fanout_counts())
    SELECT d.schema_name, d.table_name,
           (COALESCE(t.single_shard, 0) OPERATOR(pg_catalog.+) COALESCE(t.fan_out, 0))::bigint AS queries,
           COALESCE(t.single_shard, 0)::bigint AS single_shard,
           COALESCE(t.fan_out, 0)::bigint AS fan_out,
           COALESCE(t.since, z.since) AS since
      FROM sharding.distributed_tables AS d
      JOIN c AS z ON z.relid OPERATOR(pg_catalog.=) 0::oid
      LEFT JOIN c AS t
        ON t.relid OPERATOR(pg_catalog.=)
           pg_catalog.to_regclass(pg_catalog.format('%I.%I', d.schema_name, d.table_name))::oid
     ORDER BY d.schema_name, d.table_name;
COMMENT ON VIEW sharding.fanout_stats IS
    'per distributed table: statements that touched it (queries), those fixed to one logical shard by their key conditions (single_shard), the others (fan_out), counted since; needs shared_preload_libraries = ''sharding''';
GRANT SELECT ON sharding.fanout_stats TO PUBLIC;

-- @object sharding.fanout_info
-- fanout_info(): the counters' capacity and evictions. sharding.fanout_max
-- (a server setting, 4096 by default) entries hold the counters of as many
-- (database, distributed table) pairs; when all are taken, the least-used
-- tables are evicted, as pg_stat_statements evicts statements: an evicted
-- table shows zeros in fanout_stats until it is counted again, from then
-- on. slots: sharding.fanout_max; used: tables counted now, all databases;
-- evicted: tables of this database evicted since its last fanout_reset()
-- (or the server's start); evicted_all: evictions in all databases since the
-- server started. VOLATILE: shared counters. PARALLEL RESTRICTED: read in
-- the leader. Not STRICT: no argument. Without preload: a NOTICE, no row.
CREATE FUNCTION sharding.fanout_info(OUT slots integer, OUT used integer, OUT evicted bigint,
                                     OUT evicted_all bigint)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'sharding_fanout_info' LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 1;
COMMENT ON FUNCTION sharding.fanout_info() IS
    'fan-out counters: slots (sharding.fanout_max), used, tables of this database evicted since the last reset, evictions in all databases';
-- @end

-- @object sharding.fanout_reset
-- fanout_reset(): zeroes this database's counters. VOLATILE, PARALLEL
-- UNSAFE: it writes shared state. Everyone's picture changes, so it is an
-- admin function, as pg_stat_statements_reset is.
CREATE FUNCTION sharding.fanout_reset() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding_fanout_reset' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fanout_reset() IS
    'zeroes the fan-out counters of this database; fanout_stats.since becomes now, fanout_info().evicted zero';
REVOKE ALL ON FUNCTION sharding.fanout_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.fanout_reset() TO sharding_admin;
-- @end

-- Every change to sharding.distributed_tables (distribute, undistribute, a
-- direct write, a restore, logical replication to a follower) makes every
-- backend re-read it before counting. Row triggers, enabled ALWAYS: the
-- apply worker of a follower fires only those.
CREATE FUNCTION sharding._fanout_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__fanout_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._fanout_changed() IS
    'internal: makes every backend re-read the distributed tables it counts';
CREATE TRIGGER fanout_changed AFTER INSERT OR UPDATE OR DELETE ON sharding.distributed_tables
    FOR EACH ROW EXECUTE FUNCTION sharding._fanout_changed();
CREATE TRIGGER fanout_truncated AFTER TRUNCATE ON sharding.distributed_tables
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._fanout_changed();
ALTER TABLE sharding.distributed_tables ENABLE ALWAYS TRIGGER fanout_changed;
ALTER TABLE sharding.distributed_tables ENABLE ALWAYS TRIGGER fanout_truncated;

-- shard_lag(queue, shards, key_column): per shard 0..shards-1, the claimable
-- jobs (pending and due, or processing under a lapsed lease) and how long
-- the oldest of them has waited: since it was created, or since its run_at
-- when that is later (a job scheduled for later was not waiting before). One
-- scan, one aggregate grouped by shard_of(key, shards). NULL age: nothing to
-- claim on that shard. bar draws the age relative to the worst shard.
-- STABLE (reads), STRICT (NULL queue or count: no rows), PARALLEL RESTRICTED
-- (the queue may be a temporary table).
CREATE FUNCTION sharding.shard_lag(queue regclass, shards integer, key_column name DEFAULT 'key')
    RETURNS TABLE (shard integer, pending bigint, oldest_pending_age interval, bar text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL RESTRICTED
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    col text;
    has_run_at boolean;
    due text := '';
    since text := 't.created';
BEGIN
    IF shards < 1 THEN
        RAISE EXCEPTION 'shard count must be between 1 and 2147483647, got %', shards
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH col IN ARRAY ARRAY['status', 'created', 'claim_expires'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid = queue AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped) THEN
            RAISE EXCEPTION 'table % has no column "%", so it is not a queue', queue, col
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A queue has id, status, owner, claim_expires and created (sharding.create_queue makes one).';
        END IF;
    END LOOP;
    PERFORM sharding._key_column_type(queue, key_column);
    has_run_at := EXISTS (SELECT FROM pg_catalog.pg_attribute a
                           WHERE a.attrelid = queue AND a.attname = 'run_at' AND a.attnum > 0
                             AND NOT a.attisdropped);
    IF has_run_at THEN
        due := ' AND (t.run_at IS NULL OR t.run_at <= pg_catalog.now())';
        since := 'GREATEST(t.created, t.run_at)';  -- NULL run_at: created
    END IF;
    RETURN QUERY EXECUTE format(
        $q$SELECT g.shard::integer, COALESCE(k.n, 0)::bigint, k.age,
                  sharding.bar(COALESCE(EXTRACT(epoch FROM k.age), 0)::float8,
                               max(EXTRACT(epoch FROM k.age)) OVER ()::float8, 40)
             FROM pg_catalog.generate_series(0, $1 - 1) AS g(shard)
             LEFT JOIN (SELECT sharding.shard_of(t.%1$I, $1) AS shard, pg_catalog.count(*) AS n,
                               pg_catalog.now() - min(%3$s) AS age
                          FROM %2$s AS t
                         WHERE t.%1$I IS NOT NULL
                           AND ((t.status = 'pending'%4$s)
                                OR (t.status = 'processing' AND t.claim_expires < pg_catalog.now()))
                         GROUP BY 1) AS k ON k.shard = g.shard
            ORDER BY g.shard$q$,
        key_column, queue, since, due)
    USING shards;
END
$$;
COMMENT ON FUNCTION sharding.shard_lag(regclass, integer, name) IS
    'per shard of a queue: claimable jobs and the wait of the oldest, with a bar; look at the worst shard, not the average';

-- rebalance_by_load(map, nodes, loads, max_imbalance, dry_run): moves shards
-- so that only `nodes` own them and the largest node load is at most
-- max_imbalance x the mean (or as low as the shards allow), with as few
-- moves as the planner (src/core/rebalance.cpp) finds. Not STRICT: NULL
-- arguments raise 22023. Locks the map as rebalance does.
-- @object sharding.rebalance_by_load
CREATE FUNCTION sharding.rebalance_by_load(map text, nodes text[], loads float8[],
                                           max_imbalance float8 DEFAULT 1.10, dry_run boolean DEFAULT false)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    bad integer;
BEGIN
    PERFORM sharding._check_nodes(nodes);
    IF dry_run IS NULL THEN
        RAISE EXCEPTION 'dry_run must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_imbalance IS NULL OR NOT (max_imbalance >= 1) OR max_imbalance = 'Infinity'::float8 THEN
        RAISE EXCEPTION 'max_imbalance must be a finite number of at least 1, got %',
            coalesce(max_imbalance::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'It bounds the largest node load divided by the mean node load, which is never below 1.';
    END IF;
    l := sharding._require_map($1, false);
    IF loads IS NULL THEN
        RAISE EXCEPTION 'loads must list one load per logical shard of map "%", got NULL', $1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_ndims(loads) IS DISTINCT FROM 1 OR pg_catalog.cardinality(loads) <> l THEN
        RAISE EXCEPTION 'loads must list one load per logical shard of map "%" (%), got % entries',
            $1, l, pg_catalog.cardinality(loads)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'loads[i + 1] is the load of logical shard i.';
    END IF;
    SELECT u.i INTO bad FROM pg_catalog.unnest(loads) WITH ORDINALITY AS u(v, i)
     WHERE u.v IS NULL OR NOT (u.v >= 0) OR u.v = 'Infinity'::float8 ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'load of logical shard % must be a finite number >= 0, got %',
            bad - 1, coalesce(loads[bad + pg_catalog.array_lower(loads, 1) - 1]::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'loads[i + 1] is the load of logical shard i.';
    END IF;
    RETURN QUERY SELECT * FROM sharding._rebalance_apply($1, nodes, dry_run, 'rebalance_by_load', loads, max_imbalance);
END $$;
COMMENT ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) IS
    'moves shards so the largest node load is at most max_imbalance x the mean (or as low as shards allow), fewest moves; each raises the shard''s epoch; dry_run only reports';
-- @end

-- @object sharding._rebalance_by_load_plan
CREATE FUNCTION sharding._rebalance_by_load_plan(owners text[], nodes text[], loads float8[],
                                                 max_imbalance float8)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', 'sharding__rebalance_by_load_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._rebalance_by_load_plan(text[], text[], float8[], float8) IS
    'internal: the load-aware plan (src/core/rebalance.cpp), ordered by logical shard';
-- @end

-- Changing maps: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) TO sharding_admin;
