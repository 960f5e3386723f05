# Faults between an online move's switch and the end of its cleanup
# (docs/moves.md, Cancel, failure, crash): the source-side delete of the moved
# rows (sharding._move_delete_rows, one remote transaction of
# _move_delete_local calls, one per table) is held by a row lock at the
# source, then
#   1. the move's caller is cancelled, under writers: the cancelled delete
#      rolls back and the call's own finish deletes the rows again;
#   2. the caller's backend is killed (kill -9) while the delete waits: the
#      source's session of the move rolls back when it finds its client
#      gone, and the next call (_move_recover) finishes the move;
#   3. a VACUUM FULL of the source's table queued behind the held delete
#      (one part): it rewrites the table right after the delete commits,
#      and no row of the shard is left behind.
# The shard's table is large enough (4 MB) for the delete to run in two
# sessions at once (parts, each on a range of blocks, sharding.move_parallel),
# which commit together once both have deleted: the part holding the locked
# row waits, the other waits to commit with it.
# After each, and again 10 s later: the new owner is in charge with every
# row, the source holds no row of the shard, the journal says done and
# nothing of the move is left on any node; with writers, the nodes hold
# exactly what their log implies.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 200);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my @tenants = map { sprintf('t%02d', $_) } 0 .. 63;
my $sum = sub { $_[0]->safe_psql($_[1], "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $_[2], 'accounts')") };

