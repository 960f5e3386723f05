# Two sessions, one routing cache each: a change committed in one session is
# seen by the other's very next node_for / logical_shard call, whatever made
# the change (functions, direct writes, drop and re-create), and an
# uncommitted change is not.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;

my $node = queue_node('maps_cache');
sub sql { return $node->safe_psql('postgres', $_[0]); }
sql("SELECT sharding.create_map('m', 64, ARRAY['n1', 'n2', 'n3', 'n4'])");

# Sessions A and B, each its own backend. sqlstate_of (ShardingNode's
# $SQLSTATE_OF) lets A see an error's SQLSTATE from inside its session.
sql($SQLSTATE_OF);
my %s = map { $_ => $node->background_psql('postgres') } 'A', 'B';
sub run { return $s{ $_[0] }->query_safe($_[1]); }
# Owner of key k's logical shard, straight from the table (no cache).
sub owner { return sql("SELECT node FROM sharding.shards WHERE map = 'm' AND logical = sharding.shard_of('$_[0]', 64)"); }

my $apid = run('A', 'SELECT pg_backend_pid()');
my $bpid = run('B', 'SELECT pg_backend_pid()');
ok($apid ne $bpid && $apid =~ /^\d+$/, "two distinct backends ($apid, $bpid)");

# Warm A's cache.
is(run('A', "SELECT sharding.node_for('m', 'whale')"), owner('whale'), 'A routes from a warm cache');

run('B', "SELECT sharding.pin('m', 'whale', 'dedicated')");
is(run('A', "SELECT sharding.node_for('m', 'whale')"), 'dedicated', "A sees B's committed pin on its next call");

# Uncommitted changes stay invisible; the commit makes them visible.
run('B', "BEGIN; SELECT sharding.unpin('m', 'whale')");
is(run('A', "SELECT sharding.node_for('m', 'whale')"), 'dedicated', "A does not see B's uncommitted unpin");
run('B', 'COMMIT');
is(run('A', "SELECT sharding.node_for('m', 'whale')"), owner('whale'), 'A sees the unpin once committed');

# A move, seen even inside A's open REPEATABLE READ transaction.
my $shard = sql("SELECT sharding.shard_of('k7', 64)");
run('A', 'BEGIN ISOLATION LEVEL REPEATABLE READ');
my $before = run('A', "SELECT sharding.node_for('m', 'k7')");
run('B', "SELECT sharding.move_shard('m', $shard, 'moved-here')");
is(run('A', "SELECT sharding.node_for('m', 'k7')"), 'moved-here',
	"A sees B's move on its next statement, inside an open transaction (was $before)");
run('A', 'COMMIT');

# A direct write to the config table by an admin invalidates as well.
run('B', "UPDATE sharding.shards SET node = 'n1' WHERE map = 'm' AND logical = $shard");
is(run('A', "SELECT sharding.node_for('m', 'k7')"), 'n1', 'A sees a direct UPDATE of sharding.shards');

# Rebalance onto five nodes: A agrees with the table for many keys.
run('B', "SELECT count(*) FROM sharding.rebalance('m', ARRAY['n1', 'n2', 'n3', 'n4', 'n5'])");
is(run('A', "SELECT count(*) FROM generate_series(1, 5000) AS i
    WHERE sharding.node_for('m', i) <> (SELECT node FROM sharding.shards
                                         WHERE map = 'm' AND logical = sharding.shard_of(i, 64))"),
	'0', 'A routes 5000 keys as the rebalanced table says');

# Drop: A gets 42704 (undefined_object); re-create with another shape: A sees the new shape.
run('B', "SELECT sharding.drop_map('m')");
is(run('A', "SELECT sqlstate_of(\$\$SELECT sharding.node_for('m', 'k7')\$\$)"), '42704', 'A gets 42704 once the map is dropped');
run('B', "SELECT sharding.create_map('m', 8, ARRAY['solo'])");
is(run('A', "SELECT sharding.node_for('m', 'k7') || ' ' || sharding.logical_shard('m', 'k7')"),
	'solo ' . sql("SELECT sharding.shard_of('k7', 8)"), "A sees the re-created map's nodes and shard count");

# A rolled-back change in B never reaches A.
run('B', "BEGIN; SELECT sharding.pin('m', 'k7', 'ghost'); ROLLBACK");
is(run('A', "SELECT sharding.node_for('m', 'k7')"), 'solo', 'a rolled-back pin is never seen');

# Many calls after warm-up do not re-read the tables: the cache is only
# rebuilt on invalidation (seq_scan + idx_scan counters stay put).
run('A', "SELECT sharding.node_for('m', 'warm')");
sub reads
{
	return sql("SELECT sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)) FROM pg_stat_all_tables
                 WHERE schemaname = 'sharding' AND relname IN ('maps', 'shards', 'pins')");
}
run('A', 'SELECT pg_stat_force_next_flush()');
Time::HiRes::usleep(1_200_000);
my $r0 = reads();
run('A', "SELECT count(sharding.node_for('m', i)) FROM generate_series(1, 20000) AS i; SELECT pg_stat_force_next_flush()");
Time::HiRes::usleep(1_200_000);
my $r1 = reads();
is($r1 - $r0, 0, '20000 cached calls read the config tables 0 times');
$_->quit for values %s;
done_testing();
