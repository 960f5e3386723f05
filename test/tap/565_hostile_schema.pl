# A database owner's schema "sharding" is not the extension (CONTRACT 15.2,
# docs/nodes.md "What a sharding_admin member can do on the nodes"). The
# engine's sessions call sharding.<function> on the other end, logged in as
# the DSN's role, which is often a superuser. A role with LOGIN only that
# owns a database, without the extension (which only a superuser installs),
# makes there a schema "sharding" whose functions make it a superuser; a
# node whose DSN leads there (written by a sharding_admin member, or a
# mistake) must not have the superuser's session run them.
#
# One instance, library preloaded: database coord (the extension), database
# evil (mallory's, no extension, a schema sharding of hers).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 8;
use lib 'lib';
use ShardingNode;

my $i = sharding_node('hostile', db => 'coord');
$i->safe_psql('postgres', "CREATE ROLE mallory LOGIN; CREATE DATABASE evil OWNER mallory");
# Every function the engine calls on a node, and the fencing check's, as
# mallory would write them: each makes her a superuser when a superuser runs it.
my $evil = join("\n", map {
	"CREATE FUNCTION sharding.$_ RETURNS boolean LANGUAGE plpgsql AS \$f\$ BEGIN
	     IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN ALTER ROLE mallory SUPERUSER; END IF;
	     RETURN true; END \$f\$;"
} ('_serve(text)', '_follow(text, text)', '_thaw_shard(text, integer)', '_freeze_shard(text, integer)',
	'_install_guards()', '_unfollow()'));
$i->safe_psql('evil', "SET ROLE mallory; CREATE SCHEMA sharding; $evil");
my $super = sub { return $i->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'"); };
is($super->(), 'f', 'mallory is not a superuser');
my $evil_dsn = sharding_dsn($i, 'evil');

# sqlstate(db, sql): "SQLSTATE: message" of its error, or its output.
sub sqlstate
{
	my ($db, $sql) = @_;
	my ($rc, $out, $err) = $i->psql($db, "\\set VERBOSITY verbose\n$sql");
	return $rc == 0 ? $out : ($err =~ /ERROR:\s+(\w{5}): ([^\n]*)/ ? "$1: $2" : $err);
}

like(sqlstate('coord', "SELECT sharding._remote('$evil_dsn', 'SELECT sharding._thaw_shard(''m'', 0)::text')"),
	qr/^42501: .*schema "sharding" of database evil is not the sharding extension's/,
	"a superuser's _remote to mallory's database: 42501 before anything runs there");
is($super->(), 'f', '... and mallory is still not a superuser');
$i->safe_psql('postgres', 'ALTER ROLE mallory NOSUPERUSER');

$i->safe_psql('coord', "SELECT sharding.add_node('n9', '$evil_dsn')");
like(sqlstate('coord', "SELECT sharding.attach_node('n9')"), qr/^42501: /,
	"a superuser's attach_node of a node whose DSN leads to mallory's database: 42501");
is($super->(), 'f', '... and mallory is still not a superuser');
$i->safe_psql('postgres', 'ALTER ROLE mallory NOSUPERUSER');
like(sqlstate('coord', "SELECT sharding.run_on_nodes('SELECT 1', ARRAY['n9'])"), qr/42501: /,
	"run_on_nodes there: 42501");
is($super->(), 'f', '... and mallory is still not a superuser');
$i->safe_psql('postgres', 'ALTER ROLE mallory NOSUPERUSER');

# A database without any schema "sharding" is no threat: the session goes on.
$i->safe_psql('postgres', 'CREATE DATABASE plain');
is(sqlstate('coord', "SELECT sharding._remote('" . sharding_dsn($i, 'plain') . "', 'SELECT 6 * 7')"), '42',
	'a database with no schema sharding: the session runs');
