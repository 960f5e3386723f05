-- take_over (docs/nodes.md, "Failover of the coordinator"): its refusals on
-- one database, the identity check every coordinator session meets
-- (_serve), and the pieces take_over compares and copies with.
-- test/tap/660_take_over.pl fails a coordinator over for real.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Not a coordinator: no node was ever attached here (no publication).
SELECT pg_temp.err($$SELECT sharding.take_over()$$);
SELECT pg_temp.err($$SELECT sharding.take_over(force => NULL)$$);
-- A coordinator (it publishes its configuration), but without
-- sharding.coordinator_dsn: the nodes could not subscribe here.
SET client_min_messages = error;
CREATE PUBLICATION sharding_config;
RESET client_min_messages;
SELECT pg_temp.err($$SELECT sharding.take_over()$$);
-- Set, but this test server runs with wal_level = replica.
SET sharding.coordinator_dsn = 'dbname=contrib_regression';
SELECT pg_temp.err($$SELECT sharding.take_over()$$) ~ '^55000: take_over needs wal_level = logical' AS needs_logical;
RESET sharding.coordinator_dsn;
-- A follower is not a coordinator.
SET session_replication_role = replica;
INSERT INTO sharding.local_node (node, coordinator_dsn, following) VALUES ('n1', 'dbname=elsewhere', true);
RESET session_replication_role;
SELECT pg_temp.err($$SELECT sharding.take_over()$$);
-- Nothing was written by any refusal.
SELECT count(*) AS identities FROM sharding.coordinator_identity;

-- _serve: no identity held, every session passes.
SELECT pg_temp.err($$SELECT sharding._serve('')$$);
INSERT INTO sharding.coordinator_identity (token, system_identifier, timeline, coordinator, since)
VALUES ('6f1c3c52-8d5e-4a4b-9a61-0e2a4f0c1d11', '7000000000000000001', 2, 'host=new dbname=coord', '2026-01-01 00:00+00');
-- The same token passes; another one, or none, is refused naming the coordinator.
SELECT pg_temp.err($$SELECT sharding._serve('6f1c3c52-8d5e-4a4b-9a61-0e2a4f0c1d11')$$);
SELECT pg_temp.err($$SELECT sharding._serve('')$$) ~ '^55000: database "contrib_regression" follows coordinator host=new dbname=coord since ' AS refused_none;
SELECT pg_temp.err($$SELECT sharding._serve('00000000-0000-0000-0000-000000000000')$$) ~ '^55000: .* refuses requests from another coordinator$' AS refused_other;

-- Which identity may replace the one held: none held, the same token, a
-- later timeline of the same system; not an earlier or equal timeline, not
-- another system.
SELECT sharding._take_over_successor(NULL, gen_random_uuid(), '1', 1) AS none_held,
       sharding._take_over_successor(to_jsonb(i), i.token, '9', 1) AS same_token,
       sharding._take_over_successor(to_jsonb(i), gen_random_uuid(), i.system_identifier, 3) AS later_timeline,
       sharding._take_over_successor(to_jsonb(i), gen_random_uuid(), i.system_identifier, 2) AS same_timeline,
       sharding._take_over_successor(to_jsonb(i), gen_random_uuid(), i.system_identifier, 1) AS earlier_timeline,
       sharding._take_over_successor(to_jsonb(i), gen_random_uuid(), '42', 3) AS other_system
  FROM sharding.coordinator_identity AS i;
-- _take_over_accept on a node refuses the old coordinator (its timeline is
-- not later) and changes nothing; force overrides.
SELECT pg_temp.err($$SELECT sharding._take_over_accept('n1', gen_random_uuid(), '7000000000000000001', 1, 'host=old dbname=coord', false)$$);
SELECT pg_temp.err($$SELECT sharding._take_over_accept('n2', gen_random_uuid(), '7000000000000000001', 3, 'host=x', false)$$);
SELECT coordinator, timeline FROM sharding.coordinator_identity;
SELECT sharding._take_over_accept('n1', '11111111-2222-3333-4444-555555555555', '7000000000000000001', 3,
                                  'host=newer password=secret dbname=coord', false);
SELECT token, timeline, coordinator FROM sharding.coordinator_identity;

