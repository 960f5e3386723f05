# A move's plan is fixed when it starts, keys by value, bounded freeze
# (CONTRACT 15.1; docs/moves.md; review findings DL-3, DL-2, DL-7, RB-1,
# LK-2 of move-engine-1.3). Each move is held in its copy by a session at
# the destination holding the moved table in SHARE mode (the move's first
# delete there waits for it, with its slot made at the source), so that
# writes, pins, distribute and the rest happen while the move is in flight.
#   (a) isolate with a key spelled as the key type accepts but not as it
#       prints (an upper-case uuid, '007' and ' +7' for a bigint, a bytea in
#       escape form with bytea_output = escape at the source's database),
#       with writes to the key at the source during the held copy: every
#       row and write at the destination, none at the source, node_for
#       answers the destination; a spelling the type rejects: 22P02, no
#       journal row, no pin;
#   (b) isolate to the owner (a pin only), then a move of that shard: unpin
#       of the key meanwhile is refused (55006) and every row is kept; a pin
#       of another shard's key goes on; distribute of another table of the
#       map is refused (55006) and its rows are kept; a distribute of a
#       table whose key column is of another type: 22023;
#   (c) a coordinator restored from a base backup taken during the copy of
#       a move that then completed: its recovery does not delete the
#       shard at the destination, the new owner;
#   (d) a fence held open at the source by a role that can only log in:
#       the move fails with 55P03 after its 3 tries of
#       sharding.move_freeze_timeout, nothing lost, and a writer of the
#       shard waits at most the timeout; released during the retries, the
#       move succeeds;
#   (e) DROP EXTENSION sharding and detach_node of an end during a move:
#       55006 naming the move; the move then completes.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 50);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';

# A call in the background with its messages' SQLSTATEs.
sub call_bg
{
	my ($node, $db, $sql) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $node->connstr($db), '-c', $sql ],
		'>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}
