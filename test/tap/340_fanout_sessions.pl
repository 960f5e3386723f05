# Fan-out counters live in shared memory: what one session counts, every
# session sees; concurrent sessions lose no count; a reset in one session is
# seen by the others. The node preloads sharding.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;

my $node = queue_node('fanout_sessions');
sub sql { return $node->safe_psql('postgres', $_[0]); }
sql(q{
SELECT sharding.create_map('m', 16, ARRAY['n1', 'n2']);
CREATE TABLE accounts (id bigint PRIMARY KEY, tenant text NOT NULL, balance integer NOT NULL DEFAULT 0);
ALTER TABLE accounts REPLICA IDENTITY FULL;
SELECT sharding.distribute('accounts', 'tenant', 'm');
INSERT INTO accounts SELECT i, 'tenant-' || (i % 100), 0 FROM generate_series(1, 1000) AS i;
SELECT sharding.fanout_reset();
});
my $counts_sql = "SELECT queries || '|' || single_shard || '|' || fan_out FROM sharding.fanout_stats WHERE table_name = 'accounts'";
sub counts { return sql($counts_sql); }

my $a = $node->background_psql('postgres');
my $b = $node->background_psql('postgres');
is(counts(), '0|0|0', 'after a reset, the table is listed with zeros');

$a->query_safe("SELECT count(*) FROM accounts WHERE tenant = 'tenant-7'");
$a->query_safe('SELECT count(*) FROM accounts');
is($b->query_safe($counts_sql), '2|1|1', 'session B sees the statements session A ran');

# An open transaction does not hide counts: they are not transactional.
$a->query_safe('BEGIN');
$a->query_safe("UPDATE accounts SET balance = balance + 1 WHERE tenant = 'tenant-8'");
is(counts(), '3|2|1', 'a statement of an uncommitted transaction is counted at once');
$a->query_safe('ROLLBACK');

# Concurrency: 6 clients, 300 single-key statements and 20 scans each, at
# once. Every one is counted.
my ($failed, $seconds, @results) = run_workers($node, 'postgres', map { qq{DO \$\$
        BEGIN
            FOR i IN 1..300 LOOP
                PERFORM balance FROM accounts WHERE tenant = 'tenant-' || ((i * $_) % 100);
            END LOOP;
            FOR i IN 1..20 LOOP
                PERFORM count(*) FROM accounts WHERE balance >= 0;
            END LOOP;
        END \$\$;} } 1 .. 6);
diag($_->[2]) for grep { $_->[0] != 0 } @results;
is($failed, 0, "6 concurrent clients ran (${seconds}s)");
is(counts(), (3 + 6 * 320) . '|' . (2 + 6 * 300) . '|' . (1 + 6 * 20),
	'every one of 1,920 concurrent statements counted exactly once (1,800 single-shard, 120 fan-out)');

# A reset in B: A sees zeros and a new since.
my $before = $a->query_safe("SELECT since FROM sharding.fanout_stats WHERE table_name = 'accounts'");
$b->query_safe('SELECT sharding.fanout_reset()');
is($a->query_safe($counts_sql), '0|0|0', 'a reset in session B zeroes what session A sees');
is($a->query_safe("SELECT since > '$before'::timestamptz AND since <= now() FROM sharding.fanout_stats WHERE table_name = 'accounts'"),
	't', 'since moves to the reset');
$a->quit;
$b->quit;
done_testing();
