-- pin and unpin take a key by value (CONTRACT 15.1, "Keys by value"): a
-- spelling the map's key type accepts ('007' for an integer key, a uuid in
-- upper case) is converted once through that type, so that the pin holds
-- the spelling routing looks up; a spelling it rejects raises 22P02 and
-- pins nothing. Text keys stay as given. pin_many takes its keys the same
-- way; one key the type rejects raises 22P02 naming it and pins none.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT sharding.create_map('ints', 8, ARRAY['n1', 'n2']);
SELECT sharding.create_map('uuids', 8, ARRAY['n1', 'n2']);
SELECT sharding.create_map('texts', 8, ARRAY['n1', 'n2']);
CREATE TABLE accounts (id integer PRIMARY KEY, v text);
CREATE TABLE docs (id uuid PRIMARY KEY, v text);
CREATE TABLE notes (id text PRIMARY KEY, v text);
SELECT sharding.distribute('accounts', 'id', 'ints');
SELECT sharding.distribute('docs', 'id', 'uuids');
SELECT sharding.distribute('notes', 'id', 'texts');

-- Pinned to the node that does not own the key's shard, so that routing
-- shows the pin.
SELECT sharding.pin('ints', '007', CASE sharding.node_for('ints', 7) WHEN 'n1' THEN 'n2' ELSE 'n1' END);
SELECT sharding.pin('ints', ' +42', CASE sharding.node_for('ints', 42) WHEN 'n1' THEN 'n2' ELSE 'n1' END);
SELECT sharding.pin('uuids', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',
                    CASE sharding.node_for('uuids', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid) WHEN 'n1' THEN 'n2' ELSE 'n1' END);
SELECT sharding.pin('texts', 'ABC', 'n2');
SELECT map, key FROM sharding.pins ORDER BY map, key;
-- Routing finds each pin by value.
SELECT sharding.node_for('ints', 7) = (SELECT node FROM sharding.pins WHERE map = 'ints' AND key = '7') AS int_pinned,
       sharding.node_for('ints', 42) = (SELECT node FROM sharding.pins WHERE map = 'ints' AND key = '42') AS int_pinned_2,
       sharding.node_for('uuids', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid)
           = (SELECT node FROM sharding.pins WHERE map = 'uuids') AS uuid_pinned,
       sharding.node_for('texts', 'ABC') AS text_pinned;

-- A spelling the type rejects: 22P02, nothing pinned.
SELECT pg_temp.err($$SELECT sharding.pin('ints', '7x', 'n1')$$);
SELECT pg_temp.err($$SELECT sharding.pin('uuids', 'not-a-uuid', 'n1')$$);
SELECT count(*) AS pins FROM sharding.pins;

-- unpin by any spelling of the value.
SELECT sharding.unpin('ints', '0007') AS unpinned, sharding.unpin('ints', '42') AS unpinned_2,
       sharding.unpin('uuids', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11') AS unpinned_uuid,
       sharding.unpin('texts', 'abc') AS text_case_matters;
SELECT map, key FROM sharding.pins ORDER BY map, key;

-- pin_many by value: '007' and ' +7' are one key (given twice: counted
-- once, the last node wins), an upper-case uuid is pinned in lower case,
-- text keys stay as given; routing finds each pin.
SELECT sharding.pin_many('ints', ARRAY['007', '-0012', ' +7', '9223372036854775807'], ARRAY['n1', 'n1', 'n2', 'n1']) AS pinned;
SELECT sharding.pin_many('uuids', ARRAY['A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '{b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12}'],
                         ARRAY['n2', 'n1']) AS pinned_uuids;
SELECT sharding.pin_many('texts', ARRAY['ABC', ' abc'], ARRAY['n1', 'n2']) AS pinned_texts;
SELECT map, key, node FROM sharding.pins ORDER BY map, key;
SELECT sharding.node_for('ints', 7) AS int_7, sharding.node_for('ints', -12) AS int_minus_12,
       sharding.node_for('uuids', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid) AS uuid_a,
       sharding.node_for('uuids', 'b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12'::uuid) AS uuid_b;
-- Re-pinned by another spelling: the same pin moves.
SELECT sharding.pin_many('ints', ARRAY['7'], ARRAY['n1']) AS repinned;
SELECT key, node FROM sharding.pins WHERE map = 'ints' ORDER BY key;
-- One spelling the type rejects (or out of range): 22P02 (22003) naming
-- it, nothing pinned, the pins as they were.
SELECT count(*) AS pins_before FROM sharding.pins;
SELECT pg_temp.err($$SELECT sharding.pin_many('ints', ARRAY['8', '9x', '10'], ARRAY['n1', 'n1', 'n1'])$$);
SELECT pg_temp.err($$SELECT sharding.pin_many('ints', ARRAY['8', '99999999999999999999'], ARRAY['n1', 'n1'])$$);
SELECT pg_temp.err($$SELECT sharding.pin_many('uuids', ARRAY['c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a13', 'not-a-uuid'], ARRAY['n1', 'n2'])$$);
SELECT count(*) AS pins_after, count(*) FILTER (WHERE key IN ('8', '10', 'c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a13')) AS new_pins
  FROM sharding.pins;

DROP EXTENSION sharding;
