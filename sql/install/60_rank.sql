-- Rank-guarded transitions (docs/rank.md).
--
-- A guard is a C trigger, sharding._rank_guard, installed on the table as
-- BEFORE UPDATE OF col FOR EACH ROW, so every write path is checked and
-- updates of other columns pay nothing. Its arguments (col, on_regress,
-- ranks...) carry the whole configuration: the trigger needs no lookup per
-- row and keeps working after pg_dump/restore of the table alone.
-- sharding.rank_guards records the same configuration by name (not oid, which
-- changes across dump/restore); guard_rank and unguard_rank keep both in step.

CREATE TABLE sharding.rank_guards (
    schema_name text NOT NULL,
    table_name  text NOT NULL,
    column_name text NOT NULL,
    ranks       text[] CHECK (ranks IS NULL OR pg_catalog.cardinality(ranks) > 0),
    on_regress  text NOT NULL CHECK (on_regress IN ('skip', 'error')),
    created     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (schema_name, table_name, column_name)
);
COMMENT ON TABLE sharding.rank_guards IS
    'rank guards by table and column name; ranks NULL: the column is an enum ranked by its declared order';
COMMENT ON COLUMN sharding.rank_guards.ranks IS 'values lowest first; NULL: the enum''s declared order';
SELECT pg_catalog.pg_extension_config_dump('sharding.rank_guards', '');
GRANT SELECT ON sharding.rank_guards TO PUBLIC;
-- Guards are changed through guard_rank/unguard_rank, which run as the
-- caller: the extension's owner, members of sharding_admin and (since 1.2)
-- the guarded table's owner. A row trigger lets an owner write only the rows
-- of tables it owns (sharding._may_guard). Not row-level security: that
-- would make every pg_dump by a non-superuser fail on this config table.
GRANT INSERT, UPDATE, DELETE ON sharding.rank_guards TO sharding_admin;

-- Internal: may the current user change the rank guards of table
-- schema_name.table_name? Members of sharding_admin, the extension's owner,
-- and members of the table's owning role may.
CREATE FUNCTION sharding._may_guard(schema_name text, table_name text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT pg_catalog.pg_has_role('sharding_admin', 'USAGE')
            OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e
                        WHERE e.extname OPERATOR(pg_catalog.=) 'sharding'
                          AND pg_catalog.pg_has_role(e.extowner, 'USAGE'))
            OR EXISTS (SELECT FROM pg_catalog.pg_class AS c
                         JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                        WHERE n.nspname OPERATOR(pg_catalog.=) $1 AND c.relname OPERATOR(pg_catalog.=) $2
                          AND pg_catalog.pg_has_role(c.relowner, 'USAGE'))
    $$;
COMMENT ON FUNCTION sharding._may_guard(text, text) IS
    'internal: whether the current user may change the rank guards of a table (its owner, sharding_admin, the extension''s owner)';

