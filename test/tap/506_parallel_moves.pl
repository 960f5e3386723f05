# Parallel moves into one node (docs/rebalance.md, Parallelism and limits;
# issue 38): a job with max_parallel 2 moves the 4 shards of n1 to n2 under
# 4 writers. n1's tables are held (SHARE mode: reads go on, writes wait), so
# that the moves that start stay in flight: two moves into n2 must be in
# flight at once, each with a session of its own waiting at n1 (1.3 ran one
# move into a node at a time, per map, and the second waited "destination
# n2 is receiving move ..."). While both are held, one move's runner is
# terminated (pg_terminate_backend): the other goes on, the interrupted move
# is rolled back and carried out again. Then the holds go. The job ends
# done; the journal shows moves whose run times overlapped; sampled
# move_progress never shows more than 2 moves in flight nor two of one
# shard; the moves copying at once shared sharding.move_parallel's sessions
# (the runners' DEBUG lines); every row matches the writers' log at the node
# node_for names (counts and checksums per node); followers agree; nothing
# is left.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 20000);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

my $plan = $q->("SELECT string_agg(logical || ':' || from_node || '>' || to_node, ' ' ORDER BY logical)
                 FROM sharding.rebalance('bank', ARRAY['n2'], dry_run => true)");
note "plan: $plan";
is(scalar(() = $plan =~ /n1>n2/g), 4, 'the plan moves the 4 shards of n1 to n2');
my $epochs0 = $q->("SELECT string_agg(logical || '\@' || epoch, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'");

my $writers = start_writers(4);
sleep 1;

# The source's tables held (SHARE mode: reads go on, writes wait) until two
# moves are seen in flight: each move's first statement at n1 that takes
# them, its CREATE PUBLICATION, waits, before its replication slot exists.
# (A hold at n2 would not do: n1 and n2 share an instance, and a logical
# slot is created only once every transaction with an xid there has ended,
# the first move's clean-up of n2, held too, among them.)
my $hold = $d->background_psql('n1', on_error_stop => 1);
$hold->query_safe('BEGIN; LOCK TABLE accounts, events IN SHARE MODE');
my $hold_pid = $hold->query_safe('SELECT pg_backend_pid()');

# The runners log each move's steps (DEBUG1): a move copying while another
# is in flight at its nodes says how many share the copy's sessions.
$q->("ALTER DATABASE coord SET log_min_messages = debug1");
my $log_from = -s $c->logfile;
my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n2'], max_parallel => 2)");
my $sampler = start_sampler($job,
	'in_flight integer' => "count(*) FILTER (WHERE $IN_FLIGHT)",
	'shards integer' => "count(DISTINCT logical) FILTER (WHERE $IN_FLIGHT)");

# The moves' sessions at n1 blocked by the hold.
my $blocked = "SELECT coalesce(string_agg(substring(query FROM 'sharding_move_[0-9a-f]{6}_bank_[0-9]+'), ' ' ORDER BY query), '')
                 FROM pg_stat_activity WHERE query ~ '^CREATE PUBLICATION sharding_move_[0-9a-f]{6}_bank_'
                  AND pg_blocking_pids(pid) && ARRAY[$hold_pid]";
# Two moves held in flight, or the job says a move waits for another into
# n2 (1.3's limit): whichever comes first.
my ($flying, $held, $why) = (0, '', '');
my $deadline = time + 90;
while (time < $deadline)
{
	$flying = $q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND $IN_FLIGHT AND destination = 'n2'");
	$held = $d->safe_psql('n1', $blocked);
	$why = $q->("SELECT coalesce(waiting, '') FROM sharding.move_jobs WHERE job = $job");
	last if ($flying == 2 && split(/ /, $held) == 2) || $why =~ /receiving/;
	usleep(100_000);
}
note "in flight: $flying, held at n1: $held, waiting: $why";
is($flying, '2', 'two moves into n2 are in flight at once (journal)');
is(scalar(split(/ /, $held)), 2, 'each of them has a session of its own at n1, waiting for the held tables');
unlike($why, qr/one move into a node at a time/, 'no move waits for another move into the same node');

# The fault: one move's runner terminated while both are in flight.
my ($victim, $vlogical, $vpid, $survivor, $slogical) = split /\|/, $q->(
	"SELECT a.move || '|' || a.logical || '|' || a.pid || '|' || b.move || '|' || b.logical
	   FROM sharding.move_journal a, sharding.move_journal b
	  WHERE a.job = $job AND b.job = $job AND a.$IN_FLIGHT AND b.$IN_FLIGHT AND a.move < b.move");
if ($flying == 2)
{
	is($q->("SELECT pg_terminate_backend($vpid)"), 't', "the runner of move $victim (pid $vpid) is terminated");
	ok(wait_for('coord', "SELECT count(*) FROM pg_stat_activity WHERE pid = $vpid", '0', 30),
		'the terminated runner is gone');
	# Another runner rolls the interrupted move back: the dead runner's
	# session waiting at n1 must be gone before the hold goes (it would
	# create its publication then), the other move's still waits.
	# (Membership, not the whole list: once the interrupted move is rolled
	# back the job starts its next move at once, max_parallel being 2, and
	# that one waits for the hold too.)
	my $gone = "SELECT (' ' || ($blocked) || ' ') !~ ' sharding_move_[0-9a-f]{6}_bank_$vlogical '
	                   AND (' ' || ($blocked) || ' ') ~ ' sharding_move_[0-9a-f]{6}_bank_$slogical '";
	ok(wait_for('n1', $gone, 't', 60),
		"the interrupted move's session at n1 is gone, the other move ($survivor) still waits");
	is($q->("SELECT phase FROM sharding.move_journal WHERE move = $survivor"), 'copying',
		"the other move ($survivor) is still in flight");
}
usleep(300_000);
$hold->quit;

is($q->("SELECT sharding.rebalance_wait($job, '240 s')"), 'done', 'the job ends done');
is(finish_sampler($sampler), '', 'the sampler ran without error');
$q->("ALTER DATABASE coord RESET log_min_messages");
# Parallel moves share sharding.move_parallel's sessions (docs/rebalance.md):
# the moves held at n1 copy together once the hold goes, each seeing the
# other in flight, and never more than max_parallel of them.
my $log = substr(slurp_file($c->logfile), $log_from);
my @shares = $log =~ /move sharding_move_(?:[0-9a-f]{6}_)?bank_\d+: (\d+) moves in flight share the copy's sessions/g;
note 'shares: ' . join(' ', @shares);
ok((grep { $_ == 2 } @shares) > 0, "a move copied while another was in flight at its nodes, with its share of the sessions");
is((grep { $_ > 2 } @shares), 0, 'never more than max_parallel = 2 moves shared them');
note $q->("SELECT move, logical, source || '>' || destination, phase, started, finished, coalesce(error, '')
             FROM sharding.move_journal WHERE job = $job ORDER BY move");
sleep 1;
is(stop_writers($writers), '', 'four writers ran to the end without error');

# Overlap from the journal's timestamps: the most moves of the job whose
# [started, finished] intervals share an instant.
is($q->("SELECT max(n) FROM (SELECT (SELECT count(*) FROM sharding.move_journal b
                                      WHERE b.job = $job AND b.started <= a.started AND b.finished > a.started) AS n
                               FROM sharding.move_journal a WHERE a.job = $job AND a.started IS NOT NULL) x"),
	'2', 'the journal shows two moves into n2 running at the same time (never more than 2)');
is($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND phase = 'failed'
            AND error LIKE 'interrupted in phase %, rolled back'"),
	$flying == 2 ? '1' : '0', 'the interrupted move was rolled back (failed, interrupted)');
is($q->("SELECT count(DISTINCT logical) FROM sharding.move_journal WHERE job = $job AND phase = 'done'"),
	'4', 'each of the 4 shards was moved once (the interrupted one again)');

my $samples = $q->("SELECT count(*) || ' ' || coalesce(max(in_flight), -1) || ' ' || count(*) FILTER (WHERE in_flight <> shards) FROM samples");
my ($n_samples, $max_in_flight, $dup_shard) = split / /, $samples;
ok($max_in_flight <= 2, "never more than max_parallel = 2 moves in flight ($n_samples samples, at most $max_in_flight)");
is($dup_shard, '0', 'never two moves of one shard in flight');

is($q->("SELECT string_agg(node, ',' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'"),
	join(',', ('n2') x 8), 'n2 owns every shard');
my %moved = map { (split /:/)[0] => 1 } split / /, $plan;
my $want_epochs = join ' ', map { my ($l, $e) = split /\@/; "$l\@" . ($e + ($moved{$l} ? 1 : 0)) } split / /, $epochs0;
is($q->("SELECT string_agg(logical || '\@' || epoch, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'"),
	$want_epochs, 'epochs rose by exactly one per moved shard');
ok(followers_agree(), 'every follower shows the new owners and epochs');

my ($committed, $anomalies) = split / /,
  $q->("SELECT sum(committed) || ' ' || coalesce(sum(cardinality(anomalies)), 0) FROM writer_stats");
ok($committed > 100, "the writers kept writing during the job ($committed operations)");
is($anomalies, '0', 'every update and delete found its row where node_for said');
check_data('after the parallel moves');
is($d->safe_psql('n1', 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)'), '0',
	'n1 holds no row any more');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'no replication object, trigger, frozen shard or live move is left');

done_testing();
