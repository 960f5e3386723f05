-- Identities that cannot drift (docs/identities.md).
--  1. typed pin/unpin: a typed pin stores the key's canonical text form and
--     matches node_for (and partition_for) on the typed key;
--  2. database maps refuse a node without DSN (55000) in create_map, pin,
--     move_shard, rebalance; worker maps keep accepting new names;
--  3. guard_rank/unguard_rank are allowed to the table's owner.
CREATE EXTENSION sharding;
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

------------------------------------------------------------------------
-- 1. Typed pins.
SELECT sharding.create_map('idm', 16, ARRAY['a', 'b']);

-- An integer literal finds the integer overload (was 42883 in 1.1).
SELECT sharding.pin('idm', 42, 'int-node');
SELECT key, node FROM sharding.pins WHERE map = 'idm';
-- Every integer width and the text form route to the pin.
SELECT sharding.node_for('idm', 42) AS int4, sharding.node_for('idm', 42::smallint) AS int2,
       sharding.node_for('idm', 42::bigint) AS int8, sharding.node_for('idm', '42') AS text;
-- smallint and bigint pins, negative and beyond 2^53.
SELECT sharding.pin('idm', (-7)::smallint, 'small-node');
SELECT sharding.pin('idm', 9007199254740993::bigint, 'big-node');
SELECT key, node FROM sharding.pins WHERE map = 'idm' ORDER BY key;
SELECT sharding.node_for('idm', (-7)::smallint) AS int2, sharding.node_for('idm', -7) AS int4,
       sharding.node_for('idm', 9007199254740993::bigint) AS int8,
       sharding.node_for('idm', 9007199254740992::bigint) = sharding.node_for('idm', 9007199254740992::bigint)
           AND sharding.node_for('idm', 9007199254740992::bigint) IN ('a', 'b') AS neighbour_unpinned;

-- uuid: an upper-case uuid pinned as text never matches the uuid key ...
SELECT sharding.pin('idm', '123E4567-E89B-12D3-A456-426614174000', 'text-node');
SELECT sharding.node_for('idm', '123e4567-e89b-12d3-a456-426614174000'::uuid) IN ('a', 'b') AS uuid_key_misses_text_pin;
SELECT sharding.unpin('idm', '123E4567-E89B-12D3-A456-426614174000');
-- ... the typed pin stores lower case and matches, whatever case it was written in.
SELECT sharding.pin('idm', '123E4567-E89B-12D3-A456-426614174000'::uuid, 'uuid-node');
SELECT key, node FROM sharding.pins WHERE map = 'idm' AND node = 'uuid-node';
SELECT sharding.node_for('idm', '123e4567-e89b-12d3-a456-426614174000'::uuid) AS uuid,
       sharding.node_for('idm', '123E4567-E89B-12D3-A456-426614174000'::uuid) AS uuid_upper,
       sharding.node_for('idm', '123e4567-e89b-12d3-a456-426614174000') AS text_lower;

-- bytea: stored as \x and lower-case hex whatever bytea_output says, and
-- matched the same way by node_for (1.1 made routing independent of it).
SET bytea_output = 'escape';
SELECT sharding.pin('idm', '\xDEADBEEF'::bytea, 'bytea-node');
SELECT sharding.pin('idm', ''::bytea, 'empty-node');
SELECT sharding.pin('idm', 'tab	and\\'::bytea, 'escape-node');
SELECT key, node FROM sharding.pins WHERE map = 'idm' AND node IN ('bytea-node', 'empty-node', 'escape-node')
 ORDER BY node;
SELECT sharding.node_for('idm', '\xdeadbeef'::bytea) AS escape_output, sharding.node_for('idm', ''::bytea) AS empty,
       sharding.node_for('idm', 'tab	and\\'::bytea) AS escaped;
RESET bytea_output;
SELECT sharding.node_for('idm', '\xdeadbeef'::bytea) AS hex_output, sharding.node_for('idm', '\xdeadbeef') AS text_form;
-- The PL/Proxy partition follows the same pin (pin-only nodes come after the 16 logical shards, by name).
SELECT sharding.partition_for('idm', '\xdeadbeef'::bytea) AS bytea_partition,
       sharding.partition_for('idm', 42::bigint) AS int_partition,
       sharding.partition_for('idm', '123e4567-e89b-12d3-a456-426614174000'::uuid) AS uuid_partition;

-- Untyped literals still resolve to text (no ambiguity): stored as written.
SELECT sharding.pin('idm', '0042', 'literal-node');
SELECT sharding.node_for('idm', '0042') AS text_0042, sharding.node_for('idm', 42) AS int_42;
SELECT sharding.unpin('idm', '0042');
SELECT p.oid::regprocedure FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'sharding' AND p.proname IN ('pin', 'unpin') ORDER BY p.proname, 1::text;

