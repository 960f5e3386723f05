# Live progress of an online move (docs/moves.md): while the move catches up,
# the journal's lag_bytes (and so move_progress) is current, not NULL until
# done. The destination applies slowly (a replica trigger sleeps for the
# apply worker only) while writers keep a backlog; once the trigger is gone
# the move completes with lag 0 and all rows.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 100);
my $S = 0;    # shard 0 is n1's
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
	'shard 0 starts at n1');

slow_apply($b, 'n2', 0.05);
my $ws = start_writers($coord, 2, [ shard_tenants($coord, $S) ]);
my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");

ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE phase = 'catching_up'", '1', 120),
	'the move is catching up');
# The executor writes lag_bytes while it waits for the destination, as a
# committed journal update another session sees.
ok(wait_for_sql($coord, 'coord',
		"SELECT count(*) FROM sharding.move_journal WHERE phase = 'catching_up' AND lag_bytes > 0", '1', 30),
	'while catching up, the journal shows a positive lag_bytes');
my $l1 = $coord->safe_psql('coord', "SELECT lag_bytes FROM sharding.move_progress WHERE phase = 'catching_up'");
like($l1, qr/^\d+$/, "move_progress shows the lag while catching up ($l1 bytes)");
# It is refreshed, not written once: two readings a second apart differ
# (the writers and the slow apply keep changing the backlog).
my %seen;
for (1 .. 20)
{
	my $v = $coord->safe_psql('coord', "SELECT coalesce(lag_bytes, -1) FROM sharding.move_journal WHERE phase = 'catching_up'");
	$seen{$v} = 1 if $v ne '';
	usleep(250_000);
}
cmp_ok(scalar(keys %seen), '>=', 2, 'lag_bytes is refreshed during catch-up (' . scalar(keys %seen) . ' distinct values in 5 s)');

# Let the destination catch up; the move completes.
$b->safe_psql('n2', 'DROP TRIGGER slow_apply ON accounts');
my ($stats) = stop_writers($coord, $ws);
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move completes without error');
is($coord->safe_psql('coord', "SELECT phase || ' ' || lag_bytes FROM sharding.move_journal ORDER BY move DESC LIMIT 1"),
	'done 0', 'done, lag 0');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n2',
	'shard 0 is at n2');
is(shard_rows($a, 'n1', $S), '0', 'no row of the shard is left at the source');
my ($exp, $got, $misplaced) = expected_vs_actual($coord, $a, $b);
is($got, $exp, 'the nodes hold exactly the rows the writers logged');
is($misplaced, 0, 'every row is on its owner');
done_testing();
