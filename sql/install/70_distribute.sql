-- Distributed tables (docs/nodes.md). A map's distributed tables are
-- co-located: every row of each is placed by node_for(map, key_column), so
-- moving a logical shard carries all of them (move_shard_online), data nodes
-- refuse writes of keys they do not own (guarded writes), and fanout_stats
-- counts the statements that touch them.
--
-- Recorded by schema and table name (not oid), so that pg_dump/restore and
-- logical replication to followers keep the rows meaningful.

CREATE TABLE sharding.distributed_tables (
    schema_name text NOT NULL,
    table_name  text NOT NULL,
    key_column  text NOT NULL,
    map         text NOT NULL REFERENCES sharding.maps ON DELETE CASCADE,
    PRIMARY KEY (schema_name, table_name)
);
COMMENT ON TABLE sharding.distributed_tables IS
    'tables whose rows are placed by node_for(map, key_column); a map''s tables are co-located';
SELECT pg_catalog.pg_extension_config_dump('sharding.distributed_tables', '');
GRANT SELECT ON sharding.distributed_tables TO PUBLIC;
GRANT INSERT, UPDATE, DELETE ON sharding.distributed_tables TO sharding_admin;

-- @object sharding.distribute
-- distribute(tbl regclass, key_column name, map text): records tbl as placed
-- by node_for(map, key_column). Not STRICT: a NULL argument raises 22023.
CREATE FUNCTION sharding.distribute(tbl regclass, key_column name, map text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
    bad text;
    other text;
    other_type regtype;
BEGIN
    IF tbl IS NULL OR key_column IS NULL OR map IS NULL THEN
        RAISE EXCEPTION 'distribute needs a table, a key column and a map, got %, %, %',
            coalesce(tbl::text, 'NULL'), coalesce(key_column::text, 'NULL'), coalesce(map, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._move_refuse(map, NULL, 'distribute');
    PERFORM sharding._require_map(map);
    SELECT n.nspname, c.relname INTO nsp, rel
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = tbl;
    -- The column must exist (42703) and be of a shard key type (22023).
    PERFORM sharding._key_column_type(tbl, key_column);
    -- A map's tables share one key type, the integer types counting as one
    -- (docs/moves.md, "Keys by value").
    SELECT pg_catalog.format('%I.%I', d.schema_name, d.table_name), k.t INTO other, other_type
      FROM sharding.distributed_tables d,
           LATERAL (SELECT sharding._key_column_type(r, d.key_column) AS t
                      FROM pg_catalog.to_regclass(pg_catalog.format('%I.%I', d.schema_name, d.table_name)) AS r) k
     WHERE d.map = $3 AND k.t IS NOT NULL
       AND CASE WHEN k.t IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype) THEN 'bigint'::regtype ELSE k.t END
           IS DISTINCT FROM
           CASE WHEN sharding._key_column_type($1, $2) IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype)
                THEN 'bigint'::regtype ELSE sharding._key_column_type($1, $2) END
     ORDER BY 1 LIMIT 1;
    IF other IS NOT NULL THEN
        RAISE EXCEPTION 'key column "%" of % has type %, but map "%" is keyed by % (table %)', key_column, tbl,
                sharding._key_column_type($1, $2), map, other_type, other
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A map''s distributed tables share one key type (the integer types count as one).';
    END IF;
    IF EXISTS (SELECT FROM sharding.distributed_tables d WHERE d.schema_name = nsp AND d.table_name = rel) THEN
        RAISE EXCEPTION 'table % is already distributed', tbl
            USING ERRCODE = 'duplicate_object', HINT = 'Call sharding.undistribute first to change it.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = tbl AND i.indisprimary) THEN
        RAISE EXCEPTION 'table % has no primary key', tbl
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Moving a shard online replicates updates and deletes by primary key.';
    END IF;
    -- What an online move carries (CONTRACT 15.1): the replica identity of
    -- the table and of each leaf partition must carry the key, or a
    -- delete's old row would not say which shard it deletes from. The move
    -- checks both ends again when it starts (src/move/move_orchestrate.cpp).
    SELECT x.problem || ' ' || x.relid::regclass::text INTO bad
      FROM (SELECT r.relid, CASE
                WHEN c.relreplident = 'f' THEN NULL
                WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid
                                    AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                                            WHEN 'i' THEN i.indisreplident ELSE false END)
                    THEN 'none'
                WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_index i
                                   JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = key_column
                                    AND a.attnum = ANY (i.indkey::pg_catalog.int2[])
                                  WHERE i.indrelid = c.oid
                                    AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                                            WHEN 'i' THEN i.indisreplident ELSE false END)
                    THEN 'key' END AS problem
              FROM (SELECT tbl::oid AS relid
                    UNION SELECT p.relid::oid FROM pg_catalog.pg_partition_tree(tbl) AS p WHERE p.isleaf) AS r
              JOIN pg_catalog.pg_class c ON c.oid = r.relid) AS x
     WHERE x.problem IS NOT NULL
     ORDER BY x.problem DESC, x.relid LIMIT 1;
    IF bad LIKE 'none %' THEN
        RAISE EXCEPTION 'table % has no replica identity', substr(bad, 6)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Moving a shard online replicates the table''s updates and deletes.',
                  HINT = format('ALTER TABLE %s REPLICA IDENTITY FULL, or USING INDEX on a unique index that includes column %I.',
                                substr(bad, 6), key_column);
    ELSIF bad IS NOT NULL THEN
        RAISE EXCEPTION 'the replica identity of % does not include key column %', substr(bad, 5), quote_ident(key_column)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A delete''s old row carries only the replica identity: moving a shard online could not tell which shard it deletes from.',
                  HINT = format('ALTER TABLE %s REPLICA IDENTITY FULL, or USING INDEX on a unique index that includes column %I.',
                                substr(bad, 5), key_column);
    END IF;
    INSERT INTO sharding.distributed_tables (schema_name, table_name, key_column, map)
    VALUES (nsp, rel, key_column, map);
