-- Nodes and PL/Proxy (docs/nodes.md) on one node: add_node, drop_node, partition_for, the PL/Proxy
-- cluster functions, plproxy_install and copy_shard's argument checks.
-- test/tap/600_plproxy.pl drives real PL/Proxy over four instances.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 6 logical shards over three nodes (0-1 n1, 2-3 n2, 4-5 n3), none with a DSN yet.
SELECT sharding.create_map('docs', 6, ARRAY['n1', 'n2', 'n3']);
SELECT pg_temp.err($$SELECT sharding.cluster_partitions('docs')$$);
SELECT sharding.cluster_version('docs') AS v \gset

-- add_node sets a DSN and raises the version of the maps using the node.
SELECT sharding.add_node('n1', 'host=127.0.0.1 port=5001 dbname=data');
SELECT sharding.cluster_version('docs') > :v AS raised_by_new_dsn;
SELECT sharding.cluster_version('docs') AS v \gset
SELECT sharding.add_node('n1', 'host=127.0.0.1 port=5001 dbname=data');
SELECT sharding.cluster_version('docs') = :v AS same_dsn_keeps_version;
SELECT sharding.add_node('elsewhere', 'host=127.0.0.1 port=5009 dbname=data');
SELECT sharding.cluster_version('docs') = :v AS unrelated_node_keeps_version;
SELECT sharding.add_node('n1', 'host=127.0.0.1 port=5011 dbname=data');
SELECT sharding.cluster_version('docs') > :v AS raised_by_replaced_dsn;
SELECT sharding.add_node('n2', 'host=127.0.0.1 port=5002 dbname=data'),
       sharding.add_node('n3', 'host=127.0.0.1 port=5003 dbname=data');
SELECT node, dsn FROM sharding.nodes ORDER BY node;

-- One partition per logical shard, in order, each its owner's DSN.
SELECT row_number() OVER () - 1 AS partition, dsn FROM sharding.cluster_partitions('docs') AS dsn;

-- Pins to nodes owning no logical shard add partitions after the logical
-- ones, ordered by node name; a pin to an owning node adds none.
-- (1.2: 'docs' is a database map, so a pin to a node without DSN is refused
-- with 55000 and changes nothing; sql/identities.sql tests that in full.)
SELECT sharding.cluster_version('docs') AS v \gset
SELECT pg_temp.err($$SELECT sharding.pin('docs', 'whale', 'zeta')$$);
SELECT sharding.add_node('zeta', 'host=127.0.0.1 port=5025 dbname=data'),
       sharding.add_node('alpha', 'host=127.0.0.1 port=5021 dbname=data');
SELECT sharding.cluster_version('docs') = :v AS unused_nodes_keep_version;
SELECT sharding.pin('docs', 'whale', 'zeta'), sharding.pin('docs', 'orca', 'alpha'),
       sharding.pin('docs', 'orca2', 'alpha'), sharding.pin('docs', 'local-whale', 'n2');
SELECT sharding.cluster_version('docs') > :v AS raised_by_pins;
SELECT sharding.cluster_version('docs') AS v \gset
SELECT sharding.add_node('zeta', 'host=127.0.0.1 port=5026 dbname=data');
SELECT sharding.cluster_version('docs') > :v AS raised_by_pin_node_dsn;
SELECT row_number() OVER () - 1 AS partition, dsn FROM sharding.cluster_partitions('docs') AS dsn;

-- partition_for: an unpinned key's logical shard, for every key type.
SELECT bool_and(sharding.partition_for('docs', 'k' || i) = sharding.logical_shard('docs', 'k' || i)) AS text_keys,
       bool_and(sharding.partition_for('docs', ('k' || i)::bytea) = sharding.logical_shard('docs', ('k' || i)::bytea)) AS bytea_keys,
       bool_and(sharding.partition_for('docs', i::smallint) = sharding.logical_shard('docs', i::smallint)) AS int2_keys,
       bool_and(sharding.partition_for('docs', i) = sharding.logical_shard('docs', i)) AS int4_keys,
       bool_and(sharding.partition_for('docs', i::bigint * 1000003) = sharding.logical_shard('docs', i::bigint * 1000003)) AS int8_keys,
       bool_and(sharding.partition_for('docs', md5(i::text)::uuid) = sharding.logical_shard('docs', md5(i::text)::uuid)) AS uuid_keys,
       count(DISTINCT sharding.partition_for('docs', 'k' || i)) AS partitions_used
  FROM generate_series(1, 2000) AS i;
