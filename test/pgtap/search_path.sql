-- search_path safety: a schema ahead of pg_catalog on the caller's
-- search_path shadows the builtins the extension's SQL and SPI queries use
-- (=, <, now(), quote_ident, format, nextval, lower, ...). Every shadow logs
-- its call; calling every function of the extension must log nothing.
BEGIN;
SELECT plan(4);

CREATE SCHEMA evil;
CREATE TABLE evil.calls (fn text);
GRANT ALL ON SCHEMA evil TO PUBLIC;
GRANT ALL ON evil.calls TO PUBLIC;

CREATE FUNCTION evil.log(fn text) RETURNS void LANGUAGE sql
    SET search_path = pg_catalog AS $$ INSERT INTO evil.calls VALUES (fn) $$;

-- Shadowing functions: same name and argument types as the builtins. Each
-- logs its call, then returns what the builtin would.
DO $do$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT * FROM (VALUES
            ('now', '', 'timestamptz'),
            ('quote_ident', 'text', 'text'),
            ('quote_literal', 'text', 'text'),
            ('format', 'text', 'text'),
            ('lower', 'text', 'text'),
            ('upper', 'text', 'text'),
            ('length', 'text', 'integer'),
            ('nextval', 'regclass', 'bigint'),
            ('array_length', 'anyarray, integer', 'integer'),
            ('cardinality', 'anyarray', 'integer'),
            ('array_position', 'anycompatiblearray, anycompatible', 'integer'),
            ('abs', 'integer', 'integer'),
            ('hashtext', 'text', 'integer'),
            ('repeat', 'text, integer', 'text'),
            ('lpad', 'text, integer, text', 'text')) AS v(name, args, returns) LOOP
        EXECUTE format('CREATE FUNCTION evil.%I(%s) RETURNS %s LANGUAGE plpgsql SET search_path = pg_catalog AS '
                       '$$ BEGIN PERFORM evil.log(%L); RETURN pg_catalog.%I(%s); END $$',
                       f.name, f.args, f.returns, f.name, f.name,
                       (SELECT string_agg('$' || i, ', ') FROM generate_series(1, cardinality(string_to_array(f.args, ','))) i));
    END LOOP;
END $do$;
CREATE FUNCTION evil.greatest_(integer) RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$;

-- Shadowing operators for the types the extension compares, each logging
-- its call.
DO $do$
DECLARE
    o record;
BEGIN
    FOR o IN SELECT * FROM (VALUES
            ('texteq', '=', 'text', 'text', 'boolean', '= text'),
            ('int4eq', '=', 'integer', 'integer', 'boolean', '= int4'),
            ('int8eq', '=', 'bigint', 'bigint', 'boolean', '= int8'),
            ('int4lt', '<', 'integer', 'integer', 'boolean', '< int4'),
            ('tstzlt', '<', 'timestamptz', 'timestamptz', 'boolean', '< timestamptz'),
            ('textcat', '||', 'text', 'text', 'text', '|| text'),
            ('tstzpl', '+', 'timestamptz', 'interval', 'timestamptz', '+ interval'),
            ('int4pl', '+', 'integer', 'integer', 'integer', '+ int4')) AS v(fn, op, l, r, returns, label) LOOP
        EXECUTE format('CREATE FUNCTION evil.%I(%s, %s) RETURNS %s LANGUAGE plpgsql SET search_path = pg_catalog AS '
                       '$$ BEGIN PERFORM evil.log(%L); RETURN $1 OPERATOR(pg_catalog.%s) $2; END $$',
                       o.fn, o.l, o.r, o.returns, o.label, o.op);
        EXECUTE format('CREATE OPERATOR evil.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = evil.%I)', o.op, o.l, o.r, o.fn);
    END LOOP;
END $do$;

-- Shadowing tables: an unqualified reference would read these.
CREATE TABLE evil.maps (map text, logical_shards integer);
CREATE TABLE evil.shards (map text, logical integer, node text, epoch bigint);
CREATE TABLE evil.pins (map text, key text, node text);

-- Objects the calls below use, created before the attack path is set.
SELECT sharding.create_map('sp_map', 16, ARRAY['a', 'b']);
SELECT sharding.create_queue('public.sp_jobs');
INSERT INTO public.sp_jobs (key, payload) SELECT 'k' || i, '{}' FROM generate_series(1, 20) AS i;
CREATE TYPE public.sp_status AS ENUM ('new', 'shipped', 'delivered');
CREATE TABLE public.sp_orders (id bigint PRIMARY KEY, status text, state public.sp_status);
INSERT INTO public.sp_orders SELECT i, 'new', 'new' FROM generate_series(1, 5) AS i;
CREATE TABLE public.sp_parts (k text) PARTITION BY HASH (k sharding.text_shard_ops);

SET LOCAL search_path = evil, pg_catalog, public;

