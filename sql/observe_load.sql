-- rebalance_by_load (docs/observe.md): load-aware moves, fewest first.
CREATE EXTENSION sharding;

-- The whale story: 64 shards over 4 nodes; shard 5 carries 40% of the load,
-- the other 63 share the rest. 1.10 x the mean (25%) cannot be met: the
-- whale alone is 40%. The best there is: the whale's node keeps only the
-- whale, its 15 neighbours move to the other three nodes.
SELECT sharding.create_map('load_m', 64, ARRAY['n1', 'n2', 'n3', 'n4']);
CREATE TEMP TABLE whale_loads AS
SELECT array_agg(CASE WHEN l = 5 THEN 40.0 ELSE 60.0 / 63 END ORDER BY l)::float8[] AS loads
  FROM generate_series(0, 63) AS l;
-- dry_run: reports, changes nothing.
SELECT count(*) AS moves, count(*) FILTER (WHERE from_node = 'n1') AS from_whale_node,
       bool_or(logical = 5) AS whale_moves
  FROM sharding.rebalance_by_load('load_m', ARRAY['n1', 'n2', 'n3', 'n4'], (SELECT loads FROM whale_loads),
                                  dry_run => true);
SELECT count(*) FILTER (WHERE epoch > 1) AS raised_epochs, count(*) FILTER (WHERE node = 'n1') AS on_n1
  FROM sharding.shards WHERE map = 'load_m';
-- For real: the same plan; each moved shard's epoch rises by one.
SELECT string_agg(to_node, ',' ORDER BY logical) AS receivers, count(*) AS moves,
       min(logical) AS first, max(logical) AS last
  FROM sharding.rebalance_by_load('load_m', ARRAY['n1', 'n2', 'n3', 'n4'], (SELECT loads FROM whale_loads));
SELECT node, count(*) AS shards, round(sum(w.loads[logical + 1])::numeric, 2) AS load,
       min(epoch) AS min_epoch, max(epoch) AS max_epoch
  FROM sharding.shards, whale_loads AS w WHERE map = 'load_m' GROUP BY node ORDER BY node;
SELECT sharding.node_for('load_m', 'x') IS NOT NULL AS routes;
-- Now within the best the shards allow: no move.
SELECT count(*) AS moves
  FROM sharding.rebalance_by_load('load_m', ARRAY['n1', 'n2', 'n3', 'n4'], (SELECT loads FROM whale_loads));

-- Even loads, a fifth node: 1.10 x 12.8 allows 14 shards a node; each of
-- the four sheds two. imbalance() confirms.
SELECT sharding.create_map('load_e', 64, ARRAY['n1', 'n2', 'n3', 'n4']);
SELECT count(*) AS moves, count(DISTINCT from_node) AS givers, min(to_node) AS receiver
  FROM sharding.rebalance_by_load('load_e', ARRAY['n1', 'n2', 'n3', 'n4', 'n5'],
                                  array_fill(1.0::float8, ARRAY[64]));
SELECT sharding.imbalance(array_agg(n)) <= 1.10 AS within
  FROM (SELECT count(*) AS n FROM sharding.shards WHERE map = 'load_e' GROUP BY node) AS c;
-- A map already within max_imbalance gets no move.
SELECT count(*) AS moves
  FROM sharding.rebalance_by_load('load_e', ARRAY['n1', 'n2', 'n3', 'n4', 'n5'],
                                  array_fill(1.0::float8, ARRAY[64]));
-- Draining a node moves exactly its shards, to the lightest nodes.
SELECT count(*) AS moves, bool_and(from_node = 'n5') AS all_from_n5
  FROM sharding.rebalance_by_load('load_e', ARRAY['n1', 'n2', 'n3', 'n4'], array_fill(1.0::float8, ARRAY[64]));
SELECT count(*) AS n5_shards FROM sharding.shards WHERE map = 'load_e' AND node = 'n5';

-- Small map, checked by hand: 4 shards over a, b with loads 5, 1, 1, 5.
-- a holds 0, 1 (6), b holds 2, 3 (6): within 1.10 already.
SELECT sharding.create_map('load_s', 4, ARRAY['a', 'b']);
SELECT count(*) AS moves FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[5, 1, 1, 5]::float8[]);
-- Loads 5, 5, 1, 1: a carries 10 of 12, the target is 1.10 x 6 = 6.6. One
-- move gives 5 | 7 at best; two (a shard each way) give 6 | 6.
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[5, 5, 1, 1]::float8[], dry_run => true);
-- A looser target (1.20 x 6 = 7.2): one move is enough.
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[5, 5, 1, 1]::float8[], 1.20, true);

-- Errors (22023): wrong length, NULL, negative, NaN, infinite loads; bad
-- max_imbalance; bad nodes; NULL dry_run. Unknown map: 42704. Nothing moves.
\set VERBOSITY sqlstate
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, 1, 1, 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], NULL);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, NULL, 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, -1, 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, 'NaN', 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, 'Infinity', 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[[1, 1], [1, 1]]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[5, 5, 1, 1]::float8[], 0.9);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[5, 5, 1, 1]::float8[], NULL);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'a'], ARRAY[5, 5, 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY[]::text[], ARRAY[5, 5, 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[5, 5, 1, 1]::float8[], 1.1, NULL);
SELECT * FROM sharding.rebalance_by_load('nope', ARRAY['a', 'b'], ARRAY[5, 5, 1, 1]::float8[]);
\set VERBOSITY default
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, -1, 1, 1]::float8[]);
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[1, 1, 1]::float8[]);
SELECT string_agg(node || ':' || epoch, ',' ORDER BY logical) AS unchanged FROM sharding.shards WHERE map = 'load_s';

-- A database map (its nodes have DSNs): a node without one is refused
-- (55000), naming it; nothing moves.
SELECT sharding.add_node('a', 'host=127.0.0.1 dbname=a');
SELECT sharding.add_node('b', 'host=127.0.0.1 dbname=b');
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b', 'nodsn'], ARRAY[5, 5, 1, 1]::float8[]);
SELECT string_agg(node || ':' || epoch, ',' ORDER BY logical) AS unchanged FROM sharding.shards WHERE map = 'load_s';

-- Only the owner and sharding_admin may move shards.
CREATE ROLE load_user;
SET ROLE load_user;
SELECT * FROM sharding.rebalance_by_load('load_s', ARRAY['a', 'b'], ARRAY[5, 5, 1, 1]::float8[]);
RESET ROLE;
DROP ROLE load_user;

SELECT sharding.drop_map('load_m');
SELECT sharding.drop_map('load_e');
SELECT sharding.drop_map('load_s');
SELECT sharding.drop_node(n) FROM unnest(ARRAY['n1', 'n2', 'n3', 'n4', 'n5', 'a', 'b']) AS n;
DROP EXTENSION sharding;