-- Typed unpin removes exactly the typed pin; a second time there is none.
SELECT sharding.unpin('idm', 42::bigint) AS int8_unpins_int4_pin, sharding.unpin('idm', 42) AS again;
SELECT sharding.unpin('idm', (-7)::smallint) AS int2, sharding.unpin('idm', 9007199254740993) AS int8,
       sharding.unpin('idm', '123E4567-E89B-12D3-A456-426614174000'::uuid) AS uuid,
       sharding.unpin('idm', '\xDEADBEEF'::bytea) AS bytea, sharding.unpin('idm', ''::bytea) AS empty_bytea;
SELECT key, node FROM sharding.pins WHERE map = 'idm' ORDER BY key;
SELECT sharding.unpin('idm', 'tab	and\\'::bytea) AS escaped, count(*) AS pins_left
  FROM sharding.pins WHERE map = 'idm';

-- Bad input: NULL keys 22023, unknown map 42704; nothing changes.
SELECT pg_temp.err($$SELECT sharding.pin('idm', NULL::uuid, 'a')$$);
SELECT pg_temp.err($$SELECT sharding.pin('idm', NULL::bytea, 'a')$$);
SELECT pg_temp.err($$SELECT sharding.pin('idm', 5::smallint, NULL)$$);
SELECT pg_temp.err($$SELECT sharding.unpin('idm', NULL::bigint)$$);
SELECT pg_temp.err($$SELECT sharding.pin('nope', 5, 'a')$$);
SELECT pg_temp.err($$SELECT sharding.unpin('nope', '\x00'::bytea)$$);
SELECT count(*) AS pins FROM sharding.pins WHERE map = 'idm';

-- Privileges: typed pins are admin functions like the text ones.
CREATE ROLE regress_ident_plain;
SET ROLE regress_ident_plain;
SELECT pg_temp.err($$SELECT sharding.pin('idm', 5, 'a')$$);
SELECT pg_temp.err($$SELECT sharding.unpin('idm', '00000000-0000-0000-0000-000000000000'::uuid)$$);
RESET ROLE;
SELECT sharding.drop_map('idm');

------------------------------------------------------------------------
-- 2. Database maps refuse nodes without a DSN.

-- A worker map (no node has a DSN) accepts new names everywhere.
SELECT sharding.create_map('wm', 4, ARRAY['w1', 'w2']);
SELECT sharding.pin('wm', 'whale', 'w-whale');
SELECT sharding.pin('wm', 7, 'w-seven');
SELECT sharding.move_shard('wm', 0, 'w3');
SELECT * FROM sharding.rebalance('wm', ARRAY['w1', 'w2', 'w3', 'w4']);
SELECT node, dsn FROM sharding.nodes WHERE node LIKE 'w%' ORDER BY node;
SELECT sharding.drop_map('wm');

-- A database map: its nodes have DSNs.
SELECT sharding.add_node('db1', 'host=127.0.0.1 dbname=db1');
SELECT sharding.add_node('db2', 'host=127.0.0.1 dbname=db2');
SELECT sharding.create_map('dm', 8, ARRAY['db1', 'db2']);
SELECT sharding.cluster_version('dm') AS version_before \gset
-- Each of pin (text and typed), move_shard and rebalance (also dry_run)
-- names the node without DSN, hints at add_node, and changes nothing.
SELECT sharding.pin('dm', 'whale', 'db-typo');
SELECT pg_temp.err($$SELECT sharding.pin('dm', 42, 'db-typo')$$);
SELECT pg_temp.err($$SELECT sharding.pin('dm', '5ca1ab1e-0000-4000-8000-000000000000'::uuid, 'db-typo')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard('dm', 3, 'db3')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('dm', ARRAY['db1', 'db2', 'db3'])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('dm', ARRAY['db1', 'db2', 'db3'], dry_run => true)$$);
SELECT (SELECT count(*) FROM sharding.pins WHERE map = 'dm') AS pins,
       (SELECT string_agg(node || ':' || epoch, ',' ORDER BY logical) FROM sharding.shards WHERE map = 'dm') AS shards,
       (SELECT count(*) FROM sharding.nodes WHERE node IN ('db-typo', 'db3')) AS unknown_nodes_recorded,
       sharding.cluster_version('dm') = :version_before AS version_unchanged;
-- create_map: one node with a DSN makes it a database map; the others need one.
SELECT pg_temp.err($$SELECT sharding.create_map('dm2', 4, ARRAY['db1', 'db-new'])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('dm2', 4, ARRAY['db-new', 'db2'])$$);
SELECT count(*) AS dm2_created FROM sharding.maps WHERE map = 'dm2';
-- An existing map is still 42710 first, whatever its nodes.
SELECT pg_temp.err($$SELECT sharding.create_map('dm', 4, ARRAY['db1', 'db-new'])$$);
-- A known node without DSN is refused as well.
SELECT sharding.create_map('wm2', 2, ARRAY['bare']);
SELECT pg_temp.err($$SELECT sharding.move_shard('dm', 0, 'bare')$$);
SELECT sharding.drop_map('wm2');
-- After add_node, the same calls go through.
SELECT sharding.add_node('db3', 'host=127.0.0.1 dbname=db3');
SELECT sharding.pin('dm', 'whale', 'db3');
SELECT sharding.pin('dm', 42, 'db3');
SELECT sharding.move_shard('dm', 3, 'db3');
SELECT * FROM sharding.rebalance('dm', ARRAY['db1', 'db2', 'db3']);
SELECT sharding.shards_of('dm', 'db3') AS db3, sharding.node_for('dm', 'whale') AS whale,
       sharding.node_for('dm', 42::bigint) AS forty_two;
