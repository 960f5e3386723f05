# DDL on every node (docs/ddl.md, CONTRACT 15.4): run_on_nodes and DDL of a
# distributed table propagated from the coordinator to its three attached
# data nodes in one two-phase transaction, while writers write.
#
# Topology (as 610_follow.pl): instance i1 holds the coordinator (database
# `coord`) and data node n1 (database `data`); i2 and i3 hold n2 and n3.
# Every instance runs with max_prepared_transactions = 10 (two-phase
# commit needs it on the data nodes) and the library preloaded.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 50;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my %inst;
$inst{$_} = sharding_node($_, db => 'data',
	conf => "max_prepared_transactions = 10\nwal_retrieve_retry_interval = 200ms") for qw(i1 i2 i3);
my %at = (n1 => 'i1', n2 => 'i2', n3 => 'i3');
my @nodes = qw(n1 n2 n3);
my %dsn = map { $_ => sharding_dsn($inst{ $at{$_} }, 'data') } @nodes;
my $i1 = $inst{i1};
sub d { my ($n, $sql, %o) = @_; return sharding_q($inst{ $at{$n} }, 'data', $sql, %o); }
sub c { my ($sql, %o) = @_; return sharding_q($i1, 'coord', $sql, %o); }
# on_all(SQL): its answer on n1, n2, n3, joined by spaces.
sub on_all { my ($sql) = @_; return join(' ', map { d($_, $sql) } @nodes); }
# prepared(): transactions left prepared on the three nodes.
sub prepared { return on_all('SELECT count(*) FROM pg_prepared_xacts'); }

my $schema = <<'SQL';
CREATE TABLE docs (k text PRIMARY KEY, v integer);
CREATE TABLE items (k text PRIMARY KEY, v integer);
SELECT 'ready';
SQL
$i1->safe_psql('postgres', 'CREATE DATABASE coord');
$i1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($i1, 'coord') . "'");
is(join(' ', (map { d($_, $schema) } @nodes), c("CREATE EXTENSION sharding; CREATE EXTENSION dblink;\n$schema")),
	'ready ready ready ready', 'coordinator and three data nodes created');
