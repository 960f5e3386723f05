-- The observing scenes of the demo (docs/observe.md), run by
-- demo/run.sh after demo/demo.sql, on a cluster that preloads sharding.
\pset footer off
\set QUIET on
\set ON_ERROR_STOP on
SET client_min_messages = warning;
DROP TABLE IF EXISTS obs_orders, obs_jobs CASCADE;
CREATE EXTENSION IF NOT EXISTS sharding;

\echo
\echo '======================================================================'
\echo ' 5. Counting fan-out: queries that must ask every shard'
\echo '======================================================================'
\echo 'orders is distributed by tenant over a 16-shard map. A query naming its'
\echo 'tenant goes to one shard; one that does not must ask them all.'
SELECT sharding.create_map('obs', 16, ARRAY['db1', 'db2', 'db3', 'db4']) AS ok \gset
CREATE TABLE obs_orders (id bigint PRIMARY KEY, tenant text NOT NULL, total numeric NOT NULL);
ALTER TABLE obs_orders REPLICA IDENTITY FULL;
INSERT INTO obs_orders SELECT i, 't' || lpad((i % 40 + 1)::text, 3, '0'), i % 100 FROM generate_series(1, 4000) AS i;
SELECT sharding.distribute('obs_orders', 'tenant', 'obs') AS ok \gset
SELECT sharding.fanout_reset() AS ok \gset
SELECT sum(total) AS "t007's revenue" FROM obs_orders WHERE tenant = 't007';
SELECT count(*) AS "orders of t001 and t002" FROM obs_orders WHERE tenant IN ('t001', 't002');
SELECT count(*) AS "orders over 90, all tenants" FROM obs_orders WHERE total > 90;
\echo 'sharding.fanout_stats counted them (in shared memory, for every session):'
SELECT table_name, queries, single_shard, fan_out FROM sharding.fanout_stats WHERE table_name = 'obs_orders';
\echo '(t001 and t002 lie on different shards, so that IN list fanned out too.)'

\echo
\echo '======================================================================'
\echo ' 6. The worst shard, not the average'
\echo '======================================================================'
\echo 'A queue spread over 8 shards. Most shards keep up; shard 3 does not.'
SELECT sharding.create_queue('obs_jobs') AS ok \gset
INSERT INTO obs_jobs (key, created, run_at)
SELECT k, t, t
  FROM (SELECT k, now() - make_interval(secs => CASE WHEN sharding.shard_of(k, 8) = 3 THEN 1800 ELSE 20 END * random()) AS t
          FROM (SELECT 'customer-' || i AS k FROM generate_series(1, 400) AS i) AS keys) AS jobs;
SELECT round(avg(EXTRACT(epoch FROM now() - created))) AS "average wait (s)" FROM obs_jobs;
\echo 'The average looks fine. sharding.shard_lag shows each shard:'
SELECT shard, pending, date_trunc('second', oldest_pending_age) AS oldest_wait, bar
  FROM sharding.shard_lag('obs_jobs', 8);

\echo
\echo '======================================================================'
\echo ' 7. Rebalancing by load, not by shard count'
\echo '======================================================================'
\echo 'A map of worker queues (no table distributed on it: the moves below are'
\echo 'owner switches; moving rows between databases is scene 8). Measured load'
\echo 'per logical shard (say, jobs per second): shard 5 is a whale carrying 40%'
\echo 'of everything. Counting shards says the map is balanced (4 each); the'
\echo 'loads say db2 is drowning.'
SELECT sharding.create_map('obs_workers', 16, ARRAY['db1', 'db2', 'db3', 'db4']) AS ok \gset
CREATE TEMP TABLE obs_load AS
SELECT array_agg(CASE WHEN l = 5 THEN 200.0 ELSE 20.0 END ORDER BY l)::float8[] AS loads
  FROM generate_series(0, 15) AS l;
SELECT s.node, count(*) AS shards, sum(o.loads[s.logical + 1]) AS load
  FROM sharding.shards AS s, obs_load AS o WHERE s.map = 'obs_workers' GROUP BY s.node ORDER BY s.node;
\echo 'sharding.rebalance_by_load moves the whale''s neighbours away, and'
\echo 'leaves the whale alone on its node (it cannot be split):'
SELECT * FROM sharding.rebalance_by_load('obs_workers', ARRAY['db1', 'db2', 'db3', 'db4'], (SELECT loads FROM obs_load));
SELECT s.node, count(*) AS shards, sum(o.loads[s.logical + 1]) AS load, max(s.epoch) AS max_epoch
  FROM sharding.shards AS s, obs_load AS o WHERE s.map = 'obs_workers' GROUP BY s.node ORDER BY s.node;

DROP TABLE obs_orders, obs_jobs;
SELECT sharding.drop_map('obs') AS ok \gset
SELECT sharding.drop_map('obs_workers') AS ok \gset
