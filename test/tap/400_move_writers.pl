# Online moves under writers that log every commit (docs/moves.md): a shard
# move, three concurrent moves (two in the same direction, one the opposite
# way between the same two nodes), isolate; after each the nodes hold exactly
# what the log implies, every row on the node node_for names, and nothing of
# the moves is left. Also: the decoder sends only the moving shard's changes
# (an UPDATE bringing a key in as an INSERT, one taking it out as a DELETE),
# the guard refuses key changes into a moving shard, and owner switches alone
# are refused on a map with a distributed table.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 40);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my @tenants = map { sprintf('t%02d', $_) } 0 .. 63;
my $owner = sub { $coord->safe_psql('coord', "SELECT node || '/' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $_[0]") };

# 1. One shard under writers.
my $ws = start_writers($coord, 3, \@tenants);
sleep 1;
is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', 0, 'n2')"), '2',
	'move_shard_online of shard 0 under writers returns epoch 2');
sleep 1;
writers_kept($coord, $a, $b, $ws, '');
is(shard_rows($a, 'n1', 0), '0', 'the source holds none of shard 0');
is(leftovers($coord, $a, $b), $clean, 'no publication, subscription, slot, freeze, decoding row or live journal row is left');
my $j = $coord->safe_psql('coord', "SELECT phase || '|' || (rows_copied > 0)::int || '|' || (bytes_copied > 0)::int || '|' || (finished >= started)::int FROM sharding.move_journal WHERE logical = 0 AND job IS NULL ORDER BY move DESC LIMIT 1");
is($j, 'done|1|1|1', 'the journal row: done, rows and bytes copied, finished');

# 2. Three moves at once under writers: shards 1 and 2 from n1 to n2, shard
# 6 from n2 to n1 (the opposite direction between the same nodes).
$ws = start_writers($coord, 3, \@tenants);
sleep 1;
my @mv = map { psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $_->[0], '$_->[1]')") }
  ([1, 'n2'], [2, 'n2'], [6, 'n1']);
