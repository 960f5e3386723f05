-- Section 8, online moves, on one node: argument checks, the no-op, the
-- journal's cleanup of nothing, privileges and the names of a move's
-- objects. test/tap/430_move_cases.pl moves shards between live instances.
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

-- The journal interface (sharding.move_journal, _move_enqueue,
-- _move_execute, _move_cancel, _move_recover): rows commit at once through
-- the engine's own connection to this database (dblink here).
CREATE EXTENSION dblink;
SELECT sharding.add_node('a', 'dbname=nowhere_a'), sharding.add_node('b', 'dbname=nowhere_b');
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'nope', 0, NULL, 'b')$$);
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 8, NULL, 'b')$$);
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 0, NULL, NULL)$$);
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 0, NULL, 'unknown')$$);
SELECT pg_temp.err(format($$SELECT sharding._move_enqueue(NULL, 'mv', %s, 'whale', 'b')$$, (:whale_shard + 1) % 8));
SELECT sharding._move_enqueue(42, 'mv', 0, NULL, 'b') AS m1 \gset
SELECT job, map, logical, key, source, destination, phase, rows_copied, lag_bytes, started IS NULL AS not_started
  FROM sharding.move_journal WHERE move = :m1;
-- Committed at once: another session sees it while this transaction goes on.
SELECT count(*) AS seen_elsewhere FROM dblink(sharding._coordinator_dsn(),
    format('SELECT 1 FROM sharding.move_journal WHERE move = %s', :m1)) AS t(x integer);
-- One live move per shard.
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 0, NULL, 'b')$$);
SELECT map, logical, key, source, destination, state FROM sharding.moves;
SELECT sharding._move_cancel(:m1) AS cancelled, sharding._move_cancel(:m1) AS again,
       sharding._move_execute(:m1) AS executes_to;
SELECT phase, finished IS NOT NULL AS finished FROM sharding.move_journal WHERE move = :m1;
SELECT pg_temp.err($$SELECT sharding._move_cancel(-1)$$);
SELECT pg_temp.err($$SELECT sharding._move_execute(-1)$$);
-- A move that fails (the destination cannot be reached) is recorded and
-- returned, not raised; move_shard_online raises what was recorded.
SELECT sharding._move_enqueue(NULL, 'mv', 0, NULL, 'b') AS m2 \gset
SELECT sharding._move_execute(:m2) AS result;
SELECT phase, error_state, error IS NOT NULL AS has_error, pid FROM sharding.move_journal WHERE move = :m2;
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, 'b')$$) LIKE '08001: %' AS raises_recorded;
SELECT phase, count(*) FROM sharding.move_journal GROUP BY phase ORDER BY phase;
SELECT sharding._move_recover() AS recovered_nothing;
-- An interrupted move (its executor died after the journal said
-- 'copying'): _move_recover rolls it back; here its nodes are unreachable,
-- so it warns and the row stays for the next call.
INSERT INTO sharding.move_journal (map, logical, source, destination, phase) VALUES ('mv', 1, 'a', 'b', 'copying');
SELECT sharding._move_recover() AS recovered;
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 1, NULL, 'b')$$) LIKE '55006: %' AS blocked;
DELETE FROM sharding.move_journal;
UPDATE sharding.nodes SET dsn = NULL WHERE node IN ('a', 'b');

-- Owner switches alone are refused on a map with a distributed table
-- (its rows would stay behind): 55000 naming the table, nothing changes.
-- Dry runs and maps without distributed tables are unchanged.
SELECT sharding.create_map('withrows', 4, ARRAY['a', 'b']);
CREATE TABLE moved_rows (k text PRIMARY KEY);
SELECT sharding.distribute('moved_rows', 'k', 'withrows');
SELECT logical, node, epoch FROM sharding.shards WHERE map = 'withrows' ORDER BY logical;
SELECT pg_temp.err($$SELECT sharding.move_shard('withrows', 0, 'b')$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance('withrows', ARRAY['b'])$$);
SELECT pg_temp.err($$SELECT * FROM sharding.rebalance_by_load('withrows', ARRAY['b'], ARRAY[1, 1, 1, 1]::float8[])$$);
SELECT count(*) AS planned FROM sharding.rebalance('withrows', ARRAY['b'], dry_run => true);
SELECT count(*) AS planned FROM sharding.rebalance_by_load('withrows', ARRAY['b'], ARRAY[1, 1, 1, 1]::float8[], dry_run => true);
SELECT logical, node, epoch FROM sharding.shards WHERE map = 'withrows' ORDER BY logical;
SELECT sharding.undistribute('moved_rows');
SELECT sharding.move_shard('withrows', 0, 'b') AS switched_without_tables;
SELECT count(*) AS rebalanced FROM sharding.rebalance('withrows', ARRAY['a']);
SELECT sharding.drop_map('withrows');
DROP TABLE moved_rows;

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
SELECT count(*) AS readable_journal FROM sharding.move_journal;
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 0, NULL, 'b')$$);
SELECT pg_temp.err($$SELECT sharding._move_cancel(1)$$);
SELECT pg_temp.err($$SELECT sharding._move_recover()$$);
SELECT pg_temp.err($$DELETE FROM sharding.move_journal$$);
RESET ROLE;
DROP ROLE move_reader;

