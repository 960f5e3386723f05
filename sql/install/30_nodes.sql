-- Nodes and multi-node routing through PL/Proxy (docs/nodes.md).
--
-- A map's PL/Proxy cluster has one partition per logical shard (in order,
-- each pointing at its owner's DSN) followed by one partition per node that
-- only holds pins, ordered by name (byte order, COLLATE "C", so that every
-- database and every client agrees). Several partitions sharing a DSN share
-- one connection in PL/Proxy, and cluster_config sets modular_mapping, so a
-- map of any size is a valid cluster. cluster_version follows
-- sharding.map_versions, which every change to a map, its pins or its
-- nodes' DSNs raises (sharding._touch_map), so a running proxy reloads on
-- its next call.
--
-- The functions are plpgsql: they read the config tables with cached plans
-- and raise the SQLSTATEs docs/nodes.md lists. partition_for, the one called per
-- proxied request, costs one C++ routing-cache lookup (logical_shard) and
-- one index probe of sharding.pins.

-- @object sharding.add_node
-- add_node(node text, dsn text): set or replace a node's connection string.
-- Not STRICT: a NULL argument is a mistake worth an error, not a silent
-- no-op.
CREATE FUNCTION sharding.add_node(node text, dsn text) RETURNS void
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
-- @end
-- Changing where maps route is an administrator's job (42501 otherwise: docs/nodes.md).
REVOKE ALL ON FUNCTION sharding.add_node(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.add_node(text, text) TO sharding_admin;

-- @object sharding._node_dsn
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
-- @end

-- @object sharding.node_secrets
-- Passwords (CONTRACT 15.2, docs/nodes.md "Passwords"): a DSN given with a
-- password is kept whole here, readable by the extension's owner alone (no
-- role is granted anything on it), and sharding.nodes.dsn, readable by all,
-- shows it with the password as ********. The engine's connections
-- (src/remote/move_remote.cpp, real_dsn) and the subscriptions it creates
-- take the DSN from here, read as the extension's owner; a row counts only
-- while the node's shown DSN is this one masked (a DSN changed by other
-- means is used as shown). Dumped, and copied by followers (_config_tables)
-- for the moves they take part in.
CREATE TABLE sharding.node_secrets (
    node text PRIMARY KEY,
    dsn  text NOT NULL
);
COMMENT ON TABLE sharding.node_secrets IS
    'internal: the connection strings of sharding.nodes with their passwords, for the extension''s owner alone';
SELECT pg_catalog.pg_extension_config_dump('sharding.node_secrets', '');
REVOKE ALL ON sharding.node_secrets FROM PUBLIC;
-- @end

-- @object sharding._node_secret
-- On sharding.nodes, each row written or deleted: a DSN with a password
-- goes whole to sharding.node_secrets and is stored masked. SECURITY
-- DEFINER so that add_node, run by sharding_admin, can write the owner's
-- table (a trigger function cannot be called directly). A new password of a
-- node already known raises the versions of the maps that use it, so that
-- running proxies reconnect with it (add_node sees the same masked DSN).
CREATE FUNCTION sharding._node_secret() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    old_secret text;
BEGIN
    -- Only on sharding.nodes: the one SECURITY DEFINER function of the
    -- extension writes the owner's table for no other table's trigger
    -- (EXECUTE is revoked from PUBLIC as well, so no other role can make
    -- such a trigger).
    IF TG_RELID OPERATOR(pg_catalog.<>) 'sharding.nodes'::pg_catalog.regclass THEN
        RAISE EXCEPTION 'sharding._node_secret is the trigger of sharding.nodes only'
            USING ERRCODE = '42501';
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM sharding.node_secrets AS s WHERE s.node OPERATOR(pg_catalog.=) OLD.node;
        RETURN OLD;
    END IF;
    IF NEW.dsn IS NOT NULL AND sharding._mask_password(NEW.dsn) IS DISTINCT FROM NEW.dsn THEN
        SELECT s.dsn INTO old_secret FROM sharding.node_secrets AS s WHERE s.node OPERATOR(pg_catalog.=) NEW.node;
        INSERT INTO sharding.node_secrets AS s (node, dsn) VALUES (NEW.node, NEW.dsn)
            ON CONFLICT (node) DO UPDATE SET dsn = EXCLUDED.dsn;
        IF old_secret IS DISTINCT FROM NEW.dsn THEN
            PERFORM sharding._touch_map(u.map)
               FROM (SELECT s.map FROM sharding.shards AS s WHERE s.node OPERATOR(pg_catalog.=) NEW.node
                     UNION
                     SELECT p.map FROM sharding.pins AS p WHERE p.node OPERATOR(pg_catalog.=) NEW.node) AS u
              ORDER BY u.map;
        END IF;
        NEW.dsn := sharding._mask_password(NEW.dsn);
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION sharding._node_secret() IS
    'internal: keeps the passwords of sharding.nodes in sharding.node_secrets (trigger)';
