# Helpers for the Perl TAP tests (test/tap/*.pl), on PostgreSQL's own
# PostgreSQL::Test::Cluster: nodes with the extension installed, logical
# replication enabled and the library preloaded. test/run.sh runs every
# test/tap/*.pl with prove, as the server's OS user, with PATH leading to
# the PostgreSQL under test.
package ShardingNode;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Exporter 'import';

our @EXPORT = qw(sharding_node);

# sharding_node(NAME, %opts): a started cluster with wal_level = logical,
# sharding preloaded, a database (opts{db}, default 'postgres') with the
# extension (and dblink, which attach_node uses). opts{conf}: extra
# postgresql.conf lines; opts{preload} => 0 leaves the library unloaded.
sub sharding_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => 'logical');
	my $preload = exists $opts{preload} ? $opts{preload} : 1;
	# max_connections: PostgreSQL::Test::Cluster's 10 is less than two
	# moves at once take at one instance (docs/moves.md: a session at the
	# destination per part, one more from there to the source each, and
	# the coordinator's own): 508's data instance, holding both
	# coordinators' nodes, refused a part's connection ("too many clients
	# already") once in a few runs on a busy machine. opts{conf} may set it.
	$node->append_conf('postgresql.conf', join("\n",
		"max_connections = 40",
		"max_replication_slots = 20",
		"max_wal_senders = 20",
		"max_logical_replication_workers = 12",
		"max_worker_processes = 24",
		"fsync = off",
		"log_min_messages = warning",
		($preload ? "shared_preload_libraries = 'sharding'" : ()),
		($opts{conf} ? $opts{conf} : ())) . "\n");
	$node->start;
	my $db = $opts{db} // 'postgres';
	$node->safe_psql('postgres', "CREATE DATABASE $db") if $db ne 'postgres';
	$node->safe_psql($db, 'CREATE EXTENSION dblink; CREATE EXTENSION sharding');
	return $node;
}

# ---------------------------------------------------------------- helpers of
# the multi-node tests (test/tap/6xx_*.pl)
use IPC::Run;
use Time::HiRes qw(time usleep);
push @EXPORT, qw(sharding_dsn sharding_q sharding_wait sharding_start sharding_finish sharding_guards);

# sharding_dsn(NODE, DB): a libpq connection string for database DB of NODE
# (its socket directory and port), free of quotes, so that it can be written
# inside an SQL string literal (add_node, dblink, coordinator_dsn).
sub sharding_dsn
{
	my ($node, $db) = @_;
	return 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
}

# sharding_q(NODE, DB, SQL, %opts): runs SQL (one script, ON_ERROR_STOP) with
# psql -XAtq and returns its output, rows joined by "\n". It never dies: a
# failure returns "ERROR: " and psql's messages, which no check expects.
# opts{verbose} => 1 runs with VERBOSITY verbose (the SQLSTATE in messages);
# opts{stderr} => 1 returns the output followed by psql's messages.
sub sharding_q
{
	my ($node, $db, $sql, %opts) = @_;
	$sql = "\\set VERBOSITY verbose\n$sql" if $opts{verbose};
	my ($rc, $out, $err) = $node->psql($db, $sql, on_error_stop => 1);
	return "$out\n$err" if $opts{stderr};
	return $rc == 0 ? $out : "ERROR: $err";
}

# sharding_wait(NODE, DB, SQL, EXPECTED, TIMEOUT_S): polls SQL every 10 ms
# until it returns EXPECTED; returns the milliseconds waited, or undef on
# timeout (then $ShardingNode::last_wait holds the last value seen).
our $last_wait;
sub sharding_wait
{
	my ($node, $db, $sql, $expected, $timeout) = @_;
	my $t0 = time;
	while (1)
	{
		$last_wait = sharding_q($node, $db, $sql);
		return int((time - $t0) * 1000) if $last_wait eq $expected;
		return undef if time - $t0 >= $timeout;
		usleep(10_000);
	}
}

