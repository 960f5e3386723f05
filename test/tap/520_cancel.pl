# Rebalance jobs (docs/rebalance.md): rebalance_cancel mid-job. The move in
# flight rolls back (its shard's rows are not at the destination, not even 10
# s later; the old owner keeps them all), the moves after it are dropped,
# moves already done stay done, and the job ends 'cancelled'.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 60000);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

# Drain n1 (4 shards) onto n2 and n3, one move at a time: plenty of moves
# to cancel after the first is done.
my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n2', 'n3'], max_parallel => 1)");
my $total = $q->("SELECT moves_total FROM sharding.rebalance_jobs WHERE job = $job");
ok($total >= 3, "the job plans $total moves");

# Hold every move but the first at its cutover: a fence on its shard at its
# source, held in an open transaction, makes the source's freeze wait (a
# cutover waits for fenced writers). So the cancel below always meets a
# move in flight, whatever the machine's speed, instead of racing one that
# may finish first.
my @held = split /\n/, $q->("SELECT logical || '|' || source FROM sharding.move_journal
                              WHERE job = $job AND move > (SELECT min(move) FROM sharding.move_journal WHERE job = $job)
                              ORDER BY move");
my %fences;
for my $h (@held)
{
	my ($hl, $hsrc) = split /\|/, $h;
	$fences{$hsrc} //= do { my $b = $d->background_psql($hsrc); $b->query_safe('BEGIN'); $b };
	$fences{$hsrc}->query_safe("SELECT sharding.fence('bank', $hl, sharding.epoch('bank', $hl))");
}
ok(wait_for('coord', "SELECT moves_done >= 1 FROM sharding.rebalance_jobs WHERE job = $job", 't', 120), 'a first move is done');
ok(wait_for('coord', "SELECT count(*) > 0 FROM sharding.move_journal WHERE job = $job AND phase = 'cutover'", 't', 120),
	'a next move is in flight, held at its cutover');
my ($mv, $l, $src, $dst) = split /\|/, $q->("SELECT move, logical, source, destination FROM sharding.move_journal
                                             WHERE job = $job AND phase = 'cutover' LIMIT 1");
my $in = "sharding.logical_shard('bank', tenant) = $l";
my $done_before = $q->("SELECT string_agg(move::text, ',' ORDER BY move) FROM sharding.move_journal WHERE job = $job AND phase = 'done'");
my $owner_epoch = $q->("SELECT node || '\@' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $l");
is($q->("SELECT sharding.rebalance_cancel($job)"), 't', "rebalance_cancel while move $mv (shard $l, $src > $dst) is in flight");
# The fences end (without writing anything): the held cutover goes on into
# the cancel.
sleep 1;
$_->query_safe('ROLLBACK') for values %fences;
$_->quit for values %fences;
is($q->("SELECT sharding.rebalance_wait($job, '60 s')"), 'cancelled', 'the job ends cancelled');
is($q->("SELECT phase FROM sharding.move_journal WHERE move = $mv"), 'cancelled', 'the move in flight was rolled back (cancelled)');
is($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND phase = 'queued'"), '0', 'no move is left queued');
ok($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND move > $mv AND phase = 'cancelled'") >= 1,
	'the moves after it were dropped (cancelled, never started)');
is($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND move > $mv AND started IS NOT NULL"), '0',
	'none of them started');
is($q->("SELECT string_agg(move::text, ',' ORDER BY move) FROM sharding.move_journal WHERE job = $job AND phase = 'done'"),
	$done_before, 'moves done before the cancel stay done');
is($q->("SELECT node || '\@' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $l"), $owner_epoch,
	"shard $l keeps its owner and epoch");
is(digest($dst, $in), '0:-', "the destination holds none of shard ${l}'s rows");
sleep 10;
is(digest($dst, $in), '0:-', '... nor 10 s later');
is(digest($src, $in), expected_digest($in), "the source still holds all of shard ${l}'s rows");
check_data('after the cancel');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');
is($q->("SELECT sharding.rebalance_cancel($job)"), 'f', 'cancelling an ended job returns false');
is($q->("SELECT state || ' ' || moves_done FROM sharding.rebalance_jobs WHERE job = $job"),
	'cancelled ' . scalar(split(/,/, $done_before)), 'rebalance_jobs reports cancelled with the moves done');

done_testing();
