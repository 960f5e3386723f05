# move_abandon: ending a move whose source or destination is gone for good
# (issue 35, review LK-2). Recovery and _move_cancel need both ends, so a
# move whose node was destroyed stayed live for ever: its journal row
# blocked every move of the shard, the source stayed frozen if it was, and
# the answering node kept the move's slot, publication or subscription.
#   1. Destination gone. Two moves from n1 to n2: S1 held in its cutover
#      (the switch waits for a session locking the shard's row at the
#      coordinator: the source is frozen) and S2 held in its copy (a session
#      at n2 holds accounts in SHARE mode). n2 is stopped and never started
#      again. Before: the rows stay live, a new move of the shard fails,
#      the source refuses writes of S1. move_abandon while S1's executor is
#      alive: 55006. Once it is cancelled: move_abandon ends both; n1 owns
#      and writes both shards, nothing of either move is left at n1, and
#      each moves to a third node n3 with every row.
#   2. Refusals: a non-admin (42501), a shard without a live move (42704),
#      a move whose nodes both answer (55000, hint: cancel), nothing changed.
#   4. Both gone: S4, held in its copy to n2 with S2, is left live; once n1
#      is gone too, move_abandon refuses (55000, hint: force), and with
#      force ends it on the coordinator's word (n1 keeps the shard).
#   3. Source gone: S3 moving from n1 to n3, held in its catch-up (n3's
#      apply worker sleeps on a row written meanwhile); n1 is stopped for
#      good. move_abandon drops the subscription at n3, which keeps every
#      row it had, and names in a WARNING what is left at n1.
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
my $c = third_node($coord);

my $live = "phase NOT IN ('queued', 'done', 'failed', 'cancelled')";
my ($S1, $S2, $S3, $S4) = split /\n/, $coord->safe_psql('coord',
	"SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n1' ORDER BY logical LIMIT 4");
my %tenant = map { $_ => (shard_tenants($coord, $_))[0] } ($S1, $S2, $S3, $S4);
# What moves left at a node, S4's move (left live until both its nodes
# are gone, part 4) apart.
my $q = qq{SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%' AND pubname NOT LIKE '%_bank_$S4')
	|| '/' || (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%' AND slot_name NOT LIKE '%_bank_$S4')
	|| '/' || (SELECT count(*) FROM sharding.frozen_shards)
	|| '/' || (SELECT count(*) FROM sharding.move_decoding WHERE slot NOT LIKE '%_bank_$S4')};

# A write of shard L at n1: 'ok' or its SQLSTATE (and 'frozen').
my $id = 900000;
sub write_src
{
	my ($l) = @_;
	$id++;
	my ($rc, $out, $err) = $a->psql('n1', "\\set VERBOSITY verbose\nINSERT INTO accounts VALUES ('$tenant{$l}', $id, 'w')");
	return 'ok' if $rc == 0;
	return $err =~ /ERROR:  (\w{5}): .*frozen/ ? "$1 frozen" : $err;
}
# A statement at the coordinator: its SQLSTATE, or 'ok <output>'.
sub coord_try
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\n$sql");
	return $rc == 0 ? "ok $out" : ($err =~ /ERROR:  (\w{5}):/ ? $1 : $err);
}
sub journal_of
{
	my ($l) = @_;
	return $coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE map = 'bank' AND logical = $l ORDER BY move DESC LIMIT 1");
}

# ------------------------------------------------------------------ 1. destination gone
my $hold = hold_switch($coord, $S1);
my $mv1 = psql_bg($coord, 'coord', "SET sharding.move_freeze_timeout = '10min'; SELECT sharding.move_shard_online('bank', $S1, 'n2')");
ok(switch_waits($coord), 'S1: the move waits in its cutover for the switch');
is(write_src($S1), '55000 frozen', 'S1: the source is frozen');

my $lock = hold_table($b, 'n2', 'accounts');
my $mv2 = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S2, 'n2')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted AND relation = 'accounts'::regclass", 't', 120),
	'S2: the move\'s copy into accounts waits at the destination');
my $mv4 = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S4, 'n2')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name LIKE 'sharding_move_%_bank_$S4' "
	  . "AND wait_event_type = 'Lock'", 't', 120), 'S4: its copy waits there too');
my $m1 = $coord->safe_psql('coord', "SELECT move FROM sharding.move_journal WHERE map = 'bank' AND logical = $S1 AND $live");
my $m2 = $coord->safe_psql('coord', "SELECT move FROM sharding.move_journal WHERE map = 'bank' AND logical = $S2 AND $live");