# sharding_start(NODE, DB, SQL[, on_error_stop => 0]): starts psql -XAtq on
# SQL in the background (SQL, output and messages go through files, so that
# the session runs on its own without being pumped), with ON_ERROR_STOP
# unless on_error_stop => 0 (then every statement runs, and those that fail
# leave their "psql:FILE:LINE: ERROR: ..." lines among the messages);
# sharding_finish(HANDLE) waits for it and returns its exit status, its
# output and its messages.
my $background = 0;
sub sharding_start
{
	my ($node, $db, $sql, %opts) = @_;
	my @stop = ($opts{on_error_stop} // 1) ? ('-v', 'ON_ERROR_STOP=1') : ();
	my $base = PostgreSQL::Test::Utils::tempdir() . '/background' . ++$background;
	PostgreSQL::Test::Utils::append_to_file("$base.sql", $sql);
	local %ENV = $node->_get_env();
	my $h = IPC::Run::start(
		[ $node->installed_command('psql'), '-XAtq', @stop, '-d', $node->connstr($db), '-f', "$base.sql" ],
		'<', '/dev/null', '>', "$base.out", '2>', "$base.err");
	return { h => $h, base => $base };
}

sub sharding_finish
{
	my ($bg) = @_;
	$bg->{h}->finish;
	my $out = PostgreSQL::Test::Utils::slurp_file("$bg->{base}.out");
	my $err = PostgreSQL::Test::Utils::slurp_file("$bg->{base}.err");
	chomp $out;
	return (($bg->{h}->full_result(0) // -256) >> 8, $out, $err);
}

# sharding_guards(NODE, DB, TABLE): how many guard triggers (zz_sharding_guard)
# TABLE has on NODE, or, with TABLE undef, the database has.
sub sharding_guards
{
	my ($node, $db, $table) = @_;
	my $where = defined $table ? "tgrelid = '$table'::regclass AND " : '';
	return sharding_q($node, $db, "SELECT count(*) FROM pg_trigger WHERE ${where}tgname = 'zz_sharding_guard'");
}

# $SQLSTATE_OF: SQL that creates sqlstate_of(query text) in the current
# schema: the SQLSTATE a statement raises, '' if it succeeds (for tests that
# check refusals from inside one psql call).
our $SQLSTATE_OF = <<'SQL';
-- SQLSTATE of a statement ('' if it succeeds).
CREATE FUNCTION sqlstate_of(query text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE query;
    RETURN '';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
SQL
push @EXPORT, qw($SQLSTATE_OF);

# $NODE_EXEC: SQL that creates node_exec(w, node, cmd) in the current
# schema, for routed writers on a coordinator: runs cmd on the node (its DSN
# in sharding.nodes) over the calling session's dblink connection w<w>_<node>,
# opened on first use, and returns the command tag. Errors there (55000: a
# guard's refusal) are raised in the caller.
our $NODE_EXEC = <<'SQL';
CREATE OR REPLACE FUNCTION node_exec(w integer, node text, cmd text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    conn text := format('w%s_%s', w, node);
BEGIN
    IF NOT conn = ANY (coalesce(public.dblink_get_connections(), '{}')) THEN
        PERFORM public.dblink_connect(conn, (SELECT n.dsn FROM sharding.nodes n WHERE n.node = node_exec.node));
    END IF;
    RETURN public.dblink_exec(conn, cmd);
END $$;
SQL
push @EXPORT, qw($NODE_EXEC);

# sharding_same(node, db1, db2, description, query): one test that the query
# gives identical, non-empty output in both databases (a dump and its
# restore).
push @EXPORT, qw(sharding_same);

sub sharding_same
{
	my ($node, $db1, $db2, $what, $sql) = @_;
	my $a = sharding_q($node, $db1, $sql);
	my $b = sharding_q($node, $db2, $sql);
	Test::More::ok($a ne '' && $a eq $b, $what) or Test::More::diag("$db1: $a\n$db2: $b");
}

# sharding_same_config(node, db1, db2): four sharding_same tests, one per
# configuration table: maps, shards (owners and epochs), pins, nodes (DSNs).
push @EXPORT, qw(sharding_same_config);

sub sharding_same_config
{
	my ($node, $db1, $db2) = @_;
	sharding_same($node, $db1, $db2, 'maps are kept', 'SELECT map, logical_shards, created FROM sharding.maps ORDER BY map');
	sharding_same($node, $db1, $db2, 'shards, owners and epochs are kept',
		'SELECT map, logical, node, epoch FROM sharding.shards ORDER BY map, logical');
	sharding_same($node, $db1, $db2, 'pins are kept', 'SELECT map, key, node FROM sharding.pins ORDER BY map, key');
	sharding_same($node, $db1, $db2, 'nodes and DSNs are kept', 'SELECT node, dsn FROM sharding.nodes ORDER BY node');
}

# sharding_dump_restore(node, src, dst): pg_dump of database src restored
# with psql (ON_ERROR_STOP) into dst, a new database; returns psql's exit
# status (1 if pg_dump failed) and its messages.
push @EXPORT, qw(sharding_dump_restore);

sub sharding_dump_restore
{
	my ($node, $src, $dst) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $dst");
	my $dumpfile = PostgreSQL::Test::Utils::tempdir() . "/$src.sql";
	return (1, 'pg_dump failed') unless $node->run_log([ 'pg_dump', '-f', $dumpfile, '-d', $src ]);
	my ($rc, undef, $err) = $node->psql($dst, PostgreSQL::Test::Utils::slurp_file($dumpfile), on_error_stop => 1);
	return ($rc, $err);
}

# sharding_password_login(node, role…): the server asks these roles for
# their password (scram) on its Unix socket, a line put before the test
# cluster's own trust lines; reloads the server. The password rule of the
# engine's connections then depends on the DSNs alone.
push @EXPORT, qw(sharding_password_login);

sub sharding_password_login
{
	my ($node, @roles) = @_;
	my $hba = $node->data_dir . '/pg_hba.conf';
	my $rest = PostgreSQL::Test::Utils::slurp_file($hba);
	open(my $fh, '>', $hba) or die "cannot write $hba: $!";
	print $fh "local all $_ scram-sha-256\n" for @roles;
	print $fh $rest;
	close $fh;
	$node->reload;
}

# sharding_engine_logs_in(coordinator, db, user, password): every node DSN
# of db's sharding.nodes and the server's sharding.coordinator_dsn name the
# user and the password (the engine's connections log in with them).
push @EXPORT, qw(sharding_engine_logs_in);

sub sharding_engine_logs_in
{
	my ($c, $db, $user, $password) = @_;
	$c->safe_psql($db, "UPDATE sharding.nodes SET dsn = dsn || ' user=$user password=$password' WHERE dsn IS NOT NULL");
	$c->safe_psql($db, "ALTER SYSTEM SET sharding.coordinator_dsn = '" . sharding_dsn($c, $db) . " user=$user password=$password'");
	$c->reload;
}

# sharding_standby(primary, name, backup, conf): a streaming physical
# standby of primary, made from a new base backup (its name given, as a
# test may take several), started; conf: extra postgresql.conf lines set
# before it starts.
push @EXPORT, qw(sharding_standby);

sub sharding_standby
{
	my ($primary, $name, $backup, $conf) = @_;
	$primary->backup($backup);
	my $standby = PostgreSQL::Test::Cluster->new($name);
	$standby->init_from_backup($primary, $backup, has_streaming => 1);
	$standby->append_conf('postgresql.conf', $conf) if defined $conf;
	$standby->start;
	return $standby;
}

1;
