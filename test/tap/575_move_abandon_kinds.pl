# move_abandon over every kind of table a shard moves with, and after a
# kill -9 (issue 35, review LK-2; 574 covers the refusals and each end gone
# on accounts alone). Map bank moves two tables together: accounts (plain,
# its key outside the primary key, the replica identity carrying it) and
# parts (hash-partitioned with sharding.text_shard_ops, one leaf per
# logical shard: its copy reads the leaf, its clean-up truncates it).
#   1. Destination gone in the copy: the copy of S1 held at n2 (a session
#      there holds parts in SHARE mode), n2 stopped for good; the call fails.
#      move_abandon returns n1; n1 has every row of both tables, writes
#      both again, keeps nothing of the move; S1 then moves to n3 with
#      every row of both tables, and n1's leaf of S1 is emptied.
#   2. Destination gone in the cutover, then kill -9 of the move's caller:
#      S2's switch held at the coordinator (the source frozen), n2 stopped,
#      the caller's backend killed (the coordinator restarts). The journal
#      row stays live and n1 refuses writes of S2 in both tables. Then
#      move_abandon (retried while recovery holds the move for a moment)
#      returns n1, which writes both tables' rows of S2 again, has every
#      row, keeps nothing; S2 moves to n3 with every row.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 50);
load_parts($coord, $a, $b);
my $c = third_node($coord, parts => 1);

my $live = "phase NOT IN ('queued', 'done', 'failed', 'cancelled')";
my ($S1, $S2) = split /\n/, $coord->safe_psql('coord',
	"SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n1' ORDER BY logical LIMIT 2");
my %tenant = map { $_ => (shard_tenants($coord, $_))[0] } ($S1, $S2);
# "rows/checksum" of both tables' rows of shard L at a node.
sub both
{
	my ($node, $db, $l) = @_;
	return $node->safe_psql($db, "SELECT string_agg(t || ' ' || rows || '/' || checksum, ', ' ORDER BY t) FROM "
		  . "(SELECT t, (sharding.shard_checksum('bank', $l, t::regclass)).* FROM unnest(ARRAY['accounts', 'parts']) t) s");
}
# What a move leaves at n1: publications, slots, frozen shards, decoding
# rows, replication origins of moves.
my $left = q{SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM sharding.frozen_shards)
	|| '/' || (SELECT count(*) FROM sharding.move_decoding)
	|| '/' || (SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'sharding_move%')};
# Writes of shard L at n1 into both tables: "ok ok", or each one's SQLSTATE.
my $id = 900000;
sub write_both
{
	my ($l) = @_;
	my @r;
	for my $t ('accounts', 'parts')
	{
		$id++;
		my ($rc, $out, $err) = $a->psql('n1', "\\set VERBOSITY verbose\nINSERT INTO $t (tenant, id, val) VALUES ('$tenant{$l}', $id, 'w')");
		push @r, $rc == 0 ? 'ok' : ($err =~ /ERROR:  (\w{5}):/ ? $1 : $err);
	}
	return join ' ', @r;
}
sub journal_of
{
	my ($l) = @_;
	return $coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE map = 'bank' AND logical = $l ORDER BY move DESC LIMIT 1");
}
# move_abandon(L): its output and stderr, retried (up to a minute) while
# it answers 55006 (recovery holding the move for a moment).
sub abandon
{
	my ($l) = @_;
	my ($rc, $out, $err);
	for (1 .. 12)
	{
		($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding.move_abandon('bank', $l)");
		last unless $err =~ /ERROR:  55006/;
		sleep 5;
	}
	return ($out, $err);
}
# After move_abandon: n1 has every row of both tables (sum: as before the
# move), writes both again and keeps nothing of the move; then the shard
# moves to n3 with every row of both, and n1 keeps none (its leaf emptied).
sub kept_then_moved
{
	my ($l, $sum, $what) = @_;
	is(both($a, 'n1', $l), $sum, "$what: n1 has every row of both tables");
	is(write_both($l), 'ok ok', "$what: n1 writes both tables' rows of the shard again");
	is($a->safe_psql('n1', $left), '0/0/0/0/0', "$what: nothing of the move is left at n1");
	my $written = both($a, 'n1', $l);
	my (undef, $out, $err) = $coord->psql('coord', "SELECT sharding.move_shard_online('bank', $l, 'n3') > 0");
	is($out, 't', "$what then moves to n3") or diag($err);
	is(both($c, 'n3', $l), $written, "$what: n3 has every row of both tables, the new ones too");
	is($a->safe_psql('n1', "SELECT (SELECT count(*) FROM parts_$l) || '/' || "
		  . "(SELECT count(*) FROM accounts WHERE sharding.shard_of(tenant, 8) = $l)"),
		'0/0', "$what: n1 keeps none (its leaf parts_$l emptied)");
}
ok(both($a, 'n1', $S1) =~ m{^accounts [1-9]\d*/-?\d+, parts [1-9]\d*/-?\d+$}, "S1 has rows of both tables at n1");

# ------------------------------------------------------------------ 1. destination gone in the copy
my $sum1 = both($a, 'n1', $S1);
my $lock = hold_table($b, 'n2', 'parts');
my $mv1 = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S1, 'n2')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name LIKE 'sharding_move_%_bank_$S1' "
	  . "AND wait_event_type = 'Lock'", 't', 120), 'S1: its copy into parts waits at n2');
$b->stop('immediate');
$mv1->{h}->finish;
isnt(${ $mv1->{err} }, '', 'S1: the move fails with its destination');
is(journal_of($S1), 'copying', 'S1: its journal row stays live');
my ($out, $err) = abandon($S1);
is($out, 'n1', 'S1: move_abandon returns n1') or diag($err);
is(journal_of($S1), 'failed', 'S1: its journal row ends failed');
kept_then_moved($S1, $sum1, 'S1');

# ------------------------------------------------------------------ 2. destination gone in the cutover, kill -9
# n2 comes back for this part only as the destination, and is stopped for
# good again before the switch.
$b->start;
my $sum2 = both($a, 'n1', $S2);
my $hold = hold_switch($coord, $S2);
my $mv2 = psql_bg($coord, 'coord', "SET sharding.move_freeze_timeout = '10min'; SELECT sharding.move_shard_online('bank', $S2, 'n2')");
ok(switch_waits($coord), 'S2: the move waits in its cutover for the switch');
is(write_both($S2), '55000 55000', 'S2: the source refuses writes of both tables (frozen)');
$b->stop('immediate');
my $pid = mover_pid($coord);
ok($pid =~ /^\d+$/, "S2: the move's caller is backend $pid");
kill 'KILL', $pid;
$mv2->{h}->finish;
$hold->{h}->finish;
wait_for_restart($coord);
is(journal_of($S2), 'cutover', 'S2: after kill -9 and the restart its journal row stays live (cutover)');
is(write_both($S2), '55000 55000', 'S2: the source still refuses writes of both tables');
($out, $err) = abandon($S2);
is($out, 'n1', 'S2: move_abandon returns n1') or diag($err);
like($err, qr/WARNING:  01000: move \d+ abandoned: abandoned in phase cutover: node "n2", its destination, is out of reach/, 'S2: a WARNING says it was abandoned in its cutover');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S2"), 'n1', 'S2: n1 owns it');
kept_then_moved($S2, $sum2, 'S2');
is($coord->safe_psql('coord', "SELECT count(*) FROM sharding.move_journal WHERE $live"), '0', 'no live move is left');

done_testing();
