-- The sharding demo, narrated. Run through demo/run.sh.
\pset footer off
\set QUIET on
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS sharding CASCADE;
CREATE EXTENSION sharding;

\echo
\echo '1. A key always lands on the same logical shard, computed inside the database.'
\echo '   hash64 is XXH3-64 of the key''s bytes, so any client (Python, Go, Java) agrees.'
SELECT k AS key, sharding.hash64(k) AS hash64, sharding.shard_of(k, 64) AS "shard of 64",
       sharding.jump_shard(k, 64) AS "jump shard"
  FROM unnest(ARRAY['t001', 't007', 'ws_enterprise_42', 'order-1001']) AS k;

\echo
\echo '2. 64 logical shards over 4 workers; a 5th worker joins.'
\echo '   The key -> shard mapping never changes; only shard -> worker does.'
SELECT w AS worker, sharding.worker_shards(w, 4, 64) AS "shards with 4 workers"
  FROM generate_series(0, 3) AS w;
SELECT count(*) FILTER (WHERE sharding.worker_of(s, 4, 64) <> sharding.worker_of(s, 5, 64))
         AS "shards that change worker (4 -> 5)",
       0 AS "keys that change shard"
  FROM generate_series(0, 63) AS s;