-- _take_over_ahead: what a node's copy holds that this server lacks.
SELECT sharding._take_over_ahead(o, t) FROM (VALUES
    ('{"versions": {"m": 5}, "epochs": {"m/0": 2}, "nodes": ["a"], "tables": {}}'::jsonb,
     '{"versions": {"m": 5}, "epochs": {"m/0": 2}, "nodes": ["a"], "tables": {}}'::jsonb),
    ('{"versions": {"m": 5}, "epochs": {"m/0": 2}, "nodes": ["a"], "tables": {}}',
     '{"versions": {"m": 4}, "epochs": {"m/0": 1}, "nodes": [], "tables": {}}'),
    ('{"versions": {"m": 5}, "epochs": {"m/0": 2}, "nodes": ["a"], "tables": {}}',
     '{"versions": {"m": 6}, "epochs": {"m/0": 2}, "nodes": ["a"], "tables": {}}'),
    ('{"versions": {"m": 5}, "epochs": {"m/0": 2}, "nodes": ["a"], "tables": {}}',
     '{"versions": {"m": 5, "w": 7}, "epochs": {"m/0": 2}, "nodes": ["a"], "tables": {}}'),
    ('{"versions": {"m": 5}, "epochs": {"m/10": 2}, "nodes": ["a"], "tables": {}}',
     '{"versions": {"m": 5}, "epochs": {"m/10": 3}, "nodes": ["a"], "tables": {}}'),
    ('{"versions": {"m": 5}, "epochs": {}, "nodes": ["a"], "tables": {}}',
     '{"versions": {"m": 5}, "epochs": {}, "nodes": ["a", "b"], "tables": {}}'),
    ('{"versions": {"m": 5}, "epochs": {}, "nodes": [], "tables": {}}',
     '{"versions": {"m": 5}, "epochs": {}, "nodes": [], "tables": {"public.t": "m"}}')) AS c(o, t);

-- _take_over_sync on the follower n1: its copy becomes the given one in
-- one transaction (rows that differ replaced, missing ones added, others
-- gone), its coordinator's DSN kept without the password.
SET session_replication_role = replica;
INSERT INTO sharding.nodes VALUES ('a', 'dbname=a'), ('b', 'dbname=b'), ('gone', NULL);
INSERT INTO sharding.maps VALUES ('m', 2, '2026-01-01 00:00+00');
INSERT INTO sharding.shards VALUES ('m', 0, 'a', 1), ('m', 1, 'a', 1);
INSERT INTO sharding.pins VALUES ('m', 'whale', 'a'), ('m', 'stale', 'a');
INSERT INTO sharding.map_versions VALUES ('m', 3);
RESET session_replication_role;
SELECT sharding._take_over_sync('n1', 'host=newer password=secret dbname=coord', jsonb_build_object(
    'nodes', '[{"node": "a", "dsn": "dbname=a"}, {"node": "b", "dsn": "dbname=b2"}]'::jsonb,
    'maps', '[{"map": "m", "logical_shards": 2, "created": "2026-01-01T00:00:00+00:00"}]'::jsonb,
    'shards', '[{"map": "m", "logical": 0, "node": "a", "epoch": 1}, {"map": "m", "logical": 1, "node": "b", "epoch": 2}]'::jsonb,
    'pins', '[{"map": "m", "key": "whale", "node": "b"}, {"map": "m", "key": "new", "node": "a"}]'::jsonb,
    'map_versions', '[{"map": "m", "version": 9}]'::jsonb)) AS changed_rows;
SELECT * FROM sharding.nodes ORDER BY node;
SELECT * FROM sharding.shards ORDER BY logical;
SELECT * FROM sharding.pins ORDER BY key;
SELECT * FROM sharding.map_versions;
SELECT sharding.node_for('m', 'whale') AS whale, sharding.node_for('m', 'new') AS new_pin;
SELECT coordinator_dsn FROM sharding.local_node;
-- Repeating changes nothing.
SELECT sharding._take_over_sync('n1', 'host=newer password=secret dbname=coord', sharding._config_json()) AS changed_again;
-- The follower still refuses direct configuration changes.
SELECT pg_temp.err($$SELECT sharding.pin('m', 'x', 'a')$$) ~ '^55000' AS still_refused;
-- Not the node named: refused.
SELECT pg_temp.err($$SELECT sharding._take_over_sync('n2', 'dbname=x', '{}')$$);
DROP PUBLICATION sharding_config;
