# The copy of a move as one queue of parts over sharding.move_parallel
# sessions of the destination (docs/moves.md "The copy"; issue 38): the
# shard spreads over the plain table accounts and the shard-partitioned
# table parts (create_partitions(parts, 8): leaf parts_<L> holds logical
# shard L, copied without a filter). A session that is done takes the next
# part, whatever its table, so one table's pull held at the destination
# does not keep the other table from being copied:
#   1. accounts' pull held (a session at the destination holds, uncommitted,
#      the key of one of the shard's accounts rows), under writers: the
#      shard's leaf of parts arrives whole meanwhile; released, the move
#      ends with every row where the log says;
#   2. the same with parts' pull held (the key of one of its rows in the
#      shard's leaf at the destination): accounts' rows arrive meanwhile.
# Copied table after table, one of the two waits for the other's hold.
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
my @tenants = map { sprintf('t%02d', $_) } 0 .. 63;
load_parts($coord, $a, $b);
is($b->safe_psql('n2', 'SHOW sharding.move_parallel'), '2', 'the destination copies in two sessions by default');

my $psum = sub { $_[0]->safe_psql($_[1], "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $_[2], 'parts')") };
my ($S1, $S2) = split / /, $coord->safe_psql('coord',
	"SELECT string_agg(logical::text, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
# The destination's pulls of the move (the queue's sessions, named as the move).
sub pulls
{
	my $S = shift;
	my $name = $coord->safe_psql('coord', "SELECT sharding._move_name('bank', $S)");
	return "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$name' AND query LIKE 'SELECT sharding._move_pull(%'";
}
# A session at n2 inserts, uncommitted, a row of `table` with an existing
# key of shard S at n1 (bypassing the guard as the copy does): that table's
# copy waits for it on its unique key (release_row ends it).
sub hold
{
	my ($table, $S) = @_;
	my ($t, $id) = split /\|/, $a->safe_psql('n1',
		"SELECT tenant, id FROM $table WHERE sharding.logical_shard('bank', tenant) = $S ORDER BY id LIMIT 1");
	my $h = psql_bg($b, 'n2', "BEGIN; SET session_replication_role = replica; "
		  . "INSERT INTO $table VALUES ('$t', $id, 'holder'); SELECT pg_sleep(600)");
	ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%''holder''); SELECT pg_sleep(600)' "
		  . "AND wait_event = 'PgSleep'", '1', 60), "a session at the destination holds a key of $table of shard $S");
	return $h;
}

# case(label, S, held table, check of the other table, what it expects)
sub case
{
	my ($label, $S, $held, $other_sql, $other_want) = @_;
	my $want = $psum->($a, 'n1', $S);
	my $h = hold($held, $S);
	my $ws = start_writers($coord, 3, \@tenants);
	sleep 1;
	my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
	my $pulls = pulls($S);
	ok(wait_for_sql($b, 'n2', "$pulls AND wait_event_type = 'Lock'", '1', 120), "$label: the pull of $held waits for the held key");
	ok(wait_for_sql($b, 'n2', $other_sql, $other_want, 60),
		"$label: the other table's rows arrive at the destination while ${held}'s pull waits");
	is($b->safe_psql('n2', "$pulls AND wait_event_type = 'Lock'"), '1', "$label: ${held}'s pull still waits");
	release_row($b, 'n2', $h);
	$mv->{h}->finish;
	is(${ $mv->{err} }, '', "$label: the move succeeds once released");
	writers_kept($coord, $a, $b, $ws, "$label: ");
	is($psum->($b, 'n2', $S), $want, "$label: the destination has the shard's parts rows as the source had them");
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n2',
		"$label: n2 owns the shard");
	is(leftovers($coord, $a, $b), $clean, "$label: nothing of the move is left");
}

# 1. accounts held: the shard's leaf of parts arrives whole (no writer writes parts).
my $w1 = $psum->($a, 'n1', $S1);
case('accounts held', $S1, 'accounts',
	"SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S1, 'parts')", $w1);
# 2. parts held: accounts' rows of the shard arrive.
case('parts held', $S2, 'parts',
	"SELECT count(*) > 0 FROM accounts WHERE sharding.logical_shard('bank', tenant) = $S2", 't');
done_testing();
