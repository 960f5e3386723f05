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

GRANT USAGE ON SCHEMA sharding TO PUBLIC;

-- Internal: proves the C/C++ boundary turns every C++ exception into an
-- ERROR (see src/pg/boundary.hpp). Not for users, hence revoked.
CREATE FUNCTION sharding._boundary_selftest(kind text) RETURNS bigint
    AS 'MODULE_PATHNAME', 'sharding__boundary_selftest' LANGUAGE C VOLATILE STRICT;
COMMENT ON FUNCTION sharding._boundary_selftest(text) IS
    'internal: exercises the C++/PostgreSQL error boundary (regression tests only)';
-- Internal test hook; nobody but the owner needs it.
REVOKE ALL ON FUNCTION sharding._boundary_selftest(text) FROM PUBLIC;
