# CREATE EXTENSION sharding run at the same moment in four databases of one
# cluster succeeds in all four (README.md, install). The install script
# creates the cluster-wide role sharding_admin when it is missing: four
# scripts that all found it missing used to race on pg_authid's unique index,
# and three failed with "duplicate key value violates unique constraint".
#
# The four sessions are connected first, then each is sent the same wall
# clock time to wait for (pg_sleep_until) followed by CREATE EXTENSION, so
# that all four scripts start within a few milliseconds. The race window is
# the whole install of the first script (its new role is uncommitted until
# it ends), so every round used to fail. Several rounds, with the extension
# and the role dropped in between, each starting from a cluster without the
# role.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $rounds = 4;
my @dbs = map { "install_$_" } 1 .. 4;

my $node = PostgreSQL::Test::Cluster->new('parallel_install');
$node->init;
$node->append_conf('postgresql.conf', "fsync = off\nshared_preload_libraries = 'sharding'\n");
$node->start;
$node->safe_psql('postgres', "CREATE DATABASE $_") for @dbs;

is($node->safe_psql('postgres', "SELECT count(*) FROM pg_roles WHERE rolname = 'sharding_admin'"),
	'0', 'a fresh cluster has no role sharding_admin');

for my $round (1 .. $rounds)
{
	my %s = map { $_ => $node->background_psql($_, on_error_stop => 0) } @dbs;
	# One second from now, as the server sees it: every session waits for
	# the same instant, then installs.
	my $at = $node->safe_psql('postgres', "SELECT (clock_timestamp() + interval '1 second')::text");
	for my $db (@dbs)
	{
		$s{$db}->{stdin} .= "SELECT pg_sleep_until('$at');\nCREATE EXTENSION sharding;\n";
		$s{$db}->{run}->pump_nb;
	}
	my (%version, %error);
	for my $db (@dbs)
	{
		# query() runs after what was sent above and collects its errors.
		my $out = $s{$db}->query("SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'sharding'), 'none')");
		$version{$db} = (split /\n/, $out)[-1];
		$error{$db} = $s{$db}->{stderr};
		$s{$db}->quit;
	}
	my @failed = grep { $version{$_} ne '1.4' } @dbs;
	is(scalar(@failed), 0, "round $round: CREATE EXTENSION at the same moment in 4 databases succeeds in all 4")
	  or diag(join("\n", map { "$_: $version{$_}: $error{$_}" } @failed));
	is($node->safe_psql('postgres', "SELECT count(*) FROM pg_roles WHERE rolname = 'sharding_admin'"),
		'1', "round $round: the role sharding_admin exists once");
	# Every database's extension grants to the role it found or made.
	my $grants = join(',', map {
		my ($rc, $out) = $node->psql($_,
			"SELECT has_function_privilege('sharding_admin', 'sharding.fanout_reset()', 'EXECUTE')");
		$out
	} @dbs);
	is($grants, 't,t,t,t', "round $round: sharding_admin may run admin functions in every database");

	# Back to a cluster without the role for the next round.
	$node->safe_psql($_, 'DROP EXTENSION IF EXISTS sharding') for @dbs;
	$node->safe_psql('postgres', 'DROP ROLE sharding_admin');
}

$node->stop;
done_testing();
