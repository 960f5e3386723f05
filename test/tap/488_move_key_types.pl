# Keys of a map whose distributed key column is not text (docs/moves.md):
# isolate and _move_enqueue take the key as text, but its logical shard is
# that of the key column's type, as writers route it (sharding._key_type),
# not that of the key's text form.
#
# Map 'ids' (8 shards over n1 and n2) distributes items by a bigint column
# k. The key K is owned by n1 while its text form hashes into a shard of
# n2, so a shard computed from the text would name the wrong source:
#   1. _move_enqueue of K with the shard of its bigint value is accepted
#      (drain_node enqueues pinned keys so);
#   2. isolate moves K's rows from n1 to n2 and pins K there; the journal
#      names K's bigint shard; nothing of the move is left.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
my $table = 'CREATE TABLE items (id bigint PRIMARY KEY, k bigint NOT NULL, val text) ; ALTER TABLE items REPLICA IDENTITY FULL';
$_->[0]->safe_psql($_->[1], $table) for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
$coord->safe_psql('coord', q{
	SELECT sharding.create_map('ids', 8, ARRAY['n1', 'n2']);
	SELECT sharding.distribute('items', 'k', 'ids');
});
wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables WHERE map = 'ids'", '1')
  for ([$a, 'n1'], [$b, 'n2']);
my $gen = 'SELECT i AS id, i % 200 AS k, \'v\' || i AS val FROM generate_series(1, 2000) i';
$a->safe_psql('n1', "INSERT INTO items SELECT * FROM ($gen) g WHERE sharding.node_for('ids', g.k) = 'n1'");
$b->safe_psql('n2', "INSERT INTO items SELECT * FROM ($gen) g WHERE sharding.node_for('ids', g.k) = 'n2'");

my ($K, $L, $Ltext) = split /\|/, $coord->safe_psql('coord', q{
	SELECT k || '|' || sharding.logical_shard('ids', k) || '|' || sharding.logical_shard('ids', k::text)
	FROM generate_series(0, 199::bigint) k
	WHERE sharding.node_for('ids', k) = 'n1'
	  AND (SELECT s.node FROM sharding.shards s WHERE s.map = 'ids' AND s.logical = sharding.logical_shard('ids', k::text)) = 'n2'
	ORDER BY k LIMIT 1});
ok(defined $Ltext, "key $K: shard $L (n1) as a bigint, shard $Ltext (n2) as text");
my $rows = $a->safe_psql('n1', "SELECT count(*) FROM items WHERE k = $K");
is($rows, '10', "n1 holds the $rows rows of key $K");

# ------------------------------------------------------------------ 1. _move_enqueue
my ($rc, $move, $err) = $coord->psql('coord', "SELECT sharding._move_enqueue(NULL, 'ids', $L, '$K', 'n2')");
is($rc, 0, "_move_enqueue accepts key $K in its bigint shard $L") or diag($err);
$coord->safe_psql('coord', "SELECT sharding._move_cancel($move)") if $rc == 0;

# ------------------------------------------------------------------ 2. isolate
($rc, my $moved, $err) = $coord->psql('coord', "SELECT sharding.isolate('ids', '$K', 'n2')");
is($moved, $rows, "isolate moved the $rows rows of key $K") or diag($err);
is($a->safe_psql('n1', "SELECT count(*) FROM items WHERE k = $K") . ' '
	  . $b->safe_psql('n2', "SELECT count(*) FROM items WHERE k = $K"),
	"0 $rows", 'n2 holds them, n1 none');
is($coord->safe_psql('coord', "SELECT node FROM sharding.pins WHERE map = 'ids' AND key = '$K'"), 'n2', "key $K is pinned to n2");
is($coord->safe_psql('coord', "SELECT logical || '|' || source || '|' || phase FROM sharding.move_journal
                                WHERE map = 'ids' AND key = '$K' AND phase <> 'cancelled'"),
	"$L|n1|done", "the journal names shard $L, from n1, done");
is($a->safe_psql('n1', "SELECT count(*) FROM items WHERE k <> $K") + $b->safe_psql('n2', "SELECT count(*) FROM items WHERE k <> $K"),
	2000 - $rows, 'every other row stays');
is(leftovers($coord, $a, $b), 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0', 'nothing of the move is left');

done_testing();
