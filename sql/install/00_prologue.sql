\echo Use "CREATE EXTENSION sharding" to load this file. \quit

-- The role that may change maps, pins, nodes and rank guards besides the
-- extension's owner. Roles are cluster-wide, so another database may have
-- created it already, or be creating it right now: an install running at
-- the same time in another database may have made it without committing
-- yet, which our check cannot see. Our CREATE ROLE then waits for that
-- install and fails on pg_authid's unique index (23505) if it commits, or
-- finds the name taken (42710) if it committed before; either way the role
-- exists, which is all we need.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sharding_admin') THEN
        BEGIN
            CREATE ROLE sharding_admin NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
END
$$;

-- @object sharding_worker_role
-- The role of workers that join worker groups (docs/workers.md): join,
-- heartbeat and leave need it (or sharding_admin, or the extension's
-- owner). Created as sharding_admin is, above.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sharding_worker') THEN
        BEGIN
            CREATE ROLE sharding_worker NOLOGIN;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
END
$$;
-- @end

-- SEC-6: the two roles must be the plain group roles this script makes
-- (or made in another database). A role of that name made beforehand by
-- someone else may carry rights of its own (LOGIN, CREATEROLE, ...), or be
-- administered by a role that is not a superuser (one with CREATEROLE that
-- made it holds ADMIN OPTION on it from PostgreSQL 16 on): that role could
-- then grant itself sharding_admin and administer every map, node and
-- move. Refused (42501) before anything else is created.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.rolname,
                    a.rolcanlogin OR a.rolsuper OR a.rolcreaterole OR a.rolcreatedb OR a.rolreplication
                        OR a.rolbypassrls AS privileged,
                    (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(h.rolname), ', ' ORDER BY h.rolname)
                       FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles h ON h.oid = m.member
                      WHERE m.roleid = a.oid AND m.admin_option AND NOT h.rolsuper) AS admins
               FROM pg_catalog.pg_roles a WHERE a.rolname IN ('sharding_admin', 'sharding_worker')
    LOOP
        IF r.privileged THEN
            RAISE EXCEPTION 'role % exists and has attributes of its own (LOGIN, SUPERUSER, CREATEROLE, ...)', r.rolname
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'The extension needs it as a plain NOLOGIN group role: drop it (CREATE EXTENSION makes it) or ALTER ROLE ... NOLOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS, then try again.';
        END IF;
        IF r.admins IS NOT NULL THEN
            RAISE EXCEPTION 'role % is administered by %, not a superuser', r.rolname, r.admins
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Whoever holds ADMIN OPTION on it could grant it to itself and administer every map: REVOKE ADMIN OPTION FOR it (or drop the role, which CREATE EXTENSION then makes), then try again.';
        END IF;
    END LOOP;
END
$$;

GRANT USAGE ON SCHEMA sharding TO PUBLIC;

-- Internal: proves the C/C++ boundary turns every C++ exception into an
-- ERROR (see src/pg/boundary.hpp). Not for users, hence revoked.
CREATE FUNCTION sharding._boundary_selftest(kind text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__boundary_selftest' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._boundary_selftest(text) IS
    'internal: exercises the C++/PostgreSQL error boundary (regression tests only)';
-- Internal test hook; nobody but the owner needs it.
REVOKE ALL ON FUNCTION sharding._boundary_selftest(text) FROM PUBLIC;
