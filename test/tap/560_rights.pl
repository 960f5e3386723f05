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
use JobsCluster;

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

# ------------------------------------------------------------ SEC-2
# bob, a member of sharding_admin (not a superuser), cannot choose the role
# a job runs as: runas is not his to write (42501), and a job row he
# inserts runs as him.
$s->safe_psql('coord', "CREATE ROLE bob LOGIN IN ROLE sharding_admin;
    SELECT sharding.create_map('m', 4, ARRAY['a'])");
my $as = sub {
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $s->psql('coord', "\\set VERBOSITY verbose\nSET ROLE $role;\n$sql");
	return $rc == 0 ? $out : ($err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : $err);
};
like($as->('bob', "INSERT INTO sharding.move_jobs (map, strategy, max_parallel, runas) VALUES ('m', 'count', 1, 10)"),
	qr/^42501: permission denied for table move_jobs/, 'SEC-2: a sharding_admin member may not write runas (42501)');
like($as->('bob', "UPDATE sharding.move_jobs SET runas = 10"),
	qr/^42501: permission denied for table move_jobs/, 'SEC-2: nor update it (42501)');
is($as->('bob', "INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel) VALUES ('m', 'count', 'done', 1)
	RETURNING runas::regrole"), 'bob', "SEC-2: a job row bob inserts runs as bob");
is($s->safe_psql('coord', "SELECT count(*) FROM sharding.move_jobs WHERE runas = 10"), '0',
	'SEC-2: no job runs as the bootstrap superuser');
# Nor can he add a move to a job of a superuser (it would run as one).
my $sjob = $s->safe_psql('coord', "INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel, runas)
	VALUES ('m', 'count', 'done', 1, 10) RETURNING job");
like($as->('bob', "SELECT sharding._move_enqueue($sjob, 'm', 0, NULL, 'b')"),
	qr/^42501: permission denied to add a move to rebalance job $sjob, which runs as role /,
	"SEC-2: a sharding_admin member may not add a move to a superuser's job (42501)");
is($s->safe_psql('coord', "SELECT count(*) FROM sharding.move_journal WHERE job = $sjob"), '0',
	'SEC-2: the journal has no move of that job');

# ------------------------------------------------------------ SEC-3 (the setting)
# sharding.coordinator_dsn holds a password: shown masked to every role
# but a superuser (SHOW, current_setting, pg_settings); _coordinator_dsn()
# is not executable by PUBLIC.
$s->safe_psql('coord', "ALTER SYSTEM SET sharding.coordinator_dsn = 'host=/tmp dbname=coord user=bob password=topsecret'");
$s->reload;
$s->poll_query_until('coord', "SELECT current_setting('sharding.coordinator_dsn') LIKE '%topsecret%'")
  or die 'the setting was not reloaded';
is($as->('alice', "SHOW sharding.coordinator_dsn"), 'host=/tmp dbname=coord user=bob password=********',
	'SEC-3: SHOW sharding.coordinator_dsn masks the password for a LOGIN-only role');
is($as->('alice', "SELECT current_setting('sharding.coordinator_dsn')"),
	'host=/tmp dbname=coord user=bob password=********', 'SEC-3: current_setting too');
# pg_settings copies reset_val (the value of postgresql.conf / ALTER
# SYSTEM) raw, past the show hook: the setting is not listed there at all.
is($as->('alice', "SELECT count(*) FROM pg_settings WHERE name = 'sharding.coordinator_dsn'"), '0',
	'SEC-3: pg_settings does not list it (its reset_val would show the password)');
is($s->safe_psql('coord', "SELECT count(*) FROM pg_settings WHERE reset_val LIKE '%topsecret%' OR setting LIKE '%topsecret%'"),
	'0', 'SEC-3: no row of pg_settings holds the password, even for a superuser');
is($as->('bob', "SHOW sharding.coordinator_dsn"), 'host=/tmp dbname=coord user=bob password=********',
	'SEC-3: and for a sharding_admin member');
is($s->safe_psql('coord', "SHOW sharding.coordinator_dsn"), 'host=/tmp dbname=coord user=bob password=topsecret',
	'SEC-3: a superuser sees it');
like($as->('alice', "SELECT sharding._coordinator_dsn()"), qr/^42501: permission denied for function _coordinator_dsn/,
	'SEC-3: _coordinator_dsn() is not executable by a LOGIN-only role');
is($s->safe_psql('coord', q{SELECT string_agg(sharding._mask_password(d), ' | ' ORDER BY n) FROM (VALUES
	(1, 'host=h password=x user=u'), (2, $$password = 'a b\'c' dbname=d$$), (3, 'postgresql://u:pw@h:5/db?password=q&x=1'),
	(4, 'host=h user=u')) AS v(n, d)}),
	q{host=h password=******** user=u | password = ******** dbname=d | postgresql://u:********@h:5/db?password=********&x=1 | host=h user=u},
	'SEC-3: _mask_password masks key = value and URI passwords');
$s->safe_psql('coord', "ALTER SYSTEM RESET sharding.coordinator_dsn");
$s->stop;

# ------------------------------------------------------------ jobs
# The jobs cluster (JobsCluster.pm). The nodes are reached as bob, a
# superuser who logs in with a password, given in every DSN (a role that is
# not a superuser must give it: docs/moves.md, Privileges), the
# coordinator's own DSN too.
my ($c, $d) = jobs_cluster(rows => 4000);
my $q = sub { return $c->safe_psql('coord', $_[0]); };
for my $n ($c, $d)
{
	$n->safe_psql('postgres', "CREATE ROLE bob LOGIN SUPERUSER PASSWORD 'secret'");
	sharding_password_login($n, 'bob');
}
sharding_engine_logs_in($c, 'coord', 'bob', 'secret');
$c->poll_query_until('coord', "SELECT current_setting('sharding.coordinator_dsn') LIKE '%bob%'") or die 'not reloaded';

# SEC-3 (the log): a statement the extension's remote sessions send that
# carries a password (a CREATE SUBSCRIPTION ... CONNECTION, here one that
# fails at the node) reaches no line of the node's log, which logs every
# statement (log_statement = all) and the statement of every error.
my $dfrom = -s $d->logfile;
my $n1dsn = sharding_dsn($d, 'n1') . ' user=bob password=secret';
my ($rc) = $c->psql('coord', "SELECT sharding._remote_exec('$n1dsn',
	\$\$CREATE SUBSCRIPTION leak CONNECTION 'host=/nonexistent dbname=x password=leakme' PUBLICATION p\$\$)");
isnt($rc, 0, 'SEC-3: the CREATE SUBSCRIPTION of a one-shot session fails at the node');
($rc) = $c->psql('coord', "SELECT sharding._dbl_connect('t', '$n1dsn');
	SELECT sharding._dbl_run('t', \$\$CREATE SUBSCRIPTION leak CONNECTION 'host=/nonexistent password=leakme' PUBLICATION p\$\$)");
isnt($rc, 0, 'SEC-3: and that of a named connection');
my $dlog = slurp_file($d->logfile, $dfrom);
is(scalar(() = $dlog =~ /could not connect to the publisher/g), 2, 'SEC-3: the node logged both failures');
unlike($dlog, qr/leakme/, "SEC-3: no line of the node's log shows the password");

# SEC-3: attached again with the coordinator's DSN holding a password, a
# follower keeps it without (local_node is readable by all), and follows.
$q->("SELECT sharding.attach_node('n1')");
is($d->safe_psql('n1', "SELECT coordinator_dsn FROM sharding.local_node"),
	sharding_dsn($c, 'coord') . ' user=bob password=********',
	"SEC-3: the follower's local_node shows the coordinator's DSN with its password masked");
ok(followers_agree(), 'the followers follow');

# RB-2: a job started under SET ROLE sharding_admin (a role that cannot log
# in) runs as that role and ends done.
my $job = $q->("SET ROLE sharding_admin; SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'])");
is($q->("SELECT runas::regrole FROM sharding.move_jobs WHERE job = $job"), 'sharding_admin',
	'RB-2: the job runs as sharding_admin');
is($q->("SELECT sharding.rebalance_wait($job, '90 s')"), 'done', 'RB-2: the job of sharding_admin (NOLOGIN) ends done');
note $q->("SELECT state || ' ' || coalesce(error, '') FROM sharding.move_jobs WHERE job = $job");
ok($q->("SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n3'") > 0, 'RB-2: n3 owns shards now');
check_data('after the job of sharding_admin');

# SEC-2: dave starts a job, and loses sharding_admin before its runners
# start (the same transaction): the job fails with 42501, no move begun.
$q->("CREATE ROLE dave LOGIN IN ROLE sharding_admin");
my $owners = $q->("SELECT string_agg(logical || ':' || node, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'");
$job = $q->("BEGIN; SET ROLE dave; SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2']);
	RESET ROLE; REVOKE sharding_admin FROM dave; COMMIT;");
is($q->("SELECT sharding.rebalance_wait($job, '90 s')"), 'failed', 'SEC-2: the job of a role that lost its rights fails');
like($q->("SELECT error FROM sharding.move_jobs WHERE job = $job"), qr/^42501: permission denied: the job's role "dave"/,
	'SEC-2: with 42501, saying why');
is($q->("SELECT string_agg(phase, ' ' ORDER BY move) FROM sharding.move_journal WHERE job = $job AND phase <> 'cancelled'"),
	'', 'SEC-2: none of its moves began');
is($q->("SELECT string_agg(logical || ':' || node, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'"),
	$owners, 'SEC-2: no shard moved');

# RB-5: a move worker terminated mid-move (pg_terminate_backend): no PANIC,
# another worker takes the job over, it ends done. The destinations'
# tables are held (SHARE mode) until then, so that the move is in flight.
my @holds = map {
	my $h = $d->background_psql($_, on_error_stop => 1);
	$h->query_safe('BEGIN; LOCK TABLE accounts, events IN SHARE MODE');
	$h
} qw(n1 n2 n3);
my $from = -s $c->logfile;
$job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2'])");
ok(wait_for('coord', "SELECT count(*) > 0 FROM sharding.move_journal WHERE job = $job AND phase NOT IN ('queued', 'done', 'failed', 'cancelled')", 't', 60),
	'RB-5: a move of the job is in flight');
my $pid = $q->("SELECT pid FROM pg_stat_activity WHERE backend_type = 'sharding move worker' ORDER BY pid LIMIT 1");
ok($q->("SELECT pg_terminate_backend($pid)") eq 't', "RB-5: the move worker ($pid) is terminated");
$_->quit for @holds;
is($q->("SELECT sharding.rebalance_wait($job, '120 s')"), 'done', 'RB-5: the job ends done');
my $log = slurp_file($c->logfile, $from);
unlike($log, qr/PANIC/, 'RB-5: no PANIC in the log');
like($log, qr/FATAL:  terminating background worker "sharding move worker" due to administrator command/,
	'RB-5: the worker ended at an interrupt check');
# 1.3 once logged a worker's termination twice (the FATAL raised again while
# the first was reported): the terminated worker's pid ends exactly once.
my @ends = $log =~ /\[$pid\][^\n]*FATAL:  terminating background worker/g;
is(scalar @ends, 1, "RB-5: the terminated worker ($pid) logged its end once");
check_data('after the terminated worker');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

done_testing();
