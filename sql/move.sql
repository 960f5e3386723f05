-- Online moves (docs/moves.md) on one node: argument checks, the no-op, the
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
-- Nodes of databases this server does not have: each connection's
-- handshake goes on until the server refuses it.
SELECT sharding.add_node('a', sharding._coordinator_dsn() || ' dbname=nowhere_a'),
       sharding.add_node('b', sharding._coordinator_dsn() || ' dbname=nowhere_b');
-- Only under READ COMMITTED: the journal row commits over the engine's own
-- connection and is read back in this transaction, which a transaction
-- snapshot would not show. Refused (0A000) before anything is written.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, 'b')$$);
SELECT pg_temp.err(format($$SELECT sharding.isolate('mv', 'whale', %L)$$,
                          CASE :'whale_owner' WHEN 'a' THEN 'b' ELSE 'a' END));
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT pg_temp.err($$SELECT sharding.move_shard_online('mv', 0, 'b')$$);
ROLLBACK;
-- So is the journal's own entry point (before it looks at the move).
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.err($$SELECT sharding._move_execute(1)$$);
ROLLBACK;
SELECT count(*) AS journal_rows FROM sharding.move_journal;
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'nope', 0, NULL, 'b')$$);
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 8, NULL, 'b')$$);
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 0, NULL, NULL)$$);
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 0, NULL, 'unknown')$$);
SELECT pg_temp.err(format($$SELECT sharding._move_enqueue(NULL, 'mv', %s, 'whale', 'b')$$, (:whale_shard + 1) % 8));
-- A move of a job: of one that exists (42501 otherwise), running as the
-- job's role.
SELECT pg_temp.err($$SELECT sharding._move_enqueue(424242, 'mv', 0, NULL, 'b')$$);
INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel) VALUES ('mv', 'count', 'done', 1)
    RETURNING job AS mvjob \gset
SELECT sharding._move_enqueue(:mvjob, 'mv', 0, NULL, 'b') AS m1 \gset
SELECT job = :mvjob AS of_job, runas = (SELECT runas FROM sharding.move_jobs WHERE job = :mvjob) AS as_job_role,
       map, logical, key, source, destination, phase, rows_copied, lag_bytes, started IS NULL AS not_started
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
-- The source's and the destination's sessions are established at once
-- (their handshakes polled together); both are refused here, and the
-- error recorded is the source's (the first of the two), whichever of
-- them the server refused first.
SELECT error, error_detail LIKE '%"nowhere_a"%' AS source_named, error_detail LIKE '%"nowhere_b"%' AS destination_named
  FROM sharding.move_journal WHERE move = :m2;
SELECT phase, count(*) FROM sharding.move_journal GROUP BY phase ORDER BY phase;
SELECT sharding._move_recover() AS recovered_nothing;
-- An interrupted move (its executor died after the journal said
-- 'copying'): _move_recover rolls it back; here its nodes are unreachable,
-- so it warns and the row stays for the next call.
INSERT INTO sharding.move_journal (map, logical, source, destination, phase) VALUES ('mv', 1, 'a', 'b', 'copying');
SELECT sharding._move_recover() AS recovered;
SELECT pg_temp.err($$SELECT sharding._move_enqueue(NULL, 'mv', 1, NULL, 'b')$$) LIKE '55006: %' AS blocked;
DELETE FROM sharding.move_journal;
DELETE FROM sharding.move_jobs WHERE job = :mvjob;
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
-- Only a real switch is refused: a "move" to the current owner changes
-- nothing and returns the current epoch; a rebalance that plans no move
-- returns no row.
SELECT sharding.move_shard('withrows', 0, 'a') AS same_owner_epoch, sharding.move_shard('withrows', 3, 'b') AS same_owner_epoch;
SELECT count(*) AS planned FROM sharding.rebalance('withrows', ARRAY['a', 'b']);
SELECT count(*) AS planned FROM sharding.rebalance_by_load('withrows', ARRAY['a', 'b'], ARRAY[1, 1, 1, 1]::float8[]);
SELECT count(*) AS planned FROM sharding.rebalance_by_load('withrows', ARRAY['a', 'b'], ARRAY[5, 1, 5, 1]::float8[], 1.5);
SELECT logical, node, epoch FROM sharding.shards WHERE map = 'withrows' ORDER BY logical;
SELECT sharding.undistribute('moved_rows');
SELECT sharding.move_shard('withrows', 0, 'b') AS switched_without_tables;
SELECT count(*) AS rebalanced FROM sharding.rebalance('withrows', ARRAY['a']);
SELECT sharding.drop_map('withrows');
DROP TABLE moved_rows;

