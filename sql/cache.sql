-- The cache module (src/pg/cache.hpp): every per-backend cache lives in one
-- memory context, "sharding cache", under CacheMemoryContext, visible in
-- pg_backend_memory_contexts; entries replaced by rebuilds are retired and
-- freed, so memory stays bounded however often the config changes.
CREATE EXTENSION sharding;
-- Each memory context with its parent's name. PostgreSQL 18 dropped the
-- view's parent column for path (the ids of the ancestors, root first).
DO $$ BEGIN
    IF EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'pg_backend_memory_contexts'::regclass
                                          AND attname = 'parent') THEN
        CREATE FUNCTION pg_temp.contexts() RETURNS TABLE (name text, parent text) LANGUAGE sql
            AS 'SELECT name, parent FROM pg_backend_memory_contexts';
    ELSE
        CREATE FUNCTION pg_temp.contexts() RETURNS TABLE (name text, parent text) LANGUAGE sql
            AS 'WITH m AS MATERIALIZED (SELECT name, path FROM pg_backend_memory_contexts)
                SELECT c.name, p.name FROM m c LEFT JOIN m p
                    ON p.path = c.path[1:pg_catalog.array_length(c.path, 1) - 1]';
    END IF;
END $$;
DO $$ BEGIN
    PERFORM sharding.create_map('cm', 16, ARRAY['a', 'b']);
    PERFORM sharding.pin('cm', 'k' || i, 'c') FROM generate_series(1, 2000) AS i;
END $$;
SELECT sharding.node_for('cm', 'k1') AS pinned, sharding.node_for('cm', 'zz') IN ('a', 'b') AS owned;
SELECT name, parent FROM pg_temp.contexts() WHERE name = 'sharding cache';

-- The rank cache's per-column memory is a child of it.
CREATE TABLE cache_orders (id int PRIMARY KEY, status text);
INSERT INTO cache_orders VALUES (1, 'new');
SELECT sharding.guard_rank('cache_orders', 'status', ARRAY['new', 'done']);
SELECT sharding.advance('cache_orders', 1, 'done');
SELECT name, parent FROM pg_temp.contexts() WHERE name = 'sharding rank column';

-- 40 rebuilds of the routing entry (each move invalidates it; each
-- node_for rebuilds and retires the replaced entry): the context does not
-- grow with them.
CREATE TEMP TABLE cache_size AS
    SELECT total_bytes AS after_one FROM pg_backend_memory_contexts WHERE name = 'sharding cache';
DO $$ BEGIN
    FOR i IN 1 .. 40 LOOP
        PERFORM sharding.move_shard('cm', i % 16, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END);
        PERFORM sharding.node_for('cm', 'k' || i);
    END LOOP;
END $$;
SELECT sharding.node_for('cm', 'k7') AS still_pinned,
       (SELECT total_bytes FROM pg_backend_memory_contexts WHERE name = 'sharding cache')
           < 2 * (SELECT after_one FROM cache_size) AS bounded;

DROP TABLE cache_orders, cache_size;
SELECT sharding.drop_map('cm');
DROP EXTENSION sharding;
