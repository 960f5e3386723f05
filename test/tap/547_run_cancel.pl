# rebalance_cancel while CALL sharding.rebalance_run(job) is executing a
# move (no preload: the procedure is the job's only executor). The cancel
# marks the job (cancel_requested) and signals the executor, whose move is
# rolled back and whose call then ends with 57014; rebalance_run swallows
# that 57014 only when the job's cancel was asked for, and goes on to end
# the job 'cancelled'. The race: rebalance_cancel signals before its own
# transaction commits the mark. Here that transaction stays open until the
# executor has failed its move (or returned): rebalance_run must wait for
# the mark's commit, not read the old value and stop with 57014.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 4000, preload => 0);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'], max_parallel => 1)");
my @moves = split /\n/, $q->("SELECT move || '|' || logical || '|' || source || '|' || destination
                              FROM sharding.move_journal WHERE job = $job ORDER BY move");
ok(@moves >= 2, 'the job plans ' . scalar(@moves) . ' moves');
my ($mv, $l, $src, $dst) = split /\|/, $moves[0];
my $in = "sharding.logical_shard('bank', tenant) = $l";
my $owner_epoch = $q->("SELECT node || '\@' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $l");

# The first move is held at its cutover by a fence on its shard at its
# source (the freeze waits for fenced writers): the cancel meets it in
# flight.
my $fence = $d->background_psql($src);
$fence->query_safe('BEGIN');
$fence->query_safe("SELECT sharding.fence('bank', $l, sharding.epoch('bank', $l))");

my ($out, $err) = ('', '');
my $run = IPC::Run::start([ 'psql', '-XAtq', '-d', $c->connstr('coord') . ' application_name=run547',
	'-c', "CALL sharding.rebalance_run($job)" ], '>', \$out, '2>', \$err);
ok(wait_for('coord', "SELECT phase FROM sharding.move_journal WHERE move = $mv", 'cutover', 120),
	"move $mv (shard $l, $src > $dst) is in flight, held at its cutover");

# rebalance_cancel in a transaction that stays open: the executor is
# signalled, its move rolls back; the mark is not committed yet.
my $cancel = $c->background_psql('coord');
$cancel->query_safe('BEGIN');
is($cancel->query_safe("SELECT sharding.rebalance_cancel($job)"), 't', 'rebalance_cancel (its transaction left open)');
# Until the executor has rolled the move back and then either waits for
# the mark (a lock) or has returned.
my $deadline = time + 120;
my $seen = '';
while (time < $deadline)
{
	$run->pump_nb;
	$seen = $q->("SELECT (SELECT phase FROM sharding.move_journal WHERE move = $mv) || ' '
	                  || coalesce((SELECT coalesce(wait_event_type, 'running') FROM pg_stat_activity WHERE application_name = 'run547'), 'returned')");
	last if $seen =~ /^cancelled (Lock|returned)$/;
	usleep(100_000);
}
like($seen, qr/^cancelled (Lock|returned)$/, "the move is rolled back, then the executor waits or returns ($seen)");
is($seen, 'cancelled Lock', 'the executor waits for the cancel to commit');
$cancel->query_safe('COMMIT');
$cancel->quit;
$run->finish;
is($err, '', 'rebalance_run returns without an error (the 57014 of the cancelled move is not the call\'s)');
$fence->query_safe('ROLLBACK');
$fence->quit;

is($q->("SELECT sharding.rebalance_wait($job, '60 s')"), 'cancelled', 'the job ends cancelled');
is($q->("SELECT phase || ' ' || undone FROM sharding.move_journal WHERE move = $mv"), 'cancelled true',
	'the move in flight was rolled back (cancelled)');
is($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND phase <> 'cancelled'"), '0',
	'every move of the job is cancelled');
is($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND move > $mv AND started IS NOT NULL"), '0',
	'none of the others started');
is($q->("SELECT node || '\@' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $l"), $owner_epoch,
	"shard $l keeps its owner and epoch");
is(digest($dst, $in), '0:-', "the destination holds none of shard ${l}'s rows");
is(digest($src, $in), expected_digest($in), "the source still holds all of shard ${l}'s rows");
sleep 10;
is(digest($dst, $in), '0:-', '... nor 10 s later');
check_data('after the cancel');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

done_testing();