-- Deterministic object names: [a-z0-9_] and at most 63 bytes, distinct
-- for map names that fold alike.
SELECT regexp_replace(sharding._move_name('mv', 3), '^sharding_move_[0-9a-f]{6}_', 'sharding_move_TAG_') AS plain,
       regexp_replace(sharding._move_name('Big Map', 3), '^sharding_move_[0-9a-f]{6}_', 'sharding_move_TAG_') AS folded,
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

-- The copy's pull (sharding._move_pull), here from this database itself.
-- Cancelled while it waits for the source (statement_timeout): raised with
-- the cancel's own SQLSTATE, not as a failed copy (XX000); nothing is
-- copied.
SELECT sharding.add_node('pull_self', sharding._coordinator_dsn());
CREATE TABLE pull_dst (a int);
-- The source sends its first rows at once (more than its output buffer
-- holds), then sleeps: the pull waits for the next ones.
SET statement_timeout = '1s';
DO $$
BEGIN
    PERFORM sharding._move_pull('pull_self', NULL, 'pull_dst', ARRAY['a'],
        'SELECT g FROM pg_catalog.generate_series(1, 100000) g WHERE g < 5000 OR pg_catalog.pg_sleep(31) IS NULL');
EXCEPTION WHEN query_canceled THEN
    RAISE NOTICE 'cancelled here: %', SQLERRM;
WHEN OTHERS THEN
    RAISE NOTICE '%: %', SQLSTATE, SQLERRM;
END $$;
RESET statement_timeout;
SELECT count(*) AS pulled_rows FROM pull_dst;
DROP TABLE pull_dst;
SELECT sharding.drop_node('pull_self');
-- Literals in the SQL the pull sends are quoted as format's %L quotes them,
-- backslashes included: a table named with a backslash, pulled under an
-- exported snapshot from a source whose sessions have
-- standard_conforming_strings off (the size of the table there decides
-- whether the copy goes in parts).
SELECT sharding.add_node('pull_scs', sharding._coordinator_dsn() || ' options=''-c standard_conforming_strings=off''');
CREATE TABLE "pull\dst" (a int);
INSERT INTO "pull\dst" VALUES (1), (2), (3);
SELECT dblink_connect('snap', sharding._coordinator_dsn());
SELECT dblink_exec('snap', 'BEGIN ISOLATION LEVEL REPEATABLE READ');
SELECT s AS snap FROM dblink('snap', 'SELECT pg_catalog.pg_export_snapshot()') AS t(s text) \gset
SELECT (sharding._move_pull('pull_scs', :'snap', 'public."pull\dst"', ARRAY['a'],
                            'SELECT a FROM public."pull\dst" WHERE a > 1'))[1] AS pulled_under_snapshot;
SELECT dblink_disconnect('snap');
SELECT count(*) AS rows_now FROM "pull\dst";
DROP TABLE "pull\dst";
SELECT sharding.drop_node('pull_scs');

-- The checks and steps on a move's path that were PL/pgSQL until 1.3 (C++
-- now, src/routing/owner_switch.cpp and node_steps.cpp): results, SQLSTATEs
-- and messages, edge cases included, as the PL/pgSQL gave them.
SELECT sharding.create_map('cv', 4, ARRAY['cva', 'cvb']);
SELECT sharding._require_map('cv') AS shards, sharding._require_map('cv', true) AS locked,
       sharding._require_map('cv', NULL) AS null_for_update;
