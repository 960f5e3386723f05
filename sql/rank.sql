-- Rank-guarded transitions (docs/rank.md). Concurrency and dump/restore are in
-- test/tap/250_rank_storm.pl and test/tap/622_rank_dump.pl.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Rows touched by a statement (the row count the client sees).
CREATE FUNCTION pg_temp.rows(q text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    EXECUTE q;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Text ranks, 'skip' ------------------------------------------------------
CREATE TABLE orders (id bigint PRIMARY KEY, status text, note text);
INSERT INTO orders SELECT g, 'preparing', '' FROM generate_series(1, 6) AS g;
SELECT sharding.guard_rank('orders', 'status', ARRAY['preparing', 'shipped', 'delivered']);
SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
SELECT schema_name, table_name, column_name, ranks, on_regress FROM sharding.rank_guards;

SELECT sharding.rank_of('orders', 'status', 'preparing') AS r0, sharding.rank_of('orders', 'status', 'shipped') AS r1,
       sharding.rank_of('orders', 'status', 'delivered') AS r2;

-- Forward passes; backward is skipped and the row count shows it.
SELECT pg_temp.rows($$UPDATE orders SET status = 'delivered' WHERE id IN (1, 2)$$) AS forward;
SELECT pg_temp.rows($$UPDATE orders SET status = 'shipped' WHERE id <= 4$$) AS shipped_2_of_4;
SELECT id, status FROM orders ORDER BY id;
-- Equal rank passes (and is counted).
SELECT pg_temp.rows($$UPDATE orders SET status = 'delivered' WHERE id = 1$$) AS equal_rank;
SELECT pg_temp.rows($$UPDATE orders SET status = 'preparing'$$) AS backward_all;
-- Updates of other columns are not checked at all, also on delivered rows.
SELECT pg_temp.rows($$UPDATE orders SET note = 'n' || id$$) AS other_column;
-- A SET of the column to its own value passes.
SELECT pg_temp.rows($$UPDATE orders SET status = status, note = 'again'$$) AS self_assign;
SELECT id, status, note FROM orders ORDER BY id;

-- Every write path: UPDATE ... FROM, ON CONFLICT DO UPDATE, PL/pgSQL, CTE.
SELECT pg_temp.rows($$UPDATE orders o SET status = v.s FROM (VALUES (1, 'preparing'), (5, 'delivered')) AS v(i, s) WHERE o.id = v.i$$) AS update_from;
SELECT pg_temp.rows($$INSERT INTO orders VALUES (2, 'shipped', '') ON CONFLICT (id) DO UPDATE SET status = excluded.status$$) AS upsert_back;
DO $$ BEGIN UPDATE orders SET status = 'preparing' WHERE id = 3; END $$;
WITH w AS (UPDATE orders SET status = 'shipped' WHERE id = 5 RETURNING id) SELECT count(*) AS cte_back FROM w;
SELECT id, status FROM orders ORDER BY id;

-- NULL sorts below every rank: NULL may become anything, nothing becomes NULL.
INSERT INTO orders VALUES (7, NULL, '');
SELECT pg_temp.rows($$UPDATE orders SET status = NULL WHERE id = 7$$) AS null_to_null;
SELECT pg_temp.rows($$UPDATE orders SET status = 'shipped' WHERE id = 7$$) AS null_to_rank;
SELECT pg_temp.rows($$UPDATE orders SET status = NULL WHERE id = 7$$) AS rank_to_null;
SELECT status FROM orders WHERE id = 7;

-- A new value outside the ranks: 22023, from the trigger too.
SELECT pg_temp.err($$UPDATE orders SET status = 'lost' WHERE id = 1$$);
-- An old value outside the ranks (written before the guard) has no rank.
ALTER TABLE orders DISABLE TRIGGER USER;
UPDATE orders SET status = 'legacy' WHERE id = 6;
ALTER TABLE orders ENABLE TRIGGER USER;
SELECT pg_temp.rows($$UPDATE orders SET status = 'legacy', note = 'same' WHERE id = 6$$) AS unranked_unchanged;
SELECT pg_temp.rows($$UPDATE orders SET status = 'preparing' WHERE id = 6$$) AS unranked_to_rank;

-- 'error' replaces the guard: 23514 naming old and new values -------------
SELECT sharding.guard_rank('orders', 'status', ARRAY['preparing', 'shipped', 'delivered'], 'error');
SELECT count(*) AS guard_triggers FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
SELECT on_regress FROM sharding.rank_guards WHERE table_name = 'orders';
SELECT pg_temp.err($$UPDATE orders SET status = 'shipped' WHERE id = 1$$);
SELECT pg_temp.err($$UPDATE orders SET status = NULL WHERE id = 1$$);
-- (Fields read with GET STACKED DIAGNOSTICS: psql's verbose mode would also
-- print the source line, which changes with every edit and compiler.)
DO $$
DECLARE st text; m text; d text; h text; sch text; tbl text; col text;
BEGIN
    UPDATE orders SET status = 'preparing' WHERE id = 5;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL,
        h = PG_EXCEPTION_HINT, sch = SCHEMA_NAME, tbl = TABLE_NAME, col = COLUMN_NAME;
    RAISE NOTICE E'%: %\nDETAIL: %\nHINT: %\nSCHEMA NAME: %, TABLE NAME: %, COLUMN NAME: %', st, m, d, h, sch, tbl, col;
END $$;
-- A failed statement changes nothing, not even rows that could move.
SELECT pg_temp.err($$UPDATE orders SET status = 'shipped'$$);
SELECT id, status FROM orders ORDER BY id;
SELECT pg_temp.rows($$UPDATE orders SET status = 'delivered' WHERE id = 3$$) AS forward_in_error_mode;

-- New ranks take effect at once (the backend's cache is refreshed).
SELECT sharding.guard_rank('orders', 'status', ARRAY['delivered', 'shipped', 'preparing']);
SELECT pg_temp.rows($$UPDATE orders SET status = 'shipped' WHERE id = 1$$) AS now_forward;
SELECT sharding.rank_of('orders', 'status', 'delivered') AS delivered_now_0;

-- Renamed column and table: the guard follows them.
ALTER TABLE orders RENAME COLUMN status TO state;
ALTER TABLE orders RENAME TO orders2;
SELECT pg_temp.rows($$UPDATE orders2 SET state = 'delivered' WHERE id = 1$$) AS renamed_backward;
SELECT sharding.rank_of('orders2', 'state', 'preparing') AS renamed_rank;
ALTER TABLE orders2 RENAME TO orders;
ALTER TABLE orders RENAME COLUMN state TO status;

-- unguard_rank removes trigger and config row.
SELECT sharding.unguard_rank('orders', 'status');
SELECT count(*) AS triggers_left FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
SELECT count(*) AS config_left FROM sharding.rank_guards;
SELECT pg_temp.rows($$UPDATE orders SET status = 'delivered' WHERE id = 1$$) AS unguarded_any;
SELECT sharding.unguard_rank('orders', 'status');
SELECT pg_temp.err($$SELECT sharding.rank_of('orders', 'status', 'shipped')$$);

-- advance -----------------------------------------------------------------
SELECT sharding.guard_rank('orders', 'status', ARRAY['preparing', 'shipped', 'delivered']);
UPDATE orders SET status = 'preparing' WHERE id = 1;  -- skipped: delivered
TRUNCATE orders;
INSERT INTO orders SELECT g, 'preparing', '' FROM generate_series(1, 4) AS g;
INSERT INTO orders VALUES (5, NULL, '');
SELECT sharding.advance('orders', 1, 'shipped') AS fwd, sharding.advance('orders', 1, 'shipped') AS equal,
       sharding.advance('orders', 1, 'preparing') AS back, sharding.advance('orders', 1, 'delivered') AS fwd2;
-- id of another type: integer and bigint, text through the key's input.
SELECT sharding.advance('orders', 2::bigint, 'delivered') AS int8, sharding.advance('orders', 3::smallint, 'shipped') AS int2,
       sharding.advance('orders', '4'::text, 'shipped') AS text_id, sharding.advance('orders', 99, 'shipped') AS no_row,
       sharding.advance('orders', 5, 'preparing') AS from_null;
SELECT sharding.advance(tbl => 'orders', id => 4, new_value => 'delivered', col => 'status') AS named;
SELECT id, status FROM orders ORDER BY id;
SELECT pg_temp.err($$SELECT sharding.advance('orders', 1, 'lost')$$);
SELECT pg_temp.err($$SELECT sharding.advance('orders', 'x'::text, 'shipped')$$);
SELECT pg_temp.err($$SELECT sharding.advance('orders', 1, 'shipped', 'note')$$);
SELECT pg_temp.err($$SELECT sharding.advance('orders', 1, 'shipped', 'nope')$$);
SELECT sharding.advance('orders', NULL::int, 'shipped') IS NULL AS strict_null;
-- advance never trips an 'error' guard: it only moves forward.
SELECT sharding.guard_rank('orders', 'status', ARRAY['preparing', 'shipped', 'delivered'], 'error');
SELECT sharding.advance('orders', 3, 'preparing') AS back_no_error, sharding.advance('orders', 3, 'delivered') AS fwd;
-- The UPDATE's plan sees a changed guard in the same session.
SELECT sharding.guard_rank('orders', 'status', ARRAY['delivered', 'shipped', 'preparing']);
SELECT sharding.advance('orders', 3, 'shipped') AS reversed_ranks;
SELECT status FROM orders WHERE id = 3;

-- Primary keys: none, or of two columns, is 22023; text and uuid keys work.
CREATE TABLE nopk (id int, status text);
SELECT sharding.guard_rank('nopk', 'status', ARRAY['a', 'b']);
SELECT pg_temp.err($$SELECT sharding.advance('nopk', 1, 'b')$$);
CREATE TABLE twopk (a int, b int, status text, PRIMARY KEY (a, b));
SELECT sharding.guard_rank('twopk', 'status', ARRAY['a', 'b']);
SELECT pg_temp.err($$SELECT sharding.advance('twopk', 1, 'b')$$);
CREATE TABLE tk (k text PRIMARY KEY, status varchar(10));
INSERT INTO tk VALUES ('x-1', 'a');
SELECT sharding.guard_rank('tk', 'status', ARRAY['a', 'b', 'c']);
-- An untyped literal cannot resolve anyelement: cast it.
SELECT pg_temp.err($$SELECT sharding.advance('tk', 'x-1', 'c')$$);
SELECT sharding.advance('tk', 'x-1'::text, 'c') AS text_key, sharding.advance('tk', 'x-1'::varchar, 'b') AS back;
CREATE TABLE uk (k uuid PRIMARY KEY, status text);
INSERT INTO uk VALUES ('00000000-0000-0000-0000-00000000000a', 'a'), ('00000000-0000-0000-0000-00000000000b', 'a');
SELECT sharding.guard_rank('uk', 'status', ARRAY['a', 'b']);
SELECT sharding.advance('uk', '00000000-0000-0000-0000-00000000000a'::uuid, 'b') AS uuid_key,
       sharding.advance('uk', '00000000-0000-0000-0000-00000000000B'::text, 'b') AS uuid_as_text;

-- Partitioned tables: the guard is cloned to every partition, whatever its
-- column numbers; guard_rank replaces and unguard_rank removes all clones.
CREATE TABLE parts (id int PRIMARY KEY, status text) PARTITION BY RANGE (id);
CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (10);
CREATE TABLE parts_2 (gone text, id int NOT NULL, status text);
ALTER TABLE parts_2 DROP COLUMN gone;
ALTER TABLE parts ATTACH PARTITION parts_2 FOR VALUES FROM (10) TO (20);
INSERT INTO parts VALUES (1, 'a'), (15, 'a');
SELECT sharding.guard_rank('parts', 'status', ARRAY['a', 'b']);
SELECT sharding.guard_rank('parts', 'status', ARRAY['a', 'b', 'c']);
SELECT tgrelid::regclass, tgattr FROM pg_trigger WHERE tgrelid::regclass::text LIKE 'parts%' ORDER BY 1;
SELECT pg_temp.rows($$UPDATE parts SET status = 'c'$$) AS parts_fwd, pg_temp.rows($$UPDATE parts SET status = 'b'$$) AS parts_back;
INSERT INTO parts VALUES (16, 'a');
SELECT sharding.advance('parts', 15, 'a') AS parts_adv_back, sharding.advance('parts', 1, 'c') AS parts_adv_equal,
       sharding.advance('parts', 16, 'b') AS parts_adv_fwd;
SELECT pg_temp.err($$UPDATE parts SET status = 'z' WHERE id = 15$$);
SELECT sharding.unguard_rank('parts', 'status');
SELECT count(*) AS parts_triggers_left FROM pg_trigger WHERE tgrelid::regclass::text LIKE 'parts%';
DROP TABLE parts;

-- Enums: declared order, ADD VALUE BEFORE/AFTER respected ------------------
CREATE TYPE ship_state AS ENUM ('preparing', 'shipped', 'delivered');
CREATE TABLE eorders (id int PRIMARY KEY, status ship_state NOT NULL, note text);
INSERT INTO eorders SELECT g, 'preparing', '' FROM generate_series(1, 4) AS g;
-- Unguarded enum column: rank_of and advance use the declared order.
SELECT sharding.rank_of('eorders', 'status', 'delivered') AS unguarded_enum_rank;
SELECT sharding.advance('eorders', 1, 'delivered') AS fwd, sharding.advance('eorders', 1, 'shipped') AS back;
-- Unguarded means unprotected: a plain UPDATE may still go back.
SELECT pg_temp.rows($$UPDATE eorders SET status = 'shipped' WHERE id = 1$$) AS unguarded_back;
SELECT sharding.guard_rank('eorders', 'status');
SELECT ranks IS NULL AS declared_order FROM sharding.rank_guards WHERE table_name = 'eorders';
SELECT pg_temp.rows($$UPDATE eorders SET status = 'delivered' WHERE id <= 2$$) AS fwd_2;
SELECT pg_temp.rows($$UPDATE eorders SET status = 'shipped'$$) AS shipped_2_of_4;
-- A value added later, BEFORE an existing one (its oid is the highest; its
-- sort order puts it between preparing and shipped).
ALTER TYPE ship_state ADD VALUE 'packed' BEFORE 'shipped';
ALTER TYPE ship_state ADD VALUE 'returned' AFTER 'delivered';
SELECT sharding.rank_of('eorders', 'status', 'packed') AS packed, sharding.rank_of('eorders', 'status', 'shipped') AS shipped,
       sharding.rank_of('eorders', 'status', 'returned') AS returned;
SELECT pg_temp.rows($$UPDATE eorders SET status = 'packed'$$) AS packed_is_below_shipped;
INSERT INTO eorders VALUES (5, 'preparing', '');
SELECT pg_temp.rows($$UPDATE eorders SET status = 'packed' WHERE id = 5$$) AS preparing_to_packed;
SELECT sharding.advance('eorders', 5, 'shipped') AS adv_after_add, sharding.advance('eorders', 5, 'packed') AS adv_back;
SELECT pg_temp.rows($$UPDATE eorders SET status = 'returned' WHERE id = 1$$) AS to_returned;
SELECT id, status FROM eorders ORDER BY id;
-- 'error' on an enum names the labels.
SELECT sharding.guard_rank('eorders', 'status', on_regress => 'error');
SELECT pg_temp.err($$UPDATE eorders SET status = 'preparing' WHERE id = 2$$);
-- Explicit ranks on an enum column: only the listed labels are ranks.
SELECT sharding.guard_rank('eorders', 'status', ARRAY['shipped', 'delivered', 'returned']);
SELECT pg_temp.err($$UPDATE eorders SET status = 'packed' WHERE id = 5$$);
SELECT pg_temp.rows($$UPDATE eorders SET status = 'delivered' WHERE id = 5$$) AS listed_forward;
SELECT pg_temp.err($$SELECT sharding.rank_of('eorders', 'status', 'packed')$$);
SELECT pg_temp.err($$SELECT sharding.advance('eorders', 5, 'packed')$$);

-- Other column types: ranks are compared in the column's text form.
CREATE TABLE codes (id int PRIMARY KEY, level int);
INSERT INTO codes VALUES (1, 10);
SELECT sharding.guard_rank('codes', 'level', ARRAY['10', '20', '30']);
SELECT pg_temp.rows($$UPDATE codes SET level = 30$$) AS int_fwd, pg_temp.rows($$UPDATE codes SET level = 20$$) AS int_back;
SELECT sharding.advance('codes', 1, '20', 'level') AS int_adv_back, sharding.advance('codes', 1, '30', 'level') AS int_adv_equal;
SELECT pg_temp.err($$UPDATE codes SET level = 40$$);

-- guard_rank errors -------------------------------------------------------
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status')$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'nope', ARRAY['a'])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'ctid', ARRAY['a'])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', ARRAY['a'], 'ignore')$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', ARRAY['a'], NULL)$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', ARRAY['a', 'b', 'a'])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', ARRAY['a', NULL])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', ARRAY['a', ''])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', '{}')$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', '{{a,b},{c,d}}')$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('eorders', 'status', ARRAY['shipped', 'lost'])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('codes', 'level', ARRAY['10', 'x'])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('codes', 'level', ARRAY['10', '020'])$$);
SELECT pg_temp.err($$SELECT sharding.guard_rank('tk', 'status', ARRAY['a', 'longer than ten'])$$);
SELECT pg_temp.err($$SELECT sharding.unguard_rank('orders', 'nope')$$);
SELECT pg_temp.err($$SELECT sharding.rank_of('orders', 'nope', 'a')$$);
SELECT pg_temp.err($$SELECT sharding.rank_of('orders', 'status', 'lost')$$);
SELECT pg_temp.err($$SELECT sharding.rank_of('orders', 'note', 'a')$$);
-- The failed guard_rank calls changed nothing: the last guard on orders is intact.
SELECT ranks, on_regress FROM sharding.rank_guards WHERE table_name = 'orders';
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'orders'::regclass;
-- The trigger function refuses to run in any other role.
CREATE TRIGGER wrong AFTER UPDATE ON codes FOR EACH ROW EXECUTE FUNCTION sharding._rank_guard('level', 'skip', '10');
SELECT pg_temp.err($$UPDATE codes SET level = level$$);
SELECT pg_temp.err($$SELECT sharding._rank_guard()$$);
DROP TRIGGER wrong ON codes;
CREATE TRIGGER bad_mode BEFORE UPDATE OF level ON codes FOR EACH ROW EXECUTE FUNCTION sharding._rank_guard('level', 'maybe', '10');
SELECT pg_temp.err($$UPDATE codes SET level = 10$$);
DROP TRIGGER bad_mode ON codes;