# big(node, db, shard, from, log): 100,000 more rows of the shard's first
# tenant at its owner (ids from `from`, which writers never use), also in
# the coordinator's log when asked.
sub big
{
	my ($n, $db, $s, $from, $log) = @_;
	my $t = $coord->safe_psql('coord', "SELECT t FROM unnest(ARRAY[" . join(',', map { "'$_'" } @tenants)
		  . "]) t WHERE sharding.logical_shard('bank', t) = $s ORDER BY t LIMIT 1");
	my $gen = "SELECT '$t'::text AS tenant, i::bigint AS id, 'big-' || i AS val FROM generate_series($from, $from + 99999) i";
	$n->safe_psql($db, "INSERT INTO accounts $gen");
	$coord->safe_psql('coord', "INSERT INTO oplog (w, id, tenant, op, val) SELECT 0, id, tenant, 'insert', val FROM ($gen) g") if $log;
}
# gate_cutover(node, db, shard), before the move starts: a session at the
# source holds the shard's share lock (fence: no transaction id, so the
# slot's creation does not wait for it), so the move's cutover waits at the
# freeze until hold_delete opens the gate, however slow the machine.
sub gate_cutover
{
	my ($n, $db, $s) = @_;
	my $g = $n->background_psql($db);
	$g->query_safe('BEGIN');
	$g->query_safe("SELECT sharding.fence('bank', $s, sharding.epoch('bank', $s))");
	return $g;
}
# hold_delete(node, db, shard, gate): once the move's slot exists at that
# node (a transaction holding an xid would hold up its creation), a session
# there takes the row lock of one of the shard's initial rows (writers
# never touch those), so that the move's DELETE of the shard waits for it;
# then the gate opens and the move goes on to its cutover.
sub hold_delete
{
	my ($n, $db, $s, $gate) = @_;
	ok(wait_for_sql($n, $db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'", '1', 120),
		"$db: the move's slot exists");
	my $h = psql_bg($n, $db, "BEGIN; SELECT id FROM accounts WHERE sharding.logical_shard('bank', tenant) = $s AND id < 1000000 ORDER BY id LIMIT 1 FOR UPDATE; SELECT pg_sleep(600)");
	ok(wait_for_sql($n, $db, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE a.query LIKE '%FOR UPDATE; SELECT pg_sleep(600)%' AND l.locktype = 'transactionid' AND l.granted", '1', 60),
		"$db: a session holds a row lock of shard $s");
	is($coord->safe_psql('coord', "SELECT phase IN ('copying', 'catching_up', 'cutover') FROM sharding.move_journal WHERE logical = $s ORDER BY move DESC LIMIT 1"), 't',
		"$db: the lock is taken before the switch");
	$gate->query_safe('COMMIT');
	$gate->quit;
	return $h;
}
sub release
{
	my ($n, $db, $h) = @_;
	$n->safe_psql($db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%FOR UPDATE; SELECT pg_sleep(600)%' AND pid <> pg_backend_pid()");
	$h->{h}->finish;
}
my $deleting = deleting();
my $delete_waits = "SELECT count(*) FROM pg_stat_activity WHERE $deleting AND wait_event_type = 'Lock'";
# in_parts(node, db, what, from): the delete runs in two sessions; the one
# that does not wait has deleted its blocks (the big rows, ids from `from`)
# but not committed.
sub in_parts
{
	my ($n, $db, $what, $from) = @_;
	ok(wait_for_sql($n, $db, "SELECT count(*) FROM pg_stat_activity WHERE $deleting AND state = 'idle in transaction'", '1', 60),
		"$what: the delete runs in two sessions, the other one waits to commit with the waiting one");
	is($n->safe_psql($db, "SELECT count(*) FROM accounts WHERE id BETWEEN $from AND $from + 99999"), '100000',
		"$what: nothing of it is committed while a part waits");
}
sub after_cleanup_fault
{
	my ($what, $s, $src, $sdb, $dst, $ddb, $want_sum) = @_;
	after_cleanup_checks($what, $s, $src, $sdb, $dst, $ddb, $want_sum);
	sleep 10;
	after_cleanup_checks("$what, 10 s later", $s, $src, $sdb, $dst, $ddb, $want_sum);
	is($src->safe_psql($sdb, "SELECT count(*) FROM pg_stat_activity WHERE $deleting"), '0',
		"$what, 10 s later: no session of the move's delete is left at the source");
}
sub after_cleanup_checks
{
	my ($what, $s, $src, $sdb, $dst, $ddb, $want_sum) = @_;
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $s"), $ddb,
		"$what: the new owner is in charge");
	is(shard_rows($src, $sdb, $s), '0', "$what: the source holds no row of the shard");
	is($sum->($dst, $ddb, $s), $want_sum, "$what: the destination has every row of the shard") if defined $want_sum;
	is($coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE logical = $s ORDER BY move DESC LIMIT 1"), 'done',
		"$what: the journal says done");
	is(leftovers($coord, $a, $b), $clean, "$what: no slot, publication, subscription, freeze or live journal row on any node");
}

# 1. Cancel while the source-side delete waits, under writers.
my $S = 0;    # n1's
big($a, 'n1', $S, 2000000, 1);
my $ws = start_writers($coord, 3, \@tenants);
sleep 1;
my $gate = gate_cutover($a, 'n1', $S);
my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
my $lock = hold_delete($a, 'n1', $S, $gate);
ok(wait_for_sql($a, 'n1', $delete_waits, '1', 120), 'cancel: the source-side delete waits for the row lock');
in_parts($a, 'n1', 'cancel', 2000000);
is($coord->safe_psql('coord', "SELECT phase || ' ' || cleanup_deferred FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1"),
	'cleanup false', 'cancel: the move has switched (journal cleanup), its clean-up not deferred (sharding.move_cleanup immediate)');
my $first = $a->safe_psql('n1', "SELECT pid FROM pg_stat_activity WHERE $deleting AND wait_event_type = 'Lock'");
is($coord->safe_psql('coord', "SELECT pg_cancel_backend(" . mover_pid($coord) . ")"), 't', 'cancel: the caller is cancelled');
# The cancelled DELETE rolled back; the caller's own finish deletes again,
# over a new connection (and waits for the lock again).
ok(wait_for_sql($a, 'n1', "$delete_waits AND pid <> $first", '1', 60), 'cancel: the finish after the cancel deletes again');
is($a->safe_psql('n1', "SELECT count(*) FROM pg_stat_activity WHERE pid = $first AND $deleting AND state = 'active'"), '0',
	'cancel: the cancelled delete is no longer running');
release($a, 'n1', $lock);
$mv->{h}->finish;
like(${ $mv->{err} }, qr/moved to "n2" \(epoch 2\) and was finished, but the call failed: canceling statement/,
	'cancel: move_shard_online reports the move done and finished, and the cancel');
sleep 1;
writers_kept($coord, $a, $b, $ws, 'cancel: ');
after_cleanup_fault('cancel', $S, $a, 'n1', $b, 'n2', undef);

# 2. kill -9 of the caller's backend while the source-side delete waits
# (no writers: the crash restart would end them between a commit and its
# log line; the shard's checksum is the reference).
$S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n2' AND logical <> 0");
big($b, 'n2', $S, 3000000, 0);
my $want = $sum->($b, 'n2', $S);
$gate = gate_cutover($b, 'n2', $S);
$mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n1')");
$lock = hold_delete($b, 'n2', $S, $gate);
ok(wait_for_sql($b, 'n2', $delete_waits, '1', 120), 'kill -9: the source-side delete waits for the row lock');
in_parts($b, 'n2', 'kill -9', 3000000);
# The source's session of the move that waits for the lock, named before
# the kill: after the crash restart the preloaded launcher may already be
# finishing the move, and its own delete waits for the same lock.
my $orphan = $b->safe_psql('n2', "SELECT pid FROM pg_stat_activity WHERE $deleting AND wait_event_type = 'Lock'");
kill 'KILL', mover_pid($coord);
$mv->{h}->finish;
wait_for_restart($coord);
# That session finds its client gone once its DELETE has its lock: it ends
# without committing (the count in the journal below shows it: the finish
# deletes every row itself).
release($b, 'n2', $lock);
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE pid = '$orphan'", '0', 60),
	'kill -9: the orphaned delete at the source has ended');
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE $deleting", '0', 60),
	'kill -9: so has the other part, without committing (rows_moved below)');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
	'kill -9: the switch had committed before the kill');
