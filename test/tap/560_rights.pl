# Rights (CONTRACT 15.2, docs/rebalance.md "Where jobs run" and "Rights"):
# the background workers run no code in a database without the extension,
# and where it is installed they run as its owner with search_path pinned
# to pg_catalog, so that no role can get its own code run by them; a job
# runs as the role that started it (a role that cannot log in too), checked
# again for each move; a worker terminated mid-move leaves no PANIC and the
# job goes on.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

# ------------------------------------------------------------ SEC-1
# One server, the library preloaded; log_min_messages = debug1 so that the
# postmaster logs every worker it forgets ("unregistering background worker
# NAME"): a scanner of database X is over once that line for it is logged.
my $s = sharding_node('single', db => 'coord', conf => "log_min_messages = debug1\n");
# alice: LOGIN only, owner of her own database, where the extension is not
# installed. She creates schema sharding and a _job_pickup() of her own.
$s->safe_psql('postgres', "CREATE ROLE alice LOGIN; CREATE DATABASE appdb OWNER alice;
    CREATE ROLE mallory LOGIN; CREATE DATABASE evildb OWNER mallory;");
$s->safe_psql('appdb', q{
    SET ROLE alice;
    CREATE SCHEMA sharding;
    CREATE FUNCTION sharding._job_pickup() RETURNS integer LANGUAGE plpgsql
        AS $$ BEGIN EXECUTE 'ALTER ROLE alice SUPERUSER'; RETURN 0; END $$;});
# mallory owns a database where a superuser installed the extension: she
# makes her schema evil come first in the database's search_path and
# shadows what a worker could call unqualified there.
$s->safe_psql('evildb', 'CREATE EXTENSION dblink; CREATE EXTENSION sharding');
$s->safe_psql('evildb', q{
    SET ROLE mallory;
    CREATE SCHEMA evil;
    CREATE FUNCTION evil.become() RETURNS void LANGUAGE plpgsql
        AS $$ BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; END $$;
    CREATE FUNCTION evil.to_regprocedure(text) RETURNS regprocedure LANGUAGE plpgsql
        AS $$ BEGIN PERFORM evil.become(); RETURN pg_catalog.to_regprocedure($1); END $$;
    CREATE FUNCTION evil.int8(integer) RETURNS bigint LANGUAGE plpgsql
        AS $$ BEGIN PERFORM evil.become(); RETURN $1::pg_catalog.int8; END $$;
    CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE plpgsql
        AS $$ BEGIN PERFORM evil.become(); RETURN pg_catalog.texteq($1, $2); END $$;
    CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
    ALTER DATABASE evildb SET search_path = evil, pg_catalog;});

my %oid = map { $_ => $s->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = '$_'") }
  qw(appdb evildb coord);
my $scanned = sub {
	my ($from, $db) = @_;
	my $t0 = time;
	while (time - $t0 < 60)
	{
		return 1 if $s->log_contains(
			qr/unregistering background worker "sharding move scanner for database $oid{$db}"/, $from);
		usleep(50_000);
	}
	return 0;
};
my $from = -s $s->logfile;
$s->restart;
ok($scanned->($from, $_), "the launcher's scan of $_ is over after the restart") for qw(appdb evildb coord);
is($s->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'"), 'f',
	'SEC-1: the owner of a database without the extension did not become a superuser');
is($s->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'"), 'f',
	'SEC-1: the owner of a database with the extension, search_path = evil first, did not become a superuser');

done_testing();
