# Faults in the middle of a copy in parts (docs/moves.md;
# src/datanode/move_copy.cpp): a table of at least 4 MB at the source is copied
# by sharding.move_parallel sessions of the destination at once (loopback
# sessions named after the move, each on a range of the source's blocks under
# the move's snapshot, each committing on its own). Here one part is held at
# the destination by an uncommitted row with the key of the last row it
# copies, after the other part has committed its rows, then
#   1. the move's caller is cancelled, under writers;
#   2. the caller's backend is killed (kill -9).
# After each, and again 10 s later: no row of the shard at the destination,
# no session of the move left there, the old owner has all its rows (with
# writers: the nodes hold exactly what their log implies), nothing of the
# move left on any node; then the next move succeeds, in parts too.
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
my $S = 0;    # n1's
my $name = $coord->safe_psql('coord', "SELECT sharding._move_name('bank', $S)");
my $sum = sub { $_[0]->safe_psql($_[1], "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S, 'accounts')") };

# 150,000 more rows of the shard's first tenant at n1 (ids writers never
# use), logged as writer 0's: the table is then large enough for parts.
my $t = $coord->safe_psql('coord', "SELECT t FROM unnest(ARRAY[" . join(',', map { "'$_'" } @tenants)
	  . "]) t WHERE sharding.logical_shard('bank', t) = $S ORDER BY t LIMIT 1");
my $gen = "SELECT '$t'::text AS tenant, i::bigint AS id, 'big-' || i AS val FROM generate_series(2000001, 2150000) i";
$a->safe_psql('n1', "INSERT INTO accounts $gen");
$coord->safe_psql('coord', "INSERT INTO oplog (w, id, tenant, op, val) SELECT 0, id, tenant, 'insert', val FROM ($gen) g");
$a->safe_psql('n1', 'VACUUM ANALYZE accounts');
ok($a->safe_psql('n1', "SELECT pg_relation_size('accounts') / 8192 >= 512") eq 't',
	'the source table is large enough to be copied in two parts (4 MB)');
is($b->safe_psql('n2', 'SHOW sharding.move_parallel'), '2', 'the destination copies in two parts by default');

# The move's sessions at the destination that pull: the parts (sessions the
# coordinator opens there for the copy's queue; its own session there
# waits idle).
my $pulls = "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$name' AND query LIKE 'SELECT sharding._move_pull(%'";
# hold_part(): a session at the destination inserts, uncommitted, a row
# with the key of the last row at the source (in the last blocks: the last
# part's), bypassing the guard as the copy does; that part's copy waits for
# it on its unique key.
sub hold_part { return hold_row($b, 'n2', $t, 2150000); }
sub release { release_row($b, 'n2', $_[0]); }
# in_parts(what): the copy runs in two parts, one waits for the holder, the
# other has committed its rows.
sub in_parts
{
	my $what = shift;
	ok(wait_for_sql($b, 'n2', "$pulls AND wait_event_type = 'Lock'", '1', 120), "$what: a part of the copy waits for the held key");
	ok(wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM accounts WHERE sharding.logical_shard('bank', tenant) = $S", 't', 120),
		"$what: the other part has committed its rows at the destination");
	is($b->safe_psql('n2', $pulls), '2', "$what: two parts copy");
}
sub nothing_left
{
	my $what = shift;
	is(shard_rows($b, 'n2', $S), '0', "$what: no row of the shard at the destination");
	is($b->safe_psql('n2', "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$name'"), '0',
		"$what: no session of the move at the destination");
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
		"$what: the old owner is in charge");
	is(leftovers($coord, $a, $b), $clean, "$what: no slot, publication, subscription, freeze or live journal row on any node");
}

# 1. Cancel while one part waits and the other has committed, under writers.
my $hold = hold_part();
my $ws = start_writers($coord, 3, \@tenants);
sleep 1;
my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
in_parts('cancel');
is($coord->safe_psql('coord', "SELECT pg_cancel_backend(" . mover_pid($coord) . ")"), 't', 'cancel: the caller is cancelled');
$mv->{h}->finish;
like(${ $mv->{err} }, qr/cancel/i, 'cancel: move_shard_online reports the cancel');
release($hold);
sleep 1;
my ($stats) = stop_writers($coord, $ws);
my ($committed, $refused, $anomalies, $errors) = split /\|/, $stats;
ok($committed > 50, "cancel: writers committed $committed operations ($refused refusals retried)");
is("$anomalies|$errors", '0|0', 'cancel: every update and delete found its row, no writer failed');
is($coord->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1"), 'cancelled',
	'cancel: the journal says cancelled');
nothing_left('cancel');
sleep 10;
nothing_left('cancel, 10 s later');
my ($exp, $got, $misplaced) = expected_vs_actual($coord, $a, $b);
is($got, $exp, 'cancel, 10 s later: the nodes hold exactly what the log implies, row for row');
is($misplaced, 0, 'cancel, 10 s later: every row is on the node node_for names');

# 2. kill -9 of the caller's backend while one part waits (no writers: the
# crash restart would end them between a commit and its log line; the
# shard's checksum is the reference).
my $want = $sum->($a, 'n1');
$hold = hold_part();
$mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
in_parts('kill -9');
kill 'KILL', mover_pid($coord);
$mv->{h}->finish;
wait_for_restart($coord);
# The destination's sessions of the move find their client gone and end by
# themselves (client_connection_check_interval): the coordinator's session
# and the parts' sessions, all connections of the killed backend, within a
# second.
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$name'", '0', 30),
	'kill -9: the destination\'s sessions of the move end by themselves');
release($hold);
sleep 10;
is($b->safe_psql('n2', "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$name'"), '0',
	'kill -9, 10 s later: no session of the move at the destination');
# Rolled back by _move_recover: this call's, or the jobs launcher's after
# the crash restart (preloaded).
$coord->safe_psql('coord', 'SELECT sharding._move_recover()');
ok(wait_for_sql($coord, 'coord', "SELECT phase IN ('failed', 'cancelled') FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1", 't', 60),
	'kill -9: the interrupted move is rolled back (its journal row ended)');
is($sum->($a, 'n1'), $want, 'kill -9: the old owner has all its rows');
nothing_left('kill -9, after the next call');

# 3. The next move succeeds, in parts.
$want = $sum->($a, 'n1');
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')"), '2', 'the next move succeeds: epoch 2');
is($sum->($b, 'n2'), $want, 'the destination has the shard as the source had it');
is($coord->safe_psql('coord', "SELECT rows_copied || '/' || rows_moved FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1"),
	(split m{/}, $want)[0] . '/' . (split m{/}, $want)[0], 'the journal counts every row copied and deleted');
is(shard_rows($a, 'n1', $S), '0', 'the source holds no row of the shard');
is(leftovers($coord, $a, $b), $clean, 'and nothing is left');
done_testing();