is((split /\n/, c(<<"SQL"))[-1], 'configured', 'coordinator: nodes, map m, docs and items distributed');
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}'), sharding.add_node('n3', '$dsn{n3}');
SELECT sharding.create_map('m', 6, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.distribute('docs', 'k', 'm');
SELECT sharding.distribute('items', 'k', 'm');
SELECT 'configured';
SQL
is(scalar(grep { c("SELECT sharding.attach_node('$_')") eq '' } @nodes), 3, 'n1, n2, n3 attached');

# ---------------------------------------------------------------- run_on_nodes
is(c(q{SELECT string_agg(node || '=' || result, ' ' ORDER BY node) FROM sharding.run_on_nodes('CREATE TABLE extra (id integer)')}),
	'n1=CREATE TABLE n2=CREATE TABLE n3=CREATE TABLE', 'run_on_nodes: one row per attached node with its command tag');
is(on_all(q{SELECT count(*) FROM pg_class WHERE relname = 'extra'}), '1 1 1', 'run_on_nodes: the table exists on every node');
is(prepared(), '0 0 0', 'run_on_nodes: nothing left prepared');
is(c(q{SELECT string_agg(node || '=' || result, ' ') FROM sharding.run_on_nodes('INSERT INTO public.extra VALUES (1), (2)', ARRAY['n2'])}),
	'n2=INSERT 0 2', 'run_on_nodes on one node named');

# A statement failing on one node: that node's SQLSTATE and message, naming
# it; nothing kept anywhere.
d('n2', 'CREATE TABLE only_n2 (id integer)');
my $out = c(q{SELECT * FROM sharding.run_on_nodes('CREATE TABLE only_n2 (id integer); CREATE TABLE also (id integer)')},
	verbose => 1);
like($out, qr/ERROR:\s+42P07: node "n2": relation "only_n2" already exists/,
	'a statement failing on n2: 42P07 naming n2');
is(on_all(q{SELECT count(*) FROM pg_class WHERE relname IN ('only_n2', 'also')}), '0 1 0',
	'... and no node keeps any of it (n2 has its own only_n2, no "also" anywhere)');
is(prepared(), '0 0 0', '... and nothing left prepared');

# The coordinator's transaction rolled back after run_on_nodes: rolled back everywhere.
c(q{BEGIN; SELECT * FROM sharding.run_on_nodes('CREATE TABLE rolled (id integer)'); ROLLBACK;});
is(on_all(q{SELECT count(*) FROM pg_class WHERE relname = 'rolled'}), '0 0 0',
	'a coordinator ROLLBACK rolls back every node');
# A savepoint rolled back: the nodes' work since then too, the rest commits.
c(<<'SQL');
BEGIN;
SELECT * FROM sharding.run_on_nodes('CREATE TABLE kept (id integer)');
SAVEPOINT s;
SELECT * FROM sharding.run_on_nodes('CREATE TABLE undone (id integer)');
ROLLBACK TO SAVEPOINT s;
COMMIT;
SQL
is(on_all(q{SELECT string_agg(relname, ',' ORDER BY relname) FROM pg_class WHERE relname IN ('kept', 'undone')}),
	'kept kept kept', 'ROLLBACK TO SAVEPOINT undoes the nodes\' work since the savepoint; the rest commits');

# A coordinator transaction that ran commands on nodes cannot be prepared
# itself; a command that ends its transaction there is refused.
$out = c(q{BEGIN; SELECT count(*) FROM sharding.run_on_nodes('SELECT 1'); PREPARE TRANSACTION 'mine';}, verbose => 1);
like($out, qr/ERROR:\s+0A000: cannot PREPARE a transaction that ran commands on nodes/, 'PREPARE TRANSACTION after run_on_nodes: 0A000');
is(prepared() . ' ' . c('SELECT count(*) FROM pg_prepared_xacts'), '0 0 0 0', '... and nothing is left prepared anywhere');
$out = c(q{SELECT * FROM sharding.run_on_nodes('COMMIT')}, verbose => 1);
like($out, qr/ERROR:\s+2D000: node "n1": the command ended its transaction there/, 'a command that ends the transaction there: 2D000');

# The same role on every node: the DSN's user (postgres) switches to the
# caller's role there, which must exist there (n1 shares the coordinator's
# instance, so its roles: n2 is the first to miss it).
c('CREATE ROLE ddl_admin SUPERUSER');
$out = c(q{SET ROLE ddl_admin; SELECT * FROM sharding.run_on_nodes('CREATE TABLE by_admin (id integer)')}, verbose => 1);
like($out, qr/ERROR:\s+22023: node "n2": role "ddl_admin" does not exist/, 'a role missing on a node: the node\'s error, naming it');
d($_, 'CREATE ROLE ddl_admin') for qw(n2 n3);
d($_, 'GRANT CREATE ON SCHEMA public TO ddl_admin') for @nodes;
is(c(q{SET ROLE ddl_admin; SELECT count(*) FROM sharding.run_on_nodes('CREATE TABLE by_admin (id integer)')}), '3',
	'the role created on every node: the command runs');
is(on_all(q{SELECT tableowner FROM pg_tables WHERE tablename = 'by_admin'}), 'ddl_admin ddl_admin ddl_admin',
	'... as that role on every node (it owns the table)');
# The records of committed transactions are deleted by the worker's recovery.
ok(defined sharding_wait($i1, 'coord', 'SELECT count(*) FROM sharding.node_transactions', '0', 10),
	'the coordinator\'s records of resolved transactions are cleaned up within 10 s');

# ---------------------------------------------------------------- propagated DDL while writers write
# Writers on each node insert the keys that node owns, one autocommit
# statement each, while the coordinator adds a column, creates an index and
# drops a table.
my $per_writer = 400;
my %writer;
for my $n (@nodes)
{
	my $sql = join('', map {
		"INSERT INTO docs (k, v) SELECT x.k, $_ FROM (VALUES ('$n-$_')) AS x(k) WHERE sharding.node_for('m', x.k) = sharding.this_node();\n"
	} 1 .. $per_writer);
	$writer{$n} = sharding_start($inst{ $at{$n} }, 'data', $sql);
}
ok(defined sharding_wait($i1, 'data', 'SELECT count(*) > 20 FROM docs', 't', 60), 'writers are writing');
my $t0 = time;
my $ddl = c(<<'SQL', stderr => 1);
ALTER TABLE docs ADD COLUMN note text NOT NULL DEFAULT 'none';
CREATE INDEX docs_v ON docs (v);
DROP TABLE items;
SQL
my $ddl_ms = int((time - $t0) * 1000);
unlike($ddl, qr/ERROR/, "ALTER TABLE, CREATE INDEX, DROP TABLE on the coordinator ($ddl_ms ms)");
diag("ALTER TABLE + CREATE INDEX + DROP TABLE on 3 nodes while writers write: $ddl_ms ms");
# Once the coordinator's COMMIT has returned, every node has the new schema.
is(on_all(q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = 'note'}), '1 1 1',
	'the column exists on every node when COMMIT returns');
