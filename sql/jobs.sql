-- Rebalance jobs (docs/rebalance.md) on one node: argument checks (22023,
-- 42704, 55006, 42501, each changing nothing), maps without distributed tables
-- (owner switches done before rebalance_start returns), drain_node's plan,
-- wait and cancel of ended jobs, and the views. test/tap/5xx move data.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
CREATE FUNCTION pg_temp.snapshot() RETURNS text LANGUAGE sql AS $$
    SELECT (SELECT string_agg(logical || '=' || node || '@' || epoch, ' ' ORDER BY logical)
              FROM sharding.shards WHERE map = 'j')
        || ' | pins ' || coalesce((SELECT string_agg(key || '=' || node, ' ' ORDER BY key)
                                     FROM sharding.pins WHERE map = 'j'), '-')
        || ' | jobs ' || (SELECT count(*) FROM sharding.move_jobs)
$$;

SELECT sharding.create_map('j', 8, ARRAY['a', 'b']);
SELECT pg_temp.snapshot() AS before \gset
SELECT :'before' AS before;

-- Bad input: nothing changes.
SELECT pg_temp.err($$SELECT sharding.rebalance_start('nope', ARRAY['a', 'b', 'c'])$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start(NULL, ARRAY['a', 'b', 'c'])$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], strategy => 'random')$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], strategy => NULL)$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], strategy => 'load')$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], loads => '{1,1,1,1,1,1,1,1}')$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], strategy => 'load', loads => '{1,2}')$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], max_parallel => 0)$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], max_parallel => NULL)$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'a'])$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', NULL)$$);
SELECT pg_temp.err($$SELECT sharding.drain_node('nope', 'a')$$);
SELECT pg_temp.err($$SELECT sharding.drain_node('j', NULL)$$);
SELECT pg_temp.err($$SELECT sharding.drain_node('j', 'a', max_parallel => -1)$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_wait(424242)$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_wait(NULL)$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_cancel(424242)$$);
SELECT pg_temp.err($$CALL sharding.rebalance_run(424242)$$);
SELECT pg_temp.snapshot() = :'before' AS nothing_changed;

-- A map without distributed tables: the plan's owner switches are done
-- before rebalance_start returns, exactly rebalance's plan, and the job is
-- done with that many moves.
CREATE TEMP TABLE plan AS SELECT * FROM sharding.rebalance('j', ARRAY['a', 'b', 'c'], dry_run => true);
SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'], max_parallel => 2) AS job1 \gset
SELECT state, strategy, moves_total = (SELECT count(*) FROM plan) AS all_planned, moves_done = moves_total AS all_done,
       moves_failed, started IS NOT NULL AND finished IS NOT NULL AS timed, error,
       expected_end = finished AS ended_when_finished
  FROM sharding.rebalance_jobs WHERE job = :job1;
SELECT count(*) AS switched_as_planned FROM plan p JOIN sharding.shards s
    ON s.map = 'j' AND s.logical = p.logical AND s.node = p.to_node AND s.epoch = 2;
SELECT count(*) AS untouched_at_epoch_1 FROM sharding.shards s WHERE s.map = 'j' AND s.epoch = 1;
SELECT sharding.rebalance_wait(:job1) AS waited, sharding.rebalance_cancel(:job1) AS cancelled_ended_job;
SELECT sharding.rebalance_wait(:job1, '0 s') AS zero_timeout;
SELECT pg_temp.err($$SELECT sharding.rebalance_wait(1, '-1 s')$$);
-- Nothing left to do: a job done at once with no moves.
SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c']) AS job2 \gset
SELECT state, moves_total FROM sharding.rebalance_jobs WHERE job = :job2;

-- expected_end of a running job: its moves' time_left (move_progress)
-- summed, shared among its max_parallel workers. Two queued moves of a map
-- whose finished moves took 10 s and 20 s (median 15 s each), two workers:
-- about 15 s from now. NULL while a move of it has no estimate.
BEGIN;
INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel, started)
VALUES ('j', 'count', 'running', 2, now()) RETURNING job AS ejob \gset
INSERT INTO sharding.move_journal (job, map, logical, source, destination) VALUES (:ejob, 'j', 2, 'a', 'b');
SELECT expected_end IS NULL AS no_history_no_estimate FROM sharding.rebalance_jobs WHERE job = :ejob;
INSERT INTO sharding.move_journal (map, logical, source, destination, phase, started, finished)
VALUES ('j', 0, 'a', 'b', 'done', now() - interval '30 s', now() - interval '20 s'),
       ('j', 1, 'a', 'b', 'done', now() - interval '40 s', now() - interval '20 s');