SELECT pg_temp.err($$SELECT sharding._require_map(NULL)$$);
SELECT pg_temp.err($$SELECT sharding._require_map('no "such" map', true)$$);
SELECT sharding._check_logical('cv', 3, 4) AS last_shard, sharding._check_logical('cv', 7, NULL) AS unknown_count;
SELECT pg_temp.err($$SELECT sharding._check_logical('cv', 4, 4)$$);
SELECT pg_temp.err($$SELECT sharding._check_logical('cv', -1, NULL)$$);
SELECT pg_temp.err($$SELECT sharding._check_logical(NULL, NULL, 4)$$);
SELECT pg_temp.err($$SELECT sharding._check_logical('cv', 2147483647, 1)$$);
-- A worker map takes any node; a database map refuses the first node
-- without a DSN (a NULL element too).
SELECT sharding._check_database_nodes('cv', ARRAY['x', NULL]) AS worker_map;
SELECT sharding.add_node('cva', 'host=/nonexistent dbname=cva');
SELECT pg_temp.err($$SELECT sharding._check_database_nodes('cv', ARRAY['cva', 'o''brien', 'c'])$$);
SELECT pg_temp.err($$SELECT sharding._check_database_nodes('cv', ARRAY[NULL, 'c'])$$);
SELECT sharding._check_database_nodes('cv', NULL) AS no_nodes, sharding._check_database_nodes('cv', '{}') AS empty;
SELECT pg_temp.err($$SELECT sharding._check_database_nodes('cv', ARRAY['cva', 'x'])$$);
SELECT sharding._check_database_nodes('unknown', ARRAY['x']) AS unknown_map_node_without_dsn;
SELECT pg_temp.err($$SELECT sharding._check_database_nodes('unknown', ARRAY['cva', 'x'])$$);
-- The switch: its checks, the same owner, a switch (epoch + 1, the node
-- registered).
SELECT pg_temp.err($$SELECT sharding._switch_owner('cv', 0, NULL)$$);
SELECT pg_temp.err($$SELECT sharding._switch_owner('cv', 0, '')$$);
SELECT pg_temp.err($$SELECT sharding._switch_owner(NULL, 0, 'cvb')$$);
SELECT pg_temp.err($$SELECT sharding._switch_owner('cv', NULL, 'cvb')$$);
SELECT pg_temp.err($$SELECT sharding._switch_owner('cv', 4, 'cvb')$$);
SELECT pg_temp.err($$SELECT sharding._switch_owner('cv', 0, 'cvb')$$);
SELECT sharding._switch_owner('cv', 0, 'cva') AS same_owner;
SELECT sharding.add_node('cvb', 'host=/nonexistent dbname=cvb');
SELECT sharding._switch_owner('cv', 0, 'cvb') AS switched;
SELECT s.node, s.epoch, n.dsn IS NOT NULL AS has_dsn FROM sharding.shards s JOIN sharding.nodes n USING (node)
 WHERE s.map = 'cv' AND s.logical = 0;
-- Freeze and thaw on a node; NULLs.
SELECT pg_temp.err($$SELECT sharding._freeze_shard(NULL, 0)$$);
SELECT pg_temp.err($$SELECT sharding._freeze_shard('cv', NULL)$$);
SELECT sharding._freeze_shard('cv', 1), sharding._freeze_shard('cv', 1);
SELECT map, logical FROM sharding.frozen_shards;
SELECT sharding._thaw_shard('cv', 1) AS thawed, sharding._thaw_shard('cv', 1) AS again,
       sharding._thaw_shard(NULL, NULL) AS nulls;
