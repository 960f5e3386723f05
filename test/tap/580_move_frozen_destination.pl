# A move cancelled while its destination's session does not answer (its
# backend stopped; the node's postmaster still answers the cancel request). The engine cancels the
# statement there and reads its results for 30 s at most; then it shuts
# the session's socket down instead of waiting, deaf to cancel and
# terminate, for TCP to give up (before 1.4 it waited in libpq for as long
# as the backend stayed stopped). So:
#   - the cancelled move returns while the destination's backend is still
#     stopped, with the cancel's error;
#   - once the backend runs again it ends (its connection is gone), and
#     recovery leaves every row of the shard exactly once, at the source,
#     which owns it, with nothing of the move left.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 50);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my $S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $sum = shard_sum($a, 'n1', $S);
my $live = "phase NOT IN ('queued', 'done', 'failed', 'cancelled')";
my ($stopped, $stopped_pm);
$SIG{TERM} = $SIG{INT} = sub { exit 1 };    # (END runs)
END { kill 'CONT', $_ for grep { defined } ($stopped_pm, $stopped); }

# The move's session at n2 waits for the table (held in SHARE mode there);
# that session is then stopped, and the table released.
my $hold = hold_table($b, 'n2', 'accounts');
my ($out, $err) = ('', '');
my $mv = IPC::Run::start([ 'psql', '-XAtq', '-d', $coord->connstr('coord'), '-c',
		"SELECT sharding.move_shard_online('bank', $S, 'n2')" ],
	'>', \$out, '2>', \$err, IPC::Run::timeout(150));
# (Its first statement there that needs the table: the delete of stale
# rows of the shard before the copy, in the coordinator's session.)
my $pulling = "application_name LIKE 'sharding_move_%' AND wait_event_type = 'Lock'";
ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE $pulling", 't', 60),
	"the move's session at the destination waits for the table");
$stopped = $b->safe_psql('n2', "SELECT pid FROM pg_stat_activity WHERE $pulling ORDER BY pid LIMIT 1");
ok(kill('STOP', $stopped), "the destination's session (pid $stopped) is stopped");
release_table($b, 'n2', $hold);

# The move is cancelled: it returns while that session is still stopped.
my $t0 = time;
$coord->safe_psql('coord', "SELECT pg_cancel_backend(" . mover_pid($coord) . ")");
my $ended = eval { $mv->finish; 1 };
my $took = time - $t0;
$mv->kill_kill unless $ended;
ok($ended, 'the cancelled move returned while its destination session was stopped');
diag(sprintf('the move returned %.1f s after its cancel', $took));
# (The drain's 30 s, then the undo's 10 s wait for the move's sessions
# there; well under the 150 s the old wait failed.)
cmp_ok($took, '>=', 25, 'after the drain had waited its time for the stopped session');
cmp_ok($took, '<', 120, 'and not much longer');
like($err, qr/ERROR:  canceling statement due to user request/, "with the cancel's error") or diag($err);
is($b->safe_psql('n2', "SELECT state FROM pg_stat_activity WHERE pid = $stopped") ne '' ? 'present' : 'gone',
	'present', 'the destination session was still there, stopped, when the move returned');

# The session runs again: it ends, and the move is resolved.
kill 'CONT', $stopped;
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE pid = $stopped", '0', 60),
	'once running again, the destination session ends (its connection is gone)');
$stopped = undef;
ok(wait_for_sql($coord, 'coord', "SELECT sharding._move_recover() >= 0 AND NOT EXISTS (SELECT FROM sharding.move_journal "
	  . "WHERE $live)", 't', 120), 'the move is resolved');
is(shard_sum($a, 'n1', $S) . ' ' . shard_rows($b, 'n2', $S), "$sum 0", 'every row of the shard exactly once, at the source');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1', 'n1 owns the shard');
is(leftovers($coord, $a, $b), $clean, 'nothing of the move is left');

# 2. (libpq 17, whose cancel request can be polled) The destination's
# postmaster stopped too: the cancel request cannot reach it either. The
# engine gives the request 10 s; not confirmed, the session is dropped (a
# request that arrives later must find nothing to cancel), so there is no
# drain; the undo's new session there gets the node's connect_timeout (5 s
# here). The move returns all the same and is left to recovery, which
# finishes it once the node runs again.
SKIP:
{
	# (Built with libpq 17's header or later: LIBPQ_HAS_ASYNC_CANCEL.)
	my $inc = `pg_config --includedir`;
	chomp $inc;
	my $async = -r "$inc/libpq-fe.h" && slurp_file("$inc/libpq-fe.h") =~ /define\s+LIBPQ_HAS_ASYNC_CANCEL/;
	skip 'the cancel request is polled only with libpq 17 or later', 10 unless $async;
	$coord->safe_psql('coord', "UPDATE sharding.nodes SET dsn = dsn || ' connect_timeout=5' WHERE node = 'n2'");
	my $pm = (split /\n/, slurp_file($b->data_dir . '/postmaster.pid'))[0];
	my $hold2 = hold_table($b, 'n2', 'accounts');
	my ($out2, $err2) = ('', '');
	my $mv2 = IPC::Run::start([ 'psql', '-XAtq', '-d', $coord->connstr('coord'), '-c',
			"SELECT sharding.move_shard_online('bank', $S, 'n2')" ],
		'>', \$out2, '2>', \$err2, IPC::Run::timeout(150));
	ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE $pulling", 't', 60),
		"again the move's session at the destination waits for the table");
	$stopped = $b->safe_psql('n2', "SELECT pid FROM pg_stat_activity WHERE $pulling ORDER BY pid LIMIT 1");
	ok(kill('STOP', $stopped), "the destination's session (pid $stopped) is stopped");
	release_table($b, 'n2', $hold2);
	$stopped_pm = $pm;
	ok(kill('STOP', $pm), "the destination's postmaster (pid $pm) is stopped too");
	my $t1 = time;
	$coord->safe_psql('coord', "SELECT pg_cancel_backend(" . mover_pid($coord) . ")");
	my $ended2 = eval { $mv2->finish; 1 };
	my $took2 = time - $t1;
	$mv2->kill_kill unless $ended2;
	kill 'CONT', $stopped_pm;
	$stopped_pm = undef;
	ok($ended2, 'the cancelled move returned while the destination (postmaster and session) was stopped');
	diag(sprintf('the move returned %.1f s after its cancel', $took2));
	cmp_ok($took2, '>=', 9, "after the cancel request's limit (10 s; not confirmed, the session is dropped, no drain)");
	cmp_ok($took2, '<', 120, "and not much longer");
	like($err2, qr/ERROR:  canceling statement due to user request/, "with the cancel's error") or diag($err2);
	kill 'CONT', $stopped;
	ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE pid = $stopped", '0', 60),
		'once running again, the destination session ends');
	$stopped = undef;
	ok(wait_for_sql($coord, 'coord', "SELECT sharding._move_recover() >= 0 AND NOT EXISTS (SELECT FROM sharding.move_journal "
		  . "WHERE $live)", 't', 120), 'the move is resolved');
	is(shard_sum($a, 'n1', $S) . ' ' . shard_rows($b, 'n2', $S), "$sum 0", 'every row of the shard exactly once, at the source');
	$coord->safe_psql('coord', "UPDATE sharding.nodes SET dsn = replace(dsn, ' connect_timeout=5', '') WHERE node = 'n2'");
}

# The same shard moves afterwards.
$coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
is(shard_rows($a, 'n1', $S) . ' ' . shard_sum($b, 'n2', $S), "0 $sum", 'a move of the shard afterwards carries every row');

done_testing();
