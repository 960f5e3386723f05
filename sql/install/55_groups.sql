-- Worker groups (docs/workers.md, CONTRACT 15.5): the shards of a map of
-- workers dealt to the workers that are alive, by join, heartbeat and
-- leave, as Kafka's consumer groups deal partitions.
--
-- State: one row per group (sharding.worker_groups, the map's generation)
-- and one per member (sharding.worker_members, its lease). Members are
-- written only by sharding._group_apply, which runs as the extension's
-- owner: join, heartbeat and leave call it through sharding._group_call
-- (C++, src/routing/groups.cpp), which passes the calling role, checked
-- there, and switches to the owner for the call only. So a worker needs no
-- right on the config tables: it can change nothing but what the rules of
-- a group do with its own membership.
--
-- Redistribution (sharding._group_deal): under the map's exclusive lock
-- (the one rebalance takes: it waits for claim_node calls in flight and
-- for fenced writers, and serialises every change of one group), expired
-- members are dropped, then the shards are planned over the live members
-- (in order of joining) by rebalance's planner (sharding._rebalance_plan:
-- count-balanced, fewest moves), each moved shard's epoch + 1. A group
-- without live members keeps its assignment.
--
-- Generation: + 1 for each statement that changes the owner of a shard of
-- the group's map, whatever wrote it (a deal, move_shard, rebalance, the
-- moves of rebalance_start and drain_node): the trigger
-- groups_shards_moved on sharding.shards.
--
-- Time: leases are taken and checked at clock_timestamp() (not now(), the
-- transaction's start), so a join late in a long transaction still gets
-- its whole lease.
--
-- Routing (src/routing/maps.cpp): on a map with a group, a pin to a node
-- that is not a member routes as if the key were not pinned; a change of
-- membership touches the map's row so that every backend rebuilds it.

-- @object sharding.worker_groups
-- No foreign key to sharding.maps: a follower's resynchronisation
-- (sharding._follow) truncates the maps, which a reference from here would
-- refuse. A map's group goes with the map (the trigger below); a follower
-- refuses join, so its table stays empty.
CREATE TABLE sharding.worker_groups (
    map        text PRIMARY KEY,
    generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0)
);
COMMENT ON TABLE sharding.worker_groups IS
    'one row per map whose shards are dealt to a worker group (join); its generation';
SELECT pg_catalog.pg_extension_config_dump('sharding.worker_groups', '');
GRANT SELECT ON sharding.worker_groups TO PUBLIC;
-- drop_map runs as its caller: the trigger deletes the map's group as it.
GRANT DELETE ON sharding.worker_groups TO sharding_admin;
CREATE FUNCTION sharding._groups_map_dropped() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    DELETE FROM sharding.worker_groups g WHERE g.map IN (SELECT d.map FROM dropped d);
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._groups_map_dropped() IS
    'internal: a dropped map''s worker group (and its members) go with it';
CREATE TRIGGER groups_map_dropped AFTER DELETE ON sharding.maps REFERENCING OLD TABLE AS dropped
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._groups_map_dropped();
-- @end

-- @object sharding.worker_members
-- Not dumped: a restored group has no live member (and keeps its
-- assignment until one joins).
CREATE TABLE sharding.worker_members (
    map           text NOT NULL REFERENCES sharding.worker_groups ON DELETE CASCADE,
    worker        text NOT NULL CHECK (worker <> ''),
    member_role   oid NOT NULL,
    joined        timestamptz NOT NULL DEFAULT pg_catalog.now(),
    lease         interval NOT NULL,
    lease_expires timestamptz NOT NULL,
    PRIMARY KEY (map, worker)
);
COMMENT ON TABLE sharding.worker_members IS
    'internal: members of worker groups with their leases (see the view sharding.group_members)';
COMMENT ON COLUMN sharding.worker_members.member_role IS
    'the role that joined it: only that role (or the extension''s owner, sharding_admin) renews it or makes it leave';
GRANT SELECT ON sharding.worker_members TO PUBLIC;
-- @end

