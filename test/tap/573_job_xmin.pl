# A job's worker does not hold the coordinator's xmin for the length of a
# move (issue 35, review RB-10). A drain job's move is held in its copy by
# a session at the destination holding accounts in SHARE mode; meanwhile
# on the coordinator every row of a table is updated and the table
# vacuumed: the worker shows no backend_xmin, and VACUUM removes every
# dead row version (none "dead but not yet removable"). The job then
# completes: every row at n2, exactly once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 20);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
$coord->safe_psql('coord', 'CREATE TABLE churn (id int PRIMARY KEY, v int); INSERT INTO churn SELECT i, 0 FROM generate_series(1, 1000) i');

my $h = hold_table($b, 'n2', 'accounts');
# n1 drained to n2, a job: a worker carries out its moves one at a time.
my $job = $coord->safe_psql('coord', "SELECT sharding.drain_node('bank', 'n1')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name LIKE 'sharding_move_%' "
	  . "AND wait_event_type = 'Lock'", 't', 120), 'a job\'s move held in its copy');
my $worker = "application_name = 'sharding move worker' AND query LIKE '%_job_execute%'";
is($coord->safe_psql('coord', "SELECT count(*) FROM pg_stat_activity WHERE $worker"), '1', 'its worker runs _job_execute');

$coord->safe_psql('coord', 'UPDATE churn SET v = v + 1');
is($coord->safe_psql('coord', "SELECT count(*) FILTER (WHERE backend_xmin IS NOT NULL) FROM pg_stat_activity WHERE $worker"), '0',
	'the worker holds no xmin while its move waits');
my ($rc, $out, $err) = $coord->psql('coord', 'VACUUM (VERBOSE) churn');
my ($kept) = $err =~ /(\d+) are dead but not yet removable/;
is($kept, '0', 'VACUUM removes every dead row version of a table updated during the move') or diag($err);

release_table($b, 'n2', $h);
is($coord->safe_psql('coord', "SELECT sharding.rebalance_wait($job, '120s')"), 'done', 'the job completes');
is($coord->safe_psql('coord', "SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'") . ' '
  . $a->safe_psql('n1', 'SELECT count(*) FROM accounts') . ' ' . $b->safe_psql('n2', 'SELECT count(*) FROM accounts'),
	'0 0 1280', 'n1 is drained: every row at n2 exactly once');
is(leftovers($coord, $a, $b), $clean, 'nothing of the moves is left');

done_testing();
