-- claim_node's worker registry (sharding.claim_node_workers) under row
-- security: every role reads every registration; a role registers worker
-- names as itself and cannot move a name another role registered to another
-- node (directly or through claim_node), which would make that worker's
-- live leases count as the other node's own and break the handoff;
-- sharding_admin may change and delete any row.
CREATE EXTENSION sharding;
CREATE ROLE cnw_team_a;
CREATE ROLE cnw_team_b;
CREATE ROLE cnw_admin IN ROLE sharding_admin;
SELECT sharding.create_queue('cnw_jobs');
GRANT SELECT, UPDATE ON cnw_jobs TO cnw_team_a, cnw_team_b;
SELECT sharding.create_map('cnw', 2, ARRAY['n1', 'n2']);
SELECT sharding.pin('cnw', 'whale', 'n1');
INSERT INTO cnw_jobs (id, key, created)
SELECT g, 'whale', '2026-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, 4) g;

-- Team a's worker w1 claims a whale job through n1 and registers as team a.
SET ROLE cnw_team_a;
SELECT id, key, owner FROM sharding.claim_node(NULL::cnw_jobs, 'cnw', 'n1', 'w1', 1);
SELECT map, worker, node, registered_by FROM sharding.claim_node_workers ORDER BY worker;
RESET ROLE;

-- The whale's pin moves to n2: team b's worker w2 there must leave the
-- whale alone while w1's lease lives.
SELECT sharding.pin('cnw', 'whale', 'n2');
SET ROLE cnw_team_b;
SELECT id, key, owner FROM sharding.claim_node(NULL::cnw_jobs, 'cnw', 'n2', 'w2', 10);
-- Team b reads every registration...
SELECT map, worker, node, registered_by FROM sharding.claim_node_workers ORDER BY worker;
-- ...but cannot move w1 to n2 (which would let w2 take the whale at once):
-- not by UPDATE (no row of its own to update), not by upsert, not by an
-- INSERT naming another role, not through claim_node.
UPDATE sharding.claim_node_workers SET node = 'n2' WHERE map = 'cnw' AND worker = 'w1';
INSERT INTO sharding.claim_node_workers (map, worker, node) VALUES ('cnw', 'w1', 'n2')
    ON CONFLICT (map, worker) DO UPDATE SET node = EXCLUDED.node;
INSERT INTO sharding.claim_node_workers (map, worker, node, registered_by) VALUES ('cnw', 'w9', 'n2', 'cnw_team_a');
SELECT id, key, owner FROM sharding.claim_node(NULL::cnw_jobs, 'cnw', 'n2', 'w1', 10);
DELETE FROM sharding.claim_node_workers WHERE map = 'cnw' AND worker = 'w1';
-- Nothing changed, and w2 still takes nothing of the whale.
SELECT map, worker, node, registered_by FROM sharding.claim_node_workers ORDER BY worker;
SELECT id, key, owner FROM sharding.claim_node(NULL::cnw_jobs, 'cnw', 'n2', 'w2', 10);
SELECT id, owner, status FROM cnw_jobs ORDER BY id;
RESET ROLE;

-- Team a may move its own worker (its leases then count as n2's).
SET ROLE cnw_team_a;
SELECT id, key, owner FROM sharding.claim_node(NULL::cnw_jobs, 'cnw', 'n2', 'w1', 1);
SELECT map, worker, node, registered_by FROM sharding.claim_node_workers ORDER BY worker;
RESET ROLE;

-- sharding_admin may change and delete any registration.
SET ROLE cnw_admin;
UPDATE sharding.claim_node_workers SET node = 'n1' WHERE map = 'cnw' AND worker = 'w2';
DELETE FROM sharding.claim_node_workers WHERE map = 'cnw' AND worker = 'w1';
SELECT map, worker, node, registered_by FROM sharding.claim_node_workers ORDER BY worker;
RESET ROLE;

DELETE FROM sharding.claim_node_workers WHERE map = 'cnw';
SELECT sharding.drop_map('cnw');
DROP TABLE cnw_jobs;
DROP ROLE cnw_team_a;
DROP ROLE cnw_team_b;
DROP ROLE cnw_admin;
DROP EXTENSION sharding;
