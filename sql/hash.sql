-- Hashing (docs/hashing.md): hash64, shard_of, jump_shard. The oracle vectors (xxhsum) are
-- checked by test/harness/vectors.sh; this file checks the SQL surface.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Known values (XXH3-64 of "abc" is 0x78af5f94892f3950, of "" 0x2d06800538d394c2).
SELECT sharding.hash64('abc') = x'78af5f94892f3950'::bigint AS abc,
       sharding.hash64('') = x'2d06800538d394c2'::bigint AS empty,
       sharding.hash64(''::bytea) = sharding.hash64(''::text) AS empty_bytea_same,
       sharding.hash64('abc'::bytea) = sharding.hash64('abc'::text) AS bytes_same;

-- An untyped literal resolves to text; every integer width hashes alike.
SELECT sharding.shard_of('abc', 8) = sharding.shard_of('abc'::text, 8) AS literal_is_text,
       sharding.shard_of(42, 64) = sharding.shard_of(42::bigint, 64) AS int4_int8,
       sharding.shard_of(42::smallint, 64) = sharding.shard_of(42::bigint, 64) AS int2_int8,
       sharding.hash64(-1::smallint) = sharding.hash64(-1::bigint) AS negative_widened,
       sharding.hash64('00000000-0000-0000-0000-000000000001'::uuid)
         = sharding.hash64('\x00000000000000000000000000000001'::bytea) AS uuid_bytes;

-- Named notation, with the parameter names docs/hashing.md gives.
SELECT sharding.shard_of(key => 'abc', n => 8) = sharding.shard_of('abc', 8) AS named,
       sharding.jump_shard(n => 8, key => 7) = sharding.jump_shard(7, 8) AS named_jump;

-- shard_of is the unsigned hash modulo n (bigint arithmetic on the unsigned value).
SELECT bool_and(sharding.shard_of(k, n) =
         ((sharding.hash64(k)::numeric + CASE WHEN sharding.hash64(k) < 0 THEN 18446744073709551616 ELSE 0 END) % n)::int)
       AS modulo_rule
  FROM generate_series(1, 2000) AS g(i),
       LATERAL (SELECT 'key-' || i AS k) AS kk,
       unnest(ARRAY[1, 2, 3, 7, 64, 480, 2147483647]) AS n;

-- NULL in, NULL out (STRICT).
SELECT sharding.hash64(NULL::text) IS NULL AS a, sharding.shard_of(NULL::uuid, 4) IS NULL AS b,
       sharding.shard_of('x', NULL) IS NULL AS c, sharding.jump_shard(NULL::int, 4) IS NULL AS d;

-- Range: every result in [0, n).
SELECT min(s) AS min_s, max(s) AS max_s, count(DISTINCT s) AS distinct_shards,
       min(j) AS min_j, max(j) AS max_j, count(DISTINCT j) AS distinct_jump
  FROM (SELECT sharding.shard_of(i, 64) AS s, sharding.jump_shard(i, 64) AS j
          FROM generate_series(1, 20000) AS i) AS t;
SELECT sharding.shard_of('anything', 1) AS one_shard, sharding.jump_shard('anything', 1) AS one_bucket;

-- Jump hash moves only the keys that must move: growing n to n+1 moves a key
-- only into the new bucket n, and about 1/(n+1) of the keys move.
SELECT n,
       count(*) FILTER (WHERE sharding.jump_shard(i, n + 1) <> sharding.jump_shard(i, n)
                          AND sharding.jump_shard(i, n + 1) <> n) AS moved_elsewhere,
       round(count(*) FILTER (WHERE sharding.jump_shard(i, n + 1) = n) / 20000.0 * (n + 1), 1)
         BETWEEN 0.8 AND 1.2 AS moved_fraction_ok
  FROM generate_series(1, 20000) AS i, unnest(ARRAY[1, 4, 63, 479]) AS n
 GROUP BY n ORDER BY n;

-- Errors: n outside 1 .. 2147483647 is 22023 and names the value.
SELECT pg_temp.err($$SELECT sharding.shard_of('abc', 0)$$);
SELECT pg_temp.err($$SELECT sharding.shard_of(42, -1)$$);
SELECT pg_temp.err($$SELECT sharding.jump_shard('abc'::bytea, 0)$$);
SELECT pg_temp.err($$SELECT sharding.jump_shard(gen_random_uuid(), -2147483648)$$);
SELECT pg_temp.err($$SELECT sharding.shard_of('abc', 2147483648)$$);

-- Dealing contiguous ranges: 64 over 4, 10 over 4 (3,3,2,2), more workers than shards.
SELECT w, sharding.worker_shards(w, 4, 64) AS r
  FROM generate_series(0, 3) AS w WHERE w IN (0, 3);
SELECT array_agg(cardinality(sharding.worker_shards(w, 4, 10)) ORDER BY w) AS sizes_10_over_4,
       array_agg(cardinality(sharding.worker_shards(w, 4, 3)) ORDER BY w) AS sizes_3_over_4
  FROM generate_series(0, 3) AS w;
-- worker_of is the inverse of worker_shards for many shapes.
SELECT count(*) AS disagreements
  FROM generate_series(1, 40) AS workers, generate_series(1, 130) AS shards,
       LATERAL generate_series(0, shards - 1) AS s
 WHERE NOT s = ANY (sharding.worker_shards(sharding.worker_of(s, workers, shards), workers, shards));
SELECT pg_temp.err($$SELECT sharding.worker_shards(4, 4, 64)$$);
SELECT pg_temp.err($$SELECT sharding.worker_shards(0, 0, 64)$$);
SELECT pg_temp.err($$SELECT sharding.worker_of(64, 4, 64)$$);
SELECT pg_temp.err($$SELECT sharding.worker_of(0, 4, 0)$$);

-- An ordinary SQL building block: generated column, expression index, parallel query.
CREATE TABLE events (id bigint PRIMARY KEY, tenant text NOT NULL,
                     shard int GENERATED ALWAYS AS (sharding.shard_of(tenant, 64)) STORED);
INSERT INTO events (id, tenant) SELECT i, 'tenant-' || (i % 500) FROM generate_series(1, 50000) AS i;
SELECT count(*) AS mismatches FROM events WHERE shard <> sharding.shard_of(tenant, 64);
CREATE INDEX events_shard_idx ON events (sharding.shard_of(tenant, 64));
ANALYZE events;
EXPLAIN (COSTS OFF) SELECT count(*) FROM events WHERE sharding.shard_of(tenant, 64) = 3;
SELECT count(*) = (SELECT count(*) FROM events WHERE shard = 3) AS index_agrees
  FROM events WHERE sharding.shard_of(tenant, 64) = 3;

SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SET enable_indexscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT sum(sharding.shard_of(tenant, 64)) FROM events;
SELECT sum(sharding.shard_of(tenant, 64)) AS parallel_sum FROM events \gset
RESET ALL;
SELECT :parallel_sum = sum(shard) AS parallel_agrees, :parallel_sum > 0 AS nonzero FROM events;

DROP TABLE events;
DROP EXTENSION sharding;
