# The turn of a shared position (docs/ordered.md, "Positions are shared,
# claims take turns") under faults: a claim that holds the turn and is
# cancelled, terminated or killed (kill -9) leaves it free for the next
# claim; a claim that finds the turn held longer than 1 s claims from a copy
# of the position instead of waiting on. A claim made slow by a row level
# security policy that sleeps holds the turn (its rounds run under it).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;
use Time::HiRes qw(time usleep);

# (restart_after_crash: the harness turns it off; the kill -9 below wants it.)
my $node = sharding_node('ordered_turn_faults', conf => "log_min_messages = debug1\nrestart_after_crash = on");
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{
SELECT sharding.create_queue('jobs');
SELECT sharding.create_ordered_indexes('jobs');
INSERT INTO jobs (id, key, created)
SELECT g, 'k' || g, '2026-01-01'::timestamptz + g * interval '1 millisecond' FROM generate_series(1, 1000) g;
CREATE TABLE ctl (hold boolean NOT NULL);
INSERT INTO ctl VALUES (false);
-- Sleeps once per statement while ctl says so (a policy of the slow role).
CREATE FUNCTION held() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT hold FROM public.ctl) AND current_setting('turn.slept', true) IS DISTINCT FROM 'yes' THEN
        PERFORM set_config('turn.slept', 'yes', true);
        PERFORM pg_sleep(60);
    END IF;
    RETURN true;
END $$;
CREATE ROLE slow;
GRANT SELECT, UPDATE ON jobs TO slow;
GRANT SELECT ON ctl TO slow;
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY slow_only ON jobs TO slow USING (public.held());
UPDATE ctl SET hold = true;
});

# Starts a claim by the slow role that sleeps holding the turn; returns its
# handle and backend pid once it sleeps.
my $n = 0;
sub start_holder
{
	$n++;
	my $h = start_script($node, 'postgres', "SET application_name = 'holder$n'; SET ROLE slow;
		SELECT count(*) FROM sharding.claim_ordered(NULL::jobs, 'slow$n', 5);");
	defined sharding_wait($node, 'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'holder$n' AND wait_event = 'PgSleep'", '1', 30)
	  or diag("holder$n never slept ($ShardingNode::last_wait)");
	return ($h, sql("SELECT pid FROM pg_stat_activity WHERE application_name = 'holder$n'"));
}

# One claim of a superuser (no policy: the fast test) on the same position:
# (rows, its DEBUG1 summary's turn part, seconds).
sub claim_now
{
	my ($worker) = @_;
	my $offset = -s $node->logfile;
	my $t0 = time;
	my $got = sql("SELECT count(*) FROM sharding.claim_ordered(NULL::jobs, '$worker', 1)");
	my $took = time - $t0;
	my $log = slurp_file($node->logfile, $offset);
	my ($turn) = $log =~ /ordered claim on jobs: .*; turn ([^\n]*)/;
	return ($got, $turn // 'no summary', $took);
}

my ($h, $pid) = start_holder();
my ($got, $turn, $took) = claim_now('w1');
is($got, '1', 'a claim while another holds the turn still claims');
like($turn, qr/^not held \(a copy\): waited \d+ us/, "it waited, then claimed from a copy ($turn)");
cmp_ok($took, '>=', 0.9, sprintf('it waited about the 1 s limit (%.2f s)', $took));

is(sql("SELECT pg_cancel_backend($pid)"), 't', 'the holder is cancelled');
my ($status, $out, $err) = sharding_finish($h);
like($err, qr/canceling statement/, 'its claim failed');
($got, $turn, $took) = claim_now('w2');
is($got, '1', 'the next claim claims');
like($turn, qr/^held: waited \d+ us/, "and holds the turn: the cancelled claim gave it up ($turn)");

($h, $pid) = start_holder();
is(sql("SELECT pg_terminate_backend($pid)"), 't', 'a second holder is terminated');
sharding_finish($h);
defined sharding_wait($node, 'postgres', "SELECT count(*) FROM pg_stat_activity WHERE pid = $pid", '0', 30)
  or diag("the terminated holder lingers ($ShardingNode::last_wait)");
($got, $turn, $took) = claim_now('w3');
is($got, '1', 'after the termination the next claim claims');
like($turn, qr/^held: waited \d+ us/, "and holds the turn ($turn)");

# A claim that fails inside a savepoint (statement_timeout, while it
# sleeps holding the turn) gives the turn up with its subtransaction, while
# its transaction goes on.
my $s = $node->background_psql('postgres', on_error_stop => 0);
$s->query_safe("SET application_name = 'holder_sp'");
$s->query_safe('SET ROLE slow');
$s->query_safe('BEGIN');
$s->query_safe('SAVEPOINT a');
$s->query_safe("SET statement_timeout = '3s'");
$s->query("SELECT count(*) FROM sharding.claim_ordered(NULL::jobs, 'sp', 1)");
like($s->{stderr}, qr/canceling statement due to statement timeout/, 'a claim inside a savepoint timed out holding the turn');
($got, $turn, $took) = claim_now('w4');
like($turn, qr/^held: waited \d+ us/, "the next claim holds the turn while that transaction is still open ($turn)");
$s->query('ROLLBACK TO SAVEPOINT a');
$s->query('COMMIT');
$s->quit;

# kill -9 of the holder: the server restarts, shared memory with it.
($h, $pid) = start_holder();
kill 'KILL', $pid;
sharding_finish($h);
my $up = 0;
for (1 .. 600)
{
	$up = eval { $node->safe_psql('postgres', 'SELECT 1') eq '1' };
	last if $up;
	usleep(100_000);
}
ok($up, 'the server restarted after the kill -9');
($got, $turn, $took) = claim_now('w5');
is($got, '1', 'after a kill -9 of the holder and the restart, claims claim');
like($turn, qr/^held: waited \d+ us/, "and hold the turn ($turn)");

# Never two jobs of one key in flight, whatever happened.
is(sql("SELECT count(*) FROM (SELECT key FROM jobs WHERE status = 'processing' GROUP BY key HAVING count(*) > 1) x"),
	'0', 'one job per key in flight');
done_testing();
