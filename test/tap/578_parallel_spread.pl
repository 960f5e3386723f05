# Parallel moves spread over the nodes (docs/rebalance.md, Parallelism and
# limits; issue 38): of a job's queued moves, a runner claims first the one
# with the fewest of the job's moves in flight at its source or
# destination, in plan order among equals. Map bank: 4 shards on n1 and 4
# on n2; a job over n1..n4 with max_parallel 2 moves 2 shards of each
# source, into n3 and n4. The journal's plan order puts two moves out of
# the same source first (checked, so that the test shows the order is not
# the plan's); with both sources' tables held (SHARE mode: the moves' first
# statement there waits), the two moves in flight must share no node (one
# out of n1, one out of n2, into different destinations). Then the holds
# go: the job ends done, every row is where node_for says on every node
# (the counts of the start), nothing of the moves is left. The two moves
# flying together share no node but one host (this machine): the journal
# has both ends' host and CPUs, and each copies in its share of them.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;
use JobsCluster;

# cgroup_quota(pid): the CPUs the CPU quotas of pid's cgroups allow; 0 for none.
sub cgroup_quota
{
	my ($pid) = @_;
	my $read = sub {
		open(my $f, '<', $_[0]) or return undef;
		local $/;
		my $s = <$f>;
		close $f;
		return $s;
	};
	my $limit = 0;
	my $tighten = sub {
		my ($q, $p) = @_;
		return unless defined $q && defined $p;
		s/\s+$// for $q, $p;
		return unless $q =~ /^\d+$/ && $p =~ /^\d+$/ && $q > 0 && $p > 0;
		my $n = int(($q + $p - 1) / $p);
		$limit = $n if !$limit || $n < $limit;
	};
	my $cgroups = $read->("/proc/$pid/cgroup") // '';
	for my $line (split /\n/, $cgroups)
	{
		my ($id, $ctl, $path) = split /:/, $line, 3;
		next unless defined $path && $path =~ m{^/};
		my @at;
		(my $p = $path) =~ s{/+$}{};
		while (1) { push @at, $p; last if $p eq ''; $p =~ s{/[^/]*$}{}; }
		if ($id eq '0' && $ctl eq '')
		{
			for my $a (@at)
			{
				my $max = $read->("/sys/fs/cgroup$a/cpu.max");
				$tighten->(split ' ', $max) if defined $max;
			}
		}
		elsif (grep { $_ eq 'cpu' } split /,/, $ctl)
		{
			for my $mount ('/sys/fs/cgroup/cpu', '/sys/fs/cgroup/cpu,cpuacct')
			{
				$tighten->($read->("$mount$_/cpu.cfs_quota_us"), $read->("$mount$_/cpu.cfs_period_us")) for @at;
			}
		}
	}
	return $limit;
}

my ($c, $d) = jobs_cluster(rows => 4000, nodes => [qw(n1 n2 n3 n4)]);
my $q = sub { return $c->safe_psql('coord', $_[0]); };
is($d->safe_psql('n4', "SELECT count(*) FROM sharding.shards WHERE map = 'bank'"), '8', 'n4, a fourth data node, follows the map');

