-- The C/C++ boundary: every C++ exception becomes an ERROR with the right
-- SQLSTATE, C++ destructors run even when PostgreSQL raises the ERROR, and
-- the session goes on.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

\set VERBOSITY default
SELECT sharding._boundary_selftest('runtime_error');
SELECT sharding._boundary_selftest('bad_alloc');
SELECT sharding._boundary_selftest('out_of_range');
SELECT sharding._boundary_selftest('int');
SELECT sharding._boundary_selftest('error');
SELECT sharding._boundary_selftest('pg_error');
SELECT sharding._boundary_selftest('pg_value');

-- SQLSTATEs survive the trip: a PostgreSQL error raised under pg_call keeps
-- its own code, a C++ sharding::Error carries its code, bad_alloc is 53200.
SELECT pg_temp.err($$SELECT sharding._boundary_selftest('pg_error')$$);
SELECT pg_temp.err($$SELECT sharding._boundary_selftest('error')$$);
SELECT pg_temp.err($$SELECT sharding._boundary_selftest('bad_alloc')$$);
SELECT pg_temp.err($$SELECT sharding._boundary_selftest('nonsense')$$);

-- Every call above destroyed its C++ objects: 7 direct calls + 4 wrapped.
SELECT sharding._boundary_selftest('count') AS destroyed_so_far;

-- The session and its transactions go on normally afterwards.
BEGIN;
SAVEPOINT s;
SELECT sharding._boundary_selftest('runtime_error');
ROLLBACK TO SAVEPOINT s;
SELECT sharding.shard_of('still alive', 8) BETWEEN 0 AND 7 AS alive;
COMMIT;

-- A call that leaves PG_exception_stack changed (as a PG_TRY left by a C++
-- exception would) is caught by SHARDING_FUNCTION: the stack is restored
-- and an ERROR raised, and the session goes on.
SELECT pg_temp.err($$SELECT sharding._boundary_selftest('drift')$$);
SELECT sharding._boundary_selftest('drift');
SELECT sharding.shard_of('still alive', 8) BETWEEN 0 AND 7 AS alive;

-- A message longer than the capture buffer is cut at a character boundary:
-- 'x' and 340 three-byte characters (1021 bytes), ending in a whole one.
SELECT octet_length(e) - 7 AS message_bytes, right(e, 1) AS last, e LIKE '22023: x€€€%' AS starts
  FROM pg_temp.err($$SELECT sharding._boundary_selftest('long_utf8')$$) AS e;

-- glue(fn, args...), the named form of pg_call: an ERROR raised inside keeps
-- its SQLSTATE and message, the C++ objects alive around it are destroyed,
-- and a value comes back unchanged (3: count itself and the two calls).
SELECT sharding._boundary_selftest('count') AS before \gset
SELECT pg_temp.err($$SELECT sharding._boundary_selftest('glue_error')$$);
SELECT sharding._boundary_selftest('glue_value');
SELECT sharding._boundary_selftest('count') - :before AS destroyed;

DROP EXTENSION sharding;
