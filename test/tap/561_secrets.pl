# Passwords (CONTRACT 15.2, docs/nodes.md "Passwords"): a node's DSN given
# with a password is shown with the password as ******** to every role but
# the extension's owner and superusers, on the coordinator and on every
# follower (sharding.nodes, cluster_partitions(), local_node); the whole DSN
# is kept in sharding.node_secrets, which no other role may read, and the
# engine's connections use it: a move, attach_node and detach_node run by a
# sharding_admin member who is not a superuser (who must log in with a
# password) work, and no line of either server's log shows the password.
# SEC-5: a node database whose search_path puts a schema of its owner
# first runs none of that schema's objects for the engine's sessions.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my $logging = "log_statement = all\nlog_min_error_statement = error\n";
my ($c, $d) = jobs_cluster(rows => 2000, conf => $logging, data_conf => $logging);
my $q = sub { return $c->safe_psql('coord', $_[0]); };
# bob: a superuser who logs in with a password (scram), named in every DSN;
# carol: LOGIN only; dan: LOGIN, a member of sharding_admin, not a superuser.
for my $n ($c, $d)
{
	$n->safe_psql('postgres', "CREATE ROLE bob LOGIN SUPERUSER PASSWORD 'hunter2secret';
	    CREATE ROLE carol LOGIN; CREATE ROLE dan LOGIN PASSWORD 'danpw'");
	sharding_password_login($n, 'bob');
}
$q->("GRANT sharding_admin TO dan");
$d->safe_psql($_, "GRANT sharding_admin TO dan") for qw(n1 n2 n3);
sharding_engine_logs_in($c, 'coord', 'bob', 'hunter2secret');
$c->poll_query_until('coord', "SELECT current_setting('sharding.coordinator_dsn') LIKE '%bob%'") or die 'not reloaded';
ok(followers_agree(), 'the followers follow');
my $cfrom = -s $c->logfile;
my $dfrom = -s $d->logfile;

# as(cluster, db, role, sql): the output, or "SQLSTATE: message".
my $as = sub {
	my ($n, $db, $role, $sql) = @_;
	my ($rc, $out, $err) = $n->psql($db, "\\set VERBOSITY verbose\nSET ROLE $role;\n$sql");
	return $rc == 0 ? $out : ($err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : $err);
};
my $n1dsn = sharding_dsn($d, 'n1') . ' user=bob password=********';

# ------------------------------------------------------------ the coordinator
for my $role (qw(carol dan))
{
	is($as->($c, 'coord', $role, "SELECT dsn FROM sharding.nodes WHERE node = 'n1'"), $n1dsn,
		"coordinator: sharding.nodes shows $role the password as ********");
	is($as->($c, 'coord', $role, "SELECT count(*) FROM sharding.cluster_partitions('bank') AS p
	    WHERE p LIKE '%password=********' AND p NOT LIKE '%hunter2%'"), '8',
		"coordinator: cluster_partitions() shows $role the passwords as ********");
	like($as->($c, 'coord', $role, "SELECT * FROM sharding.node_secrets"), qr/^42501: permission denied for table node_secrets/,
		"coordinator: $role may not read sharding.node_secrets (42501)");
	is($as->($c, 'coord', $role, "SELECT count(*) FROM sharding.nodes WHERE dsn LIKE '%hunter2%'"), '0',
		"coordinator: no DSN $role reads holds the password");
}
is($q->("SELECT count(*) FROM sharding.cluster_partitions('bank') AS p WHERE p LIKE '%password=hunter2secret'"), '8',
	"coordinator: cluster_partitions() gives the extension's owner the whole DSNs (PL/Proxy logs in with them)");

# ------------------------------------------------------------ a follower
for my $role (qw(carol dan))
{
	is($as->($d, 'n1', $role, "SELECT dsn FROM sharding.nodes WHERE node = 'n1'"), $n1dsn,
		"follower: sharding.nodes shows $role the password as ********");
	is($as->($d, 'n1', $role, "SELECT count(*) FROM sharding.nodes WHERE dsn LIKE '%hunter2%'")
		  . ' ' . $as->($d, 'n1', $role, "SELECT count(*) FROM sharding.local_node WHERE coordinator_dsn LIKE '%hunter2%'"),
		'0 0', "follower: neither sharding.nodes nor local_node shows $role a password");
	like($as->($d, 'n1', $role, "SELECT * FROM sharding.node_secrets"), qr/^42501: permission denied for table node_secrets/,
		"follower: $role may not read sharding.node_secrets (42501)");
}

# ------------------------------------------------------------ SEC-5 set-up
# mallory owns a schema evil on n3 and makes it come first in n3's
# search_path; its objects shadow what a remote statement could resolve
# unqualified. Each records that it ran, and for which session.
$d->safe_psql('postgres', 'CREATE ROLE mallory LOGIN');
$d->safe_psql('n3', q{
    CREATE SCHEMA evil AUTHORIZATION mallory;
    SET ROLE mallory;
    CREATE TABLE evil.hits (what text, app text DEFAULT pg_catalog.current_setting('application_name'));
    GRANT INSERT ON evil.hits TO PUBLIC;
    CREATE FUNCTION evil.to_regprocedure(text) RETURNS regprocedure LANGUAGE plpgsql
        AS $$ BEGIN INSERT INTO evil.hits VALUES ('to_regprocedure'); RETURN pg_catalog.to_regprocedure($1); END $$;
    CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE plpgsql
        AS $$ BEGIN INSERT INTO evil.hits VALUES ('='); RETURN pg_catalog.texteq($1, $2); END $$;
    CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
    CREATE FUNCTION evil.json_build_array(text, boolean) RETURNS json LANGUAGE plpgsql
        AS $$ BEGIN INSERT INTO evil.hits VALUES ('json_build_array'); RETURN '[]'; END $$;
    CREATE FUNCTION evil.set_config(text, text, boolean) RETURNS text LANGUAGE plpgsql
        AS $$ BEGIN INSERT INTO evil.hits VALUES ('set_config'); RETURN pg_catalog.set_config($1, $2, $3); END $$;
    RESET ROLE;
    ALTER DATABASE n3 SET search_path = evil, pg_catalog, public;});

# ------------------------------------------------------------ dan works
# dan (sharding_admin, not a superuser: his connections must authenticate
# with a password, which only sharding.node_secrets has) detaches and
# attaches n3 and moves a shard to it.
is($as->($c, 'coord', 'dan', "SELECT sharding.detach_node('n3')"), '', 'dan detaches n3');
is($as->($c, 'coord', 'dan', "SELECT sharding.attach_node('n3')"), '', 'dan attaches n3 again (its DSN masked in nodes)');
is($as->($c, 'coord', 'dan', "SELECT sharding.attach_node('n3')"), '', 'and again (repeating is harmless)');
ok(followers_agree(), 'the followers follow');
is($d->safe_psql('n3', "SELECT count(*) FROM sharding.node_secrets WHERE dsn LIKE '%password=hunter2secret'"), '3',
	"follower n3 copied the whole DSNs into its sharding.node_secrets (for the owner's reading)");
my $moved = $as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 0, 'n3')");
like($moved, qr/^\d+$/, "dan moves shard 0 to n3 (the engine logs in with the kept passwords): $moved");
is($q->("SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 0"), 'n3', 'shard 0 is on n3');
check_data('after the move by dan');
$moved = $as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 0, 'n1')");
like($moved, qr/^\d+$/, "and moves it back from n3 (n3 pulls from n1 with n1's password): $moved");
check_data('after the move back');
# LK-1: once move_shard_online has returned, no session of the engine
# (application_name sharding) is left open on the coordinator or the nodes.
my $engine_sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sharding' AND backend_type = 'client backend'";
ok(wait_for('coord', $engine_sessions, '0', 10) && wait_for('n1', $engine_sessions, '0', 10),
	'LK-1: no idle engine session is left after the move returned');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

