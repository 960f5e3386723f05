-- The sharding demo, narrated. Run through demo/run.sh (bash demo/run.sh),
-- which starts a throwaway cluster and exports PGHOST/PGPORT for psql and
-- for demo/workers.sh (section 3).
\pset footer off
\set QUIET on
\set ON_ERROR_STOP on
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS sharding CASCADE;
DROP TABLE IF EXISTS units, jobs, job_log, orders, inbox, message_log, key_sample CASCADE;
CREATE EXTENSION sharding;

-- Runs a statement and says whether it was accepted or refused (and why).
CREATE FUNCTION pg_temp.attempt(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'accepted';
EXCEPTION WHEN OTHERS THEN
    RETURN 'refused: ' || SQLSTATE || ' ' || SQLERRM;
END $$;

\echo
\echo '======================================================================'
\echo ' 1. One whale among forty tenants'
\echo '======================================================================'
\echo 'A SaaS has 40 tenants, t001 .. t040, each producing 10 units of load,'
\echo 'except t007, an enterprise customer producing 400. We have 4 shards.'
\echo 'One row per unit of load:'
CREATE TABLE units (tenant text NOT NULL, tenant_no integer NOT NULL);
INSERT INTO units
SELECT 't' || lpad(t::text, 3, '0'), t
  FROM generate_series(1, 40) AS t, generate_series(1, CASE WHEN t = 7 THEN 400 ELSE 10 END);
SELECT count(DISTINCT tenant) AS tenants, count(*) AS "units of load" FROM units;

\echo
\echo '1a. HASH placement: shard = shard_of(tenant, 4), XXH3 of the tenant name.'
\echo '    sharding.distribution(table, key column, shards) reads the table once:'
SELECT shard, rows AS units, round(share::numeric, 3) AS share, bar
  FROM sharding.distribution('units', 'tenant', 4);

\echo
\echo '1b. RANGE placement: t001-t010 on shard 0, t011-t020 on shard 1, ...'
SELECT s AS shard, count(u.tenant) AS units,
       round(count(u.tenant) / sum(count(u.tenant)) OVER (), 3) AS share,
       sharding.bar(count(u.tenant), max(count(u.tenant)) OVER ()) AS bar
  FROM generate_series(0, 3) AS s
  LEFT JOIN units AS u ON least(u.tenant_no * 4 / 41, 3) = s
 GROUP BY s ORDER BY s;

\echo
\echo '1c. DIRECTORY placement: a lookup table pins the whale t007 to shard 3 of its'
\echo '    own; every other tenant is hashed over the remaining shards 0..2.'
CREATE TEMP VIEW directory_placement AS
SELECT u.tenant, CASE WHEN u.tenant = 't007' THEN 3 ELSE sharding.shard_of(u.tenant, 3) END AS shard
  FROM units AS u;
SELECT s AS shard, count(d.tenant) AS units,
       round(count(d.tenant) / sum(count(d.tenant)) OVER (), 3) AS share,
       sharding.bar(count(d.tenant), max(count(d.tenant)) OVER ()) AS bar
  FROM generate_series(0, 3) AS s LEFT JOIN directory_placement AS d ON d.shard = s
 GROUP BY s ORDER BY s;

\echo
\echo 'Side by side. imbalance = largest shard / average shard (1.00 is perfectly even);'
\echo '"neighbours" = other tenants on the whale''s shard, who suffer when it is busy.'
WITH placed AS (
    SELECT 'hash' AS placement, 1 AS o, tenant, sharding.shard_of(tenant, 4) AS shard FROM units
    UNION ALL
    SELECT 'range', 2, tenant, least(tenant_no * 4 / 41, 3) FROM units
    UNION ALL
    SELECT 'directory', 3, tenant, shard FROM directory_placement
), per_shard AS (
    SELECT k.placement, k.o, s, count(p.tenant) AS units
      FROM (SELECT DISTINCT placement, o FROM placed) AS k CROSS JOIN generate_series(0, 3) AS s
      LEFT JOIN placed AS p ON p.placement = k.placement AND p.shard = s
     GROUP BY k.placement, k.o, s
)
SELECT ps.placement, array_agg(ps.units ORDER BY ps.s) AS "units per shard",
       round(sharding.imbalance(array_agg(ps.units))::numeric, 2) AS imbalance,
       (SELECT count(DISTINCT p.tenant) FROM placed AS p
         WHERE p.placement = ps.placement AND p.tenant <> 't007'
           AND p.shard = (SELECT w.shard FROM placed AS w
                           WHERE w.placement = ps.placement AND w.tenant = 't007' LIMIT 1))
         AS neighbours
  FROM per_shard AS ps GROUP BY ps.placement, ps.o ORDER BY ps.o;

\echo
\echo 'Directory placement is still uneven (the whale alone is half of all load), but'
\echo 'no other tenant shares its shard, and that shard can get a bigger machine.'
\echo
\echo 'Averages hide the shard on fire. sharding.whales names the keys that make it:'
\echo 'tenants holding at least half of their shard''s rows (hash placement, 4 shards).'
SELECT key AS tenant, rows AS units, shard, round(share_of_shard::numeric, 2) AS "share of shard",
       round(share_of_total::numeric, 2) AS "share of all"
  FROM sharding.whales('units', 'tenant', 4, min_share => 0.5);
\echo 'More shards do not help: the whale is one key, so it always lands on one shard.'
SELECT n AS shards, (SELECT max(rows) FROM sharding.distribution('units', 'tenant', n)) AS "largest shard",
       (SELECT round(sharding.imbalance(array_agg(rows))::numeric, 2)
          FROM sharding.distribution('units', 'tenant', n)) AS imbalance
  FROM unnest(ARRAY[4, 8, 16]) AS n;

\echo
\echo 'The directory, for real: a map of 3 logical shards over databases db0..db2,'
\echo 'and sharding.pin sends t007 to dedicated capacity (db-whale, which owns no shard).'
\echo 'sharding.map_load shows where node_for routes every row:'
SELECT sharding.create_map('tenants', 3, ARRAY['db0', 'db1', 'db2']) AS ok \gset
SELECT sharding.pin('tenants', 't007', 'db-whale') AS ok \gset
SELECT node, logical_shards AS "logical shards", pinned_keys AS "pinned keys", rows AS units,
       round(share::numeric, 3) AS share, bar
  FROM sharding.map_load('tenants', 'units', 'tenant');
SELECT sharding.node_for('tenants', 't007') AS "t007 goes to", sharding.node_for('tenants', 't001') AS "t001 goes to";

\echo
\echo '======================================================================'
\echo ' 2. Sixty-four logical shards, and a fifth worker joins'
\echo '======================================================================'
\echo 'The number of logical shards never changes: a key''s logical shard is fixed'
\echo 'forever. Only the owner of each logical shard changes.'
SELECT sharding.create_map('workers', 64, ARRAY['w1', 'w2', 'w3', 'w4']) AS ok \gset
\echo 'Workers w1..w4 join the map''s worker group (sharding.join, with a lease each'
\echo 'renews by sharding.heartbeat); every join deals the shards again, fewest moves:'
SELECT count(*) AS ok FROM sharding.join('workers', 'w1', '1 hour') \gset
SELECT count(*) AS ok FROM sharding.join('workers', 'w2', '1 hour') \gset
SELECT count(*) AS ok FROM sharding.join('workers', 'w3', '1 hour') \gset
SELECT count(*) AS ok FROM sharding.join('workers', 'w4', '1 hour') \gset
SELECT worker, shards AS "logical shards owned", generation FROM sharding.group_members
 WHERE map = 'workers' ORDER BY worker;
\echo 'Where 10,000 customer keys live before the change:'
CREATE TABLE key_sample AS
SELECT 'customer-' || i AS key, sharding.logical_shard('workers', 'customer-' || i) AS shard_before,
       sharding.node_for('workers', 'customer-' || i) AS node_before
  FROM generate_series(1, 10000) AS i;
SELECT node_before AS worker, count(*) AS keys FROM key_sample GROUP BY 1 ORDER BY 1;
CREATE TEMP TABLE owners_before AS SELECT logical, node, epoch FROM sharding.shards WHERE map = 'workers';
\echo
\echo 'w5 calls sharding.join. The group deals again: the fewest logical shards move'
\echo '(64 over 5 = 13,13,13,13,12), each moved shard''s epoch raised, the generation too:'
SELECT count(*) AS "logical shards w5 received" FROM sharding.join('workers', 'w5', '1 hour');
CREATE TEMP TABLE moves AS
SELECT b.logical, b.node AS from_node, s.node AS to_node, b.epoch AS old_epoch, s.epoch AS new_epoch
  FROM owners_before AS b JOIN sharding.shards AS s ON s.map = 'workers' AND s.logical = b.logical
 WHERE s.node <> b.node;
SELECT from_node AS "from", to_node AS "to", count(*) AS "logical shards moved",
       array_agg(logical ORDER BY logical) AS which
  FROM moves GROUP BY 1, 2 ORDER BY 1, 2;
SELECT (SELECT count(*) FROM moves) AS "logical shards that changed owner",
       count(*) FILTER (WHERE sharding.logical_shard('workers', key) <> shard_before)
         AS "keys that changed logical shard",
       count(*) FILTER (WHERE sharding.node_for('workers', key) <> node_before)
         AS "keys now served by another worker",
       (SELECT sharding.heartbeat('workers', 'w1')) AS "generation (w1's heartbeat)"
  FROM key_sample;
\echo 'Only the keys on the 12 moved shards (about 12/64 of them) are now served by'
\echo 'w5; every key kept its logical shard, so per-shard state moves as a whole.'
SELECT worker, shards AS "logical shards owned" FROM sharding.group_members
 WHERE map = 'workers' ORDER BY worker;
SELECT count(*) FILTER (WHERE sharding.worker_of(s, 4, 64) <> sharding.worker_of(s, 5, 64))
         AS "for comparison: re-dealing contiguous ranges would move"
  FROM generate_series(0, 63) AS s;
\echo 'A writer on the old owner that read the old epoch before the move calls'
\echo 'sharding.fence inside its transaction before writing; it is refused, so two'
\echo 'workers never both act as owner of a moved shard:'
SELECT logical AS moved, old_epoch, new_epoch FROM moves ORDER BY logical LIMIT 1 \gset
SELECT :moved AS "logical shard",
       pg_temp.attempt(format('SELECT sharding.fence(%L, %s, %s)', 'workers', :moved, :old_epoch))
         AS "fence with the old epoch (old owner)",
       pg_temp.attempt(format('SELECT sharding.fence(%L, %s, %s)', 'workers', :moved, :new_epoch))
         AS "fence with the new epoch (new owner)";
\echo
\echo 'w3 dies: it renewed its lease for 1 second, then never again. Nobody calls'
\echo 'rebalance: once the lease has run out, its shards are dealt to the live'
\echo 'workers (by the background worker within a second, or by the next call on the'
\echo 'map, here w1''s heartbeat two seconds later):'
SELECT count(*) AS ok FROM sharding.join('workers', 'w3', '1 second') \gset
SELECT count(*) AS "shards w3 held when it died" FROM sharding.shards WHERE map = 'workers' AND node = 'w3';
SELECT pg_sleep(2) AS ok \gset
SELECT sharding.heartbeat('workers', 'w1') AS "generation (w1's heartbeat)";
SELECT worker, shards AS "logical shards owned" FROM sharding.group_members
 WHERE map = 'workers' ORDER BY worker;

\echo
\echo '======================================================================'
\echo ' 3. Four workers claim jobs with FOR UPDATE SKIP LOCKED; one dies'
\echo '======================================================================'
\echo 'A queue of 200 jobs. Workers w1..w4 each loop: claim up to 5 jobs with a'
\echo '3-second lease (sharding.claim), do them, mark them done (sharding.complete).'
\echo 'w4 claims its first batch and hangs; we kill its backend mid-lease.'
SELECT sharding.create_queue('jobs') AS ok \gset
INSERT INTO jobs (key, payload, status, created)
SELECT 'order-' || i, jsonb_build_object('order', i), 'pending', clock_timestamp()
  FROM generate_series(1, 200) AS i;
-- Each completion a worker's complete() accepted, to prove nothing ran twice.
CREATE TABLE job_log (id bigint, worker text, attempt integer, at timestamptz DEFAULT clock_timestamp());
\! bash demo/workers.sh
\echo
\echo 'Jobs completed per worker:'
SELECT worker, count(*) AS jobs, sharding.bar(count(*), max(count(*)) OVER (), 30) AS bar
  FROM job_log GROUP BY worker ORDER BY worker;
\echo 'The dead worker''s jobs: its lease expired and the others claimed them again'
\echo '(attempt 2):'
SELECT l.worker AS "completed by", count(*) AS jobs, min(l.attempt) AS attempt
  FROM job_log AS l WHERE l.attempt > 1 GROUP BY 1 ORDER BY 1;
SELECT (SELECT count(*) FROM jobs WHERE status = 'done') AS "jobs done",
       count(*) AS completions, count(DISTINCT id) AS "distinct jobs",
       count(*) - count(DISTINCT id) AS "done twice"
  FROM job_log;
\echo 'If w4 came back to life and reported a job of its old lease, it would be'
\echo 'refused: that job was claimed again (attempt 2, the fencing token), so'
\echo 'complete(..., worker => w4, attempt => 1) no longer matches it:'
SELECT sharding.complete('jobs', (SELECT min(id) FROM job_log WHERE attempt > 1), 'w4', 1)
       AS "late complete accepted?";

\echo
\echo '======================================================================'
\echo ' 4. The late "shipped" after "delivered"'
\echo '======================================================================'
\echo 'Order status only moves forward: preparing -> shipped -> delivered.'
\echo 'sharding.guard_rank makes the table itself refuse to move it backwards.'
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL);
INSERT INTO orders VALUES (1001, 'preparing'), (1002, 'preparing');
SELECT sharding.guard_rank('orders', 'status', ARRAY['preparing', 'shipped', 'delivered']) AS ok \gset
\echo 'Messages arrive out of order: for 1002, "shipped" was processed by a slow'
\echo 'worker after "delivered". Each message applied with sharding.advance:'
CREATE TABLE inbox (seq integer PRIMARY KEY, order_id bigint, status text);
INSERT INTO inbox VALUES (1, 1001, 'shipped'), (2, 1002, 'shipped'), (3, 1001, 'delivered'),
                         (4, 1002, 'delivered'), (5, 1002, 'shipped');
CREATE TABLE message_log (seq integer, applied boolean);
DO $$
DECLARE m record;
BEGIN
    FOR m IN SELECT * FROM inbox ORDER BY seq LOOP
        INSERT INTO message_log
        VALUES (m.seq, sharding.advance('orders', m.order_id, m.status));
    END LOOP;
END $$;
SELECT i.seq AS arrival, i.order_id AS "order", i.status AS message,
       CASE WHEN l.applied THEN 'applied' ELSE 'refused: would go backwards' END AS outcome
  FROM inbox AS i JOIN message_log AS l USING (seq) ORDER BY i.seq;
\echo 'Even a plain UPDATE from any code path is skipped by the guard:'
WITH u AS (UPDATE orders SET status = 'shipped' WHERE id = 1002 RETURNING id)
SELECT count(*) AS "rows the late UPDATE changed" FROM u;
SELECT id AS "order", status FROM orders ORDER BY id;

DROP TABLE IF EXISTS units, jobs, job_log, orders, inbox, message_log, key_sample CASCADE;
DROP EXTENSION sharding CASCADE;
