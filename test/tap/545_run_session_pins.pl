# Rebalance jobs without shared_preload_libraries, on a map with pinned keys:
# CALL sharding.rebalance_run(job) (a C procedure that commits between
# moves) drains a node whose shards leave pinned keys behind (each shard
# move's filter leaves the map's pins out, as sharding._key_text_sql writes
# them) and whose pinned keys follow as key moves once their shard has
# moved (deferred). Between its commits the procedure holds no snapshot of
# its own, so every step gets one, as PL/pgSQL statements had.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 4000, preload => 0);
my $q = sub { return $c->safe_psql('coord', $_[0]); };

is($q->("SHOW shared_preload_libraries"), '', 'the library is not preloaded on the coordinator');
# Two tenants of n1's shards pinned where their rows are (n1): a shard move
# leaves them behind, then each moves alone to its shard's new owner.
my @pinned = split /\n/, $q->("SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) s
                               WHERE sharding.node_for('bank', t) = 'n1' ORDER BY t LIMIT 2");
is(scalar(@pinned), 2, "two tenants of n1 to pin: @pinned");
$q->("SELECT sharding.pin('bank', '$_', 'n1')") for @pinned;
ok(wait_for('n1', "SELECT count(*) FROM sharding.pins WHERE map = 'bank'", '2', 30), 'the followers know the pins');
my $job = $q->("SELECT sharding.drain_node('bank', 'n1')");
is($q->("SELECT jsonb_array_length(deferred) FROM sharding.move_jobs WHERE job = $job"), '2',
	'the pinned keys wait for their shards (deferred)');
my $writers = start_writers(2);
my ($rc, $out, $err) = $c->psql('coord', "CALL sharding.rebalance_run($job)");
is($rc . $err, '0', 'CALL sharding.rebalance_run(job) returns without error');
is(stop_writers($writers), '', 'two writers ran to the end without error');
is($q->("SELECT state || ' ' || moves_done || '/' || moves_total FROM sharding.rebalance_jobs WHERE job = $job"),
	'done 6/6', 'the job is done: 4 shard moves and 2 key moves');
is($q->("SELECT count(*) FROM sharding.move_journal WHERE job = $job AND key IS NOT NULL AND phase = 'done'"), '2',
	'both pinned keys were moved as keys');
is($q->("SELECT (SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n1')
             + (SELECT count(*) FROM sharding.pins WHERE map = 'bank' AND node = 'n1')"), '0',
	'n1 owns no shard and no pinned key any more');
ok(followers_agree(), 'followers agree');
check_data('after draining n1 with pins');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the moves is left');

done_testing();
