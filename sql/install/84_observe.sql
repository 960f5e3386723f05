-- Section 11: counting what the seeds say to count: fan-out statements, the
-- worst shard's lag, rebalancing by measured load.

-- Fan-out counters (src/fanout.cpp). They live in shared memory, which only
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

-- fanout_reset(): zeroes this database's counters. VOLATILE, PARALLEL
-- UNSAFE: it writes shared state. Everyone's picture changes, so it is an
-- admin function, as pg_stat_statements_reset is.
CREATE FUNCTION sharding.fanout_reset() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding_fanout_reset' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fanout_reset() IS
    'zeroes the fan-out counters of this database; fanout_stats.since becomes now';
REVOKE ALL ON FUNCTION sharding.fanout_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.fanout_reset() TO sharding_admin;

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
-- moves as the planner (src/rebalance.cpp) finds. Not STRICT: NULL
-- arguments raise 22023. Locks the map as rebalance does.
CREATE FUNCTION sharding.rebalance_by_load(map text, nodes text[], loads float8[],
                                           max_imbalance float8 DEFAULT 1.10, dry_run boolean DEFAULT false)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    l integer;
    owners text[];
    bad integer;
    mv record;
    moved integer := 0;
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
    FOR mv IN SELECT * FROM sharding._rebalance_by_load_plan(owners, nodes, loads, max_imbalance) LOOP
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
COMMENT ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) IS
    'moves shards so the largest node load is at most max_imbalance x the mean (or as low as shards allow), fewest moves; each raises the shard''s epoch; dry_run only reports';

CREATE FUNCTION sharding._rebalance_by_load_plan(owners text[], nodes text[], loads float8[],
                                                 max_imbalance float8)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', 'sharding__rebalance_by_load_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._rebalance_by_load_plan(text[], text[], float8[], float8) IS
    'internal: the load-aware plan (src/rebalance.cpp), ordered by logical shard';

-- Changing maps: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_by_load(text, text[], float8[], float8, boolean) TO sharding_admin;
