-- The bad-input matrix: hostile and malformed calls across every topic of
-- docs/. Each must fail with the SQLSTATE its page documents
-- (never XX000), change nothing, and leave the routing cache answering as
-- before. test/run.sh then checks that the server never restarted.
\set QUIET on
BEGIN;
SELECT plan(103);

-- A fingerprint of everything a failed call could disturb: every table of
-- schema sharding, the test's own tables, and routing answers served from
-- this backend's cache (a half-updated cache would change them).
CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r record;
    h text;
    acc text := '';
BEGIN
    FOR r IN SELECT c.oid::regclass AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relkind IN ('r', 'p') AND (n.nspname = 'sharding' OR c.relname LIKE 'bad\_%')
              ORDER BY c.oid::regclass::text
    LOOP
        EXECUTE format('SELECT md5(coalesce(string_agg(x::text, ''|'' ORDER BY x::text), '''')) FROM %s x', r.t)
            INTO h;
        acc := acc || r.t::text || '=' || h || ';';
    END LOOP;
    acc := acc || (SELECT string_agg(sharding.node_for('bad_map', 'key-' || i), ',') FROM generate_series(1, 50) AS i);
    acc := acc || (SELECT string_agg(sharding.node_for('bad_map', i), ',') FROM generate_series(1, 50) AS i);
    acc := acc || (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace)::text;
    RETURN md5(acc);
END $$;

-- Runs q; 'ok' when it fails with SQLSTATE `code` and the fingerprint is unchanged.
CREATE FUNCTION pg_temp.bad(q text, code text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    before text := pg_temp.state();
    got text;
    msg text;
BEGIN
    BEGIN
        EXECUTE q;
        got := 'no error';
    EXCEPTION WHEN OTHERS THEN
        got := SQLSTATE;
        msg := SQLERRM;
    END;
    IF got IS DISTINCT FROM code THEN
        RETURN 'got ' || got || coalesce(': ' || msg, '');
    END IF;
    IF pg_temp.state() <> before THEN
        RETURN 'state changed';
    END IF;
    RETURN 'ok';
END $$;

SELECT sharding.create_map('bad_map', 16, ARRAY['n1', 'n2']);
SELECT sharding.pin('bad_map', 'key-7', 'whale');
CREATE TABLE bad_jobs (id bigint PRIMARY KEY, key text, status text, owner text,
                       claim_expires timestamptz, created timestamptz DEFAULT now(), attempts int DEFAULT 0);
INSERT INTO bad_jobs (id, key, status) SELECT i, 'k' || i, 'pending' FROM generate_series(1, 10) AS i;
CREATE TABLE bad_notqueue (id bigint PRIMARY KEY, status text);
CREATE TABLE bad_orders (id bigint PRIMARY KEY, status text, note jsonb);
INSERT INTO bad_orders VALUES (1, 'delivered', '{}'), (2, 'new', '{}');
SELECT sharding.guard_rank('bad_orders', 'status', ARRAY['new', 'shipped', 'delivered'], 'error');
CREATE TABLE bad_nopk (id bigint, status text);
CREATE TABLE bad_parted (k text) PARTITION BY HASH (k sharding.text_shard_ops);
CREATE TABLE bad_parted_0 PARTITION OF bad_parted FOR VALUES WITH (MODULUS 4, REMAINDER 0);
CREATE TABLE bad_plain_parted (k text) PARTITION BY HASH (k);
CREATE TABLE bad_two_cols (a text, b text) PARTITION BY HASH (a sharding.text_shard_ops, b sharding.text_shard_ops);

-- Hashing (docs/hashing.md)
SELECT is(pg_temp.bad($$SELECT sharding.shard_of('a', 0)$$, '22023'), 'ok', 'shard_of n = 0');
SELECT is(pg_temp.bad($$SELECT sharding.shard_of('a', -1)$$, '22023'), 'ok', 'shard_of n = -1');
SELECT is(pg_temp.bad($$SELECT sharding.shard_of(7::bigint, -2147483648)$$, '22023'), 'ok', 'shard_of n = int min');
SELECT is(pg_temp.bad($$SELECT sharding.shard_of('a'::bytea, 0)$$, '22023'), 'ok', 'shard_of bytea n = 0');
SELECT is(pg_temp.bad($$SELECT sharding.jump_shard('a', 0)$$, '22023'), 'ok', 'jump_shard n = 0');
SELECT is(pg_temp.bad($$SELECT sharding.jump_shard(gen_random_uuid(), -5)$$, '22023'), 'ok', 'jump_shard uuid n = -5');
SELECT is(pg_temp.bad($$SELECT sharding.shard_of('a', 2147483648)$$, '42883'), 'ok', 'shard_of n = 2^31 (not an integer)');
SELECT is(pg_temp.bad($$SELECT sharding.shard_of('a', '2147483648'::int)$$, '22003'), 'ok', 'n = 2^31 cast to integer');
SELECT is(pg_temp.bad($$SELECT sharding.hash64(1.5)$$, '42883'), 'ok', 'hash64 of numeric: no such key type');
SELECT is(pg_temp.bad($$SELECT sharding.hash64('{"a":1}'::jsonb)$$, '42883'), 'ok', 'hash64 of jsonb: no such key type');
SELECT is(pg_temp.bad($$SELECT sharding.worker_shards(4, 4, 64)$$, '22023'), 'ok', 'worker_shards worker out of range');
SELECT is(pg_temp.bad($$SELECT sharding.worker_shards(-1, 4, 64)$$, '22023'), 'ok', 'worker_shards negative worker');
SELECT is(pg_temp.bad($$SELECT sharding.worker_shards(0, 0, 64)$$, '22023'), 'ok', 'worker_shards zero workers');
SELECT is(pg_temp.bad($$SELECT sharding.worker_of(64, 4, 64)$$, '22023'), 'ok', 'worker_of shard out of range');
SELECT is(pg_temp.bad($$SELECT sharding.worker_of(0, 4, 0)$$, '22023'), 'ok', 'worker_of zero shards');
SELECT is(pg_temp.bad($$SELECT sharding.worker_of(0, -3, 8)$$, '22023'), 'ok', 'worker_of negative workers');

-- Maps (docs/maps.md)
SELECT is(pg_temp.bad($$SELECT sharding.create_map('m2', 0, ARRAY['a'])$$, '22023'), 'ok', 'create_map 0 shards');
SELECT is(pg_temp.bad($$SELECT sharding.create_map('m2', -4, ARRAY['a'])$$, '22023'), 'ok', 'create_map negative shards');
SELECT is(pg_temp.bad($$SELECT sharding.create_map('m2', 4, '{}')$$, '22023'), 'ok', 'create_map empty nodes');
SELECT is(pg_temp.bad($$SELECT sharding.create_map('m2', 4, ARRAY['a', NULL])$$, '22023'), 'ok', 'create_map NULL node');
SELECT is(pg_temp.bad($$SELECT sharding.create_map('m2', 4, ARRAY['a', 'b', 'a'])$$, '22023'), 'ok', 'create_map duplicate nodes');
SELECT is(pg_temp.bad($$SELECT sharding.create_map('m2', 4, NULL)$$, '22023'), 'ok', 'create_map NULL nodes array');
SELECT is(pg_temp.bad($$SELECT sharding.create_map(NULL, 4, ARRAY['a'])$$, '22023'), 'ok', 'create_map NULL name');
SELECT is(pg_temp.bad($$SELECT sharding.create_map('bad_map', 4, ARRAY['a'])$$, '42710'), 'ok', 'create_map existing');
SELECT is(pg_temp.bad($$SELECT sharding.drop_map('no map')$$, '42704'), 'ok', 'drop_map unknown');
SELECT is(pg_temp.bad($$SELECT sharding.logical_shard('no map', 'k')$$, '42704'), 'ok', 'logical_shard unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.node_for('no map', 'k')$$, '42704'), 'ok', 'node_for unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.node_for($q$x'; DROP TABLE sharding.maps; --$q$, 42)$$, '42704'), 'ok', 'node_for injection-shaped map name');
SELECT is(pg_temp.bad($$SELECT sharding.node_for('no map', gen_random_uuid())$$, '42704'), 'ok', 'node_for uuid unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.pin('no map', 'k', 'a')$$, '42704'), 'ok', 'pin unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.pin('bad_map', 'k', NULL)$$, '22023'), 'ok', 'pin NULL node');
SELECT is(pg_temp.bad($$SELECT sharding.pin('bad_map', NULL, 'a')$$, '22023'), 'ok', 'pin NULL key');
SELECT is(pg_temp.bad($$SELECT sharding.unpin('no map', 'k')$$, '42704'), 'ok', 'unpin unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.shards_of('no map', 'n1')$$, '42704'), 'ok', 'shards_of unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.move_shard('bad_map', 16, 'n2')$$, '22023'), 'ok', 'move_shard shard = L');
SELECT is(pg_temp.bad($$SELECT sharding.move_shard('bad_map', -1, 'n2')$$, '22023'), 'ok', 'move_shard negative shard');
SELECT is(pg_temp.bad($$SELECT sharding.move_shard('no map', 0, 'n2')$$, '42704'), 'ok', 'move_shard unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.move_shard('bad_map', 0, NULL)$$, '22023'), 'ok', 'move_shard NULL node');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.rebalance('bad_map', '{}')$$, '22023'), 'ok', 'rebalance empty nodes');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.rebalance('bad_map', ARRAY['n1', NULL])$$, '22023'), 'ok', 'rebalance NULL node');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.rebalance('bad_map', ARRAY['n1', 'n1'])$$, '22023'), 'ok', 'rebalance duplicate nodes');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.rebalance('no map', ARRAY['n1'])$$, '42704'), 'ok', 'rebalance unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.epoch('bad_map', 16)$$, '22023'), 'ok', 'epoch shard = L');
SELECT is(pg_temp.bad($$SELECT sharding.epoch('no map', 0)$$, '42704'), 'ok', 'epoch unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.fence('bad_map', 0, 2)$$, '55000'), 'ok', 'fence stale epoch');
SELECT is(pg_temp.bad($$SELECT sharding.fence('bad_map', 0, -1)$$, '55000'), 'ok', 'fence negative epoch');
SELECT is(pg_temp.bad($$SELECT sharding.fence('bad_map', 99, 1)$$, '22023'), 'ok', 'fence bad shard');
SELECT is(pg_temp.bad($$SELECT sharding.fence('no map', 0, 1)$$, '42704'), 'ok', 'fence unknown map');

-- Claiming work (docs/queue.md)
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim(NULL::bad_jobs, 'w', 0)$$, '22023'), 'ok', 'claim batch 0');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim(NULL::bad_jobs, 'w', -1)$$, '22023'), 'ok', 'claim negative batch');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim(NULL::bad_jobs, 'w', 5, '-1 second')$$, '22023'), 'ok', 'claim negative lease');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim(NULL::bad_jobs, 'w', 5, NULL)$$, '22023'), 'ok', 'claim NULL lease');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim(NULL::bad_jobs, NULL, 5)$$, '22023'), 'ok', 'claim NULL worker');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim(NULL::bad_notqueue, 'w')$$, '22023'), 'ok', 'claim table lacking columns');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim(NULL::integer, 'w')$$, '22023'), 'ok', 'claim on a non-table type');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim_shards(NULL::bad_jobs, 'w', ARRAY[0], 0)$$, '22023'), 'ok', 'claim_shards shard_count 0');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim_shards(NULL::bad_jobs, 'w', ARRAY[0], 4, 0)$$, '22023'), 'ok', 'claim_shards batch 0');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.claim_shards(NULL::bad_jobs, 'w', ARRAY[0], 4, key_column => 'no"col;--')$$, '22023'), 'ok', 'claim_shards unknown key column with quotes');
SELECT is(pg_temp.bad($$SELECT sharding.complete('bad_notqueue', 1, 'w')$$, '22023'), 'ok', 'complete on a table lacking columns');
SELECT is(pg_temp.bad($$SELECT sharding.complete('no_such_table', 1, 'w')$$, '42P01'), 'ok', 'complete unknown table');
SELECT is(pg_temp.bad($$SELECT sharding.fail('bad_notqueue', 1, 'w')$$, '22023'), 'ok', 'fail on a table lacking columns');
SELECT is(pg_temp.bad($$SELECT sharding.extend_lease('bad_jobs', 1, 'w', '-5 minutes')$$, '22023'), 'ok', 'extend_lease negative lease');
SELECT is(pg_temp.bad($$SELECT sharding.create_queue('bad_jobs')$$, '42P07'), 'ok', 'create_queue existing table');
SELECT is(pg_temp.bad($$SELECT sharding.create_queue('')$$, '22023'), 'ok', 'create_queue empty name');

-- Rank guards (docs/rank.md)
SELECT is(pg_temp.bad($$SELECT sharding.guard_rank('bad_orders', 'nope', ARRAY['a'])$$, '42703'), 'ok', 'guard_rank unknown column');
SELECT is(pg_temp.bad($$SELECT sharding.guard_rank('bad_orders', 'status')$$, '22023'), 'ok', 'guard_rank non-enum without ranks');
SELECT is(pg_temp.bad($$SELECT sharding.guard_rank('bad_orders', 'status', ARRAY['a', 'a'])$$, '22023'), 'ok', 'guard_rank duplicate ranks');
SELECT is(pg_temp.bad($$SELECT sharding.guard_rank('bad_orders', 'status', ARRAY['a', NULL])$$, '22023'), 'ok', 'guard_rank NULL rank');
SELECT is(pg_temp.bad($$SELECT sharding.guard_rank('bad_orders', 'status', '{}')$$, '22023'), 'ok', 'guard_rank empty ranks');
SELECT is(pg_temp.bad($$SELECT sharding.guard_rank('bad_orders', 'status', ARRAY['a'], 'explode')$$, '22023'), 'ok', 'guard_rank bad on_regress');
SELECT is(pg_temp.bad($$SELECT sharding.rank_of('bad_orders', 'status', 'lost')$$, '22023'), 'ok', 'rank_of value outside ranks');
SELECT is(pg_temp.bad($$SELECT sharding.rank_of('bad_orders', 'note', 'x')$$, '22023'), 'ok', 'rank_of unguarded non-enum');
SELECT is(pg_temp.bad($$SELECT sharding.advance('bad_orders', 2::bigint, 'lost')$$, '22023'), 'ok', 'advance to value outside ranks');
SELECT is(pg_temp.bad($$SELECT sharding.advance('bad_orders', 2::bigint, 'x', 'note')$$, '22023'), 'ok', 'advance on unguarded non-enum');
SELECT is(pg_temp.bad($$SELECT sharding.advance('bad_nopk', 2::bigint, 'x')$$, '22023'), 'ok', 'advance on a table without primary key');
SELECT is(pg_temp.bad($$UPDATE bad_orders SET status = 'shipped' WHERE id = 1$$, '23514'), 'ok', 'guarded UPDATE regressing (error mode)');
SELECT is(pg_temp.bad($$UPDATE bad_orders SET status = 'teleported' WHERE id = 2$$, '22023'), 'ok', 'guarded UPDATE to value outside ranks');

-- Observing load (docs/observe.md)
SELECT is(pg_temp.bad($$SELECT * FROM sharding.distribution('bad_jobs', 'nope', 8)$$, '42703'), 'ok', 'distribution unknown column');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.distribution('bad_jobs', 'key', 0)$$, '22023'), 'ok', 'distribution 0 shards');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.distribution('bad_jobs', 'claim_expires', 8)$$, '22023'), 'ok', 'distribution on an unsupported key type');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.whales('bad_jobs', 'key', -1)$$, '22023'), 'ok', 'whales negative shards');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.whales('bad_jobs', 'key', 4, -0.5)$$, '22023'), 'ok', 'whales negative min_share');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.whales('bad_jobs', $c$key"; DROP TABLE bad_jobs; --$c$, 4)$$, '42703'), 'ok', 'whales injection-shaped column');
SELECT is(pg_temp.bad($$SELECT sharding.imbalance(ARRAY['a', 'b'])$$, '22023'), 'ok', 'imbalance of text');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.map_load('no map', 'bad_jobs', 'key')$$, '42704'), 'ok', 'map_load unknown map');

-- Partitions (docs/partitions.md)
SELECT is(pg_temp.bad($$SELECT sharding.create_partitions('bad_parted', 0)$$, '22023'), 'ok', 'create_partitions 0');
SELECT is(pg_temp.bad($$SELECT sharding.create_partitions('bad_jobs', 4)$$, '22023'), 'ok', 'create_partitions not partitioned');
SELECT is(pg_temp.bad($$SELECT sharding.create_partitions('bad_plain_parted', 4)$$, '22023'), 'ok', 'create_partitions default opclass');
SELECT is(pg_temp.bad($$SELECT sharding.create_partitions('bad_two_cols', 4)$$, '22023'), 'ok', 'create_partitions two key columns');
SELECT is(pg_temp.bad($$SELECT sharding.create_partitions('bad_parted', 4)$$, '42P07'), 'ok', 'create_partitions name taken');

-- Nodes and PL/Proxy (docs/nodes.md)
SELECT is(pg_temp.bad($$SELECT sharding.drop_node('n1')$$, '55000'), 'ok', 'drop_node owning shards');
SELECT is(pg_temp.bad($$SELECT sharding.drop_node('whale')$$, '55000'), 'ok', 'drop_node holding pins');
SELECT is(pg_temp.bad($$SELECT sharding.drop_node('nobody')$$, '42704'), 'ok', 'drop_node unknown');
SELECT is(pg_temp.bad($$SELECT sharding.add_node(NULL, 'host=x')$$, '22023'), 'ok', 'add_node NULL node');
SELECT is(pg_temp.bad($$SELECT sharding.partition_for('no map', 'k')$$, '42704'), 'ok', 'partition_for unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.partition_for('no map', 42::bigint)$$, '42704'), 'ok', 'partition_for bigint unknown map');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.cluster_partitions('bad_map')$$, '55000'), 'ok', 'cluster_partitions node without DSN');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.cluster_partitions('no map')$$, '42704'), 'ok', 'cluster_partitions unknown map');
SELECT is(pg_temp.bad($$SELECT sharding.cluster_version('no map')$$, '42704'), 'ok', 'cluster_version unknown map');
SELECT is(pg_temp.bad($$SELECT * FROM sharding.cluster_config('no map')$$, '42704'), 'ok', 'cluster_config unknown map');

-- A map edited by hand into nonsense gives a clean ERROR (no 8 GB vector).
SELECT sharding.create_map('bad_corrupt', 4, ARRAY['a']);
UPDATE sharding.maps SET logical_shards = 2147483647 WHERE map = 'bad_corrupt';
SELECT is(pg_temp.bad($$SELECT sharding.node_for('bad_corrupt', 'k')$$, 'XX001'), 'ok',
          'node_for on a hand-corrupted map: data_corrupted, no huge allocation');

-- Hostile values that are legal: stored as values, never run as SQL.
SELECT sharding.create_map($n$x'); DROP TABLE sharding.maps; --$n$, 4, ARRAY[$n$n"1; DELETE FROM sharding.shards$n$]);
SELECT is(sharding.node_for($n$x'); DROP TABLE sharding.maps; --$n$, 'k'), $n$n"1; DELETE FROM sharding.shards$n$,
          'an injection-shaped map and node name are plain values');
SELECT is((SELECT count(*)::int FROM sharding.shards WHERE map = 'bad_map'), 16, 'bad_map still has its 16 shards');

SELECT * FROM finish();
ROLLBACK;
