# Without shared_preload_libraries, one changed pin is applied in place in
# every other backend's routing cache (docs/directory.md, "When a change is
# seen"): the triggers log the changed keys in sharding.pin_log and a
# backend re-reads only those pins, where 1.3 rebuilt the whole map (every
# pin of it) in every backend after any change. Checked with the routing
# cache's counters (sharding._routing_cache_counts: builds, refreshes) and
# the answers of node_for in a second session, B, while session A (and C)
# change pins:
#   1. one pin, one unpin: B refreshes, never rebuilds, and answers right;
#   2. a pin committed after a later one (its log row has a lower seq than
#      a row B has already read): B still sees it;
#   3. pin_many of 2,000 keys (more than the log keeps one by one): B
#      rebuilds the map and answers right;
#   4. B's own pin rolled back: B answers as before;
#   5. the log trimmed past what B read (sharding.pin_log_keep): B rebuilds
#      and answers right; the log stays small.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

my $node = sharding_node('npp', preload => 0);
is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'), '', 'the cluster preloads nothing');
$node->safe_psql('postgres', q{
SELECT sharding.create_map('huge', 256, ARRAY['a', 'b', 'c']);
SELECT sharding.pin_many('huge', array_agg('w' || i), array_agg('p' || (i % 4))) FROM generate_series(1, 50000) i;
});
my %s = map { $_ => $node->background_psql('postgres') } 'A', 'B', 'C';
sub in { my ($who, $sql) = @_; return $s{$who}->query_safe($sql); }
# B's answer for a key, and its cache's counters {builds, refreshes}.
sub b_node { return in('B', "SELECT sharding.node_for('huge', '$_[0]')"); }
sub counts { my ($b, $r) = in('B', 'SELECT sharding._routing_cache_counts()') =~ /\{(\d+),(\d+)\}/; return ($b, $r); }
my $owner = sub { in('A', "SELECT node FROM sharding.shards WHERE map = 'huge' AND logical = sharding.shard_of('$_[0]', 256)") };

is(b_node('w7'), 'p3', 'B routes a pinned key');
my $k = 'k-new';
is(b_node($k), $owner->($k), 'B routes an unpinned key by its shard');
my ($b0, $r0) = counts();

# 1. One pin, then one unpin, in A.
in('A', "SELECT sharding.pin('huge', '$k', 'z1')");
is(b_node($k), 'z1', "1: B sees A's pin at its next call");
in('A', "SELECT sharding.unpin('huge', 'w7')");
is(b_node('w7'), $owner->('w7'), "1: and A's unpin");
my ($b1, $r1) = counts();
is($b1, $b0, '1: B rebuilt nothing (1.3 rebuilt the map, every pin of it, after each change)');
cmp_ok($r1, '>=', $r0 + 2, "1: B refreshed the map in place ($r0 -> $r1)");

# 2. A's pin takes its log row first but commits after C's, which B reads
# first: B's next read of the log must still find A's row.
# (Written directly: two pin() calls on one map take turns on its
# cluster_version row.)
in('A', "INSERT INTO sharding.nodes (node) VALUES ('z2'), ('z3')");
in('A', 'BEGIN');
in('A', "INSERT INTO sharding.pins VALUES ('huge', 'late-a', 'z2')");
# C pins another key and commits while A is open.
in('C', "INSERT INTO sharding.pins VALUES ('huge', 'early-c', 'z3')");
is(b_node('early-c'), 'z3', "2: B sees C's pin");
isnt(b_node('late-a'), 'z2', "2: not A's, not committed yet");
in('A', 'COMMIT');
is(b_node('late-a'), 'z2', "2: A's pin, committed after C's, is seen too");
my ($b2, $r2) = counts();
is($b2, $b0, '2: still no rebuild');

# 3. Many pins in one statement: the log says "every pin of the map".
in('A', q{SELECT sharding.pin_many('huge', array_agg('m' || i), array_agg('z4'::text)) FROM generate_series(1, 2000) i});
is(in('B', q{SELECT count(*) FROM generate_series(1, 2000) i WHERE sharding.node_for('huge', 'm' || i) = 'z4'}),
	'2000', '3: B sees all 2,000 keys pin_many pinned');
my ($b3, $r3) = counts();
is($b3, $b2 + 1, '3: by one rebuild of the map');

# 4. B's own pin, rolled back.
in('B', 'BEGIN');
in('B', "SELECT sharding.pin('huge', 'w8', 'z5')");
is(b_node('w8'), 'z5', '4: B sees its own pin in its transaction');
in('B', 'ROLLBACK');
is(b_node('w8'), 'p0', '4: and the old pin once it rolled back');

# 5. The log trimmed past B's cursor: B rebuilds, right.
my ($b4, $r4) = counts();
in('A', 'SET sharding.pin_log_keep = 16');
in('A', q{DO $$ BEGIN FOR i IN 1..4200 LOOP PERFORM sharding.pin('huge', 'trim' || i, 'z6'); COMMIT; END LOOP; END $$});
cmp_ok(in('A', 'SELECT count(*) FROM sharding.pin_log'), '<', 1000, '5: the log was trimmed (4,200 pins, each its own transaction)');
is(in('A', 'SELECT seq > 0 FROM sharding.pin_log_horizon'), 't', '5: its horizon moved');
is(in('B', q{SELECT count(*) FROM generate_series(1, 4200) i WHERE sharding.node_for('huge', 'trim' || i) = 'z6'}),
	'4200', '5: B sees every one of the 4,200 pins');
my ($b5, $r5) = counts();
is($b5, $b4 + 1, '5: by one rebuild (the rows it needed were trimmed)');
in('A', q{SELECT sharding.pin('huge', 'after-trim', 'z7')});
is(b_node('after-trim'), 'z7', '5: and refreshes in place again after it');
my ($b6, $r6) = counts();
is($b6, $b5, '5: without another rebuild');

$s{$_}->quit for keys %s;
done_testing();
