# SEC-6 (review move-engine-1.3): the roles sharding_admin and
# sharding_worker are cluster-wide and made by CREATE EXTENSION when they
# do not exist. A role of that name made beforehand by someone else must
# not give its maker the extension's administration: CREATE EXTENSION
# refuses (42501, nothing created) a role with attributes of its own, or one
# that a role other than a superuser administers (ADMIN OPTION: from
# PostgreSQL 16 on, a CREATEROLE role that makes a role holds it
# implicitly). The roles this extension made, or plain ones a superuser
# made, are used as they are (a second database installs it).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $s = PostgreSQL::Test::Cluster->new('sec6');
$s->init;
$s->append_conf('postgresql.conf', "fsync = off\n");
$s->start;
my $v = $s->safe_psql('postgres', 'SHOW server_version_num');

# What CREATE EXTENSION sharding says in a new database (as the bootstrap
# superuser), and whether it left anything.
my $n = 0;
sub try_install
{
	my $db = 'db' . ++$n;
	$s->safe_psql('postgres', "CREATE DATABASE $db");
	my ($rc, $out, $err) = $s->psql($db, "\\set VERBOSITY verbose\nCREATE EXTENSION sharding");
	my $left = $s->safe_psql($db, q{SELECT count(*) FROM pg_namespace WHERE nspname = 'sharding'})
	  . '/' . $s->safe_psql($db, q{SELECT count(*) FROM pg_extension WHERE extname = 'sharding'});
	return ($rc, $err, $left);
}

# 1. sharding_admin made beforehand with LOGIN (by anyone: its password
#    holder would be the extension's administrator).
$s->safe_psql('postgres', q{CREATE ROLE sharding_admin LOGIN PASSWORD 'x'});
my ($rc, $err, $left) = try_install();
isnt($rc, 0, 'a sharding_admin made beforehand with LOGIN: CREATE EXTENSION fails');
like($err, qr/ERROR:\s+42501: role sharding_admin exists and has attributes of its own/, '... 42501, naming the role');
is($left, '0/0', '... and creates nothing');
$s->safe_psql('postgres', 'DROP ROLE sharding_admin');

# 2. eve, CREATEROLE but not a superuser, makes sharding_admin (from
#    PostgreSQL 16 on she holds ADMIN OPTION on it); on 15 a superuser's
#    GRANT ... WITH ADMIN OPTION to her stands for it.
$s->safe_psql('postgres', 'CREATE ROLE eve LOGIN CREATEROLE');
$s->safe_psql('postgres', 'SET ROLE eve; CREATE ROLE sharding_admin NOLOGIN');
$s->safe_psql('postgres', 'GRANT sharding_admin TO eve WITH ADMIN OPTION') if $v < 160000;
($rc, $err, $left) = try_install();
isnt($rc, 0, 'a sharding_admin that eve (CREATEROLE) administers: CREATE EXTENSION fails');
like($err, qr/ERROR:\s+42501: role sharding_admin is administered by eve, not a superuser/, '... 42501, naming eve');
like($err, qr/REVOKE ADMIN OPTION/, '... with the way out as a hint');
is($left, '0/0', '... and creates nothing');
is($s->safe_psql('postgres', q{SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid
    JOIN pg_roles e ON e.oid = m.member WHERE r.rolname = 'sharding_admin' AND e.rolname = 'eve'}), '1',
	'eve still holds what she had (nothing was granted or taken)');

# 3. The same for sharding_worker.
$s->safe_psql('postgres', 'DROP ROLE sharding_admin');
$s->safe_psql('postgres', 'SET ROLE eve; CREATE ROLE sharding_worker NOLOGIN');
$s->safe_psql('postgres', 'GRANT sharding_worker TO eve WITH ADMIN OPTION') if $v < 160000;
($rc, $err, $left) = try_install();
like($err, qr/ERROR:\s+42501: role sharding_worker is administered by eve/, 'a sharding_worker eve administers: 42501');
is($left, '0/0', '... and creates nothing');

# 4. The way out: a superuser takes the ADMIN OPTION back (or drops the
#    role); then it installs, and a second database installs with the
#    roles the first made.
$s->safe_psql('postgres', 'REVOKE ADMIN OPTION FOR sharding_worker FROM eve');
if ($v >= 160000)
{
	# eve's implicit grant: membership with ADMIN OPTION; revoking the
	# option leaves a plain membership, which gives her nothing to grant.
	is($s->safe_psql('postgres', q{SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid
	    WHERE r.rolname = 'sharding_worker' AND m.admin_option}), '0', 'no ADMIN OPTION on sharding_worker is left');
}
($rc, $err, $left) = try_install();
is($rc, 0, 'after REVOKE ADMIN OPTION: CREATE EXTENSION succeeds') or diag($err);
is($left, '1/1', '... and the extension is there');
($rc, $err, $left) = try_install();
is($rc, 0, 'a second database installs it with the roles the first made') or diag($err);
is($s->safe_psql('postgres', q{SELECT count(*) FROM pg_roles WHERE rolname IN ('sharding_admin', 'sharding_worker') AND NOT rolcanlogin}),
	'2', 'both roles are plain NOLOGIN roles');

done_testing();