END $$;
COMMENT ON FUNCTION sharding.distribute(regclass, name, text) IS
    'records that a table''s rows are placed by node_for(map, key_column); a map''s tables are co-located';
-- @end

-- undistribute(tbl regclass): whether tbl was distributed. Not STRICT: NULL
-- raises 22023 like the other configuration functions.
-- @object sharding.undistribute
CREATE FUNCTION sharding.undistribute(tbl regclass) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'table must not be NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sharding._move_refuse(d.map, NULL, 'undistribute') FROM sharding.distributed_tables d, pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = tbl AND (d.schema_name, d.table_name) = (n.nspname, c.relname);
    DELETE FROM sharding.distributed_tables d
     USING pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = tbl AND d.schema_name = n.nspname AND d.table_name = c.relname;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION sharding.undistribute(regclass) IS
    'forgets that a table is distributed; returns whether it was';
-- @end

-- Configuration changes: owner and sharding_admin only.
REVOKE ALL ON FUNCTION sharding.distribute(regclass, name, text), sharding.undistribute(regclass)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.distribute(regclass, name, text), sharding.undistribute(regclass)
    TO sharding_admin;

-- Followers, guarded data nodes, shard_checksum (docs/nodes.md).
--
-- The coordinator publishes its configuration tables (publication
-- sharding_config); each attached data node subscribes to it (subscription
-- sharding_config_<node>), so it routes, fences and guards with the
-- coordinator's maps, shards and epochs, pins, nodes and distributed tables.
-- attach_node drives both ends from the coordinator over the engine's own
-- connections (src/remote/remote_exec.cpp), since CREATE SUBSCRIPTION cannot
-- run in a transaction block.
--
-- How the node reaches the coordinator: the setting sharding.coordinator_dsn
-- of the coordinator (ALTER DATABASE ... SET, or postgresql.conf) when it is
-- set, else a DSN derived from the connection attach_node runs in (the
-- server address it was reached on, or its first socket directory; its port,
-- database and user).
--
-- Local (not replicated) state of a database: sharding.local_node (its node
-- name, whether it follows) and sharding.frozen_shards (shards a move is
-- cutting over). The guard trigger (src/datanode/guard.cpp) reads both from a
-- per-backend copy.