# Waits until a move's session at the destination waits for a lock (the held table).
sub copy_held
{
	my ($node, $db) = @_;
	return wait_for_sql($node, $db, "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name LIKE 'sharding_move_%' "
		  . "AND wait_event_type = 'Lock'", 't', 120);
}
# A statement's SQLSTATE and message (verbose), or 'ok'.
sub sqlstate_of
{
	my ($node, $db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, $sql, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return 'ok' if $rc == 0;
	return $err =~ /ERROR:\s+([0-9A-Z]{5}): ([^\n]*)/ ? "$1: $2" : $err;
}

# ------------------------------------------------------------------ (a) keys by value
my %tables = (uids => 'uuid', nums => 'bigint', blobs => 'bytea');
for my $map (sort keys %tables)
{
	my $sql = "CREATE TABLE t_$map (id bigint PRIMARY KEY, k $tables{$map} NOT NULL, val text); ALTER TABLE t_$map REPLICA IDENTITY FULL";
	$_->[0]->safe_psql($_->[1], $sql) for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
	$coord->safe_psql('coord', "SELECT sharding.create_map('$map', 8, ARRAY['n1', 'n2']); "
		  . "SELECT sharding.distribute('t_$map', 'k', '$map')");
}
wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables", '4') for ([$a, 'n1'], [$b, 'n2']);
# The source's walsenders print bytea in escape form.
$a->safe_psql('postgres', "ALTER DATABASE n1 SET bytea_output = 'escape'");

# Keys owned by n1, as typed literals, and the spelling isolate gets.
my $uuid = $coord->safe_psql('coord', "SELECT u FROM (SELECT md5(i::text)::uuid AS u, i FROM generate_series(1, 200) i) s "
	  . "WHERE sharding.node_for('uids', u) = 'n1' ORDER BY i LIMIT 1");
my @ints = split /,/, $coord->safe_psql('coord', "SELECT string_agg(i::text, ',') FROM (SELECT i FROM generate_series(1, 200) i "
	  . "WHERE sharding.node_for('nums', i::bigint) = 'n1' ORDER BY i LIMIT 2) s");
my $word = $coord->safe_psql('coord', "SELECT w FROM (SELECT 'key' || i AS w, i FROM generate_series(1, 200) i) s "
	  . "WHERE sharding.node_for('blobs', convert_to(w, 'UTF8')) = 'n1' ORDER BY i LIMIT 1");
my @cases = (
	[ 'upper-case uuid', 'uids', "'$uuid'::uuid", uc($uuid) ],
	[ "integer spelled '00$ints[0]'", 'nums', "$ints[0]::bigint", "00$ints[0]" ],
	[ "integer spelled ' +$ints[1]'", 'nums', "$ints[1]::bigint", " +$ints[1]" ],
	[ "bytea in escape form ('$word')", 'blobs', "convert_to('$word', 'UTF8')", $word ]);
my $id = 1000;
for my $case (@cases)
{
	my ($what, $map, $typed, $spelled) = @$case;
	my $t = "t_$map";
	$a->safe_psql('n1', "INSERT INTO $t SELECT $id + i, $typed, 'v' || i FROM generate_series(1, 20) i");
	# Another key of the same shard stays where it is.
	my $h = hold_table($b, 'n2', $t);
	my $iso = call_bg($coord, 'coord', "SELECT sharding.isolate('$map', '$spelled', 'n2')");
	ok(copy_held($b, 'n2'), "$what: the isolate's copy is held");
	# Writes to the key at the source while the copy waits.
	$a->safe_psql('n1', "INSERT INTO $t SELECT $id + 100 + i, $typed, 'new' || i FROM generate_series(1, 5) i; "
		  . "UPDATE $t SET val = 'upd' WHERE k = $typed AND id <= $id + 3; DELETE FROM $t WHERE k = $typed AND id = $id + 10");
	my $want = $a->safe_psql('n1', "SELECT count(*) || ' ' || string_agg(id || ':' || val, ',' ORDER BY id) FROM $t WHERE k = $typed");
	release_table($b, 'n2', $h);
	$iso->{h}->finish;
	is(${ $iso->{err} }, '', "$what: isolate succeeds");
	is($b->safe_psql('n2', "SELECT count(*) || ' ' || string_agg(id || ':' || val, ',' ORDER BY id) FROM $t WHERE k = $typed"),
		$want, "$what: every row and every write during the copy is at the destination");
	is($a->safe_psql('n1', "SELECT count(*) FROM $t WHERE k = $typed"), '0', "$what: none is left at the source");
	is($coord->safe_psql('coord', "SELECT sharding.node_for('$map', $typed)"), 'n2', "$what: node_for answers the destination");
	is($b->safe_psql('n2', "SELECT sharding.node_for('$map', $typed)"), 'n2', "$what: the destination routes it to itself");
	$id += 1000;
}
is(leftovers($coord, $a, $b), $clean, 'keys by value: nothing of the moves is left');
my $journal = $coord->safe_psql('coord', 'SELECT count(*) FROM sharding.move_journal');
my $pins = $coord->safe_psql('coord', 'SELECT count(*) FROM sharding.pins');
like(sqlstate_of($coord, 'coord', "SELECT sharding.isolate('nums', '7x', 'n2')"), qr/^22P02: /,
	'a spelling the key type rejects: 22P02');
like(sqlstate_of($coord, 'coord', "SELECT sharding.isolate('uids', 'not-a-uuid', 'n2')"), qr/^22P02: /,
	'a uuid spelling the type rejects: 22P02');
is($coord->safe_psql('coord', 'SELECT count(*) FROM sharding.move_journal') . '/' . $coord->safe_psql('coord', 'SELECT count(*) FROM sharding.pins'),
	"$journal/$pins", 'a rejected spelling: no journal row, no pin');

# ------------------------------------------------------------------ (b) the plan is fixed
my $S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my @tenants = shard_tenants($coord, $S);
my $whale = $tenants[0];
my $other_shard_key = $coord->safe_psql('coord', "SELECT 't' || lpad(i::text, 2, '0') FROM generate_series(0, 63) i "
	  . "WHERE sharding.logical_shard('bank', 't' || lpad(i::text, 2, '0')) <> $S ORDER BY i LIMIT 1");
is($coord->safe_psql('coord', "SELECT sharding.isolate('bank', '$whale', 'n1')"), '0', "isolate of $whale to its owner: a pin only");
my $whale_rows = $a->safe_psql('n1', "SELECT count(*) || '/' || sum(hashtext(id || val)) FROM accounts WHERE tenant = '$whale'");
# A table of rows already on the nodes, not yet distributed.
$_->[0]->safe_psql($_->[1], 'CREATE TABLE ledger (tenant text NOT NULL, id bigint PRIMARY KEY, val text); ALTER TABLE ledger REPLICA IDENTITY FULL')
  for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
$a->safe_psql('n1', "INSERT INTO ledger SELECT t, i, 'l' || i FROM (SELECT 't' || lpad((i % 64)::text, 2, '0') AS t, i "
	  . "FROM generate_series(1, 640) i) g WHERE sharding.node_for('bank', t) = 'n1'");
my $ledger = $a->safe_psql('n1', 'SELECT count(*) FROM ledger');
# A table keyed by another type than the map's: 22023.
$_->[0]->safe_psql($_->[1], 'CREATE TABLE odd (id bigint PRIMARY KEY, k bigint NOT NULL); ALTER TABLE odd REPLICA IDENTITY FULL') for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
like(sqlstate_of($coord, 'coord', "SELECT sharding.distribute('odd', 'k', 'bank')"), qr/^22023: /,
	'distribute of a table whose key is of another type than the map\'s: 22023');
# int4 and int8 keys count as one type.
$_->[0]->safe_psql($_->[1], 'CREATE TABLE nums4 (id bigint PRIMARY KEY, k integer NOT NULL); ALTER TABLE nums4 REPLICA IDENTITY FULL') for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
is(sqlstate_of($coord, 'coord', "SELECT sharding.distribute('nums4', 'k', 'nums')"), 'ok', 'an integer key joins a map of bigint keys');

my $shard_before = shard_sum($a, 'n1', $S);
my $h = hold_table($b, 'n2', 'accounts');
my $mv = call_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(copy_held($b, 'n2'), 'the move of the pinned key\'s shard is held in its copy');
like(sqlstate_of($coord, 'coord', "SELECT sharding.unpin('bank', '$whale')"), qr/^55006: .*move/,
	'unpin of a key of the moving shard: 55006 naming the move');
like(sqlstate_of($coord, 'coord', "SELECT sharding.pin('bank', '$tenants[1]', 'n2')"), qr/^55006: /,
	'pin of a key of the moving shard: 55006');
like(sqlstate_of($coord, 'coord', "SELECT sharding.pin_many('bank', ARRAY['$tenants[1]'], ARRAY['n2'])"), qr/^55006: /,
	'pin_many of a key of the moving shard: 55006');
is(sqlstate_of($coord, 'coord', "SELECT sharding.pin('bank', '$other_shard_key', 'n1')"), 'ok', 'a pin of another shard goes on');
like(sqlstate_of($coord, 'coord', "SELECT sharding.distribute('ledger', 'tenant', 'bank')"), qr/^55006: .*move/,
	'distribute of a table of the moving map: 55006 naming the move');
release_table($b, 'n2', $h);
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move succeeds');
$coord->safe_psql('coord', "SELECT sharding.unpin('bank', '$other_shard_key')");
is($a->safe_psql('n1', "SELECT count(*) || '/' || sum(hashtext(id || val)) FROM accounts WHERE tenant = '$whale'"), $whale_rows,
	"every row of the pinned key $whale stays at n1");
is($coord->safe_psql('coord', "SELECT sharding.node_for('bank', '$whale')"), 'n1', "$whale still routes to n1");
is($a->safe_psql('n1', 'SELECT count(*) FROM ledger'), $ledger, 'the undistributed table keeps every row at the source');
is(shard_rows($a, 'n1', $S), $a->safe_psql('n1', "SELECT count(*) FROM accounts WHERE tenant = '$whale'"),
	'only the pinned key\'s rows of the shard stay at the source');
is(leftovers($coord, $a, $b), $clean, 'the plan: nothing of the move is left');
$coord->safe_psql('coord', "SELECT sharding.distribute('ledger', 'tenant', 'bank') "
	  . "WHERE NOT EXISTS (SELECT FROM sharding.distributed_tables WHERE table_name = 'ledger')");

# ------------------------------------------------------------------ (c) a restored coordinator
my $S2 = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $sum2 = shard_sum($a, 'n1', $S2);
$h = hold_table($b, 'n2', 'accounts');
$mv = call_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S2, 'n2')");
ok(copy_held($b, 'n2'), 'a move held in its copy');
$coord->backup('during_copy');
release_table($b, 'n2', $h);
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move completes after the backup');
is(shard_sum($b, 'n2', $S2), $sum2, 'the destination owns every row of the shard');
my $restored = PostgreSQL::Test::Cluster->new('restored');
$restored->init_from_backup($coord, 'during_copy');
$restored->start;
# Its journal says the move is copying: its launcher (preloaded) or this
# call resolves it.
$restored->psql('coord', 'SELECT sharding._move_recover()');
wait_for_sql($restored, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE phase NOT IN ('done', 'failed', 'cancelled')", '0', 60);
is($restored->safe_psql('coord', "SELECT phase FROM sharding.move_journal WHERE logical = $S2 AND map = 'bank' ORDER BY move DESC LIMIT 1"),
	'done', 'the restored coordinator finishes the move whose destination owns the shard, never undoes it');
is(shard_sum($b, 'n2', $S2), $sum2, 'the restored coordinator\'s recovery leaves every row of the shard at its new owner');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S2"), 'n2', 'n2 owns the shard');
$restored->stop;
is(leftovers($coord, $a, $b), $clean, 'after the restored coordinator: nothing of the move is left');

# ------------------------------------------------------------------ (d) bounded freeze
my $S3 = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $sum3 = shard_sum($a, 'n1', $S3);
my ($t3) = shard_tenants($coord, $S3);
$a->safe_psql('n1', 'CREATE ROLE login_only LOGIN');
my $epoch = $a->safe_psql('n1', "SELECT epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S3");
my ($fout, $ferr) = ('', '');
my $fence = { out => \$fout, err => \$ferr };
$fence->{h} = IPC::Run::start([ 'psql', '-XAtq', '-d', $a->connstr('n1') . ' user=login_only', '-c',
		"BEGIN; SELECT sharding.fence('bank', $S3, $epoch); SELECT pg_sleep(600)" ], '>', \$fout, '2>', \$ferr);
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE usename = 'login_only' AND query LIKE '%sharding.fence(%' "
	  . "AND wait_event = 'PgSleep'", '1', 60), 'a role that can only log in holds a fence open at the source');
