-- Followers and guarded writes (docs/nodes.md) on one database: this_node, attach_node/detach_node refusals,
-- frozen shards, guards that stay inert where nothing follows, and
-- shard_checksum. test/tap/610_follow.pl covers following itself.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Never attached.
SELECT sharding.this_node() IS NULL AS never_attached;

-- attach_node: NULL and empty names 22023; this test cluster runs with
-- wal_level = replica, so every real name gets 55000 (before any other check).
SELECT pg_temp.err($$SELECT sharding.attach_node(NULL)$$);
SELECT pg_temp.err($$SELECT sharding.attach_node('')$$);
SELECT current_setting('wal_level');
SELECT pg_temp.err($$SELECT sharding.attach_node('n1')$$);
-- detach_node: a node without DSN 55000.
SELECT pg_temp.err($$SELECT sharding.detach_node(NULL)$$);
SELECT pg_temp.err($$SELECT sharding.detach_node('ghost')$$);

-- A map and a distributed table; the coordinator is not a data node, so
-- writes of any key pass and no guard is installed.
SELECT sharding.create_map('m', 4, ARRAY['n1', 'n2']);
CREATE TABLE docs (k text PRIMARY KEY, v integer);
CREATE TABLE ints (k bigint PRIMARY KEY, v integer);
SELECT sharding.distribute('docs', 'k', 'm');
-- (A map's tables share one key type: the bigint keys have a map of their own.)
SELECT sharding.create_map('mi', 4, ARRAY['n1', 'n2']);
SELECT sharding.distribute('ints', 'k', 'mi');
INSERT INTO docs SELECT 'key-' || i, i FROM generate_series(1, 40) AS i;
INSERT INTO ints SELECT i, i FROM generate_series(1, 40) AS i;
SELECT count(*) AS guards FROM pg_trigger WHERE tgname = 'zz_sharding_guard';

-- _freeze_shard / _thaw_shard: a frozen row per shard, repeating is
-- harmless; bad maps and shards are refused.
SELECT sharding._freeze_shard('m', 1);
SELECT sharding._freeze_shard('m', 1);
SELECT map, logical, since <= now() AS since_ok FROM sharding.frozen_shards;
SELECT pg_temp.err($$SELECT sharding._freeze_shard('nomap', 0)$$);
SELECT pg_temp.err($$SELECT sharding._freeze_shard('m', 4)$$);
SELECT pg_temp.err($$SELECT sharding._freeze_shard('m', -1)$$);
-- Not a data node: frozen shards refuse nothing here.
INSERT INTO docs SELECT k, 0 FROM (SELECT 'f' || i AS k FROM generate_series(1, 50) AS i) AS t
 WHERE sharding.logical_shard('m', k) = 1 LIMIT 1;
SELECT sharding._thaw_shard('m', 1), sharding._thaw_shard('m', 1);
SELECT count(*) FROM sharding.frozen_shards;

-- The guard itself, forced onto a table while this database claims to
-- follow as n1 (as attach_node would set it up; no subscription here).
INSERT INTO sharding.local_node (node, coordinator_dsn, following) VALUES ('n1', 'dbname=nowhere', true);
SELECT sharding.this_node();
SELECT sharding._install_guards() AS guarded;
SELECT tgrelid::regclass, tgname, tgenabled FROM pg_trigger WHERE tgname = 'zz_sharding_guard' ORDER BY 1;
-- Config changes are refused while following.
SELECT pg_temp.err($$SELECT sharding.create_map('x', 2, ARRAY['n1'])$$);
SELECT pg_temp.err($$SELECT sharding.move_shard('m', 0, 'n2')$$);
SELECT pg_temp.err($$SELECT sharding.undistribute('docs')$$);
SELECT pg_temp.err($$DELETE FROM sharding.pins$$);
-- Guarded writes: n1 owns shards 0 and 1, n2 shards 2 and 3.
SELECT sharding.shards_of('m', 'n1') AS n1, sharding.shards_of('m', 'n2') AS n2;
SELECT k, sharding.node_for('m', k) FROM (VALUES ('key-1'), ('key-2'), ('key-3'), ('key-4')) AS t(k) ORDER BY k;
SELECT pg_temp.err($$INSERT INTO docs VALUES ('key-new-1', 1)$$);
SELECT pg_temp.err($$INSERT INTO docs SELECT k, 1 FROM (SELECT 'x' || i AS k FROM generate_series(1, 50) AS i) AS t
                     WHERE sharding.node_for('m', k) = 'n2' LIMIT 1$$);
SELECT pg_temp.err($$INSERT INTO docs SELECT k, 1 FROM (SELECT 'x' || i AS k FROM generate_series(1, 50) AS i) AS t
                     WHERE sharding.node_for('m', k) = 'n1' LIMIT 1$$);
SELECT pg_temp.err(format('UPDATE docs SET v = -1 WHERE k = %L', (SELECT min(k) FROM docs WHERE sharding.node_for('m', k) = 'n2')));
SELECT pg_temp.err(format('DELETE FROM docs WHERE k = %L', (SELECT min(k) FROM docs WHERE sharding.node_for('m', k) = 'n2')));
SELECT pg_temp.err(format('UPDATE docs SET v = -1 WHERE k = %L', (SELECT min(k) FROM docs WHERE sharding.node_for('m', k) = 'n1')));
SELECT pg_temp.err(format('UPDATE ints SET v = -1 WHERE k = %s', (SELECT min(k) FROM ints WHERE sharding.node_for('mi', k) = 'n2')));
SELECT pg_temp.err(format('UPDATE ints SET v = -1 WHERE k = %s', (SELECT min(k) FROM ints WHERE sharding.node_for('mi', k) = 'n1')));
SELECT pg_temp.err($$UPDATE docs SET v = v$$);
-- A key that becomes NULL has no owner.
ALTER TABLE docs DROP CONSTRAINT docs_pkey;
ALTER TABLE docs ALTER COLUMN k DROP NOT NULL;
SELECT pg_temp.err($$INSERT INTO docs VALUES (NULL, 1)$$);
-- Frozen: owned keys of the shard are refused too.
SELECT sharding._freeze_shard('m', 0);
SELECT pg_temp.err(format('UPDATE docs SET v = -2 WHERE k = %L', (SELECT min(k) FROM docs WHERE sharding.logical_shard('m', k) = 0)));
SELECT pg_temp.err(format('UPDATE docs SET v = -2 WHERE k = %L', (SELECT min(k) FROM docs WHERE sharding.logical_shard('m', k) = 1)));
SELECT sharding._thaw_shard('m', 0);
SELECT pg_temp.err(format('UPDATE docs SET v = -2 WHERE k = %L', (SELECT min(k) FROM docs WHERE sharding.logical_shard('m', k) = 0)));
-- Replica role (logical-replication apply) writes past the guard.
SET session_replication_role = replica;
INSERT INTO docs VALUES ('key-by-apply', 1);
RESET session_replication_role;
SELECT count(*) FROM docs WHERE k = 'key-by-apply';
-- Unguard, as detach_node does (_unfollow); the copy is editable again.
SELECT sharding._unfollow(), sharding._unfollow();
SELECT sharding.this_node(), following FROM sharding.local_node;
SELECT count(*) AS guards FROM pg_trigger WHERE tgname = 'zz_sharding_guard';
SELECT pg_temp.err($$INSERT INTO docs VALUES ('key-after', 1)$$);
SELECT pg_temp.err($$SELECT sharding.create_map('x', 2, ARRAY['n1'])$$);
SELECT sharding.drop_map('x');
DELETE FROM sharding.local_node;
DELETE FROM docs WHERE k IS NULL OR k IN ('key-by-apply', 'key-after') OR v IN (0, 1, -2) AND k NOT LIKE 'key-%';
ALTER TABLE docs ADD PRIMARY KEY (k);

-- shard_checksum: rows of one logical shard, order-independent, pinned
-- keys excluded; the parts sum to the whole table's.
SELECT logical, rows FROM generate_series(0, 3) AS logical, sharding.shard_checksum('m', logical, 'docs') ORDER BY 1;
SELECT sum(rows) = (SELECT count(*) FROM docs) AS all_rows FROM generate_series(0, 3) AS l, sharding.shard_checksum('m', l, 'docs');
CREATE TEMP TABLE before AS SELECT * FROM sharding.shard_checksum('m', 0, 'docs');
CREATE TABLE docs2 (LIKE docs INCLUDING ALL);
INSERT INTO docs2 SELECT * FROM docs ORDER BY k DESC;
SELECT sharding.distribute('docs2', 'k', 'm');
SELECT (SELECT row(rows, checksum) FROM before) = (SELECT row(rows, checksum) FROM sharding.shard_checksum('m', 0, 'docs2')) AS same_rows_same_sum;
UPDATE docs2 SET v = v + 1 WHERE k = (SELECT min(k) FROM docs2 WHERE sharding.logical_shard('m', k) = 0);
SELECT (SELECT checksum FROM before) <> (SELECT checksum FROM sharding.shard_checksum('m', 0, 'docs2')) AS one_change_differs;
SELECT sharding.pin('m', (SELECT min(k) FROM docs WHERE sharding.logical_shard('m', k) = 0), 'n2');
SELECT (SELECT rows FROM before) - 1 = (SELECT rows FROM sharding.shard_checksum('m', 0, 'docs')) AS pinned_key_left_out;
-- Settings that change text forms do not change the checksum.
CREATE TABLE stamps (k bigint PRIMARY KEY, at timestamptz, f float8, d interval);
SELECT sharding.distribute('stamps', 'k', 'mi');
INSERT INTO stamps SELECT i, '2026-01-01 12:00+00'::timestamptz + i * interval '1 hour', i / 3.0, i * interval '90 minutes'
  FROM generate_series(1, 20) AS i;
CREATE TEMP TABLE s1 AS SELECT * FROM sharding.shard_checksum('mi', 2, 'stamps');
SET timezone = 'Asia/Tokyo';
SET datestyle = 'German';
SET extra_float_digits = -3;
SET intervalstyle = 'sql_standard';
SELECT (SELECT row(rows, checksum) FROM s1) = (SELECT row(rows, checksum) FROM sharding.shard_checksum('mi', 2, 'stamps')) AS settings_do_not_matter;
RESET timezone;
RESET datestyle;
RESET extra_float_digits;
RESET intervalstyle;
-- Errors.
SELECT pg_temp.err($$SELECT * FROM sharding.shard_checksum('nomap', 0, 'docs')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.shard_checksum('m', 4, 'docs')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.shard_checksum('m', NULL, 'docs')$$);
CREATE TABLE plain (k text PRIMARY KEY);
SELECT pg_temp.err($$SELECT * FROM sharding.shard_checksum('m', 0, 'plain')$$);

-- Privileges: attach, detach, freeze and thaw are for administrators.
CREATE ROLE follow_plain;
SET ROLE follow_plain;
SELECT pg_temp.err($$SELECT sharding.attach_node('n1')$$);
SELECT pg_temp.err($$SELECT sharding.detach_node('n1')$$);
SELECT pg_temp.err($$SELECT sharding._freeze_shard('m', 0)$$);
SELECT pg_temp.err($$SELECT sharding._thaw_shard('m', 0)$$);
SELECT sharding.this_node() IS NULL AS readable;
SELECT count(*) FROM sharding.frozen_shards;
RESET ROLE;
DROP ROLE follow_plain;

DROP EXTENSION sharding;
DROP TABLE docs, docs2, ints, stamps, plain;
