-- Distributed tables (docs/nodes.md): distribute / undistribute and the distributed_tables
-- config table.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT sharding.create_map('docs', 16, ARRAY['n1', 'n2']);
CREATE SCHEMA "App Data";
CREATE TABLE "App Data"."Documents" (id bigint, workspace text, body text, PRIMARY KEY (workspace, id));
CREATE TABLE comments (id bigint PRIMARY KEY, workspace text NOT NULL, body text);
CREATE DOMAIN tenant_id AS text;
CREATE TABLE tenants (id tenant_id PRIMARY KEY, name text);
CREATE TABLE nopk (workspace text);
CREATE TABLE wrongtype (id bigint PRIMARY KEY, workspace numeric);
CREATE TABLE keyed_by_int (id bigint PRIMARY KEY);

SELECT sharding.distribute('"App Data"."Documents"', 'workspace', 'docs');
-- The key outside the primary key: the replica identity must carry it
-- (55000, nothing recorded), on the table and on each leaf partition.
SELECT pg_temp.err($$SELECT sharding.distribute('comments', 'workspace', 'docs')$$);
CREATE TABLE parted (id bigint, workspace text, PRIMARY KEY (workspace, id)) PARTITION BY RANGE (id);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100);
ALTER TABLE parted_1 REPLICA IDENTITY NOTHING;
SELECT pg_temp.err($$SELECT sharding.distribute('parted', 'workspace', 'docs')$$);
DROP TABLE parted;
SELECT count(*) AS none_recorded FROM sharding.distributed_tables;
ALTER TABLE comments REPLICA IDENTITY FULL;
SELECT sharding.distribute('comments', 'workspace', 'docs');
SELECT sharding.distribute('tenants', 'id', 'docs');
SELECT * FROM sharding.distributed_tables ORDER BY schema_name, table_name;

-- Errors, each changing nothing.
SELECT pg_temp.err($$SELECT sharding.distribute('comments', 'workspace', 'nomap')$$);
SELECT pg_temp.err($$SELECT sharding.distribute('comments', 'nocol', 'docs')$$);
SELECT pg_temp.err($$SELECT sharding.distribute('wrongtype', 'workspace', 'docs')$$);
-- A map's tables share one key type (the integer types count as one).
SELECT pg_temp.err($$SELECT sharding.distribute('keyed_by_int', 'id', 'docs')$$);
SELECT pg_temp.err($$SELECT sharding.distribute('comments', 'workspace', 'docs')$$);
SELECT pg_temp.err($$SELECT sharding.distribute('nopk', 'workspace', 'docs')$$);
SELECT pg_temp.err($$SELECT sharding.distribute(NULL, 'workspace', 'docs')$$);
SELECT pg_temp.err($$SELECT sharding.distribute('comments', NULL, 'docs')$$);
SELECT pg_temp.err($$SELECT sharding.distribute('comments', 'workspace', NULL)$$);
SELECT pg_temp.err($$SELECT sharding.undistribute(NULL)$$);
SELECT count(*) AS still_three FROM sharding.distributed_tables;

-- Readable by everyone, changeable by admins only.
CREATE ROLE sharding_dist_plain;
SET ROLE sharding_dist_plain;
SELECT count(*) FROM sharding.distributed_tables;
SELECT pg_temp.err($$SELECT sharding.distribute('nopk', 'workspace', 'docs')$$);
SELECT pg_temp.err($$SELECT sharding.undistribute('comments')$$);
RESET ROLE;

SELECT sharding.undistribute('comments') AS was, sharding.undistribute('comments') AS again;
-- drop_map forgets the map's distributed tables.
SELECT sharding.drop_map('docs');
SELECT count(*) AS after_drop_map FROM sharding.distributed_tables;

DROP ROLE sharding_dist_plain;
DROP EXTENSION sharding;
DROP SCHEMA "App Data" CASCADE;
DROP TABLE comments, tenants, nopk, wrongtype, keyed_by_int;
DROP DOMAIN tenant_id;
