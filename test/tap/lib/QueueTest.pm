# Helpers of the concurrency tests of queues, ranks, fan-out counters and
# routing caches (test/tap/2xx_*.pl, 160, 340): a node whose database
# postgres has the extension and the queues a test names, and workers, each
# its own psql session (its own backend), that run at the same time.
package QueueTest;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ShardingNode;
use Time::HiRes qw(time);
use IPC::Run;
use Exporter 'import';

our @EXPORT = qw(queue_node start_workers finish_workers run_workers start_script);

# queue_node(NAME, QUEUE...): a started node (sharding_node) whose database
# postgres has the extension and a queue made by create_queue for each QUEUE.
sub queue_node
{
	my ($name, @queues) = @_;
	my $node = sharding_node($name);
	$node->safe_psql('postgres', join("\n", map { "SELECT sharding.create_queue('$_');" } @queues))
	  if @queues;
	return $node;
}

# start_workers(NODE, DB, SQL...): starts one background psql session per
# SQL script (sharding_start), all of them before any is waited for, so
# that they run concurrently. finish_workers(HANDLES...) waits for every one
# and returns the number that failed (non-zero exit status) and the list of
# [status, output, messages] of each.
sub start_workers
{
	my ($node, $db, @sql) = @_;
	return map { sharding_start($node, $db, $_) } @sql;
}

sub finish_workers
{
	my @results = map { [ sharding_finish($_) ] } @_;
	my $failed = grep { $_->[0] != 0 } @results;
	return ($failed, @results);
}

# run_workers(NODE, DB, SQL...): start_workers then finish_workers; returns
# the number that failed, the seconds they took together, and the results.
sub run_workers
{
	my ($node, $db, @sql) = @_;
	my $t0 = time;
	my ($failed, @results) = finish_workers(start_workers($node, $db, @sql));
	return ($failed, sprintf('%.1f', time - $t0), @results);
}

# start_script(NODE, DB, SQL): like sharding_start (psql -XAtq on SQL in the
# background, output and messages in files; sharding_finish waits for it)
# but without ON_ERROR_STOP: every statement runs, and those that fail
# leave their "psql:FILE:LINE: ERROR: ..." lines among the messages.
my $scripts = 0;
sub start_script
{
	my ($node, $db, $sql) = @_;
	my $base = PostgreSQL::Test::Utils::tempdir() . '/script' . ++$scripts;
	PostgreSQL::Test::Utils::append_to_file("$base.sql", $sql);
	local %ENV = $node->_get_env();
	my $h = IPC::Run::start(
		[ $node->installed_command('psql'), '-XAtq', '-d', $node->connstr($db), '-f', "$base.sql" ],
		'<', '/dev/null', '>', "$base.out", '2>', "$base.err");
	return { h => $h, base => $base };
}

1;