CREATE TRIGGER node_secret BEFORE INSERT OR UPDATE OF dsn OR DELETE ON sharding.nodes
    FOR EACH ROW EXECUTE FUNCTION sharding._node_secret();
REVOKE ALL ON FUNCTION sharding._node_secret() FROM PUBLIC;
-- @end

-- drop_node(node text): forget a node. Not STRICT, for the same reason.
-- @object sharding.drop_node
CREATE FUNCTION sharding.drop_node(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    owned integer;
    pinned integer;
    used_by text;
BEGIN
    IF drop_node.node IS NULL THEN
        RAISE EXCEPTION 'node name must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- FOR UPDATE conflicts with the key-share lock the foreign keys of
    -- sharding.shards and sharding.pins take, so no move or pin to this
    -- node can commit between the check and the delete.
    -- Not an end of a move in flight (55006).
    PERFORM sharding._move_refuse(NULL, NULL, 'drop_node', NULL, drop_node.node);
    PERFORM FROM sharding.nodes AS n WHERE n.node = drop_node.node FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'node "%" does not exist', drop_node.node
            USING ERRCODE = 'undefined_object';
    END IF;

    SELECT count(*) INTO owned FROM sharding.shards AS s WHERE s.node = drop_node.node;
    SELECT count(*) INTO pinned FROM sharding.pins AS p WHERE p.node = drop_node.node;
    IF owned > 0 OR pinned > 0 THEN
        SELECT string_agg(quote_ident(u.map), ', ' ORDER BY u.map) INTO used_by
          FROM (SELECT s.map FROM sharding.shards AS s WHERE s.node = drop_node.node
                UNION
                SELECT p.map FROM sharding.pins AS p WHERE p.node = drop_node.node) AS u;
        RAISE EXCEPTION 'node "%" still owns % logical shards and % pins', drop_node.node, owned, pinned
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Maps using it: %s.', used_by),
                  HINT = 'Move its shards away (sharding.move_shard or sharding.rebalance) and unpin its keys first.';
    END IF;

    DELETE FROM sharding.nodes AS n WHERE n.node = drop_node.node;
END
$$;
COMMENT ON FUNCTION sharding.drop_node(text) IS
    'forgets a node; refused (55000) while it owns logical shards or pins';
-- Changing where maps route is an administrator's job (42501 otherwise: docs/nodes.md).
REVOKE ALL ON FUNCTION sharding.drop_node(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.drop_node(text) TO sharding_admin;
-- @end

-- @object sharding.partition_for
-- partition_for(map text, key): the PL/Proxy RUN ON function, one overload
-- per key type (an untyped literal resolves to text). C++ (since 1.1): it
-- routes from the same per-backend cache as node_for, so a pinned key matches
-- exactly as node_for matches it, and a proxied call pays a hash and a probe
-- instead of three queries. STABLE: it reads the map.
CREATE FUNCTION sharding.partition_for(map text, key text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_text' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key bytea) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_bytea' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key smallint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int2' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key integer) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int4' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key bigint) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_partition_for_int8' LANGUAGE C STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION sharding.partition_for(map text, key uuid) RETURNS integer
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
-- @end

-- cluster_partitions(map text): the DSNs of the map's PL/Proxy partitions.
-- The extension's owner (and a superuser) gets each DSN whole, password
-- included (sharding.node_secrets); every other role gets it as
-- sharding.nodes shows it, the password as ******** (docs/nodes.md,
-- "Passwords": such a caller's proxy logs in with a password file).
-- @object sharding.cluster_partitions
CREATE FUNCTION sharding.cluster_partitions(map text) RETURNS SETOF text
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    shards integer;
    part record;
    whole boolean := pg_catalog.has_table_privilege('sharding.node_secrets', 'SELECT');
    secret text;
BEGIN
    SELECT m.logical_shards INTO shards FROM sharding.maps AS m WHERE m.map = cluster_partitions.map;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', cluster_partitions.map
            USING ERRCODE = 'undefined_object';
    END IF;

    FOR part IN
        SELECT g.logical AS part_no, s.node, n.dsn
          FROM pg_catalog.generate_series(0, shards - 1) AS g(logical)
          LEFT JOIN sharding.shards AS s ON s.map = cluster_partitions.map AND s.logical = g.logical
          LEFT JOIN sharding.nodes AS n ON n.node = s.node
        UNION ALL
        SELECT shards - 1 + row_number() OVER (ORDER BY po.node COLLATE "C"), po.node, n.dsn
          FROM (SELECT DISTINCT p.node
                  FROM sharding.pins AS p
                 WHERE p.map = cluster_partitions.map
                   AND NOT EXISTS (SELECT FROM sharding.shards AS s
                                    WHERE s.map = p.map AND s.node = p.node)) AS po
          JOIN sharding.nodes AS n ON n.node = po.node
         ORDER BY 1
    LOOP
        IF part.node IS NULL THEN
            RAISE EXCEPTION 'logical shard % of map "%" has no owner', part.part_no, cluster_partitions.map
                USING ERRCODE = 'data_corrupted';
        END IF;
        IF part.dsn IS NULL THEN
            RAISE EXCEPTION 'node "%" of map "%" has no connection string', part.node, cluster_partitions.map
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Set one with sharding.add_node(node, dsn).';
        END IF;
        IF whole THEN
            -- Two statements: a role without the privilege never plans a read of the table.
            SELECT s.dsn INTO secret FROM sharding.node_secrets AS s
             WHERE s.node = part.node AND sharding._mask_password(s.dsn) = part.dsn;
            RETURN NEXT coalesce(secret, part.dsn);
        ELSE
            RETURN NEXT part.dsn;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION sharding.cluster_partitions(text) IS
    'PL/Proxy partitions of a map: the owner''s DSN of each logical shard, then one per pin-only node by name';
-- @end

-- cluster_version(map text): PL/Proxy calls it on every request.
CREATE FUNCTION sharding.cluster_version(map text) RETURNS integer
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    found_map text;
    v bigint;
BEGIN
    SELECT m.map, mv.version INTO found_map, v
      FROM sharding.maps AS m
      LEFT JOIN sharding.map_versions AS mv ON mv.map = m.map
     WHERE m.map = cluster_version.map;
    IF found_map IS NULL THEN
        RAISE EXCEPTION 'map "%" does not exist', cluster_version.map
            USING ERRCODE = 'undefined_object';
    END IF;
    -- PL/Proxy takes an int4. Wrapping would make the version fall, so a
    -- version past the range is an error rather than a silent reset.
    IF v > 2147483647 THEN
        RAISE EXCEPTION 'cluster version % of map "%" is out of range for integer', v, cluster_version.map
            USING ERRCODE = 'numeric_value_out_of_range',
                  HINT = 'PL/Proxy cluster versions are int4; sharding.version_seq has passed 2147483647.';
    END IF;
    -- A map whose rows were written directly, without _touch_map, has no
    -- version yet: 0 still loads once, and its first touch raises it.
    RETURN coalesce(v, 0)::integer;
END
$$;
COMMENT ON FUNCTION sharding.cluster_version(text) IS
    'PL/Proxy configuration version of a map: rises with every change to the map, its pins or its nodes'' DSNs';

-- cluster_config(map text): PL/Proxy settings of a map's cluster.
-- PL/Proxy rejects unknown keys, so only settings it knows are returned.
CREATE FUNCTION sharding.cluster_config(map text) RETURNS TABLE(key text, val text)
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
BEGIN
    PERFORM FROM sharding.maps AS m WHERE m.map = cluster_config.map;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'map "%" does not exist', cluster_config.map
            USING ERRCODE = 'undefined_object';
    END IF;
    -- modular_mapping: any partition count, not only powers of two.
    -- connection_lifetime: reconnect every 30 minutes, so that a node's
    -- server-side settings and DNS changes are picked up eventually.
    RETURN QUERY VALUES ('modular_mapping'::text, '1'::text),
                        ('connection_lifetime', '1800');
END
$$;
COMMENT ON FUNCTION sharding.cluster_config(text) IS
    'PL/Proxy settings of a map''s cluster (modular_mapping = 1, connection_lifetime)';

-- plproxy_install(): the opt-in bridge from PL/Proxy's cluster
-- configuration API to the three functions above. The functions it creates
-- carry a marker comment; anything else with their names is the user's and
-- is never replaced.
CREATE FUNCTION sharding.plproxy_install() RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    marker constant text := 'created by sharding.plproxy_install(): PL/Proxy cluster configuration from sharding maps';
    fn text;
    existing regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY['plproxy.get_cluster_version(text)',
                              'plproxy.get_cluster_partitions(text)',
                              'plproxy.get_cluster_config(text)'] LOOP
        existing := to_regprocedure(fn);
        IF existing IS NOT NULL AND obj_description(existing, 'pg_proc') IS DISTINCT FROM marker THEN
            RAISE EXCEPTION 'function % already exists and was not created by sharding.plproxy_install()', fn
                USING ERRCODE = 'duplicate_function',
                      HINT = 'Drop or rename it to let sharding configure PL/Proxy, or keep configuring PL/Proxy yourself.';
        END IF;
    END LOOP;

    IF to_regnamespace('plproxy') IS NULL THEN
        CREATE SCHEMA plproxy;
    END IF;

    -- Plain SQL bodies without SET clauses, so that the planner inlines them
    -- into PL/Proxy's prepared queries; everything in them is
    -- schema-qualified and exactly typed.
    CREATE OR REPLACE FUNCTION plproxy.get_cluster_version(cluster_name text) RETURNS integer
        LANGUAGE sql STABLE STRICT
        AS 'SELECT sharding.cluster_version(cluster_name)';
    CREATE OR REPLACE FUNCTION plproxy.get_cluster_partitions(cluster_name text) RETURNS SETOF text
        LANGUAGE sql STABLE STRICT
        AS 'SELECT sharding.cluster_partitions(cluster_name)';
    CREATE OR REPLACE FUNCTION plproxy.get_cluster_config(IN cluster_name text, OUT key text, OUT val text)
        RETURNS SETOF record
        LANGUAGE sql STABLE STRICT
        AS 'SELECT c.key, c.val FROM sharding.cluster_config(cluster_name) AS c';

    EXECUTE format('COMMENT ON FUNCTION plproxy.get_cluster_version(text) IS %L', marker);
    EXECUTE format('COMMENT ON FUNCTION plproxy.get_cluster_partitions(text) IS %L', marker);
    EXECUTE format('COMMENT ON FUNCTION plproxy.get_cluster_config(text) IS %L', marker);
END
$$;
COMMENT ON FUNCTION sharding.plproxy_install() IS
    'creates plproxy.get_cluster_version/partitions/config so that every map is a PL/Proxy cluster of the same name';
-- It creates a schema and functions other roles call: administrators only.
REVOKE ALL ON FUNCTION sharding.plproxy_install() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.plproxy_install() TO sharding_admin;

-- @object sharding.copy_shard
-- copy_shard(map, logical, tbl, key_column, from_dsn, to_dsn): a low-level
-- copy, kept from 1.1 (moves use move_shard_online since 1.2): copies the
-- rows of `tbl` whose key is in logical shard `logical` of `map` and is not
-- pinned, from the database at from_dsn to the one at to_dsn, over the
-- engine's own connections (src/move/copy_shard.cpp, since 1.4): the
-- source's COPY ... TO STDOUT passed on to the destination, which adds the
-- rows in one transaction. Rows already at the destination
-- are skipped (ON CONFLICT DO NOTHING), so a repeated copy carries INSERTS
-- ONLY: rows updated or deleted at the source since the last copy keep
-- their old state at the destination. Returns the number of rows inserted.
--
-- Needs `sharding` at the source (for shard_of). `tbl` must exist here, at
-- the source and at the destination with the same columns.
CREATE FUNCTION sharding.copy_shard(map text, logical integer, tbl regclass, key_column name,
                                    from_dsn text, to_dsn text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding_copy_shard' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) IS
    'copies the unpinned rows of one logical shard of a table from one node to another (a repeat carries inserts only); returns rows inserted';
-- It reads and writes other databases: administrators only.
REVOKE ALL ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.copy_shard(text, integer, regclass, name, text, text) TO sharding_admin;
-- @end
