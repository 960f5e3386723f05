# Rank guards survive pg_dump/restore: a plain dump restored into a fresh
# database, a custom-format dump through pg_restore, and a dump of one table
# alone into a database that only has the extension. The restored guards skip
# or raise exactly as the originals did; sharding.rank_guards comes along.
# (Was test/harness/rank_dump.sh.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 21;
use lib 'lib';
use ShardingNode;

my $SRC = 'sharding_rank_dump_src';
my $node = sharding_node('rank_dump', db => $SRC);
$node->safe_psql($SRC, <<'SQL');
CREATE TABLE orders (id bigint PRIMARY KEY, status text);
INSERT INTO orders VALUES (1, 'placed'), (2, 'shipped');
SELECT sharding.guard_rank('orders', 'status', ARRAY['placed', 'shipped', 'delivered']);
-- Replaced once: only the last guard may survive.
SELECT sharding.guard_rank('orders', 'status', ARRAY['placed', 'paid', 'shipped', 'delivered']);

CREATE TYPE state AS ENUM ('placed', 'shipped', 'delivered');
ALTER TYPE state ADD VALUE 'packed' BEFORE 'shipped';
CREATE TABLE eorders (id int PRIMARY KEY, status state);
INSERT INTO eorders VALUES (1, 'packed'), (2, 'shipped');
SELECT sharding.guard_rank('eorders', 'status', on_regress => 'error');

-- Names that need quoting, ranks that need escaping.
CREATE SCHEMA "Shop Floor";
CREATE TABLE "Shop Floor"."Line Items" (k text PRIMARY KEY, "Stage" text);
INSERT INTO "Shop Floor"."Line Items" VALUES ('a', 'it''s new');
SELECT sharding.guard_rank('"Shop Floor"."Line Items"', 'Stage', ARRAY['it''s new', 'back\slash', 'done "quoted"']);
SQL
# (sharding_node installed dblink too; the restored databases get it from the dumps.)

my $work = PostgreSQL::Test::Utils::tempdir();
ok( $node->run_log([ 'pg_dump', '-d', $SRC, '-f', "$work/plain.sql" ])
	  && $node->run_log([ 'pg_dump', '-Fc', '-d', $SRC, '-f', "$work/custom.dump" ])
	  && $node->run_log([ 'pg_dump', '-d', $SRC, '-t', 'orders', '-f', "$work/orders.sql" ]),
	'pg_dump (plain, custom, one table)');

# restore(DB, FILE): psql FILE with ON_ERROR_STOP into DB; true on success.
sub restore
{
	my ($db, $file) = @_;
	my ($rc, undef, $err) = $node->psql($db, PostgreSQL::Test::Utils::slurp_file($file), on_error_stop => 1);
	diag($err) if $rc != 0;
	return $rc == 0;
}
$node->safe_psql('postgres', 'CREATE DATABASE sharding_rank_dump_plain');
ok(restore('sharding_rank_dump_plain', "$work/plain.sql"), 'plain dump restores into a fresh database without error');
$node->safe_psql('postgres', 'CREATE DATABASE sharding_rank_dump_custom');
ok($node->run_log([ 'pg_restore', '--exit-on-error', '-d', 'sharding_rank_dump_custom', "$work/custom.dump" ]),
	'custom dump restores with pg_restore without error');

sub config
{
	return sharding_q($node, $_[0],
		'SELECT schema_name, table_name, column_name, ranks, on_regress FROM sharding.rank_guards ORDER BY 1, 2, 3');
}
sub triggers
{
	return sharding_q($node, $_[0],
		'SELECT tgrelid::regclass, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1::text, 2');
}
# error_of(DB, SQL): the "ERROR: ..." line the statement raises, or its output.
sub error_of
{
	my ($db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, $sql);
	return $err =~ /(ERROR: .*)/ ? $1 : "$out$err";
}
my $want_config = config($SRC);
my $want_triggers = triggers($SRC);
is(scalar(grep { /_rank_guard/ } split /\n/, $want_triggers), 3, 'source: one guard trigger per guarded column');

for my $db ('sharding_rank_dump_plain', 'sharding_rank_dump_custom')
{
	my $sq = sub { return sharding_q($node, $db, $_[0]); };
	is(config($db), $want_config, "$db: sharding.rank_guards restored");
	is(triggers($db), $want_triggers, "$db: guard triggers restored");
	is($sq->("UPDATE orders SET status = 'paid' WHERE id = 2"), '', "$db: text guard skips shipped -> paid");
	is($sq->("SELECT string_agg(status, ',' ORDER BY id) FROM orders"), 'placed,shipped', "$db: text rows unchanged");
	is($sq->("SELECT sharding.advance('orders', 1, 'paid')::text || sharding.rank_of('orders', 'status', 'shipped')"),
		'true2', "$db: advance and rank_of use the restored ranks");
	is(error_of($db, "UPDATE eorders SET status = 'packed' WHERE id = 2"),
		'ERROR:  rank guard refuses to lower column "status" of relation "eorders" from "shipped" to "packed"',
		"$db: enum guard raises 23514; 'packed' (added BEFORE 'shipped') still ranks below it");
	is($sq->(q{SELECT sharding.rank_of('"Shop Floor"."Line Items"', 'Stage', 'done "quoted"')}), '2',
		"$db: quoted names and escaped ranks restored");
}

# One table alone, into a database that only has the extension: the trigger
# carries its configuration, so the guard works without a config row.
my $db = 'sharding_rank_dump_table';
$node->safe_psql('postgres', "CREATE DATABASE $db");
$node->safe_psql($db, 'CREATE EXTENSION sharding');
ok(restore($db, "$work/orders.sql"), 'a one-table dump restores');
is(sharding_q($node, $db, "UPDATE orders SET status = 'placed' RETURNING id"), '1',
	'one-table restore: the guard skips shipped -> placed, lets placed through');
is(sharding_q($node, $db, "SELECT sharding.rank_of('orders', 'status', 'delivered')"), '3',
	'one-table restore: rank_of reads the ranks from the restored trigger');
