-- Fixes of issue 27 (docs: install, followers, observe) and one source for
-- the exported symbols (issue 22).

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
    IF attach_node.node IS NULL OR attach_node.node = '' THEN
        RAISE EXCEPTION 'node name must not be empty or NULL, got %', coalesce(quote_literal(attach_node.node), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
    SELECT n.dsn INTO dsn FROM sharding.nodes AS n WHERE n.node = attach_node.node;
    IF dsn IS NULL THEN
        RAISE EXCEPTION 'node "%" has no connection string', attach_node.node
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Call sharding.add_node(%L, ''<dsn>'') first.', attach_node.node);
    END IF;
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
          USING dsn, format($s$SELECT (6 - count(*) FILTER (WHERE r.srsubstate IN ('r', 's')))::integer
                                 FROM pg_catalog.pg_subscription AS s
                                 JOIN pg_catalog.pg_subscription_rel AS r ON r.srsubid = s.oid
                                WHERE s.subname = %L$s$, sub);
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

-- partition_for links its sharding_ symbols (1.2 linked the bare names,
-- which stay exported for the frozen 1.2 script only).
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

COMMENT ON FUNCTION sharding.fanout_reset() IS
    'zeroes the fan-out counters of this database; fanout_stats.since becomes now, fanout_info().evicted zero';

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
CREATE OR REPLACE FUNCTION sharding.distribute(tbl regclass, key_column name, map text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    nsp text;
    rel text;
    typ oid;
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
    SELECT a.atttypid INTO typ FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = tbl AND a.attname = key_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of table % does not exist', key_column, tbl
            USING ERRCODE = 'undefined_column';
    END IF;
    -- The shard key types: sharding._key_type, the one test (varchar is
    -- text with a length limit; a domain counts as its base type).
    IF sharding._key_type(typ) IS NULL THEN
        RAISE EXCEPTION 'column "%" of table % is of type %, not a shard key type', key_column, tbl,
            pg_catalog.format_type(typ, NULL)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Shard keys are text, varchar, bytea, smallint, integer, bigint or uuid.';
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
    INSERT INTO sharding.distributed_tables (schema_name, table_name, key_column, map)
    VALUES (nsp, rel, key_column, map);
END $$;
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

    SELECT a.atttypid::regtype INTO key_type
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = copy_shard.tbl AND a.attname = copy_shard.key_column
       AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', copy_shard.key_column, copy_shard.tbl
            USING ERRCODE = 'undefined_column';
    END IF;
    IF sharding._key_type(key_type) IS NULL THEN
        RAISE EXCEPTION 'key column "%" of relation % has type %, not a shard key type',
                copy_shard.key_column, copy_shard.tbl, key_type
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Shard keys are text, varchar, bytea, smallint, integer, bigint or uuid.';
    END IF;
    key_type := sharding._key_type(key_type);  -- as it is hashed: varchar as text, a domain as its base

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
