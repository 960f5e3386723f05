-- Section 2: logical-shard maps, whale pins, nodes.
--
-- Config tables. Users change them through the functions; plain roles may
-- read them. They are registered with pg_extension_config_dump so that
-- pg_dump/restore keeps maps, epochs, pins and node DSNs.

CREATE TABLE sharding.maps (
    map            text PRIMARY KEY CHECK (map <> ''),
    logical_shards integer NOT NULL CHECK (logical_shards >= 1),
    created        timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE sharding.maps IS 'one row per logical-shard map';

-- Every node a map, pin or add_node ever named; dsn is set by add_node.
CREATE TABLE sharding.nodes (
    node text PRIMARY KEY CHECK (node <> ''),
    dsn  text
);
COMMENT ON TABLE sharding.nodes IS 'physical nodes (databases) by name, with their connection strings';

CREATE TABLE sharding.shards (
    map     text NOT NULL REFERENCES sharding.maps ON DELETE CASCADE,
    logical integer NOT NULL CHECK (logical >= 0),
    node    text NOT NULL REFERENCES sharding.nodes,
    epoch   bigint NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    PRIMARY KEY (map, logical)
);
COMMENT ON TABLE sharding.shards IS 'owner and epoch of every logical shard of every map';

CREATE TABLE sharding.pins (
    map  text NOT NULL REFERENCES sharding.maps ON DELETE CASCADE,
    key  text NOT NULL,
    node text NOT NULL REFERENCES sharding.nodes,
    PRIMARY KEY (map, key)
);
COMMENT ON TABLE sharding.pins IS 'whale directory: keys pinned to a node, overriding their logical shard';

-- cluster_version(map): rises with every change to a map, its pins or its
-- nodes' DSNs; rows survive drop_map so the version never falls.
CREATE SEQUENCE sharding.version_seq;
CREATE TABLE sharding.map_versions (
    map     text PRIMARY KEY,
    version bigint NOT NULL
);
COMMENT ON TABLE sharding.map_versions IS 'monotonic configuration version of each map name (PL/Proxy reloads on change)';

SELECT pg_catalog.pg_extension_config_dump('sharding.maps', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.nodes', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.shards', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.pins', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.map_versions', '');
SELECT pg_catalog.pg_extension_config_dump('sharding.version_seq', '');

GRANT SELECT ON sharding.maps, sharding.nodes, sharding.shards, sharding.pins, sharding.map_versions
    TO PUBLIC;
-- Admins change the config through the functions, which run as the caller.
GRANT INSERT, UPDATE, DELETE ON sharding.maps, sharding.nodes, sharding.shards, sharding.pins,
    sharding.map_versions TO sharding_admin;
GRANT USAGE, SELECT, UPDATE ON SEQUENCE sharding.version_seq TO sharding_admin;

-- Bumps the configuration version of a map name (cluster_version).
CREATE FUNCTION sharding._touch_map(map text) RETURNS bigint
    LANGUAGE sql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $$
        INSERT INTO sharding.map_versions AS v (map, version)
        VALUES ($1, pg_catalog.nextval('sharding.version_seq'))
        ON CONFLICT (map) DO UPDATE SET version = pg_catalog.nextval('sharding.version_seq')
        RETURNING v.version
    $$;
COMMENT ON FUNCTION sharding._touch_map(text) IS
    'internal: raises the configuration version of a map (called by every map, pin and DSN change)';
-- Internal: only the functions that change the config call it.
REVOKE ALL ON FUNCTION sharding._touch_map(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sharding._touch_map(text) TO sharding_admin;
