-- Section 8, online moves, on one node: argument checks, the no-op, the
-- journal's cleanup of nothing, privileges and the names of a move's
-- objects. test/multinode/move.sh moves shards between live instances.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT sharding.create_map('mv', 8, ARRAY['a', 'b']);

-- Same owner: no-op, current epoch, nothing journaled.
SELECT sharding.move_shard_online('mv', 0, 'a') AS epoch_unchanged;
SELECT sharding.move_shard_online(map => 'mv', logical => 7, node => 'b') AS named_notation;
SELECT count(*) AS journal_rows FROM sharding.moves;

-- Bad input: the contract's SQLSTATEs, the value named, nothing changed.
SELECT pg_temp.err($$SELECT sharding.move_shard_online('nope', 0, 'b')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard_online(NULL, 0, 'b')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 8, 'b')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', -1, 'b')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', NULL, 'b')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, NULL)$$);
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, '')$$);
-- A node without a DSN (here the destination, and the source too).
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, 'b')$$);
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, 'unknown')$$);
SELECT pg_temp.err($$SELECT sharding.isolate('nope', 'whale', 'b')$$);
SELECT pg_temp.err($$SELECT sharding.isolate('mv', NULL, 'b')$$);
SELECT pg_temp.err($$SELECT sharding.isolate('mv', 'whale', NULL)$$);
SELECT pg_temp.err($$SELECT sharding.isolate('mv', 'whale', 'unknown')$$);
SELECT logical, node, epoch FROM sharding.shards WHERE map = 'mv' ORDER BY logical;
SELECT count(*) AS pins, (SELECT count(*) FROM sharding.moves) AS journal_rows FROM sharding.pins;

-- isolate to the key's owner pins it and moves nothing.
SELECT sharding.logical_shard('mv', 'whale') AS whale_shard \gset
SELECT node AS whale_owner FROM sharding.shards WHERE map = 'mv' AND logical = :whale_shard \gset
SELECT sharding.isolate('mv', 'whale', :'whale_owner') AS rows_moved;
SELECT node = :'whale_owner' AS pinned_there FROM sharding.pins WHERE map = 'mv' AND key = 'whale';

-- In a transaction that has written, refused before anything happens
-- (the source's slot would wait for it).
BEGIN;
SELECT sharding.add_node('a', 'dbname=nowhere_a'), sharding.add_node('b', 'dbname=nowhere_b');
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, 'b')$$);
ROLLBACK;

-- Deterministic object names: [a-z0-9_] and at most 63 bytes, distinct
-- for map names that fold alike.
SELECT sharding._move_name('mv', 3) AS plain,
       sharding._move_name('Big Map', 3) AS folded,
       sharding._move_name('Big Map', 3) <> sharding._move_name('big_map', 3) AS distinct_from_lookalike,
       length(sharding._move_name(repeat('x', 200), 1048575)) <= 63 AS fits;

-- Administrators only.
CREATE ROLE move_reader;
SET ROLE move_reader;
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, 'a')$$);
SELECT pg_temp.err($$SELECT sharding.isolate('mv', 'whale', 'a')$$);
SELECT count(*) AS readable_journal FROM sharding.moves;
RESET ROLE;
DROP ROLE move_reader;

SELECT sharding.drop_map('mv');
DROP EXTENSION sharding;