-- Privileges: changing guards needs owner or sharding_admin ---------------
CREATE ROLE rank_stranger;
CREATE ROLE rank_admin IN ROLE sharding_admin;
GRANT USAGE ON SCHEMA public TO rank_stranger, rank_admin;
GRANT SELECT, UPDATE ON orders TO rank_stranger;
ALTER TABLE codes OWNER TO rank_admin;
SET ROLE rank_stranger;
SELECT pg_temp.err($$SELECT sharding.guard_rank('orders', 'status', ARRAY['a'])$$);
SELECT pg_temp.err($$SELECT sharding.unguard_rank('orders', 'status')$$);
-- Everyone may read ranks and advance rows they may update.
SELECT sharding.rank_of('orders', 'status', 'delivered') AS stranger_rank, sharding.advance('orders', 1, 'delivered') AS stranger_adv;
RESET ROLE;
SET ROLE rank_admin;
SELECT sharding.guard_rank('codes', 'level', ARRAY['10', '20', '30', '40']);
SELECT pg_temp.rows($$UPDATE codes SET level = 40$$) AS admin_guarded;
SELECT sharding.unguard_rank('codes', 'level');
RESET ROLE;

-- Clean up.
DROP TABLE orders, nopk, twopk, tk, uk, eorders, codes;
DROP TYPE ship_state;
REVOKE USAGE ON SCHEMA public FROM rank_stranger, rank_admin;
DROP ROLE rank_stranger, rank_admin;
DROP EXTENSION sharding;
