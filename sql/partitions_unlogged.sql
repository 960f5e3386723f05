-- Native partitions (docs/partitions.md) with an UNLOGGED parent: create_partitions makes unlogged
-- partitions. PostgreSQL 18 refuses unlogged partitioned tables outright
-- ("partitioned tables cannot be unlogged"), so there the parent cannot be
-- made and there is nothing to line up: expected/partitions_unlogged_1.out.
CREATE EXTENSION sharding;
CREATE UNLOGGED TABLE up (k bigint) PARTITION BY HASH (k sharding.int8_shard_ops);
SELECT sharding.create_partitions('up', 2);
SELECT relname, relpersistence FROM pg_class WHERE relname LIKE 'up\__' ORDER BY 1;
DROP TABLE IF EXISTS up;
DROP EXTENSION sharding;
