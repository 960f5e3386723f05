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
use Exporter 'import';

our @EXPORT = qw(queue_node start_workers finish_workers run_workers start_script start_stuck_worker
  draining_worker timed_worker);

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

# start_stuck_worker(NODE, NAME, CLAIM, SECONDS): a worker session on
# database postgres (application_name NAME) that runs the query CLAIM, which
# returns the ids it claimed as one array, then sleeps SECONDS holding
# nothing but its leases (until killed). Returns its handle (for
# sharding_finish) and the ids, once it sleeps.
sub start_stuck_worker
{
	my ($node, $name, $claim, $seconds) = @_;
	my ($w) = start_workers($node, 'postgres', qq{
SET application_name = '$name';
$claim;
\\o /dev/null
SELECT pg_sleep($seconds);
});
	defined sharding_wait($node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = '$name' AND wait_event = 'PgSleep'", '1', 10)
	  or Test::More::diag("worker $name never reached its sleep ($ShardingNode::last_wait)");
	my ($ids) = split /\n/, PostgreSQL::Test::Utils::slurp_file("$w->{base}.out");
	return ($w, $ids);
}

# draining_worker(declare => ..., start => ..., claim => ..., complete => ...):
# the DO block of a worker that claims (CLAIM sets ids bigint[], NULL when
# nothing was claimed; COMMIT), completes the batch (COMPLETE; COMMIT), and
# stops once three claims in a row, 50 ms apart, found nothing. DECLARE adds
# variables, START runs first.
sub draining_worker
{
	my (%w) = @_;
	my $declare = $w{declare} // '';
	my $start = $w{start} // '';
	return qq{
DO \$\$
DECLARE
    ids bigint[];
    empty integer := 0;
    $declare
BEGIN
    $start
    LOOP
        $w{claim}
        COMMIT;
        IF ids IS NULL THEN
            empty := empty + 1;
            EXIT WHEN empty >= 3;
            PERFORM pg_sleep(0.05);
            CONTINUE;
        END IF;
        empty := 0;
        $w{complete}
        COMMIT;
    END LOOP;
END \$\$;
};
}

# timed_worker(worker => 'w text', batches => [[VAR, QUEUE, CLAIM], ...],
#              idle => SECONDS, busy => SQL):
# CREATE PROCEDURE work(<worker>, seconds integer): a worker that claims a
# batch of each QUEUE into VAR (bigint[], NULL when nothing was claimed) by
# CLAIM (a set-returning call over the queue's rows), commits, then
# completes those batches (complete(QUEUE, VAR, <worker's name>)) and claims
# the next ones in one transaction (commit), until the time is up or it
# claimed nothing and every QUEUE is drained (no job pending or
# processing). When it claimed nothing it sleeps IDLE seconds; otherwise it
# runs BUSY (PL/pgSQL statements), if given.
sub timed_worker
{
	my (%w) = @_;
	my ($who) = split ' ', $w{worker};
	my @b = @{ $w{batches} };
	my $declare = join('', map { "    $_->[0] bigint[];\n" } @b);
	my $complete = join('', map {
		"        IF $_->[0] IS NOT NULL THEN\n"
		  . "            PERFORM sharding.complete('$_->[1]', $_->[0], $who);\n"
		  . "        END IF;\n" } @b);
	my $claim = join('', map { "        SELECT array_agg(c.id) INTO $_->[0] FROM $_->[2] c;\n" } @b);
	my $nothing = join(' AND ', map { "$_->[0] IS NULL" } @b);
	my $drained = join("\n                  AND ",
		map { "NOT EXISTS (SELECT FROM $_->[1] WHERE status IN ('pending', 'processing'))" } @b);
	my $busy = defined $w{busy} ? "        ELSE\n            $w{busy}\n" : '';
	return qq{CREATE PROCEDURE work($w{worker}, seconds integer) LANGUAGE plpgsql AS \$\$
DECLARE
${declare}    t0 timestamptz := clock_timestamp();
BEGIN
    LOOP
${complete}${claim}        COMMIT;
        EXIT WHEN clock_timestamp() - t0 > seconds * interval '1 second';
        IF $nothing THEN
            EXIT WHEN $drained;
            PERFORM pg_sleep($w{idle});
${busy}        END IF;
    END LOOP;
END \$\$;
};
}

# start_script(NODE, DB, SQL): sharding_start without ON_ERROR_STOP (every
# statement runs; sharding_finish waits for it).
sub start_script
{
	my ($node, $db, $sql) = @_;
	return sharding_start($node, $db, $sql, on_error_stop => 0);
}

1;
