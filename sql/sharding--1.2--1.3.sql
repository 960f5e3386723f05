\echo Use "ALTER EXTENSION sharding UPDATE TO '1.3'" to load this file. \quit

-- Version 1.2 -> 1.3. Assembled by the Makefile from the hand-written deltas
-- in sql/upgrade/1.2--1.3/, in order of file name: each changes or adds the
-- objects of one topic so that an updated database equals a fresh install
-- of sql/install/ (test/harness/upgrade.sh compares their catalogs). Once
-- 1.3 is released the assembled script is frozen as
-- sql/sharding--1.2--1.3.sql, as 1.1 -> 1.2 was.

-- Layout (src/ by layer and topic): comments that name a source file.
CREATE OR REPLACE FUNCTION sharding._rebalance_by_load_plan(owners text[], nodes text[], loads float8[],
                                                 max_imbalance float8)
    RETURNS TABLE (logical integer, from_node text, to_node text)
    AS 'MODULE_PATHNAME', 'sharding__rebalance_by_load_plan' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._rebalance_by_load_plan(text[], text[], float8[], float8) IS
    'internal: the load-aware plan (src/core/rebalance.cpp), ordered by logical shard';
-- Caches follow one rule (docs/directory.md): every call sees every
-- configuration change committed before it began (src/pg/cache.hpp,
-- "changes").
-- epoch reads the routing cache, like node_for.
-- From the routing cache (src/routing/maps.cpp), like node_for: a move
-- committed before the call is seen, also in a REPEATABLE READ transaction
-- or a PL/pgSQL loop.
CREATE OR REPLACE FUNCTION sharding.epoch(map text, logical integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_epoch' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.epoch(text, integer) IS
    'epoch of a logical shard: 1 when the map is created, +1 per move';

-- Per-map changes (docs/directory.md). The statement triggers see the
-- changed rows (transition tables), so only the maps and pin keys that
-- changed are rebuilt or re-read.
DROP TRIGGER routing_changed ON sharding.maps;
DROP TRIGGER routing_changed ON sharding.shards;
DROP TRIGGER routing_changed ON sharding.pins;
-- Routing cache changes: any change to maps, shards or pins, by the
-- functions or by a direct write, is seen by every backend's next routing
-- call (src/routing/maps.cpp, src/pg/cache.hpp "changes"). Statement-level,
-- with the changed rows as transition tables, so that only the maps (and
-- pin keys) that changed are rebuilt (or re-read) anywhere; a TRUNCATE
-- changes every map. ENABLE ALWAYS: a session under session_replication_role
-- = replica writes them too (apply itself fires the row triggers of
-- 70_distribute.sql).
CREATE OR REPLACE FUNCTION sharding._routing_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__routing_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._routing_changed() IS
    'internal: tells every backend''s routing cache which maps, shards and pins changed';
-- The same four statement triggers on each of the three tables, all ENABLE
-- ALWAYS.
DO $$
DECLARE
    t text;
    trg record;
BEGIN
    FOREACH t IN ARRAY ARRAY['maps', 'shards', 'pins'] LOOP
        FOR trg IN VALUES ('routing_changed', 'TRUNCATE', ''),
                          ('routing_changed_insert', 'INSERT', 'REFERENCING NEW TABLE AS changed'),
                          ('routing_changed_update', 'UPDATE', 'REFERENCING OLD TABLE AS before NEW TABLE AS after'),
                          ('routing_changed_delete', 'DELETE', 'REFERENCING OLD TABLE AS changed') LOOP
            EXECUTE pg_catalog.format('CREATE TRIGGER %I AFTER %s ON sharding.%I %s '
                                      'FOR EACH STATEMENT EXECUTE FUNCTION sharding._routing_changed()',
                                      trg.column1, trg.column2, t, trg.column3);
            EXECUTE pg_catalog.format('ALTER TABLE sharding.%I ENABLE ALWAYS TRIGGER %I', t, trg.column1);
        END LOOP;
    END LOOP;
END $$;
ALTER TABLE sharding.maps ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.shards ENABLE ALWAYS TRIGGER routing_changed;
ALTER TABLE sharding.pins ENABLE ALWAYS TRIGGER routing_changed;

-- _lock_pin locks by shard_of over the map's shard count: pinning no
-- longer builds the routing cache of the map it changes.
-- The handoff (docs/ordered.md): pin and unpin serialize with claim_node, fences and
-- moves. A pin re-routes its key at once, so, like move_shard, it must not
-- commit while a claim_node of the map is between reading the map and
-- claiming (the old node would claim the key's next job while the new node,
-- seeing no committed lease of the old one, claims another), nor while a
-- writer fenced on the key's shard is writing. pin and unpin (and the typed
-- overloads, which delegate to them) call _lock_pin before changing the pin:
-- _lock_shard on every logical shard the pinned text routes a key of: the
-- text key's own shard and, when the text is the canonical form of an
-- integer, a uuid or a bytea key (the form node_for matches a typed key's
-- pin on, docs/identities.md), that key's shard. _lock_shard takes the map-level
-- tag in RowExclusiveLock (conflicting with claim_node's ShareLock and with
-- rebalance) and the shard's tag in ExclusiveLock (conflicting with fence).
-- At most two shards, locked in ascending order, so two pins never deadlock
-- on each other. Needs the map to exist (42704).
CREATE OR REPLACE FUNCTION sharding._lock_pin(map text, key text) RETURNS void
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    -- shard_of over the map's shard count, not logical_shard: the same
    -- shards, without building the map's routing cache (whose pins the
    -- caller is changing).
    l integer := sharding._require_map($1, false);
    shards integer[] := ARRAY[sharding.shard_of($2, l)];
    s integer;
BEGIN
    -- Nested IFs: a cast must never see text its test did not accept.
    IF $2 ~ '^(0|-?[1-9][0-9]{0,18})$' THEN
        IF $2::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            shards := shards || sharding.shard_of($2::bigint, l);
        END IF;
    ELSIF $2 ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        shards := shards || sharding.shard_of($2::uuid, l);
    ELSIF pg_catalog.left($2, 2) = E'\\x' THEN
        IF pg_catalog.substr($2, 3) ~ '^([0-9a-f][0-9a-f])*$' THEN
            shards := shards || sharding.shard_of(pg_catalog.decode(pg_catalog.substr($2, 3), 'hex'), l);
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

-- pin_many (docs/directory.md, Pins at scale).
-- pin_many(map, keys, nodes) (docs/directory.md) pins (or re-pins) keys[i] to
-- nodes[i] in one statement and returns how many keys it pinned (a key given
-- twice counts once; the last one wins, as two pin calls would). Arrays of
-- different lengths, a NULL or multi-dimensional array, a NULL key: 22023,
-- nothing pinned; each node is checked as pin checks it (empty or NULL:
-- 22023; on a database map, a node without DSN: 55000); followers refuse
-- it as they refuse pin. Instead of pin's per-key shard locks it takes the
-- map's lock (_lock_map: waits for every fence, claim_node and move of the
-- map and keeps new ones out until commit), so that any number of keys costs
-- one lock and two pin_many calls cannot deadlock.
CREATE FUNCTION sharding.pin_many(map text, keys text[], nodes text[]) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n integer;
    null_at integer;
    empty_at integer;
    distinct_nodes text[];
BEGIN
    IF keys IS NULL OR nodes IS NULL THEN
        RAISE EXCEPTION 'pin_many needs arrays of keys and nodes, got NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_ndims(keys) > 1 OR pg_catalog.array_ndims(nodes) > 1 THEN
        RAISE EXCEPTION 'pin_many needs one-dimensional arrays' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.cardinality(keys) <> pg_catalog.cardinality(nodes) THEN
        RAISE EXCEPTION 'pin_many got % keys but % nodes', pg_catalog.cardinality(keys), pg_catalog.cardinality(nodes)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_position(keys, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL (keys[%])', pg_catalog.array_position(keys, NULL)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The first NULL or empty node.
    null_at := pg_catalog.array_position(nodes, NULL);
    empty_at := pg_catalog.array_position(nodes, '');
    IF null_at IS NOT NULL OR empty_at IS NOT NULL THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %',
            CASE WHEN empty_at IS NULL OR null_at < empty_at THEN 'NULL' ELSE pg_catalog.quote_literal('') END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    PERFORM sharding._lock_map($1);
    PERFORM sharding._require_map($1, true);
    -- A hash of the few distinct nodes, not a sort of every element.
    SELECT pg_catalog.array_agg(d.u) INTO distinct_nodes FROM (SELECT DISTINCT u FROM pg_catalog.unnest(nodes) u) d;
    PERFORM sharding._check_database_nodes($1, distinct_nodes);
    INSERT INTO sharding.nodes (node) SELECT u FROM pg_catalog.unnest(distinct_nodes) u ON CONFLICT DO NOTHING;
    -- Loading new keys, each given once (the common case), is one plain
    -- INSERT: no sort, no speculative insertion. A key pinned already (or
    -- given twice) makes it fail (unique_violation, before any statement
    -- trigger ran: nothing noted, rolled back with the block); then the
    -- last node given for each key wins as in a row of pin calls. The map's
    -- lock keeps pin, unpin and other pin_many calls on it out meanwhile.
    BEGIN
        INSERT INTO sharding.pins (map, key, node)
        SELECT $1, u.key, u.node FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(nodes)) AS u(key, node);
        GET DIAGNOSTICS n = ROW_COUNT;
    EXCEPTION WHEN unique_violation THEN
        INSERT INTO sharding.pins AS p (map, key, node)
        SELECT DISTINCT ON (u.key) $1, u.key, u.node
          FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(nodes)) WITH ORDINALITY AS u(key, node, i)
         ORDER BY u.key, u.i DESC
            ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
        GET DIAGNOSTICS n = ROW_COUNT;
    END;
    IF n > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding.pin_many(text, text[], text[]) IS
    'pins (or re-pins) keys[i] to nodes[i] in one statement; returns how many keys were pinned';
REVOKE ALL ON FUNCTION sharding.pin_many(text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.pin_many(text, text[], text[]) TO sharding_admin;

-- Queue (docs/queue.md): enqueue_many writes status
-- 'pending' and checks the columns it writes (22023); wake-ups cut a key
-- too long for NOTIFY (sharding._notify_payload, new) instead of failing
-- the insert.

-- enqueue_many: one INSERT ... SELECT over the unnested arrays, ids in the
-- order of keys (identity values are drawn in the order rows are inserted).
-- Not STRICT: payloads and run_at may be NULL; a NULL queue or keys raise
-- 22023.
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
    cols text := 'key, status';
    vals text := 'k.key, ''pending''';
    arrays text := 'pg_catalog.unnest($1)';
    fields text := 'key';
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
    -- default otherwise), run_at only where given, priority where the table
    -- has it.
    IF payloads IS NOT NULL THEN
        cols := cols || ', payload';
        vals := vals || ', k.payload';
        arrays := arrays || ', pg_catalog.unnest($2)';
        fields := fields || ', payload';
    END IF;
    IF enqueue_many.run_at IS NOT NULL THEN
        cols := cols || ', run_at';
        vals := vals || ', $3';
    END IF;
    IF has_priority THEN
        cols := cols || ', priority';
        vals := vals || ', $4';
    END IF;
    EXECUTE format('WITH ins AS (INSERT INTO %s (%s) '
                   'SELECT %s FROM ROWS FROM (%s) WITH ORDINALITY AS k(%s, ord) '
                   'ORDER BY k.ord RETURNING id) '
                   'SELECT pg_catalog.array_agg(ins.id ORDER BY ins.id) FROM ins',
                   queue, cols, vals, arrays, fields)
        INTO ids USING keys, payloads, enqueue_many.run_at, enqueue_many.priority;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION sharding.enqueue_many(regclass, text[], jsonb[], timestamptz, smallint) IS
    'inserts one pending job per key (status pending; payloads[i], run_at, priority) in one statement; returns their ids in order';

