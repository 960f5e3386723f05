# Rebalance jobs (docs/rebalance.md, Where jobs run): the coordinator's server
# restarts with -m immediate while a job runs, the library preloaded. After
# the restart the launcher finds the job by itself: the move in flight is
# resumed or rolled back from its journal, the job goes on and ends done, and
# every row is exactly where the map says, nothing lost or left behind. Then
# the move worker of a second job is terminated (pg_terminate_backend)
# mid-move: another worker takes the job over and it ends done.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 60000);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

# Whether a move of job J is in flight and stays so: its journal says
# 'copying' and a session of the data nodes waits for one of the HOLDS
# (each a session that holds the tables in SHARE mode). Waited for: the
# state lasts until the holds go.
sub held_in_flight
{
	my ($j, @h) = @_;
	my $pids = join(', ', map { $_->query_safe('SELECT pg_backend_pid()') } @h);
	return wait_for('coord', "SELECT count(*) > 0 FROM sharding.move_journal WHERE job = $j AND phase = 'copying'", 't', 60)
	  && wait_for('n1', "SELECT count(*) > 0 FROM pg_stat_activity WHERE pg_blocking_pids(pid) && ARRAY[$pids]", 't', 60);
}

my $plan = $q->("SELECT string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical)
                 FROM sharding.rebalance('bank', ARRAY['n2', 'n3'], dry_run => true)");
# The destinations' tables held in SHARE mode (reads go on, writes wait),
# so that the job's first move stays in flight until the stop: a move of
# these small shards is over in tens of milliseconds, and a poll could
# miss every one of them.
my @holds = map {
	my $h = $d->background_psql($_, on_error_stop => 1);
	$h->query_safe('BEGIN; LOCK TABLE accounts, events IN SHARE MODE');
	$h
} qw(n2 n3);
my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n2', 'n3'], max_parallel => 1)");
ok(held_in_flight($job, @holds), 'a move of the job is in flight: copying, a session of it waits for a held table');
my $phase = $q->("SELECT string_agg(logical || ' ' || phase, ', ') FROM sharding.move_journal WHERE job = $job AND phase NOT IN ('queued', 'done', 'failed', 'cancelled')");
$c->stop('immediate');
note "stopped (immediate) with $phase";
$_->quit for @holds;
$c->start;
my $final = $q->("SELECT sharding.rebalance_wait($job, '180 s')");
is($final, 'done', "after the restart the job finished by itself ($phase was in flight)");
note $q->("SELECT move, logical, phase, coalesce(error, '') FROM sharding.move_journal WHERE job = $job ORDER BY move");
is($q->("SELECT string_agg(logical || ':' || node, ' ' ORDER BY logical) FROM sharding.shards
         WHERE map = 'bank' AND logical IN (SELECT DISTINCT logical FROM sharding.move_journal WHERE job = $job)"),
	join(' ', map { my ($l, $m) = split /:/; my (undef, $to) = split />/, $m; "$l:$to" } split / /, $plan),
	'every planned shard is at its planned owner');
ok(followers_agree(), 'followers agree');
check_data('after the restart');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');
is($q->("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'sharding move launcher'"), '1',
	'the launcher runs after the restart');
ok(wait_for('coord', "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'sharding move worker'", '0', 20),
	'no move worker is left once the job is over');

# A move worker terminated mid-move.
# Held as above, on every node, until the worker is terminated.
@holds = map {
	my $h = $d->background_psql($_, on_error_stop => 1);
	$h->query_safe('BEGIN; LOCK TABLE accounts, events IN SHARE MODE');
	$h
} qw(n1 n2 n3);
my $j2 = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3'], max_parallel => 1)");
ok(held_in_flight($j2, @holds), 'a move of a second job is in flight: copying, a session of it waits for a held table');
# The move's session that waits: at the source, its CREATE PUBLICATION
# (the holds block it there, before any copy).
my $hold_pids = join(', ', map { $_->query_safe('SELECT pg_backend_pid()') } @holds);
my ($waiting, $waits_for) = split /\|/, $d->safe_psql('n1',
	"SELECT string_agg(pid::text, ', '), string_agg(datname || ': ' || left(query, 40), '; ')
	   FROM pg_stat_activity WHERE pg_blocking_pids(pid) && ARRAY[$hold_pids]");
note "waiting for the holds: $waits_for";
my $pid = $q->("SELECT pid FROM pg_stat_activity WHERE backend_type = 'sharding move worker'");
is($q->("SELECT pg_terminate_backend($pid)"), 't', "its worker (pid $pid) is terminated");
# Another worker rolls the move back. The holds block it too, at its
# delete of the rows copied to the destination; by then the dead worker's
# sessions at the nodes must be gone: one still waiting would run its
# statement once the holds go (a CREATE PUBLICATION committed after the
# rollback had dropped the publication, and the move's next try failed:
# 'publication "sharding_move_bank_3" already exists').
ok(wait_for('n1', "SELECT count(*) > 0 FROM pg_stat_activity
                    WHERE pg_blocking_pids(pid) && ARRAY[$hold_pids] AND pid NOT IN ($waiting)", 't', 60),
	'another worker rolls the interrupted move back (the holds block it too)');
is($d->safe_psql('n1', "SELECT count(*) FROM pg_stat_activity WHERE pid IN ($waiting)"), '0',
	"by then the dead worker's sessions that waited for the holds are gone ($waits_for)");
$_->quit for @holds;
is($q->("SELECT sharding.rebalance_wait($j2, '180 s')"), 'done', 'another worker took the job over: it ends done');
note $q->("SELECT move, logical, phase, coalesce(error, '') FROM sharding.move_journal WHERE job = $j2 ORDER BY move");
ok(followers_agree(), 'followers agree');
check_data('after the terminated worker');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

done_testing();
