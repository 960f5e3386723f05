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
# - A map held by an open transaction (BEGIN; claim_node ...; not
#   committed) holds up nothing but its own reap: with the library
#   preloaded, an expired member of another map of the same database and
#   one of a map in another database are dealt within 1 s of their
#   expiry all the same, and the held map's once the transaction ends.
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
# A held map does not hold up the others (nor the launcher).
{
	my $node = sharding_node('group_expiry_busy', preload => 1);
	my $sql = sub { return $node->safe_psql($_[1] // 'postgres', $_[0]); };
	$node->safe_psql('postgres', 'CREATE DATABASE other2');
	$sql->('CREATE EXTENSION sharding', 'other2');
	$sql->(q{
SELECT sharding.create_map('m1', 8, ARRAY['seed']);
SELECT sharding.create_map('m2', 8, ARRAY['seed']);
SELECT sharding.create_queue('jobs');
SELECT count(*) FROM sharding.join('m1', 'a1', '1 hour');
SELECT count(*) FROM sharding.join('m2', 'a2', '1 hour');
});
	$sql->(q{
SELECT sharding.create_map('m3', 8, ARRAY['seed']);
SELECT count(*) FROM sharding.join('m3', 'a3', '1 hour');
}, 'other2');
	# m1's member expires first: the reaper meets the held map before it
	# reaches m2 (or the other database).
	is($sql->("SELECT count(*) FROM sharding.join('m1', 'b1', '2 seconds')"), '4', 'b1 joins m1, a 2 s lease');
	is($sql->("SELECT count(*) FROM sharding.join('m2', 'b2', '3 seconds')"), '4', 'b2 joins m2, a 3 s lease');
	is($sql->("SELECT count(*) FROM sharding.join('m3', 'b3', '3 seconds')", 'other2'), '4', 'b3 joins m3 in another database, a 3 s lease');
	my $holder = $node->background_psql('postgres', on_error_stop => 1);
	$holder->query_safe("BEGIN; SELECT count(*) FROM sharding.claim_node(NULL::jobs, 'm1', 'a1', 'a1')");
	ok($sql->("SELECT extract(epoch FROM clock_timestamp() - lease_expires) < 0 FROM sharding.worker_members WHERE worker = 'b1'") eq 't',
		'm1 is held (claim_node in an open transaction) before b1 expires');
	my %expires = map { my ($m, $db) = @$_; ($m => $sql->("SELECT extract(epoch FROM lease_expires) FROM sharding.worker_members WHERE map = '$m' AND worker LIKE 'b%'", $db)) }
		(['m2', 'postgres'], ['m3', 'other2']);
	for my $c (['m2', 'postgres', 'b2'], ['m3', 'other2', 'b3'])
	{
		my ($m, $db, $w) = @$c;
		my $waited = sharding_wait($node, $db, "SELECT count(*) FROM sharding.shards WHERE map = '$m' AND node = '$w'", '0', 10);
		ok(defined $waited, "$m ($db): the expired member's shards were dealt while m1 is held");
		my $after_ms = int(($sql->("SELECT extract(epoch FROM clock_timestamp())") - $expires{$m}) * 1000);
		cmp_ok($after_ms, '<', 1000, "$m ($db): within 1 s of the expiry (${after_ms} ms after it)");
		diag("$m ($db): dealt ${after_ms} ms after its member's lease expired, while m1 was held by an open claim_node");
	}
	is($sql->("SELECT count(*) FROM sharding.shards WHERE map = 'm1' AND node = 'b1'"), '4',
		'm1 waits for the open transaction: b1 keeps its shards meanwhile');
	my $released = time;
	$holder->query_safe('COMMIT');
	my $waited = sharding_wait($node, 'postgres', "SELECT count(*) FROM sharding.shards WHERE map = 'm1' AND node = 'b1'", '0', 10);
	ok(defined $waited, 'm1 is dealt once the transaction ended');
	my $m1_ms = int((time - $released) * 1000);
	cmp_ok($m1_ms, '<', 2500, "m1: within a retry (1 s) of the commit (${m1_ms} ms)");
	diag("m1: dealt ${m1_ms} ms after the claim_node transaction committed");
	ok(defined sharding_wait($node, 'postgres', "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'sharding group reaper'", '0', 5),
		'no reaper left running');
	unlike(slurp_file($node->logfile), qr/sharding group reaper.*(ERROR|FATAL)/, 'no reaper error in the log');
	$holder->quit;
	$node->stop;
}
done_testing();
