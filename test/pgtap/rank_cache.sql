-- Rank guards: another backend's caches follow committed guard changes.
-- Backend "b" (a dblink connection) caches a guard, the column's ranks and
-- advance's plan; this session changes the guard, the enum, the primary key;
-- b must obey the change on its next statement. No BEGIN: b only sees what
-- this session has committed. Everything created here is dropped at the end.
\set ON_ERROR_STOP 1
\set QUIET 1
SET client_min_messages = warning;

SELECT plan(20);

CREATE TABLE rank_cache_t (id int PRIMARY KEY, status text);
INSERT INTO rank_cache_t SELECT g, 'a' FROM generate_series(1, 4) AS g;
CREATE TYPE rank_cache_e AS ENUM ('e1', 'e2', 'e3');
CREATE TABLE rank_cache_en (id int PRIMARY KEY, status rank_cache_e);
INSERT INTO rank_cache_en SELECT g, 'e1' FROM generate_series(1, 3) AS g;
SELECT sharding.guard_rank('rank_cache_t', 'status', ARRAY['a', 'b', 'c']);
SELECT sharding.guard_rank('rank_cache_en', 'status');

SELECT dblink_connect('b', format('host=%s port=%s dbname=%s user=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'),
    current_database(), current_user));

-- b warms its caches.
SELECT is(dblink_exec('b', $$UPDATE rank_cache_t SET status = 'c' WHERE id = 1$$), 'UPDATE 1', 'b: forward update');
SELECT is(dblink_exec('b', $$UPDATE rank_cache_t SET status = 'a' WHERE id = 1$$), 'UPDATE 0', 'b: backward skipped');
SELECT is((SELECT r FROM dblink('b', $$SELECT sharding.rank_of('rank_cache_t', 'status', 'c')$$) AS t(r int)), 2,
          'b: rank_of c is 2');
SELECT is((SELECT m FROM dblink('b', $$SELECT sharding.advance('rank_cache_t', 2, 'b')$$) AS t(m boolean)), true,
          'b: advance a -> b');

-- Reverse the ranks here; b must see the new guard at once.
SELECT sharding.guard_rank('rank_cache_t', 'status', ARRAY['c', 'b', 'a']);
SELECT is(dblink_exec('b', $$UPDATE rank_cache_t SET status = 'a' WHERE id = 1$$), 'UPDATE 1',
          'b: c -> a is forward under the new guard');
SELECT is(dblink_exec('b', $$UPDATE rank_cache_t SET status = 'c' WHERE id = 1$$), 'UPDATE 0',
          'b: a -> c is backward under the new guard');
SELECT is((SELECT r FROM dblink('b', $$SELECT sharding.rank_of('rank_cache_t', 'status', 'c')$$) AS t(r int)), 0,
          'b: rank_of c is now 0');
SELECT is((SELECT m FROM dblink('b', $$SELECT sharding.advance('rank_cache_t', 2, 'c')$$) AS t(m boolean)), false,
          'b: advance b -> c refused under the new guard');
SELECT is((SELECT m FROM dblink('b', $$SELECT sharding.advance('rank_cache_t', 2, 'a')$$) AS t(m boolean)), true,
          'b: advance b -> a allowed under the new guard');

-- Switch to 'error': b raises 23514.
SELECT sharding.guard_rank('rank_cache_t', 'status', ARRAY['c', 'b', 'a'], 'error');
SELECT throws_ok($$SELECT dblink_exec('b', 'UPDATE rank_cache_t SET status = ''c'' WHERE id = 1')$$, '23514', NULL,
                 'b: the error guard raises 23514');

-- Unguard: b's updates are free, rank_of on text fails.
SELECT sharding.unguard_rank('rank_cache_t', 'status');
SELECT is(dblink_exec('b', $$UPDATE rank_cache_t SET status = 'c' WHERE id = 1$$), 'UPDATE 1', 'b: unguarded');
SELECT throws_ok($$SELECT * FROM dblink('b', 'SELECT sharding.rank_of(''rank_cache_t'', ''status'', ''c'')') AS t(r int)$$,
                 '22023', NULL, 'b: rank_of of an unguarded text column is 22023');

-- Primary key dropped under b's prepared plan: 22023.
SELECT sharding.guard_rank('rank_cache_t', 'status', ARRAY['a', 'b', 'c']);
SELECT is((SELECT m FROM dblink('b', $$SELECT sharding.advance('rank_cache_t', 3, 'b')$$) AS t(m boolean)), true,
          'b: advance with the primary key');
ALTER TABLE rank_cache_t DROP CONSTRAINT rank_cache_t_pkey;
SELECT throws_ok($$SELECT * FROM dblink('b', 'SELECT sharding.advance(''rank_cache_t'', 3, ''c'')') AS t(m boolean)$$,
                 '22023', NULL, 'b: advance after the primary key is dropped is 22023');

-- Enum values added here, BEFORE existing ones, are ranked by sort order in b.
SELECT is(dblink_exec('b', $$UPDATE rank_cache_en SET status = 'e3' WHERE id = 1$$), 'UPDATE 1', 'b: enum forward');
ALTER TYPE rank_cache_e ADD VALUE 'e0' BEFORE 'e1';
ALTER TYPE rank_cache_e ADD VALUE 'e2b' BEFORE 'e3';
SELECT is((SELECT r FROM dblink('b', $$SELECT sharding.rank_of('rank_cache_en', 'status', 'e2b')$$) AS t(r int)), 3,
          'b: rank_of the added value follows the sort order');
SELECT is(dblink_exec('b', $$UPDATE rank_cache_en SET status = 'e2b' WHERE id = 1$$), 'UPDATE 0',
          'b: e3 -> e2b (added before e3) is backward');
SELECT is(dblink_exec('b', $$UPDATE rank_cache_en SET status = 'e2b' WHERE id = 2$$), 'UPDATE 1',
          'b: e1 -> e2b is forward');
SELECT is(dblink_exec('b', $$UPDATE rank_cache_en SET status = 'e0' WHERE id = 3$$), 'UPDATE 0',
          'b: e1 -> e0 (added before e1) is backward');
SELECT is((SELECT m FROM dblink('b', $$SELECT sharding.advance('rank_cache_en', 3, 'e2b')$$) AS t(m boolean)), true,
          'b: advance to the added value');

SELECT dblink_disconnect('b');
SELECT * FROM finish();
DROP TABLE rank_cache_t, rank_cache_en;
DROP TYPE rank_cache_e;