# The destination is destroyed: stopped, never started again.
$b->stop('immediate');
$mv2->{h}->finish;
$mv4->{h}->finish;
like(${ $mv2->{err} }, qr/could not clean up after the failed move/, 'S2: the move fails and cannot clean up')
  or diag(${ $mv2->{err} });
my $sum2 = shard_sum($a, 'n1', $S2);

# Before move_abandon: the shard cannot move again, the rows stay live.
is(journal_of($S2), 'copying', 'before: S2\'s journal row stays live (copying)');
is(coord_try("SELECT sharding.move_shard_online('bank', $S2, 'n3')"), '55006',
	'before: a new move of S2 (to n3) fails with 55006');
is(coord_try("SELECT sharding._move_recover()"), 'ok 0', 'before: _move_recover resolves nothing');
is($a->safe_psql('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'"), '3',
	'before: the three moves\' slots hold WAL at the source');

# S1's executor is alive (it waits for its switch): refused.
is(coord_try("SELECT sharding.move_abandon('bank', $S1)"), '55006', 'S1: refused (55006) while its executor is alive');
$coord->safe_psql('coord', "SELECT sharding._move_cancel($m1)");
$mv1->{h}->finish;
release_switch($coord, $hold);
is(journal_of($S1), 'cutover', 'S1: cancelled, its journal row stays live (cutover)');
is(write_src($S1), '55000 frozen', 'before: S1 stays frozen at the source');
is(coord_try("SELECT sharding.move_shard_online('bank', $S1, 'n3')"), '55006',
	'before: a new move of S1 (to n3) fails with 55006');

# 2. Refusals, nothing changed.
$coord->safe_psql('coord', "CREATE ROLE mallory LOGIN");
is(coord_try("SET ROLE mallory; SELECT sharding.move_abandon('bank', $S1)"), '42501', 'a role without sharding_admin: 42501');
my $none = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n2'");
is(coord_try("SELECT sharding.move_abandon('bank', $none)"), '42704', 'a shard without a live move: 42704');
is(coord_try("SELECT sharding.move_abandon('nomap', 0)"), '42704', 'an unknown map: 42704');
is(journal_of($S1) . ' ' . write_src($S1), 'cutover 55000 frozen', 'after the refusals S1 is as it was');

# move_abandon ends both: n1 keeps the shards.
my ($rc, $out, $err) = $coord->psql('coord', "SELECT sharding.move_abandon('bank', $S1)");
is($out, 'n1', 'S1: move_abandon returns the owner, n1') or diag($err);
like($err, qr/WARNING:  move $m1 abandoned: abandoned in phase cutover: node "n2", its destination, is out of reach .*Left at "n2": subscription sharding_move_[0-9a-f]{6}_bank_$S1/,
	'S1: a WARNING names what is left at n2');
is($coord->safe_psql('coord', "SELECT phase || '|' || (error LIKE 'abandoned in phase cutover%') FROM sharding.move_journal WHERE move = $m1"),
	'failed|true', 'S1: its journal row ends failed, "abandoned"');
is(write_src($S1), 'ok', 'S1: the source writes the shard again');
my $sum1 = shard_sum($a, 'n1', $S1);
($rc, $out, $err) = $coord->psql('coord', "SELECT sharding.move_abandon('bank', $S2)");
is($out, 'n1', 'S2: move_abandon returns n1') or diag($err);
is($coord->safe_psql('coord', "SELECT phase || '|' || (error LIKE 'abandoned in phase copying%') FROM sharding.move_journal WHERE move = $m2"),
	'failed|true', 'S2: its journal row ends failed, "abandoned"');
is($a->safe_psql('n1', $q), '0/0/0/0/0', 'no publication, slot, frozen shard or decoding row of either move is left at n1');
is($a->safe_psql('n1', "SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'sharding_move%' AND roname NOT LIKE '%_bank_$S4%'"), '0',
	'nor a replication origin of theirs');
is($coord->safe_psql('coord', "SELECT string_agg(node, ',' ORDER BY logical) FROM sharding.shards WHERE map = 'bank' AND logical IN ($S1, $S2)"),
	'n1,n1', 'n1 owns both shards');
is(shard_sum($a, 'n1', $S2), $sum2, 'S2: every row at n1');

# Each moves again, to n3, with every row.
is(coord_try("SELECT sharding.move_shard_online('bank', $S1, 'n3') > 0"), 'ok t', 'S1 moves to n3');
is(coord_try("SELECT sharding.move_shard_online('bank', $S2, 'n3') > 0"), 'ok t', 'S2 moves to n3');
is(shard_sum($c, 'n3', $S1) . ' ' . shard_sum($c, 'n3', $S2) . ' ' . shard_rows($a, 'n1', $S1) . ' ' . shard_rows($a, 'n1', $S2),
	"$sum1 $sum2 0 0", 'n3 has every row of both shards, n1 none');

# ------------------------------------------------------------------ 3. source gone
slow_apply($c, 'n3', 600);
my $lock3 = hold_table($c, 'n3', 'accounts');
my $mv3 = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S3, 'n3')");
ok(wait_for_sql($c, 'n3', "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted AND relation = 'accounts'::regclass", 't', 120),
	'S3: the move\'s copy waits at n3');
