
-- Queue (issue 27, contract section 14): enqueue_many writes status
-- 'pending' and checks the columns it writes (22023); wake-ups cut a key
-- too long for NOTIFY (sharding._notify_payload, new) instead of failing
-- the insert.

CREATE OR REPLACE FUNCTION sharding.enqueue_many(queue regclass, keys text[], payloads jsonb[] DEFAULT NULL,
                                      run_at timestamptz DEFAULT NULL, priority smallint DEFAULT 0)
    RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    has_key boolean;
    has_status boolean;
    has_payload boolean;
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
    SELECT coalesce(bool_or(a.attname = 'key'), false), coalesce(bool_or(a.attname = 'status'), false),
           coalesce(bool_or(a.attname = 'payload'), false),
           coalesce(bool_or(a.attname = 'run_at'), false), coalesce(bool_or(a.attname = 'priority'), false)
      INTO has_key, has_status, has_payload, has_run_at, has_priority
      FROM pg_attribute a
     WHERE a.attrelid = queue AND a.attnum > 0 AND NOT a.attisdropped
       AND a.attname IN ('key', 'status', 'payload', 'run_at', 'priority');
    IF enqueue_many.run_at IS NOT NULL AND NOT has_run_at THEN
        RAISE EXCEPTION 'queue table % has no column "run_at" for run_at %', queue, enqueue_many.run_at
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF enqueue_many.priority <> 0 AND NOT has_priority THEN
        RAISE EXCEPTION 'queue table % has no column "priority" for priority %', queue, enqueue_many.priority
            USING ERRCODE = 'invalid_parameter_value';
    -- The columns it writes, checked as the other queue functions check
    -- theirs (22023, not the INSERT's 42703).
    ELSIF NOT has_key OR NOT has_status OR (payloads IS NOT NULL AND NOT has_payload) THEN
        RAISE EXCEPTION 'queue table % lacks column "%"', queue,
            CASE WHEN NOT has_key THEN 'key' WHEN NOT has_status THEN 'status' ELSE 'payload' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(keys) = 0 THEN
        RETURN '{}'::bigint[];
    END IF;
    -- status is always written: a table whose status column has no default
    -- still gets claimable jobs. payload only where payloads are given (its
    -- default otherwise).
    IF payloads IS NULL THEN
        EXECUTE format('WITH ins AS (INSERT INTO %s (key, status%s%s) '
                       'SELECT k.key, ''pending''%s%s FROM pg_catalog.unnest($1) WITH ORDINALITY AS k(key, ord) '
                       'ORDER BY k.ord RETURNING id) '
                       'SELECT pg_catalog.array_agg(ins.id ORDER BY ins.id) FROM ins',
                       queue,
                       CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', run_at' ELSE '' END,
                       CASE WHEN has_priority THEN ', priority' ELSE '' END,
                       CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', $3' ELSE '' END,
                       CASE WHEN has_priority THEN ', $4' ELSE '' END)
            INTO ids USING keys, payloads, enqueue_many.run_at, enqueue_many.priority;
    ELSE
        EXECUTE format('WITH ins AS (INSERT INTO %s (key, status, payload%s%s) '
                       'SELECT k.key, ''pending'', k.payload%s%s FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) WITH ORDINALITY AS k(key, payload, ord) '
                       'ORDER BY k.ord RETURNING id) '
                       'SELECT pg_catalog.array_agg(ins.id ORDER BY ins.id) FROM ins',
                       queue,
                       CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', run_at' ELSE '' END,
                       CASE WHEN has_priority THEN ', priority' ELSE '' END,
                       CASE WHEN enqueue_many.run_at IS NOT NULL THEN ', $3' ELSE '' END,
                       CASE WHEN has_priority THEN ', $4' ELSE '' END)
            INTO ids USING keys, payloads, enqueue_many.run_at, enqueue_many.priority;
    END IF;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION sharding.enqueue_many(regclass, text[], jsonb[], timestamptz, smallint) IS
    'inserts one pending job per key (status pending; payloads[i], run_at, priority) in one statement; returns their ids in order';

CREATE FUNCTION sharding._notify_payload(key text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    payload text := key;
BEGIN
    IF octet_length(payload) > 7999 THEN
        payload := left(payload, 7999);
        WHILE octet_length(payload) > 7999 LOOP
            payload := left(payload, length(payload) - greatest(1, (octet_length(payload) - 7999) / 4));
        END LOOP;
    END IF;
    RETURN payload;
END
$$;
COMMENT ON FUNCTION sharding._notify_payload(text) IS
    'internal: a wake-up''s payload: the key, cut on a character boundary to the 7999 bytes NOTIFY takes';

CREATE OR REPLACE FUNCTION sharding._queue_notify() RETURNS trigger
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
        -- A wake-up never makes the insert fail (a long key is cut).
        PERFORM pg_notify(channel, sharding._notify_payload(coalesce(job ->> 'key', '')));
        PERFORM set_config(flag, 'on', true);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION sharding._queue_notify() IS
    'internal: statement trigger of queue tables; NOTIFY sharding_<table> (payload: a new claimable job''s key), once per transaction';

-- Ordered claims: a round's pick and the UPDATE (src/queue/queue_ordered.cpp).
COMMENT ON FUNCTION sharding._claim_ordered_sql(regclass, integer, name) IS
    'internal: SQL text of a claim_ordered/claim_node (ordered) statement: a round''s pick (variant bits: 2 shards, 4 node, 8 max_attempts, 16 handoff exclusion, 32 resume) or, with 64, the UPDATE';
