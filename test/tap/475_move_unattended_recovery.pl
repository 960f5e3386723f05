# A move whose rollback could not complete is rolled back without a call
# once its nodes answer again (docs/moves.md, "Cancel, failure, crash"):
# the coordinator stays up, the destination is stopped with -m immediate
# mid-copy, so the failed move cannot undo its subscription and copied rows
# there and leaves its slot, publication and journal row behind. Once the
# destination is started again, nobody calls anything, and within 60 s the
# jobs launcher (the library is preloaded) has rolled the move back: nothing
# of it is left on any node, the old owner has all its rows and is in
# charge, and the next call succeeds. Twice: a direct move_shard_online, and
# a move of a rebalance job (drain_node), which fails with it. (Before the
# fix the leftovers stayed, the source's slot holding WAL, until the next
# call of a move.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 100);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';

# A session at the destination holding a lock the copy into accounts waits
# for: the move stays in its copy.
sub hold_copy { return psql_bg($b, 'n2', 'BEGIN; LOCK accounts IN SHARE MODE; SELECT pg_sleep(600)'); }

# The destination down mid-copy, then up again; then the time until
# nothing of the move is left, with no call (undef: not within 60 s).
sub destination_fails
{
	my ($what, $start, $in_copy) = @_;
	my $lock = hold_copy();
	my $call = psql_bg($coord, 'coord', $start);
	ok(wait_for_sql($coord, 'coord', $in_copy, '1', 60), "$what: the move is copying");
	# (The journal says 'copying' before the slot exists: the copy waiting
	# for the held lock at the destination says it does.)
	ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE (query LIKE 'SELECT sharding._move_pull(%' "
		  . "OR query LIKE 'SELECT sharding._move_delete_local(%') AND wait_event_type = 'Lock'", 't', 60),
		"$what: its copy waits at the destination (its slot exists)");
	$b->stop('immediate');
	$call->{h}->finish;
	$lock->{h}->kill_kill;
	return $call;
}

# What the move left where it can be seen while the destination is down:
# its slot at the source, its journal row live.
sub left_behind
{
	return $a->safe_psql('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'")
	  . ' slot, ' . $coord->safe_psql('coord',
		"SELECT count(*) FROM sharding.move_journal WHERE phase NOT IN ('done', 'failed', 'cancelled')") . ' live';
}

sub recovered_within
{
	my ($secs) = @_;
	my $t0 = time;
	while (time - $t0 < $secs)
	{
		return time - $t0 if leftovers($coord, $a, $b) eq $clean;
		usleep(250_000);
	}
	return undef;
}

# 1. A direct call.
my $S = 0;
my $src = shard_sum($a, 'n1', $S);
my $call = destination_fails('direct call', "SELECT sharding.move_shard_online('bank', $S, 'n2')",
	"SELECT count(*) FROM sharding.move_journal WHERE phase = 'copying' AND pid IS NOT NULL");
like(${ $call->{err} }, qr/could not clean up after the failed move/, 'direct call: it fails and could not clean up');
is(left_behind(), '1 slot, 1 live', 'direct call: the move left its slot and journal row behind');
$b->start;
my $took = recovered_within(60);
ok(defined $took, 'direct call: with the destination up again and no call, nothing of the move is left within 60 s');
diag(sprintf('direct call: rolled back %.1f s after the destination was started', $took // -1));
is($coord->safe_psql('coord', 'SELECT phase FROM sharding.move_journal ORDER BY move DESC LIMIT 1'), 'failed',
	'direct call: its journal row ended failed');
is(shard_rows($b, 'n2', $S), '0', 'direct call: no row of the shard at the destination');
is(shard_sum($a, 'n1', $S), $src, 'direct call: the old owner has all its rows');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
	'direct call: the old owner is in charge');
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')"), '2',
	'direct call: the next call succeeds');
is(shard_sum($b, 'n2', $S), $src, 'direct call: the destination has the shard as the source had it');

# 2. A move of a job: n1 (shards 1-3 now) drained onto n2, one move at a time.
my %src = map { $_ => shard_sum($a, 'n1', $_) } (1, 2, 3);
destination_fails('job', "SELECT sharding.drain_node('bank', 'n1')",
	"SELECT count(*) FROM sharding.move_journal WHERE job IS NOT NULL AND phase = 'copying' AND pid IS NOT NULL");
my $job = $coord->safe_psql('coord', 'SELECT max(job) FROM sharding.move_jobs');
ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE job = $job AND error IS NOT NULL",
		'1', 60), 'job: its move fails');
my $moved = $coord->safe_psql('coord', "SELECT logical FROM sharding.move_journal WHERE job = $job AND error IS NOT NULL");
like(left_behind(), qr/^1 slot, [1-9] live$/, 'job: the move left its slot and journal row behind');
$b->start;
$took = recovered_within(60);
ok(defined $took, 'job: with the destination up again and no call, nothing of the move is left within 60 s');
diag(sprintf('job: rolled back %.1f s after the destination was started', $took // -1));
is($coord->safe_psql('coord', "SELECT sharding.rebalance_wait($job, '60 s')"), 'failed', 'job: the job ends failed');
is($coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE job = $job AND logical = $moved"), 'failed',
	'job: its move ended failed');
is(shard_rows($b, 'n2', $moved), '0', 'job: no row of the failed move\'s shard at the destination');
is(shard_sum($a, 'n1', $moved), $src{$moved}, 'job: the old owner has all its rows');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $moved"), 'n1',
	'job: the old owner is in charge');
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $moved, 'n2')"), '2',
	'job: the next call succeeds');
is(leftovers($coord, $a, $b), $clean, 'nothing is left at the end');
done_testing();
