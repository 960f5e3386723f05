# DDL of a distributed table during a rebalance job (docs/ddl.md, CONTRACT
# 15.4): each ALTER TABLE either waits for the move in flight to end (its
# cutover) and runs on every node, or, when lock_timeout passes first, is
# refused with 55006; the job ends done and its moves lose no row the
# writers committed (JobsCluster: coordinator on instance coord, n1..n3 on
# instance data, with max_prepared_transactions for two-phase commit).
# Then, held deterministically, the two windows between a DDL's check and
# its end: a move that starts while an ALTER TABLE passed the check (no
# move then) and has not committed waits for it at its plan and reads the
# columns afterwards (A); a move that starts while an ALTER TABLE has
# committed on the coordinator but not yet on the nodes (sharding.ddl_fault
# 'commit') reads the columns once the nodes have committed it (B): both
# moves succeed, carrying every row. (Before 1.4's fix both failed at
# their cutover: "the columns or the replica identity of public.accounts
# changed on node "n1" while logical shard … was being moved".)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IPC::Run;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 8000, data_conf => 'max_prepared_transactions = 10');
my $q = sub { return $c->safe_psql('coord', $_[0]); };

my $writers = start_writers(2);
sleep 1;
my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'], max_parallel => 1)");
my (%outcome, @added);
my $i = 0;
while ($i < 6 && $q->("SELECT state FROM sharding.rebalance_jobs WHERE job = $job") =~ /^(queued|running)$/)
{
	$i++;
	my $lt = $i % 2 ? '100ms' : '60s';
	my ($rc, $out, $err) = $c->psql('coord', "SET lock_timeout = '$lt'; ALTER TABLE accounts ADD COLUMN note$i text",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	if ($rc == 0) { $outcome{ok}++; push @added, "note$i"; }
	elsif ($err =~ /ERROR:\s+55006/) { $outcome{'55006'}++; }
	else { $outcome{other}++; diag("ALTER TABLE during the job: $err"); }
	usleep(300_000);
}
note('ALTER TABLE during the job: ' . join(', ', map { "$_ $outcome{$_}" } sort keys %outcome));
ok($i >= 1, "ALTER TABLE ran while the job ran ($i times)");
ok(!$outcome{other}, 'every ALTER TABLE during the job ran on every node or was refused with 55006 (nothing else)');
my $final = $q->("SELECT sharding.rebalance_wait($job, '180 s')");
# (An ALTER TABLE that passed its check while a move was queued, and
# committed between the move's look at the columns and its plan, failed
# the move at its cutover and the job with it: the move fixes its plan
# first now, and reads the columns under it.)
is($final, 'done', 'the job ends done');
sleep 1;
is(stop_writers($writers), '', 'the writers ran without error');
check_data('after DDL during the job');

# start_move(logical, node): move_shard_online in the background.
sub start_move
{
	my ($l, $to) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $c->connstr('coord'), '-c',
			"SELECT sharding.move_shard_online('bank', $l, '$to')" ], '>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}
my $owner = sub { $q->("SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $_[0]") };
my $shard_of = sub { $q->("SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = '$_[0]'") };
my $from = $shard_of->('n1') ne '' ? 'n1' : 'n2';
my $to = $from eq 'n1' ? 'n3' : 'n1';

# A: ALTER TABLE in an open transaction (it passed its check: no move
# yet); the move starts, waits at its plan for the DDL's plan lock; the
# DDL commits; the move reads the new columns and carries them.
my $la = $shard_of->($from);
my $ddl = $c->background_psql('coord');
$ddl->query_safe('BEGIN');
$ddl->query_safe('ALTER TABLE accounts ADD COLUMN held_open text');
my $mv = start_move($la, $to);
ok(wait_for('coord', "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", 't', 60),
	'A: the move waits at its plan for the open ALTER TABLE');
$ddl->query_safe('COMMIT');
$ddl->quit;
push @added, 'held_open';
$mv->{h}->finish;
diag("A: ${ $mv->{err} }") if ${ $mv->{err} } ne '';
is(${ $mv->{err} }, '', 'A: the move that started while the ALTER TABLE was open succeeds');
is($owner->($la), $to, "A: $to owns logical shard $la");

# B: ALTER TABLE committed on the coordinator, held before COMMIT PREPARED
# on the nodes (its plan lock is let go only after that); the move starts,
# waits at its plan; the nodes commit; the move reads the new columns and
# carries them.
my $lb = $shard_of->($from);
my $hold = $c->basedir . '/hold_commit';
open(my $fh, '>', $hold) or die "$hold: $!";
close($fh);
my ($bout, $berr) = ('', '');
my $bh = IPC::Run::start([ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $c->connstr('coord'), '-c',
		"SET sharding.ddl_fault = 'commit:$hold'", '-c', 'ALTER TABLE accounts ADD COLUMN held_commit text' ],
	'>', \$bout, '2>', \$berr);
# On each node its part is prepared, or already committed: the launcher's
# recovery commits the prepared parts of a transaction the coordinator
# committed whenever it scans (docs/ddl.md), and a scan may come right
# after move A (once in a CI run it committed two of the three within
# 30 ms of their PREPARE). The ALTER TABLE's session is still held at
# the fault either way, its plan lock with it.
my $part = sub {
	my $n = shift;
	return node_of_db($n)->safe_psql($n, "SELECT (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())
	    + (SELECT count(*) FROM pg_attribute WHERE attrelid = 'accounts'::regclass AND attname = 'held_commit')");
};
my $parts_ok = 0;
if (wait_for('coord', "SELECT count(*) FROM pg_attribute WHERE attrelid = 'accounts'::regclass AND attname = 'held_commit'", '1', 60))
{
	my $deadline = time + 60;
	while (time < $deadline)
	{
		$parts_ok = (join(' ', map { $part->($_) } qw(n1 n2 n3)) eq '1 1 1');
		last if $parts_ok;
		usleep(100_000);
	}
}
ok($parts_ok && wait_for('coord', "SELECT count(*) FROM pg_stat_activity WHERE query = 'ALTER TABLE accounts ADD COLUMN held_commit text' "
	  . "AND state = 'active'", '1', 10),
	'B: the ALTER TABLE committed on the coordinator, prepared (or committed by recovery) on each node, its session held');
note('B: prepared on the nodes: ' . node_of_db('n1')->safe_psql('n1', 'SELECT count(*) FROM pg_prepared_xacts'));
$mv = start_move($lb, $to);
ok(wait_for('coord', "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", 't', 60),
	'B: the move waits at its plan for the ALTER TABLE to end on the nodes');
unlink($hold);
$bh->finish;
is($berr, '', 'B: the ALTER TABLE committed on every node');
push @added, 'held_commit';
$mv->{h}->finish;
diag("B: ${ $mv->{err} }") if ${ $mv->{err} } ne '';
is(${ $mv->{err} }, '', 'B: the move that started before the nodes committed the ALTER TABLE succeeds');
is($owner->($lb), $to, "B: $to owns logical shard $lb");
check_data('after the held DDL');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');
my $cols = join(',', map { "'$_'" } @added) || "''";
for my $n (qw(n1 n2 n3))
{
	is(node_of_db($n)->safe_psql($n, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'accounts'::regclass AND attname IN ($cols) AND NOT attisdropped"),
		scalar(@added), "$n has every column the accepted ALTER TABLEs added (" . scalar(@added) . ')');
}
is(join(' ', map { node_of_db($_)->safe_psql($_, 'SELECT count(*) FROM pg_prepared_xacts') } qw(n1 n2 n3)), '0 0 0',
	'nothing left prepared on the nodes');
done_testing();
