# Worker groups (docs/workers.md): who notices a lease that expired.
# - With the library preloaded, the background worker does, within one
#   second of the expiry, while nothing else calls anything on the map: the
#   member's shards are dealt to the live member (the time from the expiry
#   to the deal is reported).
# - Without it, nothing does until the next call on the map: the shards
#   stay with the expired member however long it waits; then a claim
#   through claim_node (by a role that is not a worker) deals them.
# - The background worker runs only where the extension is installed: a
#   database without it sees no group reaper.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use Time::HiRes qw(time usleep);

for my $preload (1, 0)
{
	my $node = sharding_node($preload ? 'group_expiry_preload' : 'group_expiry_plain', preload => $preload);
	my $sql = sub { return $node->safe_psql('postgres', $_[0]); };
	$node->safe_psql('postgres', 'CREATE DATABASE other');
	$sql->(q{
SELECT sharding.create_map('gx', 8, ARRAY['seed']);
SELECT sharding.create_queue('jobs');
CREATE ROLE claimer;
GRANT SELECT, UPDATE ON jobs TO claimer;
SELECT count(*) FROM sharding.join('gx', 'stay', '1 hour');
});
	is($sql->("SELECT count(*) FROM sharding.join('gx', 'brief', '1 second')"), '4', 'brief joins with a 1 s lease: 4 of 8 shards');
	my $expires = $sql->("SELECT extract(epoch FROM lease_expires) FROM sharding.worker_members WHERE worker = 'brief'");
	if ($preload)
	{
		# Nothing calls anything on the map: only the background worker can
		# notice. Poll the table itself (reading routes notices nothing).
		my $waited = sharding_wait($node, 'postgres',
			"SELECT count(*) FROM sharding.shards WHERE map = 'gx' AND node = 'brief'", '0', 10);
		ok(defined $waited, 'the background worker dealt the expired member\'s shards');
		my $dealt = $sql->("SELECT extract(epoch FROM clock_timestamp())");
		my $after_ms = int(($dealt - $expires) * 1000);
		cmp_ok($after_ms, '<', 1000, "within 1 s of the lease's expiry (${after_ms} ms after it, polled every 10 ms)");
		diag("preloaded: an expired member's shards were dealt ${after_ms} ms after its lease expired, with no call on the map");
		is($sql->("SELECT count(*) FROM sharding.shards WHERE map = 'gx' AND node = 'stay'"), '8', 'to the live member');
		is($sql->("SELECT count(*) FROM sharding.worker_members WHERE worker = 'brief'"), '0', 'the member is gone');
		is($node->safe_psql('other', "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'sharding group reaper'
		                                 OR application_name = 'sharding group reaper'"), '0',
			'no group reaper in a database without the extension');
		unlike(slurp_file($node->logfile), qr/sharding group reaper.*(ERROR|FATAL)/, 'no reaper error in the log');
	}
	else
	{
		usleep(2_500_000);
		is($sql->("SELECT count(*) FROM sharding.shards WHERE map = 'gx' AND node = 'brief'"), '4',
			'without preload, an expired member keeps its shards while nothing calls on the map');
		is($sql->("SET ROLE claimer; SELECT count(*) FROM sharding.claim_node(NULL::jobs, 'gx', 'stay', 'stay')"), '0',
			'a claim through claim_node (by a role that is no worker) ...');
		is($sql->("SELECT count(*) FROM sharding.shards WHERE map = 'gx' AND node = 'stay'"), '8',
			'... notices the expiry and deals the shards to the live member');
		is($sql->("SELECT generation FROM sharding.worker_groups WHERE map = 'gx'"), '3',
			'the generation: stay, brief, the deal');
	}
	$node->stop;
}
done_testing();