-- The engine's remote helper keeps dblink's rule: an administrator who is
-- not a superuser may not connect out under the server's own identity (this
-- test server trusts local connections, so no password is asked): 2F003,
-- for the move's named connections and follow's one-shot calls alike. A
-- superuser may; the helper reports the remote answer.
CREATE ROLE move_admin IN ROLE sharding_admin;
CREATE TEMP TABLE probe_dsn AS SELECT sharding._coordinator_dsn() AS d;
SELECT sharding.add_node('probe_node', sharding._coordinator_dsn());
GRANT SELECT ON probe_dsn TO move_admin;
SET ROLE move_admin;
SELECT pg_temp.err($$SELECT sharding._dbl_connect('probe', (SELECT d FROM probe_dsn))$$);
SELECT sharding._dbl_open('probe') AS open_after_refusal;
SELECT pg_temp.err($$SELECT sharding._remote((SELECT d FROM probe_dsn), 'SELECT 1')$$);
-- The copy's own connection (the destination pulling from the source) too.
CREATE TEMP TABLE pull_t (a int);
SELECT pg_temp.err($$SELECT sharding._move_pull('probe_node', NULL, 'pull_t', ARRAY['a'], 'SELECT 1')$$);
SELECT count(*) AS pulled_rows FROM pull_t;
DROP TABLE pull_t;
RESET ROLE;
DROP TABLE probe_dsn;
SELECT sharding.drop_node('probe_node');
DROP ROLE move_admin;
SELECT sharding._remote(sharding._coordinator_dsn(), 'SELECT 6 * 7') AS remote_value;
SELECT sharding._remote(sharding._coordinator_dsn(), 'SELECT NULL') IS NULL AS remote_null;
SELECT sharding._remote_exec(sharding._coordinator_dsn(), 'CREATE TEMP TABLE probe_t (a int)') AS remote_tag;
SELECT pg_temp.err($$SELECT sharding._remote(sharding._coordinator_dsn(), 'SELECT 1/0')$$);
SELECT sharding._dbl_connect('probe', sharding._coordinator_dsn());
SELECT sharding._dbl_value('probe', 'SHOW search_path') AS remote_search_path;
SELECT sharding._dbl_run('probe', 'SET application_name = probe') AS run_tag;
-- Cancelled while a statement runs there (statement_timeout): the remote
-- statement is cancelled too and its results consumed; the connection is
-- usable at once.
SET statement_timeout = '200ms';
DO $$
BEGIN
    PERFORM sharding._dbl_value('probe', 'SELECT pg_catalog.pg_sleep(30)');
EXCEPTION WHEN query_canceled THEN
    RAISE NOTICE 'cancelled here: %', SQLERRM;
END $$;
RESET statement_timeout;
SELECT count(*) AS remote_sleepers FROM pg_stat_activity WHERE query = 'SELECT pg_catalog.pg_sleep(30)' AND state <> 'idle';
SELECT sharding._dbl_value('probe', 'SELECT 1') AS usable_after_cancel;
SELECT sharding._dbl_disconnect('probe');
SELECT sharding._dbl_open('probe') AS open_after_disconnect;
SELECT pg_temp.err($$SELECT sharding._dbl_value('probe', 'SELECT 1')$$);

SELECT sharding.drop_map('mv');
DROP EXTENSION sharding;
DROP EXTENSION dblink;
