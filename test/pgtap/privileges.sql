-- Privileges (docs/maps.md, docs/nodes.md, docs/rank.md: "Privileges"): routing and hashing for every role; changing maps,
-- pins, nodes and rank guards only for the extension's owner or members of
-- sharding_admin (42501 otherwise); no direct writes to the config tables by
-- plain roles; claim and complete obey the caller's privileges on the queue.
\set QUIET on
BEGIN;
SELECT plan(62);

CREATE ROLE priv_plain NOLOGIN;
CREATE ROLE priv_admin NOLOGIN IN ROLE sharding_admin;
GRANT USAGE, CREATE ON SCHEMA public TO priv_plain, priv_admin;

SELECT sharding.create_map('priv_map', 8, ARRAY['a', 'b']);
SELECT sharding.pin('priv_map', 'whale', 'c');
SELECT sharding.add_node('a', 'host=a.invalid');
SELECT sharding.add_node('b', 'host=b.invalid');
SELECT sharding.add_node('c', 'host=c.invalid');
SELECT sharding.create_queue('public.priv_jobs');
INSERT INTO public.priv_jobs (key, payload) SELECT 'k' || i, '{}' FROM generate_series(1, 10) AS i;
CREATE TABLE public.priv_orders (id bigint PRIMARY KEY, status text);
INSERT INTO public.priv_orders VALUES (1, 'new');

