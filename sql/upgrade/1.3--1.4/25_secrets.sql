-- Passwords (CONTRACT 15.2, docs/nodes.md "Passwords"): a node's DSN with
-- a password is kept whole in sharding.node_secrets (the owner's alone) and
-- shown masked in sharding.nodes; the engine's connections take it from
-- there, attach_node and detach_node reach the node through them.
-- @include sharding.node_secrets
-- @include sharding._node_secret
-- @replace sharding.cluster_partitions
-- @replace sharding._config_tables
-- A follower refuses changes to it, as to every table it copies.
CREATE TRIGGER refuse_on_follower BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON sharding.node_secrets FOR EACH STATEMENT EXECUTE FUNCTION sharding._refuse_on_follower();
-- @replace sharding._leads_here
-- @replace sharding.attach_node
-- @replace sharding.detach_node
-- The DSNs already given: kept whole, shown masked. Not on a follower: its
-- copy comes from its coordinator (run attach_node there again once both
-- are updated, so that it copies sharding.node_secrets too).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following) THEN
        INSERT INTO sharding.node_secrets (node, dsn)
        SELECT n.node, n.dsn FROM sharding.nodes AS n
         WHERE n.dsn IS NOT NULL AND sharding._mask_password(n.dsn) <> n.dsn
            ON CONFLICT (node) DO UPDATE SET dsn = EXCLUDED.dsn;
        UPDATE sharding.nodes AS n SET dsn = sharding._mask_password(n.dsn)
         WHERE n.dsn IS NOT NULL AND sharding._mask_password(n.dsn) <> n.dsn;
    END IF;
END $$;
-- pin and unpin take a key by value, as isolate does (CONTRACT 15.1).
-- @include sharding._canonical_keys
-- @include sharding._canonical_key
-- @replace sharding.pin
-- @replace sharding.unpin
-- SEC-2: the tables only the engine's sessions on a node write, closed to
-- sharding_admin; a job's role guarded (deferred moves, journal rows).
REVOKE INSERT, UPDATE, DELETE ON sharding.move_decoding, sharding.local_node, sharding.frozen_shards FROM sharding_admin;
-- @include sharding._job_role_guard
