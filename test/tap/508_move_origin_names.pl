# Moves named per coordinator (review LK-3, issue 35): replication slots
# and replication origins belong to a PostgreSQL instance, not to one of
# its databases. Two coordinators (databases ca and cb of one instance),
# each with a map 'bank' over two data nodes that are databases of one
# other instance (a1, a2 and b1, b2), move the same shard at the same time:
#   1. A's copy held at a2 (its slot exists) while B moves the same shard
#      from b1 to b2: before, B's slot had A's name ("already exists");
#   2. another shard: B's copy held at b2 (its slot exists) while A runs
#      to its delete at a1, held there (its origin active); then B goes on:
#      before, B's delete found its origin active in A's session and B
#      failed after its switch, b1 keeping the rows;
# (Holds are advisory locks in statement triggers, never an uncommitted
# row: a slot being created waits for every transaction id of the
# instance.)
#   3. an origin of A's left in use (a session holds it) when A finishes:
#      it stays while in use, and the next move of A with that node at one
#      end drops it.
# Every move's rows are checked at both of its ends; nothing of any move is
# left (publications, subscriptions, slots, origins, journal rows).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my $coord = sharding_node('coord', db => 'ca');
$coord->safe_psql('postgres', 'CREATE DATABASE cb');
$coord->safe_psql('cb', 'CREATE EXTENSION dblink; CREATE EXTENSION sharding');
my $data = sharding_node('data');
my $tables = "CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text);"
  . " CREATE UNIQUE INDEX accounts_identity ON accounts (id, tenant);"
  . " ALTER TABLE accounts REPLICA IDENTITY USING INDEX accounts_identity;";