SET LOCAL ROLE priv_plain;
-- Routing and hashing: every role.
SELECT lives_ok($$SELECT sharding.hash64('x'), sharding.shard_of('x', 8), sharding.jump_shard(1, 8)$$, 'plain: hashing');
SELECT lives_ok($$SELECT sharding.worker_shards(0, 4, 64), sharding.worker_of(3, 4, 64)$$, 'plain: worker_shards, worker_of');
SELECT is(sharding.node_for('priv_map', 'whale'), 'c', 'plain: node_for sees the pin');
SELECT lives_ok($$SELECT sharding.logical_shard('priv_map', 42), sharding.node_for('priv_map', 42)$$, 'plain: logical_shard, node_for');
SELECT lives_ok($$SELECT sharding.shards_of('priv_map', 'a'), sharding.epoch('priv_map', 0)$$, 'plain: shards_of, epoch');
SELECT lives_ok($$SELECT sharding.fence('priv_map', 0, 1)$$, 'plain: fence (a writer needs no admin rights)');
SELECT lives_ok($$SELECT sharding.partition_for('priv_map', 'k'), sharding.cluster_version('priv_map')$$, 'plain: partition_for, cluster_version');
SELECT lives_ok($$SELECT * FROM sharding.cluster_partitions('priv_map')$$, 'plain: cluster_partitions');
SELECT lives_ok($$SELECT * FROM sharding.cluster_config('priv_map')$$, 'plain: cluster_config');
SELECT lives_ok($$SELECT count(*) FROM sharding.maps$$, 'plain: may read the config');
-- Changing maps, pins, nodes, guards: refused.
SELECT throws_ok($$SELECT sharding.create_map('priv_x', 4, ARRAY['a'])$$, '42501', NULL, 'plain: create_map refused');
SELECT throws_ok($$SELECT sharding.drop_map('priv_map')$$, '42501', NULL, 'plain: drop_map refused');
SELECT throws_ok($$SELECT sharding.pin('priv_map', 'k', 'a')$$, '42501', NULL, 'plain: pin refused');
SELECT throws_ok($$SELECT sharding.unpin('priv_map', 'whale')$$, '42501', NULL, 'plain: unpin refused');
SELECT throws_ok($$SELECT sharding.move_shard('priv_map', 0, 'b')$$, '42501', NULL, 'plain: move_shard refused');
SELECT throws_ok($$SELECT * FROM sharding.rebalance('priv_map', ARRAY['a'])$$, '42501', NULL, 'plain: rebalance refused');
SELECT throws_ok($$SELECT sharding.add_node('z', 'host=z')$$, '42501', NULL, 'plain: add_node refused');
SELECT throws_ok($$SELECT sharding.drop_node('c')$$, '42501', NULL, 'plain: drop_node refused');
SELECT throws_ok($$SELECT sharding.guard_rank('public.priv_orders', 'status', ARRAY['new', 'done'])$$, '42501', NULL, 'plain: guard_rank refused');
SELECT throws_ok($$SELECT sharding.unguard_rank('public.priv_orders', 'status')$$, '42501', NULL, 'plain: unguard_rank refused');
SELECT throws_ok($$SELECT sharding.plproxy_install()$$, '42501', NULL, 'plain: plproxy_install refused');
-- Direct writes to the config tables: refused.
SELECT throws_ok($$INSERT INTO sharding.maps (map, logical_shards) VALUES ('sneaky', 4)$$, '42501', NULL, 'plain: INSERT into maps');
SELECT throws_ok($$UPDATE sharding.shards SET node = 'evil'$$, '42501', NULL, 'plain: UPDATE shards');
SELECT throws_ok($$UPDATE sharding.shards SET epoch = epoch + 1$$, '42501', NULL, 'plain: UPDATE shard epochs');
SELECT throws_ok($$DELETE FROM sharding.pins$$, '42501', NULL, 'plain: DELETE pins');
SELECT throws_ok($$INSERT INTO sharding.nodes VALUES ('evil', 'host=evil')$$, '42501', NULL, 'plain: INSERT nodes');
SELECT throws_ok($$UPDATE sharding.nodes SET dsn = 'host=evil'$$, '42501', NULL, 'plain: UPDATE node DSNs');
SELECT throws_ok($$UPDATE sharding.map_versions SET version = 0$$, '42501', NULL, 'plain: UPDATE map_versions');
-- (1.2: owners may write the rank_guards rows of their own tables; others' are refused.)
SELECT throws_ok($$INSERT INTO sharding.rank_guards (schema_name, table_name, column_name, ranks, on_regress)
                   VALUES ('public', 'priv_orders', 'status', '{a}', 'skip')$$, '42501', NULL, 'plain: INSERT rank_guards of a table it does not own');
SELECT throws_ok($$TRUNCATE sharding.shards$$, '42501', NULL, 'plain: TRUNCATE shards');
-- The queue: the caller's own privileges apply.
SELECT throws_ok($$SELECT * FROM sharding.claim(NULL::public.priv_jobs, 'w', 1)$$, '42501', NULL, 'plain: claim without privileges on the queue');
SELECT throws_ok($$SELECT sharding.complete('public.priv_jobs', 1, 'w')$$, '42501', NULL, 'plain: complete without privileges');
SELECT throws_ok($$SELECT sharding.extend_lease('public.priv_jobs', 1, 'w', '1 minute')$$, '42501', NULL, 'plain: extend_lease without privileges');
RESET ROLE;
GRANT SELECT, UPDATE ON public.priv_jobs TO priv_plain;
SET LOCAL ROLE priv_plain;
SELECT is((SELECT count(*)::int FROM sharding.claim(NULL::public.priv_jobs, 'w', 3)), 3, 'plain: claim with SELECT, UPDATE granted');
SELECT is(sharding.complete('public.priv_jobs', (SELECT min(id) FROM public.priv_jobs WHERE owner = 'w'), 'w'), true,
          'plain: complete with privileges granted');
RESET ROLE;

-- A member of sharding_admin may change maps, pins, nodes; guards need TRIGGER on the table too.
SET LOCAL ROLE priv_admin;
SELECT lives_ok($$SELECT sharding.create_map('priv_admin_map', 4, ARRAY['a', 'b'])$$, 'admin: create_map');
SELECT lives_ok($$SELECT sharding.pin('priv_admin_map', 'whale', 'c')$$, 'admin: pin');
SELECT is(sharding.unpin('priv_admin_map', 'whale'), true, 'admin: unpin');
SELECT is(sharding.move_shard('priv_admin_map', 0, 'b'), 2::bigint, 'admin: move_shard');
SELECT lives_ok($$SELECT * FROM sharding.rebalance('priv_admin_map', ARRAY['a', 'b', 'c'])$$, 'admin: rebalance');
SELECT lives_ok($$SELECT sharding.add_node('d', 'host=d.invalid')$$, 'admin: add_node');
SELECT lives_ok($$SELECT sharding.drop_node('d')$$, 'admin: drop_node');
SELECT lives_ok($$SELECT sharding.drop_map('priv_admin_map')$$, 'admin: drop_map');
SELECT throws_ok($$SELECT sharding.guard_rank('public.priv_orders', 'status', ARRAY['new', 'done'])$$, '42501', NULL,
                 'admin without TRIGGER on the table: guard_rank refused');
RESET ROLE;
GRANT TRIGGER ON public.priv_orders TO priv_admin;
SET LOCAL ROLE priv_admin;
SELECT lives_ok($$SELECT sharding.guard_rank('public.priv_orders', 'status', ARRAY['new', 'done'])$$, 'admin with TRIGGER: guard_rank');
SELECT throws_ok($$SELECT sharding.unguard_rank('public.priv_orders', 'status')$$, '42501', NULL,
                 'admin with TRIGGER but not owner: unguard_rank refused (DROP TRIGGER needs the owner)');
CREATE TABLE public.priv_admin_orders (id bigint PRIMARY KEY, status text);
SELECT lives_ok($$SELECT sharding.guard_rank('public.priv_admin_orders', 'status', ARRAY['new', 'done'])$$, 'admin owning the table: guard_rank');
SELECT lives_ok($$SELECT sharding.unguard_rank('public.priv_admin_orders', 'status')$$, 'admin owning the table: unguard_rank');
RESET ROLE;

-- Rights (CONTRACT 15.2): a job runs as the role that started it, which
-- no other role can write; the coordinator's DSN is shown with its
-- password masked to every role but a superuser.
SET LOCAL sharding.coordinator_dsn = 'host=coord.invalid user=u password=pw';
SET LOCAL ROLE priv_admin;
SELECT throws_ok($$INSERT INTO sharding.move_jobs (map, strategy, max_parallel, runas) VALUES ('priv_map', 'count', 1, 10)$$,
                 '42501', NULL, 'admin: move_jobs.runas not writable');
SELECT throws_ok($$UPDATE sharding.move_jobs SET runas = 10$$, '42501', NULL, 'admin: nor updatable');
WITH j AS (INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel)
           VALUES ('priv_map', 'count', 'done', 1) RETURNING runas)
