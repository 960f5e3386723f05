# TRUNCATE of a moved table during an online move (docs/moves.md): the
# stream does not carry it, so the move notes the tables' storage at both
# ends before its slot exists and the cutover refuses the switch when it
# changed. Each case holds the copy with an uncommitted row at the
# destination, truncates one end meanwhile, then lets the copy go:
#   1. at the source: the move fails with 55000 naming the source and is
#      rolled back; the destination has no row of the shard (before, the
#      copied rows would have come back there, owned), the source keeps the
#      shard, as truncated, and nothing of the move is left;
#   2. at the destination: the same, naming the destination; the source
#      still has every row of the shard;
#   2b. VACUUM FULL (a rewrite) at the source: the same, naming the source;
#   3. the next move of the shard succeeds with every row.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 200);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my $S = 0;    # n1's
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
	'the shard starts at n1');
my $owner = sub { $coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S") };
my $others = "SELECT count(*) FROM accounts WHERE sharding.logical_shard('bank', tenant) <> $S";

# truncated_during(what, node, db[, statement]): a move n1 -> n2 held at
# the destination while `node` truncates accounts (or runs `statement`,
# which rewrites it); returns the move's messages.
sub truncated_during
{
	my ($what, $node, $db, $stmt) = @_;
	$stmt //= 'TRUNCATE accounts';
	my ($t, $id) = split /\|/, $a->safe_psql('n1',
		"SELECT tenant || '|' || id FROM accounts WHERE sharding.logical_shard('bank', tenant) = $S ORDER BY id DESC LIMIT 1");
	my $hold = hold_row($b, 'n2', $t, $id);
	# The move's messages with their SQLSTATE (VERBOSITY verbose).
	my ($out, $merr) = ('', '');
	my $mv = { out => \$out, err => \$merr };
	$mv->{h} = IPC::Run::start([ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $coord->connstr('coord'), '-c',
			"SELECT sharding.move_shard_online('bank', $S, 'n2')" ], '>', \$out, '2>', \$merr);
	ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT sharding._move_pull(%' "
		  . "AND wait_event_type = 'Lock'", '1', 120), "$what: the copy waits for the held key");
	# The TRUNCATE runs, or waits for the copy's lock at the destination.
	my $tr = psql_bg($node, $db, $stmt);
	# (Not by reading accounts there: that would queue behind the TRUNCATE.)
	my ($state, $finished) = ('', 0);
	for (1 .. 200)
	{
		$tr->{h}->pump_nb if $tr->{h}->pumpable;
		if (!$tr->{h}->pumpable) { $finished = 1; last; }
		$state = $node->safe_psql($db, "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock') || '/' || count(*) "
			  . "FROM pg_stat_activity WHERE query = '$stmt' AND pid <> pg_backend_pid()");
		last if $state eq '1/1';
		usleep(50_000);
	}
	ok($finished || $state eq '1/1', "$what: the $stmt waits for the copy or has run (" . ($finished ? 'ran' : 'waits') . ')');
	release_row($b, 'n2', $hold);
	$tr->{h}->finish;
	is(${ $tr->{err} }, '', "$what: the $stmt succeeds");
	$mv->{h}->finish;
	return ${ $mv->{err} };
}

# 1. At the source.
my $n2_before = $b->safe_psql('n2', 'SELECT count(*) FROM accounts');
my $err = truncated_during('truncated at the source', $a, 'n1');
like($err, qr/ERROR:\s+55000: public\.accounts was truncated or rewritten on node "n1" while logical shard $S of map "bank" was being moved/,
	'truncated at the source: the move fails, naming the table and the node');
is($owner->(), 'n1', 'truncated at the source: n1 still owns the shard');
is(shard_rows($b, 'n2', $S), '0', 'truncated at the source: no row of the shard is at the destination');
is($b->safe_psql('n2', 'SELECT count(*) FROM accounts'), $n2_before, "truncated at the source: the destination's own rows are as they were");
is($a->safe_psql('n1', 'SELECT count(*) FROM accounts'), '0', 'truncated at the source: the source stays truncated');
is(leftovers($coord, $a, $b), $clean, 'truncated at the source: nothing of the move is left');

# 2. At the destination, with rows at the source again.
$a->safe_psql('n1', "INSERT INTO accounts SELECT t, i, 'again-' || i FROM (SELECT 't' || lpad((i % 64)::text, 2, '0') AS t, i "
	  . "FROM generate_series(100001, 100000 + 64 * 100) i) g WHERE sharding.node_for('bank', t) = 'n1'");
my $before = shard_sum($a, 'n1', $S);
like($before, qr/^[1-9]\d*\//, "the source holds the shard again ($before)");
$err = truncated_during('truncated at the destination', $b, 'n2');
like($err, qr/ERROR:\s+55000: public\.accounts was truncated or rewritten on node "n2" while logical shard $S of map "bank" was being moved/,
	'truncated at the destination: the move fails, naming the table and the node');
is($owner->(), 'n1', 'truncated at the destination: n1 still owns the shard');
is(shard_sum($a, 'n1', $S), $before, 'truncated at the destination: the source has every row of the shard');
is($b->safe_psql('n2', 'SELECT count(*) FROM accounts'), '0', 'truncated at the destination: no row of the shard is there');
is(leftovers($coord, $a, $b), $clean, 'truncated at the destination: nothing of the move is left');

# 2b. A rewrite at the source keeps the rows but gives the table new
# storage: refused the same way.
$err = truncated_during('rewritten at the source', $a, 'n1', 'VACUUM FULL accounts');
like($err, qr/ERROR:\s+55000: public\.accounts was truncated or rewritten on node "n1" while logical shard $S of map "bank" was being moved/,
	'rewritten at the source: the move fails, naming the table and the node');
is($owner->(), 'n1', 'rewritten at the source: n1 still owns the shard');
is(shard_sum($a, 'n1', $S), $before, 'rewritten at the source: the source has every row of the shard');
is($b->safe_psql('n2', 'SELECT count(*) FROM accounts'), '0', 'rewritten at the source: no row of the shard is at the destination');
is(leftovers($coord, $a, $b), $clean, 'rewritten at the source: nothing of the move is left');

# 3. The next move carries the shard.
my $n1_others = $a->safe_psql('n1', $others);
like($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')"), qr/^\d+/,
	'the next move of the shard succeeds');
is($owner->(), 'n2', 'n2 owns the shard');
is(shard_sum($b, 'n2', $S), $before, 'the destination has every row of the shard');
is(shard_rows($a, 'n1', $S), '0', 'the source holds no row of the shard');
is($a->safe_psql('n1', $others), $n1_others, "the source's other shards are as they were");
is(leftovers($coord, $a, $b), $clean, 'nothing of the move is left');
done_testing();