my %co = (a => 'ca', b => 'cb');
for my $x ('a', 'b')
{
	my $c = $co{$x};
	for my $n ("${x}1", "${x}2")
	{
		$data->safe_psql('postgres', "CREATE DATABASE $n");
		$data->safe_psql($n, "CREATE EXTENSION dblink; CREATE EXTENSION sharding; $tables");
	}
	$coord->safe_psql($c, $tables);
	my $dsn = sub { return "host=" . $data->host . " port=" . $data->port . " dbname=$_[0]" };
	$coord->safe_psql($c, "SELECT sharding.create_map('bank', 8, ARRAY['${x}1', '${x}2']);
		SELECT sharding.add_node('${x}1', '" . $dsn->("${x}1") . "'), sharding.add_node('${x}2', '" . $dsn->("${x}2") . "');
		SELECT sharding.distribute('accounts', 'tenant', 'bank');
		SELECT sharding.attach_node('${x}1'); SELECT sharding.attach_node('${x}2');");
	for my $n ("${x}1", "${x}2")
	{
		wait_for_sql($data, $n, "SELECT count(*) FROM sharding.shards WHERE map = 'bank'", '8')
		  or die "node $n does not follow its coordinator";
		$data->safe_psql($n, "INSERT INTO accounts SELECT 't' || lpad((i % 64)::text, 2, '0'), i, 'v-' || i"
			  . " FROM generate_series(1, 3200) i WHERE sharding.node_for('bank', 't' || lpad((i % 64)::text, 2, '0')) = '$n'");
	}
}
# The shards each first node owns in both clusters.
my @S = split / /, $coord->safe_psql('ca', "SELECT string_agg(logical::text, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank' AND node = 'a1'");
is($coord->safe_psql('cb', "SELECT string_agg(logical::text, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank' AND node = 'b1'"),
	join(' ', @S), 'both maps place their shards alike');
ok(@S >= 4, 'a1 and b1 own at least four shards each');

my $of = sub { "SELECT count(*) || '/' || coalesce(sum(hashtext(tenant || id || val)), 0) FROM accounts WHERE sharding.logical_shard('bank', tenant) = $_[0]" };
my %want;
for my $x ('a', 'b') { $want{$x}{$_} = $data->safe_psql("${x}1", $of->($_)) for @S; }
# moved(x, shard, what): the shard is x2's at the coordinator, x2 holds
# every row x1 had, x1 none.
sub moved
{
	my ($x, $s, $what) = @_;
	is($coord->safe_psql($co{$x}, "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $s"), "${x}2", "$what: shard $s is ${x}2's");
	is($data->safe_psql("${x}2", $of->($s)), $want{$x}{$s}, "$what: ${x}2 holds every row of shard $s (count/sum)");
	is($data->safe_psql("${x}1", $of->($s)), '0/0', "$what: ${x}1 holds none");
}
# hold_copy(db): a move's copy into db waits (a BEFORE INSERT statement
# trigger waiting for an advisory lock a session of the test holds; an
# uncommitted row would hold a transaction id, for which every slot
# created on the instance waits). Returns the session (release_copy).
sub hold_copy
{
	my $db = shift;
	$data->safe_psql($db, q{
		CREATE OR REPLACE FUNCTION hold_copy() RETURNS trigger LANGUAGE plpgsql AS
		    $$ BEGIN PERFORM pg_advisory_lock(4243); PERFORM pg_advisory_unlock(4243); RETURN NULL; END $$;
		CREATE TRIGGER hold_copy BEFORE INSERT ON accounts FOR EACH STATEMENT EXECUTE FUNCTION hold_copy();
		ALTER TABLE accounts ENABLE ALWAYS TRIGGER hold_copy;});
	my $h = $data->background_psql($db, on_error_stop => 1);
	$h->query_safe('SELECT pg_advisory_lock(4243)');
	return $h;
}
sub release_copy
{
	my ($db, $h) = @_;
	$h->query_safe('SELECT pg_advisory_unlock(4243)');
	$h->quit;
	$data->safe_psql($db, 'DROP TRIGGER hold_copy ON accounts');
}
my $pulls = sub { "SELECT count(*) FROM pg_stat_activity WHERE datname = '$_[0]' AND query LIKE 'SELECT sharding._move_pull(%' AND wait_event_type = 'Lock'" };

# 1. Slots: A's copy held (its slot exists), B moves the same shard meanwhile.
my $S1 = $S[0];
my $hold = hold_copy('a2');
my $mva = psql_bg($coord, 'ca', "SELECT sharding.move_shard_online('bank', $S1, 'a2')");
ok(wait_for_sql($data, 'a2', $pulls->('a2'), '1', 120), 'slots: A\'s copy waits (held by the test; A\'s slot exists)');
my ($rc, $out, $err) = $coord->psql('cb', "SET statement_timeout = '120s'; SELECT sharding.move_shard_online('bank', $S1, 'b2')");
is($err, '', 'slots: B moves the same shard meanwhile');
is($data->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'"), '1',
	'slots: A\'s slot is still there');
release_copy('a2', $hold);
$mva->{h}->finish;
is(${ $mva->{err} }, '', 'slots: then A moves');
moved('a', $S1, 'slots: A');
moved('b', $S1, 'slots: B');

# 2. Origins: B's copy held (its slot exists), A runs to its delete at a1
# and is held there (its origin active), then B goes on to its own delete.
my $S2 = $S[1];
$data->safe_psql('a1', q{
	CREATE FUNCTION hold_delete() RETURNS trigger LANGUAGE plpgsql AS
	    $$ BEGIN PERFORM pg_advisory_lock(4242); PERFORM pg_advisory_unlock(4242); RETURN NULL; END $$;
	CREATE TRIGGER hold_delete BEFORE DELETE ON accounts FOR EACH STATEMENT EXECUTE FUNCTION hold_delete();
	ALTER TABLE accounts ENABLE ALWAYS TRIGGER hold_delete;});
my $holder = $data->background_psql('a1', on_error_stop => 1);
$holder->query_safe('SELECT pg_advisory_lock(4242)');
$hold = hold_copy('b2');
my $mvb = psql_bg($coord, 'cb', "SET statement_timeout = '180s'; SELECT sharding.move_shard_online('bank', $S2, 'b2')");
ok(wait_for_sql($data, 'b2', $pulls->('b2'), '1', 120), 'origins: B\'s copy waits (held by the test; B\'s slot exists)');
$mva = psql_bg($coord, 'ca', "SELECT sharding.move_shard_online('bank', $S2, 'a2')");
ok(wait_for_sql($data, 'a1', "SELECT count(*) FROM pg_stat_activity WHERE datname = 'a1' AND " . deleting() . " AND wait_event_type = 'Lock'", '1', 120),
	'origins: A\'s delete at a1 waits (held by the test), under its origin');
release_copy('b2', $hold);
$mvb->{h}->finish;
is(${ $mvb->{err} }, '', 'origins: B moves the same shard meanwhile, its delete under an origin of its own');
moved('b', $S2, 'origins: B');
$holder->query_safe('SELECT pg_advisory_unlock(4242)');
$holder->quit;
$mva->{h}->finish;
is(${ $mva->{err} }, '', 'origins: then A moves');
moved('a', $S2, 'origins: A');
$data->safe_psql('a1', 'DROP TRIGGER hold_delete ON accounts');

# 3. An origin of A's in use when A finishes: a session at the data
# instance holds <A's name>_7 (as an interrupted delete's part would).
my $S3 = $S[2];
$hold = hold_copy('a2');
$mva = psql_bg($coord, 'ca', "SELECT sharding.move_shard_online('bank', $S3, 'a2')");
ok(wait_for_sql($data, 'a2', $pulls->('a2'), '1', 120), 'left in use: A\'s copy waits (held by the test)');
my $name = $coord->safe_psql('ca', "SELECT name FROM sharding.move_journal WHERE logical = $S3 AND phase NOT IN ('done', 'failed', 'cancelled')");
like($name, qr/^sharding_move_[0-9a-f]{6}_bank_$S3$/, "left in use: A's move is named with its coordinator's tag ($name)");
my $other = $coord->safe_psql('cb', "SELECT sharding._move_name('bank', $S3)");
isnt($name, $other, 'left in use: not as 1.3 named it');
my $inuse = $data->background_psql('a1', on_error_stop => 1);
$inuse->query_safe("SELECT pg_replication_origin_create('${name}_7'); SELECT pg_replication_origin_session_setup('${name}_7')");
release_copy('a2', $hold);
$mva->{h}->finish;
is(${ $mva->{err} }, '', 'left in use: A moves');
moved('a', $S3, 'left in use: A');
is($data->safe_psql('postgres', "SELECT string_agg(roname, ' ') FROM pg_replication_origin WHERE roname LIKE 'sharding_move%'"),
	"${name}_7", 'left in use: only the origin in use is left');
$inuse->query_safe('SELECT pg_replication_origin_session_reset()');
$inuse->quit;
my $S4 = $S[3];
($rc, $out, $err) = $coord->psql('ca', "SELECT sharding.move_shard_online('bank', $S4, 'a2')");
is($err, '', 'left in use: the next move of A from a1');
moved('a', $S4, 'left in use: the next move');
is($data->safe_psql('postgres', "SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'sharding_move%'"), '0',
	'left in use: it dropped the origin left behind');

# A name in the journal that is not a move name of its shard (the journal
# is writable by sharding_admin; the name says what the engine drops) is
# refused, never used: a slot so named survives the recovery.
$data->safe_psql('a1', "SELECT pg_create_logical_replication_slot('important_slot', 'pgoutput')");
$coord->safe_psql('ca', "INSERT INTO sharding.move_journal (map, logical, source, destination, phase, started, name)"
	  . " VALUES ('bank', $S1, 'a1', 'a2', 'copying', now(), 'important_slot')");
($rc, $out, $err) = $coord->psql('ca', "\\set VERBOSITY verbose\nSELECT sharding._move_name('bank', $S1)");
like($err, qr/XX001: the journal names the move of logical shard $S1 of map "bank" "important_slot"/, 'a name that is not a move name: refused (XX001)');
$coord->psql('ca', 'SELECT sharding._move_recover()');
is($data->safe_psql('a1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'important_slot'"), '1',
	'a name that is not a move name: the recovery dropped no slot so named');
$coord->safe_psql('ca', "DELETE FROM sharding.move_journal WHERE name = 'important_slot'");
$data->safe_psql('a1', "SELECT pg_drop_replication_slot('important_slot')");

# Nothing of any move is left.
is($data->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'"), '0', 'no slot left');
for my $n (qw(a1 a2 b1 b2))
{
	is($data->safe_psql($n, "SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%') || '/' ||"
		  . " (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%') || '/' || (SELECT count(*) FROM sharding.frozen_shards)"),
		'0/0/0', "$n: no publication, subscription or frozen shard left");
}
is($coord->safe_psql($_, "SELECT count(*) FROM sharding.move_journal WHERE phase NOT IN ('done', 'failed', 'cancelled')"), '0',
	"$_: no live journal row") for ('ca', 'cb');

done_testing();