my $m3 = $coord->safe_psql('coord', "SELECT move FROM sharding.move_journal WHERE map = 'bank' AND logical = $S3 AND $live");
# Both nodes answer: refused, nothing changed.
($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding.move_abandon('bank', $S3)");
like($err, qr/ERROR:  55000: move $m3 of logical shard $S3 of map "bank" is not abandoned: both its nodes answer/,
	'S3: refused (55000) while both nodes answer');
like($err, qr/HINT:  Cancel it: SELECT sharding._move_cancel\($m3\);/, 'its hint says to cancel it');
is(journal_of($S3) . ' ' . $a->safe_psql('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE '%_bank_$S3'"),
	'copying 1', 'nothing changed: the move copies on, its slot at n1');
# A row written meanwhile at n1 is held in n3's apply.
$a->safe_psql('n1', "INSERT INTO accounts VALUES ('$tenant{$S3}', 990001, 'during')");
release_table($c, 'n3', $lock3);
ok(wait_for_sql($c, 'n3', "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'logical replication%' AND wait_event = 'PgSleep'", '1', 120),
	'S3: copied, its apply worker holds the catch-up');
my $copied = shard_rows($c, 'n3', $S3);
ok($copied > 0, "S3: n3 has the $copied rows copied");
$a->stop('immediate');
$mv3->{h}->finish;
is(journal_of($S3), 'catching_up', 'S3: the source gone, the journal row stays live');
($rc, $out, $err) = $coord->psql('coord', "SELECT sharding.move_abandon('bank', $S3)");
is($out, 'n1', 'S3: move_abandon returns the owner the coordinator names, n1 (gone)') or diag($err);
like($err, qr/WARNING:  move $m3 abandoned: abandoned in phase catching_up: node "n1", its source, is out of reach .*Left at "n1": slot sharding_move_[0-9a-f]{6}_bank_$S3 \(holding WAL until dropped\), publication/,
	'S3: a WARNING names the slot and publication left at n1');
like($err, qr/the destination "n3" keeps the rows it copied/, 'and says that n3 keeps the rows it copied');
is($coord->safe_psql('coord', "SELECT phase || '|' || (error LIKE 'abandoned in phase catching_up%') FROM sharding.move_journal WHERE move = $m3"),
	'failed|true', 'S3: its journal row ends failed, "abandoned"');
is($c->safe_psql('n3', "SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%'"), '0',
	'S3: its subscription at n3 is dropped');
is(shard_rows($c, 'n3', $S3), $copied, 'S3: n3 keeps every row it had');

# ------------------------------------------------------------------ 4. both gone
is(journal_of($S4), 'copying', 'S4: its nodes both gone, its journal row is live');
($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding.move_abandon('bank', $S4)");
like($err, qr/ERROR:  55000: move \d+ of logical shard $S4 of map "bank" cannot be abandoned: neither of its nodes answers/,
	'S4: refused (55000) while neither node answers');
like($err, qr/HINT:  .*force => true/, 'its hint names force');
is(journal_of($S4), 'copying', 'nothing changed');
($rc, $out, $err) = $coord->psql('coord', "SELECT sharding.move_abandon('bank', $S4, force => true)");
is($out, 'n1', 'S4: with force, ended on the coordinator\'s word: n1 keeps the shard') or diag($err);
is($coord->safe_psql('coord', "SELECT phase || '|' || (error LIKE 'abandoned in phase copying (forced): neither of its nodes answers%') "
	  . "FROM sharding.move_journal WHERE map = 'bank' AND logical = $S4 ORDER BY move DESC LIMIT 1"),
	'failed|true', 'S4: its journal row ends failed, "abandoned ... (forced)"');
is($coord->safe_psql('coord', "SELECT count(*) FROM sharding.move_journal WHERE $live"), '0', 'no live move is left');

done_testing();