-- Guards: a table that does not exist is not guarded; one that cannot be
-- (a view) gives a WARNING, not an error; installing is idempotent, and a
-- new key column replaces the trigger; NULL names raise 22004.
CREATE TABLE cv_t (k text PRIMARY KEY, other text);
CREATE VIEW cv_v AS SELECT * FROM cv_t;
SELECT sharding._install_guard('public', 'no_such_table', 'k', 'cv') AS missing;
SELECT sharding._install_guard('public', 'cv_v', 'k', 'cv') AS a_view;
SELECT sharding._install_guard('public', 'cv_t', 'k', 'cv') AS guarded, sharding._install_guard('public', 'cv_t', 'k', 'cv') AS again;
SELECT tgname, pg_catalog.encode(tgargs, 'escape') AS args FROM pg_catalog.pg_trigger WHERE tgrelid = 'cv_t'::regclass;
SELECT sharding._install_guard('public', 'cv_t', 'other', 'cv') AS rekeyed;
SELECT tgname, pg_catalog.encode(tgargs, 'escape') AS args FROM pg_catalog.pg_trigger WHERE tgrelid = 'cv_t'::regclass;
SELECT pg_temp.err($$SELECT sharding._install_guard(NULL, 'cv_t', 'k', 'cv')$$);
SELECT sharding._install_guards() AS not_following;
DROP VIEW cv_v;
DROP TABLE cv_t;
-- The coordinator's DSN: the setting if not blank, else this session's.
SET sharding.coordinator_dsn = '  ';
SELECT sharding._coordinator_dsn() = pg_catalog.format('host=%s port=%s dbname=%s user=%s',
         pg_catalog.quote_literal(coalesce(pg_catalog.host(pg_catalog.inet_server_addr()),
             nullif(pg_catalog.btrim(pg_catalog.split_part(pg_catalog.current_setting('unix_socket_directories'), ',', 1)), ''),
             'localhost')),
         pg_catalog.current_setting('port'), pg_catalog.quote_literal(pg_catalog.current_database()),
         pg_catalog.quote_literal(current_user)) AS derived;
SET sharding.coordinator_dsn = ' host=example dbname=x ';
SELECT sharding._coordinator_dsn() AS as_set;
RESET sharding.coordinator_dsn;
SELECT sharding.drop_map('cv');
SELECT sharding.drop_node('cva'), sharding.drop_node('cvb');

-- The deletes of a move's rows on one node (sharding._move_delete_local,
-- src/move/move_delete.cpp): DELETE FROM rel WHERE filter with the BEFORE
-- ROW DELETE triggers that cannot fire in the session (under
-- session_replication_role = replica) left out for the statement, so that
-- no row is locked first: fewer WAL records, the same rows deleted, a
-- trigger that fires in replica mode still fires, and the table's triggers
-- are back for the next statement. TAP 470 runs it at a move's source.
CREATE TABLE md (id integer PRIMARY KEY, v text);
INSERT INTO md SELECT i, 'row ' || i FROM generate_series(1, 10000) i;
-- No autovacuum WAL inside the two measurements below.
ALTER TABLE md SET (autovacuum_enabled = off);
CREATE FUNCTION md_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'md_refuse fired'; END $$;
CREATE TRIGGER md_refuse BEFORE DELETE ON md FOR EACH ROW EXECUTE FUNCTION md_refuse();

-- Outside replica mode the trigger fires: nothing is left out.
SELECT pg_temp.err($$SELECT sharding._move_delete_local('md', 'id <= 10')$$);

-- Under replica mode: the same rows as a plain DELETE, with less WAL (the
-- plain DELETE locks each row, one more record per row, before it finds
-- that md_refuse does not fire). Each in a transaction rolled back.
BEGIN;
SET LOCAL session_replication_role = replica;
SELECT pg_current_wal_insert_lsn() AS before_plain \gset
DELETE FROM md WHERE id % 2 = 0;
SELECT pg_current_wal_insert_lsn() AS after_plain \gset
ROLLBACK;
BEGIN;
SET LOCAL session_replication_role = replica;
SELECT pg_current_wal_insert_lsn() AS before_ours \gset
SELECT sharding._move_delete_local('md', 'id % 2 = 0') AS deleted;
SELECT pg_current_wal_insert_lsn() AS after_ours \gset
SELECT count(*) AS left_after, min(id) % 2 AS only_odd_left FROM md;
ROLLBACK;
SELECT (:'after_ours'::pg_lsn - :'before_ours'::pg_lsn) < 0.8 * (:'after_plain'::pg_lsn - :'before_plain'::pg_lsn)
       AS less_wal_than_a_plain_delete;