CREATE TABLE sharding.local_node (
    one_row         boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    node            text NOT NULL CHECK (node <> ''),
    coordinator_dsn text NOT NULL,
    following       boolean NOT NULL,
    attached        timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE sharding.local_node IS
    'this database''s node name and coordinator, set by attach_node (local, not replicated)';

CREATE TABLE sharding.frozen_shards (
    map     text NOT NULL,
    logical integer NOT NULL,
    since   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (map, logical)
);
COMMENT ON TABLE sharding.frozen_shards IS
    'logical shards whose guarded writes this node refuses while a move cuts them over (local, not replicated)';

SELECT pg_catalog.pg_extension_config_dump('sharding.local_node', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.frozen_shards', '');
GRANT SELECT ON sharding.local_node, sharding.frozen_shards TO PUBLIC;
-- Written only by _follow, _unfollow, _freeze_shard and _thaw_shard, which
-- the engine runs on a node as the DSN's user; never by sharding_admin
-- directly (SEC-2).

-- this_node(): NULL where this database was never attached.
CREATE FUNCTION sharding.this_node() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT l.node FROM sharding.local_node AS l $$;
COMMENT ON FUNCTION sharding.this_node() IS
    'this database''s node name (set by attach_node on the coordinator), NULL where never attached';

-- Every backend's copy of the local state is rebuilt after a change.
CREATE FUNCTION sharding._local_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding_local_changed' LANGUAGE C;
COMMENT ON FUNCTION sharding._local_changed() IS
    'internal: invalidates every backend''s copy of local_node and frozen_shards';
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.local_node
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
CREATE TRIGGER local_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sharding.frozen_shards
    FOR EACH STATEMENT EXECUTE FUNCTION sharding._local_changed();
ALTER TABLE sharding.local_node ENABLE ALWAYS TRIGGER local_changed;
ALTER TABLE sharding.frozen_shards ENABLE ALWAYS TRIGGER local_changed;

-- ------------------------------------------------------------------ followers
-- @object sharding._config_tables
-- The configuration tables a follower copies, in schema sharding: the one
-- list. _publish_config publishes them (publication sharding_config), a
-- node empties them before it follows (_follow), and attach_node waits
-- until the node has synchronised each of them.
CREATE FUNCTION sharding._config_tables() RETURNS name[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT ARRAY['maps', 'nodes', 'shards', 'pins', 'map_versions', 'distributed_tables', 'node_secrets']::name[] $$;
COMMENT ON FUNCTION sharding._config_tables() IS
    'internal: the configuration tables (schema sharding) that followers copy through publication sharding_config';
-- @end

-- A follower refuses configuration changes: a statement trigger on every
-- replicated config table, in ORIGIN mode, so that the subscription's apply
-- (session_replication_role = replica) still writes. detach_node lifts it.
CREATE FUNCTION sharding._refuse_on_follower() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    me text;
    coordinator text;
BEGIN
    SELECT l.node, l.coordinator_dsn INTO me, coordinator FROM sharding.local_node AS l WHERE l.following;
    IF FOUND THEN
        RAISE EXCEPTION 'cannot change the sharding configuration on node "%": it follows its coordinator', me
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('%s on %s.%s refused; this database copies its configuration from %s.',
                                  TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, coordinator),
                  HINT = format('Make the change on the coordinator, or run sharding.detach_node(%L) there first.', me);
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._refuse_on_follower() IS
    'internal: refuses (55000) configuration changes on a database that follows a coordinator';
-- On every table a follower copies (_config_tables, the one list).
DO $$
DECLARE
    t name;
BEGIN
    FOREACH t IN ARRAY sharding._config_tables() LOOP
        EXECUTE pg_catalog.format('CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE '
                                  'ON sharding.%I FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower()', t);
    END LOOP;
END $$;

-- Apply (and the initial copy) run with session_replication_role = replica:
-- the routing-cache invalidations of 20_maps.sql fire there too (ENABLE
-- ALWAYS), but apply fires row triggers only: these invalidate a follower's
-- routing caches for every replicated row (REPLICA: only under apply; the
-- statement triggers of 20_maps.sql cover every other writer).
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['maps', 'shards', 'pins'] LOOP
        EXECUTE pg_catalog.format('CREATE TRIGGER routing_changed_apply AFTER INSERT OR UPDATE OR DELETE ON sharding.%I '
                                  'FOR EACH ROW EXECUTE FUNCTION sharding._routing_changed()', t);
        EXECUTE pg_catalog.format('ALTER TABLE sharding.%I ENABLE REPLICA TRIGGER routing_changed_apply', t);
    END LOOP;
END $$;

-- ------------------------------------------------------------------ guards
CREATE FUNCTION sharding._guard() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding_guard' LANGUAGE C;
COMMENT ON FUNCTION sharding._guard() IS
    'internal: refuses (55000) writes of keys this data node does not own, or of frozen shards (guarded writes)';

-- Installs (or refreshes) the guard trigger zz_sharding_guard on one
-- distributed table, if it exists here. The name sorts last, so the guard
-- sees the row as other BEFORE triggers leave it. Never raises once the
-- table is found: it runs inside logical-replication apply, which an error
-- would stop; a failure is a WARNING and the table stays unguarded. Returns
-- whether it is guarded. C++ (src/datanode/node_steps.cpp).
-- @object sharding._install_guard
CREATE FUNCTION sharding._install_guard(schema_name text, table_name text, key_column text, map text)
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__install_guard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._install_guard(text, text, text, text) IS
    'internal: creates the guard trigger on a distributed table of this data node';
-- @end

CREATE FUNCTION sharding._drop_guard(schema_name text, table_name text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    rel regclass := pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema_name, table_name));
BEGIN
    IF rel IS NOT NULL
       AND EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = rel AND t.tgname = 'zz_sharding_guard') THEN
        EXECUTE pg_catalog.format('DROP TRIGGER zz_sharding_guard ON %s', rel);
    END IF;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'could not unguard table %: %', rel, SQLERRM;
END $$;
COMMENT ON FUNCTION sharding._drop_guard(text, text) IS
    'internal: drops the guard trigger of a table';

-- Guards every distributed table of a following node; returns how many.
-- C++ (src/datanode/node_steps.cpp).
-- @object sharding._install_guards
CREATE FUNCTION sharding._install_guards() RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding__install_guards' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._install_guards() IS
    'internal: guards every distributed table of this data node (when it follows)';
-- @end

-- Follows sharding.distributed_tables on a data node: ALWAYS, so that rows
-- arriving through the subscription guard (or unguard) the local table.
CREATE FUNCTION sharding._distributed_changed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RETURN NULL;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        PERFORM sharding._drop_guard(OLD.schema_name, OLD.table_name);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM sharding._install_guard(NEW.schema_name, NEW.table_name, NEW.key_column, NEW.map);
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION sharding._distributed_changed() IS
    'internal: guards or unguards the local table when sharding.distributed_tables changes on a data node';
CREATE TRIGGER distributed_changed AFTER INSERT OR UPDATE OR DELETE ON sharding.distributed_tables
    FOR EACH ROW EXECUTE FUNCTION sharding._distributed_changed();
ALTER TABLE sharding.distributed_tables ENABLE ALWAYS TRIGGER distributed_changed;

-- A table created on a following data node after it was distributed gets
-- its guard at once (event trigger on CREATE TABLE).
CREATE FUNCTION sharding._guard_new_tables() RETURNS event_trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    d record;
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RETURN;
    END IF;
    FOR d IN SELECT t.* FROM pg_catalog.pg_event_trigger_ddl_commands() AS c
               JOIN pg_catalog.pg_class AS r ON r.oid = c.objid
               JOIN pg_catalog.pg_namespace AS s ON s.oid = r.relnamespace
               JOIN sharding.distributed_tables AS t ON t.schema_name = s.nspname AND t.table_name = r.relname
              WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND c.objsubid = 0 LOOP
        PERFORM sharding._install_guard(d.schema_name, d.table_name, d.key_column, d.map);
    END LOOP;
END $$;
COMMENT ON FUNCTION sharding._guard_new_tables() IS
    'internal: guards a distributed table created on a following data node';
CREATE EVENT TRIGGER sharding_guard_new_tables ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO')
    EXECUTE FUNCTION sharding._guard_new_tables();

-- ------------------------------------------------------------------ freeze
-- _freeze_shard(map, logical): waits for guarded and fenced writers of the
-- shard (the exclusive shard lock of move_shard), then records the shard as
-- frozen: from its commit on, every guarded write of the shard's keys on
-- this node gets 55000, until _thaw_shard. Run it in its own transaction
-- (over a connection from the coordinator): the lock is held until commit.
-- C++ (src/datanode/node_steps.cpp), as _thaw_shard.
-- @object sharding._freeze_shard
CREATE FUNCTION sharding._freeze_shard(map text, logical integer) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__freeze_shard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._freeze_shard(text, integer) IS
    'internal: waits for the shard''s writers, then refuses its guarded writes on this node until _thaw_shard';
-- @end

-- @object sharding._thaw_shard
CREATE FUNCTION sharding._thaw_shard(map text, logical integer) RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding__thaw_shard' LANGUAGE C VOLATILE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._thaw_shard(text, integer) IS
    'internal: lifts _freeze_shard; true if the shard was frozen';
-- @end

-- ------------------------------------------------------------------ attach
-- The DSN a data node's subscription uses to reach this coordinator:
-- sharding.coordinator_dsn if set, else host (the address this session
-- reached the server at, the first Unix socket directory, or localhost),
-- port, database and user of this session. C++ (src/routing/owner_switch.cpp).
-- @object sharding._coordinator_dsn
CREATE FUNCTION sharding._coordinator_dsn() RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__coordinator_dsn' LANGUAGE C STABLE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._coordinator_dsn() IS
    'internal: sharding.coordinator_dsn, or a DSN of this database derived from the current connection';
-- @end

-- @object sharding._mask_password
-- A connection string with its password shown as ******** (key = value
-- pairs and URIs): what a follower keeps of its coordinator's DSN.
CREATE FUNCTION sharding._mask_password(dsn text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__mask_password' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION sharding._mask_password(text) IS
    'internal: the connection string with its password shown as ********';
-- @end

-- Follow's remote calls, on the move's libpq helper (src/remote/remote_exec.cpp):
-- a connection for the call, the statement in its own transaction there,
-- every wait interruptible, the remote statement cancelled when the caller
-- is; a remote error is raised with its SQLSTATE, message, detail and hint.
-- _remote: the first value of a query (NULL if no row).
-- @object sharding._remote
CREATE FUNCTION sharding._remote(dsn text, query text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote(text, text) IS
    'internal: first value of a query run on another database (its own connection and transaction)';
-- @end

-- _remote_exec: runs a command there (CREATE SUBSCRIPTION, ...); its tag.
-- @object sharding._remote_exec
CREATE FUNCTION sharding._remote_exec(dsn text, command text) RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__remote_exec' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._remote_exec(text, text) IS
    'internal: runs a command on another database (its own connection and transaction)';
-- @end

-- @object sharding._leads_here
-- Whether a connection string leads to this very database (the same
-- server and database, whatever host, port or user it names). A clone of
-- this cluster (pg_basebackup, a copied disk image) has the same system
-- identifier and database name, so those prove nothing; instead this
-- session takes a random application_name for a moment, and a session
-- opened with the DSN looks for it in its own server's pg_stat_activity,
-- among the backends of its own database: it is there only if the DSN leads
-- here. The application_name of every backend is visible to every role.
CREATE FUNCTION sharding._leads_here(dsn text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    token text := 'sharding_probe_' || pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '');
    was text := pg_catalog.current_setting('application_name');
    here text;
BEGIN
    -- This session is marked, and the session the DSN leads to looks for
    -- the mark (through the engine's connections, which take a node's
    -- password from sharding.node_secrets).
    PERFORM pg_catalog.set_config('application_name', token, false);
    BEGIN
        here := sharding._remote(dsn, pg_catalog.format(
            'SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity AS a WHERE a.application_name OPERATOR(pg_catalog.=) %L '
            'AND a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())::pg_catalog.text', token));
    EXCEPTION WHEN OTHERS THEN
        PERFORM pg_catalog.set_config('application_name', was, false);
        RAISE;
    END;
    PERFORM pg_catalog.set_config('application_name', was, false);
    RETURN here::boolean;
END $$;
COMMENT ON FUNCTION sharding._leads_here(text) IS
    'internal: whether a connection string leads back to this database (a probe connection seen in pg_stat_activity)';
-- For administrators, as attach_node, which calls it: it connects out.
REVOKE ALL ON FUNCTION sharding._leads_here(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._leads_here(text) TO sharding_admin;
-- @end

-- Subscription and slot names of a node's configuration feed. The
-- subscription lives in the node's database; the slot lives on this
-- coordinator's instance, whose slots all share one name space: its name
-- carries this coordinator's tag (_coordinator_tag, as the names of its
-- moves do), sharding_config_<tag>_<node>, so that coordinators of one
-- instance whose nodes are named alike never share a slot (review LK-3).
-- Slot names allow only [a-z0-9_] (63 characters at most): other node
-- names get a sanitised name plus a hash (_config_slot_part).
CREATE FUNCTION sharding._config_subscription(node text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT 'sharding_config_' || $1 $$;
COMMENT ON FUNCTION sharding._config_subscription(text) IS
    'internal: name of the subscription through which a node follows the coordinator';
-- @object sharding._config_slot_part
CREATE FUNCTION sharding._config_slot_part(node text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT CASE WHEN $1 ~ '^[a-z0-9_]{1,40}$' THEN $1
                ELSE pg_catalog.left(pg_catalog.regexp_replace(pg_catalog.lower($1), '[^a-z0-9_]', '_', 'g'), 30)
                     || '_' || pg_catalog.left(pg_catalog.md5($1), 8) END
$$;
COMMENT ON FUNCTION sharding._config_slot_part(text) IS
    'internal: a node''s part of its configuration slot''s name ([a-z0-9_], 40 characters at most)';
-- @end
-- @object sharding._coordinator_tag
-- C++ (src/move/move_orchestrate.cpp): six hex digits of the md5 of this
-- instance's system identifier and this database's OID; a promoted standby
-- keeps both, and so the tag.
CREATE FUNCTION sharding._coordinator_tag() RETURNS text
    AS 'MODULE_PATHNAME', 'sharding__coordinator_tag' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding._coordinator_tag() IS
    'internal: this coordinator''s tag in the names of its moves and of its nodes'' configuration slots';
-- @end
-- @object sharding._config_slot
-- The name a node's configuration slot gets when attach_node (or
-- take_over) makes it: sharding_config_<tag>_<node> (63 characters at most).
CREATE FUNCTION sharding._config_slot(node text) RETURNS text
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT 'sharding_config_' || sharding._coordinator_tag() || '_' || sharding._config_slot_part($1) $$;
COMMENT ON FUNCTION sharding._config_slot(text) IS
    'internal: replication slot (on the coordinator) that a node''s configuration subscription gets when attached';
-- @end
-- @object sharding._config_slot_here
-- The slot of this database (pg_replication_slots.database) that a node's
-- configuration subscription uses: the one named by _config_slot, else one
-- named by 1.3 (sharding_config_<node>, no tag: nodes attached before the
-- update), else one named with another tag (the instance's system
-- identifier changed: pg_upgrade), but never another node's 1.3 name; with
-- none, _config_slot's name. attach_node, detach_node, take_over and the
-- DDL checks (which nodes are attached) look slots up through it.
CREATE FUNCTION sharding._config_slot_here(node text) RETURNS text
    LANGUAGE sql STABLE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT coalesce(
        (SELECT r.slot_name::text
           FROM pg_catalog.pg_replication_slots AS r
          WHERE r.database = pg_catalog.current_database() AND r.slot_type = 'logical'
            AND r.slot_name::text ~ ('^sharding_config_([0-9a-f]{6}_)?' || sharding._config_slot_part($1) || '$')
            AND NOT EXISTS (SELECT FROM sharding.nodes AS o
                             WHERE o.node <> $1 AND r.slot_name::text = 'sharding_config_' || sharding._config_slot_part(o.node))
          ORDER BY r.slot_name::text = sharding._config_slot($1) DESC,
                   r.slot_name::text = 'sharding_config_' || sharding._config_slot_part($1) DESC,
                   r.slot_name::text COLLATE "C"
          LIMIT 1),
        sharding._config_slot($1))
$$;
COMMENT ON FUNCTION sharding._config_slot_here(text) IS
    'internal: a node''s configuration slot in this database (1.4''s tagged name, 1.3''s, or the name attach_node gives)';
-- @end

-- @object sharding._publish_config
-- On the coordinator, in its own transaction (attach_node calls it over a
-- connection of its own, so that its writes are committed before the node
-- subscribes):
-- the publication, and versions above those the node already reported, so
-- that cluster_version never falls on the node when it starts following.
CREATE FUNCTION sharding._publish_config(node_maps text[], node_versions bigint[]) RETURNS void
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
    -- This coordinator's identity (sql/install/97_take_over.sql), from its
    -- first attach on: a server promoted from its standby, or restored from
    -- its backup, sees a later timeline than the one recorded, and its jobs
    -- wait for take_over (_take_over_needed).
    INSERT INTO sharding.coordinator_identity AS i (token, system_identifier, timeline, coordinator)
    SELECT pg_catalog.gen_random_uuid(), c.system_identifier::text,
           ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::integer,
           sharding._mask_password(sharding._coordinator_dsn())
      FROM pg_catalog.pg_control_system() AS c
        ON CONFLICT (one_row) DO NOTHING;
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
-- @end

-- @object sharding._follow
-- On the node (called over the engine's connections): forget its own configuration and follow.
-- Returns false when it already follows as `node` (nothing to do).
CREATE FUNCTION sharding._follow(node text, coordinator_dsn text) RETURNS boolean
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
        IF cur.coordinator_dsn IS DISTINCT FROM sharding._mask_password($2) THEN
            UPDATE sharding.local_node SET coordinator_dsn = sharding._mask_password($2);
        END IF;
        RETURN false;
    END IF;
    -- The coordinator's copy replaces ours: unguard, then empty.
    FOR d IN SELECT * FROM sharding.distributed_tables LOOP
        PERFORM sharding._drop_guard(d.schema_name, d.table_name);
    END LOOP;
    EXECUTE 'TRUNCATE ' || (SELECT pg_catalog.string_agg(pg_catalog.format('sharding.%I', t), ', ')
                              FROM pg_catalog.unnest(sharding._config_tables()) AS t);
    -- The coordinator's DSN without its password (PUBLIC reads local_node;
    -- the subscription keeps the DSN it connects with).
    INSERT INTO sharding.local_node AS l (node, coordinator_dsn, following)
        VALUES ($1, sharding._mask_password($2), true)
        ON CONFLICT (one_row) DO UPDATE SET node = EXCLUDED.node, coordinator_dsn = EXCLUDED.coordinator_dsn,
                                            following = true, attached = pg_catalog.now();
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding._follow(text, text) IS
    'internal: makes this database a follower named node (its configuration is replaced by the coordinator''s)';
-- @end

-- On the node (called over the engine's connections), after its subscription is gone.
CREATE FUNCTION sharding._unfollow() RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    d record;
    top bigint;
BEGIN
    UPDATE sharding.local_node SET following = false WHERE following;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    FOR d IN SELECT * FROM sharding.distributed_tables LOOP
        PERFORM sharding._drop_guard(d.schema_name, d.table_name);
    END LOOP;
    -- The copied versions came from the coordinator's sequence: ours must
    -- continue above them, so that cluster_version never falls here.
    top := (SELECT pg_catalog.max(v.version) FROM sharding.map_versions AS v);
    IF top IS NOT NULL AND (SELECT s.last_value FROM sharding.version_seq AS s) < top THEN
        PERFORM pg_catalog.setval('sharding.version_seq', top);
    END IF;
    RETURN true;
END $$;
COMMENT ON FUNCTION sharding._unfollow() IS
    'internal: stops following (configuration editable again, guards removed, versions continue above the copy)';

-- @object sharding.attach_node
-- attach_node(node text): see the top of this file. Not STRICT: NULL raises.
CREATE FUNCTION sharding._attach_node_body(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    dsn text;
    me text;
    sub text;
    slot text;
    following_as text;
    reply json;
    node_maps text[];
    node_versions bigint[];
    pending integer;
    deadline timestamptz;
    sub_conninfo text;
    sub_enabled boolean;
BEGIN
    PERFORM sharding._check_node(_attach_node_body.node);
    IF current_setting('wal_level') <> 'logical' THEN
        RAISE EXCEPTION 'attach_node needs wal_level = logical on the coordinator, got %', current_setting('wal_level')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Set wal_level = logical (and max_replication_slots, max_wal_senders for one slot per node) '
                         'in postgresql.conf, then restart PostgreSQL.';
    END IF;
    IF EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        RAISE EXCEPTION 'this database follows a coordinator: attach node "%" there', _attach_node_body.node
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    dsn := sharding._node_dsn(_attach_node_body.node);
    -- The node's CREATE SUBSCRIPTION makes a replication slot here, which
    -- waits for every transaction holding a transaction id to end.
    IF txid_current_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'attach_node must run in a transaction that has not written yet'
            USING ERRCODE = 'active_sql_transaction',
                  HINT = 'Call it in its own transaction.';
    END IF;
    me := sharding._coordinator_dsn();
    sub := sharding._config_subscription(_attach_node_body.node);
    slot := sharding._config_slot_here(_attach_node_body.node);

    -- The node: not this very database, this extension (1.2) there, not
    -- following as another node. Nothing has changed anywhere yet.
    IF sharding._leads_here(dsn) THEN
        RAISE EXCEPTION 'node "%" is this database: a coordinator cannot follow itself', _attach_node_body.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Its connection string %s leads back here.', dsn);
    END IF;
    -- Every query to the node goes through the engine's connections
    -- (_remote, _remote_exec), which pin search_path first and take the
    -- node's password from sharding.node_secrets (dsn shows it masked).
    IF NOT sharding._remote(dsn, $r$SELECT (pg_catalog.to_regprocedure('sharding._follow(text,text)') IS NOT NULL)::pg_catalog.text$r$)::boolean THEN
        RAISE EXCEPTION 'node "%" has no sharding extension of version 1.2 or later', _attach_node_body.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'CREATE EXTENSION sharding (or ALTER EXTENSION sharding UPDATE) in the node''s database.';
    END IF;
    following_as := sharding._remote(dsn, 'SELECT node FROM sharding.local_node WHERE following');
    IF following_as IS DISTINCT FROM _attach_node_body.node AND following_as IS NOT NULL THEN
        RAISE EXCEPTION 'the database of node "%" already follows a coordinator as node "%"',
                _attach_node_body.node, following_as
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Detach it first: sharding.detach_node(%L) on its coordinator.', following_as);
    END IF;
    reply := sharding._remote(dsn, 'SELECT pg_catalog.json_build_array(pg_catalog.array_agg(v.map ORDER BY v.map)::text, '
                                   'pg_catalog.array_agg(v.version ORDER BY v.map)::text)::text FROM sharding.map_versions AS v')::json;
    node_maps := (reply ->> 0)::text[];
    node_versions := (reply ->> 1)::bigint[];

    -- Coordinator side, committed before the node subscribes (a publication
    -- nobody subscribes to, and versions that rose, are harmless leftovers
    -- of a failure below).
    PERFORM sharding._remote(me, format('SELECT sharding._publish_config(%L, %L)::text', node_maps, node_versions));

    -- The subscription, disabled: creating it proves the node reaches us
    -- before its configuration is touched. Its slot is made from here first:
    -- a CREATE SUBSCRIPTION that creates its slot hangs when the node lives
    -- in this same PostgreSQL instance.
    reply := sharding._remote(dsn, format($s$SELECT pg_catalog.json_build_array(subconninfo, subenabled)::text
                                             FROM pg_catalog.pg_subscription
                                            WHERE subname = %L AND subdbid = (SELECT oid FROM pg_catalog.pg_database
                                                                               WHERE datname = pg_catalog.current_database())$s$,
                                         sub))::json;
    sub_conninfo := reply ->> 0;
    sub_enabled := (reply ->> 1)::boolean;
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
    -- A table that the publication gained since (an older version's node):
    -- copied too.
    IF sub_enabled THEN
        PERFORM sharding._remote_exec(dsn, format('ALTER SUBSCRIPTION %I REFRESH PUBLICATION', sub));
    END IF;

    -- The node's configuration gives way to ours, then the copy starts.
    BEGIN
        PERFORM sharding._remote(dsn, format('SELECT sharding._follow(%L, %L)::text', _attach_node_body.node, me));
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
        pending := sharding._remote(dsn, format($s$SELECT (%s - count(*) FILTER (WHERE r.srsubstate IN ('r', 's')))::text
                                 FROM pg_catalog.pg_subscription AS s
                                 JOIN pg_catalog.pg_subscription_rel AS r ON r.srsubid = s.oid
                                WHERE s.subname = %L$s$, cardinality(sharding._config_tables()), sub))::integer;
        EXIT WHEN pending <= 0;
        IF clock_timestamp() > deadline THEN
            RAISE WARNING 'node "%" is still copying the configuration (% tables to go)', _attach_node_body.node, pending
                USING HINT = 'It follows once the copy ends; check pg_subscription_rel on the node.';
            EXIT;
        END IF;
        PERFORM pg_sleep(0.02);
    END LOOP;
    PERFORM sharding._remote(dsn, 'SELECT sharding._install_guards()::text');
END $$;
COMMENT ON FUNCTION sharding._attach_node_body(text) IS
    'internal: attach_node''s steps, run by attach_node in the engine''s scope (the extension''s owner alone may call it)';
REVOKE ALL ON FUNCTION sharding._attach_node_body(text) FROM PUBLIC;
-- The entry point (SEC-4): runs the body in the engine's scope, where the
-- nodes' whole DSNs and the coordinator's password serve its statements.
CREATE FUNCTION sharding.attach_node(node text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__engine_call' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding.attach_node(text) IS
    'makes a data node follow this coordinator''s configuration through logical replication (repeating is harmless)';
-- @end

-- @object sharding.detach_node
-- detach_node(node text): the node stops following and keeps its copy.
CREATE FUNCTION sharding._detach_node_body(node text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    dsn text;
    sub text;
    n integer;
BEGIN
    PERFORM sharding._check_node(_detach_node_body.node);
    -- Not an end of a move in flight (55006): its guards hold the cutover.
    PERFORM sharding._move_refuse(NULL, NULL, 'detach_node', NULL, _detach_node_body.node);
    dsn := sharding._node_dsn(_detach_node_body.node);
    sub := sharding._config_subscription(_detach_node_body.node);
    BEGIN
        n := sharding._remote(dsn, format($s$SELECT count(*)::text FROM pg_catalog.pg_subscription
                                WHERE subname = %L AND subdbid = (SELECT oid FROM pg_catalog.pg_database
                                                                   WHERE datname = pg_catalog.current_database())$s$,
                            sub))::integer;
    EXCEPTION WHEN sqlclient_unable_to_establish_sqlconnection OR connection_exception THEN
        RAISE EXCEPTION 'cannot reach node "%" to detach it: %', _detach_node_body.node, SQLERRM
            USING ERRCODE = 'sqlclient_unable_to_establish_sqlconnection',
                  HINT = format('If the node is gone for good, drop its replication slot here: '
                                'SELECT pg_drop_replication_slot(%L);', sharding._config_slot_here(_detach_node_body.node));
    END;
    IF n > 0 THEN
        -- Drops the subscription's slot here too.
        PERFORM sharding._remote_exec(dsn, format('DROP SUBSCRIPTION %I', sub));
    END IF;
    PERFORM sharding._remote(dsn, 'SELECT sharding._unfollow()::text');
END $$;
COMMENT ON FUNCTION sharding._detach_node_body(text) IS
    'internal: detach_node''s steps, run by detach_node in the engine''s scope (the extension''s owner alone may call it)';
REVOKE ALL ON FUNCTION sharding._detach_node_body(text) FROM PUBLIC;
CREATE FUNCTION sharding.detach_node(node text) RETURNS void
    AS 'MODULE_PATHNAME', 'sharding__engine_call' LANGUAGE C VOLATILE;
COMMENT ON FUNCTION sharding.detach_node(text) IS
    'stops a data node following this coordinator; it keeps its copy of the configuration, editable again';
-- @end

-- Administrators only: these change which databases follow, guard and
-- refuse writes.
REVOKE ALL ON FUNCTION sharding.attach_node(text), sharding.detach_node(text), sharding._freeze_shard(text, integer),
    sharding._thaw_shard(text, integer), sharding._follow(text, text), sharding._unfollow(),
    sharding._publish_config(text[], bigint[]), sharding._install_guards(),
    sharding._install_guard(text, text, text, text), sharding._drop_guard(text, text),
    sharding._remote(text, text), sharding._remote_exec(text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.attach_node(text), sharding.detach_node(text), sharding._freeze_shard(text, integer),
    sharding._thaw_shard(text, integer), sharding._follow(text, text), sharding._unfollow(),
    sharding._publish_config(text[], bigint[]), sharding._install_guards(),
    sharding._install_guard(text, text, text, text), sharding._drop_guard(text, text),
    sharding._remote(text, text), sharding._remote_exec(text, text)
    TO sharding_admin;
-- The DSN of this coordinator may hold a password (CONTRACT 15.2): for
-- administrators only, as sharding.coordinator_dsn is for superusers only.
REVOKE ALL ON FUNCTION sharding._coordinator_dsn() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._coordinator_dsn() TO sharding_admin;

-- ------------------------------------------------------------------ checksum
-- shard_checksum(map, logical, tbl): rows and an order-independent checksum
-- of tbl's rows whose unpinned key lies in logical shard `logical`: the sum,
-- modulo 2^64, of hash64 of each row's text form. The settings that change
-- text forms are pinned, so the same rows give the same result on any node
-- of the same PostgreSQL major version.
-- @object sharding.shard_checksum
CREATE FUNCTION sharding.shard_checksum(map text, logical integer, tbl regclass)
    RETURNS TABLE(rows bigint, checksum bigint)
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    SET datestyle = 'ISO, YMD'
    SET intervalstyle = 'postgres'
    SET timezone = 'UTC'
    SET extra_float_digits = 1
    SET bytea_output = 'hex'
    AS $$
#variable_conflict use_column
DECLARE
    l integer;
    col text;
    has_pins boolean;
    s numeric;
BEGIN
    IF map IS NULL OR logical IS NULL OR tbl IS NULL THEN
        RAISE EXCEPTION 'shard_checksum needs a map, a logical shard and a table, got %, %, %',
            coalesce(quote_literal(map), 'NULL'), coalesce(logical::text, 'NULL'), coalesce(tbl::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    l := sharding._require_map(map);
    PERFORM sharding._check_logical(map, logical, l);
    SELECT d.key_column INTO col
      FROM sharding.distributed_tables AS d
      JOIN pg_catalog.pg_class AS c ON c.relname = d.table_name
      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = d.schema_name
     WHERE c.oid = tbl;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table % is not distributed', tbl
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Record its key column with sharding.distribute(tbl, key_column, map).';
    END IF;
    has_pins := EXISTS (SELECT FROM sharding.pins AS p WHERE p.map = shard_checksum.map);
    EXECUTE format('SELECT count(*), coalesce(sum(sharding.hash64(t::text)), 0) FROM %s AS t
                     WHERE sharding.logical_shard($1, t.%I) OPERATOR(pg_catalog.=) $2 %s',
                   tbl, col,
                   CASE WHEN has_pins THEN format('AND NOT EXISTS (SELECT FROM sharding.pins AS p
                       WHERE p.map OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) t.%I::text)', col)
                   ELSE '' END)
       INTO rows, s
      USING map, logical;
    -- (sum(bigint) adds exactly, in 128 bits, and returns numeric: no cast
    -- of each hash to numeric is needed.)
    s := mod(s, 18446744073709551616);  -- takes the sign of the sum
    IF s < 0 THEN
        s := s + 18446744073709551616;
    END IF;
    IF s >= 9223372036854775808 THEN
        s := s - 18446744073709551616;
    END IF;
    checksum := s::bigint;
    RETURN NEXT;
END $$;
COMMENT ON FUNCTION sharding.shard_checksum(text, integer, regclass) IS
    'rows and order-independent checksum of a distributed table''s rows in one logical shard (unpinned keys)';
-- @end
