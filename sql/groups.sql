-- Worker groups (CONTRACT 15.5, docs/workers.md): join, heartbeat, leave,
-- group_members, the role sharding_worker; redistribution on every change
-- of membership (balanced within one shard, fewest moves, epochs + 1, the
-- generation + 1); every error with its SQLSTATE, changing nothing.
CREATE EXTENSION sharding;
CREATE ROLE grp_w1 IN ROLE sharding_worker;
CREATE ROLE grp_w2 IN ROLE sharding_worker;
CREATE ROLE grp_admin IN ROLE sharding_admin;
CREATE ROLE grp_plain;
-- The SQLSTATE and message of a statement (run as the current role).
CREATE FUNCTION grp_try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
-- Everything a group change may change: owners and epochs, members and
-- their leases, generations, nodes.
CREATE FUNCTION grp_state() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce((SELECT string_agg(map || ':' || logical || ':' || node || ':' || epoch, ',' ORDER BY map, logical)
                           FROM sharding.shards), '')
            || coalesce((SELECT string_agg(map || ':' || worker || ':' || member_role || ':' || lease_expires, ','
                                           ORDER BY map, worker) FROM sharding.worker_members), '')
            || coalesce((SELECT string_agg(map || ':' || generation, ',' ORDER BY map) FROM sharding.worker_groups), '')
            || coalesce((SELECT string_agg(node, ',' ORDER BY node) FROM sharding.nodes), ''))
$$;
GRANT EXECUTE ON FUNCTION grp_try(text), grp_state() TO PUBLIC;
-- Who owns how many shards of a map, and the sum of its epochs.
CREATE FUNCTION grp_owners(m text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(node || '=' || n, ' ' ORDER BY node) || ' epochs=' || sum(e)
      FROM (SELECT node, count(*) AS n, sum(epoch) AS e FROM sharding.shards WHERE map = m GROUP BY node) o
$$;
-- A member's lease made to have expired a moment ago. (A lease of 1 ms
-- expired during the join itself on a loaded machine: the join's own deal
-- reaps it, 0 shards instead of 4; issue 36.) Nothing is told the new
-- expiry, so the next call on the map is what notices it.
CREATE FUNCTION grp_expire(m text, w text) RETURNS integer LANGUAGE sql AS $$
    WITH e AS (UPDATE sharding.worker_members SET lease_expires = clock_timestamp() - interval '1 millisecond'
                WHERE map = m AND worker = w RETURNING 1)
    SELECT count(*)::integer FROM e
$$;

SELECT sharding.create_map('g', 12, ARRAY['seed1', 'seed2']);
SELECT sharding.pin('g', 'whale', 'seed1');
SELECT sharding.node_for('g', 'whale');

-- The first member takes every shard (each raises its epoch); the nodes of
-- create_map own nothing from now on, and a key pinned to one of them
-- routes as if it were not pinned.
SET ROLE grp_w1;
SELECT logical, epoch FROM sharding.join('g', 'w1');
RESET ROLE;
SELECT grp_owners('g');
SELECT sharding.node_for('g', 'whale') = 'w1' AS whale_unpinned;
SELECT map, worker, shards, generation, lease_expires - joined AS lease FROM sharding.group_members;

-- A second member receives floor(12 / 2) = 6 shards: 6 moves.
SET ROLE grp_w2;
SELECT count(*) AS shards, sum(epoch) AS epochs FROM sharding.join('g', 'w2', '1 minute');
SELECT sharding.heartbeat('g', 'w2') AS generation;
RESET ROLE;
SELECT grp_owners('g');
-- A third (joined by an administrator) receives floor(12 / 3) = 4: 4 moves,
-- 2 from each; the others keep the rest.
SET ROLE grp_admin;
SELECT array_agg(logical ORDER BY logical) FROM sharding.join('g', 'w3');
RESET ROLE;
SELECT grp_owners('g');
SELECT worker, shards, generation FROM sharding.group_members ORDER BY worker;
-- Renewing a membership moves nothing: the generation stays.
SET ROLE grp_w1;
SELECT count(*) FROM sharding.join('g', 'w1');
SELECT sharding.heartbeat('g', 'w1') AS generation;
RESET ROLE;

-- A key pinned to a member routes to it.
SELECT sharding.pin('g', 'whale', 'w3');
SELECT sharding.node_for('g', 'whale');