my $started = time;
$mv = call_bg($coord, 'coord', "SET sharding.move_freeze_timeout = '3s'; SELECT sharding.move_shard_online('bank', $S3, 'n2')");
ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE phase = 'cutover'", '1', 120),
	'the move reaches its cutover');
# A writer of the shard at the source while the freeze waits.
usleep(500_000);
my $w0 = time;
my ($wrc, $wout, $werr) = $a->psql('n1', "SET statement_timeout = '20s'; INSERT INTO accounts VALUES ('$t3', 990001, 'during freeze')");
my $waited = time - $w0;
ok($wrc == 0 && $waited < 3 + 1.5, sprintf('a writer of the shard waits at most the freeze timeout (%.1f s)', $waited)) or diag($werr);
my $ended = 0;
for (1 .. 600)
{
	$mv->{h}->pump_nb if $mv->{h}->pumpable;
	if (!$mv->{h}->pumpable) { $ended = 1; last; }
	last if time - $started > 60;
	usleep(100_000);
}
my $took = time - $started;
$a->safe_psql('n1', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%sharding.fence(%' AND pid <> pg_backend_pid()");
$fence->{h}->finish;
$mv->{h}->finish;
ok($ended, sprintf('the move ends while the fence is held (%.1f s)', $took));
diag(sprintf('bounded freeze (timeout 3 s, 3 tries): a writer of the shard waited %.2f s; the move failed after %.1f s', $waited, $took));
like(${ $mv->{err} }, qr/ERROR:\s+55P03: /, 'the move fails with 55P03');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S3"), 'n1', 'n1 keeps the shard');
is(shard_rows($b, 'n2', $S3), '0', 'nothing of the shard is left at the destination');
is(shard_rows($a, 'n1', $S3), (split m{/}, $sum3)[0] + ($wrc == 0 ? 1 : 0), 'every row of the shard is at the source');
is(leftovers($coord, $a, $b), $clean, 'bounded freeze: nothing of the move is left');

# The same with the fence released during the retries: the move succeeds.
my $sum3b = shard_sum($a, 'n1', $S3);
($fout, $ferr) = ('', '');
$fence = { out => \$fout, err => \$ferr };
$fence->{h} = IPC::Run::start([ 'psql', '-XAtq', '-d', $a->connstr('n1') . ' user=login_only', '-c',
		"BEGIN; SELECT sharding.fence('bank', $S3, $epoch); SELECT pg_sleep(600)" ], '>', \$fout, '2>', \$ferr);
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE usename = 'login_only' AND query LIKE '%sharding.fence(%' "
	  . "AND wait_event = 'PgSleep'", '1', 60), 'the fence is held open again');