INSERT INTO sharding.move_journal (job, map, logical, source, destination) VALUES (:ejob, 'j', 3, 'a', 'b');
SELECT expected_end - clock_timestamp() BETWEEN interval '14 s' AND interval '16 s' AS about_15_s_left
  FROM sharding.rebalance_jobs WHERE job = :ejob;
ROLLBACK;

-- Strategy load: rebalance_by_load's plan.
SELECT pg_temp.snapshot() AS before \gset
CREATE TEMP TABLE lplan AS
    SELECT * FROM sharding.rebalance_by_load('j', ARRAY['a', 'b'], '{9,1,1,1,1,1,1,1}', 1.2, dry_run => true);
SELECT sharding.rebalance_start('j', ARRAY['a', 'b'], 'load', '{9,1,1,1,1,1,1,1}', 1.2) AS job3 \gset
SELECT state, strategy, moves_total = (SELECT count(*) FROM lplan) AS as_planned, moves_total > 0 AS moved
  FROM sharding.rebalance_jobs WHERE job = :job3;
SELECT count(*) = (SELECT count(*) FROM lplan) AS load_switched_as_planned FROM lplan p JOIN sharding.shards s
    ON s.map = 'j' AND s.logical = p.logical AND s.node = p.to_node;
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b'], 'load', '{1,1,1,1,1,1,1,-1}')$$);

-- drain_node: shards count-balanced onto the other owners, pins onto the
-- owner of their shard; then drop_node succeeds.
SELECT sharding.create_map('d', 8, ARRAY['a', 'b', 'c']);
SELECT sharding.pin('d', 'whale', 'c');
SELECT sharding.pin('d', 'minnow', 'a');
SELECT sharding.drain_node('d', 'c') AS job4 \gset
SELECT state, strategy, moves_total FROM sharding.rebalance_jobs WHERE job = :job4;
SELECT node, count(*) FROM sharding.shards WHERE map = 'd' GROUP BY node ORDER BY node;
SELECT p.node = s.node AS whale_with_its_shard FROM sharding.pins p
  JOIN sharding.shards s ON s.map = p.map AND s.logical = sharding.logical_shard('d', p.key)
 WHERE p.map = 'd' AND p.key = 'whale';
SELECT node FROM sharding.pins WHERE map = 'd' AND key = 'minnow';
-- A node owning nothing: done at once; the only node: 55000.
SELECT sharding.drain_node('d', 'c') AS job5 \gset
SELECT state, moves_total FROM sharding.rebalance_jobs WHERE job = :job5;
SELECT sharding.drain_node('j', 'zzz') IS NOT NULL AS unknown_node_owns_nothing;
SELECT sharding.create_map('solo', 4, ARRAY['a']);
SELECT pg_temp.err($$SELECT sharding.drain_node('solo', 'a')$$);
SELECT count(*) AS solo_jobs FROM sharding.rebalance_jobs WHERE map = 'solo';
SELECT sharding.drop_map('d');