-- Wakeups: the statement trigger create_queue puts on a queue. After an
-- INSERT (or COPY) that adds a claimable job (pending, and due where the
-- table has run_at), it sends NOTIFY on channel sharding_<table name> with
-- the first such job's key as payload, at most once per transaction and
-- channel (a transaction-local setting remembers it). Another queue table
-- gets the same with:
--   CREATE TRIGGER sharding_notify AFTER INSERT ON t REFERENCING NEW TABLE AS sharding_new
--       FOR EACH STATEMENT EXECUTE FUNCTION sharding._queue_notify();
-- The payload of a wake-up: the key, or, when it would not fit (NOTIFY
-- takes at most 7999 bytes), its longest prefix that fits, cut on a
-- character boundary. Each round drops at most the excess (a character has
-- at most 4 bytes), so it ends on that prefix, in a few rounds.
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
CREATE OR REPLACE FUNCTION sharding._claim_ordered_sql(queue regclass, variant integer, key_column name DEFAULT 'key')
    RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__claim_ordered_sql' LANGUAGE C STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._claim_ordered_sql(regclass, integer, name) IS
    'internal: SQL text of a claim_ordered/claim_node (ordered) statement: a round''s pick (variant bits: 2 shards, 4 node, 8 max_attempts, 16 handoff exclusion, 32 resume) or, with 64, the UPDATE';
-- Fixes (docs/nodes.md, docs/observe.md) and one source for the exported
-- symbols (docs/architecture.md).

-- attach_node tells this database from a node by a probe connection seen in
-- pg_stat_activity, not by system identifier and database name, which
-- clones of a cluster share.
-- Whether a connection string leads to this very database (the same
-- server and database, whatever host, port or user it names). A clone of
-- this cluster (pg_basebackup, a copied disk image) has the same system
-- identifier and database name, so those prove nothing; instead a
-- connection is opened, marked with a random application_name, and looked
-- for in this server's pg_stat_activity, which lists every backend of this
-- server and none of another's. The application_name of every backend is
-- visible to every role.
CREATE FUNCTION sharding._leads_here(dsn text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    dl name := sharding._dblink_schema('this operation');
    token text := 'sharding_probe_' || pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '');
    here boolean;
BEGIN
    EXECUTE pg_catalog.format('SELECT %I.dblink_connect($1, $2)', dl) USING token, dsn;
    BEGIN
        EXECUTE pg_catalog.format('SELECT f.v FROM %I.dblink($1, $2) AS f(v text)', dl)
          USING token, pg_catalog.format('SELECT pg_catalog.set_config(%L, %L, false)', 'application_name', token);
        -- This transaction may have read pg_stat_activity before: read it anew.
        PERFORM pg_catalog.pg_stat_clear_snapshot();
        here := EXISTS (SELECT FROM pg_catalog.pg_stat_activity AS a
                         WHERE a.application_name = token AND a.datname = pg_catalog.current_database());
    EXCEPTION WHEN OTHERS THEN
        EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', dl) USING token;
        RAISE;
    END;
    EXECUTE pg_catalog.format('SELECT %I.dblink_disconnect($1)', dl) USING token;
    RETURN here;
END $$;
COMMENT ON FUNCTION sharding._leads_here(text) IS
    'internal: whether a connection string leads back to this database (a probe connection seen in pg_stat_activity)';
-- For administrators, as attach_node, which calls it: it connects out.
REVOKE ALL ON FUNCTION sharding._leads_here(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._leads_here(text) TO sharding_admin;

-- attach_node(node text): see the top of this file. Not STRICT: NULL raises.
CREATE OR REPLACE FUNCTION sharding.attach_node(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    dl name;
    dsn text;
    me text;
    sub text;
    slot text;
    facts record;
    node_maps text[];
    node_versions bigint[];
    pending integer;
    deadline timestamptz;
    sub_conninfo text;
    sub_enabled boolean;
BEGIN
    PERFORM sharding._check_node(attach_node.node);
    IF current_setting('wal_level') <> 'logical' THEN
        RAISE EXCEPTION 'attach_node needs wal_level = logical on the coordinator, got %', current_setting('wal_level')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Set wal_level = logical (and max_replication_slots, max_wal_senders for one slot per node) '
                         'in postgresql.conf, then restart PostgreSQL.';
    END IF;
    IF EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RAISE EXCEPTION 'this database follows a coordinator: attach node "%" there', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    dsn := sharding._node_dsn(attach_node.node);
    -- The node's CREATE SUBSCRIPTION makes a replication slot here, which
    -- waits for every transaction holding a transaction id to end.
    IF txid_current_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'attach_node must run in a transaction that has not written yet'
            USING ERRCODE = 'active_sql_transaction',
                  HINT = 'Call it in its own transaction.';
    END IF;
    dl := sharding._dblink_schema('attach_node');
    me := sharding._coordinator_dsn();
    sub := sharding._config_subscription(attach_node.node);
    slot := sharding._config_slot(attach_node.node);

    -- The node: not this very database, this extension (1.2) there, not
    -- following as another node. Nothing has changed anywhere yet.
    IF sharding._leads_here(dsn) THEN
        RAISE EXCEPTION 'node "%" is this database: a coordinator cannot follow itself', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Its connection string %s leads back here.', dsn);
    END IF;
    EXECUTE format($q$SELECT * FROM %I.dblink($1, $2) AS f(has_follow boolean, following_as text)$q$, dl)
       INTO facts
      USING dsn, $r$SELECT pg_catalog.to_regprocedure('sharding._follow(text,text)') IS NOT NULL, NULL::text$r$;
    IF NOT facts.has_follow THEN
        RAISE EXCEPTION 'node "%" has no sharding extension of version 1.2 or later', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'CREATE EXTENSION sharding (or ALTER EXTENSION sharding UPDATE) in the node''s database.';
    END IF;
    facts.following_as := sharding._remote(dsn, 'SELECT node FROM sharding.local_node WHERE following');
    IF facts.following_as IS DISTINCT FROM attach_node.node AND facts.following_as IS NOT NULL THEN
        RAISE EXCEPTION 'the database of node "%" already follows a coordinator as node "%"',
                attach_node.node, facts.following_as
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Detach it first: sharding.detach_node(%L) on its coordinator.', facts.following_as);
    END IF;
    EXECUTE format($q$SELECT array_agg(f.map), array_agg(f.version) FROM %I.dblink($1, $2) AS f(map text, version bigint)$q$, dl)
       INTO node_maps, node_versions
      USING dsn, 'SELECT map, version FROM sharding.map_versions';

    -- Coordinator side, committed before the node subscribes (a publication
    -- nobody subscribes to, and versions that rose, are harmless leftovers
    -- of a failure below).
    PERFORM sharding._remote(me, format('SELECT sharding._publish_config(%L, %L)::text', node_maps, node_versions));

    -- The subscription, disabled: creating it proves the node reaches us
    -- before its configuration is touched. Its slot is made from here first:
    -- a CREATE SUBSCRIPTION that creates its slot hangs when the node lives
    -- in this same PostgreSQL instance.
    EXECUTE format($q$SELECT f.c, f.e FROM %I.dblink($1, $2) AS f(c text, e boolean)$q$, dl)
       INTO sub_conninfo, sub_enabled
      USING dsn, format($s$SELECT subconninfo, subenabled FROM pg_catalog.pg_subscription
                            WHERE subname = %L AND subdbid = (SELECT oid FROM pg_catalog.pg_database
                                                               WHERE datname = pg_catalog.current_database())$s$, sub);
    IF sub_conninfo IS NULL THEN
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots AS r WHERE r.slot_name = slot) THEN
            PERFORM sharding._remote(me, format(
                $s$SELECT slot_name::text FROM pg_catalog.pg_create_logical_replication_slot(%L, 'pgoutput')$s$, slot));
        END IF;
        BEGIN
            PERFORM sharding._remote_exec(dsn, format(
                'CREATE SUBSCRIPTION %I CONNECTION %L PUBLICATION sharding_config '
                'WITH (slot_name = %L, create_slot = false, enabled = false)', sub, me, slot));
        EXCEPTION WHEN OTHERS THEN
            -- Leave no slot behind (it would hold WAL back forever).
            PERFORM sharding._remote(me, format(
                $s$SELECT 'dropped' FROM pg_catalog.pg_drop_replication_slot(%L)$s$, slot));
            RAISE;
        END;
        sub_enabled := false;
    ELSIF sub_conninfo IS DISTINCT FROM me THEN
        PERFORM sharding._remote_exec(dsn, format('ALTER SUBSCRIPTION %I CONNECTION %L', sub, me));
    END IF;

    -- The node's configuration gives way to ours, then the copy starts.
    BEGIN
        PERFORM sharding._remote(dsn, format('SELECT sharding._follow(%L, %L)::text', attach_node.node, me));
    EXCEPTION WHEN OTHERS THEN
        IF NOT sub_enabled THEN
            PERFORM sharding._remote_exec(dsn, format('DROP SUBSCRIPTION %I', sub));
        END IF;
        RAISE;
    END;
    IF NOT sub_enabled THEN
        PERFORM sharding._remote_exec(dsn, format('ALTER SUBSCRIPTION %I ENABLE', sub));
    END IF;

    -- The full copy: wait (up to a minute) until every table is synchronised.
    deadline := clock_timestamp() + interval '60 seconds';
    LOOP
        EXECUTE format($q$SELECT f.n FROM %I.dblink($1, $2) AS f(n integer)$q$, dl)
           INTO pending
          USING dsn, format($s$SELECT (%s - count(*) FILTER (WHERE r.srsubstate IN ('r', 's')))::integer
                                 FROM pg_catalog.pg_subscription AS s
                                 JOIN pg_catalog.pg_subscription_rel AS r ON r.srsubid = s.oid
                                WHERE s.subname = %L$s$, cardinality(sharding._config_tables()), sub);
        EXIT WHEN pending <= 0;
        IF clock_timestamp() > deadline THEN
            RAISE WARNING 'node "%" is still copying the configuration (% tables to go)', attach_node.node, pending
                USING HINT = 'It follows once the copy ends; check pg_subscription_rel on the node.';
            EXIT;
        END IF;
        PERFORM pg_sleep(0.02);
    END LOOP;
    PERFORM sharding._remote(dsn, 'SELECT sharding._install_guards()::text');
END $$;
COMMENT ON FUNCTION sharding.attach_node(text) IS
    'makes a data node follow this coordinator''s configuration through logical replication (repeating is harmless)';

-- partition_for links its sharding_ symbols (1.2 linked the bare names,
-- which stay exported for the frozen 1.2 script only).
-- partition_for(map text, key): the PL/Proxy RUN ON function, one overload
-- per key type (an untyped literal resolves to text). C++ (since 1.1): it
-- routes from the same per-backend cache as node_for, so a pinned key matches
-- exactly as node_for matches it, and a proxied call pays a hash and a probe
-- instead of three queries. STABLE: it reads the map.
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE OR REPLACE FUNCTION sharding.partition_for(map text, key uuid) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_uuid' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.partition_for(text, text) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, bytea) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, smallint) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, integer) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, bigint) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';
COMMENT ON FUNCTION sharding.partition_for(text, uuid) IS
    'PL/Proxy partition of the key (RUN ON): its logical shard, or for a pinned key its node''s partition';

-- Fan-out counters are sized by sharding.fanout_max and evict the least-used
-- tables; fanout_info() tells how many.
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

-- fanout_reset(): zeroes this database's counters. VOLATILE, PARALLEL
-- UNSAFE: it writes shared state. Everyone's picture changes, so it is an
-- admin function, as pg_stat_statements_reset is.
CREATE OR REPLACE FUNCTION sharding.fanout_reset() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding_fanout_reset' LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.fanout_reset() IS
    'zeroes the fan-out counters of this database; fanout_stats.since becomes now, fanout_info().evicted zero';
REVOKE ALL ON FUNCTION sharding.fanout_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.fanout_reset() TO sharding_admin;

-- One test of what a shard key may be (sharding._key_type, shared with the
-- C++ code), used by distribute, copy_shard and _key_column_type.
-- Internal: the one test of what a shard key may be, shared with the C++
-- code (src/pg/keys.cpp, key_type_of): the type a key of type t is hashed
-- as (text for text, varchar and domains over them; bytea, smallint,
-- integer, bigint, uuid and domains over them as themselves), NULL when t is
-- not a shard key type. STABLE: it reads the type catalog (domains).
CREATE FUNCTION sharding._key_type(t regtype) RETURNS regtype
    AS 'MODULE_PATHNAME', 'sharding__key_type' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._key_type(regtype) IS
    'internal: the type a shard key of type t is hashed as (text for varchar, a domain''s base type), NULL if none';
-- distribute(tbl regclass, key_column name, map text): records tbl as placed
-- by node_for(map, key_column). Not STRICT: a NULL argument raises 22023.
CREATE OR REPLACE FUNCTION sharding.distribute(tbl regclass, key_column name, map text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
BEGIN
    IF tbl IS NULL OR key_column IS NULL OR map IS NULL THEN
        RAISE EXCEPTION 'distribute needs a table, a key column and a map, got %, %, %',
            coalesce(tbl::text, 'NULL'), coalesce(key_column::text, 'NULL'), coalesce(map, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map(map);
    SELECT n.nspname, c.relname INTO nsp, rel
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = tbl;
    -- The column must exist (42703) and be of a shard key type (22023).
    PERFORM sharding._key_column_type(tbl, key_column);
    IF EXISTS (SELECT FROM sharding.distributed_tables d WHERE d.schema_name = nsp AND d.table_name = rel) THEN
        RAISE EXCEPTION 'table % is already distributed', tbl
            USING ERRCODE = 'duplicate_object', HINT = 'Call sharding.undistribute first to change it.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = tbl AND i.indisprimary) THEN
        RAISE EXCEPTION 'table % has no primary key', tbl
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Moving a shard online replicates updates and deletes by primary key.';
    END IF;
    INSERT INTO sharding.distributed_tables (schema_name, table_name, key_column, map)
    VALUES (nsp, rel, key_column, map);
END $$;
COMMENT ON FUNCTION sharding.distribute(regclass, name, text) IS
    'records that a table''s rows are placed by node_for(map, key_column); a map''s tables are co-located';
-- copy_shard(map, logical, tbl, key_column, from_dsn, to_dsn): a low-level
-- copy, kept from 1.1 (moves use move_shard_online since 1.2): copies the
-- rows of `tbl` whose key is in logical shard `logical` of `map` and is not
-- pinned, from the database at from_dsn to the one at to_dsn, with one
-- INSERT ... SELECT that the destination runs against the source through
-- dblink (rows go from source to destination directly). Rows already at
-- the destination are skipped (ON CONFLICT DO NOTHING), so a repeated copy
-- carries INSERTS ONLY: rows updated or deleted at the source since the
-- last copy keep their old state at the destination. Returns the number of
-- rows inserted.
--
-- Needs contrib's dblink here (to reach the destination) and at the
-- destination (to reach the source), in the same schema, and `sharding` at
-- the source (for shard_of). `tbl` must exist here, at the source and at
-- the destination with the same columns. dblink runs SQL text, not
-- parameters: every identifier is quoted with %I, every value with %L.
CREATE OR REPLACE FUNCTION sharding.copy_shard(map text, logical integer, tbl regclass, key_column name,
                                    from_dsn text, to_dsn text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    shards integer;
    dblink_schema name;
    key_type regtype;
    rel text;
    cols text;
    coldefs text;
    pinned text[];
    src_query text;
    dst_command text;
    status text;
BEGIN
    SELECT m.logical_shards INTO shards FROM sharding.maps AS m WHERE m.map = copy_shard.map;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', copy_shard.map USING ERRCODE = 'undefined_object';
    END IF;
    IF copy_shard.logical < 0 OR copy_shard.logical >= shards THEN
        RAISE EXCEPTION 'logical shard must be between 0 and % for map "%", got %',
                shards - 1, copy_shard.map, copy_shard.logical
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- As it is hashed (varchar as text, a domain as its base); 42703 or 22023.
    key_type := sharding._key_column_type(copy_shard.tbl, copy_shard.key_column);

    SELECT e.extnamespace::regnamespace::name INTO dblink_schema
      FROM pg_catalog.pg_extension AS e WHERE e.extname = 'dblink';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'copy_shard needs extension "dblink"'
            USING ERRCODE = 'undefined_function',
                  HINT = 'CREATE EXTENSION dblink here and at the destination.';
    END IF;

    -- The table by schema-qualified name (the other ends' search_path is
    -- theirs), its stored columns, and the record type dblink returns.
    SELECT format('%I.%I', n.nspname, c.relname) INTO rel
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = copy_shard.tbl;
    SELECT string_agg(format('%I', a.attname), ', ' ORDER BY a.attnum),
           string_agg(format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)), ', '
                      ORDER BY a.attnum)
      INTO cols, coldefs
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = copy_shard.tbl AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '';

    -- Pinned keys live on their pin's node, not on the shard's owner.
    SELECT coalesce(array_agg(p.key), '{}') INTO pinned
      FROM sharding.pins AS p WHERE p.map = copy_shard.map;

    -- Pins hold the key's canonical text form (bytea in hex): compare that
    -- form, not ::text, which for bytea follows the source's bytea_output.
    src_query := format('SELECT %s FROM %s WHERE sharding.shard_of(%I, %s) = %s AND NOT (%s = ANY (%L::text[]))',
                        cols, rel, copy_shard.key_column, shards, copy_shard.logical,
                        sharding._key_text_sql(format('%I', copy_shard.key_column), key_type), pinned);
    dst_command := format('INSERT INTO %s (%s) SELECT %s FROM %I.dblink(%L, %L) AS s(%s) ON CONFLICT DO NOTHING',
                          rel, cols, cols, dblink_schema, copy_shard.from_dsn, src_query, coldefs);
    EXECUTE format('SELECT %I.dblink_exec($1, $2)', dblink_schema)
       INTO status USING copy_shard.to_dsn, dst_command;
    -- The command tag: "INSERT 0 <rows>".
    RETURN split_part(status, ' ', 3)::bigint;
END
$$;
COMMENT ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) IS
    'copies the unpinned rows of one logical shard of a table from one node to another (through dblink; a repeat carries inserts only); returns rows inserted';
-- It reads and writes other databases: administrators only.
REVOKE ALL ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) TO sharding_admin;
-- Internal: the type a shard key column is hashed as (sharding._key_type:
-- text for varchar, a domain's base type), or 42703 (no such column) or
-- 22023 (not a key type).
CREATE OR REPLACE FUNCTION sharding._key_column_type(tbl regclass, key_column name) RETURNS regtype
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
    IF sharding._key_type(t) IS NULL THEN
        RAISE EXCEPTION 'column "%" of relation % has type %, which is not a shard key type',
                key_column, tbl, t
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Shard keys are text, varchar, bytea, smallint, integer, bigint or uuid.';
    END IF;
    RETURN sharding._key_type(t);
END
$$;
COMMENT ON FUNCTION sharding._key_column_type(regclass, name) IS
    'internal: type a shard key column is hashed as; 42703 if missing, 22023 if not a key type';
-- sharding.enqueue (docs/queue.md) writes status = 'pending', as
-- enqueue_many does (a status column without a default got NULL).
CREATE OR REPLACE FUNCTION sharding.enqueue(queue regclass, key text, payload jsonb DEFAULT NULL) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    new_id bigint;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = '22023';
    END IF;
    -- status always written, as enqueue_many does: a hand-made queue whose
    -- status column has no default still gets a claimable job.
    EXECUTE format('INSERT INTO %s (key, payload, status) VALUES ($1, $2, ''pending'') RETURNING id', queue)
        INTO new_id USING key, payload;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION sharding.enqueue(regclass, text, jsonb) IS
    'adds a pending job (key, payload) to a create_queue table; returns its id';

-- One list of the configuration tables followers copy
-- (sharding._config_tables, new): the publication, the node's emptying
-- before it follows and attach_node's wait for the copy (40_fixes.sql
-- includes attach_node) read it instead of three copies and a count.
-- The configuration tables a follower copies, in schema sharding: the one
-- list. _publish_config publishes them (publication sharding_config), a
-- node empties them before it follows (_follow), and attach_node waits
-- until the node has synchronised each of them.
CREATE FUNCTION sharding._config_tables() RETURNS name[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT ARRAY['maps', 'nodes', 'shards', 'pins', 'map_versions', 'distributed_tables']::name[] $$;
COMMENT ON FUNCTION sharding._config_tables() IS
    'internal: the configuration tables (schema sharding) that followers copy through publication sharding_config';
-- On the coordinator, in its own transaction (attach_node calls it through
-- dblink, so that its writes are committed before the node subscribes):
-- the publication, and versions above those the node already reported, so
-- that cluster_version never falls on the node when it starts following.
CREATE OR REPLACE FUNCTION sharding._publish_config(node_maps text[], node_versions bigint[]) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    t text;
    top bigint;
    m text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication p WHERE p.pubname = 'sharding_config') THEN
        CREATE PUBLICATION sharding_config;
    END IF;
    -- Also a publication made by an older version gets every table.
    FOREACH t IN ARRAY sharding._config_tables() LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication_tables p
                        WHERE p.pubname = 'sharding_config' AND p.schemaname = 'sharding' AND p.tablename = t) THEN
            EXECUTE pg_catalog.format('ALTER PUBLICATION sharding_config ADD TABLE sharding.%I', t);
        END IF;
    END LOOP;
    top := (SELECT pg_catalog.max(v) FROM pg_catalog.unnest(node_versions) AS v);
    IF top IS NOT NULL THEN
        IF (SELECT s.last_value FROM sharding.version_seq AS s) < top THEN
            PERFORM pg_catalog.setval('sharding.version_seq', top);
        END IF;
        FOR m IN SELECT u.map FROM ROWS FROM (pg_catalog.unnest(node_maps), pg_catalog.unnest(node_versions)) AS u(map, version)
                  WHERE u.version >= coalesce((SELECT v.version FROM sharding.map_versions AS v WHERE v.map = u.map), 0)
                  ORDER BY u.map LOOP
            PERFORM sharding._touch_map(m);
        END LOOP;
    END IF;
