# sharding.move_cleanup = deferred (issue 38, "a cheaper clean-up"):
# move_shard_online returns once the switch is done, the followers see it
# and the copies are verified; a background worker (the move cleaner)
# deletes the source's rows afterwards, and a crash resumes it. Map bank
# moves accounts (plain, its key outside the primary key) and parts
# (shard-partitioned, one leaf per shard) together.
#   0. The setting: immediate by default, a bad value 22023.
#   1. S1's clean-up held at n1 (a session there holds a row of S1 FOR
#      UPDATE, taken once the move is past its slot): the call returns,
#      n2 owns S1 with every row of both tables, the journal row stays in
#      phase cleanup while the cleaner's delete waits at n1, n1 still has
#      S1's rows and refuses writes of them; a move of S1 back is refused
#      (55006), changing nothing; another shard (S2, from n2 to n1) moves
#      and is cleaned meanwhile. Then kill -9 of the cleaner (the coordinator restarts):
#      the row stays in cleanup; once the hold is released the launcher's
#      recovery finishes it: done, n1 keeps no row of S1, nothing of the
#      move is left.
#   2. S1 moves back to n1, deferred: every row there, none left at n2.
#   3. isolate cleans up before it returns, whatever the setting.
#   4. The coordinator without shared_preload_libraries: the cleaner (a
#      dynamic background worker) still deletes the source's rows, without
#      a further call, a table larger than 16 MB in several transactions.
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

my ($S1, $S3) = split /\n/, $coord->safe_psql('coord',
	"SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n1' ORDER BY logical LIMIT 2");
# S2 moves from n2 meanwhile: a move from n1 would wait for the held row's
# transaction (a slot waits for the transactions running at its creation).
my $S2 = $coord->safe_psql('coord', "SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n2' ORDER BY logical LIMIT 1");
my %tenant = map { $_ => (shard_tenants($coord, $_))[0] } ($S1, $S2, $S3);
# "rows/checksum" of both tables' rows of shard L at a node.
sub both
{
	my ($node, $db, $l) = @_;
	return $node->safe_psql($db, "SELECT string_agg(t || ' ' || rows || '/' || checksum, ', ' ORDER BY t) FROM "
		  . "(SELECT t, (sharding.shard_checksum('bank', $l, t::regclass)).* FROM unnest(ARRAY['accounts', 'parts']) t) s");
}
# Rows of shard L at a node, "accounts/parts".
sub count_of
{
	my ($node, $db, $l) = @_;
	return $node->safe_psql($db, "SELECT (SELECT count(*) FROM accounts WHERE sharding.shard_of(tenant, 8) = $l) "
		  . "|| '/' || (SELECT count(*) FROM parts WHERE sharding.shard_of(tenant, 8) = $l)");
}
my $left = q{SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM sharding.frozen_shards)
	|| '/' || (SELECT count(*) FROM sharding.move_decoding)
	|| '/' || (SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'sharding_move%')};
sub journal_of
{
	my ($l) = @_;
	return $coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE map = 'bank' AND logical = $l ORDER BY move DESC LIMIT 1");
}
my $id = 900000;
# A write of shard L at n1 into accounts: 'ok' or its SQLSTATE.
sub write_n1
{
	my ($l) = @_;
	$id++;
	my ($rc, $out, $err) = $a->psql('n1', "\\set VERBOSITY verbose\nINSERT INTO accounts (tenant, id, val) VALUES ('$tenant{$l}', $id, 'w')");
	return $rc == 0 ? 'ok' : ($err =~ /ERROR:  (\w{5}):/ ? $1 : $err);
}
my $deferred = "SET sharding.move_cleanup = deferred; ";
# deferred_move(L, from, to, what): L moves from node `from` to `to` (each
# instance's database has the node's name) with the clean-up deferred: the
# destination has every row of both tables when the call returns, the
# cleaner ends the journal row done without a further call, and the
# source keeps none. Returns the source's "accounts/parts" rows before.
sub deferred_move
{
	my ($l, $from, $to, $what) = @_;
	my ($fdb, $tdb) = ($from->name eq 'i1' ? 'n1' : 'n2', $to->name eq 'i1' ? 'n1' : 'n2');
	my $sum = both($from, $fdb, $l);
	my $count = count_of($from, $fdb, $l);
	my (undef, $out, $err) = $coord->psql('coord', $deferred . "SELECT sharding.move_shard_online('bank', $l, '$tdb') > 0");
	is($out, 't', "$what moves from $fdb to $tdb, deferred") or diag($err);
	is(both($to, $tdb, $l), $sum, "$what: $tdb has every row of both tables");
	ok(wait_for_sql($coord, 'coord', "SELECT phase FROM sharding.move_journal WHERE map = 'bank' AND logical = $l ORDER BY move DESC LIMIT 1",
		'done', 60), "$what: the cleaner ends its clean-up done without a further call");
	is(count_of($from, $fdb, $l), '0/0', "$what: $fdb keeps none of its rows");
	return $count;
}