-- @object sharding._groups_shards_moved
-- Runs as the role that moved shards (a deal runs as the extension's
-- owner; move_shard, rebalance and the move jobs as a sharding_admin).
GRANT UPDATE (generation) ON sharding.worker_groups TO sharding_admin;
CREATE FUNCTION sharding._groups_shards_moved() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    UPDATE sharding.worker_groups g SET generation = g.generation + 1
     WHERE g.map IN (SELECT n.map FROM moved_new n JOIN moved_old o ON o.map = n.map AND o.logical = n.logical
                      WHERE o.node IS DISTINCT FROM n.node);
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._groups_shards_moved() IS
    'internal: a statement that changed the owner of a shard of a worker group''s map raises its generation';
CREATE TRIGGER groups_shards_moved AFTER UPDATE ON sharding.shards
    REFERENCING OLD TABLE AS moved_old NEW TABLE AS moved_new
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._groups_shards_moved();
-- @end

-- @object sharding.group_members
CREATE VIEW sharding.group_members AS
SELECT m.map, m.worker, m.joined, m.lease_expires,
       (SELECT pg_catalog.count(*) FROM sharding.shards s
         WHERE s.map OPERATOR(pg_catalog.=) m.map AND s.node OPERATOR(pg_catalog.=) m.worker)::integer AS shards,
       g.generation
  FROM sharding.worker_members m
  JOIN sharding.worker_groups g ON g.map OPERATOR(pg_catalog.=) m.map
 WHERE m.lease_expires OPERATOR(pg_catalog.>=) pg_catalog.statement_timestamp();
COMMENT ON VIEW sharding.group_members IS
    'one row per live member of every worker group: its lease, how many shards it owns, the group''s generation';
GRANT SELECT ON sharding.group_members TO PUBLIC;
-- @end

-- @object sharding._group_deal
-- Deals the map's shards over its live members (under the map lock, which
-- the caller holds): drops the expired members, plans with rebalance's
-- planner, moves and raises epochs (the generation: the trigger on
-- sharding.shards, sharding._groups_shards_moved). Returns how many
-- shards moved. `changed`: membership changed by the caller (a member
-- joined or left), so that routing of pins is rebuilt.
CREATE FUNCTION sharding._group_deal(map text, changed boolean) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    live text[];
    owners text[];
    moved integer := 0;
    dropped integer;
BEGIN
    DELETE FROM sharding.worker_members m WHERE m.map = $1 AND m.lease_expires < clock_timestamp();
    GET DIAGNOSTICS dropped = ROW_COUNT;
    SELECT array_agg(m.worker ORDER BY m.joined, m.worker) INTO live
      FROM sharding.worker_members m WHERE m.map = $1;
    IF live IS NOT NULL THEN
        SELECT array_agg(s.node ORDER BY s.logical) INTO owners FROM sharding.shards s WHERE s.map = $1;
        -- One statement: the trigger on sharding.shards raises the
        -- generation once.
        UPDATE sharding.shards s SET node = mv.to_node, epoch = s.epoch + 1
          FROM sharding._rebalance_plan(owners, live) mv
         WHERE s.map = $1 AND s.logical = mv.logical;
        GET DIAGNOSTICS moved = ROW_COUNT;
    END IF;
    -- A pin to a node that stopped (or started) being a member routes
    -- differently: every backend rebuilds the map (its row changed).
    IF (changed OR dropped > 0) AND EXISTS (SELECT FROM sharding.pins p WHERE p.map = $1) THEN
        UPDATE sharding.maps m SET logical_shards = m.logical_shards WHERE m.map = $1;
    END IF;
    IF moved > 0 OR changed OR dropped > 0 THEN
        PERFORM sharding._touch_map($1);
    END IF;
    RETURN moved;
END $$;
COMMENT ON FUNCTION sharding._group_deal(text, boolean) IS
    'internal: drops expired members and deals a worker group''s shards over the live ones (fewest moves)';