SELECT is((SELECT runas::regrole::text FROM j), 'priv_admin', 'admin: a job row runs as the role that inserts it');
SELECT is(current_setting('sharding.coordinator_dsn'), 'host=coord.invalid user=u password=********',
          'admin: coordinator_dsn shown with the password masked');
RESET ROLE;
SET LOCAL ROLE priv_plain;
SELECT is((SELECT count(*)::int FROM pg_settings WHERE name = 'sharding.coordinator_dsn'), 0,
          'plain: pg_settings does not list it (its reset_val is copied raw)');
SELECT throws_ok($$SELECT sharding._coordinator_dsn()$$, '42501', NULL, 'plain: _coordinator_dsn refused');
RESET ROLE;
SELECT is(current_setting('sharding.coordinator_dsn'), 'host=coord.invalid user=u password=pw',
          'superuser: coordinator_dsn as set');

-- Every function is SECURITY INVOKER but one: the trigger of sharding.nodes
-- that keeps passwords in the owner's sharding.node_secrets (add_node runs
-- as sharding_admin). It cannot be called, no role but the owner may make
-- a trigger of it, and it refuses to run for any other table.
SELECT is((SELECT string_agg(p.oid::regprocedure::text, ', ') FROM pg_proc p
             JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
            WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'sharding') AND p.prosecdef),
          'sharding._node_secret()', 'the one SECURITY DEFINER function of the extension is the trigger of sharding.nodes');
SELECT is((SELECT p.prorettype = 'trigger'::regtype AND p.proconfig = '{"search_path=pg_catalog, pg_temp"}'
                  AND NOT has_function_privilege('public', p.oid, 'EXECUTE')
             FROM pg_proc p WHERE p.oid = 'sharding._node_secret()'::regprocedure), true,
          '_node_secret: a trigger function, search_path pinned, not executable by PUBLIC');
-- SEC-4: the engine's entry points written in PL/pgSQL run their bodies
-- in the engine's scope; the bodies are the owner's alone.
SELECT is((SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY p.oid::regprocedure::text) FROM pg_proc p
            WHERE p.pronamespace = 'sharding'::regnamespace AND p.prosrc = 'sharding__engine_call'),
          'sharding.attach_node(text), sharding.detach_node(text), sharding.take_over(boolean)',
          'SEC-4: attach_node, detach_node and take_over are the engine''s entry points (sharding__engine_call)');
SELECT is((SELECT string_agg(p.oid::regprocedure::text || ':' || has_function_privilege('priv_admin', p.oid, 'EXECUTE'), ', '
                             ORDER BY p.oid::regprocedure::text) FROM pg_proc p
            WHERE p.pronamespace = 'sharding'::regnamespace AND p.proname LIKE '\_%\_body'),
          'sharding._attach_node_body(text):false, sharding._detach_node_body(text):false, sharding._take_over_body(boolean):false',
          'SEC-4: their bodies are not executable by sharding_admin');
SET LOCAL ROLE priv_admin;
SELECT throws_ok($$SELECT sharding._attach_node_body('a')$$, '42501', NULL, 'SEC-4: admin: attach_node''s body refused');
RESET ROLE;
CREATE TABLE public.priv_fake_nodes (node text, dsn text);
GRANT ALL ON public.priv_fake_nodes TO priv_plain;
SET LOCAL ROLE priv_plain;
SELECT throws_ok($$CREATE TRIGGER t BEFORE INSERT ON public.priv_fake_nodes
                   FOR EACH ROW EXECUTE FUNCTION sharding._node_secret()$$, '42501', NULL,
                 'plain: no trigger of _node_secret on a table of its own');
RESET ROLE;
CREATE TRIGGER t BEFORE INSERT ON public.priv_fake_nodes FOR EACH ROW EXECUTE FUNCTION sharding._node_secret();
SELECT throws_ok($$INSERT INTO public.priv_fake_nodes VALUES ('n1', 'host=x password=y')$$, '42501', NULL,
                 '_node_secret refuses to run for any table but sharding.nodes');
SELECT * FROM finish();
ROLLBACK;
