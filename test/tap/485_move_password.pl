# dblink's password rule on every connection of the move engine's libpq
# helper (docs/moves.md, "Privileges"): a role that is not a superuser must
# give the password in the node's connection string itself. A DSN without
# one (the password coming from the server OS user's password file) is
# refused with 2F003 before any connection is made: never a login on the
# node on a plain role's behalf.
#
# One instance: the coordinator's database coord, and n1 and n2 reached as
# bob (a superuser who logs in with a password, scram-sha-256) through DSNs
# without a password; the server's environment names a password file with
# bob's. Roles: alice (no privilege), carol (sharding_admin, not a
# superuser; her own session's password is in her coordinator DSN). Every
# login is logged (log_connections): after each refusal, no login of bob
# happened at all, and none is open (pg_stat_activity).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

my $pgpass = PostgreSQL::Test::Utils::tempdir() . '/pgpass';
append_to_file($pgpass, "*:*:*:bob:secret\n");
chmod 0600, $pgpass;
$ENV{PGPASSFILE} = $pgpass;    # the server's OS user's password file
my $c = sharding_node('coord', db => 'coord', preload => 0, conf => 'log_connections = on');
my $hba = $c->data_dir . '/pg_hba.conf';
my $rest = slurp_file($hba);
open(my $fh, '>', $hba) or die "cannot write $hba: $!";
print $fh "local all bob,carol scram-sha-256\n$rest";
close $fh;
$c->reload;

my $host = $c->host;
my $port = $c->port;
my $dsn = sub { return "host=$host port=$port dbname=$_[0] user=bob"; };
$c->safe_psql('coord', qq{
	CREATE ROLE bob LOGIN SUPERUSER PASSWORD 'secret';
	CREATE ROLE alice LOGIN;
	CREATE ROLE carol LOGIN PASSWORD 'secret' IN ROLE sharding_admin;
	ALTER ROLE carol SET sharding.coordinator_dsn = 'host=$host port=$port dbname=coord user=carol password=secret';
	CREATE DATABASE n1;
	CREATE DATABASE n2;
	CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
	ALTER TABLE accounts REPLICA IDENTITY FULL;
	SELECT sharding.create_map('bank', 4, ARRAY['n1']);
	SELECT sharding.add_node('n1', '@{[ $dsn->('n1') ]}'), sharding.add_node('n2', '@{[ $dsn->('n2') ]}');
	SELECT sharding.distribute('accounts', 'tenant', 'bank');
	GRANT SELECT ON accounts TO carol;});
my $carol = $c->connstr('coord') . ' user=carol password=secret';
my $alice = $c->connstr('coord') . ' user=alice';

# as(connstr, sql): psql's output and messages (SQLSTATEs shown).
sub as
{
	my ($connstr, $sql) = @_;
	my ($rc, $out, $err) = $c->psql('coord', "\\set VERBOSITY verbose\n$sql", connstr => $connstr);
	return "$out$err";
}
# bob_logins(since): logins of bob logged after the log's offset `since`.
sub bob_logins
{
	my $log = slurp_file($c->logfile, $_[0]);
	return scalar(() = $log =~ /connection authorized: user=bob/g);
}
sub bob_sessions { return $c->safe_psql('coord', "SELECT count(*) FROM pg_stat_activity WHERE usename = 'bob'"); }

# The password file works: the superuser's connection logs in as bob with it.
my $since = -s $c->logfile;
is($c->safe_psql('coord', "SELECT sharding._dbl_connect('s', '@{[ $dsn->('n1') ]}');
	SELECT sharding._dbl_value('s', 'SELECT current_user'); SELECT sharding._dbl_disconnect('s');"),
	"\nbob\n", 'a superuser logs in as bob with the password file of the server (no password in the DSN)');
is(bob_logins($since), 1, 'the log shows that login');

# _job_lag (executable by every role: move_progress calls it) as alice.
# The superuser's session of bob above has been closed, but its backend
# exits on its own time: wait until it has gone (under load it was still
# listed when alice looked), so that a session of bob seen below can only
# be one that alice's call opened.
ok($c->poll_query_until('coord', "SELECT count(*) = 0 FROM pg_stat_activity WHERE usename = 'bob'"),
	"the superuser's session of bob has ended");
$since = -s $c->logfile;
is(as($alice, "SELECT coalesce(sharding._job_lag('n1', 'sharding_move_bank_0')::text, 'NULL');
	SELECT count(*) FROM pg_stat_activity WHERE usename = 'bob';"),
	"NULL\n0", 'alice: _job_lag is NULL, and no session of bob is open while hers is');
is(bob_logins($since), 0, 'alice: _job_lag logged nobody in at n1');
is(as($alice, "SELECT count(*) FROM sharding.move_progress"), '0', 'alice still reads move_progress');

# The named connections, as carol (sharding_admin, not a superuser).
$since = -s $c->logfile;
like(as($carol, "SELECT sharding._dbl_connect('x', '@{[ $dsn->('n1') ]}')"),
	qr/ERROR:  2F003: password is required/, 'carol: _dbl_connect with a DSN without a password is 2F003');
is(bob_logins($since), 0, 'carol: ... and nobody logged in at n1');
is(as($carol, "SELECT coalesce(sharding._job_lag('n1', 'sharding_move_bank_0')::text, 'NULL')"), 'NULL',
	'carol: _job_lag is NULL (the source is not asked)');
is(bob_logins($since), 0, 'carol: ... and nobody logged in at n1');
like(as($carol, "SELECT sharding._dbl_connect('x', '@{[ $dsn->('n1') ]} password=secret');
	SELECT sharding._dbl_value('x', 'SELECT current_user'); SELECT sharding._dbl_disconnect('x');"),
	qr/^\nbob\n$/, 'carol: with the password in the DSN, the connection is made');

# A rebalance job of carol's: its capacity checks ask the nodes (refused:
# they are not asked), then its move connects to them (refused, 2F003): the
# job fails with the move's error, and nothing of the move is left.
$since = -s $c->logfile;
my $job = as($carol, "SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2'])");
like($job, qr/^\d+$/, "carol starts a job ($job)");
my $run = as($carol, "CALL sharding.rebalance_run($job)");
unlike($run, qr/ERROR/, 'carol: rebalance_run returns');
is($c->safe_psql('coord', "SELECT state || ' ' || coalesce(error, '-') FROM sharding.rebalance_jobs WHERE job = $job"),
	'failed password is required', 'the job failed: password is required');
is($c->safe_psql('coord', "SELECT string_agg(DISTINCT phase || ' ' || coalesce(error_state, '-'), ', ')
                           FROM sharding.move_journal WHERE job = $job AND phase <> 'cancelled'"),
	'failed 2F003', 'its move failed with 2F003');
is($c->safe_psql('coord', 'SELECT count(*) FROM sharding.moves'), '0', 'no move is left live');
is(bob_logins($since), 0, 'carol: neither the capacity checks nor the move logged anybody in at n1 or n2');
is(bob_sessions(), '0', 'no session of bob is open');

# move_shard_online by carol: 2F003, the shard stays.
$since = -s $c->logfile;
like(as($carol, "SELECT sharding.move_shard_online('bank', 0, 'n2')"), qr/ERROR:  2F003: password is required/,
	'carol: move_shard_online is 2F003');
is($c->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 0"), 'n1',
	'the shard keeps its owner');
is($c->safe_psql('coord', 'SELECT count(*) FROM sharding.moves'), '0', 'no move is left live');
is(bob_logins($since), 0, 'carol: move_shard_online logged nobody in at n1 or n2');

done_testing();
