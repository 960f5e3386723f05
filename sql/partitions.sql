-- Native partitions (docs/partitions.md): hash operator classes whose partitions line up with shard_of,
-- and create_partitions. The cross-database move of a partition (pg_dump -t)
-- is checked by test/harness/partitions.sh.
CREATE EXTENSION sharding;

CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- What an EXPLAIN of q scans: each relation scanned (an index scan shows the
-- index instead), plus "removed N" for run-time pruning.
CREATE FUNCTION pg_temp.scanned(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    line text;
    m text[];
    out text[] := '{}';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
        m := regexp_match(line, ' (?:using (\S+) )?on (\S+)');
        IF m IS NOT NULL THEN out := out || coalesce(m[1], m[2]); END IF;
        m := regexp_match(line, 'Subplans Removed: (\d+)');
        IF m IS NOT NULL THEN out := out || ('removed ' || m[1]); END IF;
    END LOOP;
    RETURN array_to_string(out, ' ');
END $$;

-- 100,000 keys of each type, as SQL over i = 0 .. 99999: multibyte and empty
-- text, bytea of length 0..32, every smallint, integers and bigints spread
-- over their whole range (both ends included), uuids.
CREATE TEMP TABLE key_sql (typ text PRIMARY KEY, opc text, expr text);
INSERT INTO key_sql VALUES
  ('text', 'text_shard_ops',
   $$CASE WHEN i = 0 THEN '' WHEN i % 2 = 0 THEN 'key-' || i ELSE 'ключ-' || i || '-é' END$$),
  ('bytea', 'bytea_shard_ops', $$substring(sha256(int8send(i)) from 1 for i % 33)$$),
  ('smallint', 'int2_shard_ops', $$(i % 65536 - 32768)::smallint$$),
  ('integer', 'int4_shard_ops',
   $$CASE i WHEN 99999 THEN 2147483647 ELSE (i::bigint * 42949 - 2147483648)::integer END$$),
  ('bigint', 'int8_shard_ops',
   $$CASE i WHEN 99999 THEN 9223372036854775807
            ELSE (i::numeric * 184467440737095 - 9223372036854775808)::bigint END$$),
  ('uuid', 'uuid_shard_ops', $$md5(i::text)::uuid$$);

-- Every opclass is a valid hash opclass; the integer widths share one family
-- holding all nine equality operators.
SELECT o.opcname, f.opfname, amvalidate(o.oid) AS valid, o.opcdefault
  FROM pg_opclass o JOIN pg_opfamily f ON f.oid = o.opcfamily
 WHERE o.opcnamespace = 'sharding'::regnamespace ORDER BY 1;
SELECT count(*) FILTER (WHERE amoplefttype <> amoprighttype) AS cross_type_ops, count(*) AS ops
  FROM pg_amop
 WHERE amopfamily = (SELECT oid FROM pg_opfamily
                      WHERE opfname = 'integer_shard_ops' AND opfnamespace = 'sharding'::regnamespace);

-- The support functions: standard = low 32 bits of hash64 = low 32 bits of
-- extended(seed 0) = hash64; extended(hash partition seed) = hash64 minus
-- hash_combine64's constant; any other seed is a different hash.
CREATE FUNCTION pg_temp.support_check(key_type text, expr text) RETURNS TABLE (typ text, rows bigint, bad bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format($q$
        SELECT %L::text, count(*),
               count(*) FILTER (WHERE NOT (
                   sharding.partition_hash(k) = (sharding.hash64(k) & 4294967295)::bit(32)::integer
                   AND sharding.partition_hash_extended(k, 0) = sharding.hash64(k)
                   AND (sharding.partition_hash_extended(k, 0) & 4294967295)
                       = (sharding.partition_hash(k)::bigint & 4294967295)
                   AND (sharding.partition_hash_extended(k, x'7A5B22367996DCFD'::bigint)::numeric
                        + 18446744073709551616 + x'49a0f4dd15e5a8e3'::bigint) %% 18446744073709551616
                       = (sharding.hash64(k)::numeric + 18446744073709551616) %% 18446744073709551616
                   AND sharding.partition_hash_extended(k, 42) <> sharding.partition_hash_extended(k, 0)
                   AND sharding.partition_hash_extended(k, 42) <> sharding.partition_hash_extended(k, 43)
                   AND sharding.partition_hash_extended(k, 42) = sharding.partition_hash_extended(k, 42)))
          FROM (SELECT %s AS k FROM generate_series(0, 9999) AS i) AS s$q$, key_type, expr);
END $$;
SELECT s.* FROM key_sql, LATERAL pg_temp.support_check(key_sql.typ, key_sql.expr) AS s ORDER BY 1;
-- Equal integers hash alike whatever their width; NULL in, NULL out.
SELECT sharding.partition_hash(-5::smallint) = sharding.partition_hash(-5)
       AND sharding.partition_hash(-5) = sharding.partition_hash(-5::bigint) AS same_32,
       sharding.partition_hash_extended(-5::smallint, 7) = sharding.partition_hash_extended(-5, 7)
       AND sharding.partition_hash_extended(-5, 7) = sharding.partition_hash_extended(-5::bigint, 7) AS same_64,
       sharding.partition_hash(NULL::text) IS NULL AND sharding.partition_hash_extended(NULL::uuid, 0) IS NULL AS strict;

-- Alignment: for 100,000 keys (and a NULL) of each type and n in {4, 64, 480},
-- every row sits in <parent>_<shard_of(k, n)>, the NULL in <parent>_0.
-- Reports rows, misplaced rows, NULLs not in remainder 0, partitions that got
-- rows, and disagreements of satisfies_hash_partition (PostgreSQL's partition
-- constraint) for moduli with no partitions at all (3, 1000, 2^31-1).
CREATE FUNCTION pg_temp.alignment(key_type text, opc text, expr text, modulus integer)
RETURNS TABLE (typ text, n integer, rows bigint, misplaced bigint, null_misplaced bigint,
               partitions_used bigint, constraint_disagrees bigint)
LANGUAGE plpgsql AS $$
DECLARE
    w integer := length((modulus - 1)::text);
BEGIN
    EXECUTE format('CREATE TABLE pt (k %s) PARTITION BY HASH (k sharding.%I)', key_type, opc);
    PERFORM sharding.create_partitions('pt', modulus);
    EXECUTE format('INSERT INTO pt SELECT %s FROM generate_series(0, 99999) AS i', expr);
    INSERT INTO pt VALUES (NULL);
    RETURN QUERY SELECT key_type, modulus,
        count(*) FILTER (WHERE k IS NOT NULL),
        count(*) FILTER (WHERE k IS NOT NULL
                           AND c.relname <> 'pt_' || lpad(sharding.shard_of(k, modulus)::text, w, '0')),
        count(*) FILTER (WHERE k IS NULL AND c.relname <> 'pt_' || repeat('0', w)),
        count(DISTINCT c.relname),
        count(*) FILTER (WHERE k IS NOT NULL AND modulus = 4 AND NOT (
              satisfies_hash_partition('pt'::regclass, 3, sharding.shard_of(k, 3), k)
          AND satisfies_hash_partition('pt'::regclass, 1000, sharding.shard_of(k, 1000), k)
          AND satisfies_hash_partition('pt'::regclass, 2147483647, sharding.shard_of(k, 2147483647), k)
          AND NOT satisfies_hash_partition('pt'::regclass, 1000, (sharding.shard_of(k, 1000) + 1) % 1000, k)))
      FROM pt JOIN pg_class c ON c.oid = pt.tableoid;
    DROP TABLE pt;
END $$;
SELECT a.* FROM key_sql, unnest(ARRAY[4, 64, 480]) AS n,
       LATERAL pg_temp.alignment(key_sql.typ, key_sql.opc, key_sql.expr, n) AS a
 ORDER BY a.typ, a.n;

-- Control: the same check fails with PostgreSQL's own hash opclass.
CREATE TABLE pgp (k text) PARTITION BY HASH (k);
DO $$ BEGIN
    FOR r IN 0 .. 63 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF pgp FOR VALUES WITH (MODULUS 64, REMAINDER %s)', 'pgp_' || lpad(r::text, 2, '0'), r);
    END LOOP;
END $$;
INSERT INTO pgp SELECT 'key-' || i FROM generate_series(1, 10000) AS i;
SELECT count(*) FILTER (WHERE c.relname <> 'pgp_' || lpad(sharding.shard_of(k, 64)::text, 2, '0')) > 9000 AS default_opclass_misplaces
  FROM pgp JOIN pg_class c ON c.oid = pgp.tableoid;
DROP TABLE pgp;

-- Pruning: WHERE k = constant scans one partition, the one shard_of names.
CREATE TABLE pt_text (k text, v int) PARTITION BY HASH (k sharding.text_shard_ops);
SELECT sharding.create_partitions('pt_text', 64);
INSERT INTO pt_text SELECT 'key-' || i, i FROM generate_series(1, 20000) AS i;
ANALYZE pt_text;
SELECT sharding.shard_of('key-42', 64) AS shard;
EXPLAIN (COSTS OFF) SELECT * FROM pt_text WHERE k = 'key-42';
SELECT count(*) AS keys, count(*) FILTER (WHERE pg_temp.scanned(format('SELECT * FROM pt_text WHERE k = %L', 'key-' || i))
                                             <> 'pt_text_' || lpad(sharding.shard_of('key-' || i, 64)::text, 2, '0')) AS not_pruned
  FROM generate_series(1, 200) AS i;
-- A prepared statement with a parameter: custom plans prune at plan time,
-- the generic plan at executor start-up.
PREPARE by_key(text) AS SELECT v FROM pt_text WHERE k = $1;
SET plan_cache_mode = force_custom_plan;
SELECT pg_temp.scanned($$EXECUTE by_key('key-42')$$) = 'pt_text_' || lpad(sharding.shard_of('key-42', 64)::text, 2, '0') AS custom_pruned;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE by_key('key-42');
SELECT pg_temp.scanned($$EXECUTE by_key('key-7')$$) = 'removed 63 pt_text_' || lpad(sharding.shard_of('key-7', 64)::text, 2, '0') AS generic_pruned;
EXECUTE by_key('key-42');
RESET plan_cache_mode;
DEALLOCATE by_key;

-- Cross-type: an integer key compared with bigint and smallint values, and a
-- bigint key compared with an integer, prune like PostgreSQL's integer_ops.
CREATE TABLE pt_int (k integer, v int) PARTITION BY HASH (k sharding.int4_shard_ops);
SELECT sharding.create_partitions('pt_int', 64);
INSERT INTO pt_int SELECT i, i FROM generate_series(-10000, 10000) AS i;
CREATE TABLE pt_big (k bigint, v int) PARTITION BY HASH (k sharding.int8_shard_ops);
SELECT sharding.create_partitions('pt_big', 4);
INSERT INTO pt_big SELECT i, i FROM generate_series(-10000, 10000) AS i;
ANALYZE pt_int, pt_big;
EXPLAIN (COSTS OFF) SELECT * FROM pt_int WHERE k = 5::bigint;
SELECT pg_temp.scanned('SELECT * FROM pt_int WHERE k = 5::bigint') = 'pt_int_' || lpad(sharding.shard_of(5, 64)::text, 2, '0') AS int4_bigint,
       pg_temp.scanned('SELECT * FROM pt_int WHERE k = -7::smallint') = 'pt_int_' || lpad(sharding.shard_of(-7, 64)::text, 2, '0') AS int4_smallint,
       pg_temp.scanned('SELECT * FROM pt_big WHERE k = 5') = 'pt_big_' || sharding.shard_of(5, 4) AS int8_int4,
       (SELECT v FROM pt_int WHERE k = 5::bigint) = 5 AS found;
PREPARE by_big(bigint) AS SELECT v FROM pt_int WHERE k = $1;
SET plan_cache_mode = force_generic_plan;
SELECT pg_temp.scanned('EXECUTE by_big(9999)') = 'removed 63 pt_int_' || lpad(sharding.shard_of(9999, 64)::text, 2, '0') AS generic_cross_type;
EXECUTE by_big(9999);
RESET plan_cache_mode;
DEALLOCATE by_big;

-- Partitionwise join and aggregate pair partitions by remainder, so they
-- are right only if both tables route alike; a hash join and a hashed
-- GROUP BY on the opclass's equality agree with the unpartitioned answer.
CREATE TABLE pt_text2 (k text, w int) PARTITION BY HASH (k sharding.text_shard_ops);
SELECT sharding.create_partitions('pt_text2', 64);
INSERT INTO pt_text2 SELECT 'key-' || (i % 5000), i FROM generate_series(1, 30000) AS i;
ANALYZE pt_text2;
SET enable_partitionwise_join = on;
SET enable_partitionwise_aggregate = on;
SET enable_mergejoin = off;
SET enable_nestloop = off;
SELECT pg_temp.scanned('SELECT count(*) FROM pt_text a JOIN pt_text2 b USING (k)') ~ '(pt_text2_00 pt_text_00|pt_text_00 pt_text2_00) ' AS partitionwise;
SELECT count(*) AS joined, sum(a.v) AS sum_v FROM pt_text a JOIN pt_text2 b USING (k);
SELECT count(*) AS joined, sum(a.v) AS sum_v
  FROM (SELECT * FROM pt_text) a JOIN (SELECT k, w FROM pt_text2 OFFSET 0) b ON a.k = b.k;
SELECT count(*) AS groups, sum(c) AS rows, max(c) AS max_per_key
  FROM (SELECT k, count(*) AS c FROM pt_text2 GROUP BY k) AS g;
RESET ALL;

-- Hash indexes with the opclasses: an index scan finds every row.
CREATE TABLE hidx (k text, b bytea, i integer, u uuid);
INSERT INTO hidx SELECT 'key-' || i, int8send(i), i, md5(i::text)::uuid FROM generate_series(1, 20000) AS i;
CREATE INDEX hidx_k ON hidx USING hash (k sharding.text_shard_ops);
CREATE INDEX hidx_b ON hidx USING hash (b sharding.bytea_shard_ops);
CREATE INDEX hidx_i ON hidx USING hash (i sharding.int4_shard_ops);
CREATE INDEX hidx_u ON hidx USING hash (u sharding.uuid_shard_ops);
ANALYZE hidx;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT * FROM hidx WHERE k = 'key-42';
SELECT pg_temp.scanned($$SELECT * FROM hidx WHERE b = int8send(42)$$) AS b,
       pg_temp.scanned($$SELECT * FROM hidx WHERE i = 42::bigint$$) AS i_cross_type,
       pg_temp.scanned($$SELECT * FROM hidx WHERE u = md5('42')::uuid$$) AS u;
SELECT count(*) FILTER (WHERE (SELECT count(*) FROM hidx h WHERE h.k = 'key-' || g) = 1
                          AND (SELECT count(*) FROM hidx h WHERE h.b = int8send(g)) = 1
                          AND (SELECT count(*) FROM hidx h WHERE h.i = g::bigint) = 1
                          AND (SELECT count(*) FROM hidx h WHERE h.u = md5(g::text)::uuid) = 1) AS found,
       count(*) AS looked_up
  FROM generate_series(1, 20000, 7) AS g;
SELECT count(*) AS absent FROM hidx WHERE k = 'no such key';
RESET ALL;
DROP TABLE hidx;

-- Keys stored compressed or out of line (TOAST) hash by their value.
CREATE TABLE pt_big_text (k text) PARTITION BY HASH (k sharding.text_shard_ops);
SELECT sharding.create_partitions('pt_big_text', 16);
INSERT INTO pt_big_text SELECT repeat('x', 300000) || i FROM generate_series(1, 20) AS i;
INSERT INTO pt_big_text SELECT string_agg(md5(i::text || j), '') FROM generate_series(1, 20) AS i,
       generate_series(1, 200) AS j GROUP BY i;
SELECT count(*) AS rows, max(pg_column_size(k)) < 10000 AS stored_small, min(length(k)) >= 6400 AS long_keys,
       count(*) FILTER (WHERE tableoid::regclass::text <> 'pt_big_text_' || lpad(sharding.shard_of(k, 16)::text, 2, '0')) AS misplaced,
       (SELECT count(*) FROM pt_big_text WHERE k = repeat('x', 300000) || 7) AS found
  FROM pt_big_text;
DROP TABLE pt_big_text;

-- Text under a nondeterministic collation would hash equal strings apart:
-- refused (0A000) rather than misrouted.
CREATE COLLATION pg_temp.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
SELECT pg_temp.err($$SELECT sharding.partition_hash('abc' COLLATE pg_temp.ci)$$);
SELECT sharding.partition_hash('abc' COLLATE "C") = sharding.partition_hash('abc') AS c_collation_ok;

-- create_partitions: names zero-padded to the width of shards - 1.
CREATE TABLE p1 (k uuid) PARTITION BY HASH (k sharding.uuid_shard_ops);
SELECT sharding.create_partitions('p1', 1);
CREATE TABLE p10 (k bytea) PARTITION BY HASH (k sharding.bytea_shard_ops);
SELECT sharding.create_partitions('p10', 10);
CREATE TABLE p11 (k smallint) PARTITION BY HASH (k sharding.int2_shard_ops);
SELECT sharding.create_partitions('p11', 11);
SELECT c.relparent, count(*) AS partitions, min(c.relname) AS first, max(c.relname) AS last,
       string_agg(DISTINCT pg_get_expr(c.relpartbound, c.oid), ', ') FILTER (WHERE c.relname IN ('p1_0', 'p10_3', 'p11_07')) AS bounds
  FROM (SELECT i.inhparent::regclass AS relparent, r.* FROM pg_inherits i JOIN pg_class r ON r.oid = i.inhrelid
         WHERE i.inhparent IN ('p1'::regclass, 'p10'::regclass, 'p11'::regclass)) AS c
 GROUP BY 1 ORDER BY 1;
INSERT INTO p1 SELECT md5(i::text)::uuid FROM generate_series(1, 100) AS i;
SELECT count(*) FROM p1_0;
-- Quoted names in another schema; temporary parents (unlogged ones:
-- partitions_unlogged.sql).
CREATE SCHEMA "odd Schema";
CREATE TABLE "odd Schema"."Tab le" (k text) PARTITION BY HASH (k sharding.text_shard_ops);
SELECT sharding.create_partitions('"odd Schema"."Tab le"', 3);
SELECT relname, relnamespace::regnamespace FROM pg_class
 WHERE relnamespace = '"odd Schema"'::regnamespace ORDER BY 1;
CREATE TEMP TABLE tp (k bigint) PARTITION BY HASH (k sharding.int8_shard_ops);
SELECT sharding.create_partitions('tp', 2);
SELECT relname, relpersistence FROM pg_class WHERE relname LIKE 'tp\__' ORDER BY 1;
-- STRICT: NULL arguments create nothing.
SELECT sharding.create_partitions(NULL, 4) IS NULL AS null_parent,
       sharding.create_partitions('p10', NULL) IS NULL AS null_shards;

-- Errors: 22023 for a bad count or a parent that cannot line up, 42P07 for a
-- name already taken; a failed call creates nothing.
CREATE TABLE plain (k text);
CREATE TABLE listp (k text) PARTITION BY LIST (k);
CREATE TABLE rangep (k int) PARTITION BY RANGE (k);
CREATE TABLE pghash (k text) PARTITION BY HASH (k);
CREATE TABLE twocol (a text, b text) PARTITION BY HASH (a sharding.text_shard_ops, b sharding.text_shard_ops);
CREATE TABLE exprp (k text) PARTITION BY HASH (lower(k) sharding.text_shard_ops);
CREATE TABLE fresh (k text) PARTITION BY HASH (k sharding.text_shard_ops);
CREATE VIEW v AS SELECT 1;
SELECT pg_temp.err($$SELECT sharding.create_partitions('fresh', 0)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('fresh', -2147483648)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('plain', 4)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('v', 4)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('listp', 4)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('rangep', 4)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('pghash', 4)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('twocol', 4)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('exprp', 4)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('no_such_table', 4)$$);
CREATE FUNCTION pg_temp.err_full(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE d text; h text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
    RETURN SQLSTATE || ': ' || SQLERRM || E'\nDETAIL: ' || d || E'\nHINT: ' || h;
END $$;
SELECT pg_temp.err_full($$SELECT sharding.create_partitions('twocol', 4)$$);
-- Name clashes: a table, or any relation or type, holding one of the names.
CREATE TABLE fresh_17 (x int);
SELECT pg_temp.err_full($$SELECT sharding.create_partitions('fresh', 64)$$);
SELECT pg_temp.err($$SELECT sharding.create_partitions('fresh', 18)$$);
SELECT count(*) AS partitions_after_failures FROM pg_inherits WHERE inhparent = 'fresh'::regclass;
-- fresh_17 is not one of the names for 17 shards (_00 .. _16), nor are these.
CREATE TABLE fresh_abc (x int);
CREATE TABLE fresh_99999999999999999999 (x int);
CREATE TABLE fresh_1 (x int);
SELECT sharding.create_partitions('fresh', 17);
DROP TABLE fresh_abc, fresh_99999999999999999999, fresh_1;
SELECT pg_temp.err($$SELECT sharding.create_partitions('fresh', 17)$$);
SELECT count(*) AS partitions FROM pg_inherits WHERE inhparent = 'fresh'::regclass;
DROP TABLE fresh;
CREATE TABLE fresh (k text) PARTITION BY HASH (k sharding.text_shard_ops);
CREATE TYPE fresh_2 AS (a int);
SELECT pg_temp.err($$SELECT sharding.create_partitions('fresh', 4)$$);
DROP TYPE fresh_2;
-- A partition already there under another name: PostgreSQL refuses the
-- overlapping remainder 3 after _0 .. _2 were made, and none of them survive.
CREATE TABLE fresh_odd PARTITION OF fresh FOR VALUES WITH (MODULUS 8, REMAINDER 3);
SELECT pg_temp.err($$SELECT sharding.create_partitions('fresh', 4)$$);
SELECT count(*) AS partitions FROM pg_inherits WHERE inhparent = 'fresh'::regclass;
-- Names that would not fit in 63 bytes.
CREATE TABLE pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp (k int)
    PARTITION BY HASH (k sharding.int4_shard_ops);
SELECT pg_temp.err($$SELECT sharding.create_partitions('pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp', 10)$$);
-- Only the parent's owner may add partitions (as for CREATE TABLE ... PARTITION OF).
CREATE ROLE sharding_partitions_nobody;
CREATE TABLE "odd Schema".other (k text) PARTITION BY HASH (k sharding.text_shard_ops);
GRANT USAGE, CREATE ON SCHEMA "odd Schema" TO sharding_partitions_nobody;
SET ROLE sharding_partitions_nobody;
SELECT pg_temp.err($$SELECT sharding.create_partitions('"odd Schema".other', 4)$$);
RESET ROLE;
SELECT count(*) AS partitions FROM pg_inherits WHERE inhparent = '"odd Schema".other'::regclass;
REVOKE ALL ON SCHEMA "odd Schema" FROM sharding_partitions_nobody;
DROP ROLE sharding_partitions_nobody;

DROP TABLE pt_text, pt_text2, pt_int, pt_big, p1, p10, p11, tp, plain, listp, rangep, pghash,
           twocol, exprp, fresh, fresh_17, pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp;
DROP VIEW v;
DROP SCHEMA "odd Schema" CASCADE;
DROP EXTENSION sharding;
