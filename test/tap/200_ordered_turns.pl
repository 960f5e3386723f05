# claim_ordered and claim_node(..., ordered => true): keys take turns, oldest
# head first, whatever the queue looks like (docs/ordered.md): a batch of b
# holds the b first heads in claim order among the keys that have a claimable
# head, also when the oldest jobs of the queue all belong to one key (a
# whale). Then several workers, each its own backend (the queue's position
# shared by them), claim and complete in turns, and every claim is checked
# against an oracle computed in SQL right before it; and workers whose claims
# interleave inside open transactions.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('n1');
my $db = 'postgres';
sub sql { return $node->safe_psql($db, $_[0]); }

# 5,000 jobs: the oldest 1,000 are the whale's, then 4,000 jobs of 500 keys
# (8 each, interleaved): the heads of the other keys are 1001 .. 1500.
sql(q{
SELECT sharding.create_queue('turns');
SELECT sharding.create_ordered_indexes('turns');
INSERT INTO turns (id, key, created)
SELECT g, CASE WHEN g <= 1000 THEN 'whale' ELSE 'k' || (g % 500) END,
       '2026-01-01'::timestamptz + g * interval '1 millisecond'
  FROM generate_series(1, 5000) g;
ANALYZE turns;
SELECT sharding.create_map('tm', 4, ARRAY['n1']);
});

is(sql("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'w1', 4)"),
	'1,1001,1002,1003', 'a first claim of 4: the whale\'s head and the heads 1001, 1002, 1003');
is(sql("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'w2', 4)"),
	'1004,1005,1006,1007', 'the next claim: the whale is in flight, the next four heads');
is(sql("SELECT string_agg(id::text, ',' ORDER BY id)
        FROM sharding.claim_node(NULL::turns, 'tm', 'n1', 'w3', 3, ordered => true)"),
	'1008,1009,1010', 'claim_node(ordered => true) takes the next heads in the same order');
sql("SELECT sharding.complete('turns', 1, 'w1')");
is(sql("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'w1', 3)"),
	'2,1011,1012', 'the whale\'s next job is the oldest head once its first is done');
is(sql("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'w2', 2,
        shards => ARRAY[0, 1, 2, 3], shard_count => 4)"),
	'1013,1014', 'claim_ordered with a shard filter covering every key: the next heads');

# Workers whose claims interleave in open transactions: each takes the
# first heads that no other transaction holds, in order.
my $a = $node->background_psql($db);
my $b = $node->background_psql($db);
$a->query_safe('BEGIN');
is($a->query_safe("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'wa', 3)"),
	'1015,1016,1017', 'worker a, in an open transaction: the next three heads');
$b->query_safe('BEGIN');
is($b->query_safe("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'wb', 3)"),
	'1018,1019,1020', 'worker b meanwhile: the three heads after the ones a holds');
$a->query_safe('ROLLBACK');
is(sql("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'w1', 4)"),
	'1015,1016,1017,1021', 'a rolled back: its heads are the oldest again, then the one after b\'s');
$b->query_safe('COMMIT');
is(sql("SELECT string_agg(id::text, ',' ORDER BY id) FROM sharding.claim_ordered(NULL::turns, 'w2', 2)"),
	'1022,1023', 'b committed: the claims go on past its heads');
$a->quit;
$b->quit;

# Many rounds by four workers, each its own backend, against an oracle:
# before each claim, the first b heads in claim order among the keys that
# have a claimable head (oldest pending job of its key, no job of the key
# processing under a live lease), computed in SQL. A bigger whale in front
# makes the walk past it cost, so the workers resume from the position
# between sweeps. Completions are random; new jobs arrive at the end.
sql(q{
TRUNCATE turns;
INSERT INTO turns (id, key, created)
SELECT g, CASE WHEN g <= 30000 THEN 'whale' ELSE 'k' || (g % 300) END,
       '2026-01-01'::timestamptz + g * interval '1 millisecond'
  FROM generate_series(1, 33000) g;
VACUUM ANALYZE turns;
CREATE FUNCTION oracle(b integer) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '') FROM (
        SELECT h.id FROM (SELECT DISTINCT ON (key) * FROM turns WHERE status = 'pending'
                          ORDER BY key, created, id) h
         WHERE NOT EXISTS (SELECT FROM turns p WHERE p.key = h.key AND p.status = 'processing'
                              AND p.claim_expires >= now())
         ORDER BY h.priority DESC, h.run_at, h.created, h.id LIMIT b) x
$$;
CREATE TABLE claims_log (worker int, batch int, expected text, got text);
});
# The claims' summaries (DEBUG1) tell sweeps from resumed claims.
$node->append_conf('postgresql.conf', 'log_min_messages = debug1');
$node->reload;
my $log_offset = -s $node->logfile;
my @w = map { $node->background_psql($db) } 0 .. 3;
my $mismatches = 0;
my $claims = 0;
my $next_id = 33001;
srand(27);
for my $round (1 .. 120)
{
	my $i = int(rand(4));
	my $batch = 1 + int(rand(12));
	# Nothing else runs between the oracle and the claim.
	my $expected = $w[$i]->query_safe("SELECT oracle($batch)");
	my $got = $w[$i]->query_safe("SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '')
		   FROM sharding.claim_ordered(NULL::turns, 'w$i', $batch)");
	$claims++;
	if ($expected ne $got)
	{
		$mismatches++;
		diag("round $round worker $i batch $batch: expected $expected, got $got");
	}
	# Complete some of what is in flight (any worker's), sometimes new jobs.
	sql("SELECT sharding.complete('turns', array_agg(id), owner) FROM
	     (SELECT id, owner FROM turns WHERE status = 'processing' AND random() < 0.6) x GROUP BY owner");
	if ($round % 20 == 0)
	{
		sql("INSERT INTO turns (id, key, created)
		   SELECT g, 'k' || (g % 350), now() FROM generate_series($next_id, $next_id + 99) g");
		$next_id += 100;
	}
}
$_->quit for @w;
is($mismatches, 0, "$claims claims by four workers each took exactly the first heads in claim order");
my $log = slurp_file($node->logfile, $log_offset);
my $resumed = () = $log =~ /ordered claim on turns: resume/g;
my $swept = () = $log =~ /ordered claim on turns: sweep/g;
cmp_ok($resumed, '>', 40, "resumed claims were among them ($resumed resumed, $swept swept)");
# (The four workers share the queue's position: a worker's first claim
# resumes from it, and claims sweep on the position's budget, or when its
# first claim finds none.)
cmp_ok($swept, '>=', 1, 'and sweeps');
# Per key, the jobs were claimed in order, one at a time.
is(sql("SELECT count(*) FROM turns t WHERE t.status IN ('processing', 'done')
        AND EXISTS (SELECT FROM turns o WHERE o.key = t.key AND o.status = 'pending'
                       AND (o.created, o.id) < (t.created, t.id))"),
	'0', 'no job was claimed while an older job of its key was pending');
cmp_ok(sql("SELECT count(*) FROM turns WHERE key = 'whale' AND status = 'done'"), '>', 5,
	'the whale made progress, one job at a time');
cmp_ok(sql("SELECT count(DISTINCT key) FROM turns WHERE key <> 'whale' AND status <> 'pending'"), '>', 100,
	'and so did the other keys');
done_testing();
