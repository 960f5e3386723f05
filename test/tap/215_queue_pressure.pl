# Queue behaviour of docs/queue.md (run_at, priority, wake-ups, pressure)
# that needs more than one session:
#  - wakeups: one NOTIFY on sharding_<table> per transaction and channel,
#    payload the first claimable job's key, for INSERT, INSERT ... SELECT,
#    COPY, enqueue and enqueue_many; none for rows that are not claimable
#    or inserts rolled back;
#  - queue_health names a session holding a snapshot (pid, application
#    name) and forgets it once it ends;
#  - with the horizon pinned and thousands of dead entries at the front of
#    the pending index, a job that lands behind a worker's position (a
#    higher priority, a retry keeping its run_at) is still claimed soon, and
#    no claim takes more than its batch.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;

my $node = queue_node('queue_pressure', 'jobs', 'other');
sub sql { return $node->safe_psql('postgres', $_[0]); }

# 1-2. Wakeups, in one listening session (a session gets its own
# notifications, at the end of each transaction, as any listener does).
my ($rc, $out, $err) = $node->psql('postgres', <<'SQL', on_error_stop => 1);
LISTEN sharding_jobs;
LISTEN sharding_other;
BEGIN;
INSERT INTO jobs (key) VALUES ('a');
INSERT INTO jobs (key) VALUES ('b');
INSERT INTO other (key) VALUES ('o');
INSERT INTO other (key) VALUES ('p');
COMMIT;
INSERT INTO jobs (key) SELECT 'm' || g FROM generate_series(1, 3) g;
COPY jobs (key) FROM stdin;
c1
c2
\.
INSERT INTO jobs (key, status) VALUES ('finished', 'done');
INSERT INTO jobs (key, run_at) VALUES ('later', now() + interval '1 hour');
BEGIN;
INSERT INTO jobs (key) VALUES ('rolled back');
ROLLBACK;
BEGIN;
SAVEPOINT s;
INSERT INTO jobs (key) VALUES ('savepoint rolled back');
ROLLBACK TO SAVEPOINT s;
INSERT INTO jobs (key) VALUES ('after savepoint');
COMMIT;
SELECT sharding.enqueue_many('jobs', ARRAY['e1', 'e2']) IS NOT NULL;
SELECT sharding.enqueue('jobs', 'one') IS NOT NULL;
SQL
diag("the listening session failed: $err") if $rc != 0;
my $all = "$out\n$err";
my @got;
push @got, "$1:$2"
  while $all =~ /^Asynchronous notification "([^"]*)" with payload "([^"]*)" received from server process with PID \d+\.$/mg;
my $got = join(' ', @got);
is($got, 'sharding_jobs:a sharding_other:o sharding_jobs:m1 sharding_jobs:c1 sharding_jobs:after savepoint sharding_jobs:e1 sharding_jobs:one',
	'one NOTIFY per transaction and channel, payload the first claimable key, for INSERT, INSERT ... SELECT, COPY, enqueue_many, enqueue');
my $notifications = () = $all =~ /Asynchronous notification/g;
is($notifications, 7, 'none for done or future jobs, nor for inserts rolled back');

# 3-4. queue_health names the session holding the horizon.
my $h = $node->background_psql('postgres');
$h->query_safe("SET application_name = 'pin_holder'");
my $holder_pid = $h->query_safe('SELECT pg_backend_pid()');
$h->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$h->query_safe('SELECT count(*) > 0 FROM jobs');
Time::HiRes::usleep(1_100_000);
is(sql("SELECT horizon_holder = format('backend pid %s (application_name ''pin_holder'', idle in transaction)', $holder_pid)
          FROM sharding.queue_health('jobs')"), 't',
	'queue_health names the backend holding a snapshot: its pid and application name');
is(sql("SELECT xmin_horizon_age >= interval '1 second' FROM sharding.queue_health('jobs')"), 't',
	'xmin_horizon_age is the age of its transaction');

# 5-7. Claims behind the position, horizon still pinned by H. A worker
# session claims and completes 10,000 jobs, leaving 10,000 dead entries at
# the front of the pending index (so its sweeps are expensive and it
# resumes past its position), then keeps claiming while another session
# adds a priority job and retries a job it claimed (keeping its run_at,
# both behind the worker's position).
sql(q{
CREATE TABLE seen (claim integer, id bigint, key text, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE flag (step text);
INSERT INTO flag VALUES ('start');
INSERT INTO jobs (key, created) SELECT 'bulk-' || g, now() - interval '1 day' + g * interval '1 ms'
  FROM generate_series(1, 20000) g;
});
my ($worker) = start_workers($node, 'postgres', q{
DO $$
DECLARE
    ids bigint[];
    n integer := 0;
    big integer := 0;
BEGIN
    -- Make the dead entries (the horizon is pinned, so they stay).
    WHILE (SELECT count(*) FROM public.seen) < 10000 LOOP
        n := n + 1;
        WITH c AS (SELECT * FROM sharding.claim(NULL::public.jobs, 'worker', 100))
        INSERT INTO public.seen (claim, id, key) SELECT n, c.id, c.key FROM c;
        SELECT array_agg(id) INTO ids FROM public.seen WHERE claim = n;
        PERFORM sharding.complete('public.jobs', ids, 'worker');
        COMMIT;
    END LOOP;
    UPDATE public.flag SET step = 'primed';
    COMMIT;
    -- Keep claiming small batches until both late jobs are seen (at most
    -- 30 s or 4000 claims).
    FOR i IN 1 .. 4000 LOOP
        n := n + 1;
        WITH c AS (SELECT * FROM sharding.claim(NULL::public.jobs, 'worker', 5))
        INSERT INTO public.seen (claim, id, key) SELECT n, c.id, c.key FROM c;
        SELECT array_agg(id) INTO ids FROM public.seen WHERE claim = n;
        big := greatest(big, coalesce(cardinality(ids), 0));
        PERFORM sharding.complete('public.jobs', coalesce(ids, '{}'), 'worker');
        COMMIT;
        EXIT WHEN (SELECT count(*) FROM public.seen WHERE key IN ('vip', 'retried-late')) >= 2
               OR clock_timestamp() - (SELECT min(at) FROM public.seen WHERE claim > 0) > interval '60 seconds';
        PERFORM pg_sleep(0.002);
    END LOOP;
    UPDATE public.flag SET step = 'done ' || big;
    COMMIT;
END $$;
});
sharding_wait($node, 'postgres', "SELECT step <> 'start' FROM flag", 't', 120);
my $primed = sql("SELECT step = 'primed' FROM flag");
# The retried job: claimed by another worker, then failed with retry; it
# keeps its run_at and created, far behind the worker's position.
sql("INSERT INTO jobs (key, created, run_at) VALUES ('retried-late', now() - interval '2 days', now() - interval '2 days')");
sql("SELECT count(*) FROM sharding.claim(NULL::jobs, 'other-worker', 1)");
sql("SELECT sharding.fail('jobs', id, 'other-worker') FROM jobs WHERE key = 'retried-late'");
sql("INSERT INTO jobs (key, priority) VALUES ('vip', 9)");
my $injected = sql('SELECT clock_timestamp()');
sharding_wait($node, 'postgres', "SELECT step LIKE 'done%' FROM flag", 't', 90);
my ($worker_rc, undef, $worker_err) = sharding_finish($worker);
diag("the worker failed: $worker_err") if $worker_rc != 0;
is($primed, 't', 'the worker left 10,000 dead index entries with the horizon pinned');
is(sql("SELECT count(*) = 2 AND max(at) - '$injected'::timestamptz < interval '40 seconds' FROM seen WHERE key IN ('vip', 'retried-late')"), 't',
	"a priority job and a retried job behind the worker's position are claimed within seconds (here: under 40 s)");
is(sql("SELECT (SELECT step FROM flag) IN ('done 1', 'done 2', 'done 3', 'done 4', 'done 5')
          AND NOT EXISTS (SELECT FROM seen GROUP BY claim HAVING count(*) > 100)
          AND NOT EXISTS (SELECT FROM seen GROUP BY id HAVING count(*) > 1 AND min(key) <> 'retried-late')"), 't',
	'no claim took more than its batch, no job was claimed twice');

$h->query_safe('COMMIT');
$h->quit;
is(sql("SELECT horizon_holder IS DISTINCT FROM format('backend pid %s (application_name ''pin_holder'', idle in transaction)', $holder_pid)
          FROM sharding.queue_health('jobs')"), 't', 'once the transaction ends, queue_health no longer names it');
done_testing();