-- A pinned key: its node's lowest logical shard, or its pin-only partition.
SELECT k, sharding.node_for('docs', k) AS node, sharding.partition_for('docs', k) AS partition
  FROM unnest(ARRAY['whale', 'orca', 'orca2', 'local-whale']) AS k;
-- Pins match on the key's text form, whatever the key's type.
SELECT sharding.pin('docs', '42', 'zeta'), sharding.pin('docs', '\x0102', 'alpha'),
       sharding.pin('docs', '00000000-0000-0000-0000-00000000002a', 'n3');
SELECT sharding.partition_for('docs', 42::smallint) AS int2, sharding.partition_for('docs', 42) AS int4,
       sharding.partition_for('docs', 42::bigint) AS int8, sharding.partition_for('docs', '42') AS text,
       sharding.partition_for('docs', '\x0102'::bytea) AS bytea,
       sharding.partition_for('docs', '00000000-0000-0000-0000-00000000002a'::uuid) AS uuid;
-- Named notation and NULL (STRICT: NULL in, NULL out).
SELECT sharding.partition_for(map => 'docs', key => 'whale') AS named,
       sharding.partition_for('docs', NULL::text) IS NULL AS null_key;
-- Every partition number has a partition.
SELECT (SELECT count(*) FROM sharding.cluster_partitions('docs')) AS partitions,
       max(sharding.partition_for('docs', k)) AS max_partition
  FROM (SELECT 'k' || i FROM generate_series(1, 500) AS i
        UNION ALL SELECT key FROM sharding.pins) AS t(k);

-- PL/Proxy settings: modular mapping (8 partitions here, any count works).
SELECT * FROM sharding.cluster_config('docs');