$_->{h}->finish for @mv;
is(join(' ', map { ${ $_->{out} } =~ s/\s+$//r } @mv), '2 2 2', 'three concurrent moves (both directions) each return epoch 2');
is(join(' ', map { ${ $_->{err} } eq '' ? 'ok' : ${ $_->{err} } } @mv), 'ok ok ok', 'none of them raised');
sleep 1;
my ($stats) = stop_writers($coord, $ws);
my ($committed, $refused, $anomalies, $errors) = split /\|/, $stats;
is("$anomalies|$errors", '0|0', "writers: $committed commits, no anomaly, no failure");
my ($exp, $got, $misplaced) = expected_vs_actual($coord, $a, $b);
is($got, $exp, 'after the concurrent moves the nodes hold exactly what the log implies');
diag('per shard, expected / n1 / n2: ' . join(' ', map {
	my $l = $_;
	$l . ':' . $coord->safe_psql('coord', "SELECT count(*) FROM (SELECT DISTINCT ON (id) id, tenant, op FROM oplog ORDER BY id, seq DESC) l WHERE op <> 'delete' AND sharding.logical_shard('bank', tenant) = $l")
	  . '/' . shard_rows($a, 'n1', $l) . '/' . shard_rows($b, 'n2', $l) } 0 .. 7));
diag('t17 in shard ' . $coord->safe_psql('coord', "SELECT sharding.logical_shard('bank', 't17'::text)"));
is($misplaced, 0, 'every row is on its owner');
is($owner->(1) . ' ' . $owner->(2) . ' ' . $owner->(6), 'n2/2 n2/2 n1/2', 'owners switched');
is(leftovers($coord, $a, $b), $clean, 'nothing of the three moves is left');

# 3. isolate under writers.
$ws = start_writers($coord, 2, \@tenants);
my $src = $coord->safe_psql('coord', "SELECT sharding.node_for('bank', 't07'::text)");
my $dst = $src eq 'n1' ? 'n2' : 'n1';
sleep 1;
my $moved = $coord->safe_psql('coord', "SELECT sharding.isolate('bank', 't07', '$dst')");
($stats) = stop_writers($coord, $ws);
ok($moved > 0, "isolate moved $moved rows of t07 from $src to $dst");
($exp, $got, $misplaced) = expected_vs_actual($coord, $a, $b);
is($got, $exp, 'after isolate the nodes hold exactly what the log implies');
is($misplaced, 0, 'the pinned key is on its new node');
is(leftovers($coord, $a, $b), $clean, 'nothing of isolate is left');

# 4. The guard refuses a key change into a shard that is moving from its
# node (as it does while sharding.move_decoding has the shard's row).
my $in3 = $coord->safe_psql('coord', "SELECT t FROM unnest(ARRAY['" . join("','", @tenants) . "']) t WHERE sharding.logical_shard('bank', t) = 3 LIMIT 1");
my $in4 = $coord->safe_psql('coord', "SELECT t FROM unnest(ARRAY['" . join("','", @tenants) . "']) t WHERE sharding.logical_shard('bank', t) = 4 LIMIT 1");
my $n3 = $coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 3");
my $node3 = $n3 eq 'n1' ? $a : $b;
$coord->safe_psql('coord', "SELECT sharding._switch_owner('bank', 4, '$n3')");
wait_for_sql($node3, $n3, "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 4", $n3);
$node3->safe_psql($n3, "SET session_replication_role = replica; INSERT INTO accounts VALUES ('$in4', 99000001, 'rekey me')");
$node3->safe_psql($n3, "INSERT INTO sharding.move_decoding VALUES ('sharding_move_probe', 'bank', 8, 3, NULL, '{}', ARRAY['accounts'::regclass]::oid[], ARRAY['tenant'])");
my ($rc, $out, $err) = $node3->psql($n3, "UPDATE accounts SET tenant = '$in3' WHERE id = 99000001");
like($err, qr/being moved online/, 'a key change into a moving shard is refused (55000) while it moves');
$node3->safe_psql($n3, "DELETE FROM sharding.move_decoding WHERE slot = 'sharding_move_probe'");
is($node3->safe_psql($n3, "UPDATE accounts SET tenant = '$in3' WHERE id = 99000001 RETURNING tenant"), $in3,
	'and allowed once the move is over');
$node3->safe_psql($n3, "DELETE FROM accounts WHERE id = 99000001");

# 5. The decoder: only the shard's changes leave the source.
my $d = $coord;
$d->safe_psql('coord', q{
	CREATE TABLE dt (k text, id integer, v text, PRIMARY KEY (k, id));
	CREATE PUBLICATION dp FOR TABLE dt;
	INSERT INTO sharding.move_decoding VALUES ('sharding_move_dtest', 'm', 8, 2, NULL, '{k_pinned}', ARRAY['dt'::regclass]::oid[], ARRAY['k']);
});
# (Servers with output_plugin_libraries must allow the plugin; a move's own
# sessions add it themselves.)
if ($d->safe_psql('coord', "SELECT current_setting('output_plugin_libraries', true) IS NOT NULL") eq 't')
{
	$d->append_conf('postgresql.conf', "output_plugin_libraries = 'pgoutput, sharding'");
	$d->reload;
	wait_for_sql($d, 'coord', "SELECT current_setting('output_plugin_libraries') ~ 'sharding'", 't');
}
$d->safe_psql('coord', "SELECT pg_create_logical_replication_slot('sharding_move_dtest', 'sharding')");
my ($in, $out2) = map { $d->safe_psql('coord', "SELECT k FROM (SELECT 'k' || i AS k FROM generate_series(1, 200) i) s WHERE sharding.shard_of(k, 8) $_ 2 LIMIT 1") } ('=', '<>');
my $pinned_in = $d->safe_psql('coord', "SELECT sharding.shard_of('k_pinned', 8) = 2");
$d->safe_psql('coord', qq{
	INSERT INTO dt VALUES ('$in', 1, 'in'), ('$out2', 2, 'out');
	UPDATE dt SET v = 'in2' WHERE id = 1;
	UPDATE dt SET v = 'out2' WHERE id = 2;
	UPDATE dt SET k = '$in' WHERE id = 2;
	UPDATE dt SET k = '$out2' WHERE id = 1;
	DELETE FROM dt WHERE id = 1;
	DELETE FROM dt WHERE id = 2;
});
my $peek = q{
	SELECT string_agg(chr(get_byte(data, 0)), '' ORDER BY lsn)
	  FROM pg_logical_slot_peek_binary_changes('sharding_move_dtest', NULL, NULL, 'proto_version', '1', 'publication_names', 'dp')
	 WHERE chr(get_byte(data, 0)) IN ('I', 'U', 'D')};
# The decoder sends only while the move's controller holds its lock at the
# source (src/datanode/move_controller.hpp): here the peeking session itself.
my $msgs = $d->safe_psql('coord',
	"SELECT pg_advisory_lock(1936220515, hashtext('sharding_move_dtest'));" . $peek);
# in: insert, update; out: nothing; out->in: insert; in->out: delete; delete of
# the row now in the shard; the other delete not sent.
like($msgs, qr/^\s*IUIDD$/, 'decoder: the shard\'s insert and update; a key brought in as I, taken out as D; other keys not sent');
# (The session that held the lock may still be exiting: wait until the lock is free.)
wait_for_sql($d, 'coord', "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1936220515 AND objsubid = 2", '0');
my (undef, undef, $gone) = $d->psql('coord', $peek);
like($gone, qr/the online move of slot "sharding_move_dtest" has lost its coordinator/,
	'decoder: nothing is sent when nobody holds the controller lock');
# A large transaction streamed before it commits (streaming on, past
# logical_decoding_work_mem) passes the same filter. The first decoding
# of this session ends in an ERROR (no controller): the next one in the
# same session starts afresh.
my $ins = $d->safe_psql('coord', "SELECT pg_current_wal_insert_lsn()");
$d->safe_psql('coord', "SELECT pg_replication_slot_advance('sharding_move_dtest', '$ins')");
$d->safe_psql('coord', "INSERT INTO dt SELECT 'k' || i, 1000 + i, repeat('x', 200) FROM generate_series(1, 3000) i");
my $want_in = $d->safe_psql('coord', "SELECT count(*) FROM dt WHERE id > 1000 AND sharding.shard_of(k, 8) = 2 AND k <> 'k_pinned'");
my $stream = q{
	SELECT string_agg(DISTINCT chr(get_byte(data, 0)), '') || ' ' || count(*) FILTER (WHERE chr(get_byte(data, 0)) = 'I')
	  FROM pg_logical_slot_peek_binary_changes('sharding_move_dtest', NULL, NULL, 'proto_version', '2',
	       'streaming', 'on', 'publication_names', 'dp')};
my (undef, $streamed, $stream_err) = $d->psql('coord',
	"SET logical_decoding_work_mem = '64kB';\n$stream;\nSELECT pg_advisory_lock(1936220515, hashtext('sharding_move_dtest'));\n$stream;",
	on_error_stop => 0);
like($stream_err, qr/has lost its coordinator/, 'decoder, streamed: the first decoding (no controller) ends in an error');
my ($kinds, $inserts) = split / /, (split /\n/, $streamed)[-1];
like($kinds, qr/S/, "decoder, streamed: the transaction was streamed before its commit (messages $kinds)");
is($inserts, $want_in, "decoder, streamed: only the shard's $want_in of 3000 inserts are sent");
$d->safe_psql('coord', "SELECT pg_drop_replication_slot('sharding_move_dtest')");

# 6. Owner switches alone are refused on a map with a distributed table.
my $before = $coord->safe_psql('coord', "SELECT string_agg(node || epoch, ',' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'");
my $n2_shard = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n2'");
for my $sql ("SELECT sharding.move_shard('bank', $n2_shard, 'n1')", "SELECT * FROM sharding.rebalance('bank', ARRAY['n1'])",
	"SELECT * FROM sharding.rebalance_by_load('bank', ARRAY['n1'], array_fill(1::float8, ARRAY[8]))")
{
	my ($r, $o, $e) = $coord->psql('coord', "\\set VERBOSITY verbose\n$sql");
	like($e, qr/55000.*public\.accounts/s, "refused with 55000 naming the table: $sql");
}
is($coord->safe_psql('coord', "SELECT string_agg(node || epoch, ',' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'"),
	$before, 'the refused switches changed nothing');
done_testing();