$mv = call_bg($coord, 'coord', "SET sharding.move_freeze_timeout = '3s'; SELECT sharding.move_shard_online('bank', $S3, 'n2')");
ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE phase = 'cutover'", '1', 120),
	'the move reaches its cutover again');
# Past the first try (3 s), within the second (from about 4 s to 7 s).
usleep(4_500_000);
$a->safe_psql('n1', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%sharding.fence(%' AND pid <> pg_backend_pid()");
$fence->{h}->finish;
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'with the fence released during the retries, the move succeeds');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S3"), 'n2', 'n2 owns the shard');
is(shard_sum($b, 'n2', $S3), $sum3b, 'every row of the shard is at the destination');
is(shard_rows($a, 'n1', $S3), '0', 'none is left at the source');
is(leftovers($coord, $a, $b), $clean, 'nothing of the move is left');

# ------------------------------------------------------------------ (e) DROP EXTENSION, detach_node
my $S4 = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
$h = hold_table($b, 'n2', 'accounts');
$mv = call_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S4, 'n2')");
ok(copy_held($b, 'n2'), 'a move held in its copy');
like(sqlstate_of($coord, 'coord', 'DROP EXTENSION sharding CASCADE'), qr/^55006: .*move/, 'DROP EXTENSION during a move: 55006 naming the move');
like(sqlstate_of($coord, 'coord', "SELECT sharding.detach_node('n2')"), qr/^55006: .*move/, 'detach_node of its destination: 55006');
like(sqlstate_of($coord, 'coord', "SELECT sharding.detach_node('n1')"), qr/^55006: .*move/, 'detach_node of its source: 55006');
like(sqlstate_of($coord, 'coord', "SELECT sharding.undistribute('ledger')"), qr/^55006: /,
	'undistribute of a table of the moving map: 55006');
like(sqlstate_of($coord, 'coord', "SELECT sharding.drop_map('bank')"), qr/^55006: /, 'drop_map of the moving map: 55006');
like(sqlstate_of($coord, 'coord', "SELECT sharding.drop_node('n2')"), qr/^55006: /, 'drop_node of an end of the move: 55006');
release_table($b, 'n2', $h);
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move then completes');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S4"), 'n2', 'n2 owns the shard');
is(leftovers($coord, $a, $b), $clean, 'nothing of the move is left');

done_testing();