-- Hashing (docs/hashing.md)
SELECT sharding.hash64('x'), sharding.shard_of('x', 8), sharding.jump_shard(7, 8),
       sharding.worker_shards(1, 4, 64), sharding.worker_of(3, 4, 64);
-- Maps (docs/maps.md)
SELECT sharding.logical_shard('sp_map', 'x'), sharding.node_for('sp_map', 'x'), sharding.node_for('sp_map', 42);
SELECT sharding.pin('sp_map', 'whale', 'c');
SELECT sharding.node_for('sp_map', 'whale');
SELECT sharding.unpin('sp_map', 'whale');
SELECT sharding.shards_of('sp_map', 'a');
SELECT sharding.move_shard('sp_map', 0, 'b');
SELECT * FROM sharding.rebalance('sp_map', ARRAY['a', 'b', 'c'], true);
SELECT * FROM sharding.rebalance('sp_map', ARRAY['a', 'b', 'c']);
SELECT sharding.epoch('sp_map', 0);
SELECT sharding.fence('sp_map', 0, sharding.epoch('sp_map', 0));
-- Claiming work (docs/queue.md)
SELECT count(*) FROM sharding.claim(NULL::public.sp_jobs, 'w1', 5);
SELECT count(*) FROM sharding.claim_shards(NULL::public.sp_jobs, 'w2', ARRAY[0, 1, 2, 3], 4, 5);
SELECT sharding.complete('public.sp_jobs', (SELECT min(id) FROM public.sp_jobs WHERE owner OPERATOR(pg_catalog.=) 'w1'), 'w1');
SELECT sharding.complete('public.sp_jobs', ARRAY(SELECT id FROM public.sp_jobs WHERE owner OPERATOR(pg_catalog.=) 'w2'), 'w2');
SELECT sharding.fail('public.sp_jobs', (SELECT max(id) FROM public.sp_jobs WHERE owner OPERATOR(pg_catalog.=) 'w1'), 'w1');
SELECT sharding.extend_lease('public.sp_jobs', 1, 'w1', '1 minute');
-- Rank guards (docs/rank.md)
SELECT sharding.guard_rank('public.sp_orders', 'status', ARRAY['new', 'shipped', 'delivered']);
SELECT sharding.guard_rank('public.sp_orders', 'state', NULL, 'error');
SELECT sharding.rank_of('public.sp_orders', 'status', 'shipped');
SELECT sharding.advance('public.sp_orders', 1::bigint, 'delivered');
SELECT sharding.advance('public.sp_orders', 2::bigint, 'shipped', 'state');
UPDATE public.sp_orders SET status = 'new' WHERE id OPERATOR(pg_catalog.=) 1;
SELECT sharding.unguard_rank('public.sp_orders', 'status');
-- Observing load (docs/observe.md)
SELECT count(*) FROM sharding.distribution('public.sp_jobs', 'key', 8);
SELECT sharding.imbalance(ARRAY[1, 2, 3]);
SELECT count(*) FROM sharding.whales('public.sp_jobs', 'key', 4);
SELECT count(*) FROM sharding.map_load('sp_map', 'public.sp_jobs', 'key');
-- Partitions (docs/partitions.md)
SELECT sharding.create_partitions('public.sp_parts', 4);
INSERT INTO public.sp_parts VALUES ('a'), ('b');
-- Nodes and PL/Proxy (docs/nodes.md)
SELECT sharding.add_node('a', 'host=/nonexistent dbname=a');
SELECT sharding.add_node('b', 'host=/nonexistent dbname=b');
SELECT sharding.add_node('c', 'host=/nonexistent dbname=c');
SELECT sharding.partition_for('sp_map', 'x');
SELECT count(*) FROM sharding.cluster_partitions('sp_map');
SELECT sharding.cluster_version('sp_map');
SELECT count(*) FROM sharding.cluster_config('sp_map');
SELECT sharding.drop_map('sp_map');

RESET search_path;
SELECT is((SELECT string_agg(DISTINCT fn, ', ' ORDER BY fn) FROM evil.calls), NULL,
          'no shadowing function or operator ran during any extension call');
SELECT is((SELECT count(*)::int FROM evil.maps) + (SELECT count(*)::int FROM evil.pins), 0,
          'no shadowing table was written');
SELECT ok(NOT EXISTS (SELECT FROM sharding.maps WHERE map = 'sp_map'), 'the calls really ran (map dropped at the end)');
-- Control: the same path really hijacks a query that does not defend itself.
SET LOCAL search_path = evil, pg_catalog, public;
SELECT now() IS NOT NULL, 'a'::text = 'b'::text, quote_ident('x'), 1 + 1;
RESET search_path;
SELECT is((SELECT string_agg(DISTINCT fn, ', ' ORDER BY fn) FROM evil.calls),
          '+ int4, = text, now, quote_ident', 'control: the shadows do fire for undefended SQL');
SELECT * FROM finish();
ROLLBACK;
