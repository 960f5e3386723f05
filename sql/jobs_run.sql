-- Rebalance jobs (docs/rebalance.md): what CALL rebalance_run and
-- rebalance_start must get right on one node (sql/jobs.sql has the rest;
-- test/tap/5xx move data).
CREATE EXTENSION sharding;

-- rebalance_run commits between its steps, inside its own call. The cache
-- module counts the calls of the extension running (a cache entry replaced
-- meanwhile is freed when the outermost returns, cache.hpp), and the end of
-- a transaction sets that count to 0: after a commit inside rebalance_run
-- the count must be given back, or it is one too low until the transaction
-- ends, and a call nested in another (a trigger fired by claim that routes)
-- returns to 0 and frees what the outer call still uses.
SELECT sharding.create_map('r', 4, ARRAY['a', 'b']);
SELECT sharding.create_queue('rq') IS NOT NULL AS queue_made;
CREATE TABLE depth_log (seq serial, at text, depth bigint, routed text);
CREATE FUNCTION log_depth() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO depth_log (at, depth, routed)
        VALUES (TG_ARGV[0], sharding._boundary_selftest('call_depth'), sharding.node_for('r', NEW.key));
    RETURN NEW;
END $$;
CREATE TRIGGER log_depth AFTER UPDATE ON rq FOR EACH ROW EXECUTE FUNCTION log_depth('in a trigger fired by claim');
SELECT sharding.enqueue('rq', 'k' || i) IS NOT NULL AS enqueued FROM generate_series(1, 2) AS i;
-- A job with nothing to carry (no distributed table): done at once; running
-- it commits twice.
SELECT sharding.rebalance_start('r', ARRAY['a', 'b', 'c']) IS NOT NULL AS started;
-- Without rebalance_run first: 1 at the top, 2 in the trigger.
DO $$
BEGIN
    INSERT INTO depth_log (at, depth) VALUES ('plain call', sharding._boundary_selftest('call_depth'));
    PERFORM count(*) FROM sharding.claim(NULL::rq, 'w1', 1);
END $$;
-- After CALL rebalance_run in the same block: the same.
DO $$
DECLARE
    j bigint := (SELECT max(job) FROM sharding.move_jobs);
BEGIN
    CALL sharding.rebalance_run(j);
    INSERT INTO depth_log (at, depth) VALUES ('after rebalance_run', sharding._boundary_selftest('call_depth'));
    PERFORM sharding.node_for('r', 'k1');
    PERFORM count(*) FROM sharding.claim(NULL::rq, 'w2', 1);
END $$;
SELECT at, depth, routed IS NOT NULL AS routed FROM depth_log ORDER BY seq;
SELECT sharding._boundary_selftest('call_depth') AS depth_in_a_new_transaction;
DROP TABLE depth_log, rq;
DROP FUNCTION log_depth();
SELECT sharding.drop_map('r');

-- rebalance_start gives loads and max_imbalance to the planner and to the
-- job row as the float8 values they are: their text form would round them
-- under extra_float_digits = 0 (0.1 + 0.2 would be 0.3, 1 + 2^-52 would be 1).
SELECT sharding.create_map('f', 4, ARRAY['a', 'b']);
SET extra_float_digits = 0;
SELECT sharding.rebalance_start('f', ARRAY['a', 'b'], 'load', ARRAY[0.1::float8 + 0.2, 1, 1, 1],
                                1 + 2 ^ -52::float8) AS fjob \gset
SELECT loads = ARRAY[0.1::float8 + 0.2, 1, 1, 1] AS loads_exact, loads[1] = 0.3::float8 AS loads_rounded,
       max_imbalance = 1 + 2 ^ -52::float8 AS max_imbalance_exact, max_imbalance = 1 AS max_imbalance_rounded,
       state
  FROM sharding.move_jobs WHERE job = :fjob;
RESET extra_float_digits;
SELECT sharding.drop_map('f');

-- A job's claim of a move is the move engine's own lock of it (the one its
-- executor and recovery take): a move another session holds (here a
-- second connection holding that lock, as recovery does while it rolls a
-- move back) is in flight, not claimed; rebalance_run waits for it instead
-- of failing with 55006, and holds no lock of it afterwards. Once it is
-- free, the move is carried out (it fails: its nodes cannot be reached).
CREATE EXTENSION dblink;
SELECT sharding.create_map('c', 4, ARRAY['ca']);
SELECT sharding.add_node('ca', 'dbname=nowhere_ca'), sharding.add_node('cb', 'dbname=nowhere_cb');
INSERT INTO sharding.move_jobs (map, strategy, max_parallel, runas)
    VALUES ('c', 'count', 1, (SELECT oid FROM pg_roles WHERE rolname = current_user)) RETURNING job AS cjob \gset
SELECT sharding._move_enqueue(:cjob, 'c', 0, NULL, 'cb') AS cmove \gset
SELECT dblink_connect('holder', sharding._coordinator_dsn());
SELECT x FROM dblink('holder', format('SELECT pg_advisory_lock(hashtext(%L), %s)::text', 'sharding.move_journal',
                                      :cmove % 2147483647)) AS t(x text);
SET statement_timeout = '1500ms';
CALL sharding.rebalance_run(:cjob);
RESET statement_timeout;
SELECT phase FROM sharding.move_journal WHERE move = :cmove;
SELECT count(*) AS advisory_locks_left_here FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
SELECT dblink_disconnect('holder');
CALL sharding.rebalance_run(:cjob);
SELECT j.state, m.phase, m.error_state FROM sharding.move_jobs j JOIN sharding.move_journal m USING (job)
 WHERE j.job = :cjob;
SELECT count(*) AS advisory_locks_left_here FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
SELECT sharding.drop_map('c');
DROP EXTENSION dblink;
DROP EXTENSION sharding;