# ------------------------------------------------------------------ 0. the setting
is($coord->safe_psql('coord', 'SHOW sharding.move_cleanup'), 'immediate', 'move_cleanup is immediate by default');
my ($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\nSET sharding.move_cleanup = later");
like($err, qr/ERROR:  22023: invalid value for parameter "sharding.move_cleanup"/, 'a bad value of move_cleanup: 22023');

# move_row_held(S, LABEL, WHAT, CALL, WHERE): runs CALL (a deferred move of
# shard S) in the background with the row of accounts matching WHERE held
# at n1 by another session (FOR UPDATE, WHAT in the check's name), so that
# the clean-up waits for it. The copy is held at n2 first: the row lock is
# taken after the move's slot exists (a slot waits for the transactions
# running at its creation). Returns the move's and the holder's sessions,
# the move's finished.
sub move_row_held {
	my ($s, $label, $what, $call, $where) = @_;
	my $copy_hold = hold_table($b, 'n2', 'parts');
	my $mv = psql_bg($coord, 'coord', $deferred . $call);
	ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name LIKE 'sharding_move_%_bank_$s' "
		  . "AND wait_event_type = 'Lock'", 't', 120), "$label: its copy waits at n2");
	my $row = psql_bg($a, 'n1', "BEGIN; SELECT 1 FROM accounts WHERE $where FOR UPDATE; SELECT pg_sleep(600)");
	ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%FOR UPDATE; SELECT pg_sleep(600)' "
		  . "AND wait_event = 'PgSleep'", '1', 60), "$label: a session at n1 holds $what");
	release_table($b, 'n2', $copy_hold);
	$mv->{h}->finish;
	return ($mv, $row);
}

# ------------------------------------------------------------------ 1. held, killed, resumed
my $sum1 = both($a, 'n1', $S1);
my $count1 = count_of($a, 'n1', $S1);
ok($count1 =~ m{^[1-9]\d*/[1-9]\d*$}, "S1 has rows of both tables at n1 ($count1)");
my ($mv, $row_hold) = move_row_held($S1, 'S1', 'a row of S1', "SELECT sharding.move_shard_online('bank', $S1, 'n2')",
	"tenant = '$tenant{$S1}' ORDER BY id LIMIT 1");
like(${ $mv->{out} }, qr/^\d+$/, 'S1: move_shard_online returns its epoch with the clean-up held') or diag(${ $mv->{err} });
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S1"), 'n2', 'S1: n2 owns it');
is(both($b, 'n2', $S1), $sum1, 'S1: n2 has every row of both tables');
ok(wait_for_sql($a, 'n1', "SELECT count(*) > 0 FROM pg_stat_activity WHERE " . deleting() . " AND wait_event_type = 'Lock'", 't', 60),
	"S1: the cleaner's delete waits at n1 for the held row");
is(journal_of($S1), 'cleanup', 'S1: its journal row is in phase cleanup meanwhile');
is($coord->safe_psql('coord', "SELECT cleanup_deferred FROM sharding.move_journal WHERE map = 'bank' AND logical = $S1 ORDER BY move DESC LIMIT 1"),
	't', 'S1: its journal row says the clean-up is deferred (cleanup_deferred)');
ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'sharding move cleaner'", '1', 30),
	'S1: a move cleaner runs at the coordinator');