-- The version rises with moves, unpins, and across drop_map + create_map.
SELECT sharding.cluster_version('docs') AS v \gset
SELECT sharding.move_shard('docs', 0, 'n2');
SELECT sharding.cluster_version('docs') > :v AS raised_by_move;
SELECT row_number() OVER () - 1 AS partition, dsn FROM sharding.cluster_partitions('docs') AS dsn LIMIT 2;
SELECT sharding.cluster_version('docs') AS v \gset
SELECT sharding.unpin('docs', 'orca');
SELECT sharding.cluster_version('docs') > :v AS raised_by_unpin;
SELECT sharding.cluster_version('docs') AS v \gset
SELECT sharding.drop_map('docs');
SELECT pg_temp.err($$SELECT sharding.cluster_version('docs')$$);
SELECT sharding.create_map('docs', 6, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.cluster_version('docs') > :v AS higher_after_recreate;
-- Past int4, the version is an error rather than a wrap-around.
UPDATE sharding.map_versions SET version = 2147483648 WHERE map = 'docs';
SELECT pg_temp.err($$SELECT sharding.cluster_version('docs')$$);
SELECT sharding.drop_map('docs');

-- Unknown map: 42704 everywhere.
SELECT pg_temp.err($$SELECT sharding.partition_for('nope', 'k')$$);
SELECT pg_temp.err($$SELECT sharding.partition_for('nope', 7::bigint)$$);
SELECT pg_temp.err($$SELECT sharding.partition_for('nope', gen_random_uuid())$$);
SELECT pg_temp.err($$SELECT sharding.cluster_partitions('nope')$$);
SELECT pg_temp.err($$SELECT sharding.cluster_version('nope')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.cluster_config('nope')$$);

-- drop_node: refused while the node owns shards or pins; unknown: 42704.
SELECT sharding.create_map('m2', 4, ARRAY['n1', 'n2']);
SELECT sharding.pin('m2', 'big', 'zeta');
SELECT pg_temp.err($$SELECT sharding.drop_node('n1')$$);
SELECT pg_temp.err($$SELECT sharding.drop_node('zeta')$$);
SELECT pg_temp.err($$SELECT sharding.drop_node('no-such-node')$$);
SELECT pg_temp.err($$SELECT sharding.drop_node(NULL)$$);
SELECT sharding.drop_node('elsewhere');
SELECT sharding.unpin('m2', 'big');
SELECT sharding.drop_node('zeta');
SELECT node FROM sharding.nodes ORDER BY node;

-- add_node: bad arguments are 22023 naming the value.
SELECT pg_temp.err($$SELECT sharding.add_node(NULL, 'dbname=x')$$);
SELECT pg_temp.err($$SELECT sharding.add_node('', 'dbname=x')$$);
SELECT pg_temp.err($$SELECT sharding.add_node('n1', NULL)$$);
SELECT pg_temp.err($$SELECT sharding.add_node('n1', '  ')$$);

-- plproxy_install: the three PL/Proxy configuration functions, delegating.
SELECT sharding.plproxy_install();
SELECT sharding.plproxy_install() AS again;
SELECT plproxy.get_cluster_version('m2') = sharding.cluster_version('m2') AS version,
       (SELECT array_agg(p) FROM plproxy.get_cluster_partitions('m2') AS p)
         = (SELECT array_agg(p) FROM sharding.cluster_partitions('m2') AS p) AS partitions;
SELECT * FROM plproxy.get_cluster_config('m2');
SELECT pg_temp.err($$SELECT plproxy.get_cluster_version('nope')$$);
-- Signatures PL/Proxy 2.10 calls.
SELECT p.oid::regprocedure AS function, pg_get_function_result(p.oid) AS result
  FROM pg_proc AS p WHERE p.pronamespace = 'plproxy'::regnamespace ORDER BY p.proname COLLATE "C";
-- A user's own function of one of those names is never replaced.
DROP FUNCTION plproxy.get_cluster_config(text);
CREATE FUNCTION plproxy.get_cluster_config(IN cluster_name text, OUT key text, OUT val text)
    RETURNS SETOF record LANGUAGE sql AS $$ SELECT 'connection_lifetime'::text, '60'::text $$;
SELECT pg_temp.err($$SELECT sharding.plproxy_install()$$);
SELECT * FROM plproxy.get_cluster_config('m2') AS still_the_users;
SET client_min_messages = warning;
DROP SCHEMA plproxy CASCADE;
RESET client_min_messages;

-- copy_shard's checks (copies between live instances: the multi-node tests).
CREATE TABLE docs_t (workspace_id text PRIMARY KEY, n numeric, body text);
SELECT pg_temp.err($$SELECT sharding.copy_shard('nope', 0, 'docs_t', 'workspace_id', 'a', 'b')$$);
SELECT pg_temp.err($$SELECT sharding.copy_shard('m2', 4, 'docs_t', 'workspace_id', 'a', 'b')$$);
SELECT pg_temp.err($$SELECT sharding.copy_shard('m2', -1, 'docs_t', 'workspace_id', 'a', 'b')$$);
SELECT pg_temp.err($$SELECT sharding.copy_shard('m2', 0, 'docs_t', 'missing', 'a', 'b')$$);
SELECT pg_temp.err($$SELECT sharding.copy_shard('m2', 0, 'docs_t', 'n', 'a', 'b')$$);
-- A source it cannot reach: 08001 with libpq's reason (no dblink needed
-- since 1.4: the engine's own connections).
SELECT pg_temp.err($$SELECT sharding.copy_shard('m2', 0, 'docs_t', 'workspace_id', 'port=none', 'port=none')$$);
DROP TABLE docs_t;

-- Privileges: routing for everyone; nodes, installing and copying for
-- the owner and sharding_admin only (42501).
CREATE ROLE nodes_reader;
CREATE ROLE nodes_admin IN ROLE sharding_admin;
SET ROLE nodes_reader;
SELECT sharding.partition_for('m2', 'k') = sharding.logical_shard('m2', 'k') AS reader_routes,
       sharding.cluster_version('m2') > 0 AS reader_version,
       (SELECT count(*) FROM sharding.cluster_config('m2')) AS reader_config;
SELECT pg_temp.err($$SELECT sharding.add_node('n1', 'dbname=evil')$$);
SELECT pg_temp.err($$SELECT sharding.drop_node('n1')$$);
SELECT pg_temp.err($$SELECT sharding.plproxy_install()$$);
SELECT pg_temp.err($$SELECT sharding.copy_shard('m2', 0, 'pg_class', 'relname', 'a', 'b')$$);
RESET ROLE;
SET ROLE nodes_admin;
SELECT sharding.add_node('n9', 'host=127.0.0.1 port=5009 dbname=data');
SELECT sharding.drop_node('n9');
RESET ROLE;
DROP ROLE nodes_reader;
DROP ROLE nodes_admin;

SELECT sharding.drop_map('m2');
DROP EXTENSION sharding;