# Finished by _move_recover: this call's, or the jobs launcher's after the
# crash restart (preloaded).
$coord->safe_psql('coord', 'SELECT sharding._move_recover()');
ok(wait_for_sql($coord, 'coord', "SELECT phase FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1", 'done', 60),
	'kill -9: the next call finishes the move');
after_cleanup_fault('kill -9', $S, $b, 'n2', $a, 'n1', $want);
is($coord->safe_psql('coord', "SELECT rows_moved FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1"),
	(split m{/}, $want)[0], 'kill -9: the journal counts every row deleted at the source');

# 3. A rewrite of the source's table queued behind the clean-up (VACUUM FULL
# waiting for the held delete), one part (move_parallel 1) over a table of
# about 30 MB: once the lock is released the rewrite runs right after the
# delete's transaction and moves the remaining rows to new places; the
# source must still end with no row of the shard and rows_moved with every
# row once. (A delete committed in batches of ctid ranges, the rewrite
# between two of them, skipped the rows it moved below the next batch.)
my $S3 = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1' AND logical NOT IN (0, $S)");
my $t3 = $coord->safe_psql('coord', "SELECT t FROM unnest(ARRAY[" . join(',', map { "'$_'" } @tenants)
	  . "]) t WHERE sharding.logical_shard('bank', t) = $S3 ORDER BY t LIMIT 1");
$a->safe_psql('n1', "INSERT INTO accounts SELECT '$t3', i, 'pad-' || i || repeat('x', 100) FROM generate_series(4000000, 4199999) i");
my $want3 = $sum->($a, 'n1', $S3);
$gate = gate_cutover($a, 'n1', $S3);
$mv = psql_bg($coord, 'coord', "SET sharding.move_parallel = 1; SELECT sharding.move_shard_online('bank', $S3, 'n2')");
$lock = hold_delete($a, 'n1', $S3, $gate);
ok(wait_for_sql($a, 'n1', $delete_waits, '1', 120), 'rewrite: the source-side delete waits for the row lock');
my $vf = psql_bg($a, 'n1', 'VACUUM FULL accounts');
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query = 'VACUUM FULL accounts' AND wait_event_type = 'Lock'", '1', 60),
	'rewrite: VACUUM FULL of the table waits behind the delete');
release($a, 'n1', $lock);
$vf->{h}->finish;
is(${ $vf->{err} }, '', 'rewrite: VACUUM FULL ran');
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'rewrite: the move succeeded');
after_cleanup_checks('rewrite', $S3, $a, 'n1', $b, 'n2', $want3);
is($coord->safe_psql('coord', "SELECT rows_moved FROM sharding.move_journal WHERE logical = $S3 ORDER BY move DESC LIMIT 1"),
	(split m{/}, $want3)[0], 'rewrite: the journal counts every row deleted at the source');

done_testing();