is(count_of($a, 'n1', $S1) =~ m{^[1-9]\d*/} ? 'kept' : 'gone', 'kept', "S1: n1 still has S1's accounts rows");
is(write_n1($S1), '55000', 'S1: n1 refuses writes of S1 meanwhile');
($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\n" . $deferred . "SELECT sharding.move_shard_online('bank', $S1, 'n1')");
like($err, qr/ERROR:  55006: logical shard $S1 of map "bank" is already being moved \(move \d+, phase cleanup\)/,
	'S1: a move back while its clean-up runs: 55006');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S1"), 'n2', 'S1: still n2');
# Another shard moves (n2 to n1), deferred, and is cleaned meanwhile.
my $count2 = deferred_move($S2, $b, $a, 'S2');
my ($a2, $p2) = split m{/}, $count2;
is($coord->safe_psql('coord', "SELECT rows_moved FROM sharding.move_journal WHERE map = 'bank' AND logical = $S2 ORDER BY move DESC LIMIT 1"),
	$a2 + $p2, 'S2: rows_moved counts the rows deleted at the source');
# _move_cancel interrupts the cleaner's delete (it cannot undo the
# switch): the cleaner tries again, its new delete waits at n1 again.
my $mid = $coord->safe_psql('coord', "SELECT move FROM sharding.move_journal WHERE map = 'bank' AND logical = $S1 ORDER BY move DESC LIMIT 1");
my $before_cancel = $a->safe_psql('n1', 'SELECT clock_timestamp()');
is($coord->safe_psql('coord', "SELECT sharding._move_cancel($mid)"), 't', 'S1: _move_cancel of the move in its clean-up');
ok(wait_for_sql($a, 'n1', "SELECT count(*) > 0 FROM pg_stat_activity WHERE " . deleting() . " AND wait_event_type = 'Lock' "
	  . "AND query_start > '$before_cancel'", 't', 60), 'S1: the cleaner tries again: a new delete waits at n1');
is(journal_of($S1), 'cleanup', 'S1: its journal row is still in cleanup');
is(count_of($a, 'n1', $S1) =~ m{^[1-9]\d*/} ? 'kept' : 'gone', 'kept', "S1: n1 still has S1's accounts rows (the cancelled delete rolled back)");
# kill -9 of the cleaner: the coordinator restarts, the row stays.
# Who carries the clean-up out now holds the move's executor lock: the
# cleaner, or the launcher's scanner when the cancel had it scan first
# (both retry after 1 s; the one that finds the other at work leaves it).
my $holder_sql = "SELECT l.pid || ' ' || a.backend_type FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
  . "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
  . "AND l.classid = hashtext('sharding.move_journal')::oid AND l.objid = ${mid}::oid";
my ($cleaner, $who) = split / /, $coord->safe_psql('coord', $holder_sql), 2;
like($who // '', qr/^sharding move (cleaner|scanner)$/, "S1: a worker of the extension carries the clean-up out (" . ($who // 'none') . ')');
kill 'KILL', $cleaner if defined $cleaner && $cleaner =~ /^\d+$/;
wait_for_restart($coord);
is(journal_of($S1), 'cleanup', 'S1: after kill -9 of the cleaner its journal row stays in cleanup');
$a->safe_psql('n1', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%FOR UPDATE; SELECT pg_sleep(600)'");
$row_hold->{h}->finish;
ok(wait_for_sql($coord, 'coord', "SELECT phase FROM sharding.move_journal WHERE map = 'bank' AND logical = $S1 ORDER BY move DESC LIMIT 1",
	'done', 120), 'S1: once released, recovery finishes the clean-up: done');
is(count_of($a, 'n1', $S1), '0/0', 'S1: n1 keeps none of its rows (both tables)');
is($a->safe_psql('n1', $left), '0/0/0/0/0', 'nothing of the moves is left at n1');
is($b->safe_psql('n2', "SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%'"), '0', 'no subscription is left at n2');
is(both($b, 'n2', $S1), $sum1, 'S1: n2 still has every row');

# ------------------------------------------------------------------ 2. back, deferred
deferred_move($S1, $b, $a, 'S1 back');
is(both($a, 'n1', $S1), $sum1, 'S1: n1 has every row again, once');

# ------------------------------------------------------------------ 3. isolate is not deferred
my $whale = $tenant{$S3};
my $before = $a->safe_psql('n1', "SELECT count(*) FROM accounts WHERE tenant = '$whale'");
($rc, $out, $err) = $coord->psql('coord', $deferred . "SELECT sharding.isolate('bank', '$whale', 'n2')");
ok($out > 0, "isolate moves $out rows of $whale") or diag($err);
is($a->safe_psql('n1', "SELECT count(*) FROM accounts WHERE tenant = '$whale'"), '0', 'isolate: n1 keeps none when it returns');
is($b->safe_psql('n2', "SELECT count(*) FROM accounts WHERE tenant = '$whale'"), $before, "isolate: n2 has all $before");
is($coord->safe_psql('coord', "SELECT phase || ' ' || cleanup_deferred FROM sharding.move_journal WHERE key = '$whale' ORDER BY move DESC LIMIT 1"),
	'done false', 'isolate: its journal row is done, its clean-up never deferred');

# ------------------------------------------------------------------ 4. without shared_preload_libraries
# S3 grows by 200,000 rows at n1 first: the cleaner deletes a table of
# several ranges of 1,024 blocks, a transaction each.
my $t3 = (shard_tenants($coord, $S3))[1];
$a->safe_psql('n1', "INSERT INTO accounts SELECT '$t3', 2000000 + i, md5(i::text) || md5(i::text) FROM generate_series(1, 200000) i");
ok($a->safe_psql('n1', "SELECT pg_relation_size('accounts') > 2 * 1024 * 8192") eq 't',
	'accounts at n1 spans more than two ranges of 1,024 blocks');
$coord->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$coord->restart;
is($coord->safe_psql('coord', "SELECT count(*) FROM pg_settings WHERE name = 'sharding.max_move_workers'"), '0',
	'the coordinator runs without the library preloaded');
# The cleaner's delete commits range by range: a row of S3 in the last
# range of accounts held at n1 (once the move's slot exists: its copy held
# at n2 first), the delete waits for it with the ranges before it already
# committed (a delete in one transaction would still show every row).
my $sum3 = both($a, 'n1', $S3);
my ($acc3) = split m{/}, count_of($a, 'n1', $S3);
my ($mv3, $last_hold) = move_row_held($S3, 'S3', "a row in accounts' last range",
	"SELECT sharding.move_shard_online('bank', $S3, 'n2') > 0",
	"ctid = (SELECT max(ctid) FROM accounts WHERE tenant = '$t3')");
like(${ $mv3->{out} }, qr/^t$/, 'S3, without preload, moves from n1 to n2, deferred') or diag(${ $mv3->{err} });
is(both($b, 'n2', $S3), $sum3, 'S3: n2 has every row of both tables');
ok(wait_for_sql($a, 'n1', "SELECT count(*) > 0 FROM pg_stat_activity WHERE " . deleting() . " AND wait_event_type = 'Lock'", 't', 60),
	"S3: the cleaner's delete waits at n1 for the held row");
my ($acc3_mid) = split m{/}, count_of($a, 'n1', $S3);
ok($acc3_mid > 0 && $acc3_mid < $acc3,
	"S3: meanwhile the ranges before it are deleted and committed ($acc3_mid of $acc3 accounts rows left at n1)");
$a->safe_psql('n1', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%FOR UPDATE; SELECT pg_sleep(600)'");
$last_hold->{h}->finish;
ok(wait_for_sql($coord, 'coord', "SELECT phase FROM sharding.move_journal WHERE map = 'bank' AND logical = $S3 ORDER BY move DESC LIMIT 1",
	'done', 60), 'S3: once released, the cleaner ends its clean-up done');
is(count_of($a, 'n1', $S3), '0/0', 'S3: n1 keeps none of its rows');
is(both($b, 'n2', $S3), $sum3, 'S3: n2 still has every row');

done_testing();