-- Errors: each with its SQLSTATE, changing nothing.
SELECT grp_state() AS before \gset
SET ROLE grp_plain;
SELECT grp_try($$SELECT * FROM sharding.join('g', 'w9')$$);
SELECT grp_try($$SELECT sharding.heartbeat('g', 'w1')$$);
SELECT grp_try($$SELECT sharding.leave('g', 'w1')$$);
SET ROLE grp_w2;
SELECT grp_try($$SELECT sharding.heartbeat('g', 'w1')$$);
SELECT grp_try($$SELECT sharding.leave('g', 'w1')$$);
SELECT grp_try($$SELECT * FROM sharding.join('g', 'w1')$$);
SELECT grp_try($$SELECT * FROM sharding.join('nope', 'w2')$$);
SELECT grp_try($$SELECT sharding.heartbeat('nope', 'w2')$$);
SELECT grp_try($$SELECT sharding.leave('nope', 'w2')$$);
SELECT grp_try($$SELECT * FROM sharding.join('g', 'w2', '0 seconds')$$);
SELECT grp_try($$SELECT * FROM sharding.join('g', 'w2', '-1 second')$$);
SELECT grp_try($$SELECT * FROM sharding.join('g', 'w2', NULL)$$);
SELECT grp_try($$SELECT * FROM sharding.join('g', NULL)$$);
SELECT grp_try($$SELECT * FROM sharding.join('g', '')$$);
SELECT grp_try($$SELECT * FROM sharding.join(NULL, 'w2')$$);
SELECT grp_try($$SELECT sharding.heartbeat('g', 'w9')$$);
RESET ROLE;
SELECT grp_state() = :'before' AS unchanged;
-- The hint of a heartbeat refused.
\set SHOW_CONTEXT never
SET ROLE grp_w2;
SELECT sharding.heartbeat('g', 'w9');
RESET ROLE;
-- A map of databases (nodes with a DSN), a map with distributed tables: 55000.
SELECT sharding.add_node('db1', 'dbname=nowhere');
SELECT sharding.create_map('dbmap', 4, ARRAY['db1']);
SELECT sharding.create_map('tmap', 4, ARRAY['t1']);
CREATE TABLE grp_t (id bigint PRIMARY KEY, k text);
ALTER TABLE grp_t REPLICA IDENTITY FULL;
SELECT sharding.distribute('grp_t', 'k', 'tmap');
SELECT grp_state() AS before \gset
SET ROLE grp_w2;
SELECT grp_try($$SELECT * FROM sharding.join('dbmap', 'w2')$$);
SELECT grp_try($$SELECT * FROM sharding.join('tmap', 'w2')$$);
RESET ROLE;
-- A worker named like a node with a DSN.
SELECT grp_try($$SELECT * FROM sharding.join('g', 'db1')$$);
SELECT grp_state() = :'before' AS unchanged;

-- An administrator may renew another role's member.
SET ROLE grp_admin;
SELECT sharding.heartbeat('g', 'w1') > 0 AS renewed;
RESET ROLE;

-- Leaving: the member's shards go to the others at once (6 and 6: 4
-- moves); the pin to it no longer routes; leaving again is false.
SET ROLE grp_admin;
SELECT sharding.leave('g', 'w3');
SELECT sharding.leave('g', 'w3');
RESET ROLE;
SELECT grp_owners('g');
SELECT sharding.node_for('g', 'whale') = (SELECT node FROM sharding.shards
                                          WHERE map = 'g' AND logical = sharding.logical_shard('g', 'whale')) AS whale_unpinned;
SELECT worker, shards, generation FROM sharding.group_members ORDER BY worker;

-- A lease that expired is noticed at the next call on the map (or by the
-- background worker, the library being preloaded here; TAP 217 tells them
-- apart): w4 joins, takes 4 shards, its lease expires, and it is gone at
-- w1's next heartbeat, whose generation counts that deal too.
SET ROLE grp_w2;
SELECT count(*) FROM sharding.join('g', 'w4', '1 hour');
RESET ROLE;
SELECT grp_expire('g', 'w4');
SELECT count(*) AS live FROM sharding.group_members WHERE worker = 'w4';
SET ROLE grp_w1;
SELECT sharding.heartbeat('g', 'w1') AS generation;
RESET ROLE;
SELECT grp_owners('g');
SELECT count(*) AS rows FROM sharding.worker_members WHERE worker = 'w4';
-- ... and a claim through claim_node notices it too (when nothing did before).
SELECT sharding.create_queue('grp_jobs');
GRANT SELECT, UPDATE ON grp_jobs TO grp_plain;
SET ROLE grp_w2;
SELECT count(*) FROM sharding.join('g', 'w4', '1 hour');
RESET ROLE;
SELECT grp_expire('g', 'w4');
SET ROLE grp_plain;
SELECT count(*) FROM sharding.claim_node(NULL::grp_jobs, 'g', 'w1', 'w1');
RESET ROLE;
SELECT count(*) AS rows FROM sharding.worker_members WHERE worker = 'w4';
SELECT grp_owners('g');

