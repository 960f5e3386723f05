-- Maps (docs/maps.md): logical-shard maps, pins, moves, rebalancing, epochs, fences.
-- Multi-session behaviour (cache invalidation across backends, fence against
-- move) is in test/harness/maps_*.sh.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Owner counts per node of a map, as text for compact output.
CREATE FUNCTION pg_temp.counts(m text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(node || '=' || n, ' ' ORDER BY node)
      FROM (SELECT node, count(*) AS n FROM sharding.shards WHERE map = m GROUP BY node) AS c
$$;

-- create_map deals contiguous ranges, larger first: 64 over 4, 10 over 4 (3,3,2,2).
SELECT sharding.create_map('m64', 64, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT node, min(logical), max(logical), count(*), min(epoch) AS min_epoch, max(epoch) AS max_epoch
  FROM sharding.shards WHERE map = 'm64' GROUP BY node ORDER BY node;
SELECT sharding.create_map('m10', 10, ARRAY['d', 'c', 'b', 'a']);
SELECT sharding.shards_of('m10', 'd') AS d, sharding.shards_of('m10', 'c') AS c,
       sharding.shards_of('m10', 'b') AS b, sharding.shards_of('m10', 'a') AS a;
-- Same rule as worker_shards.
SELECT bool_and(sharding.shards_of('m10', (ARRAY['d', 'c', 'b', 'a'])[w + 1])
                = sharding.worker_shards(w, 4, 10)) AS same_as_worker_shards
  FROM generate_series(0, 3) AS w;
-- More nodes than shards: the last nodes own nothing but become known.
SELECT sharding.create_map('tiny', 2, ARRAY['t1', 't2', 't3']);
SELECT pg_temp.counts('tiny'), sharding.shards_of('tiny', 't3') AS t3_owns;
SELECT node FROM sharding.nodes WHERE node LIKE 't_' ORDER BY node;

-- create_map errors: 42710, 22023; a failed call changes nothing.
SELECT pg_temp.err($$SELECT sharding.create_map('m64', 8, ARRAY['x'])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', 0, ARRAY['x'])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', -5, ARRAY['x'])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', NULL, ARRAY['x'])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', 8, ARRAY[]::text[])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', 8, NULL)$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', 8, ARRAY['x', NULL])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', 8, ARRAY['x', 'y', 'x'])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', 8, ARRAY['x', ''])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('bad', 8, ARRAY[['x'], ['y']])$$);
SELECT pg_temp.err($$SELECT sharding.create_map('', 8, ARRAY['x'])$$);
SELECT pg_temp.err($$SELECT sharding.create_map(NULL, 8, ARRAY['x'])$$);
SELECT count(*) AS maps, (SELECT count(*) FROM sharding.nodes WHERE node IN ('x', 'y')) AS leaked_nodes
  FROM sharding.maps;

-- logical_shard = shard_of(key, logical shards), for every key type.
SELECT bool_and(sharding.logical_shard('m64', 'k' || i) = sharding.shard_of('k' || i, 64)) AS text_ok,
       bool_and(sharding.logical_shard('m64', ('k' || i)::bytea) = sharding.shard_of(('k' || i)::bytea, 64)) AS bytea_ok,
       bool_and(sharding.logical_shard('m64', i::smallint) = sharding.shard_of(i::smallint, 64)) AS int2_ok,
       bool_and(sharding.logical_shard('m64', i) = sharding.shard_of(i, 64)) AS int4_ok,
       bool_and(sharding.logical_shard('m64', i::bigint * 1000003) = sharding.shard_of(i::bigint * 1000003, 64)) AS int8_ok,
       bool_and(sharding.logical_shard('m10', md5(i::text)::uuid) = sharding.shard_of(md5(i::text)::uuid, 10)) AS uuid_ok
  FROM generate_series(1, 3000) AS i;
-- node_for without pins = owner of the logical shard.
SELECT count(*) FILTER (WHERE sharding.node_for('m64', 'k' || i) IS DISTINCT FROM
                              (SELECT node FROM sharding.shards
                                WHERE map = 'm64' AND logical = sharding.shard_of('k' || i, 64))) AS text_mismatch,
       count(*) FILTER (WHERE sharding.node_for('m10', i) IS DISTINCT FROM
                              (SELECT node FROM sharding.shards
                                WHERE map = 'm10' AND logical = sharding.shard_of(i, 10))) AS int_mismatch
  FROM generate_series(1, 3000) AS i;