is(on_all(q{SELECT count(*) FROM pg_indexes WHERE indexname = 'docs_v'}), '1 1 1', 'so does the index');
is(on_all(q{SELECT count(*) FROM pg_class WHERE relname = 'items'}), '0 0 0', 'and the table is gone everywhere');
is(c(q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = 'note'}), '1',
	'... as on the coordinator');
my @written;
for my $n (@nodes)
{
	my ($rc, $o, $err) = sharding_finish($writer{$n});
	push @written, $rc == 0 && $err !~ /ERROR/ ? 'ok' : "rc=$rc $err";
}
is(join(' ', @written), 'ok ok ok', 'every writer wrote every statement without an error');
is(on_all(q{SELECT count(*) = count(*) FILTER (WHERE note = 'none') AND count(*) > 0 FROM docs}), 't t t',
	'every row written has the new column\'s default');
is(prepared(), '0 0 0', 'nothing left prepared after the DDL');

# A propagated statement failing on one node: refused everywhere.
d('n3', 'CREATE INDEX docs_dup ON docs (k)');
$out = c('CREATE INDEX docs_dup ON docs (v)', verbose => 1);
like($out, qr/ERROR:\s+42P07: node "n3": relation "docs_dup" already exists/, 'CREATE INDEX failing on n3: 42P07 naming n3');
is(join(' ', c(q{SELECT count(*) FROM pg_indexes WHERE indexname = 'docs_dup'}),
		on_all(q{SELECT count(*) FROM pg_indexes WHERE indexname = 'docs_dup' AND indexdef LIKE '%(v)'})),
	'0 0 0 0', '... and the index on v exists nowhere');

# Several statements in one query string: each node runs each once.
c(q{ALTER TABLE docs ADD COLUMN a1 integer\; ALTER TABLE docs ADD COLUMN a2 integer});
is(on_all(q{SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname IN ('a1', 'a2')}),
	'a1,a2 a1,a2 a1,a2', 'a query string of two statements: both on every node, once each');

# CREATE INDEX CONCURRENTLY: node by node, with a NOTICE.
$out = c('CREATE INDEX CONCURRENTLY docs_note ON docs (note)', stderr => 1);
like($out, qr/NOTICE:.*not atomically/, 'CREATE INDEX CONCURRENTLY: a NOTICE that it is not atomic');
is(on_all(q{SELECT count(*) FROM pg_indexes WHERE indexname = 'docs_note'}), '1 1 1', '... and the index on every node');

# Renames inside the table propagate; DROP INDEX too.
c('ALTER TABLE docs RENAME COLUMN a2 TO a3');
is(on_all(q{SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname IN ('a1', 'a2', 'a3')}),
	'a1,a3 a1,a3 a1,a3', 'ALTER TABLE ... RENAME COLUMN: renamed on every node');
c('DROP INDEX docs_note');
is(join(' ', c(q{SELECT count(*) FROM pg_indexes WHERE indexname = 'docs_note'}), on_all(q{SELECT count(*) FROM pg_indexes WHERE indexname = 'docs_note'})),
	'0 0 0 0', 'DROP INDEX of a distributed table\'s index: dropped on every node');
