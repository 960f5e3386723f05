# Faults during an online move (docs/moves.md, Cancel, failure, crash): a
# cancel mid-copy (the destination checked again 10 s later), kill -9 of the
# coordinator's backend while copying and again while catching up, the
# destination stopped with -m immediate mid-copy and started again. After
# each: the old owner has all its rows, nothing of the move is left on any
# node once the next call has run, and the next call succeeds.
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
my $S = 0;    # shard 0 is n1's
my $rows = shard_rows($a, 'n1', $S);
my $sum = sub { shard_sum($_[0], $_[1], $S) };
my $src_sum = $sum->($a, 'n1');

# hold_copy(): a session at the destination holding a lock that the copy
# into accounts waits for (the move stays in its copy).
sub hold_copy
{
	my $h = psql_bg($b, 'n2', "BEGIN; LOCK accounts IN SHARE MODE; SELECT pg_sleep(600)");
	# Held before the move starts (a move quicker than psql's start would
	# otherwise copy before the lock is taken).
	wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%LOCK accounts IN SHARE MODE%' "
		  . "AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()", '1', 60);
	return $h;
}
sub release
{
	my $h = shift;
	$b->safe_psql('n2', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%LOCK accounts IN SHARE MODE%' AND pid <> pg_backend_pid()");
	$h->{h}->finish;
}
sub start_move { return psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')"); }
sub in_phase
{
	my $p = shift;
	return wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE phase = '$p' AND pid IS NOT NULL", '1', 60);
}
# rolled_back(WHAT): after a kill -9 of the mover and the crash restart,
# the move is rolled back by _move_recover: this call's, or the jobs
# launcher's, which runs it after the crash restart when preloaded.
sub rolled_back
{
	my $what = shift;
	# The launcher may hold the move (rolling it back) when this call comes:
	# the call then skips it, so wait for the journal row to end.
	$coord->safe_psql('coord', 'SELECT sharding._move_recover()');
	ok(wait_for_sql($coord, 'coord', "SELECT phase IN ('failed', 'cancelled') FROM sharding.move_journal ORDER BY move DESC LIMIT 1", 't', 60),
		"$what: the interrupted move is rolled back (its journal row ended)");
}
sub after_fault
{
	my $what = shift;
	is(shard_rows($b, 'n2', $S), '0', "$what: no row of the shard at the destination");
	is($sum->($a, 'n1'), $src_sum, "$what: the old owner has all its rows");
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
		"$what: the old owner is in charge");
	is(leftovers($coord, $a, $b), $clean, "$what: no slot, publication, subscription, freeze or live journal row on any node");
}

# 1. Cancel mid-copy; the destination checked again 10 s later.
my $lock = hold_copy();
my $mv = start_move();
ok(in_phase('copying'), 'cancel: the move is copying');
usleep(300_000);
$coord->safe_psql('coord', "SELECT pg_cancel_backend(" . mover_pid($coord) . ")");
release($lock);    # (the rollback's delete at the destination waits for it too)
$mv->{h}->finish;
like(${ $mv->{err} }, qr/cancel/i, 'cancel: move_shard_online reports the cancel');
sleep 10;
after_fault('cancel, 10 s later');
is($coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal ORDER BY move DESC LIMIT 1"), 'cancelled',
	'cancel: the journal says cancelled');

# 2. kill -9 of the coordinator's backend while copying.
$lock = hold_copy();
$mv = start_move();
ok(in_phase('copying'), 'kill -9 while copying: the move is copying');
my $pid = mover_pid($coord);
kill 'KILL', $pid;
$mv->{h}->finish;
release($lock);
wait_for_restart($coord);
rolled_back('kill -9 while copying');
after_fault('kill -9 while copying');

# 3. kill -9 while catching up: the destination applies slowly (a replica
# trigger sleeps for the apply worker only), writers keep the backlog full.
slow_apply($b, 'n2', 0.2);
my $ws = start_writers($coord, 2, [ shard_tenants($coord, $S) ]);
$mv = start_move();
ok(in_phase('catching_up'), 'kill -9 while catching up: the move is catching up');
usleep(500_000);
my $catching_pid = mover_pid($coord);
kill 'KILL', $catching_pid if $catching_pid;
$mv->{h}->finish;
wait_for_restart($coord);
my ($stats) = stop_writers($coord, $ws);
$b->safe_psql('n2', 'DROP TRIGGER slow_apply ON accounts');
# (The crash restart ended the writers too, one maybe between its commit on
# the node and its log line: the source's own state is the reference.)
my $before_recover = $sum->($a, 'n1');
rolled_back('kill -9 while catching up');
$src_sum = $sum->($a, 'n1');    # the writers changed the shard meanwhile
is(shard_rows($b, 'n2', $S), '0', 'kill -9 while catching up: no row of the shard at the destination');
is(leftovers($coord, $a, $b), $clean, 'kill -9 while catching up: nothing of the move is left');
is($sum->($a, 'n1'), $before_recover, 'kill -9 while catching up: the old owner keeps every committed change');

# 4. The destination stopped with -m immediate mid-copy, started again.
$lock = hold_copy();
$mv = start_move();
ok(in_phase('copying'), 'destination stop: the move is copying');
$b->stop('immediate');
$mv->{h}->finish;
ok(${ $mv->{err} } ne '', 'destination stop: move_shard_online fails');
$lock->{h}->kill_kill;
$b->start;
# Rolled back by _move_recover: this call's, or already the jobs
# launcher's, which tries again a rollback that could not complete.
$coord->safe_psql('coord', 'SELECT sharding._move_recover()');
ok(wait_for_sql($coord, 'coord', "SELECT phase FROM sharding.move_journal ORDER BY move DESC LIMIT 1", 'failed', 60),
	'destination stop: the move is rolled back once the destination is up');
after_fault('destination stopped mid-copy');

# The next call succeeds.
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')"), '2', 'the next move succeeds: epoch 2');
is($sum->($b, 'n2'), $src_sum, 'the destination has the shard as the source had it');
is(leftovers($coord, $a, $b), $clean, 'and nothing is left');
done_testing();