-- Privileges: starting, waiting, cancelling and running need the owner
-- or sharding_admin (42501); reading the views does not.
CREATE ROLE jobs_reader;
CREATE ROLE jobs_admin IN ROLE sharding_admin;
SELECT pg_temp.snapshot() AS before \gset
SET ROLE jobs_reader;
SELECT pg_temp.err($$SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c'])$$);
SELECT pg_temp.err($$SELECT sharding.drain_node('j', 'c')$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_wait(1)$$);
SELECT pg_temp.err($$SELECT sharding.rebalance_cancel(1)$$);
SELECT pg_temp.err($$CALL sharding.rebalance_run(1)$$);
SELECT pg_temp.err($$SELECT sharding._job_launch(1, 1, 10)$$);
SELECT count(*) > 0 AS reader_sees_jobs FROM sharding.rebalance_jobs;
SELECT count(*) AS reader_sees_no_live_move FROM sharding.move_progress;
RESET ROLE;
SELECT pg_temp.snapshot() = :'before' AS nothing_changed;
SET ROLE jobs_admin;
SELECT sharding.rebalance_start('j', ARRAY['a', 'b', 'c']) > 0 AS admin_may_start;
SELECT pg_temp.err($$SELECT sharding._job_launch(1, 1, 10)$$);
RESET ROLE;
DROP ROLE jobs_reader;
DROP ROLE jobs_admin;

-- rebalance_cancel cancels each move on its own: a move it cannot roll
-- back now (interrupted, its nodes unreachable) is a WARNING, left to
-- recovery, and the cancel stands (cancel_requested, the queued move
-- cancelled) instead of being rolled back after the queued moves were
-- cancelled for good. And a job any of whose moves was cancelled never ends
-- 'done', even without cancel_requested.
SELECT sharding.create_map('x', 4, ARRAY['xa']);
SELECT sharding.add_node('xa', 'dbname=nowhere_xa'), sharding.add_node('xb', 'dbname=nowhere_xb');
INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel, runas, started)
    VALUES ('x', 'drain', 'running', 1, (SELECT oid FROM pg_roles WHERE rolname = current_user), now())
    RETURNING job AS xjob \gset
SELECT sharding._move_enqueue(:xjob, 'x', 0, NULL, 'xb') AS xqueued \gset
INSERT INTO sharding.move_journal (job, map, logical, source, destination, phase, pid, started)
    VALUES (:xjob, 'x', 1, 'xa', 'xb', 'copying', 999999, now()) RETURNING move AS xinterrupted \gset
SELECT sharding.rebalance_cancel(:xjob) AS cancel_accepted;
SELECT cancel_requested FROM sharding.move_jobs WHERE job = :xjob;
SELECT move = :xqueued AS queued_move, phase FROM sharding.move_journal WHERE job = :xjob ORDER BY move;
-- Once the interrupted move is gone, the job ends cancelled.
DELETE FROM sharding.move_journal WHERE move = :xinterrupted;
SELECT sharding._job_claim(:xjob) IS NULL AS job_over;
SELECT state FROM sharding.move_jobs WHERE job = :xjob;
-- A move cancelled by itself (_move_cancel), the job's cancel not asked for.
INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel, runas, started)
    VALUES ('x', 'drain', 'running', 1, (SELECT oid FROM pg_roles WHERE rolname = current_user), now())
    RETURNING job AS yjob \gset
SELECT sharding._move_enqueue(:yjob, 'x', 0, NULL, 'xb') AS ymove \gset
SELECT sharding._move_cancel(:ymove) AS move_cancelled;
SELECT sharding._job_claim(:yjob) IS NULL AS job_over;
SELECT state, error FROM sharding.move_jobs WHERE job = :yjob;

-- A background runner whose job's role may not run moves (neither a member
-- of sharding_admin nor the extension's owner; checked before each claim)
-- gives up at once, and the job fails saying why (42501), its moves not
-- begun cancelled, as a failed move makes it fail: it does not stay
-- 'queued' with nobody to run it, and rebalance_wait returns. (A runner
-- whose claims fail otherwise gives up after 30 retries.)
CREATE ROLE jobs_nopriv LOGIN;
INSERT INTO sharding.move_jobs (map, strategy, max_parallel, runas)
    VALUES ('x', 'drain', 1, 'jobs_nopriv'::regrole::oid) RETURNING job AS zjob \gset
SELECT sharding._move_enqueue(:zjob, 'x', 0, NULL, 'xb') AS zmove \gset
SELECT sharding._job_launch(:zjob, 1, 'jobs_nopriv'::regrole::oid) AS launched;
SELECT sharding.rebalance_wait(:zjob, '120 s') AS waited;
SELECT state, error, started IS NOT NULL AND finished IS NOT NULL AS timed FROM sharding.move_jobs WHERE job = :zjob;
SELECT phase FROM sharding.move_journal WHERE move = :zmove;
DROP ROLE jobs_nopriv;
SELECT sharding.drop_map('x');
DROP EXTENSION sharding;
