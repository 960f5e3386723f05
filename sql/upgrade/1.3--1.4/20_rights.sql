-- Rights (CONTRACT 15.2, docs/rebalance.md "Rights"): a job's role is the
-- one that started it, the column's default; sharding_admin may write
-- every column of a job but that one.
ALTER TABLE sharding.move_jobs
    ALTER COLUMN runas SET DEFAULT (pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER::text)))::oid;
REVOKE INSERT, UPDATE ON sharding.move_jobs FROM sharding_admin;
GRANT INSERT (map, strategy, state, nodes, loads, max_imbalance, drained, max_parallel, switched, cancel_requested,
              created, started, finished, error, waiting, waits, deferred, retried)
    ON sharding.move_jobs TO sharding_admin;
GRANT UPDATE (state, switched, cancel_requested, started, finished, error, waiting, waits, deferred, retried)
    ON sharding.move_jobs TO sharding_admin;
-- The coordinator's DSN (it may hold a password) for administrators only.
REVOKE ALL ON FUNCTION sharding._coordinator_dsn() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._coordinator_dsn() TO sharding_admin;
-- attach_node and detach_node pin search_path in their dblink queries.
-- @replace sharding.attach_node
-- @replace sharding.detach_node
-- A follower keeps its coordinator's DSN without the password.
-- @include sharding._mask_password
-- @replace sharding._follow
UPDATE sharding.local_node SET coordinator_dsn = sharding._mask_password(coordinator_dsn)
 WHERE coordinator_dsn IS DISTINCT FROM sharding._mask_password(coordinator_dsn);