-- Untyped literal resolves to text; named notation; NULL in, NULL out.
SELECT sharding.node_for('m64', 'abc') = sharding.node_for('m64', 'abc'::text) AS literal_is_text,
       sharding.node_for(map => 'm64', key => 7) = sharding.node_for('m64', 7) AS named,
       sharding.node_for('m64', NULL::text) IS NULL AS null_key,
       sharding.node_for(NULL, 5) IS NULL AS null_map,
       sharding.logical_shard('m64', NULL::uuid) IS NULL AS null_uuid;
-- Unknown map: 42704, for every key type.
SELECT pg_temp.err($$SELECT sharding.node_for('nope', 'k')$$);
SELECT pg_temp.err($$SELECT sharding.node_for('nope', 1::smallint)$$);
SELECT pg_temp.err($$SELECT sharding.logical_shard('nope', 1::bigint)$$);
SELECT pg_temp.err($$SELECT sharding.logical_shard('nope', '\x00'::bytea)$$);
SELECT pg_temp.err($$SELECT sharding.node_for('nope', gen_random_uuid())$$);

-- Pins match on the key's text form, for every key type.
SELECT sharding.pin('m64', '42', 'whale');
SELECT sharding.pin('m64', 'tenant-7', 'whale');
SELECT sharding.pin('m64', '\xdeadbeef', 'bytes');
SELECT sharding.pin('m64', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'uuidnode');
SELECT sharding.pin('m64', '-32768', 'neg');
SELECT sharding.node_for('m64', 42) AS int4, sharding.node_for('m64', 42::smallint) AS int2,
       sharding.node_for('m64', 42::bigint) AS int8, sharding.node_for('m64', '42') AS text,
       sharding.node_for('m64', 'tenant-7') AS tenant, sharding.node_for('m64', '\xdeadbeef'::bytea) AS bytea,
       sharding.node_for('m64', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'::uuid) AS uuid,
       sharding.node_for('m64', (-32768)::smallint) AS int2_min;
-- Pins do not change the logical shard, and only the pinned key moves.
SELECT sharding.logical_shard('m64', 42) = sharding.shard_of(42, 64) AS logical_unchanged,
       sharding.node_for('m64', 43) = (SELECT node FROM sharding.shards
                                        WHERE map = 'm64' AND logical = sharding.shard_of(43, 64)) AS neighbour_unpinned,
       sharding.node_for('m64', '\xdeadbeee'::bytea) <> 'bytes' AS other_bytes_unpinned;
-- bytea pins use hex text even when bytea_output is 'escape'.
SET bytea_output = 'escape';
SELECT sharding.node_for('m64', '\xdeadbeef'::bytea) AS escape_output_still_hex;
RESET bytea_output;
-- Re-pinning replaces; a pin-only node becomes known (dsn NULL).
SELECT sharding.pin('m64', '42', 'whale2');
SELECT sharding.node_for('m64', 42) AS repinned,
       (SELECT count(*) FROM sharding.pins WHERE map = 'm64' AND key = '42') AS pin_rows,
       (SELECT dsn IS NULL FROM sharding.nodes WHERE node = 'whale2') AS known_without_dsn;
-- unpin: true when a pin went, false otherwise.
SELECT sharding.unpin('m64', '42') AS removed, sharding.unpin('m64', '42') AS again,
       sharding.unpin('m64', 'never-pinned') AS never;
SELECT sharding.node_for('m64', 42) = (SELECT node FROM sharding.shards
                                        WHERE map = 'm64' AND logical = sharding.shard_of(42, 64)) AS back_to_owner;
-- Pin errors.
SELECT pg_temp.err($$SELECT sharding.pin('nope', 'k', 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.unpin('nope', 'k')$$);
SELECT pg_temp.err($$SELECT sharding.pin('m64', NULL, 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.pin('m64', 'k', '')$$);
SELECT pg_temp.err($$SELECT sharding.pin('m64', 'k', NULL)$$);

-- A routing cache is per backend and sees changes at once, even ones made
-- inside the current transaction, and forgets them on rollback.
SELECT sharding.node_for('m64', 'cache-key') AS before_pin \gset
BEGIN;
SELECT sharding.pin('m64', 'cache-key', 'inside');
SELECT sharding.node_for('m64', 'cache-key') AS inside_txn;
ROLLBACK;
SELECT sharding.node_for('m64', 'cache-key') = :'before_pin' AS rolled_back;
-- Direct writes by an admin invalidate too (statement triggers).
INSERT INTO sharding.nodes VALUES ('direct') ON CONFLICT DO NOTHING;
UPDATE sharding.shards SET node = 'direct' WHERE map = 'm64' AND logical = sharding.shard_of('cache-key', 64);
SELECT sharding.node_for('m64', 'cache-key') AS after_direct_update;
UPDATE sharding.shards SET node = :'before_pin' WHERE map = 'm64' AND logical = sharding.shard_of('cache-key', 64);
DELETE FROM sharding.nodes WHERE node = 'direct';

-- shards_of: ascending; '{}' for a node owning nothing; 42704 unknown map.
SELECT sharding.shards_of('m64', 'n2') AS n2, sharding.shards_of('m64', 'whale') AS pin_only,
       sharding.shards_of('m64', 'stranger') AS unknown_node;
SELECT pg_temp.err($$SELECT sharding.shards_of('nope', 'n1')$$);

-- epoch and move_shard: new maps start at 1; every move adds 1.
SELECT sharding.epoch('m64', 0) AS e0, sharding.epoch('m64', 63) AS e63;
SELECT sharding.move_shard('m64', 5, 'n4') AS first_move;
SELECT sharding.move_shard('m64', 5, 'n2') AS second_move;
SELECT sharding.move_shard('m64', 5, 'fresh') AS to_unknown_node;
SELECT sharding.epoch('m64', 5) AS e5, sharding.shards_of('m64', 'fresh') AS fresh_owns,
       (SELECT count(*) FROM sharding.nodes WHERE node = 'fresh') AS fresh_known;
-- Moving a shard to its current owner is a no-op returning the current epoch.
SELECT sharding.move_shard('m64', 5, 'fresh') AS noop_move, sharding.epoch('m64', 5) AS e5_unchanged;
-- node_for follows the move.
SELECT count(*) AS keys_on_5, bool_and(sharding.node_for('m64', i) = 'fresh') AS all_to_fresh
  FROM generate_series(1, 2000) AS i WHERE sharding.logical_shard('m64', i) = 5;
SELECT sharding.move_shard('m64', 5, 'n1') AS moved_back;
-- Errors: bad shard 22023, unknown map 42704.
SELECT pg_temp.err($$SELECT sharding.move_shard('m64', 64, 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard('m64', -1, 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard('m64', NULL, 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard('m64', 1, NULL)$$);
SELECT pg_temp.err($$SELECT sharding.move_shard('nope', 0, 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.epoch('m64', 64)$$);
SELECT pg_temp.err($$SELECT sharding.epoch('m64', -1)$$);
SELECT pg_temp.err($$SELECT sharding.epoch('nope', 0)$$);
SELECT sharding.epoch('m64', 5) AS e5_after_errors;

-- fence: passes at the current epoch, 55000 naming both epochs otherwise.
SELECT sharding.fence('m64', 5, 5) AS fence_current;
SELECT pg_temp.err($$SELECT sharding.fence('m64', 5, 3)$$);
SELECT pg_temp.err($$SELECT sharding.fence('m64', 64, 1)$$);
SELECT pg_temp.err($$SELECT sharding.fence('m64', -1, 1)$$);
SELECT pg_temp.err($$SELECT sharding.fence('nope', 0, 1)$$);
SELECT pg_temp.err($$SELECT sharding.fence('m64', 5, NULL)$$);
-- The share lock is held until the transaction ends (a custom advisory tag, field4 = 3).
BEGIN;
SELECT sharding.fence('m64', 5, 5);
SELECT mode, objsubid, objid FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 3 ORDER BY objid;
COMMIT;
SELECT count(*) AS locks_after_commit FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 3;

-- rebalance: 64 over 4 -> add a fifth node: exactly 12 moves, 13/13/13/13/12.
SELECT sharding.create_map('r', 64, ARRAY['a', 'b', 'c', 'd']);
SELECT count(*) AS planned, string_agg(DISTINCT to_node, ',') AS receivers
  FROM sharding.rebalance('r', ARRAY['a', 'b', 'c', 'd', 'e'], dry_run => true);
SELECT pg_temp.counts('r') AS after_dry_run, (SELECT max(epoch) FROM sharding.shards WHERE map = 'r') AS max_epoch;
SELECT * FROM sharding.rebalance('r', ARRAY['a', 'b', 'c', 'd', 'e']);
SELECT pg_temp.counts('r') AS after_add,
       (SELECT count(*) FROM sharding.shards WHERE map = 'r' AND epoch = 2) AS raised_epochs,
       (SELECT count(*) FROM sharding.shards WHERE map = 'r' AND epoch > 2) AS raised_twice;
-- Already balanced: nothing moves.
SELECT count(*) AS moves_when_balanced FROM sharding.rebalance('r', ARRAY['a', 'b', 'c', 'd', 'e']);
-- Same set, other order: still balanced, nothing moves.
SELECT count(*) AS moves_reordered FROM sharding.rebalance('r', ARRAY['e', 'd', 'c', 'b', 'a']);
-- Remove one of five: exactly its shards move, the others receive 3 or 4.
SELECT count(*) AS moves, bool_and(from_node = 'c') AS only_from_removed
  FROM sharding.rebalance('r', ARRAY['a', 'b', 'd', 'e']);
SELECT pg_temp.counts('r') AS after_remove;
-- node_for follows a rebalance.
SELECT count(*) FILTER (WHERE sharding.node_for('r', i) <> (SELECT node FROM sharding.shards
                          WHERE map = 'r' AND logical = sharding.shard_of(i, 64))) AS routing_mismatch
  FROM generate_series(1, 2000) AS i;
-- Replace every node: all shards move.
SELECT count(*) AS all_move FROM sharding.rebalance('r', ARRAY['p', 'q'], true);
-- 480 over 32 -> 33: 14 moves, one from each of 14 nodes to the newcomer;
-- 18 nodes keep 15, 15 nodes (the newcomer included) own 14.
SELECT sharding.create_map('big', 480, (SELECT array_agg('w' || i ORDER BY i) FROM generate_series(1, 32) AS i));
SELECT count(*) AS moves, count(DISTINCT from_node) AS donors, bool_and(to_node = 'w33') AS all_to_new
  FROM sharding.rebalance('big', (SELECT array_agg('w' || i ORDER BY i) FROM generate_series(1, 33) AS i));
SELECT count(*) FILTER (WHERE n = 15) AS owning_15, count(*) FILTER (WHERE n = 14) AS owning_14,
       count(*) AS nodes
  FROM (SELECT node, count(*) AS n FROM sharding.shards WHERE map = 'big' GROUP BY node) AS c;
-- Minimality on an irregular map: moves = shards that cannot stay.
SELECT sharding.create_map('odd', 10, ARRAY['a', 'b']);
SELECT sharding.move_shard('odd', 0, 'b');
SELECT sharding.move_shard('odd', 1, 'b');  -- now a=3, b=7
SELECT count(*) AS moves, string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical) AS plan
  FROM sharding.rebalance('odd', ARRAY['a', 'b', 'c'], true);
-- rebalance errors: nodes like create_map (22023); unknown map 42704.
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('r', ARRAY[]::text[])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('r', ARRAY['a', NULL])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('r', ARRAY['a', 'a'])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('r', NULL)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('r', ARRAY['a'], NULL)$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('nope', ARRAY['a'])$$);
SELECT pg_temp.counts('r') AS unchanged_after_errors;

-- Every change raises map_versions (cluster_version); drop_map keeps the row.
SELECT sharding.create_map('v', 4, ARRAY['a']);
CREATE TEMP TABLE vs (step text, version bigint);
INSERT INTO vs SELECT 'create', version FROM sharding.map_versions WHERE map = 'v';
SELECT sharding.pin('v', 'k', 'b');
INSERT INTO vs SELECT 'pin', version FROM sharding.map_versions WHERE map = 'v';
SELECT sharding.unpin('v', 'k');
INSERT INTO vs SELECT 'unpin', version FROM sharding.map_versions WHERE map = 'v';
SELECT sharding.move_shard('v', 0, 'b');
INSERT INTO vs SELECT 'move', version FROM sharding.map_versions WHERE map = 'v';
SELECT count(*) FROM sharding.rebalance('v', ARRAY['a', 'b']);
INSERT INTO vs SELECT 'rebalance', version FROM sharding.map_versions WHERE map = 'v';
SELECT sharding.drop_map('v');
INSERT INTO vs SELECT 'drop', version FROM sharding.map_versions WHERE map = 'v';
SELECT sharding.create_map('v', 4, ARRAY['a']);
INSERT INTO vs SELECT 'recreate', version FROM sharding.map_versions WHERE map = 'v';
SELECT step, version > lag(version) OVER (ORDER BY ctid) AS rose FROM vs ORDER BY ctid;

-- drop_map removes shards and pins; the name is free again; 42704 after.
SELECT sharding.pin('tiny', 'k', 'pinned');
SELECT sharding.drop_map('tiny');
SELECT (SELECT count(*) FROM sharding.shards WHERE map = 'tiny') AS shards,
       (SELECT count(*) FROM sharding.pins WHERE map = 'tiny') AS pins;
SELECT pg_temp.err($$SELECT sharding.node_for('tiny', 'k')$$);
SELECT pg_temp.err($$SELECT sharding.drop_map('tiny')$$);
SELECT pg_temp.err($$SELECT sharding.drop_map(NULL)$$);
SELECT pg_temp.err($$SELECT sharding.pin(NULL, 'k', 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.unpin('m64', NULL)$$);
SELECT pg_temp.err($$SELECT sharding.move_shard(NULL, 0, 'n1')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance(NULL, ARRAY['a'])$$);

-- map_overview.
SELECT map, node, logical_shards, owned_shards, pinned_keys, max_epoch
  FROM sharding.map_overview WHERE map = 'm64' ORDER BY node;

-- Scale: 4096 logical shards and 100,000 pins route correctly.
SELECT sharding.create_map('huge', 4096, ARRAY['h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'h7']);
INSERT INTO sharding.nodes VALUES ('whales') ON CONFLICT DO NOTHING;
INSERT INTO sharding.pins SELECT 'huge', 'key-' || i, 'whales' FROM generate_series(1, 200000, 2) AS i;
SELECT count(*) FILTER (WHERE sharding.node_for('huge', 'key-' || i) = 'whales') AS pinned_routed,
       count(*) FILTER (WHERE i % 2 = 0 AND sharding.node_for('huge', 'key-' || i) =
                        'h' || (sharding.worker_of(sharding.shard_of('key-' || i, 4096), 7, 4096) + 1)) AS unpinned_routed
  FROM generate_series(1, 20000) AS i;

-- Parallel workers build their own cache.
CREATE TABLE keys AS SELECT 'key-' || i AS k FROM generate_series(1, 30000) AS i;
SELECT count(*) FILTER (WHERE sharding.node_for('huge', k) = 'whales') AS serial_pinned FROM keys \gset
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT count(*) FILTER (WHERE sharding.node_for('huge', k) = 'whales') FROM keys;
SELECT count(*) FILTER (WHERE sharding.node_for('huge', k) = 'whales') = :serial_pinned AS parallel_agrees FROM keys;
RESET ALL;
DROP TABLE keys;

-- Privileges: routing for everyone; changes for sharding_admin (or the owner) only.
CREATE ROLE maps_reader;
CREATE ROLE maps_admin IN ROLE sharding_admin;
SET ROLE maps_reader;
SELECT sharding.node_for('m64', 1) IS NOT NULL AS reader_routes,
       sharding.logical_shard('m64', 1) AS reader_logical,
       sharding.shards_of('m64', 'n1') IS NOT NULL AS reader_shards_of,
       sharding.epoch('m64', 5) AS reader_epoch;
SELECT sharding.fence('m64', 0, 1) AS reader_fences;
SELECT pg_temp.err($$SELECT sharding.create_map('evil', 4, ARRAY['a'])$$);
SELECT pg_temp.err($$SELECT sharding.drop_map('m64')$$);
SELECT pg_temp.err($$SELECT sharding.pin('m64', 'k', 'a')$$);
SELECT pg_temp.err($$SELECT sharding.unpin('m64', 'k')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard('m64', 0, 'a')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('m64', ARRAY['a'])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('m64', ARRAY['a'], true)$$);
SELECT pg_temp.err($$UPDATE sharding.shards SET node = 'n1'$$);
SELECT pg_temp.err($$INSERT INTO sharding.pins VALUES ('m64', 'k', 'n1')$$);
RESET ROLE;
SET ROLE maps_admin;
SELECT sharding.create_map('adm', 4, ARRAY['a', 'b']);
SELECT sharding.pin('adm', 'k', 'c');
SELECT sharding.move_shard('adm', 0, 'b');
SELECT count(*) AS moved FROM sharding.rebalance('adm', ARRAY['a', 'b', 'c']);
SELECT sharding.unpin('adm', 'k');
SELECT sharding.drop_map('adm');
RESET ROLE;
DROP ROLE maps_reader;
DROP ROLE maps_admin;

SELECT sharding.drop_map(map) FROM sharding.maps ORDER BY map;
DROP EXTENSION sharding;
