# The owner's credentials only for SQL the engine wrote (SEC-4, CONTRACT
# 15.2, docs/nodes.md "Passwords" and "What a sharding_admin member can do
# on the nodes"): the whole DSNs kept in sharding.node_secrets and the
# password of sharding.coordinator_dsn serve the engine's own statements
# (attach_node, detach_node, moves, take_over), never a statement or a
# connection string a member of sharding_admin who is not a superuser
# gives an internal function: _remote/_remote_exec and _dbl_connect given a
# node's masked DSN, _dbl_run on the engine's own named connections, and
# _move_pull given a node's name are refused (42501), _coordinator_dsn()
# shows the password masked, and _mask_password masks every password libpq
# would read (a URI's userinfo with a raw '?', sslpassword, percent-encoded
# keys). The public API keeps working for that member.
#
# The jobs cluster (JobsCluster.pm): bob, a superuser who logs in with a
# password, in every node DSN and in the coordinator's; dan, a member of
# sharding_admin, not a superuser.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 500, data_conf => "max_prepared_transactions = 10\n");
my $q = sub { return $c->safe_psql('coord', $_[0]); };
for my $n ($c, $d)
{
	$n->safe_psql('postgres', "CREATE ROLE bob LOGIN SUPERUSER PASSWORD 'hunter2secret';
	    CREATE ROLE dan LOGIN PASSWORD 'danpw'");
	sharding_password_login($n, 'bob');
}
$q->("GRANT sharding_admin TO dan; CREATE SCHEMA dans AUTHORIZATION dan;
	CREATE TABLE dans.loot (v text); ALTER TABLE dans.loot OWNER TO dan");
$d->safe_psql($_, "GRANT sharding_admin TO dan") for qw(n1 n2 n3);
sharding_engine_logs_in($c, 'coord', 'bob', 'hunter2secret');
$c->poll_query_until('coord', "SELECT current_setting('sharding.coordinator_dsn') LIKE '%bob%'") or die 'not reloaded';
ok(followers_agree(), 'the followers follow');

# as(cluster, db, role, sql): the output, or "SQLSTATE: message".
my $as = sub {
	my ($n, $db, $role, $sql) = @_;
	my ($rc, $out, $err) = $n->psql($db, "\\set VERBOSITY verbose\nSET ROLE $role;\n$sql");
	return $rc == 0 ? $out : ($err =~ /ERROR:  (\w{5}): ([^\n]*)/ ? "$1: $2" : $err);
};
my $super = sub { return $_[0]->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'dan'"); };
my $reset = sub { $_->safe_psql('postgres', 'ALTER ROLE dan NOSUPERUSER') for ($c, $d); };
my $n1 = $q->("SELECT dsn FROM sharding.nodes WHERE node = 'n1'");
like($n1, qr/password=\*\*\*\*\*\*\*\*$/, 'n1 is shown with its password masked');

# ------------------------------------------------------------ free SQL with a node's DSN
like($as->($c, 'coord', 'dan', "SELECT sharding._remote('$n1', 'ALTER ROLE dan SUPERUSER')"), qr/^42501: /,
	'_remote with a node\'s masked DSN and SQL of dan\'s: 42501');
is($super->($d), 'f', '... and dan did not become a superuser on the node');
$reset->();
like($as->($c, 'coord', 'dan', "SELECT sharding._remote_exec('$n1', 'ALTER ROLE dan SUPERUSER')"), qr/^42501: /,
	'_remote_exec with a node\'s masked DSN: 42501');
is($super->($d), 'f', '... and dan did not become a superuser on the node');
$reset->();
like($as->($c, 'coord', 'dan', "SELECT sharding._dbl_connect('mine', '$n1');
	SELECT sharding._dbl_run('mine', 'ALTER ROLE dan SUPERUSER')"), qr/^42501: /,
	'_dbl_connect with a node\'s masked DSN: 42501');
is($super->($d), 'f', '... and dan did not become a superuser on the node');
$reset->();
like($as->($c, 'coord', 'dan', "SELECT sharding.copy_shard('bank', 0, 'accounts', 'tenant', '$n1', '$n1')"), qr/^42501: /,
	'copy_shard with a node\'s masked DSN: 42501 (it would read the node as its DSN\'s role)');
like($q->("SELECT sharding.copy_shard('bank', 0, 'accounts', 'tenant', '$n1', '$n1')"), qr/^\d+$/,
	'... which the owner may (the rows are there already: a count)');
like($as->($c, 'coord', 'dan', "SELECT sharding._leads_here('$n1')"), qr/^42501: /,
	'_leads_here with a node\'s masked DSN (outside attach_node): 42501');
like($as->($c, 'coord', 'dan', "SELECT sharding._take_over_config('$n1', 'dans_slot')"), qr/^42501: /,
	'_take_over_config with a node\'s masked DSN: 42501');
is($d->safe_psql('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'dans_slot'"), '0',
	'... and no slot was made there');

# ------------------------------------------------------------ the coordinator's DSN
my $cd = $as->($c, 'coord', 'dan', 'SELECT sharding._coordinator_dsn()');
unlike($cd, qr/hunter2/, "_coordinator_dsn() shows dan no password ($cd)");
like($as->($c, 'coord', 'dan', "SELECT sharding._remote(sharding._coordinator_dsn(), 'ALTER ROLE dan SUPERUSER')"),
	qr/^(42501|28P01|08001): /, '_remote with what _coordinator_dsn() gives dan: refused');
is($super->($c), 'f', '... and dan did not become a superuser on the coordinator');
$reset->();

# ------------------------------------------------------------ _move_pull
like($as->($c, 'coord', 'dan', "SELECT sharding._move_pull('n1', NULL, 'dans.loot', ARRAY['v'],
	'SELECT rolname::text FROM pg_catalog.pg_authid WHERE rolpassword IS NOT NULL')"), qr/^42501: /,
	'_move_pull with a node\'s name and a query of dan\'s: 42501');
is($q->('SELECT count(*) FROM dans.loot'), '0', '... and nothing of pg_authid was copied');
like($as->($c, 'coord', 'dan', "SELECT * FROM sharding._move_slot_create('n1', 'dans_slot2', 'pgoutput', '-c work_mem=64MB')"),
	qr/^42501: /, '_move_slot_create at a node with options of dan\'s: 42501');
is($d->safe_psql('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'dans_slot2'"), '0',
	'... and no slot was made there');

# ------------------------------------------------------------ _move_delete_local
# It runs its DELETE in the caller's own session, with the caller's rights
# (no credentials of anyone else): dan's expression reads nothing he may not.
like($as->($c, 'coord', 'dan', "SELECT sharding._move_delete_local('dans.loot',
	'(SELECT count(*) FROM pg_catalog.pg_authid) > 0')"), qr/^42501: permission denied for table pg_authid/,
	'_move_delete_local: dan\'s filter runs with his own rights (42501 on pg_authid)');

# ------------------------------------------------------------ run_on_nodes
# Statements run on the nodes as dan himself: in a session logged in as
# dan, not as the DSN's bob switched to dan with SET ROLE (which RESET ROLE
# would undo).
$as->($c, 'coord', 'dan', "SELECT * FROM sharding.run_on_nodes('RESET ROLE; ALTER ROLE dan SUPERUSER', ARRAY['n1'])");
is($super->($d), 'f', 'run_on_nodes: dan\'s RESET ROLE does not make him the DSN\'s superuser on the node');
$reset->();
is($as->($c, 'coord', 'dan', "SELECT node || ': ' || result FROM sharding.run_on_nodes('SELECT current_user', ARRAY['n1'])"),
	'n1: SELECT 1', 'run_on_nodes: dan runs a statement of his on a node');

# ------------------------------------------------------------ the public API still works for dan
is($as->($c, 'coord', 'dan', "SELECT sharding.detach_node('n3')"), '', 'dan detaches n3');
is($as->($c, 'coord', 'dan', "SELECT sharding.attach_node('n3')"), '', 'dan attaches n3 again');
ok(followers_agree(), 'the followers follow');
my $moved = $as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 0, 'n3')");
like($moved, qr/^\d+$/, "dan moves shard 0 to n3: $moved");
check_data('after the move by dan');
# The engine's named connections of dan's session (the journal's over the
# coordinator's DSN, the source's, the destination's) are the engine's. A
# move that copies closes them when it ends; a move in a map without
# tables (the switch is the move) ends its journal row over the journal's
# connection after that and leaves it open in his session: the checks
# below make one each time first (without it they would fail with 08003),
# and check that it switched the shard.
$q->("SELECT sharding.create_map('bare', 2, ARRAY['n1', 'n3'])");
my $bare = $q->("SELECT node FROM sharding.shards WHERE map = 'bare' AND logical = 0");
my $refused = qr/^42501: permission denied to use connection "sharding_move_self" of the extension/;
my $bare_move = sub {
	$bare = $bare eq 'n1' ? 'n3' : 'n1';
	return "SELECT sharding.move_shard_online('bare', 0, '$bare');";
};
my $bare_moved = sub {
	is($q->("SELECT node FROM sharding.shards WHERE map = 'bare' AND logical = 0"), $bare,
		"... dan's move of the map without tables switched its shard to $bare");
};
like($as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 0, 'n1');
	SELECT sharding._dbl_connect('sharding_move_src', '$n1');"), qr/^42501: /,
	'after a move, dan may not open a named connection with a node\'s masked DSN');
like($as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 0, 'n3');" . $bare_move->() . "
	SELECT sharding._dbl_open('sharding_move_self');
	SELECT sharding._dbl_run('sharding_move_self', 'ALTER ROLE dan SUPERUSER');"), $refused,
	'after his moves, dan may not run SQL of his own over the engine\'s journal connection');
$bare_moved->();
like($as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 0, 'n1');
	SELECT sharding._dbl_run(c, 'ALTER ROLE dan SUPERUSER') FROM unnest(ARRAY['sharding_move_src',
	  'sharding_move_dst']) AS c WHERE sharding._dbl_open(c);"), qr/^(42501: |\d+\n?$)/,
	'after a move, dan may not run SQL of his own over the source\'s or destination\'s connection if still open');
is($super->($c) . $super->($d), 'ff', '... and dan is a superuser nowhere');
# The journal's connection in dan's session: none of the internals that take
# a connection's name runs on it for him.
for my $call ("sharding._dbl_value('sharding_move_self', 'SELECT current_user')",
	"sharding._move_stop_backends('sharding_move_self', 'no_such_application')",
	"sharding._move_call('sharding_move_self', '_thaw_shard', 'bank', 5)")
{
	my $got = $as->($c, 'coord', 'dan', "SELECT sharding.move_shard_online('bank', 0, 'n1');" . $bare_move->() . "
		SELECT sharding._dbl_open('sharding_move_self');
		SELECT $call;");
	like($got, $refused, "after his moves, dan's $call on the engine's journal connection: 42501 ($got)");
	$bare_moved->();
	$q->("SELECT sharding.move_shard_online('bank', 0, 'n3')");
}

$reset->();
check_data('after the moves by dan');

# ------------------------------------------------------------ the owner keeps the whole DSNs
like($q->("SELECT sharding._remote('$n1', 'SELECT current_user')"), qr/^bob$/,
	'a superuser\'s _remote with a node\'s masked DSN logs in with the kept password');
like($q->('SELECT sharding._coordinator_dsn()'), qr/password=hunter2secret/, 'a superuser reads the whole coordinator DSN');

# ------------------------------------------------------------ masking
my @mask = (
	['postgresql://bob:p?x@h/db', 'p?x', 'a URI password with a raw ?'],
	['postgresql://bob:p%3Fx@h:5/db?sslmode=disable', 'p%3Fx', 'a percent-encoded URI password'],
	['postgresql://bob@h/db?pass%77ord=pw77', 'pw77', 'a URI password= with a percent-encoded key'],
	['postgresql://bob@h/db?sslpassword=keypw1', 'keypw1', 'a URI sslpassword'],
	['host=h sslpassword=keypw2 user=u', 'keypw2', 'sslpassword='],
	[q{host=h sslpassword = 'a b\'keypw3' user=u}, 'keypw3', 'a quoted sslpassword with a space and a quote'],
	[q{host=h password='pw\\ 4x' user=u}, '4x', 'a quoted password with a backslash'],
	['postgres://bob:pw5@h/db', 'pw5', 'postgres:// userinfo'],
);
for my $m (@mask)
{
	my ($dsn, $secret, $what) = @$m;
	(my $lit = $dsn) =~ s/'/''/g;
	my $shown = $q->("SELECT sharding._mask_password(E'" . ($lit =~ s/\\/\\\\/gr) . "')");
	unlike($shown, qr/\Q$secret\E/, "_mask_password: $what ($shown)");
	like($shown, qr/\*\*\*\*\*\*\*\*/, "_mask_password: $what is shown as ********");
}
is($q->(q{SELECT sharding._mask_password('host=h password=x user=u') || ' | ' ||
	sharding._mask_password('postgresql://u:pw@h:5/db?password=q&x=1')}),
	'host=h password=******** user=u | postgresql://u:********@h:5/db?password=********&x=1',
	'_mask_password keeps the form of what it masks');
# SHOW to a role that is not a superuser.
my ($rc, $out, $err) = $c->psql('coord', q{SET sharding.coordinator_dsn = 'postgresql://bob:p?x@h/db'; SET ROLE dan; SHOW sharding.coordinator_dsn});
unlike($out, qr/p\?x/, "SHOW sharding.coordinator_dsn masks a URI password with a raw ? ($out)");

# A connection an SQL caller opened under the journal's name, with a DSN of
# his own, is not the engine's: a move does not write its journal over it
# (before 1.4 its journal rows went wherever dan's DSN led; here a
# database without the journal, and the move failed), it opens its own.
sharding_password_login($c, 'dan');
my $dan_dsn = 'host=' . $c->host . ' port=' . $c->port . ' dbname=postgres user=dan password=danpw';
my $journal = "SELECT count(*) FILTER (WHERE phase = 'done') FROM sharding.move_journal";
my $done = $q->($journal);
my $to = $q->("SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 0") eq 'n1' ? 'n3' : 'n1';
like($as->($c, 'coord', 'dan', "SELECT sharding._dbl_connect('sharding_move_self', '$dan_dsn');
	SELECT sharding._dbl_value('sharding_move_self', 'SELECT pg_catalog.current_database()');
	SELECT sharding.move_shard_online('bank', 0, '$to') >= 0;"), qr/^\s*postgres\nt$/,
	"dan's own connection under the journal's name: his move goes on");
is($q->("SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 0"), $to, '... it moved shard 0');
is($q->($journal), $done + 1, '... and its journal row is in this database, done');
check_data('after dan\'s move with his own journal connection');

done_testing();