# SEC-5: nothing of mallory's ran, and mallory is no superuser.
# (The test's own sessions, application_name 561_secrets.pl, resolve them.)
is($d->safe_psql('n3', "SELECT coalesce(string_agg(DISTINCT what || ' by ' || app, ', '), '') FROM evil.hits WHERE app <> '561_secrets.pl'"), '',
	"SEC-5: no object of the node's own search_path ran for the engine's sessions");
is($d->safe_psql('n3', "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'"), 'f', 'SEC-5: mallory is no superuser');

# ------------------------------------------------------------ SEC-2
# dan may not write directly the tables through which a role could choose
# what the engine runs, or as whom: move_decoding, frozen_shards and
# local_node (42501, on the coordinator and on a node), a job's deferred
# moves or its revival when the job runs as another role, or a journal row
# of such a job; his own job he may.
my $sjob = $q->("INSERT INTO sharding.move_jobs (map, strategy, state, max_parallel, runas)
	VALUES ('bank', 'count', 'done', 1, 10) RETURNING job");
my %direct = (
	'move_decoding' => ["INSERT INTO sharding.move_decoding (slot, map, shards, logical, tables, key_columns)
	                      VALUES ('s', 'bank', 8, 0, '{}', '{}')", "UPDATE sharding.move_decoding SET logical = 1",
	                    "DELETE FROM sharding.move_decoding"],
	'frozen_shards' => ["INSERT INTO sharding.frozen_shards (map, logical) VALUES ('bank', 0)",
	                    "UPDATE sharding.frozen_shards SET logical = 1", "DELETE FROM sharding.frozen_shards"],
	'local_node'    => ["INSERT INTO sharding.local_node (node, coordinator_dsn, following) VALUES ('x', 'host=evil', false)",
	                    "UPDATE sharding.local_node SET coordinator_dsn = 'host=evil'", "DELETE FROM sharding.local_node"],
);
for my $t (sort keys %direct)
{
	for my $sql (@{ $direct{$t} })
	{
		my ($verb) = $sql =~ /^(\w+)/;
		like($as->($c, 'coord', 'dan', $sql), qr/^42501: permission denied for table $t/,
			"SEC-2: dan's direct $verb on $t at the coordinator: 42501");
		like($as->($d, 'n1', 'dan', $sql), qr/^42501: permission denied for table $t/,
			"SEC-2: dan's direct $verb on $t at a node: 42501");
	}
}
like($as->($c, 'coord', 'dan', "UPDATE sharding.move_jobs SET deferred = '[{\"logical\": 0}]' WHERE job = $sjob"),
	qr/^42501: permission denied to change rebalance job $sjob, which runs as role /,
	"SEC-2: dan may not add deferred moves to a superuser's job (42501)");
like($as->($c, 'coord', 'dan', "UPDATE sharding.move_jobs SET state = 'queued' WHERE job = $sjob"),
	qr/^42501: permission denied to change rebalance job $sjob/, "SEC-2: nor make it live again (42501)");
like($as->($c, 'coord', 'dan', "INSERT INTO sharding.move_journal (job, map, logical, source, destination)
	VALUES ($sjob, 'bank', 5, 'n2', 'n3')"), qr/^42501: permission denied/,
	"SEC-2: nor insert a journal row of it (42501)");
is($q->("SELECT state || ' ' || deferred::text || ' ' || (SELECT count(*) FROM sharding.move_journal WHERE job = $sjob)
	FROM sharding.move_jobs WHERE job = $sjob"), 'done [] 0', 'SEC-2: the job is unchanged and has no move');
# His own job runs, and so does distribute.
$d->safe_psql($_, "CREATE TABLE public.ledger (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
	ALTER TABLE public.ledger REPLICA IDENTITY FULL") for qw(n1 n2 n3);
$q->("CREATE TABLE ledger (tenant text NOT NULL, id bigint PRIMARY KEY, val text); ALTER TABLE ledger REPLICA IDENTITY FULL");
is($as->($c, 'coord', 'dan', "SELECT sharding.distribute('ledger', 'tenant', 'bank')"), '', 'dan distributes a table');
my $job = $as->($c, 'coord', 'dan', "SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'])");
like($job, qr/^\d+$/, "dan starts a rebalance job ($job)");
is($q->("SELECT sharding.rebalance_wait($job, '120 s')"), 'done', "dan's job ends done");
note $q->("SELECT state || ' ' || coalesce(error, '') FROM sharding.move_jobs WHERE job = $job");
check_data("after dan's job");
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

# ------------------------------------------------------------ add_node
# A new password of a known node: shown masked, kept whole, and the maps
# using the node see a new cluster_version (running proxies reconnect).
$d->safe_psql('postgres', "ALTER ROLE bob PASSWORD 'newpass99'");
my $v = $q->("SELECT sharding.cluster_version('bank')");
is($as->($c, 'coord', 'dan', "SELECT sharding.add_node('n2', '" . sharding_dsn($d, 'n2') . " user=bob password=newpass99')"), '',
	'dan gives n2 a new password');
is($as->($c, 'coord', 'carol', "SELECT dsn FROM sharding.nodes WHERE node = 'n2'"),
	sharding_dsn($d, 'n2') . ' user=bob password=********', 'it is shown masked');
ok($q->("SELECT sharding.cluster_version('bank')") > $v, 'the map using n2 has a new cluster_version');
$q->("UPDATE sharding.nodes SET dsn = replace(dsn, '********', 'newpass99') WHERE node IN ('n1', 'n3')");
is($q->("SELECT string_agg(n.node || ':' || (n.dsn LIKE '%password=********') || ':' || (s.dsn LIKE '%newpass99'), ' ' ORDER BY n.node)
    FROM sharding.nodes n JOIN sharding.node_secrets s USING (node)"), 'n1:true:true n2:true:true n3:true:true',
	'a superuser writing sharding.nodes directly stores the DSN masked too');
$moved = $as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 1, 'n3')");
like($moved, qr/^\d+$/, "dan moves shard 1 with the new passwords: $moved");
check_data('after the move with the new passwords');

# ------------------------------------------------------------ the logs
# (The test's own statements, application_name 561_secrets.pl, are left out.)
my @leaks = grep { !/ 561_secrets\.pl / }
  grep { /hunter2secret|newpass99/ } split /\n/, slurp_file($c->logfile, $cfrom);
is(join("\n", @leaks), '', "no line of the coordinator's log written by the extension's statements shows a password");
@leaks = grep { !/ 561_secrets\.pl / } grep { /hunter2secret|newpass99/ } split /\n/, slurp_file($d->logfile, $dfrom);
is(join("\n", @leaks), '', "no line of the data nodes' log (log_statement = all) shows a password");

done_testing();