-- The triggers are back: the same session, now in origin mode, fires it.
SELECT pg_temp.err($$DELETE FROM md WHERE id = 1$$);
SELECT count(*) AS rows_kept FROM md;

-- A trigger that fires in replica mode (ALWAYS) keeps running, once per row
-- (with the search_path of the function that runs the delete, as in an
-- apply worker: it names its table's schema).
CREATE TABLE md_fired (n integer NOT NULL);
INSERT INTO md_fired VALUES (0);
CREATE FUNCTION md_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE public.md_fired SET n = n + 1; RETURN OLD; END $$;
CREATE TRIGGER md_count BEFORE DELETE ON md FOR EACH ROW EXECUTE FUNCTION md_count();
ALTER TABLE md ENABLE ALWAYS TRIGGER md_count;
BEGIN;
SET LOCAL session_replication_role = replica;
SELECT sharding._move_delete_local('md', 'id <= 100') AS deleted_with_always_trigger;
SELECT n AS always_trigger_fired FROM md_fired;
COMMIT;
DROP TRIGGER md_count ON md;

-- One condition only; NULLs; no such table; nothing deleted by a refusal.
BEGIN;
SET LOCAL session_replication_role = replica;
SELECT pg_temp.err($$SELECT sharding._move_delete_local('md', 'true; DROP TABLE md')$$);
SELECT pg_temp.err($$SELECT sharding._move_delete_local('md', 'true RETURNING id')$$);
SELECT pg_temp.err($$SELECT sharding._move_delete_local('md', 'no_such_column = 1')$$);
SELECT sharding._move_delete_local('md', NULL) IS NULL AS strict_null;
SELECT pg_temp.err($$SELECT sharding._move_delete_local('no_such_table', 'true')$$);
COMMIT;
SELECT count(*) AS rows_kept FROM md;

-- Privileges: internal, for sharding_admin; the caller's own DELETE right.
CREATE ROLE md_user;
CREATE ROLE md_admin IN ROLE sharding_admin;
GRANT SELECT ON md TO md_admin;
SET ROLE md_user;
SELECT pg_temp.err($$SELECT sharding._move_delete_local('md', 'id = 200')$$);
RESET ROLE;
SET ROLE md_admin;
SELECT pg_temp.err($$SELECT sharding._move_delete_local('md', 'id = 200')$$);
RESET ROLE;
SELECT count(*) AS rows_kept FROM md;

DROP TABLE md, md_fired;
DROP FUNCTION md_refuse(), md_count();
DROP ROLE md_user, md_admin;

-- move_abandon (docs/moves.md, "A node gone for good"): its arguments
-- checked before anything else; no live move of the shard is 42704; only
-- sharding_admin (and the owner) may call it.
SELECT pg_temp.err($$SELECT sharding.move_abandon('nope', 0)$$);
SELECT pg_temp.err($$SELECT sharding.move_abandon('mv', 8)$$);
SELECT pg_temp.err($$SELECT sharding.move_abandon(NULL, 0)$$);
SELECT pg_temp.err($$SELECT sharding.move_abandon('mv', NULL)$$);
SELECT pg_temp.err($$SELECT sharding.move_abandon('mv', 0, NULL)$$);
SELECT pg_temp.err($$SELECT sharding.move_abandon('mv', 0)$$);
CREATE ROLE ma_user;
SET ROLE ma_user;
SELECT pg_temp.err($$SELECT sharding.move_abandon('mv', 0)$$);
RESET ROLE;
DROP ROLE ma_user;

SELECT sharding.drop_map('mv');
DROP EXTENSION sharding;
DROP EXTENSION dblink;
