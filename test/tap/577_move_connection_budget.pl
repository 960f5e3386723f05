# A source at max_connections during a move (issue 38; noticed when 508
# failed on "too many clients already"): a move copies and deletes in
# sharding.move_parallel sessions (2), each part's copy opening a
# connection from the destination to the source, and the delete at the
# source an extra session there. Before 1.4's fix the move failed whole
# (08001) when one of them could not connect; now the sessions that got a
# connection do the work, with a WARNING, and the move succeeds.
#   A. n1 has 2 free connections (sessions hold the rest): the move's own
#      connection takes one, the first part's copy the other; the second
#      part's copy cannot connect, its part goes back to the queue and the
#      first session copies it. The move succeeds with every row.
#   B. The same, then the move held at its switch (its copy done, its part
#      connections closed) while one more session takes n1's last free
#      connection: the delete at the source runs in one session, not two.
#      The move succeeds with every row, and n1 keeps none.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use lib 'lib';
use ShardingNode;
use MoveTest;

# A held connection whose client is gone ends within 100 ms
# (client_connection_check_interval), so that a full n1 can be emptied.
my ($coord, $a, $b) = move_cluster(node_conf => "max_connections = 16\nclient_connection_check_interval = '100ms'");
load_rows($coord, $a, $b, 4000);
my ($S1, $S2) = split /\n/, $coord->safe_psql('coord',
	"SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n1' ORDER BY logical LIMIT 2");
my $sum = sub { $_[0]->safe_psql($_[1], "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $_[2], 'accounts')") };
ok($a->safe_psql('n1', "SELECT pg_relation_size('accounts') >= 2 * 256 * 8192") eq 't',
	'accounts at n1 is large enough to be copied and deleted in two parts');

my @holders;
my $holder_sql = 'SELECT pg_sleep(600) /* holder */';
# fill(free): sessions hold n1's connections until `free` are left.
sub fill
{
	my ($free) = @_;
	my $used = $a->safe_psql('n1', "SELECT count(*) - 1 FROM pg_stat_activity WHERE backend_type = 'client backend'");
	my $n = $a->safe_psql('n1', 'SHOW max_connections') - $used - $free;
	push @holders, psql_bg($a, 'n1', $holder_sql) for 1 .. $n;
	my $want = scalar @holders;
	ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query = '$holder_sql' AND wait_event = 'PgSleep'", $want, 60),
		"$want sessions hold n1's connections but $free");
}
# unfill(): the holders' clients end (their sessions within 100 ms).
sub unfill
{
	$_->{h}->kill_kill for @holders;
	@holders = ();
	ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query = '$holder_sql'", '0', 60), 'the holders are gone');
}
my $left = q{SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM sharding.frozen_shards)
	|| '/' || (SELECT count(*) FROM sharding.move_decoding)};
# moved(L, sum, what): n2 owns L with every row, n1 keeps none of it.
sub moved
{
	my ($l, $before, $what) = @_;
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $l"), 'n2', "$what: n2 owns it");
	is($sum->($b, 'n2', $l), $before, "$what: n2 has every row");
	is($a->safe_psql('n1', "SELECT count(*) FROM accounts WHERE sharding.shard_of(tenant, 8) = $l"), '0', "$what: n1 keeps none");
	is($a->safe_psql('n1', $left), '0/0/0/0', "$what: nothing of the move is left at n1");
}

# ------------------------------------------------------------------ A. the copy
my $sum1 = $sum->($a, 'n1', $S1);
fill(2);
my ($rc, $out, $err) = $coord->psql('coord', "SELECT sharding.move_shard_online('bank', $S1, 'n2') > 0");
is($out, 't', 'A: the move succeeds with one copy session short') or diag($err);
like($err, qr/WARNING:  copying a part: one of 2 sessions stops, the others go on: .*too many clients already/s,
	'A: a WARNING says a copy session stopped for want of a connection at the source');
unfill();
moved($S1, $sum1, 'A');

# ------------------------------------------------------------------ B. the delete
my $sum2 = $sum->($a, 'n1', $S2);
fill(2);
my $hold = hold_switch($coord, $S2);
my $mv = psql_bg($coord, 'coord', "SET sharding.move_freeze_timeout = '10min'; SELECT sharding.move_shard_online('bank', $S2, 'n2') > 0");
ok(switch_waits($coord), 'B: the move waits at its switch, its copy done');
# One more holder takes the last free connection (a probe that cannot
# connect says it has; a holder that lost the race to a probe is replaced).
my ($full, $last) = (0, undef);
for (1 .. 100)
{
	$last = psql_bg($a, 'n1', $holder_sql) if !$last || !$last->{h}->pumpable;
	usleep(200_000);
	$last->{h}->pump_nb if $last->{h}->pumpable;
	my (undef, undef, $perr) = $a->psql('n1', 'SELECT 1');
	if ($perr =~ /too many clients already/) { $full = 1; last; }
}
push @holders, $last if $last;
ok($full, 'B: n1 has no free connection left');
release_switch($coord, $hold);
$mv->{h}->finish;
is(${ $mv->{out} } =~ s/\s+$//r, 't', 'B: the move succeeds with one delete session short') or diag(${ $mv->{err} });
like(${ $mv->{err} }, qr/WARNING:  the delete of move \S+ runs in 1 sessions, not 2: .*too many clients already/s,
	'B: a WARNING says the delete at the source ran in fewer sessions');
unfill();
moved($S2, $sum2, 'B');

done_testing();
