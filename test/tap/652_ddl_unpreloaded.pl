# DDL of a distributed table on a coordinator WITHOUT the library preloaded
# (docs/ddl.md): no ProcessUtility hook can propagate it, so an event
# trigger refuses it (55000, hint: preload, or run_on_nodes) rather than let
# it change the coordinator alone; run_on_nodes still works.
#
# One instance, library not preloaded: database `coord` is the coordinator,
# database `data` its attached data node n1.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 15;
use lib 'lib';
use ShardingNode;

my $i1 = sharding_node('i1', db => 'data', preload => 0, conf => 'max_prepared_transactions = 5');
my $dsn = sharding_dsn($i1, 'data');
sub d { my ($sql, %o) = @_; return sharding_q($i1, 'data', $sql, %o); }
sub c { my ($sql, %o) = @_; return sharding_q($i1, 'coord', $sql, %o); }
$i1->safe_psql('postgres', 'CREATE DATABASE coord');
$i1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($i1, 'coord') . "'");
my $schema = "CREATE TABLE docs (k text PRIMARY KEY, v integer); CREATE TABLE plain (k text);";
d($schema);
c("CREATE EXTENSION sharding; CREATE EXTENSION dblink; $schema
   SELECT sharding.add_node('n1', '$dsn'); SELECT sharding.create_map('m', 2, ARRAY['n1']);
   SELECT sharding.distribute('docs', 'k', 'm');");
is(c("SELECT sharding.attach_node('n1')"), '', 'n1 attached to a coordinator without the library preloaded');
is(c("SHOW shared_preload_libraries"), '', 'the library is not preloaded');

my $cols = "SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attnum > 0 AND NOT attisdropped";
my $out = c('ALTER TABLE docs ADD COLUMN note text', verbose => 1);
like($out, qr/ERROR:\s+55000: DDL of distributed table public\.docs is not propagated/, 'ALTER TABLE of a distributed table: 55000');
like($out, qr/HINT:.*shared_preload_libraries.*run_on_nodes/, '... with a hint: preload, or run_on_nodes');
is(c($cols), '2', '... and the coordinator is unchanged');
my @refused = map { c($_, verbose => 1) =~ /ERROR:\s+55000/ ? 'refused' : 'ran' }
	('CREATE INDEX docs_v ON docs (v)', "COMMENT ON TABLE docs IS 'x'", 'DROP TABLE docs',
	 'CREATE TRIGGER t BEFORE INSERT ON docs FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()');
is(join(' ', @refused), 'refused refused refused refused', 'CREATE INDEX, COMMENT, DROP TABLE, CREATE TRIGGER: refused');
is(c("SELECT count(*) FROM pg_class WHERE relname IN ('docs', 'docs_v')"), '1', 'nothing of them happened here');
# DROP INDEX of a distributed table's index (the sql_drop event has lost
# the index's table by then), renaming the table or moving it to another
# schema (the map would name a table that no longer exists): refused too.
c('SET sharding.propagate_ddl = off; CREATE INDEX docs_v ON docs (v)');
$out = c('DROP INDEX docs_v', verbose => 1);
like($out, qr/ERROR:\s+55000: DDL of distributed table public\.docs is not propagated/, 'DROP INDEX of its index: 55000');
is(c("SELECT count(*) FROM pg_class WHERE relname = 'docs_v'"), '1', '... and the index is still here');
c('CREATE SCHEMA other');
@refused = map { c($_, verbose => 1) =~ /ERROR:\s+(\w{5}): (distributed table public\.docs cannot be|DDL of distributed table public\.docs)/ ? $1 : 'ran' }
	('ALTER TABLE docs RENAME TO docs2', 'ALTER TABLE docs SET SCHEMA other', 'ALTER TABLE docs RENAME COLUMN v TO w');
is(join(' ', @refused), '0A000 0A000 55000', 'RENAME TO, SET SCHEMA: 0A000; RENAME COLUMN: the 55000 of any ALTER TABLE');
is(c("SELECT string_agg(n.nspname || '.' || c.relname || ':' || a.attname, ',' ORDER BY a.attnum) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 WHERE c.relname IN ('docs', 'docs2') AND c.relkind = 'r'"),
	'public.docs:k,public.docs:v', '... the table, its schema and its columns unchanged');
is(c('ALTER TABLE plain ADD COLUMN note text; SELECT 1'), '1', 'DDL of a table that is not distributed: as usual');
# The way without preloading: run_on_nodes, and the same statement here with
# propagation off (the setting says: this database only).
is(c(q{SELECT string_agg(node || '=' || result, ' ') FROM sharding.run_on_nodes('ALTER TABLE docs ADD COLUMN note text')}),
	'n1=ALTER TABLE', 'run_on_nodes runs the ALTER TABLE on the node');
is(d($cols), '3', '... which has the column');
is(c("SET sharding.propagate_ddl = off; ALTER TABLE docs ADD COLUMN note text; $cols"), '3',
	'with sharding.propagate_ddl = off the same ALTER TABLE changes the coordinator alone, as asked');
