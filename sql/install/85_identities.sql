-- Section 12: identities that cannot drift. A pin is stored by the key's
-- canonical text form, and node_for on a typed key matches pins on that
-- form (src/maps.cpp key_text). Pinning through the text overload asks the
-- caller to produce exactly that form ('42', a lower-case uuid, '\x' and
-- lower-case hex for bytea whatever bytea_output says); the typed overloads
-- below produce it themselves, so that a typed pin always matches node_for
-- on the same typed key. An untyped literal still resolves to the text
-- overload (text is the preferred type of its category), as for shard_of.
--
-- SQL functions delegating to pin(map, text, node) and unpin(map, text):
-- the checks (NULL key 22023, unknown map 42704, database maps refusing a
-- node without DSN 55000, followers refusing changes) live there once. Not
-- STRICT: a NULL key must raise 22023 as the text form does.

CREATE FUNCTION sharding.pin(map text, key bytea, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, E'\\x' OPERATOR(pg_catalog.||) pg_catalog.encode($2, 'hex'), $3) $$;
COMMENT ON FUNCTION sharding.pin(text, bytea, text) IS
    'pins a bytea key (stored as \x and lower-case hex, whatever bytea_output says) to a node';

CREATE FUNCTION sharding.pin(map text, key smallint, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, smallint, text) IS
    'pins a smallint key (stored as its decimal text, as node_for matches it) to a node';

CREATE FUNCTION sharding.pin(map text, key integer, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, integer, text) IS
    'pins an integer key (stored as its decimal text, as node_for matches it) to a node';

CREATE FUNCTION sharding.pin(map text, key bigint, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, bigint, text) IS
    'pins a bigint key (stored as its decimal text, as node_for matches it) to a node';

CREATE FUNCTION sharding.pin(map text, key uuid, node text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.pin($1, $2::pg_catalog.text, $3) $$;
COMMENT ON FUNCTION sharding.pin(text, uuid, text) IS
    'pins a uuid key (stored in lower case, as node_for matches it) to a node';

CREATE FUNCTION sharding.unpin(map text, key bytea) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, E'\\x' OPERATOR(pg_catalog.||) pg_catalog.encode($2, 'hex')) $$;
COMMENT ON FUNCTION sharding.unpin(text, bytea) IS
    'removes the pin of a bytea key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key smallint) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, smallint) IS
    'removes the pin of a smallint key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key integer) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, integer) IS
    'removes the pin of an integer key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key bigint) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, bigint) IS
    'removes the pin of a bigint key; true if there was one';

CREATE FUNCTION sharding.unpin(map text, key uuid) RETURNS boolean
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$ SELECT sharding.unpin($1, $2::pg_catalog.text) $$;
COMMENT ON FUNCTION sharding.unpin(text, uuid) IS
    'removes the pin of a uuid key; true if there was one';

-- Changing pins is an administrator's job, whatever the key's type.
REVOKE ALL ON FUNCTION sharding.pin(text, bytea, text), sharding.pin(text, smallint, text),
    sharding.pin(text, integer, text), sharding.pin(text, bigint, text), sharding.pin(text, uuid, text),
    sharding.unpin(text, bytea), sharding.unpin(text, smallint), sharding.unpin(text, integer),
    sharding.unpin(text, bigint), sharding.unpin(text, uuid)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.pin(text, bytea, text), sharding.pin(text, smallint, text),
    sharding.pin(text, integer, text), sharding.pin(text, bigint, text), sharding.pin(text, uuid, text),
    sharding.unpin(text, bytea), sharding.unpin(text, smallint), sharding.unpin(text, integer),
    sharding.unpin(text, bigint), sharding.unpin(text, uuid)
    TO sharding_admin;
