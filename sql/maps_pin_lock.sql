-- pin and unpin lock (sharding._lock_pin, docs/ordered.md): the map-level lock tag
-- in RowExclusiveLock (conflicting with claim_node's ShareLock and with
-- rebalance) and, in ExclusiveLock (conflicting with fence), every logical
-- shard the pinned text routes a key of: the text key's own shard and, when
-- the text is the canonical form of an integer, uuid or bytea key (the form
-- node_for matches a typed key's pin on), that key's shard too. The locks
-- seen in pg_locks (advisory, objsubid 3, objid = the shard or 4294967295
-- for the whole map) against the shards logical_shard computes.
CREATE EXTENSION sharding;
SELECT sharding.create_map('pl', 16, ARRAY['a', 'b']);

-- Errors as SQLSTATE and message.
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- The locks this backend holds on map tags after _lock_pin(key), in one
-- transaction (the statement's).
CREATE FUNCTION pg_temp.pin_locks(k text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sharding._lock_pin('pl', k);
    RETURN (SELECT string_agg(l.objid::text || ' ' || l.mode, ', ' ORDER BY l.objid)
              FROM pg_locks l
             WHERE l.locktype = 'advisory' AND l.objsubid = 3 AND l.pid = pg_backend_pid());
END $$;

-- The shards a key text routes by, computed.
SELECT sharding.logical_shard('pl', 'orca') AS orca,
       sharding.logical_shard('pl', '42') AS text_42, sharding.logical_shard('pl', 42::bigint) AS int_42,
       sharding.logical_shard('pl', '-7') AS text_m7, sharding.logical_shard('pl', (-7)::bigint) AS int_m7;
SELECT sharding.logical_shard('pl', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11') AS text_uuid,
       sharding.logical_shard('pl', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid) AS uuid,
       sharding.logical_shard('pl', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11') AS text_upper_uuid;
SELECT sharding.logical_shard('pl', E'\\x0102ff') AS text_bytea, sharding.logical_shard('pl', '\x0102ff'::bytea) AS bytea,
       sharding.logical_shard('pl', '042') AS text_042, sharding.logical_shard('pl', '9223372036854775808') AS text_big,
       sharding.logical_shard('pl', E'\\x0G') AS text_badhex;

-- A plain text key: its own shard.
SELECT pg_temp.pin_locks('orca');
-- Canonical integers: the text key's shard and the integer key's.
SELECT pg_temp.pin_locks('42');
SELECT pg_temp.pin_locks('-7');
-- A lower-case uuid: text and uuid; upper case is not the canonical form.
SELECT pg_temp.pin_locks('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11');
SELECT pg_temp.pin_locks('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11');
-- '\x' and lower-case hex: text and bytea.
SELECT pg_temp.pin_locks(E'\\x0102ff');
-- Not canonical forms: a leading zero, beyond bigint, bad hex: text only.
SELECT pg_temp.pin_locks('042');
SELECT pg_temp.pin_locks('9223372036854775808');
SELECT pg_temp.pin_locks(E'\\x0G');
-- pin and unpin (text and typed) take the same locks.
BEGIN;
SELECT sharding.pin('pl', 42::bigint, 'b');
SELECT string_agg(l.objid::text || ' ' || l.mode, ', ' ORDER BY l.objid) FROM pg_locks l
 WHERE l.locktype = 'advisory' AND l.objsubid = 3 AND l.pid = pg_backend_pid();
COMMIT;
BEGIN;
SELECT sharding.unpin('pl', '42');
SELECT string_agg(l.objid::text || ' ' || l.mode, ', ' ORDER BY l.objid) FROM pg_locks l
 WHERE l.locktype = 'advisory' AND l.objsubid = 3 AND l.pid = pg_backend_pid();
COMMIT;
-- Unknown map: 42704 from pin before any lock; NULL key: 22023.
SELECT pg_temp.err($$SELECT sharding.pin('nope', 'orca', 'a')$$);
SELECT pg_temp.err($$SELECT sharding.unpin('nope', 'orca')$$);
SELECT pg_temp.err($$SELECT sharding.pin('pl', NULL::text, 'a')$$);
SELECT pg_temp.err($$SELECT sharding.unpin('pl', NULL::text)$$);
-- Only pin's callers may call it.
SELECT has_function_privilege('public', 'sharding._lock_pin(text, text)', 'EXECUTE') AS public_may,
       has_function_privilege('sharding_admin', 'sharding._lock_pin(text, text)', 'EXECUTE') AS admin_may;

SELECT sharding.drop_map('pl');
DROP EXTENSION sharding;
