-- Sections 10 and 12: queues that stay fast under pressure (run_at,
-- priority, batch enqueue, retry backoff, purge, health, wakeups) and the
-- 1.2 amendments of the fenced functions (src/queue.cpp).
--
-- All SECURITY INVOKER: the caller's privileges on the queue table apply.

-- complete(queue, ids, worker, attempts): the batch form fenced per id.
-- Not STRICT: a NULL argument raises 22023 naming it.
CREATE FUNCTION sharding.complete(queue regclass, ids bigint[], worker text, attempts integer[])
    RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding_complete_attempts' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, bigint[], text, integer[]) IS
    'marks done every listed job that is processing, owned by worker and in claim number attempts[i] (NULL: unchecked), in one statement; returns the ids that passed';

-- integer ids (1.2): the same functions, so that complete('jobs', 42, 'w1')
-- needs no cast. An integer literal matches these exactly; a bigint the
-- bigint forms. Not STRICT, as their bigint forms.
CREATE FUNCTION sharding.complete(queue regclass, id integer, worker text, attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_complete_int4' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.complete(regclass, integer, text, integer) IS
    'marks the job done if it is processing, owned by worker and (if given) in claim number attempt (integer id)';

CREATE FUNCTION sharding.fail(queue regclass, id integer, worker text, retry boolean DEFAULT true,
                              attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_fail_int4' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fail(regclass, integer, text, boolean, integer) IS
    'same fence as complete; back to pending (retry, while max_attempts allows; run_at pushed back by the queue''s backoff) or failed (integer id)';

CREATE FUNCTION sharding.extend_lease(queue regclass, id integer, worker text, lease interval,
                                      attempt integer DEFAULT NULL)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_extend_lease_int4' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.extend_lease(regclass, integer, text, interval, integer) IS
    'same fence as complete; sets claim_expires = now() + lease (integer id)';

-- enqueue_many: one INSERT ... SELECT over the unnested arrays, ids in the
-- order of keys (identity values are drawn in the order rows are inserted).
-- Not STRICT: payloads and run_at may be NULL; a NULL queue or keys raise
-- 22023.
CREATE FUNCTION sharding.enqueue_many(queue regclass, keys text[], payloads jsonb[] DEFAULT NULL,
                                      run_at timestamptz DEFAULT NULL, priority smallint DEFAULT 0)
    RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    has_run_at boolean;
    has_priority boolean;
    ids bigint[];
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF keys IS NULL THEN
        RAISE EXCEPTION 'keys must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF priority IS NULL THEN
        RAISE EXCEPTION 'priority must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF array_ndims(keys) > 1 OR array_ndims(payloads) > 1 THEN
        RAISE EXCEPTION 'keys and payloads must be one-dimensional arrays' USING ERRCODE = 'invalid_parameter_value';
    ELSIF payloads IS NOT NULL AND cardinality(payloads) <> cardinality(keys) THEN
        RAISE EXCEPTION 'keys and payloads must have the same length, got % keys and % payloads',
            cardinality(keys), cardinality(payloads) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(bool_or(a.attname = 'run_at'), false), coalesce(bool_or(a.attname = 'priority'), false)
      INTO has_run_at, has_priority
      FROM pg_attribute a
     WHERE a.attrelid = queue AND a.attnum > 0 AND NOT a.attisdropped AND a.attname IN ('run_at', 'priority');
    IF enqueue_many.run_at IS NOT NULL AND NOT has_run_at THEN
        RAISE EXCEPTION 'queue table % has no column "run_at" for run_at %', queue, enqueue_many.run_at
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF enqueue_many.priority <> 0 AND NOT has_priority THEN
        RAISE EXCEPTION 'queue table % has no column "priority" for priority %', queue, enqueue_many.priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(keys) = 0 THEN
        RETURN '{}'::bigint[];
    END IF;
    EXECUTE format('WITH ins AS (INSERT INTO %s (key, payload%s%s) '
                   'SELECT k.key, k.payload%s%s FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) WITH ORDINALITY AS k(key, payload, ord) '
                   'ORDER BY k.ord RETURNING id) '
                   'SELECT pg_catalog.array_agg(ins.id ORDER BY ins.id) FROM ins',
                   queue,
                   CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', run_at' ELSE '' END,
                   CASE WHEN has_priority THEN ', priority' ELSE '' END,
                   CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', $3' ELSE '' END,
                   CASE WHEN has_priority THEN ', $4' ELSE '' END)
        INTO ids USING keys, payloads, enqueue_many.run_at, enqueue_many.priority;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION sharding.enqueue_many(regclass, text[], jsonb[], timestamptz, smallint) IS
    'inserts one pending job per key (payloads[i], run_at, priority) in one statement; returns their ids in order';

-- set_backoff: a retried job (fail with retry) is not claimed again before
-- now() + base * 2^(attempts - 1), capped at max. Not STRICT: a NULL base
-- removes the backoff (a retried job then keeps its run_at).
CREATE FUNCTION sharding.set_backoff(queue regclass, base interval, max interval) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
    relowner oid;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT n.nspname, c.relname, c.relowner INTO nsp, rel, relowner
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = queue;
    IF NOT pg_has_role(relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of queue table %', queue USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF base IS NULL THEN
        UPDATE sharding.queue_settings s SET backoff_base = NULL, backoff_max = NULL
         WHERE s.schema_name = nsp AND s.table_name = rel;
        DELETE FROM sharding.queue_settings s
         WHERE s.schema_name = nsp AND s.table_name = rel AND s.backoff_base IS NULL AND s.max_attempts IS NULL;
        RETURN;
    END IF;
    IF base <= interval '0' THEN
        RAISE EXCEPTION 'backoff base must be positive, got %', base USING ERRCODE = 'invalid_parameter_value';
    ELSIF max IS NULL THEN
        RAISE EXCEPTION 'backoff max must not be null (with base %)', base USING ERRCODE = 'invalid_parameter_value';
    ELSIF max < base THEN
        RAISE EXCEPTION 'backoff max must be at least base %, got %', base, max
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a
                    WHERE a.attrelid = queue AND a.attname = 'run_at' AND a.atttypid = 'timestamptz'::regtype
                      AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'queue table % has no timestamptz column "run_at" to delay retries by', queue
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'ALTER TABLE ... ADD COLUMN run_at timestamptz NOT NULL DEFAULT now()';
    END IF;
    INSERT INTO sharding.queue_settings AS s (schema_name, table_name, backoff_base, backoff_max)
    VALUES (nsp, rel, base, max)
    ON CONFLICT (schema_name, table_name)
    DO UPDATE SET backoff_base = EXCLUDED.backoff_base, backoff_max = EXCLUDED.backoff_max;
END
$$;
COMMENT ON FUNCTION sharding.set_backoff(regclass, interval, interval) IS
    'retried jobs wait base * 2^(attempts - 1), at most max, before they are claimed again (NULL base: no backoff)';

-- purge: deletes up to batch done rows finished (claim_expires, which
-- complete sets to the time it ran) more than older_than ago, skipping rows
-- other transactions hold. Not STRICT: NULL arguments raise 22023.
CREATE FUNCTION sharding.purge(queue regclass, older_than interval DEFAULT '1 day', batch integer DEFAULT 10000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n bigint;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    ELSIF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must not be null or negative, got %', coalesce(older_than::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION 'batch must be at least 1, got %', coalesce(batch::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._queue_sql(queue, 'complete');  -- checks it is a queue table (22023) and UPDATE rights
    EXECUTE format('WITH gone AS (DELETE FROM %1$s AS q WHERE q.id = ANY (ARRAY('
                   'SELECT d.id FROM %1$s AS d WHERE d.status = %2$L AND d.claim_expires < now() - $1 '
                   'LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING 1) SELECT count(*) FROM gone', queue, 'done')
        INTO n USING older_than, batch;
    RETURN n;
END
$$;
COMMENT ON FUNCTION sharding.purge(regclass, interval, integer) IS
    'deletes up to batch done jobs finished more than older_than ago; returns how many';

-- queue_health: counts from the partial indexes create_queue makes (the
-- function disables sequential scans for its own queries, so done rows are
-- never read), table statistics, and what holds the xmin horizon back.
-- STRICT: NULL queue, NULL result. STABLE: it only reads.
CREATE FUNCTION sharding.queue_health(queue regclass,
    OUT pending bigint, OUT processing bigint, OUT expired bigint, OUT oldest_pending_age interval,
    OUT dead_tuples bigint, OUT xmin_horizon_age interval, OUT horizon_holder text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    SET enable_seqscan = off
    AS $$
BEGIN
    PERFORM sharding._queue_health_check(queue);
    EXECUTE format('SELECT count(*), now() - min(created) FROM %s WHERE status = %L', queue, 'pending')
        INTO pending, oldest_pending_age;
    EXECUTE format('SELECT count(*), count(*) FILTER (WHERE claim_expires < now()) FROM %s WHERE status = %L',
                   queue, 'processing')
        INTO processing, expired;
    dead_tuples := pg_stat_get_dead_tuples(queue);
    -- What holds the horizon back for this table: transactions of this
    -- database (and walsenders, whose feedback holds every database),
    -- prepared transactions of this database, replication slots' xmin.
    -- The oldest by transaction age wins. This session is left out.
    SELECT h.age, h.holder INTO xmin_horizon_age, horizon_holder
      FROM (SELECT greatest(age(a.backend_xmin), age(a.backend_xid)) AS xid_age,
                   now() - coalesce(a.xact_start, a.backend_start) AS age,
                   format('backend pid %s (application_name %s, %s)', a.pid,
                          quote_literal(coalesce(a.application_name, '')), coalesce(a.state, a.backend_type)) AS holder
              FROM pg_stat_activity a
             WHERE (a.datname = current_database() OR a.datid IS NULL OR a.datid = 0)
               AND a.pid <> pg_backend_pid()
               AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
            UNION ALL
            SELECT age(p.transaction), now() - p.prepared, format('prepared transaction %s', quote_literal(p.gid))
              FROM pg_prepared_xacts p
             WHERE p.database = current_database()
            UNION ALL
            SELECT age(s.xmin), NULL, format('replication slot %s', quote_literal(s.slot_name))
              FROM pg_replication_slots s
             WHERE s.xmin IS NOT NULL) AS h
     ORDER BY h.xid_age DESC NULLS LAST
     LIMIT 1;
END
$$;
COMMENT ON FUNCTION sharding.queue_health(regclass) IS
    'pending, processing and expired jobs (from the partial indexes), the oldest pending job''s age, dead tuples, and the age and holder of the xmin horizon';

-- Checks that queue_health's table is a queue (22023 naming it).
CREATE FUNCTION sharding._queue_health_check(queue regclass) RETURNS void
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    missing text;
BEGIN
    SELECT string_agg(format('%I %s', c.col, format_type(c.typ, NULL)), ', ') INTO missing
      FROM (VALUES ('status', 'text'::regtype), ('created', 'timestamptz'::regtype),
                   ('claim_expires', 'timestamptz'::regtype)) AS c(col, typ)
     WHERE NOT EXISTS (SELECT FROM pg_attribute a
                        WHERE a.attrelid = queue AND a.attname = c.col AND a.atttypid = c.typ
                          AND NOT a.attisdropped);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'queue table % lacks column(s) %', queue, missing USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
COMMENT ON FUNCTION sharding._queue_health_check(regclass) IS
    'internal: raises 22023 unless the table has the columns queue_health reads';

-- Wakeups: the statement trigger create_queue puts on a queue. After an
-- INSERT (or COPY) that adds a claimable job (pending, and due where the
-- table has run_at), it sends NOTIFY on channel sharding_<table name> with
-- the first such job's key as payload, at most once per transaction and
-- channel (a transaction-local setting remembers it). Another queue table
-- gets the same with:
--   CREATE TRIGGER sharding_notify AFTER INSERT ON t REFERENCING NEW TABLE AS sharding_new
--       FOR EACH STATEMENT EXECUTE FUNCTION sharding._queue_notify();
CREATE FUNCTION sharding._queue_notify() RETURNS trigger
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    channel text := left('sharding_' || TG_TABLE_NAME, 63);
    flag text := 'sharding_queue.notified_' || md5(left('sharding_' || TG_TABLE_NAME, 63));
    job jsonb;
BEGIN
    IF current_setting(flag, true) = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT to_jsonb(n) INTO job
      FROM sharding_new AS n
     WHERE (to_jsonb(n) ->> 'status') = 'pending'
       AND (NOT (to_jsonb(n) ? 'run_at') OR (to_jsonb(n) ->> 'run_at')::timestamptz <= now())
     LIMIT 1;
    IF job IS NOT NULL THEN
        PERFORM pg_notify(channel, coalesce(job ->> 'key', ''));
        PERFORM set_config(flag, 'on', true);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sharding._queue_notify() IS
    'internal: statement trigger of queue tables; NOTIFY sharding_<table> (payload: a new claimable job''s key), once per transaction';
