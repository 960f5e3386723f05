-- What a shard key may be: one test, sharding._key_type (src/pg/keys.cpp,
-- key_type_of), which the C++ code uses too. Every SQL check of a key column
-- (distribute, copy_shard, and _key_column_type behind distribution, whales,
-- map_load and shard_lag) answers as it does, for every type below; fan-out counting
-- hashes a key value of each accepted type as hash64 does.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;

-- 'ok' if q runs, then rolled back; else its SQLSTATE.
CREATE FUNCTION pg_temp.tried(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RAISE EXCEPTION 'tried' USING ERRCODE = 'SH000';
EXCEPTION WHEN OTHERS THEN
    RETURN CASE WHEN SQLSTATE = 'SH000' THEN 'ok' ELSE SQLSTATE END;
END $$;

CREATE DOMAIN key_dom AS bigint;
CREATE DOMAIN name_dom AS varchar(20);
CREATE DOMAIN dom_dom AS key_dom;
CREATE DOMAIN num_dom AS numeric;
CREATE TEMP TABLE types (t regtype, n integer);
INSERT INTO types VALUES
    ('text', 1), ('varchar', 2), ('bytea', 3), ('smallint', 4), ('integer', 5), ('bigint', 6), ('uuid', 7),
    ('key_dom', 8), ('name_dom', 9), ('dom_dom', 10),
    ('bpchar', 11), ('numeric', 12), ('jsonb', 13), ('timestamptz', 14), ('num_dom', 15), ('text[]', 16);

-- The test itself.
SELECT t, sharding._key_type(t) AS hashed_as FROM types ORDER BY n;
SELECT sharding._key_type(NULL) IS NULL AS strict;

-- One table per type, each with the key column k of that type.
SELECT sharding.create_map('m', 8, ARRAY['a', 'b']);
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT * FROM types LOOP
        EXECUTE format('CREATE TABLE kt_%s (id bigint PRIMARY KEY, k %s) ; ALTER TABLE kt_%s REPLICA IDENTITY FULL', r.n, r.t, r.n);
    END LOOP;
END $$;

-- Every check agrees with _key_type: 'ok' for the key types, 22023 for the
-- others.
SELECT x.t,
       sharding._key_type(x.t) IS NOT NULL AS key_type,
       pg_temp.tried(format($$SELECT sharding.distribute('kt_%s', 'k', 'm')$$, x.n)) AS distribute,
       pg_temp.err(format($$SELECT sharding.distribution('kt_%s', 'k', 8)$$, x.n)) AS distribution,
       pg_temp.err(format($$SELECT sharding.whales('kt_%s', 'k', 8)$$, x.n)) AS whales,
       pg_temp.err(format($$SELECT sharding.map_load('m', 'kt_%s', 'k')$$, x.n)) AS map_load,
       -- copy_shard checks the key type before it connects (08001 here: a
       -- DSN libpq refuses).
       pg_temp.err(format($$SELECT sharding.copy_shard('m', 0, 'kt_%s', 'k', 'port=none', 'port=none')$$, x.n)) AS copy_shard
  FROM types AS x ORDER BY x.n;
-- (Each distribute above was rolled back: a map's tables share one key type.)
SELECT sharding.distribute('kt_6', 'k', 'm'), sharding.distribute('kt_8', 'k', 'm');

-- Fan-out counting hashes each accepted type as hash64 hashes the type it
-- is hashed as: two keys in one shard count as single-shard, in two shards
-- as fan-out (the classification needs the hashes to be right).
SELECT min(k) AS k1, max(k) AS k2 FROM (
    SELECT i::text AS k FROM generate_series(1, 50) AS i
     WHERE sharding.shard_of(i::bigint, 8) = sharding.shard_of(1::bigint, 8)) AS same \gset same_
SELECT i AS other FROM generate_series(1, 50) AS i WHERE sharding.shard_of(i::bigint, 8) <> sharding.shard_of(1::bigint, 8)
 LIMIT 1 \gset
SELECT sharding.fanout_reset();
SELECT count(*) FROM kt_6 WHERE k IN (:same_k1, :same_k2);
SELECT count(*) FROM kt_8 WHERE k IN (:same_k1::key_dom, :same_k2::key_dom);
SELECT count(*) FROM kt_6 WHERE k IN (:same_k1, :other);
SELECT count(*) FROM kt_8 WHERE k IN (:same_k1::key_dom, :other::key_dom);
SELECT table_name, single_shard, fan_out FROM sharding.fanout_stats WHERE table_name IN ('kt_6', 'kt_8') ORDER BY 1;

-- Rebalance jobs route a pinned key (by its text form) as writers route it:
-- by the type its map's key column is hashed as (_job_key_shard, on
-- _key_type). Each key type's table moves to a map of its own; the
-- keys are chosen so that the text and the typed hash disagree.
SELECT k AS int_key FROM (SELECT i::text AS k FROM generate_series(1, 50) AS i
                           WHERE sharding.shard_of(i::text, 8) <> sharding.shard_of(i::bigint, 8)) AS d LIMIT 1 \gset
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT * FROM types WHERE sharding._key_type(t) IS NOT NULL LOOP
        PERFORM sharding.undistribute(format('kt_%s', r.n)::regclass);
        PERFORM sharding.create_map('jk_' || r.n, 8, ARRAY['a', 'b']);
        PERFORM sharding.distribute(format('kt_%s', r.n)::regclass, 'k', 'jk_' || r.n);
    END LOOP;
END $$;
SELECT x.t, sharding._job_key_shard('jk_' || x.n, v.key) = v.want AS routed_as_typed
  FROM types AS x
  JOIN (VALUES (1, 'abc', sharding.shard_of('abc'::text, 8)), (2, 'abc', sharding.shard_of('abc'::text, 8)),
               (9, 'abc', sharding.shard_of('abc'::text, 8)),
               (3, '\x0a0b', sharding.shard_of('\x0a0b'::bytea, 8)),
               (4, :'int_key', sharding.shard_of(:'int_key'::bigint, 8)),
               (5, :'int_key', sharding.shard_of(:'int_key'::bigint, 8)),
               (6, :'int_key', sharding.shard_of(:'int_key'::bigint, 8)),
               (8, :'int_key', sharding.shard_of(:'int_key'::bigint, 8)),
               (10, :'int_key', sharding.shard_of(:'int_key'::bigint, 8)),
               (7, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
                sharding.shard_of('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 8))) AS v(n, key, want)
    ON v.n = x.n
 ORDER BY x.n;

DROP EXTENSION sharding CASCADE;
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT * FROM types LOOP
        EXECUTE format('DROP TABLE kt_%s', r.n);
    END LOOP;
END $$;
DROP DOMAIN dom_dom, key_dom, name_dom, num_dom;