my @nodes = qw(n1 n2 n3 n4);
my $counts = sub {
	return join ' ', map { my $n = $_; $d->safe_psql($n, 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)') } @nodes;
};
my $total_before = 0;
$total_before += $_ for split / /, $counts->();
is($total_before, 8000, 'n1..n4 hold the 8,000 rows of both tables');

# The sources' tables held: each move's CREATE PUBLICATION at its source waits.
my %hold;
for my $n (qw(n1 n2))
{
	$hold{$n} = $d->background_psql($n, on_error_stop => 1);
	$hold{$n}->query_safe('BEGIN; LOCK TABLE accounts, events IN SHARE MODE');
}

# The runners log each move's steps (DEBUG1): a move copying while
# another is in flight on its host says how many sessions it copies in.
$q->("ALTER DATABASE coord SET log_min_messages = debug1");
my $log_from = -s $c->logfile;
my $job = $q->("SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2', 'n3', 'n4'], max_parallel => 2)");
my @plan = split / /, $q->("SELECT string_agg(source || '>' || destination, ' ' ORDER BY move) FROM sharding.move_journal WHERE job = $job");
note "plan order: @plan";
is(scalar(@plan), 4, 'the job plans 4 moves');
is(join(' ', sort map { (split />/)[0] } @plan), 'n1 n1 n2 n2', 'two moves out of n1, two out of n2');
is(join(' ', sort map { (split />/)[1] } @plan), 'n3 n3 n4 n4', 'two moves into n3, two into n4');
my %first = map { $_ => 1 } map { split />/ } @plan[0, 1];
ok(keys(%first) < 4, "the plan's first two moves share a node ($plan[0], $plan[1]): in plan order they would fly together");

# Both moves in flight, each waiting at its source.
my $blocked = "SELECT count(*) FROM pg_stat_activity WHERE query ~ '^CREATE PUBLICATION sharding_move_'
                AND datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0";
my ($flying, $waiting) = ('', 0);
my $deadline = time + 90;
while (time < $deadline)
{
	$flying = $q->("SELECT coalesce(string_agg(source || '>' || destination, ' ' ORDER BY move), '')
	                  FROM sharding.move_journal WHERE job = $job AND $IN_FLIGHT");
	$waiting = 0;
	$waiting += $d->safe_psql($_, $blocked) for qw(n1 n2);
	last if split(/ /, $flying) == 2 && $waiting == 2;
	usleep(100_000);
}
note "in flight: $flying; waiting at the sources: $waiting";
is(scalar(split / /, $flying), 2, 'two moves are in flight at once');
is($waiting, 2, 'each waits at its source for the held tables');
my %in = map { $_ => 1 } map { split />/ } split / /, $flying;
is(scalar(keys %in), 4, "the two moves in flight share no node ($flying)");
is($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND phase = 'queued'"), '2', 'the other two wait in the queue');

# Moves in flight on one host share its CPUs (docs/rebalance.md): each end
# of both moves said its host (the kernel's boot id) and CPUs (the
# backend's affinity, or fewer under a cgroup CPU quota) when the move
# started. Oracles, from the kernel's files for the data nodes' server
# (whose backends share its affinity and cgroups): the boot id, the CPUs
# of its Cpus_allowed_list (/proc/PID/status), and its cgroups' quota
# (cgroup v2 cpu.max "$MAX $PERIOD", v1 cpu.cfs_quota_us and
# cpu.cfs_period_us; its cgroup and the ancestors visible here; rounded
# up). Not nproc: a newer one applies the quota itself, rounded to the
# nearest CPU.
my $boot_id = slurp_file('/proc/sys/kernel/random/boot_id');
chomp $boot_id;
my ($allowed) = slurp_file("/proc/$d->{_pid}/status") =~ /^Cpus_allowed_list:\s*(\S+)/m;
my $nproc = 0;
for (split /,/, $allowed // '')
{
	my ($from, $to) = split /-/;
	$nproc += defined $to ? $to - $from + 1 : 1;
}
ok($nproc >= 1, "the server's Cpus_allowed_list (" . ($allowed // "missing") . ") names $nproc CPUs");
my $quota = cgroup_quota($d->{_pid});
note "boot id $boot_id, $nproc CPUs allowed, a cgroup quota of " . ($quota || 'none');
$nproc = $quota if $quota && $quota < $nproc;
is($q->("SELECT string_agg(source_host || '/' || source_cpus || ' ' || destination_host || '/' || destination_cpus, ' ; ' ORDER BY move)
           FROM sharding.move_journal WHERE job = $job AND $IN_FLIGHT"),
	"$boot_id/$nproc $boot_id/$nproc ; $boot_id/$nproc $boot_id/$nproc",
	'the journal has the host and CPUs of both ends of both moves in flight');

$hold{$_}->quit for qw(n1 n2);
is($q->("SELECT sharding.rebalance_wait($job, '180 s')"), 'done', 'the job ends done');
$q->("ALTER DATABASE coord RESET log_min_messages");
# The two moves share no node, so the node rule leaves each its
# sharding.move_parallel (2) sessions; on one host of $nproc CPUs each
# copies in its share of them: max(1, min(2, CPUs / 2)).
my $share = $nproc >= 4 ? 2 : 1;
my $log = substr(slurp_file($c->logfile), $log_from);
my @hosted = $log =~ /move sharding_move_(?:[0-9a-f]{6}_)?bank_\d+: (\d+ moves in flight on one host: the copy in \d+ of \d+ sessions)/g;
note 'on one host: ' . join('; ', @hosted);
ok((grep { $_ eq "2 moves in flight on one host: the copy in $share of 2 sessions" } @hosted) >= 2,
	"both moves flying together copied in their share of the host's CPUs ($share of 2 sessions)");
is((grep { !/^[12] moves/ } @hosted), 0, 'never more than max_parallel = 2 moves on the host');
is($q->("SELECT string_agg(node || ':' || n, ' ' ORDER BY node) FROM (SELECT node, count(*) n FROM sharding.shards WHERE map = 'bank' GROUP BY node) s"),
	'n1:2 n2:2 n3:2 n4:2', 'two shards on each node');
my $total_after = 0;
$total_after += $_ for split / /, $counts->();
is($total_after, $total_before, 'no row lost nor duplicated (n1..n4 hold the 8,000 rows)');
for my $n (@nodes)
{
	my $owned = $q->("SELECT coalesce(string_agg(logical::text, ','), '-1') FROM sharding.shards WHERE map = 'bank' AND node = '$n'");
	is($d->safe_psql($n, "SELECT (SELECT count(*) FROM accounts WHERE sharding.logical_shard('bank', tenant) NOT IN ($owned))
	                         + (SELECT count(*) FROM events WHERE sharding.logical_shard('bank', tenant) NOT IN ($owned))"),
		'0', "$n holds only rows of the shards it owns ($owned)");
	is($d->safe_psql($n, "SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
	                         || '/' || (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%' AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database()))
	                         || '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%' AND database = '$n')
	                         || '/' || (SELECT count(*) FROM sharding.frozen_shards)"),
		'0/0/0/0', "nothing of the moves is left at $n");
}

done_testing();
