# Rights of the move journal (SEC-2, CONTRACT 15.2, docs/moves.md "Rights"):
# each journal row records the role that started the move (runas); a role
# may write no row whose role it has not the privileges of (42501), a row
# naming a job that does not exist neither; recovery (the launcher's
# scanner, _move_recover, _move_resolve, _move_cancel) undoes or finishes a
# move with the rights of its role, so that dblink's password rule applies
# to it as to that role. _move_journal(sql) is the owner's only.
#
# The attack: alice, a member of sharding_admin who is not a superuser,
# forges a live journal row whose nodes are a database she owns, reached as
# the bootstrap superuser without a password; its sharding._thaw_shard
# makes her a superuser if a superuser's session calls it. She must not
# become one, and nothing of hers may run as a superuser. (The end checks
# another way in, through sharding.nodes: closed by the engine sessions'
# check of the schema sharding at the other end.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

# One server, the library preloaded (the launcher's scanner runs);
# log_min_messages = debug1: the postmaster logs each worker it forgets, so
# that a scan being over can be seen.
my $s = sharding_node('single', db => 'coord', conf => "log_min_messages = debug1\n");
my $boot = $s->safe_psql('postgres', 'SELECT rolname FROM pg_roles WHERE oid = 10');
$s->safe_psql('postgres', "CREATE ROLE alice LOGIN; CREATE DATABASE alicedb OWNER alice;");
$s->safe_psql('coord', "GRANT sharding_admin TO alice;
    SELECT sharding.create_map('m', 4, ARRAY['a']);
    SELECT sharding.add_node('a', 'dbname=nowhere_a'), sharding.add_node('b', 'dbname=nowhere_b');");
# root: a superuser who logs in with a password; the engine's loopback
# connection logs in as root (the database's coordinator_dsn, set by the
# owner), so that the password rule's outcome depends on the nodes' DSNs
# only.
$s->safe_psql('postgres', "CREATE ROLE root LOGIN SUPERUSER PASSWORD 'rootpw'");
sharding_password_login($s, 'root');
$s->safe_psql('coord', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($s, 'coord') . " user=root password=rootpw'");
# alice's database: a schema sharding whose _thaw_shard (and _undo_shard)
# records who ran it and tries to make her a superuser.
$s->safe_psql('alicedb', q{
    SET ROLE alice;
    CREATE SCHEMA sharding;
    CREATE TABLE sharding.hits (fn text, cur name DEFAULT current_user, ses name DEFAULT session_user, su boolean);
    GRANT INSERT ON sharding.hits TO PUBLIC;
    CREATE FUNCTION sharding._thaw_shard(text, integer) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO sharding.hits (fn, su)
            SELECT '_thaw_shard', r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
        BEGIN EXECUTE 'ALTER ROLE alice SUPERUSER'; EXCEPTION WHEN insufficient_privilege THEN NULL; END;
    END $$;});
my $hits = sub {
	return $s->safe_psql('alicedb', "SELECT coalesce(string_agg(fn || ' as ' || cur || '/' || ses || ' su=' || su, ', '), '')
	    FROM sharding.hits WHERE su");
};
my $super = sub { return $s->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'"); };

# as_alice(sql): logged in as alice; the output, or "SQLSTATE: message".
my $as_alice = sub {
	my ($sql) = @_;
	my ($rc, $out, $err) = $s->psql('coord', "\\set VERBOSITY verbose\n$sql", extra_params => [ '-U', 'alice' ]);
	return $rc == 0 ? $out : ($err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : $err);
};
my $q = sub { return $s->safe_psql('coord', $_[0]); };
# Checks that must not die on the unfixed code (no column runas there).
my $q2 = sub { return sharding_q($s, 'coord', $_[0]); };
my $coord_oid = $s->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = 'coord'");
my $scanned = sub {
	my ($from) = @_;
	my $t0 = time;
	while (time - $t0 < 60)
	{
		return 1 if $s->log_contains(
			qr/unregistering background worker "sharding move scanner for database $coord_oid"/, $from);
		usleep(50_000);
	}
	return 0;
};

# ------------------------------------------------------------ who a move runs as
# A move journaled by the engine records the role that started it.
my $own = $q->("SELECT sharding._move_enqueue(NULL, 'm', 0, NULL, 'b')");
like($own, qr/^\d+$/, "the bootstrap superuser journals a queued move ($own)");
is($q2->("SELECT runas::regrole FROM sharding.move_journal WHERE move = $own"), $boot,
	'its journal row runs as the role that journaled it');

# alice's own move runs as her, though the engine's loopback connection
# that journals it logs in as root; she cancels it, but may not act on the
# superuser's.
my $hers = $as_alice->("SELECT sharding._move_enqueue(NULL, 'm', 1, NULL, 'b')");
like($hers, qr/^\d+$/, "alice journals a queued move ($hers)");
is($q2->("SELECT runas::regrole FROM sharding.move_journal WHERE move = $hers"), 'alice', 'it runs as alice');
like($as_alice->("SELECT sharding._move_resolve($own)"), qr/^42501: permission denied for move $own, which runs as role "$boot"/,
	"alice may not roll back the superuser's move (42501)");
is($as_alice->("SELECT sharding._move_cancel($hers)"), 't', 'alice cancels her own move');

# ------------------------------------------------------------ direct writes
like($as_alice->("INSERT INTO sharding.move_journal (map, logical, source, destination, runas)
	VALUES ('m', 1, 'a', 'b', 10)"), qr/^42501: /, 'alice may not journal a move that runs as the bootstrap superuser (42501)');
like($as_alice->("UPDATE sharding.move_journal SET destination = 'a' WHERE move = $own"), qr/^42501: /,
	"alice may not change a superuser's move (42501)");
like($as_alice->("UPDATE sharding.move_journal SET runas = 10 WHERE move = $own"), qr/^42501: /,
	"nor the role it runs as (42501)");
like($as_alice->("DELETE FROM sharding.move_journal WHERE move = $own"), qr/^42501: /,
	"nor delete it (42501)");
is($q2->("SELECT destination || ' ' || runas::regrole || ' ' || phase FROM sharding.move_journal WHERE move = $own"),
	"b $boot queued", "the superuser's move is unchanged");
like($as_alice->("INSERT INTO sharding.move_journal (job, map, logical, source, destination)
	VALUES (999999, 'm', 2, 'a', 'b')"), qr/^42501: /, 'nor journal a move of a job that does not exist (42501)');
is($q2->("SELECT sharding._move_cancel($own)"), 't', 'the superuser cancels the queued move');

# ------------------------------------------------------------ the forged row
# alice adds a node reaching her own database as the bootstrap superuser,
# without a password, and journals an "interrupted" move through it.
my $evil = sharding_dsn($s, 'alicedb') . " user=$boot";
is($as_alice->("SELECT sharding.add_node('evil', '$evil')"), '', 'alice adds a node reaching her database as the superuser');
my $forged = $as_alice->("INSERT INTO sharding.move_journal (map, logical, source, destination, phase)
	VALUES ('m', 3, 'evil', 'evil', 'copying') RETURNING move");
note "alice's forged row: $forged";
my $forged_id = $forged =~ /^(\d+)$/ ? $1 : 0;
if ($forged_id)
{
	is($q2->("SELECT runas::regrole FROM sharding.move_journal WHERE move = $forged_id"), 'alice',
		'a row alice writes runs as alice');
}

# The launcher's scanner (the extension's owner, a superuser) recovers it.
my $from = -s $s->logfile;
$s->restart;
ok($scanned->($from), "the launcher's scan of coord is over after the restart");
is($super->(), 'f', 'the scanner did not make alice a superuser');
is($hits->(), '', "nothing ran in alice's database as a superuser (scanner)");
if ($forged_id)
{
	ok(slurp_file($s->logfile, $from) =~ /could not recover move $forged_id: password is required/,
		"the scanner's recovery of alice's move, as alice, met dblink's password rule");
}
$q->("ALTER ROLE alice NOSUPERUSER");

# Nor when a superuser calls the recovery, resolves or cancels it.
$q->("SELECT sharding._move_recover()");
is($super->(), 'f', 'the superuser\'s _move_recover did not make alice a superuser');
if ($forged_id)
{
	my ($rc, $out, $err) = $s->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding._move_resolve($forged_id)");
	like($err, qr/ERROR:  2F003: password is required/, "the superuser's _move_resolve runs it as alice: 2F003");
	($rc, $out, $err) = $s->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding._move_cancel($forged_id)");
	like($err, qr/ERROR:  2F003: password is required/, "and so does _move_cancel of the dead move: 2F003");
	is($q->("SELECT phase FROM sharding.move_journal WHERE move = $forged_id"), 'copying', 'the forged move stays');
}
is($super->(), 'f', 'alice is no superuser');
is($hits->(), '', "nothing ran in alice's database as a superuser");
$q->("ALTER ROLE alice NOSUPERUSER");

# ------------------------------------------------------------ _move_journal(sql)
# The engine's loopback connection logs in as root, a superuser, with the
# password coordinator_dsn gives: 1.3's _move_journal(sql) ran any
# statement of a sharding_admin member over it. It is gone, and its C
# function (which 1.3's SQL still names) refuses all but the extension's
# owner and superusers.
unlike($as_alice->("SELECT sharding._move_journal('ALTER ROLE alice SUPERUSER'::text)"), qr/^ALTER ROLE/,
	'alice may not run a statement through _move_journal(sql)');
is($q->("SELECT count(*) FROM pg_proc WHERE proname = '_move_journal' AND pronamespace = 'sharding'::regnamespace"),
	'0', 'sharding._move_journal(sql) is gone');
# A database still at 1.3's SQL (the library updated, ALTER EXTENSION not
# run yet): its _move_journal(sql), granted to sharding_admin there,
# refuses alice; its journal (no runas) still works as 1.3's did.
$s->safe_psql('postgres', 'CREATE DATABASE old13');
$s->safe_psql('old13', "CREATE EXTENSION dblink; CREATE EXTENSION sharding VERSION '1.3'; GRANT sharding_admin TO alice;
    ALTER DATABASE old13 SET sharding.coordinator_dsn = '" . sharding_dsn($s, 'old13') . " user=root password=rootpw';
    SELECT sharding.create_map('m', 4, ARRAY['a']);
    SELECT sharding.add_node('a', 'dbname=nowhere_a'), sharding.add_node('b', 'dbname=nowhere_b');");
my ($rc13, $out13, $err13) = $s->psql('old13', "\\set VERBOSITY verbose\nSELECT sharding._move_journal('ALTER ROLE alice SUPERUSER'::text)",
	extra_params => [ '-U', 'alice' ]);
like($err13, qr/ERROR:  42501: permission denied for function _move_journal/,
	"at 1.3's SQL, _move_journal(sql) refuses alice (42501)");
my $m13 = $s->safe_psql('old13', "SELECT sharding._move_enqueue(NULL, 'm', 0, NULL, 'b')");
is($s->safe_psql('old13', "SELECT sharding._move_cancel($m13)::text || ' ' || sharding._move_recover()"), 'true 0',
	"at 1.3's SQL, the journal (without runas) works as before");
is($super->(), 'f', 'alice is no superuser');
$q->("ALTER ROLE alice NOSUPERUSER");
# A deferred clean-up needs 1.4's journal (its column cleanup_deferred):
# at 1.3's SQL the move says it cleans up before it returns (then fails
# here: node a is nowhere).
my (undef, undef, $errd) = $s->psql('old13', "SET sharding.move_cleanup = deferred; SELECT sharding.move_shard_online('m', 0, 'b')");
like($errd, qr/NOTICE:  the move of logical shard 0 of map "m" cleans up before it returns: a deferred clean-up needs version 1.4/,
	"at 1.3's SQL, a move asked to defer its clean-up says it does not");
is($s->safe_psql('old13', "SELECT node FROM sharding.shards WHERE map = 'm' AND logical = 0"), 'a', 'and the shard stays where it was');
# A move to where the shard already is has nothing to clean up: no NOTICE.
my ($rch, $outh, $errh) = $s->psql('old13', "SET sharding.move_cleanup = deferred; SELECT sharding.move_shard_online('m', 0, 'a')");
is($rch, 0, "at 1.3's SQL, a move of a shard to the node it is on returns ($outh)");
unlike($errh, qr/cleans up before it returns/, 'and says nothing of a clean-up it does not have');
# Nor can she get her row recovered over that connection, by herself or
# by a superuser.
$as_alice->("SELECT sharding._move_recover()");
is($super->(), 'f', "alice's own _move_recover did not make her a superuser");
$q->("ALTER ROLE alice NOSUPERUSER");
$q->("SELECT sharding._move_recover()");
is($super->(), 'f', 'with a superuser coordinator_dsn, the recovery of her row does not make alice a superuser');
is($hits->(), '', "nothing ran in alice's database as a superuser");

# A move whose role lost sharding_admin: nobody acts on it as that role
# (42501, its row stays); the scan warns.
$q->("CREATE ROLE eve LOGIN IN ROLE sharding_admin");
my $eves = $q->("INSERT INTO sharding.move_journal (map, logical, source, destination, phase, runas)
	VALUES ('m', 2, 'a', 'b', 'copying', 'eve'::regrole) RETURNING move");
$q->("REVOKE sharding_admin FROM eve");
my ($rc, $out, $err) = $s->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding._move_resolve($eves)");
like($err, qr/ERROR:  42501: move $eves runs as role "eve", which is no longer a member of sharding_admin/,
	"a move whose role lost sharding_admin is not rolled back as it (42501)");
($rc, $out, $err) = $s->psql('coord', "SELECT sharding._move_recover()");
like($err, qr/WARNING:  could not recover move $eves: move $eves runs as role "eve", which is no longer a member/,
	'_move_recover warns about it');
is($q->("SELECT phase FROM sharding.move_journal WHERE move = $eves"), 'copying', 'and it stays');
$q->("DELETE FROM sharding.move_journal WHERE move = $eves");

# The owner may take the row over (a role with the privileges of both its
# role and the new one may).
if ($forged_id)
{
	is($q2->("UPDATE sharding.move_journal SET runas = 10 WHERE move = $forged_id RETURNING runas::regrole"), $boot,
		'the superuser may take the forged move over');
	$q->("DELETE FROM sharding.move_journal WHERE move = $forged_id");
}

# Another way in (not the journal's): sharding_admin may rewrite the DSN of
# a node that a superuser's move uses (add_node, or sharding.nodes
# directly); the superuser's recovery then connects there as a superuser
# (the password rule does not bind a superuser). Alice's database has no
# sharding extension (only a superuser installs it), so its schema
# "sharding" is refused (42501) before anything runs there (move_remote.cpp,
# TAP 565): this was a TODO until then, and failed.
my $sup = $q->("INSERT INTO sharding.move_journal (map, logical, source, destination, phase)
	VALUES ('m', 0, 'a', 'b', 'copying') RETURNING move");
$s->safe_psql('alicedb', 'TRUNCATE sharding.hits');
note $as_alice->("SELECT sharding.add_node('a', '$evil'), sharding.add_node('b', '$evil')");
$q->("SELECT sharding._move_recover()");
is($hits->(), '', "a superuser's recovery runs nothing of alice's after she rewrote a node's DSN");
is($super->(), 'f', 'nor makes her a superuser');
$q->("ALTER ROLE alice NOSUPERUSER; DELETE FROM sharding.move_journal WHERE move = $sup;
    UPDATE sharding.nodes SET dsn = 'dbname=nowhere_' || node WHERE node IN ('a', 'b')");

$s->stop;
done_testing();