-- A group without a live member keeps its assignment until one joins.
SET ROLE grp_w1;
SELECT sharding.leave('g', 'w1');
RESET ROLE;
SET ROLE grp_w2;
SELECT sharding.leave('g', 'w2');
RESET ROLE;
SELECT grp_owners('g');
SELECT count(*) FROM sharding.group_members;
SET ROLE grp_w2;
SELECT count(*) FROM sharding.join('g', 'w5');
RESET ROLE;
SELECT grp_owners('g');

-- A heartbeat of a member whose lease expired: 55000 (join again).
SET ROLE grp_w2;
SELECT count(*) FROM sharding.join('g', 'w6', '1 hour');
RESET ROLE;
SELECT grp_expire('g', 'w6');
SET ROLE grp_w2;
SELECT grp_try($$SELECT sharding.heartbeat('g', 'w6')$$);
RESET ROLE;

-- Privileges: join, heartbeat and leave are for sharding_worker,
-- sharding_admin and the owner; the view for everybody.
SELECT has_function_privilege('grp_plain', 'sharding._group_apply(text, text, text, interval, oid)', 'EXECUTE');
SELECT has_function_privilege('grp_plain', 'sharding._group_reap()', 'EXECUTE');
SELECT has_table_privilege('grp_w1', 'sharding.worker_members', 'INSERT'),
       has_table_privilege('grp_w1', 'sharding.shards', 'UPDATE');
SET ROLE grp_plain;
SELECT count(*) >= 0 FROM sharding.group_members;
RESET ROLE;

-- Only join, heartbeat and leave go through sharding._group_call for a
-- role that is not the extension's owner: a reap asked by a worker or any
-- other role is refused (42501), changing nothing.
SELECT grp_state() AS before \gset
SET ROLE grp_plain;
SELECT grp_try($$SELECT sharding._group_call('reap', 'g', NULL, NULL)$$);
SELECT grp_try($$SELECT sharding._group_call('reap_all', NULL, NULL, NULL)$$);
RESET ROLE;
SET ROLE grp_w2;
SELECT grp_try($$SELECT sharding._group_call('reap_all', NULL, NULL, NULL)$$);
RESET ROLE;
SELECT grp_state() = :'before' AS unchanged;

-- Leases count from the statement, not from the transaction's start: a
-- join and a heartbeat late in a long transaction start their lease at
-- least as late as the sleeps before them. (Checked on the lease's start,
-- lease_expires - lease, against the transaction's start, now(): a short
-- lease against the clock failed on a loaded machine; issue 36.)
SET ROLE grp_w2;
BEGIN;
SELECT pg_sleep(1.2);
SELECT count(*) >= 0 FROM sharding.join('g', 'w7', '1 hour');
SELECT lease_expires - lease >= now() + interval '1.2 second' AS join_lease_ahead
  FROM sharding.worker_members WHERE worker = 'w7';
SELECT pg_sleep(0.3);
SELECT sharding.heartbeat('g', 'w7') >= 0 AS renewed;
SELECT lease_expires - lease >= now() + interval '1.5 second' AS beat_lease_ahead
  FROM sharding.worker_members WHERE worker = 'w7';
COMMIT;
SELECT sharding.leave('g', 'w7');
RESET ROLE;

-- A change of a member's shards by other means than join and leave
-- (move_shard, rebalance, and the move jobs of rebalance_start and
-- drain_node) raises the group's generation too, once per statement that
-- moved shards; a write that moves nothing leaves it.
SELECT generation AS gen0 FROM sharding.worker_groups WHERE map = 'g' \gset
SELECT min(logical) AS lg FROM sharding.shards WHERE map = 'g' AND node = 'w5' \gset
SET ROLE grp_admin;
SELECT sharding.move_shard('g', :lg, 'seed1') > 0 AS moved;
RESET ROLE;
SELECT generation - :gen0 AS raised FROM sharding.worker_groups WHERE map = 'g';
SET ROLE grp_admin;
SELECT count(*) AS moves FROM sharding.rebalance('g', ARRAY['w5', 'seed1']);
RESET ROLE;
SELECT generation - :gen0 AS raised FROM sharding.worker_groups WHERE map = 'g';
UPDATE sharding.shards SET epoch = epoch WHERE map = 'g';
SELECT generation - :gen0 AS raised FROM sharding.worker_groups WHERE map = 'g';

-- A dropped map takes its group and members with it (also for
-- sharding_admin, as whom drop_map runs).
SET ROLE grp_admin;
SELECT sharding.drop_map('g');
RESET ROLE;
SELECT (SELECT count(*) FROM sharding.worker_groups WHERE map = 'g') AS groups,
       (SELECT count(*) FROM sharding.worker_members WHERE map = 'g') AS members;

DROP EXTENSION sharding CASCADE;
DROP TABLE grp_t, grp_jobs;
DROP FUNCTION grp_try(text), grp_state(), grp_owners(text);
DROP ROLE grp_w1, grp_w2, grp_admin, grp_plain;
