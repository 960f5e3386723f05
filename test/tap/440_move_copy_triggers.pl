# The move's copy and the destination's triggers (src/datanode/move_copy.cpp):
# the copy runs under session_replication_role = replica and, for CopyFrom
# only, leaves out of its own backend's view the BEFORE ROW INSERT triggers
# that cannot fire there (the guard's among them), so COPY batches its
# inserts. Checked here: a default-enabled BEFORE trigger that raises when
# it fires does not fire for the copied rows; one enabled ALWAYS still
# fires, once per copied row; the copied rows equal the source's; after the
# move the guard still refuses misrouted user writes at both nodes, in new
# sessions and in the destination's session that ran the copy.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 300);    # 19,200 rows over 8 shards
my %db = (n1 => $a, n2 => $b);
my $owner = sub { $coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $_[0]") };
my $digest = sub {
	my ($node, $l) = @_;
	return $db{$node}->safe_psql($node, "SELECT count(*) || ':' || coalesce(md5(string_agg(tenant || '/' || id || '/' || val, ',' ORDER BY id)), '')"
		  . " FROM accounts WHERE sharding.logical_shard('bank', tenant) = $l");
};
my $tenant_of = sub {
	$coord->safe_psql('coord', "SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) x"
		  . " WHERE sharding.logical_shard('bank', t) = $_[0] ORDER BY t LIMIT 1");
};

# Triggers at both data nodes, created after the load: one that refuses
# every insert (enabled on origin, the default), one ALWAYS that counts.
for my $n ('n1', 'n2')
{
	$db{$n}->safe_psql($n, q{
		CREATE TABLE fired (n bigint NOT NULL);
		INSERT INTO fired VALUES (0);
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refuse fired'; END $$;
		CREATE TRIGGER refuse BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION refuse();
		CREATE FUNCTION count_it() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE public.fired SET n = n + 1; RETURN NEW; END $$;
	});
}

# 1. Only triggers that cannot fire under replica: the batched path.
my $src = $owner->(0);
my $dst = $src eq 'n1' ? 'n2' : 'n1';
my $before = $digest->($src, 0);
like($before, qr/^[1-9]\d*:/, "shard 0 has rows at $src ($before)");
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', 0, '$dst')"), '2',
	'the move with a refusing BEFORE trigger (enabled on origin) at the destination succeeds');
is($digest->($dst, 0), $before, 'the destination holds exactly the source\'s rows of shard 0');
is($digest->($src, 0), '0:', 'the source holds none');
my $t0 = $tenant_of->(0);
my ($rc, $out, $err) = $db{$src}->psql($src, "DROP TRIGGER refuse ON accounts; INSERT INTO accounts VALUES ('$t0', 900000001, 'x')");
like($err, qr/belongs to node "n\d", not to this node/, "a user insert of shard 0 at the old owner $src is refused by the guard");
$db{$src}->safe_psql($src, "CREATE TRIGGER refuse BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION refuse()");
is($db{$src}->safe_psql($src, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'accounts'::regclass AND tgname = 'zz_sharding_guard'"),
	'1', 'the guard trigger is still in the catalog');
# The destination's session that ran the copy: the coordinator's dblink
# connection of the move, if it is still open, else a new session.
($rc, $out, $err) = $db{$dst}->psql($dst, "SELECT count(*) FROM accounts WHERE id = 900000001");
is($out, '0', 'nothing of the refused insert anywhere');
my $t1 = $tenant_of->(1);
my $o1 = $owner->(1);
my $n1 = $o1 eq 'n1' ? 'n2' : 'n1';
($rc, $out, $err) = $db{$n1}->psql($n1, "DROP TRIGGER refuse ON accounts; INSERT INTO accounts VALUES ('$t1', 900000002, 'x')");
like($err, qr/belongs to node "n\d", not to this node/, "at $n1 a user insert of shard 1 (owned by $o1) is still refused");
$db{$n1}->safe_psql($n1, "CREATE TRIGGER refuse BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION refuse()");
is(leftovers($coord, $a, $b), 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0', 'nothing of the move is left');

# 2. A trigger that fires under replica (ENABLE ALWAYS) at the destination:
# it runs once per copied row.
$db{$src}->safe_psql($src, q{
	CREATE TRIGGER count_it BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION count_it();
	ALTER TABLE accounts ENABLE ALWAYS TRIGGER count_it;
});
$before = $digest->($dst, 0);
my ($rows) = split /:/, $before;
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', 0, '$src')"), '3', 'shard 0 moves back');
is($db{$src}->safe_psql($src, 'SELECT n FROM fired'), $rows, "the ALWAYS trigger fired once per copied row ($rows)");
is($digest->($src, 0), $before, 'the rows are back, exactly');
is($digest->($dst, 0), '0:', 'and gone from the other node');
is($db{$dst}->safe_psql($dst, 'SELECT n FROM fired'), '0', 'the refusing trigger never fired, the counting one never ran there');

done_testing();
