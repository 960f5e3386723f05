# Every kind of distributed table an online move carries (CONTRACT 15.1,
# docs/moves.md "What a move carries, what it refuses"). Each case holds
# the copy (the destination's table locked in SHARE mode) while the source
# is written, then lets the move go and checks every node:
#   a. a table hash-partitioned with sharding.text_shard_ops into 8
#      partitions (create_partitions) on the 8-shard map, under writers:
#      the changes arrive on the leaf partitions and every one is carried;
#   b. a table range-partitioned by another column, one range partitioned
#      again (multi-level), a leaf whose columns are numbered differently
#      (attached with another column order), the destination partitioned
#      differently, under writers; a leaf truncated at the source during
#      the move fails it at the cutover, naming the leaf;
#   c. a key column outside the primary key, ids repeating across the
#      nodes: distribute refuses it without a replica identity that
#      carries the key (55000); nodes whose tables lack one refuse the
#      move (55000), nothing done, the destination's rows intact; with
#      REPLICA IDENTITY FULL, deletes of other shards at the source delete
#      nothing at the destination;
#   d. rows written at the source under a foreign replication origin (a
#      session under pg_replication_origin_session_setup) during the move
#      reach the destination;
#   e. REPLICA IDENTITY NOTHING at the source: refused (55000 naming the
#      table), nothing done;
#   f. columns compared at both ends: a column the coordinator lacks is
#      copied; one the destination lacks, or of another type there, is
#      refused (55000 naming table and column), nothing copied; a column
#      added at the source while the copy is held fails the move cleanly,
#      the rows intact.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my %db = ('coord' => $coord, 'n1' => $a, 'n2' => $b);
my $owner = sub { $coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $_[0]") };

# A logical shard at n1 to move to n2 (one is brought back from n2 when n1
# has only one left).
sub n1_shard
{
	my $n = $coord->safe_psql('coord', "SELECT count(*) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
	if ($n <= 1)
	{
		my $back = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n2'");
		$coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $back, 'n1')");
	}
	return $coord->safe_psql('coord', "SELECT max(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
}

# reshape(node sql, coordinator sql[, distribute]): accounts dropped
# everywhere and created anew (node sql at n1 and n2, or a hash of sql per
# node), distributed again on tenant unless told not to; the log emptied.
sub reshape
{
	my ($nodes, $coord_sql, $distribute) = @_;
	$distribute //= 1;
	$coord->safe_psql('coord', "SELECT sharding.undistribute('accounts')");
	wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables", '0') for ([$a, 'n1'], [$b, 'n2']);
	for my $n ('coord', 'n1', 'n2')
	{
		my $sql = $n eq 'coord' ? $coord_sql : ref $nodes ? $nodes->{$n} : $nodes;
		$db{$n}->safe_psql($n, "DROP TABLE IF EXISTS accounts; $sql");
	}
	$coord->safe_psql('coord', "DO \$\$ BEGIN IF to_regclass('oplog') IS NOT NULL THEN TRUNCATE oplog; END IF; END \$\$");
	return unless $distribute;
	$coord->safe_psql('coord', "SELECT sharding.distribute('accounts', 'tenant', 'bank')");
	wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables", '1') for ([$a, 'n1'], [$b, 'n2']);
}

# start_move(S): the move of S to n2 in the background, its messages with
# their SQLSTATE.
sub start_move
{
	my $S = shift;
	my ($out, $err) = ('', '');
	my $mv = { out => \$out, err => \$err };
	$mv->{h} = IPC::Run::start([ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $coord->connstr('coord'), '-c',
			"SELECT sharding.move_shard_online('bank', $S, 'n2')" ], '>', \$out, '2>', \$err);
	return $mv;
}

# held_move(what, S, during): n2's accounts held in SHARE mode, the move of S
# started; once it waits for n2's table (its slot exists at n1), during()
# runs; then n2 lets go and the move ends. Returns the move's messages
# (empty when it succeeded).
my $holding = "query LIKE 'BEGIN; LOCK TABLE accounts IN SHARE MODE%' AND wait_event = 'PgSleep'";
sub held_move
{
	my ($what, $S, $during) = @_;
	my $hold = psql_bg($b, 'n2', "BEGIN; LOCK TABLE accounts IN SHARE MODE; SELECT pg_sleep(600)");
	ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE $holding", '1'), "$what: n2 holds accounts");
	my $mv = start_move($S);
	my $waits = 0;
	for (1 .. 1200)
	{
		$mv->{h}->pump_nb if $mv->{h}->pumpable;
		last unless $mv->{h}->pumpable;
		if ($b->safe_psql('n2', "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'sharding_move%' "
			  . "AND wait_event_type = 'Lock'") ne '0'
			&& $a->safe_psql('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'") ne '0')
		{
			$waits = 1;
			last;
		}
		usleep(50_000);
	}
	$during->() if $waits;
	$b->safe_psql('n2', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE $holding AND pid <> pg_backend_pid()");
	$hold->{h}->finish;
	$mv->{h}->finish;
	diag("$what: the move " . ($waits ? 'was held' : 'ended before it copied') . ': ' . ${ $mv->{err} });
	return (${ $mv->{err} }, $waits);
}

# writers_until(n, tenants, ops): n writers on those tenants until they
# have committed that many operations in all.
sub writers_until
{
	my ($n, $tenants, $ops) = @_;
	my $ws = start_writers($coord, $n, $tenants);
	wait_for_sql($coord, 'coord', "SELECT count(*) >= $ops FROM oplog WHERE w > 0", 't', 120);
	return $ws;
}

# Tenants of shard S, and of another shard n1 keeps.
sub tenants_of
{
	my $S = shift;
	my $other = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1' AND logical <> $S");
	return (shard_tenants($coord, $S), shard_tenants($coord, $other));
}

# sum_of(node, db, S): rows, sum of ids and a digest of shard S there.
sub sum_of
{
	my ($node, $db, $l) = @_;
	return $node->safe_psql($db, "SELECT count(*) || '/' || coalesce(sum(id), 0) || '/' || coalesce(md5(string_agg(tenant || ':' || id || ':' || coalesce(val, '-'), ',' ORDER BY id)), '-') "
		  . "FROM accounts WHERE sharding.logical_shard('bank', tenant) = $l");
}

sub leaves
{
	my ($node, $db) = @_;
	return $node->safe_psql($db, "SELECT count(*) FROM pg_partition_tree('accounts') WHERE isleaf");
}

# ---------------------------------------------------------------- a
my $hashed = "CREATE TABLE accounts (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (tenant, id))"
  . " PARTITION BY HASH (tenant sharding.text_shard_ops); SELECT sharding.create_partitions('accounts', 8);";
reshape($hashed, $hashed);
load_rows($coord, $a, $b, 40);
is(leaves($a, 'n1'), '8', 'a: accounts has 8 leaf partitions at n1');
my $S = n1_shard();
my $ws;
my ($err, $held) = held_move('a', $S, sub { $ws = writers_until(2, [ tenants_of($S) ], 150); });
ok($held, 'a: the copy was held while writers wrote');
is($err, '', 'a: the move of the hash-partitioned table succeeds');
is($owner->($S), 'n2', 'a: n2 owns the shard');
$ws = start_writers($coord, 1, [ tenants_of($S) ]) unless $ws;
writers_kept($coord, $a, $b, $ws, 'a: ');
is(shard_rows($a, 'n1', $S), '0', 'a: the source holds none of the shard');
is($b->safe_psql('n2', "SELECT count(*) FROM accounts_$S WHERE sharding.shard_of(tenant, 8) <> $S"), '0',
	"a: the destination's partition $S holds exactly its shard's rows");
is(leftovers($coord, $a, $b), $clean, 'a: nothing of the move is left');

# ---------------------------------------------------------------- b
# n1: ranges of id, the middle one partitioned again by hash of id, the
# top one a table with its columns in another order (other numbers).
# Writers' ids of this round (start_writers: round 2 or 3, ids 2xx..3xx
# million) fall in the middle and top ranges.
my $ranged_n1 = q{
	CREATE TABLE accounts (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (tenant, id)) PARTITION BY RANGE (id);
	CREATE TABLE accounts_lo PARTITION OF accounts FOR VALUES FROM (MINVALUE) TO (100000);
	CREATE TABLE accounts_mid PARTITION OF accounts FOR VALUES FROM (100000) TO (215000000) PARTITION BY HASH (id);
	CREATE TABLE accounts_mid_0 PARTITION OF accounts_mid FOR VALUES WITH (MODULUS 2, REMAINDER 0);
	CREATE TABLE accounts_mid_1 PARTITION OF accounts_mid FOR VALUES WITH (MODULUS 2, REMAINDER 1);
	CREATE TABLE accounts_hi (val text, dropped integer, id bigint NOT NULL, tenant text NOT NULL);
	ALTER TABLE accounts_hi DROP COLUMN dropped;
	ALTER TABLE accounts ATTACH PARTITION accounts_hi FOR VALUES FROM (215000000) TO (MAXVALUE);
};
my $ranged_n2 = q{
	CREATE TABLE accounts (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (tenant, id)) PARTITION BY RANGE (id);
	CREATE TABLE other_low PARTITION OF accounts FOR VALUES FROM (MINVALUE) TO (1000);
	CREATE TABLE other_high PARTITION OF accounts FOR VALUES FROM (1000) TO (MAXVALUE);
};
reshape({ n1 => $ranged_n1, n2 => $ranged_n2 }, $ranged_n2);
load_rows($coord, $a, $b, 40);
is(leaves($a, 'n1') . '/' . $a->safe_psql('n1', "SELECT attnum FROM pg_attribute WHERE attrelid = 'accounts_hi'::regclass AND attname = 'tenant'"),
	'4/4', 'b: n1 has 4 leaves, two levels, its top leaf numbers tenant 4');
$S = n1_shard();
undef $ws;
($err, $held) = held_move('b', $S, sub { $ws = writers_until(2, [ tenants_of($S) ], 150); });
ok($held, 'b: the copy was held while writers wrote');
is($err, '', 'b: the move of the range-partitioned table succeeds');
is($owner->($S), 'n2', 'b: n2 owns the shard');
$ws = start_writers($coord, 1, [ tenants_of($S) ]) unless $ws;
writers_kept($coord, $a, $b, $ws, 'b: ');
is($a->safe_psql('n1', "SELECT (SELECT count(*) FROM accounts_mid) > 0 AND (SELECT count(*) FROM accounts_hi) > 0"), 't',
	"b: the writers wrote into n1's middle and top partitions");
is(shard_rows($a, 'n1', $S), '0', 'b: the source holds none of the shard');
is(leftovers($coord, $a, $b), $clean, 'b: nothing of the move is left');
# A leaf truncated at the source while the copy is held: refused at the
# cutover, naming the leaf; the destination gets nothing.
$S = n1_shard();
($err, $held) = held_move('b, a leaf truncated', $S, sub { $a->safe_psql('n1', 'TRUNCATE accounts_mid_0'); });
ok($held, 'b: the copy was held while a leaf was truncated at the source');
like($err, qr/ERROR:\s+55000: public\.accounts_mid_0 was truncated or rewritten on node "n1"/,
	'b: a leaf truncated at the source fails the move (55000 naming the leaf)');
is($owner->($S), 'n1', 'b, leaf truncated: n1 still owns the shard');
is(shard_rows($b, 'n2', $S), '0', 'b, leaf truncated: the destination has none of the shard');
is(leftovers($coord, $a, $b), $clean, 'b, leaf truncated: nothing of the move is left');

# ---------------------------------------------------------------- c
# Key outside the primary key; ids 1..100 at n2 (its own tenants), ids
# 1..100 at n1 for a shard M it keeps, 1001..1100 for the shard S it moves.
my $plain = "CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text);";
reshape($plain, $plain, 0);
my (undef, undef, $derr) = $coord->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding.distribute('accounts', 'tenant', 'bank')");
like($derr, qr/ERROR:\s+55000: the replica identity of public\.accounts does not include key column tenant/,
	'c: distribute refuses a table whose replica identity lacks the key (55000)');
like($derr, qr/HINT:.*REPLICA IDENTITY FULL/, 'c: its hint names REPLICA IDENTITY FULL');
is($coord->safe_psql('coord', 'SELECT count(*) FROM sharding.distributed_tables'), '0', 'c: nothing was recorded');
$coord->safe_psql('coord', "ALTER TABLE accounts REPLICA IDENTITY FULL; SELECT sharding.distribute('accounts', 'tenant', 'bank')");
wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables", '1') for ([$a, 'n1'], [$b, 'n2']);
# The nodes' tables keep the default replica identity (the primary key):
# the move checks them itself.
$S = n1_shard();
my $M = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1' AND logical <> $S");
my $tenants = "(SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i)";
my $fill = sub {
	my ($where, $from) = @_;
	return "INSERT INTO accounts SELECT (SELECT t FROM $tenants s WHERE $where ORDER BY t LIMIT 1), $from + g, 'c-' || g "
	  . "FROM generate_series(1, 100) g";
};
$b->safe_psql('n2', $fill->("sharding.node_for('bank', t) = 'n2'", 0));
$a->safe_psql('n1', $fill->("sharding.logical_shard('bank', t) = $M", 0) . '; ' . $fill->("sharding.logical_shard('bank', t) = $S", 1000));
my $n2_own = $b->safe_psql('n2', q{SELECT count(*) || '/' || sum(id) FROM accounts});
my $deletes = sub {
	$a->safe_psql('n1', 'DELETE FROM accounts WHERE id <= 50');    # shard M's, kept at n1
	$a->safe_psql('n1', 'DELETE FROM accounts WHERE id BETWEEN 1001 AND 1010');    # shard S's
};
($err) = held_move('c without replica identity', $S, $deletes);
like($err, qr/ERROR:\s+55000: .*replica identity of public\.accounts on node "n1" does not include key column "tenant"/,
	'c: without a replica identity carrying the key the move is refused (55000)');
like($err, qr/HINT:.*REPLICA IDENTITY FULL/, 'c: the hint names REPLICA IDENTITY FULL');
is($owner->($S), 'n1', 'c: n1 still owns the shard');
is($b->safe_psql('n2', q{SELECT count(*) || '/' || sum(id) FROM accounts}), $n2_own, "c: the destination's own rows are all there");
is(leftovers($coord, $a, $b), $clean, 'c: nothing of the refused move is left');
# Again with the shard's rows back, the replica identity carrying the key.
$a->safe_psql('n1', 'TRUNCATE accounts; ' . $fill->("sharding.logical_shard('bank', t) = $M", 0) . '; '
	  . $fill->("sharding.logical_shard('bank', t) = $S", 1000));
$db{$_}->safe_psql($_, 'ALTER TABLE accounts REPLICA IDENTITY FULL') for qw(n1 n2);
($err, $held) = held_move('c with REPLICA IDENTITY FULL', $S, sub {
	$deletes->();
	$a->safe_psql('n1', "INSERT INTO accounts SELECT tenant, id + 1000, 'late' FROM accounts WHERE id BETWEEN 1011 AND 1020");
});
ok($held, 'c: the copy was held while n1 deleted rows of both shards');
is($err, '', 'c: with REPLICA IDENTITY FULL the move succeeds');
is($b->safe_psql('n2', "SELECT count(*) || '/' || sum(id) FROM accounts WHERE sharding.logical_shard('bank', tenant) <> $S"), $n2_own,
	"c: deletes of another shard at the source deleted none of the destination's rows");
is($b->safe_psql('n2', "SELECT count(*) || '/' || min(id) || '/' || count(*) FILTER (WHERE val = 'late') FROM accounts WHERE sharding.logical_shard('bank', tenant) = $S"),
	'100/1011/10', 'c: the shard arrived with its deletes and inserts');
is($a->safe_psql('n1', q{SELECT count(*) || '/' || sum(id) FROM accounts}), '50/' . (51 + 100) * 50 / 2, 'c: n1 keeps shard M less its deleted rows');
is(leftovers($coord, $a, $b), $clean, 'c: nothing of the move is left');

# ---------------------------------------------------------------- d
$S = n1_shard();
my $t = (shard_tenants($coord, $S))[0];
$a->safe_psql('n1', "INSERT INTO accounts SELECT '$t', 5000 + g, 'before' FROM generate_series(1, 20) g");
$a->safe_psql('n1', "SELECT pg_replication_origin_create('etl_feed')");
($err, $held) = held_move('d', $S, sub {
	$a->safe_psql('n1', "SELECT pg_replication_origin_session_setup('etl_feed'); "
		  . "INSERT INTO accounts SELECT '$t', 6000 + g, 'fed' FROM generate_series(1, 20) g; "
		  . "UPDATE accounts SET val = 'fed-update' WHERE id BETWEEN 5001 AND 5005; "
		  . "DELETE FROM accounts WHERE id BETWEEN 5006 AND 5010;");
});
ok($held, 'd: the copy was held while rows arrived under a foreign origin');
is($err, '', 'd: the move succeeds');
is($b->safe_psql('n2', "SELECT count(*) FILTER (WHERE val = 'fed') || '/' || count(*) FILTER (WHERE val = 'fed-update') "
	  . "|| '/' || count(*) FROM accounts WHERE tenant = '$t' AND id > 5000"), '20/5/35',
	"d: the destination has the origin's inserts, updates and deletes");
is($a->safe_psql('n1', "SELECT count(*) FROM accounts WHERE tenant = '$t'"), '0', 'd: the source holds none of them');
is(leftovers($coord, $a, $b), $clean, 'd: nothing of the move is left');

# ---------------------------------------------------------------- e
$S = n1_shard();
my $before = sum_of($a, 'n1', $S);
$a->safe_psql('n1', 'ALTER TABLE accounts REPLICA IDENTITY NOTHING');
($err) = held_move('e', $S, sub { });
like($err, qr/ERROR:\s+55000: .*public\.accounts.* has no replica identity on node "n1"/,
	'e: REPLICA IDENTITY NOTHING at the source: refused with 55000 naming the table');
is($owner->($S), 'n1', 'e: n1 still owns the shard');
is(sum_of($a, 'n1', $S), $before, 'e: the source has every row of the shard');
is(shard_rows($b, 'n2', $S), '0', 'e: the destination has none');
is(leftovers($coord, $a, $b), $clean, 'e: nothing of the refused move is left');
is($coord->safe_psql('coord', "SELECT phase || ' ' || error_state || ' ' || (error LIKE '%has no replica identity%') FROM sharding.move_journal ORDER BY move DESC LIMIT 1"),
	'failed 55000 true', "e: the move's journal row ended failed with the refusal");
$a->safe_psql('n1', 'UPDATE accounts SET val = val WHERE id = (SELECT min(id) FROM accounts)');
$a->safe_psql('n1', 'ALTER TABLE accounts REPLICA IDENTITY FULL');

# ---------------------------------------------------------------- f
# f1: a column the nodes have and the coordinator has not is copied.
$a->safe_psql('n1', "ALTER TABLE accounts ADD COLUMN note text; UPDATE accounts SET note = 'n-' || id");
$b->safe_psql('n2', 'ALTER TABLE accounts ADD COLUMN note text');
$S = n1_shard();
my $tf = (shard_tenants($coord, $S))[0];
$a->safe_psql('n1', "INSERT INTO accounts SELECT '$tf', 9000 + g, 'f', 'n-' || (9000 + g) FROM generate_series(1, 30) g");
my $rows = shard_rows($a, 'n1', $S);
ok($rows >= 30, "f: shard $S has $rows rows at n1, each with a note");
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')") =~ /^\d+$/ ? 'ok' : 'no', 'ok',
	'f: a move with a column the coordinator lacks succeeds');
is($b->safe_psql('n2', "SELECT count(*) || '/' || count(*) FILTER (WHERE note = 'n-' || id) FROM accounts WHERE sharding.logical_shard('bank', tenant) = $S"),
	"$rows/$rows", "f: the coordinator's missing column arrived with every row");
# f2, f3: a column the destination lacks, or has with another type.
for my $c ([ 'missing', 'ALTER TABLE accounts ADD COLUMN extra integer', '', qr/column "extra" of public\.accounts is missing on node "n2"/ ],
	[ 'of another type', 'ALTER TABLE accounts ADD COLUMN extra integer', 'ALTER TABLE accounts ADD COLUMN extra text',
		qr/column "extra" of public\.accounts is integer on node "n1" but text on node "n2"/ ])
{
	my ($what, $src, $dst, $re) = @$c;
	$a->safe_psql('n1', $src);
	$b->safe_psql('n2', $dst) if $dst;
	$S = n1_shard();
	$before = sum_of($a, 'n1', $S);
	my $n2_before = $b->safe_psql('n2', 'SELECT count(*) FROM accounts');
	($err) = held_move("f $what", $S, sub { });
	like($err, qr/ERROR:\s+55000: .*$re/, "f: a column $what at the destination: refused with 55000 naming table and column");
	is($owner->($S), 'n1', "f $what: n1 still owns the shard");
	is(sum_of($a, 'n1', $S), $before, "f $what: the source has every row of the shard");
	is($b->safe_psql('n2', 'SELECT count(*) FROM accounts'), $n2_before, "f $what: nothing was copied");
	is(leftovers($coord, $a, $b), $clean, "f $what: nothing of the refused move is left");
	is($coord->safe_psql('coord', "SELECT phase || ' ' || error_state || ' ' || (error LIKE '%column \"extra\" of public.accounts%') || ' ' || coalesce(rows_copied, 0) "
		  . "FROM sharding.move_journal ORDER BY move DESC LIMIT 1"), 'failed 55000 true 0',
		"f $what: the move's journal row ended failed with the refusal, nothing copied");
	$a->safe_psql('n1', 'ALTER TABLE accounts DROP COLUMN extra');
	$b->safe_psql('n2', 'ALTER TABLE accounts DROP COLUMN extra') if $dst;
}
# f4: a column added at the source while the copy is held.
$S = n1_shard();
$before = sum_of($a, 'n1', $S);
($err, $held) = held_move('f added during the move', $S, sub { $a->safe_psql('n1', 'ALTER TABLE accounts ADD COLUMN late text'); });
ok($held, 'f: the copy was held while a column was added at the source');
like($err, qr/ERROR:\s+55000: .*columns or the replica identity of public\.accounts changed on node "n1"/, 'f: the move fails cleanly (55000) naming the table and the node');
is($owner->($S), 'n1', 'f added: n1 still owns the shard');
is(sum_of($a, 'n1', $S), $before, 'f added: the source has every row of the shard');
is(shard_rows($b, 'n2', $S), '0', 'f added: the destination has none');
is(leftovers($coord, $a, $b), $clean, 'f added: nothing of the move is left');
done_testing();