END $$;
COMMENT ON FUNCTION sharding._publish_config(text[], bigint[]) IS
    'internal: creates publication sharding_config and raises versions above a joining node''s';
-- On the node (through dblink): forget its own configuration and follow.
-- Returns false when it already follows as `node` (nothing to do).
CREATE OR REPLACE FUNCTION sharding._follow(node text, coordinator_dsn text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    cur record;
    d record;
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL THEN
        RAISE EXCEPTION 'node name and coordinator DSN must not be NULL or empty, got %, %',
                coalesce(quote_literal($1), 'NULL'), coalesce(quote_literal($2), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO cur FROM sharding.local_node;
    IF FOUND AND cur.following THEN
        IF cur.node <> $1 THEN
            RAISE EXCEPTION 'this database already follows a coordinator as node "%", not "%"', cur.node, $1
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Detach it first (sharding.detach_node on its coordinator).';
        END IF;
        IF cur.coordinator_dsn IS DISTINCT FROM $2 THEN
            UPDATE sharding.local_node SET coordinator_dsn = $2;
        END IF;
        RETURN false;
    END IF;
    -- The coordinator's copy replaces ours: unguard, then empty.
    FOR d IN SELECT * FROM sharding.distributed_tables LOOP
        PERFORM sharding._drop_guard(d.schema_name, d.table_name);
    END LOOP;
    EXECUTE 'TRUNCATE ' || (SELECT pg_catalog.string_agg(pg_catalog.format('sharding.%I', t), ', ')
                              FROM pg_catalog.unnest(sharding._config_tables()) AS t);
    INSERT INTO sharding.local_node AS l (node, coordinator_dsn, following) VALUES ($1, $2, true)
        ON CONFLICT (one_row) DO UPDATE SET node = EXCLUDED.node, coordinator_dsn = EXCLUDED.coordinator_dsn,
                                            following = true, attached = pg_catalog.now();
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding._follow(text, text) IS
    'internal: makes this database a follower named node (its configuration is replaced by the coordinator''s)';


-- Owner switches alone refused on maps with distributed tables
-- (docs/moves.md, Owner switches alone): move_shard's switch is
-- _switch_owner, also the cutover of an online move.
CREATE OR REPLACE FUNCTION sharding._refuse_owner_switch(map text, fn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__refuse_owner_switch' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._refuse_owner_switch(text, text) IS
    'internal: 55000 if a map has distributed tables (owner switches alone would strand their rows)';

CREATE OR REPLACE FUNCTION sharding._switch_owner(map text, logical integer, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__switch_owner' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._switch_owner(text, integer, text) IS
    'internal: switches a shard''s owner after fenced writers commit (epoch + 1); returns its epoch';

REVOKE ALL ON FUNCTION sharding._switch_owner(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._switch_owner(text, integer, text) TO sharding_admin;
CREATE OR REPLACE FUNCTION sharding.move_shard(map text, logical integer, node text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._check_node(node);
    PERFORM sharding._check_logical($1, $2, sharding._require_map($1, false));
    -- A "move" to the current owner changes nothing (the current epoch):
    -- only a real switch is refused. The shard is locked first, as
    -- _switch_owner locks it, so that no cutover switches it in between.
    PERFORM sharding._lock_shard($1, $2);
    IF EXISTS (SELECT FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2 AND s.node IS DISTINCT FROM $3) THEN
        PERFORM sharding._refuse_owner_switch($1, 'move_shard');
    END IF;
    RETURN sharding._switch_owner($1, $2, $3);
END $$;
COMMENT ON FUNCTION sharding.move_shard(text, integer, text) IS
    'moves one logical shard to a node after fenced writers commit; returns its new epoch (unchanged when already there); refused on a map with distributed tables';

CREATE OR REPLACE FUNCTION sharding.rebalance(map text, nodes text[], dry_run boolean DEFAULT false)
    RETURNS TABLE(logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._check_nodes(nodes);
    IF dry_run IS NULL THEN
        RAISE EXCEPTION 'dry_run must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    RETURN QUERY SELECT * FROM sharding._rebalance_apply($1, nodes, dry_run, 'rebalance');
END $$;
COMMENT ON FUNCTION sharding.rebalance(text, text[], boolean) IS
    'spreads a map evenly over nodes with the fewest moves (each raises the shard''s epoch); dry_run only reports';

CREATE OR REPLACE FUNCTION sharding.rebalance_by_load(map text, nodes text[], loads float8[],
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


-- Move journal (docs/moves.md): sharding.move_journal replaces 1.2's
-- sharding.moves (now a view of the live rows); moves are journaled
-- through _move_enqueue / _move_execute / _move_cancel / _move_recover.
CREATE SEQUENCE sharding.move_journal_seq;
CREATE TABLE sharding.move_journal (
    move          bigint PRIMARY KEY DEFAULT pg_catalog.nextval('sharding.move_journal_seq'),
    job           bigint,             -- the rebalance job; NULL for a direct call
    map           text NOT NULL,
    logical       integer NOT NULL,
    key           text,               -- isolate: the key; NULL for a shard move
    source        text NOT NULL,
    destination   text NOT NULL,
    phase         text NOT NULL DEFAULT 'queued'
                  CHECK (phase IN ('queued', 'copying', 'catching_up', 'cutover', 'cleanup', 'done', 'failed', 'cancelled')),
    rows_copied   bigint NOT NULL DEFAULT 0,
    bytes_copied  bigint NOT NULL DEFAULT 0,
    lag_bytes     bigint,             -- WAL the destination still has to apply; NULL before catch-up
    started       timestamptz,
    phase_started timestamptz,
    finished      timestamptz,
    error         text,
    -- internal: how the error was raised (re-raised by move_shard_online)
    error_state   text,
    error_detail  text,
    error_hint    text,
    -- internal: the executing backend (its session-level advisory lock on
    -- (hashtext('sharding.move_journal'), move) says it is alive)
    pid           integer,
    new_epoch     bigint,             -- internal: the shard's epoch after the switch
    rows_moved    bigint,             -- internal: rows deleted at the source (isolate's result)
    undone        boolean NOT NULL DEFAULT false,  -- internal: the rollback has completed
    created       timestamptz NOT NULL DEFAULT pg_catalog.now()
);
-- At most one live move per shard, and per key for isolate.
CREATE UNIQUE INDEX move_journal_live_shard ON sharding.move_journal (map, logical)
    WHERE phase NOT IN ('done', 'failed', 'cancelled');
CREATE UNIQUE INDEX move_journal_live_key ON sharding.move_journal (map, key)
    WHERE key IS NOT NULL AND phase NOT IN ('done', 'failed', 'cancelled');
CREATE INDEX move_journal_job ON sharding.move_journal (job) WHERE job IS NOT NULL;
COMMENT ON TABLE sharding.move_journal IS
    'the move journal: one row per online move (of a job or a direct call), its phase, progress and error';
SELECT pg_catalog.pg_extension_config_dump('sharding.move_journal', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_journal_seq', '');
ALTER SEQUENCE sharding.move_journal_seq OWNED BY sharding.move_journal.move;
GRANT USAGE ON SEQUENCE sharding.move_journal_seq TO sharding_admin;
GRANT SELECT ON sharding.move_journal TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.move_journal TO sharding_admin;

-- Moves 1.2 left interrupted keep their journal: the next call cleans up.
INSERT INTO sharding.move_journal (map, logical, key, source, destination, phase, started, phase_started)
SELECT m.map, m.logical, m.key, m.source, m.destination,
       CASE m.state WHEN 'setup' THEN 'copying' WHEN 'catchup' THEN 'catching_up'
                    WHEN 'switched' THEN 'cleanup' ELSE m.state END,
       m.started, m.started
  FROM sharding.moves m;
ALTER EXTENSION sharding DROP TABLE sharding.moves;
DROP TABLE sharding.moves;

-- 1.2's journal, as a view of the moves in progress (or interrupted).
CREATE VIEW sharding.moves AS
    SELECT j.map, j.logical, j.key, j.source, j.destination,
           CASE j.phase WHEN 'queued' THEN 'setup' WHEN 'catching_up' THEN 'catchup'
                        WHEN 'cleanup' THEN 'switched' ELSE j.phase END AS state,
           coalesce(j.started, j.created) AS started
      FROM sharding.move_journal j
     WHERE j.phase NOT IN ('done', 'failed', 'cancelled');
COMMENT ON VIEW sharding.moves IS
    'online moves in progress (or interrupted: the next move of the shard cleans them up); see move_journal';
GRANT SELECT ON sharding.moves TO PUBLIC;

-- What a move's decoder carries (src/nodes/move_decoder.cpp), one row per
-- slot, on the source: written before the slot is created, deleted with it.
-- A user_catalog_table: logical decoding reads it under its historic
-- snapshot. The guard refuses key changes into or out of these shards
-- while a row is here.
CREATE TABLE sharding.move_decoding (
    slot        text PRIMARY KEY,
    map         text NOT NULL,
    shards      integer NOT NULL,
    logical     integer NOT NULL,
    key         text,                       -- isolate: the one key
    pins        text[] NOT NULL DEFAULT '{}',  -- a shard move leaves these keys behind
    tables      oid[] NOT NULL,             -- the map's distributed tables here
    key_columns text[] NOT NULL             -- their key columns, in the same order
) WITH (user_catalog_table = true);
COMMENT ON TABLE sharding.move_decoding IS
    'internal: what the decoder of an online move''s slot carries (source side; one row per slot)';
GRANT SELECT ON sharding.move_decoding TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.move_decoding TO sharding_admin;
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.move_decoding
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
ALTER TABLE sharding.move_decoding ENABLE ALWAYS TRIGGER local_changed;

-- The copy and the slot, in C++ (src/nodes/move_copy.cpp): the slot is
-- created over a replication connection with an exported snapshot (held
-- open until _move_slot_close or the end of the transaction), and the
-- destination pulls the shard's rows under that snapshot with
-- COPY ... TO STDOUT fed into BeginCopyFrom: copy and stream never overlap,
-- no program runs, the source's DSN is read from sharding.nodes there.
CREATE FUNCTION sharding._move_slot_create(source text, slot text, plugin text, options text,
                                           OUT lsn pg_lsn, OUT snapshot text)
    AS 'MODULE_PATHNAME', 'sharding__move_slot_create' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_slot_create(text, text, text, text) IS
    'internal: creates a move''s logical slot at the source over a replication connection, exporting its snapshot';
CREATE FUNCTION sharding._move_slot_close(slot text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_slot_close' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_slot_close(text) IS
    'internal: closes the replication connection holding a move''s exported snapshot';
CREATE FUNCTION sharding._move_pull(source text, snapshot text, rel regclass, columns text[], query text)
    RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding__move_pull' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_pull(text, text, regclass, text[], text) IS
    'internal: at a move''s destination, pulls COPY (query) TO STDOUT from the source under a snapshot into rel; {rows, bytes}';
REVOKE ALL ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_slot_create(text, text, text, text), sharding._move_slot_close(text),
    sharding._move_pull(text, text, regclass, text[], text) TO sharding_admin;

CREATE OR REPLACE FUNCTION sharding._move_drop_replication(name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_drop_replication' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_drop_replication(text) IS
    'internal: drops an online move''s subscription, slot and publication';

CREATE OR REPLACE FUNCTION sharding._move_delete_rows(conn text, map text, logical integer, key text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_delete_rows' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_delete_rows(text, text, integer, text) IS
    'internal: deletes the rows an online move carries on one node (bypassing its guard)';

CREATE OR REPLACE FUNCTION sharding._move_finish(map text, logical integer, key text, destination text, new_epoch bigint)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_finish' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_finish(text, integer, text, text, bigint) IS
    'internal: completes an online move after its switch (thaw, drop replication, delete source rows)';

CREATE OR REPLACE FUNCTION sharding._move_undo(map text, logical integer, key text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_undo' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_undo(text, integer, text) IS
    'internal: undoes an online move that has not switched (drops replication, deletes copies, thaws)';

CREATE OR REPLACE FUNCTION sharding._move_online(map text, logical integer, key text, node text,
                                      OUT new_epoch bigint, OUT moved bigint)
    AS 'MODULE_PATHNAME', 'sharding__move_online' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_online(text, integer, text, text) IS
    'internal: moves a logical shard (or one key) online; the engine of move_shard_online and isolate';

DROP FUNCTION sharding._move_cleanup(text, integer);
DROP FUNCTION sharding._shell_quote(text);

-- _move_journal(sql): runs a statement on the journal through the engine's
-- own connection to this database (sharding_move_self), so that it commits
-- at once, whatever the caller's transaction does; returns its first value.
CREATE OR REPLACE FUNCTION sharding._move_journal(sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_journal' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_journal(text) IS
    'internal: runs a statement on the move journal in its own transaction (committed at once)';

-- _move_phase(map, logical, phase): the live move of the shard enters a
-- phase (committed before the phase acts).
CREATE OR REPLACE FUNCTION sharding._move_phase(map text, logical integer, phase text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_phase' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_phase(text, integer, text) IS
    'internal: records the phase a live move enters, before it acts';

-- _move_stop_backends(conn, name): ends every other session of that
-- node's database whose application_name is the move's name (a copy left
-- running by a cancelled or dead caller) and waits until they are gone.
CREATE OR REPLACE FUNCTION sharding._move_stop_backends(conn text, name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_stop_backends' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_stop_backends(text, text) IS
    'internal: ends what a move''s sessions still run on a node, and waits for them';

-- _move_resolve(move): rolls back (or, if its switch had committed,
-- finishes) a move whose executor is gone, from its journal row; returns
-- the final phase. The caller holds the move's advisory lock.
CREATE OR REPLACE FUNCTION sharding._move_resolve(id bigint, final text DEFAULT 'failed') RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_resolve' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_resolve(bigint, text) IS
    'internal: rolls back or finishes an interrupted move from its journal row';

-- _move_enqueue(job, map, logical, key, destination): a 'queued' journal
-- row (committed at once); the source is the current owner.
CREATE OR REPLACE FUNCTION sharding._move_enqueue(job bigint, map text, logical integer, key text, destination text)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_enqueue' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_enqueue(bigint, text, integer, text, text) IS
    'internal: journals a queued online move (of a job, or a direct call) and returns its id';

-- _move_execute(move): carries out a queued move, or resumes / rolls back
-- an interrupted one, to its end; returns 'done', 'failed' or 'cancelled'.
-- A failure is recorded (error) and returned, not raised; a cancel of the
-- caller rolls back, records 'cancelled' and is re-raised.
CREATE OR REPLACE FUNCTION sharding._move_execute(id bigint) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_execute' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_execute(bigint) IS
    'internal: carries out (or resumes, or rolls back) a journaled move to its end; returns its final phase';

-- _move_cancel(move): a queued move becomes 'cancelled'; a move in flight
-- is told to stop (its executor is cancelled and rolls back); false if it
-- had already ended.
CREATE OR REPLACE FUNCTION sharding._move_cancel(id bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_cancel' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_cancel(bigint) IS
    'internal: cancels a queued or running move (it rolls back); false if it had ended';

-- _move_recover(): resumes or rolls back every move whose executor died
-- (crash, kill -9, restart); returns how many.
CREATE OR REPLACE FUNCTION sharding._move_recover() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__move_recover' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_recover() IS
    'internal: rolls back or finishes every move whose executor died; returns how many';

REVOKE ALL ON FUNCTION sharding._move_journal(text), sharding._move_phase(text, integer, text),
    sharding._move_stop_backends(text, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_journal(text), sharding._move_phase(text, integer, text),
    sharding._move_stop_backends(text, text),
    sharding._move_resolve(bigint, text), sharding._move_enqueue(bigint, text, integer, text, text),
    sharding._move_execute(bigint), sharding._move_cancel(bigint), sharding._move_recover()
    TO sharding_admin;

-- _move_raise(move): raises the recorded error of a move that did not end
-- 'done' (move_shard_online and isolate raise what the engine recorded).
CREATE OR REPLACE FUNCTION sharding._move_raise(id bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_raise' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_raise(bigint) IS
    'internal: raises the recorded error of a move that failed';

-- _move_refuse_written(): the source's slot waits for every transaction
-- holding a transaction id to end, this one included when the source
-- shares its instance: refused before anything happens.
CREATE OR REPLACE FUNCTION sharding._move_refuse_written() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_refuse_written' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_refuse_written() IS
    'internal: 25001 in a transaction that has written (a move''s slot would wait for it)';

-- move_shard_online(map text, logical integer, node text): docs/moves.md.
-- Not STRICT: NULL arguments raise 22023. A journaled move:
-- _move_execute(_move_enqueue(NULL, map, logical, NULL, node)).
CREATE OR REPLACE FUNCTION sharding.move_shard_online(map text, logical integer, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_move_shard_online' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.move_shard_online(text, integer, text) IS
    'moves a logical shard with its rows to a node while writes go on (logical replication); returns its new epoch';

-- isolate(map text, key text, node text): docs/moves.md. Not STRICT.
CREATE OR REPLACE FUNCTION sharding.isolate(map text, key text, node text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_isolate' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.isolate(text, text, text) IS
    'pins a key to a node and moves its rows of every distributed table there online; returns rows moved';

REVOKE ALL ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_raise(bigint), sharding._move_refuse_written() TO sharding_admin;

-- No PL/pgSQL on the move's path (docs/moves.md): the move's remote
-- connections are C++ over libpq (src/nodes/remote_exec.cpp) instead of
-- PL/pgSQL over contrib's dblink; _move_journal asks _dbl_open instead of
-- dblink_get_connections. The 1.2 destination filter (_move_filter,
-- _move_key_in), unused since the decoder filters at the source, is gone:
-- CASCADE drops a filter trigger an interrupted 1.2 move left behind.
DROP FUNCTION sharding._move_filter() CASCADE;
DROP FUNCTION sharding._move_key_in(jsonb, text, text, integer, integer, text, text, text);

-- The move's remote connections, in C++ (src/nodes/remote_exec.cpp): named
-- libpq connections of this session (kept across transactions, closed by
-- _dbl_disconnect, a new _dbl_connect of the name, or the session's end).
-- Every wait is interruptible; a statement running there when the caller
-- is cancelled or fails is cancelled (PQcancel) and its results consumed
-- before the error goes on (a cancelled cutover's _freeze_shard must not
-- freeze the shard after the undo thawed it). Remote errors are raised with
-- their SQLSTATE, message, detail and hint. Remote statements run with
-- search_path = pg_catalog, pg_temp (every name in them is qualified
-- anyway), and commit synchronously: a commit whose WAL waited for the WAL
-- writer would reach walsenders, and so the destination and the followers,
-- that much later, inside the cutover's refusal window. No dblink.
CREATE OR REPLACE FUNCTION sharding._dbl_connect(conn text, dsn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_connect' LANGUAGE C VOLATILE;
CREATE OR REPLACE FUNCTION sharding._dbl_disconnect(conn text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__dbl_disconnect' LANGUAGE C VOLATILE STRICT;
CREATE FUNCTION sharding._dbl_open(conn text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__dbl_open' LANGUAGE C VOLATILE STRICT;
CREATE OR REPLACE FUNCTION sharding._dbl_value(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_value' LANGUAGE C VOLATILE STRICT;
CREATE OR REPLACE FUNCTION sharding._dbl_run(conn text, sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__dbl_run' LANGUAGE C VOLATILE STRICT;

REVOKE ALL ON FUNCTION sharding._dbl_connect(text, text), sharding._dbl_disconnect(text),
    sharding._dbl_open(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._dbl_connect(text, text), sharding._dbl_disconnect(text),
    sharding._dbl_open(text), sharding._dbl_value(text, text), sharding._dbl_run(text, text)
    TO sharding_admin;
COMMENT ON FUNCTION sharding._dbl_connect(text, text) IS 'internal: opens a named remote connection of this session (reopens one of that name)';
COMMENT ON FUNCTION sharding._dbl_disconnect(text) IS 'internal: cancels and closes a named remote connection if open';
COMMENT ON FUNCTION sharding._dbl_open(text) IS 'internal: whether a named remote connection is open';
COMMENT ON FUNCTION sharding._dbl_value(text, text) IS 'internal: first value of a query (or a command''s tag) over a named remote connection';
COMMENT ON FUNCTION sharding._dbl_run(text, text) IS 'internal: runs SQL over a named remote connection, interruptibly; the last command''s tag';

DROP FUNCTION sharding._move_dblink_schema();

CREATE OR REPLACE FUNCTION sharding._move_connect(source text, destination text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_connect' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_connect(text, text) IS
    'internal: opens the remote connections of an online move (55000 for a node without DSN)';

CREATE OR REPLACE FUNCTION sharding._move_journal(sql text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_journal' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_journal(text) IS
    'internal: runs a statement on the move journal in its own transaction (committed at once)';

-- Follow's _remote and _remote_exec on the same C++ helper (no dblink).
-- Follow's remote calls, on the move's libpq helper (src/nodes/remote_exec.cpp):
-- a connection for the call, the statement in its own transaction there,
-- every wait interruptible, the remote statement cancelled when the caller
-- is; a remote error is raised with its SQLSTATE, message, detail and hint.
-- _remote: the first value of a query (NULL if no row).
CREATE OR REPLACE FUNCTION sharding._remote(dsn text, query text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote(text, text) IS
    'internal: first value of a query run on another database (its own connection and transaction)';

-- _remote_exec: runs a command there (CREATE SUBSCRIPTION, ...); its tag.
CREATE OR REPLACE FUNCTION sharding._remote_exec(dsn text, command text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote_exec' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote_exec(text, text) IS
    'internal: runs a command on another database (its own connection and transaction)';


-- _move_wait_flush keeps the journal's lag_bytes current while it waits.
CREATE OR REPLACE FUNCTION sharding._move_wait_flush(name text, seconds float8) RETURNS float8
    AS 'MODULE_PATHNAME', 'sharding__move_wait_flush' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_wait_flush(text, float8) IS
    'internal: waits until an online move''s destination has confirmed the source''s current WAL position';
-- pin_many at scale (docs/directory.md, Pins at scale). The references of
-- sharding.pins to maps and nodes are checked once per statement
-- (sharding._pins_integrity) instead of by declared foreign keys, which
-- checked them row by row.
ALTER TABLE sharding.pins DROP CONSTRAINT pins_map_fkey, DROP CONSTRAINT pins_node_fkey;
-- The references of sharding.pins (map -> sharding.maps ON DELETE CASCADE,
-- node -> sharding.nodes), kept as the declared foreign keys of 1.2 kept
-- them, with their SQLSTATE (23503), messages and locks, but one check per
-- statement over its transition table instead of one query per row:
-- - pins, after INSERT or UPDATE: every map and node the new rows name is
--   locked FOR KEY SHARE (so that a concurrent delete waits for this
--   transaction, or this check for it) and must exist;
-- - maps, after DELETE: the pins of the deleted maps are deleted;
-- - maps and nodes, after UPDATE (of the name) or nodes after DELETE: a name
--   that is gone must not be named by a pin;
-- - maps or nodes, after TRUNCATE (... CASCADE): every pin goes.
-- Not fired by logical-replication apply (session_replication_role =
-- replica), as declared foreign keys are not: the publisher sends the rows.
CREATE FUNCTION sharding._pins_integrity() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    bad text;
    maps_named text[];
    nodes_named text[];
BEGIN
    IF TG_TABLE_NAME = 'pins' THEN
        -- One pass over the rows: the few distinct maps and nodes they name.
        SELECT pg_catalog.array_agg(DISTINCT g.map), pg_catalog.array_agg(DISTINCT g.node) INTO maps_named, nodes_named
          FROM (SELECT c.map, c.node FROM changed c GROUP BY c.map, c.node) g;
        PERFORM FROM sharding.maps m WHERE m.map = ANY (maps_named) FOR KEY SHARE OF m;
        SELECT u INTO bad FROM pg_catalog.unnest(maps_named) u
         WHERE NOT EXISTS (SELECT FROM sharding.maps m WHERE m.map = u) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'insert or update on table "pins" violates foreign key constraint "pins_map_fkey"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_map_fkey',
                      DETAIL = format('Key (map)=(%s) is not present in table "maps".', bad);
        END IF;
        PERFORM FROM sharding.nodes n WHERE n.node = ANY (nodes_named) FOR KEY SHARE OF n;
        SELECT u INTO bad FROM pg_catalog.unnest(nodes_named) u
         WHERE NOT EXISTS (SELECT FROM sharding.nodes n WHERE n.node = u) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'insert or update on table "pins" violates foreign key constraint "pins_node_fkey"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_node_fkey',
                      DETAIL = format('Key (node)=(%s) is not present in table "nodes".', bad);
        END IF;
    ELSIF TG_OP = 'TRUNCATE' THEN
        -- TRUNCATE maps or nodes ... CASCADE (without it, the foreign keys
        -- of sharding.shards refuse): as it took the pins with it in 1.2.
        DELETE FROM sharding.pins;
    ELSIF TG_TABLE_NAME = 'maps' AND TG_OP = 'DELETE' THEN
        DELETE FROM sharding.pins p WHERE p.map IN (SELECT c.map FROM changed c);
    ELSIF TG_TABLE_NAME = 'maps' THEN
        SELECT b.map INTO bad FROM before b
         WHERE NOT EXISTS (SELECT FROM sharding.maps m WHERE m.map = b.map)
           AND EXISTS (SELECT FROM sharding.pins p WHERE p.map = b.map) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'update or delete on table "maps" violates foreign key constraint "pins_map_fkey" on table "pins"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_map_fkey',
                      DETAIL = format('Key (map)=(%s) is still referenced from table "pins".', bad);
        END IF;
    ELSE
        IF TG_OP = 'DELETE' THEN
            SELECT b.node INTO bad FROM changed b
             WHERE EXISTS (SELECT FROM sharding.pins p WHERE p.node = b.node) LIMIT 1;
        ELSE
            SELECT b.node INTO bad FROM before b
             WHERE NOT EXISTS (SELECT FROM sharding.nodes n WHERE n.node = b.node)
               AND EXISTS (SELECT FROM sharding.pins p WHERE p.node = b.node) LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION 'update or delete on table "nodes" violates foreign key constraint "pins_node_fkey" on table "pins"'
                USING ERRCODE = 'foreign_key_violation', SCHEMA = 'sharding', TABLE = 'pins', CONSTRAINT = 'pins_node_fkey',
                      DETAIL = format('Key (node)=(%s) is still referenced from table "pins".', bad);
        END IF;
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._pins_integrity() IS
    'internal: the references of sharding.pins to maps and nodes (23503; a map''s pins go with it), checked per statement';
CREATE TRIGGER pins_fkey_insert AFTER INSERT ON sharding.pins REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_update AFTER UPDATE ON sharding.pins REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_delete AFTER DELETE ON sharding.maps REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_update AFTER UPDATE ON sharding.maps REFERENCING OLD TABLE AS before
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_delete AFTER DELETE ON sharding.nodes REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_update AFTER UPDATE ON sharding.nodes REFERENCING OLD TABLE AS before
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_truncate AFTER TRUNCATE ON sharding.maps
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();
CREATE TRIGGER pins_fkey_truncate AFTER TRUNCATE ON sharding.nodes
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._pins_integrity();

-- pin_many: new keys in one plain INSERT; the distinct nodes by a hash.
-- _check_database_nodes reads a map's pins only when nothing cheaper
-- decides.
-- pin_many(map, keys, nodes) (docs/directory.md) pins (or re-pins) keys[i] to
-- nodes[i] in one statement and returns how many keys it pinned (a key given
-- twice counts once; the last one wins, as two pin calls would). Arrays of
-- different lengths, a NULL or multi-dimensional array, a NULL key: 22023,
-- nothing pinned; each node is checked as pin checks it (empty or NULL:
-- 22023; on a database map, a node without DSN: 55000); followers refuse
-- it as they refuse pin. Instead of pin's per-key shard locks it takes the
-- map's lock (_lock_map: waits for every fence, claim_node and move of the
-- map and keeps new ones out until commit), so that any number of keys costs
-- one lock and two pin_many calls cannot deadlock.
CREATE OR REPLACE FUNCTION sharding.pin_many(map text, keys text[], nodes text[]) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n integer;
    null_at integer;
    empty_at integer;
    distinct_nodes text[];
BEGIN
    IF keys IS NULL OR nodes IS NULL THEN
        RAISE EXCEPTION 'pin_many needs arrays of keys and nodes, got NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_ndims(keys) > 1 OR pg_catalog.array_ndims(nodes) > 1 THEN
        RAISE EXCEPTION 'pin_many needs one-dimensional arrays' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.cardinality(keys) <> pg_catalog.cardinality(nodes) THEN
        RAISE EXCEPTION 'pin_many got % keys but % nodes', pg_catalog.cardinality(keys), pg_catalog.cardinality(nodes)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.array_position(keys, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL (keys[%])', pg_catalog.array_position(keys, NULL)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The first NULL or empty node.
    null_at := pg_catalog.array_position(nodes, NULL);
    empty_at := pg_catalog.array_position(nodes, '');
    IF null_at IS NOT NULL OR empty_at IS NOT NULL THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %',
            CASE WHEN empty_at IS NULL OR null_at < empty_at THEN 'NULL' ELSE pg_catalog.quote_literal('') END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._require_map($1, false);
    PERFORM sharding._lock_map($1);
    PERFORM sharding._require_map($1, true);
    -- A hash of the few distinct nodes, not a sort of every element.
    SELECT pg_catalog.array_agg(d.u) INTO distinct_nodes FROM (SELECT DISTINCT u FROM pg_catalog.unnest(nodes) u) d;
    PERFORM sharding._check_database_nodes($1, distinct_nodes);
    INSERT INTO sharding.nodes (node) SELECT u FROM pg_catalog.unnest(distinct_nodes) u ON CONFLICT DO NOTHING;
    -- Loading new keys, each given once (the common case), is one plain
    -- INSERT: no sort, no speculative insertion. A key pinned already (or
    -- given twice) makes it fail (unique_violation, before any statement
    -- trigger ran: nothing noted, rolled back with the block); then the
    -- last node given for each key wins as in a row of pin calls. The map's
    -- lock keeps pin, unpin and other pin_many calls on it out meanwhile.
    BEGIN
        INSERT INTO sharding.pins (map, key, node)
        SELECT $1, u.key, u.node FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(nodes)) AS u(key, node);
        GET DIAGNOSTICS n = ROW_COUNT;
    EXCEPTION WHEN unique_violation THEN
        INSERT INTO sharding.pins AS p (map, key, node)
        SELECT DISTINCT ON (u.key) $1, u.key, u.node
          FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(nodes)) WITH ORDINALITY AS u(key, node, i)
         ORDER BY u.key, u.i DESC
            ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
        GET DIAGNOSTICS n = ROW_COUNT;
    END;
    IF n > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding.pin_many(text, text[], text[]) IS
    'pins (or re-pins) keys[i] to nodes[i] in one statement; returns how many keys were pinned';
REVOKE ALL ON FUNCTION sharding.pin_many(text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.pin_many(text, text[], text[]) TO sharding_admin;
-- _check_database_nodes(map, nodes): 55000 naming the first node of `nodes`
-- that has no DSN, when `map` is a database map: some node owning its shards
-- or holding its pins, or some node of `nodes`, has a DSN. create_map passes
-- a map that does not exist yet: then only `nodes` decide. Cheapest first:
-- no DSN anywhere; a node of `nodes` or an owner of the map's shards with
-- one. Only then the map's pins (no index by node): a join that stops at
-- the first pin held by a node with a DSN. C++ (src/nodes/owner_switch.cpp;
-- its statements are kept prepared: pin calls it every time).
CREATE OR REPLACE FUNCTION sharding._check_database_nodes(map text, nodes text[]) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__check_database_nodes' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._check_database_nodes(text, text[]) IS
    'internal: 55000 for a node without DSN handed shards or pins of a database map';
REVOKE ALL ON FUNCTION sharding._check_database_nodes(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._check_database_nodes(text, text[]) TO sharding_admin;

-- For tests: how often this backend's routing cache built or refreshed a map.
-- Internal, for tests (test/tap/102_directory_scale.pl): how often this
-- backend's routing cache built a map from all its rows, and refreshed one
-- in place from the keys and shards that changed.
CREATE FUNCTION sharding._routing_cache_counts() RETURNS bigint[]
    AS 'MODULE_PATHNAME', 'sharding__routing_cache_counts' LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION sharding._routing_cache_counts() IS
    'internal: {builds, refreshes} of this backend''s routing cache (for tests)';
-- No PL/pgSQL on the move's path (docs/moves.md): the orchestration of
-- an online move is C++ (src/nodes/move_orchestrate.cpp). _move_online,
-- _move_journal and _move_phase are replaced by the deltas that brought
-- them (70_move, 75_move_remote: their definitions come from the install
-- fragment, now LANGUAGE C); _move_call, unchanged since 1.2 until now,
-- is replaced here.
CREATE OR REPLACE FUNCTION sharding._move_call(conn text, fn text, map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_call' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_call(text, text, text, integer) IS
    'internal: calls sharding._freeze_shard or _thaw_shard on a node';
-- _move_finish, _move_undo, _move_drop_replication and _move_stop_backends
-- are C++ too (replaced by 70_move from the fragment); _move_drop_triggers
-- and _move_sees_switch, unchanged since 1.2 until now, are replaced here.
CREATE OR REPLACE FUNCTION sharding._move_drop_triggers(map text, name text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_drop_triggers' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_drop_triggers(text, text) IS
    'internal: drops an online move''s filter triggers at the destination';
CREATE OR REPLACE FUNCTION sharding._move_sees_switch(conn text, map text, logical integer, key text, node text,
                                           new_epoch bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__move_sees_switch' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_sees_switch(text, text, integer, text, text, bigint) IS
    'internal: whether a node''s followed configuration shows an online move''s switch';
-- What a move costs (docs/moves.md): sharding._move_delete_rows deletes with
-- one plain DELETE per table in one remote transaction (its count read from
-- the command tag) instead of a data-modifying CTE with RETURNING. Its new
-- definition reaches the upgrade through 70_move.sql's
-- `-- @replace sharding._move_delete_rows` (a second @replace of one
-- object stops the build): nothing else to write here.
-- Each fact in one place (docs/architecture.md): shared helpers instead of
-- copies. Changed definitions that an earlier delta already replaces
-- (rebalance, rebalance_by_load: 70_move.sql) reach the upgrade through
-- that delta's `-- @replace`.

-- set_max_attempts and set_backoff find their queue_settings row through
-- one helper, which refuses a NULL queue (22023) and a caller who does not
-- own the table (42501).
-- The key of a queue's row in sharding.queue_settings (its schema and table
-- name), for set_max_attempts and set_backoff: a NULL queue is 22023, a
-- caller who does not own the table (is not a member of its owner) 42501.
-- Not STRICT: NULL raises.
CREATE FUNCTION sharding._queue_settings_key(queue regclass, OUT schema_name text, OUT table_name text)
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    relowner oid;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT n.nspname, c.relname, c.relowner INTO schema_name, table_name, relowner
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = queue;
    IF NOT pg_has_role(relowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of queue table %', queue USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
COMMENT ON FUNCTION sharding._queue_settings_key(regclass) IS
    'internal: schema and table name of a queue the caller owns (its sharding.queue_settings key)';
-- Not STRICT: a NULL max_attempts removes the limit.
CREATE OR REPLACE FUNCTION sharding.set_max_attempts(queue regclass, max_attempts integer) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
BEGIN
    SELECT k.schema_name, k.table_name INTO nsp, rel FROM sharding._queue_settings_key(queue) k;
    IF max_attempts IS NULL THEN
        UPDATE sharding.queue_settings s SET max_attempts = NULL WHERE s.schema_name = nsp AND s.table_name = rel;
        DELETE FROM sharding.queue_settings s
         WHERE s.schema_name = nsp AND s.table_name = rel AND s.backoff_base IS NULL AND s.max_attempts IS NULL;
        RETURN;
    END IF;
    IF max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts must be at least 1, got %', max_attempts USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a
                    WHERE a.attrelid = queue AND a.attname = 'attempts' AND a.atttypid = 'integer'::regtype
                      AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'queue table % has no integer column "attempts" to count against max_attempts', queue
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO sharding.queue_settings AS s (schema_name, table_name, max_attempts)
    VALUES (nsp, rel, set_max_attempts.max_attempts)
    ON CONFLICT (schema_name, table_name) DO UPDATE SET max_attempts = EXCLUDED.max_attempts;
END
$$;
COMMENT ON FUNCTION sharding.set_max_attempts(regclass, integer) IS
    'after max_attempts claims an expired or retried job goes to failed instead of pending (NULL: no limit)';
-- set_backoff: a retried job (fail with retry) is not claimed again before
-- now() + base * 2^(attempts - 1), capped at max. Not STRICT: a NULL base
-- removes the backoff (a retried job then keeps its run_at).
CREATE OR REPLACE FUNCTION sharding.set_backoff(queue regclass, base interval, max interval) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
BEGIN
    SELECT k.schema_name, k.table_name INTO nsp, rel FROM sharding._queue_settings_key(queue) k;
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

-- rebalance and rebalance_by_load lock, plan and move through one helper.
-- What rebalance and rebalance_by_load (80_observe.sql) do once they have
-- checked their arguments: on a database map every listed node needs a DSN
-- (a dry run says so too); unless dry_run, the map-wide lock (it waits for
-- fenced writers and keeps new ones out) and the new nodes registered;
-- then the plan for the owners as they are under the lock, _rebalance_plan
-- or, when loads are given, _rebalance_by_load_plan, is carried out (each
-- move raises the shard's epoch) and returned. Before its first move,
-- caller's refusal of owner switches (a plan without moves changes
-- nothing, and is not refused).
CREATE FUNCTION sharding._rebalance_apply(map text, nodes text[], dry_run boolean, caller text,
                                          loads float8[] DEFAULT NULL, max_imbalance float8 DEFAULT NULL)
    RETURNS TABLE(logical integer, from_node text, to_node text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    owners text[];
    plan refcursor;
    mv record;
    moved integer := 0;
BEGIN
    PERFORM sharding._check_database_nodes($1, nodes);
    IF NOT dry_run THEN
        PERFORM sharding._lock_map($1);
        PERFORM sharding._require_map($1, true);
        INSERT INTO sharding.nodes (node) SELECT n FROM pg_catalog.unnest(nodes) AS n
            ON CONFLICT DO NOTHING;
    END IF;
    SELECT pg_catalog.array_agg(s.node ORDER BY s.logical) INTO owners
      FROM sharding.shards s WHERE s.map = $1;
    IF loads IS NULL THEN
        OPEN plan FOR SELECT * FROM sharding._rebalance_plan(owners, nodes);
    ELSE
        OPEN plan FOR SELECT * FROM sharding._rebalance_by_load_plan(owners, nodes, loads, max_imbalance);
    END IF;
    LOOP
        FETCH plan INTO mv;
        EXIT WHEN NOT FOUND;
        IF NOT dry_run THEN
            -- Refused only when an owner would really change (a plan
            -- without moves changes nothing).
            IF moved = 0 THEN
                PERFORM sharding._refuse_owner_switch($1, caller);
            END IF;
            UPDATE sharding.shards s SET node = mv.to_node, epoch = s.epoch + 1
             WHERE s.map = $1 AND s.logical = mv.logical;
        END IF;
        moved := moved + 1;
        logical := mv.logical;
        from_node := mv.from_node;
        to_node := mv.to_node;
        RETURN NEXT;
    END LOOP;
    CLOSE plan;
    IF NOT dry_run AND moved > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
END $$;
COMMENT ON FUNCTION sharding._rebalance_apply(text, text[], boolean, text, float8[], float8) IS
    'internal: locks the map, plans the moves (by count, or by loads when given) and carries them out unless dry_run';
-- Like the functions that call it: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding._rebalance_apply(text, text[], boolean, text, float8[], float8) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._rebalance_apply(text, text[], boolean, text, float8[], float8) TO sharding_admin;

-- One check of a node name (22023 for NULL or empty), instead of a copy in
-- each function that takes one; move_shard, _switch_owner (70_move.sql) and
-- attach_node (40_fixes.sql) arrive through their deltas' @replace.
-- Validates one node name (pin, move_shard, add_node, attach_node ...):
-- 22023 for NULL or empty. Not STRICT: NULL must raise.
CREATE FUNCTION sharding._check_node(node text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF node IS NULL OR node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
COMMENT ON FUNCTION sharding._check_node(text) IS
    'internal: validates a node name (22023 for NULL or empty)';
CREATE OR REPLACE FUNCTION sharding.pin(map text, key text, node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'pin key must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._check_node(node);
    PERFORM sharding._require_map($1, false);
    -- Waits for claim_node calls in flight on the map, for writers fenced on
    -- the shards the key routes by, and for moves (sharding._lock_pin).
    PERFORM sharding._lock_pin($1, $2);
    PERFORM sharding._require_map($1, true);
    -- On a database map, a pin to a node without DSN would break every proxied call.
    PERFORM sharding._check_database_nodes($1, ARRAY[$3]);
    INSERT INTO sharding.nodes (node) VALUES ($3) ON CONFLICT DO NOTHING;
    INSERT INTO sharding.pins AS p (map, key, node) VALUES ($1, $2, $3)
        ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET node = EXCLUDED.node;
    PERFORM sharding._touch_map($1);
END $$;
COMMENT ON FUNCTION sharding.pin(text, text, text) IS
    'pins (or re-pins) one key, by its text form, to a node, overriding its logical shard';
-- add_node(node text, dsn text): set or replace a node's connection string.
-- Not STRICT: a NULL argument is a mistake worth an error, not a silent
-- no-op.
CREATE OR REPLACE FUNCTION sharding.add_node(node text, dsn text) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    changed boolean := false;
BEGIN
    PERFORM sharding._check_node(add_node.node);
    IF add_node.dsn IS NULL OR btrim(add_node.dsn) = '' THEN
        RAISE EXCEPTION 'connection string of node "%" must not be empty or NULL, got %',
                add_node.node, coalesce(quote_literal(add_node.dsn), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO sharding.nodes AS n (node, dsn)
    VALUES (add_node.node, add_node.dsn)
    ON CONFLICT ON CONSTRAINT nodes_pkey DO UPDATE SET dsn = EXCLUDED.dsn
        WHERE n.dsn IS DISTINCT FROM EXCLUDED.dsn
    RETURNING true INTO changed;

    -- A new DSN changes the PL/Proxy cluster of every map that routes to the
    -- node: raise their versions (in name order, as every writer does) so
    -- that running proxies reload.
    IF changed THEN
        PERFORM sharding._touch_map(u.map)
           FROM (SELECT s.map FROM sharding.shards AS s WHERE s.node = add_node.node
                 UNION
                 SELECT p.map FROM sharding.pins AS p WHERE p.node = add_node.node) AS u
          ORDER BY u.map;
    END IF;
END
$$;
COMMENT ON FUNCTION sharding.add_node(text, text) IS
    'sets (or replaces) the connection string of a node; raises the cluster version of every map using it';
-- detach_node(node text): the node stops following and keeps its copy.
CREATE OR REPLACE FUNCTION sharding.detach_node(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    dl name;
    dsn text;
    sub text;
    n integer;
BEGIN
    PERFORM sharding._check_node(detach_node.node);
    dsn := sharding._node_dsn(detach_node.node);
    dl := sharding._dblink_schema('detach_node');
    sub := sharding._config_subscription(detach_node.node);
    BEGIN
        EXECUTE format($q$SELECT f.n FROM %I.dblink($1, $2) AS f(n integer)$q$, dl)
           INTO n
          USING dsn, format($s$SELECT count(*)::integer FROM pg_catalog.pg_subscription
                                WHERE subname = %L AND subdbid = (SELECT oid FROM pg_catalog.pg_database
                                                                   WHERE datname = pg_catalog.current_database())$s$,
                            sub);
    EXCEPTION WHEN sqlclient_unable_to_establish_sqlconnection OR connection_exception THEN
        RAISE EXCEPTION 'cannot reach node "%" to detach it: %', detach_node.node, SQLERRM
            USING ERRCODE = 'sqlclient_unable_to_establish_sqlconnection',
                  HINT = format('If the node is gone for good, drop its replication slot here: '
                                'SELECT pg_drop_replication_slot(%L);', sharding._config_slot(detach_node.node));
    END;
    IF n > 0 THEN
        -- Drops the subscription's slot here too.
        PERFORM sharding._remote_exec(dsn, format('DROP SUBSCRIPTION %I', sub));
    END IF;
    PERFORM sharding._remote(dsn, 'SELECT sharding._unfollow()::text');
END $$;
COMMENT ON FUNCTION sharding.detach_node(text) IS
    'stops a data node following this coordinator; it keeps its copy of the configuration, editable again';

-- A node's connection string, or 55000 when it has none: one helper for
-- attach_node and detach_node (40_fixes.sql and this file replace them).
-- The connection string of a node that must have one (attach_node,
-- detach_node): 55000 naming the node when it has none or is unknown.
CREATE FUNCTION sharding._node_dsn(node text) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    dsn text;
BEGIN
    SELECT n.dsn INTO dsn FROM sharding.nodes AS n WHERE n.node = _node_dsn.node;
    IF dsn IS NULL THEN
        RAISE EXCEPTION 'node "%" has no connection string', node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Call sharding.add_node(%L, ''<dsn>'') first.', node);
    END IF;
    RETURN dsn;
END $$;
COMMENT ON FUNCTION sharding._node_dsn(text) IS
    'internal: a node''s connection string, 55000 if it has none';
-- No PL/pgSQL on the move's path (docs/moves.md): the helpers
-- that name and describe what a move carries and the move's connections
-- are C++ (src/nodes/move_orchestrate.cpp). Unchanged since 1.2 until now,
-- they are replaced here; _move_connect, _move_wait_flush and
-- _move_refuse_written come from the deltas that changed them before
-- (70_move, 75_move_remote), their definitions from the install fragment.
-- The SQL wrapper _move_switch is gone: the cutover calls _switch_owner.
CREATE OR REPLACE FUNCTION sharding._move_name(map text, logical integer) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_name' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_name(text, integer) IS
    'internal: name of the publication, slot, subscription and trigger of an online move';
CREATE OR REPLACE FUNCTION sharding._move_tables(map text)
    RETURNS TABLE(rel text, key_column text, key_type regtype, cols text, coldefs text, vals text,
                  pk_match text)
    AS 'MODULE_PATHNAME', 'sharding__move_tables' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_tables(text) IS
    'internal: the distributed tables of a map with the column lists an online move needs';
CREATE OR REPLACE FUNCTION sharding._move_filter_sql(key_column text, key_type regtype, shards integer, logical integer,
                                          key text, pins text[]) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__move_filter_sql' LANGUAGE C IMMUTABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_filter_sql(text, regtype, integer, integer, text, text[]) IS
    'internal: SQL condition selecting the rows an online move carries';
CREATE OR REPLACE FUNCTION sharding._move_disconnect() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_disconnect' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_disconnect() IS 'internal: closes the remote connections of an online move';
-- What a move costs (docs/moves.md): the deletes of a move's rows are C++
-- (src/nodes/move_delete.cpp). _move_delete_rows' new definition reaches
-- the upgrade through 70_move.sql's `-- @replace sharding._move_delete_rows`;
-- _move_delete_local, which runs each table's delete at the node with the
-- idle BEFORE ROW DELETE triggers left out, is new.
CREATE FUNCTION sharding._move_delete_local(rel regclass, filter text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__move_delete_local' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_delete_local(regclass, text) IS
    'internal: deletes a move''s rows of one table on this node, idle row triggers left out';
REVOKE ALL ON FUNCTION sharding._move_delete_local(regclass, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_delete_local(regclass, text) TO sharding_admin;
-- The directory at scale (docs/directory.md, Pins at scale): the pins of a
-- node are found by an index instead of a read of every pin (drop_node,
-- add_node, deleting a node that pins name).
-- The pins of a node: drop_node, add_node and the refusal to delete a node
-- that pins name (sharding._pins_integrity) look them up by node, which
-- read every pin of every map without this index.
CREATE INDEX pins_node ON sharding.pins (node);
-- A move's stream stops by itself when its controller (the coordinator's
-- session carrying it out) is gone (docs/moves.md, While the coordinator is
-- down); at the destination the controller's connection watches the
-- subscription (_move_watch).
CREATE FUNCTION sharding._move_watch(subscription text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__move_watch' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._move_watch(text) IS
    'internal: at a move''s destination, stops the subscription''s worker when this session (the controller''s) ends';
REVOKE ALL ON FUNCTION sharding._move_watch(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_watch(text) TO sharding_admin;
-- "No PL/pgSQL on the move's path": the checks and steps a move runs at the
-- coordinator and at its nodes are C++ (src/nodes/owner_switch.cpp,
-- node_steps.cpp), unchanged since 1.2 until now and replaced here;
-- _switch_owner and _check_database_nodes come from the deltas that
-- changed them before (70_move, 84_dir), their definitions taken from the
-- install fragment.
CREATE OR REPLACE FUNCTION sharding._require_map(map text, for_update boolean DEFAULT false) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__require_map' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._require_map(text, boolean) IS
    'internal: logical shard count of a map, 42704 if it does not exist';
CREATE OR REPLACE FUNCTION sharding._check_logical(map text, logical integer, logical_shards integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__check_logical' LANGUAGE C IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._check_logical(text, integer, integer) IS
    'internal: validates a logical shard number (22023)';
CREATE OR REPLACE FUNCTION sharding._coordinator_dsn() RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__coordinator_dsn' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._coordinator_dsn() IS
    'internal: sharding.coordinator_dsn, or a DSN of this database derived from the current connection';
CREATE OR REPLACE FUNCTION sharding._install_guard(schema_name text, table_name text, key_column text, map text)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__install_guard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._install_guard(text, text, text, text) IS
    'internal: creates the guard trigger on a distributed table of this data node';
CREATE OR REPLACE FUNCTION sharding._install_guards() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__install_guards' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._install_guards() IS
    'internal: guards every distributed table of this data node (when it follows)';
CREATE OR REPLACE FUNCTION sharding._freeze_shard(map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__freeze_shard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._freeze_shard(text, integer) IS
    'internal: waits for the shard''s writers, then refuses its guarded writes on this node until _thaw_shard';
CREATE OR REPLACE FUNCTION sharding._thaw_shard(map text, logical integer) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__thaw_shard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._thaw_shard(text, integer) IS
    'internal: lifts _freeze_shard; true if the shard was frozen';
-- sharding.move_nice (docs/moves.md): the sessions of a move's copy can
-- run below the nodes' own work; _move_nice, which such a session calls
-- on itself, is new.
-- _move_nice(step): a session of a move's copy lowers its own priority
-- (sharding.move_nice, src/nodes/move_copy.cpp).
CREATE FUNCTION sharding._move_nice(step integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__move_nice' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._move_nice(integer) IS
    'internal: raises this backend''s nice value by step (0-19) for a move''s copy; returns the new value';
REVOKE ALL ON FUNCTION sharding._move_nice(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._move_nice(integer) TO sharding_admin;
-- Rebalance jobs (docs/rebalance.md). A job is one row of sharding.move_jobs; each
-- of its moves is a row of the move engine's journal (sharding.move_journal,
-- 90_move.sql), enqueued when the job starts. The job's moves are carried
-- out by whoever runs _job_claim/_job_execute in a loop: background runners
-- of the coordinator's server when the library is preloaded
-- (src/nodes/jobs.cpp), else CALL sharding.rebalance_run(job).
--
-- Who executes which move: a runner claims a move by taking the move
-- engine's own session advisory lock of the move
-- (hashtext('sharding.move_journal'), move % (2^31 - 1)), the one its
-- executor and recovery take, and holds it until _move_execute returns, so
-- "in flight" is exactly "locked by a live backend", also after a crash (the
-- lock dies with its process), and a move being recovered is never claimed. _job_claim runs under the job
-- row's lock, so two runners never exceed max_parallel nor take two moves
-- of one shard.
--
-- Every function below is C++ (src/nodes/jobs_run.cpp) behind its SQL
-- name: no PL/pgSQL on a move's path. The capacity checks ask the nodes
-- over the move engine's libpq helper, not dblink.

CREATE TABLE sharding.move_jobs (
    job              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    map              text NOT NULL,
    strategy         text NOT NULL CHECK (strategy IN ('count', 'load', 'drain')),
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    nodes            text[],
    loads            float8[],
    max_imbalance    float8,
    drained          text,
    max_parallel     integer NOT NULL CHECK (max_parallel >= 1),
    switched         integer NOT NULL DEFAULT 0,
    runas            oid NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false,
    created          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    started          timestamptz,
    finished         timestamptz,
    error            text,
    -- why no further move starts now (rebalance_jobs.waiting); per queued
    -- move passed over by the last claim, why it waits (move number ->
    -- reason: move_progress.waiting)
    waiting          text,
    waits            jsonb NOT NULL DEFAULT '{}',
    -- key moves (drain's pins) enqueued once no live move of their shard
    -- remains (the journal allows one live move per shard)
    deferred         jsonb NOT NULL DEFAULT '[]',
    -- failed moves that were interrupted (their executor died: crash,
    -- restart) and rolled back by recovery, each replaced by a new move of
    -- the same shard: they do not fail the job
    retried          bigint[] NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE sharding.move_jobs IS
    'rebalance jobs (rebalance_start, drain_node), one row per job, kept after it ends; read it through the rebalance_jobs view';
-- At most one live job per map (55006 for a second one).
CREATE UNIQUE INDEX move_jobs_one_live_per_map ON sharding.move_jobs (map)
    WHERE state IN ('queued', 'running');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_jobs', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.move_jobs_job_seq', '');
GRANT SELECT ON sharding.move_jobs TO PUBLIC;
GRANT INSERT, UPDATE ON sharding.move_jobs TO sharding_admin;

-- Background runners (src/nodes/jobs.cpp).
CREATE FUNCTION sharding._job_launch(job bigint, runners integer, runas oid) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__job_launch' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._job_launch(bigint, integer, oid) IS
    'internal: starts runners background workers for a job when this transaction commits; false without preload';
CREATE FUNCTION sharding._job_runners(job bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_runners' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._job_runners(bigint) IS
    'internal: background runners of a job in this database now';
REVOKE ALL ON FUNCTION sharding._job_launch(bigint, integer, oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._job_launch(bigint, integer, oid) TO sharding_admin;

-- The logical shard of a pinned key (pins are by text form): computed by
-- the type of the map's distributed key columns, as writers route it (the
-- type a key is hashed as: sharding._key_type).
CREATE FUNCTION sharding._job_key_shard(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_key_shard' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_key_shard(text, text) IS
    'internal: the logical shard of a pinned key, by the type of the map''s key columns';

-- rebalance_start: plans as rebalance / rebalance_by_load (their dry runs)
-- and enqueues every planned move; a map without distributed tables is
-- rebalanced in place (owner switches) and its job is done at once. A
-- start that fails (or is cancelled) cancels the moves it had enqueued.
CREATE FUNCTION sharding.rebalance_start(map text, nodes text[], strategy text DEFAULT 'count',
                                         loads float8[] DEFAULT NULL, max_imbalance float8 DEFAULT 1.10,
                                         max_parallel integer DEFAULT 1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_rebalance_start' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer) IS
    'starts a rebalance job (strategy count or load) that moves every planned shard online, max_parallel at a time; returns its id at once';

-- drain_node: every shard of `node` onto the map's other shard owners
-- (count-balanced, rebalance's plan over them), every key pinned to it onto
-- the owner of the key's shard after that plan.
CREATE FUNCTION sharding.drain_node(map text, node text, max_parallel integer DEFAULT 1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_drain_node' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.drain_node(text, text, integer) IS
    'starts a job moving every shard and pinned key of node onto the map''s other shard owners, online; afterwards drop_node succeeds';

-- _job_claim(job): the next move this backend should execute (and now
-- holds the claim of), 0 when none may start now (max_parallel moves in
-- flight, one move into a node at a time per map, a node without capacity
-- (replication slots, WAL senders, apply workers, counting moves claimed
-- but not begun): `waiting` says why), NULL when the job is over. A failed
-- move or a cancel stops the job: moves not begun are cancelled; it ends
-- once no move is in flight. A move rolled back by recovery is carried out
-- again (at most 3 tries per shard); deferred key moves are enqueued once
-- their shard has no live move.
CREATE FUNCTION sharding._job_claim(job bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_claim' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_claim(bigint) IS
    'internal: claims the next move of a job for this backend (its id), 0 if none may start now, NULL once the job is over';

-- Executes a claimed move through the engine, then gives up the claim.
CREATE FUNCTION sharding._job_execute(job bigint, move bigint) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_execute' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_execute(bigint, bigint) IS
    'internal: carries out a claimed move of a job (sharding._move_execute) and releases the claim';

-- A runner whose job is over takes the oldest live job of its role that
-- lacks runners (NULL: none).
CREATE FUNCTION sharding._job_adopt() RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_adopt' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_adopt() IS
    'internal: the next live job of this role that lacks background runners';

-- The launcher's scanner, at server start and when runners were short:
-- recovers moves whose executor died, then asks for runners for every
-- live job.
CREATE FUNCTION sharding._job_pickup() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__job_pickup' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_pickup() IS
    'internal: recovers interrupted moves and starts background runners for every live job (the launcher calls it)';

-- rebalance_wait: the job's state once it has ended, or when timeout runs
-- out. Polls (each check a new snapshot: call it in READ COMMITTED).
CREATE FUNCTION sharding.rebalance_wait(job bigint, timeout interval DEFAULT NULL) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding_rebalance_wait' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_wait(bigint, interval) IS
    'waits until a rebalance job ends (or timeout runs out) and returns its state';

-- rebalance_cancel: moves not begun are dropped, the ones in flight are told
-- to roll back (the engine's _move_cancel); done ones stay done. The job
-- ends 'cancelled' as soon as no move is in flight.
CREATE FUNCTION sharding.rebalance_cancel(job bigint) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_rebalance_cancel' LANGUAGE C VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.rebalance_cancel(bigint) IS
    'cancels a rebalance job: moves not begun are dropped, moves in flight roll back, done moves stay; false if it had ended';

-- rebalance_run: carries a job out in this session, one move at a time,
-- committing between steps (so it must be CALLed outside a transaction
-- block). No SET clause: a procedure with one cannot COMMIT; it pins
-- search_path itself for each step.
CREATE PROCEDURE sharding.rebalance_run(job bigint)
    AS 'MODULE_PATHNAME', 'sharding_rebalance_run' LANGUAGE C;
COMMENT ON PROCEDURE sharding.rebalance_run(bigint) IS
    'carries out a queued or interrupted rebalance job in this session until it ends';

REVOKE ALL ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer),
    sharding.drain_node(text, text, integer), sharding._job_claim(bigint), sharding._job_execute(bigint, bigint),
    sharding.rebalance_wait(bigint, interval), sharding.rebalance_cancel(bigint), sharding._job_pickup()
    FROM PUBLIC;
REVOKE ALL ON PROCEDURE sharding.rebalance_run(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.rebalance_start(text, text[], text, float8[], float8, integer),
    sharding.drain_node(text, text, integer), sharding._job_claim(bigint), sharding._job_execute(bigint, bigint),
    sharding.rebalance_wait(bigint, interval), sharding.rebalance_cancel(bigint)
    TO sharding_admin;
GRANT EXECUTE ON PROCEDURE sharding.rebalance_run(bigint) TO sharding_admin;

-- The WAL a move's destination still has to confirm, read live at the
-- source (its slot) over the move engine's libpq helper; NULL when it
-- cannot be read (node down, no password in the node's DSN for a role that
-- is not a superuser), and for a role that is neither a superuser nor a
-- member of sharding_admin (nothing connects on its behalf):
-- move_progress then shows the journal's figure. Executable by PUBLIC:
-- move_progress, readable by all, calls it, and a view's function calls are
-- checked for its reader.
CREATE FUNCTION sharding._job_lag(source text, slot text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__job_lag' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._job_lag(text, text) IS
    'internal: bytes of WAL a move''s slot at the source has not had confirmed yet, NULL if unreadable';

-- rebalance_jobs: one row per job, kept after it ends. The counts are of
-- the job's journal rows (a move interrupted by a crash and carried out
-- again counts once), plus the owner switches of maps without distributed
-- tables.
CREATE VIEW sharding.rebalance_jobs AS
    SELECT j.job, j.map, j.strategy, j.state,
           (j.switched + coalesce(c.total, 0) - pg_catalog.cardinality(j.retried)
            + pg_catalog.jsonb_array_length(j.deferred))::integer AS moves_total,
           (j.switched + coalesce(c.done, 0))::integer AS moves_done,
           (coalesce(c.failed, 0) - pg_catalog.cardinality(j.retried))::integer AS moves_failed,
           j.started, j.finished, j.error,
           coalesce(c.cancelled, 0)::integer AS moves_cancelled,
           j.max_parallel, j.nodes, j.drained, j.created, j.waiting
      FROM sharding.move_jobs j
      LEFT JOIN LATERAL (
           SELECT pg_catalog.count(*) AS total,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'done') AS done,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'failed') AS failed,
                  pg_catalog.count(*) FILTER (WHERE m.phase = 'cancelled') AS cancelled
             FROM sharding.move_journal m WHERE m.job = j.job) c ON true;
COMMENT ON VIEW sharding.rebalance_jobs IS
    'rebalance jobs: state, moves total/done/failed, times and the first failed move''s error';
GRANT SELECT ON sharding.rebalance_jobs TO PUBLIC;

-- move_progress: every move planned or in flight (of a job, or a direct
-- move_shard_online/isolate call), and every move of a job still running.
-- lag_bytes is read live at the source while the move catches up. The bar
-- and time_left come from how long the job's (else the map's) finished
-- moves took: a move is expected to take their median; without history,
-- the bar shows the phase and time_left is NULL.
CREATE VIEW sharding.move_progress AS
    SELECT m.job, m.map, m.logical, m.key, m.source, m.destination, m.phase,
           m.rows_copied, m.bytes_copied,
           CASE WHEN m.phase IN ('catching_up', 'cutover')
                THEN coalesce(sharding._job_lag(m.source, sharding._move_name(m.map, m.logical)), m.lag_bytes)
                ELSE m.lag_bytes END AS lag_bytes,
           m.started, m.phase_started, m.error,
           sharding.bar(p.fraction, 1, 20) AS bar,
           pg_catalog.date_trunc('second',
               CASE WHEN m.phase IN ('done', 'failed', 'cancelled') THEN interval '0'
                    WHEN h.expected IS NULL THEN NULL
                    WHEN m.phase = 'queued' THEN greatest(h.expected, interval '1 s')
                    ELSE greatest(h.expected - (pg_catalog.clock_timestamp() - m.started), interval '1 s') END
               + interval '0.5 s') AS time_left,
           CASE WHEN m.phase = 'queued' AND j.state IN ('queued', 'running')
                THEN coalesce(j.waits ->> m.move::text, CASE WHEN j.waits = '{}' THEN j.waiting END) END AS waiting,
           m.move
      FROM sharding.move_journal m
      LEFT JOIN sharding.move_jobs j ON j.job = m.job
      LEFT JOIN LATERAL (
           SELECT pg_catalog.percentile_cont(0.5) WITHIN GROUP (ORDER BY d.finished - d.started) AS expected
             FROM (SELECT x.started, x.finished FROM sharding.move_journal x
                    WHERE x.phase = 'done' AND x.started IS NOT NULL AND x.map = m.map
                      AND (x.job = m.job OR NOT EXISTS (SELECT FROM sharding.move_journal y
                                                         WHERE y.job = m.job AND y.phase = 'done'))
                    ORDER BY x.finished DESC LIMIT 20) d) h ON true
      CROSS JOIN LATERAL (
           SELECT CASE WHEN m.phase = 'done' THEN 1.0
                       WHEN m.phase IN ('queued', 'failed', 'cancelled') OR m.started IS NULL THEN 0.0
                       WHEN h.expected IS NOT NULL AND h.expected > interval '0'
                       THEN least(0.95, pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() - m.started)
                                        / pg_catalog.date_part('epoch', h.expected))
                       ELSE CASE m.phase WHEN 'copying' THEN 0.25 WHEN 'catching_up' THEN 0.6
                                         WHEN 'cutover' THEN 0.85 ELSE 0.95 END
                  END::float8 AS fraction) p
     WHERE m.phase NOT IN ('done', 'failed', 'cancelled') OR j.state IN ('queued', 'running');
COMMENT ON VIEW sharding.move_progress IS
    'moves planned or in flight (and every move of a running job): phase, rows/bytes copied, lag, bar, time left, why it waits';
GRANT SELECT ON sharding.move_progress TO PUBLIC;