# A distributed table is known by its name (sharding.distributed_tables, the
# nodes' copies, PL/Proxy): renaming it, or moving it to another schema,
# would leave the map naming a table that no longer exists. Refused (0A000,
# with the way to do it), nothing changed anywhere, propagation on or off.
c('CREATE SCHEMA other');
my $where = q{SELECT coalesce(string_agg(n.nspname || '.' || c.relname, ',' ORDER BY c.relname), '-') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname IN ('docs', 'docs_renamed') AND c.relkind = 'r'};
for my $stmt ('ALTER TABLE docs RENAME TO docs_renamed', 'ALTER TABLE docs SET SCHEMA other',
		'SET sharding.propagate_ddl = off; ALTER TABLE docs RENAME TO docs_renamed') {
	$out = c($stmt, verbose => 1);
	like($out, qr/ERROR:\s+0A000: distributed table public\.docs cannot be (renamed|moved to another schema)/, "$stmt: 0A000");
	like($out, qr/HINT:.*undistribute/, '... with the way to do it in the hint');
	is(join(' ', c($where), on_all($where), c(q{SELECT count(*) FROM sharding.distributed_tables WHERE schema_name = 'public' AND table_name = 'docs'})),
		'public.docs public.docs public.docs public.docs 1', '... nothing renamed anywhere, docs still distributed');
}

# ---------------------------------------------------------------- distribute creates the table
# On the nodes that lack it (n2 has its own, kept), in the same two-phase
# transaction: columns, constraints, indexes, replica identity.
d('n2', 'CREATE TABLE notes (ws text NOT NULL, id bigint NOT NULL, own_column integer)');
c(<<'SQL');
CREATE TABLE notes (ws text NOT NULL, id bigint GENERATED BY DEFAULT AS IDENTITY, body text DEFAULT 'empty',
                    n integer CHECK (n > 0), PRIMARY KEY (ws, id));
CREATE INDEX notes_body ON notes (body);
ALTER TABLE notes REPLICA IDENTITY FULL;
SQL
is((split /\n/, c(q{SELECT sharding.distribute('notes', 'ws', 'm'); SELECT 'distributed'}))[-1], 'distributed', 'distribute notes');
my $shape = q{SELECT string_agg(attname || ':' || format_type(atttypid, atttypmod), ',' ORDER BY attnum)
    || '/' || (SELECT count(*) FROM pg_indexes WHERE tablename = 'notes')
    || '/' || (SELECT count(*) FROM pg_constraint WHERE conrelid = 'notes'::regclass AND contype IN ('p', 'c'))
    || '/' || (SELECT relreplident::text FROM pg_class WHERE oid = 'notes'::regclass)
    FROM pg_attribute WHERE attrelid = 'notes'::regclass AND attnum > 0 AND NOT attisdropped};
my $here = c($shape);
like($here, qr/^ws:text,id:bigint,body:text,n:integer\/2\/2\/f$/, "the coordinator's table: $here");
is(join(' ', d('n1', $shape), d('n3', $shape)), "$here $here", "n1 and n3 got the coordinator's table");
like(d('n2', $shape), qr/own_column/, 'n2 kept its own table');
# A node that cannot create it: distribute fails naming it, nothing anywhere.
c(q{CREATE TYPE mood AS ENUM ('ok', 'sad'); CREATE TABLE moods (ws text PRIMARY KEY, m mood)});
$out = c(q{SELECT sharding.distribute('moods', 'ws', 'm')}, verbose => 1);
like($out, qr/ERROR:\s+42704: node "n1": type "public\.mood" does not exist/, 'a node that cannot create the table: distribute fails naming it');
is(join(' ', c(q{SELECT count(*) FROM sharding.distributed_tables WHERE table_name = 'moods'}),
		on_all(q{SELECT count(*) FROM pg_class WHERE relname = 'moods'}), prepared()),
	'0 0 0 0 0 0 0', '... nothing recorded, no node has the table, nothing prepared');