-- Internal: the row trigger of sharding.rank_guards; 42501 for a row (old
-- or new) of a table the current user may not guard. Not revoked: EXECUTE of
-- a trigger function is checked only when the trigger is created.
CREATE FUNCTION sharding._guard_registry_check() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND NOT sharding._may_guard(OLD.schema_name, OLD.table_name) THEN
        RAISE EXCEPTION 'permission denied to change the rank guards of table %', format('%I.%I', OLD.schema_name, OLD.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Rank guards are changed by the table''s owner, the extension''s owner or members of role sharding_admin.';
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NOT sharding._may_guard(NEW.schema_name, NEW.table_name) THEN
        RAISE EXCEPTION 'permission denied to change the rank guards of table %', format('%I.%I', NEW.schema_name, NEW.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Rank guards are changed by the table''s owner, the extension''s owner or members of role sharding_admin.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION sharding._guard_registry_check() IS
    'internal: keeps writes to sharding.rank_guards to tables the current user may guard';
CREATE TRIGGER may_guard BEFORE INSERT OR UPDATE OR DELETE ON sharding.rank_guards
    FOR EACH ROW EXECUTE FUNCTION sharding._guard_registry_check();
-- Table owners need the privilege; the trigger above keeps them to their tables.
GRANT INSERT, UPDATE, DELETE ON sharding.rank_guards TO PUBLIC;

-- Internal: 42501 unless the current user may change the guards of tbl.
CREATE FUNCTION sharding._require_may_guard(tbl regclass) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_class AS r JOIN pg_namespace AS n ON n.oid = r.relnamespace
                    WHERE r.oid = tbl AND sharding._may_guard(n.nspname, r.relname)) THEN
        RAISE EXCEPTION 'permission denied to change the rank guards of table %', tbl
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Rank guards are changed by the table''s owner, the extension''s owner or members of role sharding_admin.',
                  HINT = 'Ask the table''s owner, or GRANT sharding_admin to this role.';
    END IF;
END
$$;
COMMENT ON FUNCTION sharding._require_may_guard(regclass) IS
    'internal: 42501 unless the current user may change the rank guards of the table';

-- The trigger function. Not revoked: PostgreSQL checks EXECUTE only when a
-- trigger is created (a restore by the table's owner must be able to), and it
-- refuses to run outside a BEFORE UPDATE row trigger.
CREATE FUNCTION sharding._rank_guard() RETURNS trigger
    AS 'MODULE_PATHNAME', 'sharding__rank_guard' LANGUAGE C;
COMMENT ON FUNCTION sharding._rank_guard() IS
    'internal: the rank guard trigger; arguments (column, on_regress, ranks lowest first...)';

-- Internal: the guard trigger(s) of one column of a table, found by function
-- and column number, so renamed tables and columns are still found.
CREATE FUNCTION sharding._rank_guard_triggers(tbl regclass, attnum smallint) RETURNS SETOF name
    LANGUAGE sql STABLE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
        SELECT t.tgname FROM pg_catalog.pg_trigger AS t
         WHERE t.tgrelid = $1 AND t.tgfoid = 'sharding._rank_guard()'::pg_catalog.regprocedure
           AND pg_catalog.cardinality(t.tgattr::pg_catalog.int2[]) = 1
           AND $2 = ANY (t.tgattr::pg_catalog.int2[]) AND NOT t.tgisinternal
    $$;
COMMENT ON FUNCTION sharding._rank_guard_triggers(regclass, smallint) IS
    'internal: names of the rank guard triggers on one column';

-- Internal: a user column of tbl (42703 otherwise). Shared by guard_rank and unguard_rank.
CREATE FUNCTION sharding._rank_column(tbl regclass, col name, OUT attnum smallint, OUT atttypid oid,
                                      OUT typmod integer)
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    -- Not STRICT: a NULL must be refused with a message, not ignored.
    IF tbl IS NULL OR col IS NULL THEN
        RAISE EXCEPTION 'table and column must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT a.attnum, a.atttypid, a.atttypmod INTO attnum, atttypid, typmod
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column "%" of relation % does not exist', col, tbl USING ERRCODE = 'undefined_column';
    END IF;
END
$$;
COMMENT ON FUNCTION sharding._rank_column(regclass, name) IS
    'internal: number and type of a user column, or 42703';

CREATE FUNCTION sharding.guard_rank(tbl regclass, col name, ranks text[] DEFAULT NULL,
                                    on_regress text DEFAULT 'skip') RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    c record;
    base oid;
    is_enum boolean;
    label text;
    canonical text;
    coltype text;
    trig name;
    args text;
BEGIN
    -- Not STRICT: ranks NULL means "the enum's declared order".
    IF tbl IS NOT NULL THEN
        PERFORM sharding._require_may_guard(tbl);
    END IF;
    IF on_regress IS NULL OR on_regress NOT IN ('skip', 'error') THEN
        RAISE EXCEPTION 'on_regress must be ''skip'' or ''error'', got %', coalesce(quote_literal(on_regress), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    c := sharding._rank_column(tbl, col);
    base := c.atttypid;
    WHILE (SELECT t.typtype = 'd' FROM pg_type AS t WHERE t.oid = base) LOOP
        base := (SELECT t.typbasetype FROM pg_type AS t WHERE t.oid = base);
    END LOOP;
    is_enum := (SELECT t.typtype = 'e' FROM pg_type AS t WHERE t.oid = base);
    coltype := format_type(c.atttypid, c.typmod);

    IF ranks IS NULL THEN
        IF NOT is_enum THEN
            RAISE EXCEPTION 'column "%" of relation % is of type %, not an enum, so ranks must be given', col, tbl, coltype
                USING ERRCODE = 'invalid_parameter_value', HINT = 'List the values lowest first: ranks => ARRAY[''new'', ''done''].';
        END IF;
    ELSE
        IF cardinality(ranks) = 0 THEN
            RAISE EXCEPTION 'ranks must list at least one value, got %', ranks USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF array_ndims(ranks) <> 1 THEN
            RAISE EXCEPTION 'ranks must be a one-dimensional array, got %', ranks USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR i IN 1 .. cardinality(ranks) LOOP
            label := ranks[array_lower(ranks, 1) + i - 1];
            IF label IS NULL THEN
                RAISE EXCEPTION 'ranks must not contain NULL, got %', ranks USING ERRCODE = 'invalid_parameter_value';
            ELSIF label = '' THEN
                RAISE EXCEPTION 'ranks must not contain an empty string, got %', ranks USING ERRCODE = 'invalid_parameter_value';
            ELSIF label = ANY (ranks[array_lower(ranks, 1) : array_lower(ranks, 1) + i - 2]) THEN
                RAISE EXCEPTION 'ranks list "%" twice', label USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF is_enum THEN
                IF NOT EXISTS (SELECT FROM pg_enum AS e WHERE e.enumtypid = base AND e.enumlabel = label) THEN
                    RAISE EXCEPTION 'rank "%" is not a value of enum type %', label, base::regtype
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            ELSE
                -- A rank must be a value of the column, written as the column
                -- prints it (the guard compares text forms).
                BEGIN
                    EXECUTE format('SELECT $1::%s::text', coltype) INTO canonical USING label;
                EXCEPTION WHEN data_exception THEN
                    RAISE EXCEPTION 'rank "%" is not a valid value of type %', label, coltype USING ERRCODE = 'invalid_parameter_value';
                END;
                IF canonical IS DISTINCT FROM label THEN
                    RAISE EXCEPTION 'rank "%" of type % reads back as "%"', label, coltype, canonical
                        USING ERRCODE = 'invalid_parameter_value', HINT = 'Write ranks as the column prints them.';
                END IF;
            END IF;
        END LOOP;
    END IF;

    -- Replace the column's guard, if any.
    FOR trig IN SELECT * FROM sharding._rank_guard_triggers(tbl, c.attnum) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trig, tbl);
    END LOOP;
    trig := CASE WHEN octet_length('sharding_rank_guard_' || col) <= 63 THEN 'sharding_rank_guard_' || col
                 ELSE 'sharding_rank_guard_' || md5(col) END;
    SELECT string_agg(quote_literal(a), ', ' ORDER BY n) INTO args
      FROM unnest(ARRAY[col::text, on_regress] || coalesce(ranks, '{}')) WITH ORDINALITY AS u(a, n);
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION sharding._rank_guard(%s)',
                   trig, col, tbl, args);

    INSERT INTO sharding.rank_guards AS g (schema_name, table_name, column_name, ranks, on_regress)
    SELECT n.nspname, r.relname, col, guard_rank.ranks, guard_rank.on_regress
      FROM pg_class AS r JOIN pg_namespace AS n ON n.oid = r.relnamespace
     WHERE r.oid = tbl
    ON CONFLICT (schema_name, table_name, column_name)
    DO UPDATE SET ranks = excluded.ranks, on_regress = excluded.on_regress, created = now();
END
$$;
COMMENT ON FUNCTION sharding.guard_rank(regclass, name, text[], text) IS
    'guard a column: every UPDATE that would lower its rank is skipped (''skip'') or raises 23514 (''error'')';

CREATE FUNCTION sharding.unguard_rank(tbl regclass, col name) RETURNS void
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    c record;
    trig name;
    dropped boolean := false;
BEGIN
    PERFORM sharding._require_may_guard(tbl);
    c := sharding._rank_column(tbl, col);
    FOR trig IN SELECT * FROM sharding._rank_guard_triggers(tbl, c.attnum) LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trig, tbl);
        dropped := true;
    END LOOP;
    DELETE FROM sharding.rank_guards AS g
     USING pg_class AS r JOIN pg_namespace AS n ON n.oid = r.relnamespace
     WHERE r.oid = tbl AND g.schema_name = n.nspname AND g.table_name = r.relname AND g.column_name = col;
    IF NOT dropped THEN
        RAISE NOTICE 'column "%" of relation % has no rank guard, skipping', col, tbl;
    END IF;
