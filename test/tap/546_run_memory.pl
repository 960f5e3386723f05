# CALL sharding.rebalance_run(job) keeps the memory of one move, not of
# every move of its job (docs/rebalance.md, Where jobs run): a
# procedure that commits between steps runs in SPI's procedure context
# ("SPI Proc"), which lives until it returns, so whatever a step allocates
# there (the tables a move describes, its filter's _key_text_sql call, the
# copies of errors a step swallows) would pile up move after move.
#
# The runner drains n1 (4 shard moves) of a map with pins (each shard move's
# filter leaves the pinned keys out, written by sharding._key_text_sql).
# Every move is held at its cutover by a fence at its source (the freeze
# waits for fenced writers), and the runner's memory contexts are logged
# there (pg_log_backend_memory_contexts): the same point of each move. From
# the second move on, the runner's memory must not grow with the number of
# moves done (before: about 60 KB more per move, one "SQL function" context
# of about 49 KB per table described with pins).
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

my ($c, $d) = jobs_cluster(rows => 2000, preload => 0);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

# Two tenants of n2 pinned where they are: the map has pins, and n1's shard
# moves leave them alone.
my @pinned = split /\n/, $q->("SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) s
                               WHERE sharding.node_for('bank', t) = 'n2' ORDER BY t LIMIT 2");
$q->("SELECT sharding.pin('bank', '$_', 'n2')") for @pinned;
ok(wait_for('n1', "SELECT count(*) FROM sharding.pins WHERE map = 'bank'", '2', 30), 'the followers know the pins');
my $job = $q->("SELECT sharding.drain_node('bank', 'n1')");
my @moves = split /\n/, $q->("SELECT move || '|' || logical FROM sharding.move_journal WHERE job = $job ORDER BY move");
is(scalar(@moves), 4, 'the job drains n1: 4 shard moves');

# One fence per move, each in a session of its own at the source (n1).
my @fences;
for my $m (@moves)
{
	my (undef, $l) = split /\|/, $m;
	my $b = $d->background_psql('n1');
	$b->query_safe('BEGIN');
	$b->query_safe("SELECT sharding.fence('bank', $l, sharding.epoch('bank', $l))");
	push @fences, $b;
}

my ($out, $err) = ('', '');
my $h = IPC::Run::start([ 'psql', '-XAtq', '-d', $c->connstr('coord') . ' application_name=run546',
	'-c', "CALL sharding.rebalance_run($job)" ], '>', \$out, '2>', \$err);

# dump(): the runner's memory contexts, logged and parsed: the grand total,
# "SPI Proc" with everything under it, and how many "SQL function"
# contexts there are.
sub dump_runner
{
	my $start = -s $c->logfile;
	is($q->("SELECT pg_log_backend_memory_contexts(pid) FROM pg_stat_activity WHERE application_name = 'run546'"),
		't', 'the runner logs its memory contexts');
	my $deadline = time + 60;
	my $log = '';
	while (time < $deadline)
	{
		$log = slurp_file($c->logfile, $start);
		last if $log =~ /Grand total: \d+ bytes/;
		usleep(100_000);
	}
	my %r = (grand => -1, sqlfn => 0, by => {});
	# Subtrees: "SPI Proc" (the procedure's memory) and CacheMemoryContext
	# (relcache entries, cached plans: rebuilt whenever a switch
	# invalidates them, at no fixed point of a move).
	my %root = ('SPI Proc' => 'spi', 'CacheMemoryContext' => 'caches');
	my %in;    # subtree => its root's level while inside it
	$r{$_} = 0 for values %root;
	for my $line (split /\n/, $log)
	{
		if ($line =~ /level: (\d+); ([^:]+): (\d+) total[^:]*(?:: (.*))?$/)
		{
			my ($level, $name, $total) = ($1, $2, $3);
			$r{by}{"$level $name" . (defined $4 ? ": $4" : '')} += $total;
			for my $k (keys %in) { delete $in{$k} if $level <= $in{$k}; }
			$in{ $root{$name} } //= $level if $root{$name};
			$r{$_} += $total for keys %in;
			$r{sqlfn}++ if $name eq 'SQL function';
		}
		elsif ($line =~ /level: (\d+); (\d+) more child contexts containing (\d+) total/)
		{
			# Past the 100 children the log shows of a parent: their sum,
			# at the parent's level.
			my ($level, $total) = ($1, $3);
			$r{by}{"children past the 100th of a context of level $level"} += $total;
			for my $k (keys %in) { delete $in{$k} if $level < $in{$k}; }
			$r{$_} += $total for keys %in;
		}
		if ($line =~ /Grand total: (\d+) bytes/) { $r{grand} = $1; last; }
	}
	$r{rest} = $r{grand} - $r{caches};
	return \%r;
}

my @dumps;
for my $i (0 .. $#moves)
{
	my ($mv) = split /\|/, $moves[$i];
	ok(wait_for('coord', "SELECT phase FROM sharding.move_journal WHERE move = $mv", 'cutover', 120),
		"move $mv is held at its cutover");
	push @dumps, dump_runner();
	note(sprintf("at the cutover of move %d (%d done): grand total %d, CacheMemoryContext and below %d, "
		  . "SPI Proc and below %d, %d 'SQL function' contexts",
		$i + 1, $i, $dumps[-1]{grand}, $dumps[-1]{caches}, $dumps[-1]{spi}, $dumps[-1]{sqlfn}));
	$fences[$i]->query_safe('ROLLBACK');
	$fences[$i]->quit;
}
$h->finish;
is($err, '', 'rebalance_run ended without error');
is($q->("SELECT state || ' ' || moves_done FROM sharding.rebalance_jobs WHERE job = $job"), 'done 4', 'the job is done');

# Each dump was read: a total and the procedure's SPI context were found.
ok(!grep({ $_->{grand} <= 0 || $_->{spi} <= 0 } @dumps),
	'each memory dump was found and parsed (grand total and SPI Proc above 0: ' . join(', ', map { "$_->{grand}/$_->{spi}" } @dumps) . ')');
# From the second move to the fourth (two moves later), at the same point.
cmp_ok($dumps[3]{spi} - $dumps[1]{spi}, '<=', 8192,
	"the procedure's memory (SPI Proc) does not grow with the moves done ($dumps[1]{spi} -> $dumps[3]{spi} bytes)");
cmp_ok($dumps[3]{rest} - $dumps[1]{rest}, '<=', 8192,
	"the runner's memory outside the caches does not grow with the moves done ($dumps[1]{rest} -> $dumps[3]{rest} bytes)");
is($dumps[3]{sqlfn}, $dumps[1]{sqlfn}, "no 'SQL function' context is left behind per move");
# What changed, for the log.
for my $k (sort keys %{ { %{ $dumps[1]{by} }, %{ $dumps[3]{by} } } })
{
	my ($x, $y) = ($dumps[1]{by}{$k} // 0, $dumps[3]{by}{$k} // 0);
	note("context $k: $x -> $y bytes") if $x != $y;
}
check_data('after the drain');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

done_testing();
