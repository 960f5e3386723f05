-- Section 9: order per key without giving up dynamic claims
-- (claim_ordered), and claims routed by a map with a safe handoff
-- (claim_node). src/queue_ordered.cpp.

-- The node each worker last claimed through with claim_node, per map: one
-- row per worker name (never per key). claim_node treats a live lease held
-- by a worker registered for another node as held through that node, and
-- leaves its key (and the logical shard of an unpinned key) alone
-- until the lease ends: the handoff rule. Workers register themselves on
-- every claim_node call that changes their node, so everyone may write it.
CREATE TABLE sharding.claim_node_workers (
    map    text NOT NULL,
    worker text NOT NULL,
    node   text NOT NULL,
    since  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    registered_by name NOT NULL DEFAULT CURRENT_USER,
    PRIMARY KEY (map, worker)
);
COMMENT ON TABLE sharding.claim_node_workers IS
    'the node each worker last claimed through (claim_node); a live lease of another node''s worker holds back the handoff';
COMMENT ON COLUMN sharding.claim_node_workers.registered_by IS
    'the role that registered the worker name; only it (or sharding_admin) may move the name to another node';
SELECT pg_catalog.pg_extension_config_dump('sharding.claim_node_workers', '');
GRANT SELECT, INSERT, UPDATE ON sharding.claim_node_workers TO PUBLIC;
GRANT DELETE ON sharding.claim_node_workers TO sharding_admin;
-- Row security. Moving another worker's name to node B would make its live
-- leases count as B's own, so B would claim their keys and shards at once:
-- the handoff broken by any role that may write here. So everyone reads
-- every row (the handoff compares them), a role registers names as itself
-- (registered_by) and re-registers only names it registered (claim_node
-- then fails with 42501 for a name another role holds); sharding_admin may
-- change and delete any row. Worker names remain unauthenticated within a
-- role: a role's workers must use distinct names on distinct nodes.
ALTER TABLE sharding.claim_node_workers ENABLE ROW LEVEL SECURITY;
CREATE POLICY claim_node_workers_read ON sharding.claim_node_workers FOR SELECT USING (true);
CREATE POLICY claim_node_workers_insert ON sharding.claim_node_workers FOR INSERT
    WITH CHECK (registered_by OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY claim_node_workers_update ON sharding.claim_node_workers FOR UPDATE
    USING (registered_by OPERATOR(pg_catalog.=) CURRENT_USER)
    WITH CHECK (registered_by OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE POLICY claim_node_workers_admin ON sharding.claim_node_workers TO sharding_admin
    USING (true) WITH CHECK (true);

-- claim_ordered and claim_node are not STRICT: the queue argument is
-- NULL::table by design, shards/shard_count are NULL by default; other NULL
-- arguments raise 22023.
CREATE FUNCTION sharding.claim_ordered(queue anyelement, worker text, batch integer DEFAULT 50,
                                       lease interval DEFAULT '5 minutes', key_column name DEFAULT 'key',
                                       shards integer[] DEFAULT NULL, shard_count integer DEFAULT NULL)
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim_ordered' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.claim_ordered(anyelement, text, integer, interval, name, integer[], integer) IS
    'as claim, but per key strictly in (created, id) order with at most one job of a key in flight; keys take turns, oldest head first';

CREATE FUNCTION sharding.claim_node(queue anyelement, map text, node text, worker text, batch integer DEFAULT 50,
                                    lease interval DEFAULT '5 minutes', key_column name DEFAULT 'key',
                                    ordered boolean DEFAULT false)
    RETURNS SETOF anyelement
    AS 'MODULE_PATHNAME', 'sharding_claim_node' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 50
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.claim_node(anyelement, text, text, text, integer, interval, name, boolean) IS
    'claims only jobs node_for(map, key) sends to node, nothing another node''s worker still holds under a live lease; ordered as claim_ordered';

CREATE FUNCTION sharding._claim_ordered_sql(queue regclass, variant integer, key_column name DEFAULT 'key')
    RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__claim_ordered_sql' LANGUAGE C STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._claim_ordered_sql(regclass, integer, name) IS
    'internal: SQL text of a claim_ordered/claim_node (ordered) statement (variant bits: 1 ordered, 2 shards, 4 node, 8 max_attempts, 16 handoff exclusion)';

-- create_ordered_indexes(queue, key_column): the indexes that keep
-- claim_ordered and claim_node an index walk, each created only when the
-- table has no index of the same definition:
--   (key_column, status, created, id) WHERE status IN ('pending', 'processing')
--       the head test: two probes per candidate, whatever the backlog;
--   ([priority DESC,] [run_at,] created, id) WHERE status = 'pending'
--       pending jobs in claim order (create_queue makes it);
--   (claim_expires) WHERE status = 'processing'
--       expired leases (create_queue makes it).
-- Returns the indexes it created. Needs ownership of the table, as CREATE
-- INDEX does. Not STRICT: a NULL argument raises 22023.
CREATE FUNCTION sharding.create_ordered_indexes(queue regclass, key_column name DEFAULT 'key')
    RETURNS SETOF regclass
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    wanted text[];
    def text;
    existing text[];
    idx oid;
    order_cols text := 'created, id';
BEGIN
    IF queue IS NULL OR key_column IS NULL THEN
        RAISE EXCEPTION 'queue and key_column must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = queue AND a.attname = key_column
                      AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'queue table % lacks key column "%"', queue, key_column
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = queue AND a.attname = 'run_at'
                  AND a.attnum > 0 AND NOT a.attisdropped) THEN
        order_cols := 'run_at, ' || order_cols;
    END IF;
    IF EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = queue AND a.attname = 'priority'
                  AND a.attnum > 0 AND NOT a.attisdropped) THEN
        order_cols := 'priority DESC, ' || order_cols;
    END IF;
    -- As pg_get_indexdef spells them after "USING ".
    wanted := ARRAY[
        format('btree (%s, status, created, id) WHERE (status = ANY (ARRAY[''pending''::text, ''processing''::text]))',
               quote_ident(key_column)),
        format('btree (%s) WHERE (status = ''pending''::text)', order_cols),
        'btree (claim_expires) WHERE (status = ''processing''::text)'];
    SELECT coalesce(array_agg(regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '')), '{}')
      INTO existing
      FROM pg_index i WHERE i.indrelid = queue;
    FOREACH def IN ARRAY wanted LOOP
        CONTINUE WHEN def = ANY (existing);
        EXECUTE format('CREATE INDEX ON %s USING %s', queue, def);
        SELECT c.oid INTO idx FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = queue
           AND regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '') = def
         ORDER BY c.oid DESC LIMIT 1;
        RETURN NEXT idx;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sharding.create_ordered_indexes(regclass, name) IS
    'creates the indexes claim_ordered and claim_node walk (head test, pending in claim order, expired leases) where missing';

CREATE FUNCTION sharding._current_version(rel oid, tid tid) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__current_version' LANGUAGE C VOLATILE STRICT PARALLEL SAFE COST 10;
COMMENT ON FUNCTION sharding._current_version(oid, tid) IS
    'internal (claim_ordered, claim_node): whether a row version is still its row''s latest committed one, checked just before FOR UPDATE';