-- Unpinning and moves between nodes with DSNs are untouched.
SELECT sharding.unpin('dm', 42::smallint);
SELECT sharding.move_shard('dm', 3, 'db1');
SELECT sharding.drop_map('dm');
SELECT sharding.drop_node(n) FROM unnest(ARRAY['db1', 'db2', 'db3']) AS n;

------------------------------------------------------------------------
-- 3. Rank guards: the table's owner may guard and unguard it.
CREATE ROLE regress_ident_owner;
CREATE ROLE regress_ident_member IN ROLE regress_ident_owner;
CREATE SCHEMA ident_s AUTHORIZATION regress_ident_owner;
CREATE TABLE ident_s.theirs (id bigint PRIMARY KEY, status text);
ALTER TABLE ident_s.theirs OWNER TO regress_ident_owner;
CREATE TABLE ident_s.admins (id bigint PRIMARY KEY, status text);
GRANT SELECT, UPDATE ON ident_s.admins TO regress_ident_owner, regress_ident_plain;
GRANT SELECT, UPDATE ON ident_s.theirs TO regress_ident_plain;
GRANT USAGE ON SCHEMA ident_s TO regress_ident_plain;
INSERT INTO ident_s.theirs VALUES (1, 'shipped');

SET ROLE regress_ident_owner;
SELECT sharding.guard_rank('ident_s.theirs', 'status', ARRAY['preparing', 'shipped', 'delivered']);
UPDATE ident_s.theirs SET status = 'preparing' WHERE id = 1;   -- skipped: a regression
SELECT status FROM ident_s.theirs;
SELECT schema_name, table_name, column_name, ranks, on_regress FROM sharding.rank_guards;
-- Not the owner of ident_s.admins: refused, and the registry of others' tables is closed too.
SELECT pg_temp.err($$SELECT sharding.guard_rank('ident_s.admins', 'status', ARRAY['a', 'b'])$$);
SELECT pg_temp.err($$INSERT INTO sharding.rank_guards (schema_name, table_name, column_name, ranks, on_regress)
                     VALUES ('ident_s', 'admins', 'status', '{a}', 'skip')$$);
RESET ROLE;

-- Another role: refused on the owner's table, and cannot touch its registry row.
SET ROLE regress_ident_plain;
SELECT pg_temp.err($$SELECT sharding.guard_rank('ident_s.theirs', 'status', ARRAY['a', 'b'], 'error')$$);
SELECT pg_temp.err($$SELECT sharding.unguard_rank('ident_s.theirs', 'status')$$);
DELETE FROM sharding.rank_guards;
UPDATE sharding.rank_guards SET on_regress = 'error';
SELECT pg_temp.err($$INSERT INTO sharding.rank_guards (schema_name, table_name, column_name, ranks, on_regress)
                     VALUES ('ident_s', 'theirs', 'note', '{a}', 'skip')$$);
RESET ROLE;
SELECT count(*) AS guards, min(on_regress) AS on_regress FROM sharding.rank_guards;

-- A member of the owning role counts as the owner.
SET ROLE regress_ident_member;
SELECT sharding.guard_rank('ident_s.theirs', 'status', ARRAY['preparing', 'shipped', 'delivered'], 'error');
SELECT pg_temp.err($$UPDATE ident_s.theirs SET status = 'preparing' WHERE id = 1$$);
SELECT sharding.unguard_rank('ident_s.theirs', 'status');
RESET ROLE;
SELECT count(*) AS guards_left FROM sharding.rank_guards;
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgrelid = 'ident_s.theirs'::regclass AND NOT tgisinternal;

-- The owner unguards its own table.
SET ROLE regress_ident_owner;
SELECT sharding.guard_rank('ident_s.theirs', 'status', ARRAY['preparing', 'shipped', 'delivered']);
SELECT sharding.unguard_rank('ident_s.theirs', 'status');
UPDATE ident_s.theirs SET status = 'preparing' WHERE id = 1;   -- no guard any more
SELECT status FROM ident_s.theirs;
RESET ROLE;

DROP SCHEMA ident_s CASCADE;
DROP ROLE regress_ident_member;
DROP ROLE regress_ident_owner;
DROP ROLE regress_ident_plain;
DROP EXTENSION sharding;