END
$$;
COMMENT ON FUNCTION sharding.unguard_rank(regclass, name) IS 'remove the rank guard of a column';

-- Changing guards needs the extension's owner, sharding_admin, or (since
-- 1.2) the table's owner: EXECUTE for everyone, and the functions refuse
-- anyone else with 42501 (sharding._require_may_guard). The grants are
-- written as 1.1's followed by 1.2's, so that a fresh install and an
-- updated 1.1 hold the same ACL.
REVOKE ALL ON FUNCTION sharding.guard_rank(regclass, name, text[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION sharding.unguard_rank(regclass, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.guard_rank(regclass, name, text[], text) TO sharding_admin;
GRANT EXECUTE ON FUNCTION sharding.unguard_rank(regclass, name) TO sharding_admin;
GRANT EXECUTE ON FUNCTION sharding.guard_rank(regclass, name, text[], text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION sharding.unguard_rank(regclass, name) TO PUBLIC;

CREATE FUNCTION sharding.rank_of(tbl regclass, col name, value text) RETURNS integer
    AS 'MODULE_PATHNAME', 'sharding_rank_of' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sharding.rank_of(regclass, name, text) IS
    '0-based rank of value in the column''s guard, or in its enum''s declared order';

-- No SET search_path: a C function whose only SQL names every table, column
-- and operator with its schema (and pinning it would cost every call).
CREATE FUNCTION sharding.advance(tbl regclass, id anyelement, new_value text, col name DEFAULT 'status')
    RETURNS boolean
    AS 'MODULE_PATHNAME', 'sharding_advance' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION sharding.advance(regclass, anyelement, text, name) IS
    'set col to new_value on the row whose primary key is id, only if that raises its rank; true if it did';
