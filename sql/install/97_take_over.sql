-- The coordinator fails over (docs/nodes.md, "Failover of the
-- coordinator"; CONTRACT 15.3). take_over() on a server promoted from a
-- physical standby of the coordinator (or restored from its backup) makes
-- every attached data node follow it: the node's subscription to the lost
-- server is dropped (its slot lived there), its copy of the configuration
-- is made this server's (one transaction, read in the snapshot of a fresh
-- slot here, so that writers never see a gap), and it subscribes here.
--
-- Fencing. take_over writes a coordinator identity (a random token, this
-- server's system identifier and timeline) here and on every node it
-- re-points. Every session the coordinator's engine opens to a database
-- (moves, jobs, attach/detach, follow: src/remote/move_remote.cpp) first
-- presents the token of its own database; a node that holds an identity
-- refuses (55000, naming its coordinator) a session presenting another one.
-- The old coordinator, which never saw the token, is refused everywhere;
-- its own configuration changes reach no node, since no node subscribes to
-- it any more. A node accepts a new identity only from a later timeline
-- of the same system (a promoted standby, a restored backup), or with
-- take_over(force => true).

-- @object sharding.take_over
CREATE TABLE sharding.coordinator_identity (
    one_row           boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    token             uuid NOT NULL,
    system_identifier text NOT NULL,
    timeline          integer NOT NULL,
    coordinator       text NOT NULL,
    since             timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- On the coordinator: the nodes its last take_over could not reach,
    -- which the jobs launcher's scanner re-points (_take_over_pending).
    unreached         text[] NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE sharding.coordinator_identity IS
    'the coordinator this database is (on a coordinator) or follows (on a node), written by take_over (local, not replicated)';
SELECT pg_catalog.pg_extension_config_dump('sharding.coordinator_identity', '');
GRANT SELECT ON sharding.coordinator_identity TO PUBLIC;

-- _serve(token): what every session of a coordinator's engine runs first
-- (src/remote/move_remote.cpp). Passes where this database holds no
-- identity or the same token; 55000 naming the coordinator otherwise.
CREATE FUNCTION sharding._serve(token text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    cur record;
BEGIN
    SELECT * INTO cur FROM sharding.coordinator_identity AS i;
    IF NOT FOUND OR cur.token::text = token THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'database "%" follows coordinator % since %: it refuses requests from another coordinator',
            pg_catalog.current_database(), cur.coordinator, cur.since
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = format('The request came from a coordinator with identity %s; this database follows %s (system %s, timeline %s).',
                              coalesce(nullif(token, ''), 'none'), cur.token, cur.system_identifier, cur.timeline),
              HINT = format('Run it on the coordinator %s: a server replaced by sharding.take_over() no longer drives the nodes.',
                            cur.coordinator);
END $$;
COMMENT ON FUNCTION sharding._serve(text) IS
    'internal: refuses (55000) a session of a coordinator this database does not follow';

-- The configuration tables, row by row, as JSON (timestamps in UTC, so
-- that the same rows give the same text on any server).
CREATE FUNCTION sharding._config_json() RETURNS jsonb
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    SET timezone = 'UTC'
    AS $$
DECLARE
    t name;
    rows jsonb;
    out jsonb := '{}';
BEGIN
    FOREACH t IN ARRAY sharding._config_tables() LOOP
        EXECUTE format('SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r)), ''[]'') FROM sharding.%I AS r', t)
           INTO rows;
        out := out || jsonb_build_object(t, rows);
    END LOOP;
    RETURN out;
END $$;
COMMENT ON FUNCTION sharding._config_json() IS
    'internal: the rows of every configuration table as JSON (take_over copies them to the nodes)';

-- What take_over compares: every map's version, every shard's epoch, the
-- nodes and distributed tables.
CREATE FUNCTION sharding._config_summary() RETURNS jsonb
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT jsonb_build_object(
        'versions', (SELECT coalesce(jsonb_object_agg(v.map, v.version), '{}') FROM sharding.map_versions AS v),
        'epochs', (SELECT coalesce(jsonb_object_agg(s.map || '/' || s.logical, s.epoch), '{}') FROM sharding.shards AS s),
        'pins', (SELECT coalesce(jsonb_object_agg(p.map, p.n), '{}')
                   FROM (SELECT p.map, count(*) AS n FROM sharding.pins AS p GROUP BY p.map) AS p),
        'nodes', (SELECT coalesce(jsonb_agg(n.node ORDER BY n.node), '[]') FROM sharding.nodes AS n),
        'tables', (SELECT coalesce(jsonb_object_agg(format('%I.%I', d.schema_name, d.table_name), d.map), '{}')
                     FROM sharding.distributed_tables AS d))
$$;
COMMENT ON FUNCTION sharding._config_summary() IS
    'internal: versions, epochs, pin counts, nodes and distributed tables of the configuration (take_over compares them)';

-- _take_over_ahead(ours, theirs): the first change a node's copy holds that
-- this server's configuration lacks, in words; NULL if none. A map's
-- version rises with every change of the map, its pins or its nodes, so a
-- higher version is a change; an epoch above ours, a node or distributed
-- table we do not know (of a map whose version is not below ours) too.
CREATE FUNCTION sharding._take_over_ahead(ours jsonb, theirs jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT coalesce(
        (SELECT format('map "%s" at version %s (here %s)', v.key, v.value,
                       coalesce(ours->'versions'->>v.key, 'unknown'))
           FROM jsonb_each_text(theirs->'versions') AS v
          WHERE (ours->'versions'->>v.key) IS NULL OR (ours->'versions'->>v.key)::bigint < v.value::bigint
          ORDER BY v.key LIMIT 1),
        (SELECT format('shard %s of map "%s" at epoch %s (here %s)', split_part(e.key, '/', 2),
                       left(e.key, length(e.key) - length(split_part(e.key, '/', 2)) - 1), e.value,
                       coalesce(ours->'epochs'->>e.key, 'unknown'))
           FROM jsonb_each_text(theirs->'epochs') AS e
          WHERE (ours->'epochs'->>e.key) IS NULL OR (ours->'epochs'->>e.key)::bigint < e.value::bigint
          ORDER BY e.key LIMIT 1),
        (SELECT format('node "%s"', n) FROM jsonb_array_elements_text(theirs->'nodes') AS n
          WHERE NOT (ours->'nodes' ? n) ORDER BY n LIMIT 1),
        (SELECT format('distributed table %s of map "%s"', d.key, d.value)
           FROM jsonb_each_text(theirs->'tables') AS d
          WHERE NOT (ours->'tables' ? d.key)
            AND coalesce((ours->'versions'->>d.value)::bigint, 0) <= coalesce((theirs->'versions'->>d.value)::bigint, 0)
          ORDER BY d.key LIMIT 1))
$$;
COMMENT ON FUNCTION sharding._take_over_ahead(jsonb, jsonb) IS
    'internal: the first configuration change a node holds that this server lacks (NULL if none)';

-- On a node (take_over, over its connection): what take_over needs to know
-- of it. coordinator_dsn: the DSN its subscription should use.
CREATE FUNCTION sharding._take_over_probe(coordinator_dsn text) RETURNS jsonb
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT jsonb_build_object(
        'following_as', (SELECT l.node FROM sharding.local_node AS l WHERE l.following),
        'identity', (SELECT to_jsonb(i) FROM sharding.coordinator_identity AS i),
        'summary', sharding._config_summary(),
        'subscription', (SELECT jsonb_build_object('here', s.subconninfo = $1, 'enabled', s.subenabled,
                                                   'slot', s.subslotname)
                           FROM pg_catalog.pg_subscription AS s
                          WHERE s.subname = sharding._config_subscription(l.node)
                            AND s.subdbid = (SELECT d.oid FROM pg_catalog.pg_database AS d
                                              WHERE d.datname = pg_catalog.current_database()))
      )
      FROM (SELECT (SELECT l.node FROM sharding.local_node AS l WHERE l.following) AS node) AS l
$$;
COMMENT ON FUNCTION sharding._take_over_probe(text) IS
    'internal: a node''s follow state, identity and configuration summary, for take_over';

-- _take_over_successor(cur, token, system_identifier, timeline): whether an
-- identity may replace the one a database holds: none yet, the same token
-- (a repeat), or a later timeline of the same system.
CREATE FUNCTION sharding._take_over_successor(cur jsonb, token uuid, system_identifier text, timeline integer)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT cur IS NULL OR (cur->>'token')::uuid = $2
        OR (cur->>'system_identifier' = $3 AND (cur->>'timeline')::integer < $4)
$$;
COMMENT ON FUNCTION sharding._take_over_successor(jsonb, uuid, text, integer) IS
    'internal: whether a coordinator identity may replace the one a database holds';

-- On a node: takes the new coordinator's identity (refused, 55000, unless
-- it succeeds the one held, or force).
CREATE FUNCTION sharding._take_over_accept(node text, token uuid, system_identifier text, timeline integer,
                                           coordinator text, force boolean) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    cur jsonb := (SELECT to_jsonb(i) FROM sharding.coordinator_identity AS i);
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following AND l.node = $1) THEN
        RAISE EXCEPTION 'this database does not follow a coordinator as node "%"', $1
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF NOT force AND NOT sharding._take_over_successor(cur, $2, $3, $4) THEN
        RAISE EXCEPTION 'node "%" follows coordinator % (system %, timeline %): % (system %, timeline %) does not succeed it',
                $1, cur->>'coordinator', cur->>'system_identifier', cur->>'timeline', $5, $3, $4
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'take_over() succeeds a coordinator from its promoted standby or restored backup; '
                         'take_over(force => true) overrides.';
    END IF;
    INSERT INTO sharding.coordinator_identity AS i (token, system_identifier, timeline, coordinator)
        VALUES ($2, $3, $4, sharding._mask_password($5))
        ON CONFLICT (one_row) DO UPDATE SET token = EXCLUDED.token, system_identifier = EXCLUDED.system_identifier,
                                            timeline = EXCLUDED.timeline, coordinator = EXCLUDED.coordinator,
                                            since = pg_catalog.now()
        WHERE i.token IS DISTINCT FROM EXCLUDED.token OR i.coordinator IS DISTINCT FROM EXCLUDED.coordinator;
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding._take_over_accept(text, uuid, text, integer, text, boolean) IS
    'internal: a node takes the identity of the coordinator that took over';

-- On a node, in one transaction: its copy of the configuration becomes
-- `config` (rows that differ deleted, missing rows inserted, as apply
-- writes them: session_replication_role = replica), so that its writers
-- route by one configuration or the other, never by none. Returns how
-- many rows changed.
CREATE FUNCTION sharding._take_over_sync(node text, dsn text, config jsonb) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET timezone = 'UTC'
    AS $$
DECLARE
    t name;
    n bigint;
    changed bigint := 0;
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following AND l.node = $1) THEN
        RAISE EXCEPTION 'this database does not follow a coordinator as node "%"', $1
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM pg_catalog.set_config('session_replication_role', 'replica', true);
    FOREACH t IN ARRAY sharding._config_tables() LOOP
        EXECUTE format('DELETE FROM sharding.%1$I AS x USING (SELECT pg_catalog.to_jsonb(o) AS j FROM sharding.%1$I AS o '
                       'EXCEPT SELECT e FROM pg_catalog.jsonb_array_elements($1) AS e) AS d '
                       'WHERE pg_catalog.to_jsonb(x) OPERATOR(pg_catalog.=) d.j', t)
          USING coalesce(config->t, '[]');
        GET DIAGNOSTICS n = ROW_COUNT;
        changed := changed + n;
    END LOOP;
    FOREACH t IN ARRAY sharding._config_tables() LOOP
        EXECUTE format('INSERT INTO sharding.%1$I SELECT (pg_catalog.jsonb_populate_record(NULL::sharding.%1$I, d.j)).* '
                       'FROM (SELECT e FROM pg_catalog.jsonb_array_elements($1) AS e '
                       'EXCEPT SELECT pg_catalog.to_jsonb(o) FROM sharding.%1$I AS o) AS d(j)', t)
          USING coalesce(config->t, '[]');
        GET DIAGNOSTICS n = ROW_COUNT;
        changed := changed + n;
    END LOOP;
    PERFORM pg_catalog.set_config('session_replication_role', 'origin', true);
    UPDATE sharding.local_node SET coordinator_dsn = sharding._mask_password($2)
     WHERE coordinator_dsn IS DISTINCT FROM sharding._mask_password($2);
    RETURN changed;
END $$;
COMMENT ON FUNCTION sharding._take_over_sync(text, text, jsonb) IS
    'internal: a node''s configuration copy made the new coordinator''s, in one transaction';

-- On the coordinator, in its own transaction (take_over calls it over a
-- connection, so that it commits before any node takes the identity): the
-- identity; with force, every shard's epoch above the highest a node
-- reported (node_epochs: {"map/logical": epoch}) and every map's version
-- above any node's (top).
CREATE FUNCTION sharding._take_over_commit(token uuid, system_identifier text, timeline integer, coordinator text,
                                           node_epochs jsonb, top bigint) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    raised integer := 0;
    m text;
BEGIN
    INSERT INTO sharding.coordinator_identity AS i (token, system_identifier, timeline, coordinator)
        VALUES ($1, $2, $3, sharding._mask_password($4))
        ON CONFLICT (one_row) DO UPDATE SET token = EXCLUDED.token, system_identifier = EXCLUDED.system_identifier,
                                            timeline = EXCLUDED.timeline, coordinator = EXCLUDED.coordinator,
                                            since = pg_catalog.now()
        WHERE i.token IS DISTINCT FROM EXCLUDED.token OR i.coordinator IS DISTINCT FROM EXCLUDED.coordinator;
    IF node_epochs IS NOT NULL THEN
        UPDATE sharding.shards AS s
           SET epoch = GREATEST(s.epoch, coalesce((node_epochs->>(s.map || '/' || s.logical))::bigint, 0)) + 1;
        GET DIAGNOSTICS raised = ROW_COUNT;
        -- A move past its switch is finished at the shard's epoch as it is
        -- now (its finish waits for the nodes to show it).
        UPDATE sharding.move_journal AS j SET new_epoch = s.epoch
          FROM sharding.shards AS s
         WHERE j.phase = 'cleanup' AND j.key IS NULL AND s.map = j.map AND s.logical = j.logical
           AND j.new_epoch IS DISTINCT FROM s.epoch;
        IF top IS NOT NULL AND (SELECT q.last_value FROM sharding.version_seq AS q) < top THEN
            PERFORM pg_catalog.setval('sharding.version_seq', top);
        END IF;
        FOR m IN SELECT v.map FROM sharding.map_versions AS v ORDER BY v.map LOOP
            PERFORM sharding._touch_map(m);
        END LOOP;
    END IF;
    RETURN raised;
END $$;
COMMENT ON FUNCTION sharding._take_over_commit(uuid, text, integer, text, jsonb, bigint) IS
    'internal: records this coordinator''s identity (and, with force, raises epochs and versions above the nodes'')';

-- C++ (src/datanode/take_over.cpp): the configuration of the database at dsn
-- as JSON, read in the snapshot of a new logical slot made there, so that
-- a subscription on that slot carries exactly the later changes.
CREATE FUNCTION sharding._take_over_config(dsn text, slot text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__take_over_config' LANGUAGE C VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._take_over_config(text, text) IS
    'internal: a new logical slot at dsn and the configuration read in its snapshot';
-- The connections this transaction opens from here on present no identity
-- check (take_over's own: the nodes' accept decides). C++.
CREATE FUNCTION sharding._take_over_mode() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__take_over_mode' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._take_over_mode() IS
    'internal: take_over''s own connections skip the identity check until the end of the transaction';

-- Asks the jobs launcher (with the library preloaded) to scan this
-- database again a little later, which calls _take_over_pending. C++.
CREATE FUNCTION sharding._take_over_later() RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__take_over_later' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._take_over_later() IS
    'internal: the jobs launcher re-points the nodes take_over could not reach, a little later';

-- Whether this server was promoted from a standby of the coordinator (or
-- restored from its backup) and take_over has not run yet: the identity it
-- holds is of its system but of an earlier timeline. The jobs launcher's
-- scanner does not recover moves nor run jobs here until take_over has.
CREATE FUNCTION sharding._take_over_needed() RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT NOT pg_catalog.pg_is_in_recovery() AND EXISTS (
        SELECT FROM sharding.coordinator_identity AS i, pg_catalog.pg_control_system() AS c
         WHERE i.system_identifier = c.system_identifier::text
           AND i.timeline < ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::integer
           AND NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following))
$$;
COMMENT ON FUNCTION sharding._take_over_needed() IS
    'internal: whether this server was promoted (or restored) and waits for take_over before it runs moves and jobs';

-- What the launcher's scanner calls in every database: where this server's
-- own take_over left nodes out of reach, take_over again (a failure is a
-- WARNING, and another try is asked for).
CREATE FUNCTION sharding._take_over_pending() RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    n integer;
BEGIN
    IF pg_catalog.pg_is_in_recovery()
       OR NOT EXISTS (SELECT FROM sharding.coordinator_identity AS i
                       WHERE pg_catalog.cardinality(i.unreached) > 0
                         AND i.system_identifier = (SELECT c.system_identifier::text FROM pg_catalog.pg_control_system() AS c)
                         AND i.timeline = ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::integer) THEN
        RETURN NULL;
    END IF;
    BEGIN
        n := sharding.take_over();
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'take_over of the nodes out of reach failed: %', SQLERRM;
        PERFORM sharding._take_over_later();
    END;
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding._take_over_pending() IS
    'internal: take_over again where this server''s last one left nodes out of reach (the jobs launcher calls it)';

-- On the coordinator, in its own transaction (take_over calls it over a
-- connection): the owner switch of a move in flight here that this server
-- missed (an asynchronous standby promoted after the old coordinator's
-- switch) while its destination shows it. The switch and the journal's
-- 'cleanup' commit together, as the move's own cutover does; the move is
-- then finished, never undone (_move_recover). new_epoch is the switch's;
-- with force, _take_over_commit raises it with the shard's epoch.
CREATE FUNCTION sharding._take_over_switch(move bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    j record;
    e bigint;
BEGIN
    SELECT m.move, m.map, m.logical, m.key, m.destination INTO j FROM sharding.move_journal AS m
     WHERE m.move = $1 AND m.phase IN ('copying', 'catching_up', 'cutover') FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The move's own switch passes _move_refuse.
    PERFORM pg_catalog.set_config('sharding_move.own', j.move::text, true);
    IF j.key IS NULL THEN
        e := sharding._switch_owner(j.map, j.logical, j.destination);
    ELSE
        PERFORM sharding.pin(j.map, j.key, j.destination);
    END IF;
    UPDATE sharding.move_journal AS m SET phase = 'cleanup', phase_started = pg_catalog.now(), new_epoch = e
     WHERE m.move = j.move;
    RETURN coalesce(e, 0);
END $$;
COMMENT ON FUNCTION sharding._take_over_switch(bigint) IS
    'internal: take_over takes the owner switch of a move in flight that its destination shows and this server missed';

-- take_over(force): see the top of this file and docs/nodes.md.
CREATE FUNCTION sharding._take_over_body(force boolean) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_variable
DECLARE
    me text;
    sysid text;
    tl integer;
    tok uuid;
    cur jsonb;
    ours jsonb;
    n record;
    facts jsonb;
    probed jsonb := '{}';
    change text;
    ahead text[] := '{}';
    epochs jsonb := '{}';
    top bigint;
    node_maps text[] := '{}';
    node_versions bigint[] := '{}';
    v record;
    e record;
    sub text;
    slot text;
    config text;
    n_following integer := 0;
    missed text[] := '{}';
    mv record;
    owner text;
    adopted text[] := '{}';
BEGIN
    IF force IS NULL THEN
        RAISE EXCEPTION 'force must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION 'take_over needs a primary: this server is still in recovery'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Promote it first (pg_ctl promote, or SELECT pg_promote()).';
    END IF;
    IF EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RAISE EXCEPTION 'this database is not a coordinator: it follows one as node "%"',
                (SELECT l.node FROM sharding.local_node AS l)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run take_over on the promoted standby of the coordinator.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication AS p WHERE p.pubname = 'sharding_config') THEN
        RAISE EXCEPTION 'this database is not a coordinator: no node was ever attached here'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'It has no publication sharding_config.',
                  HINT = 'Run take_over on the promoted standby of the coordinator.';
    END IF;
    IF coalesce(pg_catalog.current_setting('sharding.coordinator_dsn', true), '') = '' THEN
        RAISE EXCEPTION 'take_over needs sharding.coordinator_dsn set on this server'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The nodes subscribe to this server with it.',
                  HINT = 'ALTER SYSTEM SET sharding.coordinator_dsn = ''host=... port=... dbname=...''; SELECT pg_reload_conf();';
    END IF;
    IF pg_catalog.current_setting('wal_level') <> 'logical' THEN
        RAISE EXCEPTION 'take_over needs wal_level = logical, got %', pg_catalog.current_setting('wal_level')
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF pg_catalog.txid_current_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'take_over must run in a transaction that has not written yet'
            USING ERRCODE = 'active_sql_transaction', HINT = 'Call it in its own transaction.';
    END IF;
    me := sharding._coordinator_dsn();
    sysid := (SELECT c.system_identifier::text FROM pg_catalog.pg_control_system() AS c);
    tl := ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::integer;
    cur := (SELECT to_jsonb(i) FROM sharding.coordinator_identity AS i);
    -- A repeat on this server keeps its token.
    IF cur IS NOT NULL AND cur->>'system_identifier' = sysid AND (cur->>'timeline')::integer = tl THEN
        tok := (cur->>'token')::uuid;
    ELSE
        tok := pg_catalog.gen_random_uuid();
    END IF;
    PERFORM sharding._take_over_mode();
    ours := sharding._config_summary();

    -- 1. Every node with a DSN: does it follow (as itself), may it take
    -- this identity, is its copy ahead of ours? Nothing changes yet.
    FOR n IN SELECT d.node, d.dsn FROM sharding.nodes AS d WHERE d.dsn IS NOT NULL ORDER BY d.node LOOP
        BEGIN
            facts := sharding._remote(n.dsn, format('SELECT sharding._take_over_probe(%L)::text', me))::jsonb;
        EXCEPTION WHEN sqlclient_unable_to_establish_sqlconnection OR connection_exception THEN
            RAISE WARNING 'node "%" is out of reach: it follows this server once take_over reaches it', n.node
                USING DETAIL = SQLERRM;
            missed := missed || n.node;
            CONTINUE;
        END;
        IF facts->>'following_as' IS DISTINCT FROM n.node THEN
            IF facts->>'following_as' IS NOT NULL THEN
                RAISE WARNING 'node "%" follows a coordinator as node "%": left alone', n.node, facts->>'following_as';
            END IF;
            CONTINUE;
        END IF;
        IF NOT force AND NOT sharding._take_over_successor(facts->'identity', tok, sysid, tl) THEN
            RAISE EXCEPTION 'node "%" follows coordinator % (system %, timeline %): this server (system %, timeline %) does not succeed it',
                    n.node, facts->'identity'->>'coordinator', facts->'identity'->>'system_identifier',
                    facts->'identity'->>'timeline', sysid, tl
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Nothing was changed.',
                      HINT = 'take_over() succeeds a coordinator from its promoted standby or restored backup; '
                             'take_over(force => true) overrides.';
        END IF;
        probed := probed || jsonb_build_object(n.node, facts);
    END LOOP;

    -- 1b. A move in flight here before its switch whose destination owns
    -- the shard (or the key) in its copy, or whose source's copy names the
    -- destination, had its switch at the old coordinator, which this server
    -- missed (an asynchronous standby): the nodes' word before this
    -- server's journal. The switch is taken here, committed with the
    -- journal's 'cleanup', so that the move is finished, never undone: the
    -- destination may hold the only copy of the rows and writes made since
    -- the switch.
    FOR mv IN SELECT j.move, j.map, j.logical, j.key, j.source, j.destination
                FROM sharding.move_journal AS j
               WHERE j.phase IN ('copying', 'catching_up', 'cutover') AND (probed ? j.destination OR probed ? j.source)
               ORDER BY j.move LOOP
        owner := NULL;
        FOR n IN SELECT d.node, d.dsn FROM sharding.nodes AS d
                  WHERE d.node IN (mv.destination, mv.source) AND probed ? d.node
                  ORDER BY d.node = mv.destination DESC LOOP
            BEGIN
                owner := sharding._remote(n.dsn, CASE WHEN mv.key IS NULL
                    THEN format('SELECT s.node FROM sharding.shards AS s WHERE s.map = %L AND s.logical = %s', mv.map, mv.logical)
                    ELSE format('SELECT p.node FROM sharding.pins AS p WHERE p.map = %L AND p.key = %L', mv.map, mv.key) END);
            EXCEPTION WHEN sqlclient_unable_to_establish_sqlconnection OR connection_exception THEN
                owner := NULL;  -- asked again by the next take_over, before its copy is replaced
            END;
            EXIT WHEN owner IS NOT DISTINCT FROM mv.destination;
        END LOOP;
        CONTINUE WHEN owner IS DISTINCT FROM mv.destination;
        RAISE WARNING 'the destination "%" of the move of logical shard % of map "%" owns it: this server missed its owner switch, which it takes',
                mv.destination, mv.logical, mv.map
            USING DETAIL = format('Move %s was in flight in this server''s journal; node "%s" shows the switch. The move is finished, never undone.',
                                  mv.move, n.node);
        PERFORM sharding._remote(me, format('SELECT sharding._take_over_switch(%s)::text', mv.move));
        adopted := adopted || format('move %s of logical shard %s of map "%s"', mv.move, mv.logical, mv.map);
    END LOOP;
    IF cardinality(adopted) > 0 THEN
        ours := sharding._config_summary();
    END IF;
    FOR n IN SELECT p.key AS node, p.value AS facts FROM jsonb_each(probed) AS p ORDER BY p.key LOOP
        change := sharding._take_over_ahead(ours, n.facts->'summary');
        IF change IS NOT NULL THEN
            ahead := ahead || format('node "%s" holds %s', n.node, change);
        END IF;
    END LOOP;
    IF cardinality(ahead) > 0 AND NOT force THEN
        RAISE EXCEPTION 'take_over refused: %, a configuration change this server lacks', ahead[1]
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = CASE WHEN cardinality(adopted) = 0 THEN 'Nothing was changed. '
                                ELSE 'Nothing was changed at the nodes; this server took the owner switch of '
                                     || array_to_string(adopted, ', ') || ', which its destination shows. ' END
                           || array_to_string(ahead, '; ') || '.',
                  HINT = 'This server missed changes the old coordinator had sent (an asynchronous standby). '
                         'take_over(force => true) makes this server''s configuration the truth and raises every shard''s epoch above any node''s.';
    END IF;

    -- 2. Here, committed before any node takes the identity: the identity,
    -- the publication, versions above the nodes' (and with force, epochs).
    FOR n IN SELECT p.key AS node, p.value AS facts FROM jsonb_each(probed) AS p LOOP
        FOR v IN SELECT x.key AS map, x.value::bigint AS version FROM jsonb_each_text(n.facts->'summary'->'versions') AS x LOOP
            node_maps := node_maps || v.map;
            node_versions := node_versions || v.version;
            top := GREATEST(top, v.version);
        END LOOP;
        FOR e IN SELECT x.key, x.value::bigint AS epoch FROM jsonb_each_text(n.facts->'summary'->'epochs') AS x LOOP
            IF coalesce((epochs->>e.key)::bigint, 0) < e.epoch THEN
                epochs := epochs || jsonb_build_object(e.key, e.epoch);
            END IF;
        END LOOP;
    END LOOP;
    PERFORM sharding._remote(me, format('SELECT sharding._take_over_commit(%L, %L, %s, %L, %s, %s)::text',
                                        tok, sysid, tl, me,
                                        CASE WHEN force THEN quote_literal(epochs::text) || '::jsonb' ELSE 'NULL' END,
                                        coalesce(top::text, 'NULL')));
    PERFORM sharding._remote(me, format('SELECT sharding._publish_config(%L, %L)::text', node_maps, node_versions));

    -- 3. Every node: the identity, its old subscription gone, its copy
    -- made ours in one transaction, subscribed here.
    FOR n IN SELECT p.key AS node, p.value AS facts, d.dsn
               FROM jsonb_each(probed) AS p JOIN sharding.nodes AS d ON d.node = p.key ORDER BY p.key LOOP
        sub := sharding._config_subscription(n.node);
        slot := sharding._config_slot_here(n.node);
        BEGIN
            PERFORM sharding._remote(n.dsn, format('SELECT sharding._take_over_accept(%L, %L, %L, %s, %L, %L)::text',
                                                   n.node, tok, sysid, tl, me, force));
            IF (n.facts->'identity'->>'token')::uuid IS NOT DISTINCT FROM tok
               AND (n.facts->'subscription'->>'here')::boolean AND (n.facts->'subscription'->>'enabled')::boolean
               AND n.facts->'subscription'->>'slot' = slot
               AND EXISTS (SELECT FROM pg_catalog.pg_replication_slots AS r WHERE r.slot_name = slot) AND NOT force THEN
                n_following := n_following + 1;  -- follows this server already
                CONTINUE;
            END IF;
            IF n.facts->'subscription' IS NOT NULL AND n.facts->'subscription' <> 'null'::jsonb THEN
                PERFORM sharding._remote_exec(n.dsn, format('ALTER SUBSCRIPTION %I DISABLE', sub));
                PERFORM sharding._remote_exec(n.dsn, format('ALTER SUBSCRIPTION %I SET (slot_name = NONE)', sub));
                PERFORM sharding._remote_exec(n.dsn, format('DROP SUBSCRIPTION %I', sub));
            END IF;
            IF EXISTS (SELECT FROM pg_catalog.pg_replication_slots AS r WHERE r.slot_name = slot) THEN
                PERFORM sharding._remote(me, format(
                    $s$SELECT 'dropped' FROM pg_catalog.pg_drop_replication_slot(%L)$s$, slot));
            END IF;
            config := sharding._take_over_config(me, slot);
            PERFORM sharding._remote(n.dsn, format('SELECT sharding._take_over_sync(%L, %L, %L::jsonb)::text',
                                                   n.node, me, config));
            PERFORM sharding._remote_exec(n.dsn, format(
                'CREATE SUBSCRIPTION %I CONNECTION %L PUBLICATION sharding_config '
                'WITH (slot_name = %L, create_slot = false, copy_data = false)', sub, me, slot));
            PERFORM sharding._remote(n.dsn, 'SELECT sharding._install_guards()::text');
            n_following := n_following + 1;
        EXCEPTION WHEN sqlclient_unable_to_establish_sqlconnection OR connection_exception THEN
            RAISE WARNING 'node "%" is out of reach: it follows this server once take_over reaches it', n.node
                USING DETAIL = SQLERRM;
            missed := missed || n.node;
        END;
    END LOOP;

    -- 4. Moves in flight: finished where the destination sees the switch,
    -- rolled back otherwise (the move engine's recovery); jobs go on.
    BEGIN
        PERFORM sharding._move_recover();
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'moves in flight are not resolved yet: %', SQLERRM
            USING HINT = 'With the library preloaded the jobs launcher retries; otherwise call sharding._move_recover().';
    END;
    -- 5. The nodes out of reach: the jobs launcher's scanner tries again
    -- (1, 2, 4, 8, then every 10 s) with the library preloaded; else the
    -- next call.
    PERFORM sharding._remote(me, format('UPDATE sharding.coordinator_identity SET unreached = %L '
                                        'WHERE unreached IS DISTINCT FROM %L RETURNING 1', missed, missed));
    -- The jobs launcher scans here again: it picks up the jobs (and the
    -- nodes out of reach).
    PERFORM sharding._take_over_later();
    IF cardinality(missed) > 0 THEN
        RAISE NOTICE 'take_over: % node(s) follow this server; out of reach: %', n_following, array_to_string(missed, ', ');
    END IF;
    RETURN n_following;
END $$;
COMMENT ON FUNCTION sharding._take_over_body(boolean) IS
    'internal: take_over''s steps, run by take_over in the engine''s scope (the extension''s owner alone may call it)';
REVOKE ALL ON FUNCTION sharding._take_over_body(boolean) FROM PUBLIC;
-- The entry point (SEC-4): runs the body in the engine's scope, where the
-- nodes' whole DSNs and the coordinator's password serve its statements.
CREATE FUNCTION sharding.take_over(force boolean DEFAULT false) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__engine_call' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding.take_over(boolean) IS
    'makes this promoted standby the coordinator of every attached node; returns how many now follow it';

-- _serve stays executable by every role: it only reads.
REVOKE ALL ON FUNCTION sharding.take_over(boolean), sharding._config_json(), sharding._take_over_probe(text),
    sharding._take_over_accept(text, uuid, text, integer, text, boolean), sharding._take_over_sync(text, text, jsonb),
    sharding._take_over_commit(uuid, text, integer, text, jsonb, bigint), sharding._take_over_config(text, text),
    sharding._take_over_mode(), sharding._take_over_later(), sharding._take_over_pending(), sharding._take_over_needed(),
    sharding._take_over_switch(bigint)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.take_over(boolean), sharding._config_json(), sharding._take_over_probe(text),
    sharding._take_over_accept(text, uuid, text, integer, text, boolean), sharding._take_over_sync(text, text, jsonb),
    sharding._take_over_commit(uuid, text, integer, text, jsonb, bigint), sharding._take_over_config(text, text),
    sharding._take_over_mode(), sharding._take_over_later(), sharding._take_over_pending(), sharding._take_over_needed(),
    sharding._take_over_switch(bigint)
    TO sharding_admin;
-- @end