REVOKE ALL ON FUNCTION sharding._group_deal(text, boolean) FROM PUBLIC;
-- @end

-- @object sharding._group_apply
-- What join, heartbeat, leave and the reapers do, as the extension's owner
-- (called only through sharding._group_call, which passes the caller's
-- role in `caller`). op: 'join', 'heartbeat', 'leave' (result: the
-- generation; for leave 1 or 0), 'reap' (one map; result: shards moved),
-- 'reap_all' (every map with an expired member, then the next expiry is
-- handed to the background worker; result: maps reaped).
CREATE FUNCTION sharding._group_apply(op text, map text, worker text, lease interval, caller oid) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    manager boolean;
    member_role oid;
    was_live boolean := false;
    n bigint := 0;
    m text;
    expires timestamptz;
    busy boolean := false;
    t timestamptz;
BEGIN
    IF op = 'reap_all' THEN
        -- The background worker's reaper: never waits long for a map
        -- (claim_node in an open transaction holds it): a map whose lock
        -- is not had within 100 ms is left for a retry a second later.
        PERFORM set_config('lock_timeout', '100ms', true);
        FOR m IN SELECT DISTINCT w.map FROM sharding.worker_members w
                  WHERE w.lease_expires < clock_timestamp() ORDER BY 1 LOOP
            BEGIN
                PERFORM sharding._lock_map(m);
                PERFORM sharding._group_deal(m, false);
                n := n + 1;
            EXCEPTION WHEN lock_not_available THEN
                busy := true;
            END;
        END LOOP;
        SELECT min(w.lease_expires) INTO expires FROM sharding.worker_members w
         WHERE w.lease_expires >= clock_timestamp();
        IF busy THEN
            expires := least(expires, clock_timestamp() + interval '1 second');
        END IF;
        PERFORM sharding._group_watch(expires, true);
        RETURN n;
    END IF;
    IF op = 'reap' THEN
        IF NOT EXISTS (SELECT FROM sharding.worker_members w WHERE w.map = $2 AND w.lease_expires < clock_timestamp()) THEN
            RETURN 0;
        END IF;
        PERFORM sharding._lock_map($2);
        RETURN sharding._group_deal($2, false);
    END IF;

    -- join, heartbeat, leave: the caller's rights first.
    manager := EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = caller AND r.rolsuper)
               OR caller = (SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname = 'sharding')
               OR pg_has_role(caller, 'sharding_admin', 'USAGE');
    IF NOT manager AND NOT pg_has_role(caller, 'sharding_worker', 'USAGE') THEN
        RAISE EXCEPTION 'permission denied for %: role % is not a member of sharding_worker', op,
              quote_ident(coalesce((SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = caller)::text, caller::text))
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'GRANT sharding_worker TO the role the worker logs in as.';
    END IF;
    IF $2 IS NULL OR $2 = '' THEN
        RAISE EXCEPTION 'map name must not be empty or NULL, got %', coalesce(quote_literal($2), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $3 IS NULL OR $3 = '' THEN
        RAISE EXCEPTION 'worker name must not be empty or NULL, got %', coalesce(quote_literal($3), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF op = 'join' AND (lease IS NULL OR lease <= interval '0') THEN
        RAISE EXCEPTION 'lease must be positive, got %', coalesce(lease::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF op NOT IN ('join', 'heartbeat', 'leave') THEN
        RAISE EXCEPTION 'unknown worker group operation %', quote_literal(op) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM sharding.maps p WHERE p.map = $2) THEN
        RAISE EXCEPTION 'map "%" does not exist', $2 USING ERRCODE = 'undefined_object';
    END IF;

    IF op = 'heartbeat' THEN
        -- The cheap path: renew a live lease. The map lock only when some
        -- member of the map has expired (it is dropped and its shards
        -- dealt), and then before the member's row is locked: join and
        -- leave lock the map, then the row.
        IF EXISTS (SELECT FROM sharding.worker_members w WHERE w.map = $2 AND w.lease_expires < clock_timestamp()) THEN
            PERFORM sharding._lock_map($2);
            PERFORM sharding._group_deal($2, false);
        END IF;
        -- Only the member's role (or a manager) renews it: in the UPDATE
        -- itself, so that it holds for the row as it is when locked.
        t := clock_timestamp();
        UPDATE sharding.worker_members w SET lease_expires = t + w.lease
         WHERE w.map = $2 AND w.worker = $3 AND w.lease_expires >= t
           AND (manager OR w.member_role = caller)
        RETURNING w.lease_expires INTO expires;
        IF NOT FOUND THEN
            IF EXISTS (SELECT FROM sharding.worker_members w
                        WHERE w.map = $2 AND w.worker = $3 AND w.lease_expires >= t) THEN
                RAISE EXCEPTION 'permission denied for %: worker "%" of map "%" was joined by another role', op, $3, $2
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            RAISE EXCEPTION 'worker "%" is not a live member of the group of map "%"', $3, $2
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Its lease expired, it left or it never joined: call sharding.join again (and read its shards).';
        END IF;
        PERFORM sharding._group_watch(expires, false);
        RETURN (SELECT g.generation FROM sharding.worker_groups g WHERE g.map = $2);
    END IF;

    -- join, leave: the map lock serialises every change of the group; the
    -- member's row is read (and its role checked) only under it.
    PERFORM sharding._lock_map($2);
    PERFORM sharding._require_map($2, true);
    t := clock_timestamp();
    -- A live member of another role: only that role or a manager.
    SELECT w.member_role, w.lease_expires >= t INTO member_role, was_live
      FROM sharding.worker_members w WHERE w.map = $2 AND w.worker = $3;
    was_live := coalesce(was_live, false);
    IF was_live AND member_role <> caller AND NOT manager THEN
        RAISE EXCEPTION 'permission denied for %: worker "%" of map "%" was joined by another role', op, $3, $2
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF op = 'join' THEN
        IF EXISTS (SELECT FROM sharding.distributed_tables d WHERE d.map = $2) THEN
            RAISE EXCEPTION 'map "%" has distributed tables: its shards cannot be dealt to workers', $2
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Worker groups are for maps of workers (nodes without a DSN and no distributed table).';
        END IF;
        IF EXISTS (SELECT FROM sharding.nodes n
                    WHERE n.dsn IS NOT NULL
                      AND (n.node = $3
                           OR n.node IN (SELECT s.node FROM sharding.shards s WHERE s.map = $2)
                           OR n.node IN (SELECT p.node FROM sharding.pins p WHERE p.map = $2))) THEN
            RAISE EXCEPTION 'map "%" is a map of databases (its nodes have a DSN): its shards cannot be dealt to workers', $2
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Worker groups are for maps of workers (nodes without a DSN and no distributed table).';
        END IF;
        INSERT INTO sharding.worker_groups (map) VALUES ($2) ON CONFLICT DO NOTHING;
        INSERT INTO sharding.nodes (node) VALUES ($3) ON CONFLICT DO NOTHING;
        -- An expired row (of whatever role) is a new membership; a live
        -- one is renewed only for its role or a manager (checked above,
        -- and again on the row as written).
        INSERT INTO sharding.worker_members AS w (map, worker, member_role, joined, lease, lease_expires)
        VALUES ($2, $3, caller, t, $4, t + $4)
        ON CONFLICT ON CONSTRAINT worker_members_pkey DO UPDATE
           SET member_role = CASE WHEN w.lease_expires < t THEN EXCLUDED.member_role ELSE w.member_role END,
               joined = CASE WHEN w.lease_expires < t THEN EXCLUDED.joined ELSE w.joined END,
               lease = EXCLUDED.lease, lease_expires = EXCLUDED.lease_expires
         WHERE manager OR w.member_role = caller OR w.lease_expires < t;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'permission denied for %: worker "%" of map "%" was joined by another role', op, $3, $2
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        PERFORM sharding._group_watch(t + $4, false);
        PERFORM sharding._group_deal($2, NOT was_live);
        RETURN (SELECT g.generation FROM sharding.worker_groups g WHERE g.map = $2);
    END IF;
    -- leave
    DELETE FROM sharding.worker_members w
     WHERE w.map = $2 AND w.worker = $3 AND w.lease_expires >= t AND (manager OR w.member_role = caller);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 AND EXISTS (SELECT FROM sharding.worker_members w
                          WHERE w.map = $2 AND w.worker = $3 AND w.lease_expires >= t) THEN
        RAISE EXCEPTION 'permission denied for %: worker "%" of map "%" was joined by another role', op, $3, $2
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM sharding._group_deal($2, n > 0);
    RETURN n;
END $$;
COMMENT ON FUNCTION sharding._group_apply(text, text, text, interval, oid) IS
    'internal: join, heartbeat, leave and lease expiry of worker groups, run as the extension''s owner';
REVOKE ALL ON FUNCTION sharding._group_apply(text, text, text, interval, oid) FROM PUBLIC;
-- @end

-- @object sharding._group_call
-- Calls sharding._group_apply as the extension's owner, passing the
-- calling role (C++, src/routing/groups.cpp). Any role may call it for
-- join, heartbeat and leave (what it may do is decided there, by its
-- rights); 'reap' and 'reap_all' only the extension's owner or a superuser
-- (else 42501).
CREATE FUNCTION sharding._group_call(op text, map text, worker text, lease interval) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__group_call' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._group_call(text, text, text, interval) IS
    'internal: runs a worker group operation as the extension''s owner for the calling role';
-- @end

-- @object sharding._group_watch
-- Tells the background worker (with the library preloaded) when this
-- database's next lease expires (C++, src/routing/groups.cpp); nothing
-- without preload.
CREATE FUNCTION sharding._group_watch(expires timestamptz, reaped boolean) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__group_watch' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding._group_watch(timestamptz, boolean) IS
    'internal: the next lease expiry of this database, for the background worker';
REVOKE ALL ON FUNCTION sharding._group_watch(timestamptz, boolean) FROM PUBLIC;
-- @end

-- @object sharding._group_reap
-- What the background worker runs in each database whose next lease
-- expiry has come (src/jobs/jobs.cpp), as the extension's owner: every
-- map with an expired member is dealt again.
CREATE FUNCTION sharding._group_reap() RETURNS bigint
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding._group_call('reap_all', NULL, NULL, NULL) $$;
COMMENT ON FUNCTION sharding._group_reap() IS
    'internal: deals the shards of expired members of every worker group (background worker)';
REVOKE ALL ON FUNCTION sharding._group_reap() FROM PUBLIC;
-- @end

-- @object sharding.join
CREATE FUNCTION sharding."join"(map text, worker text, lease interval DEFAULT '30 seconds')
    RETURNS TABLE(logical integer, epoch bigint)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM sharding._group_call('join', $1, $2, $3);
    RETURN QUERY SELECT s.logical, s.epoch FROM sharding.shards s
                  WHERE s.map = $1 AND s.node = $2 ORDER BY s.logical;
END $$;
COMMENT ON FUNCTION sharding."join"(text, text, interval) IS
    'joins (or renews) a worker in the map''s worker group; the shards it owns now, with their epochs';
-- @end

-- @object sharding.heartbeat
CREATE FUNCTION sharding.heartbeat(map text, worker text) RETURNS bigint
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding._group_call('heartbeat', $1, $2, NULL) $$;
COMMENT ON FUNCTION sharding.heartbeat(text, text) IS
    'renews a live member''s lease; the group''s generation (join again when it changed)';
-- @end

-- @object sharding.leave
CREATE FUNCTION sharding.leave(map text, worker text) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding._group_call('leave', $1, $2, NULL) > 0 $$;
COMMENT ON FUNCTION sharding.leave(text, text) IS
    'a member leaves its worker group: its shards go to the others at once; false if it was not a member';
-- @end
