# DROP DATABASE of the coordinator's database while a move is in flight
# (issue 35, review LK-2). The move is held in its copy by a session at the
# destination holding accounts in SHARE mode.
#   (a) library preloaded: DROP DATABASE coord WITH (FORCE), from another
#       database, is refused with 55006, its hint naming the move to cancel;
#       the move goes on and completes, nothing of it left;
#   (b) not preloaded (the coordinator restarted without it): nothing can
#       refuse the drop; the nodes are left with the move's slot,
#       publication and decoding row at the source, its subscription and
#       copied rows at the destination. The clean-up docs/moves.md gives
#       ("Dropping the coordinator's database") removes all of it, and the
#       source keeps every row of the shard exactly once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 50);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
sub copy_held
{
	return wait_for_sql($b, 'n2', "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name LIKE 'sharding_move_%' "
		  . "AND wait_event_type = 'Lock'", 't', 120);
}
# The nodes' configuration subscriptions disabled (a node restarting, a
# network cut): their slots in coord are inactive, and PostgreSQL's own
# DROP DATABASE ... WITH (FORCE) drops them instead of refusing
# ("database is used by an active logical replication slot").
sub config_subscriptions
{
	my ($on) = @_;
	$_->[0]->safe_psql($_->[1], "ALTER SUBSCRIPTION sharding_config_$_->[1] " . ($on ? 'ENABLE' : 'DISABLE'))
	  for ([$a, 'n1'], [$b, 'n2']);
	wait_for_sql($coord, 'coord', "SELECT count(*) FROM pg_replication_slots WHERE database = 'coord' AND active", '0')
	  unless $on;
}
my @n1 = split /\n/, $coord->safe_psql('coord',
	"SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n1' ORDER BY logical LIMIT 2");
my ($S, $T) = @n1;

# ------------------------------------------------------------------ (a) preloaded
my $sum = shard_sum($a, 'n1', $S);
my $h = hold_table($b, 'n2', 'accounts');
my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(copy_held(), 'preloaded: a move held in its copy');
my $move = $coord->safe_psql('coord', "SELECT move FROM sharding.move_journal WHERE map = 'bank' AND logical = $S
                                        AND phase NOT IN ('queued', 'done', 'failed', 'cancelled')");
config_subscriptions(0);
my ($rc, $out, $err) = $coord->psql('postgres', "\\set VERBOSITY verbose\nDROP DATABASE coord WITH (FORCE)");
like($err, qr/ERROR:  55006: database "coord" cannot be dropped: move $move is in flight there/,
	'preloaded: DROP DATABASE coord WITH (FORCE) is refused with 55006') or diag($err);
like($err, qr/HINT:  Cancel the move first: in database "coord", SELECT sharding._move_cancel\($move\);/,
	'its hint says how to cancel the move');
($rc, $out, $err) = $coord->psql('postgres', "\\set VERBOSITY verbose\nDROP DATABASE coord");
like($err, qr/ERROR:  55006: database "coord" cannot be dropped: move $move/, 'preloaded: DROP DATABASE coord without FORCE too');
config_subscriptions(1);
release_table($b, 'n2', $h);
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move goes on and completes');
is(shard_sum($b, 'n2', $S) . ' ' . shard_rows($a, 'n1', $S), "$sum 0", 'every row of the shard at the destination, none at the source');
is(leftovers($coord, $a, $b), $clean, 'nothing of the move is left');
$coord->safe_psql('postgres', 'CREATE DATABASE spare');
$coord->safe_psql('postgres', 'DROP DATABASE spare WITH (FORCE)');
pass('a database without a move in flight drops as before');

# ------------------------------------------------------------------ (b) not preloaded
# The move held in its catch-up (copied, its subscription streaming): the
# destination's apply worker sleeps on a row written at the source meanwhile.
$coord->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$coord->restart;
my $tsum = shard_sum($a, 'n1', $T);
my ($tt) = shard_tenants($coord, $T);
slow_apply($b, 'n2', 600);
$h = hold_table($b, 'n2', 'accounts');
$mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $T, 'n2')");
ok(copy_held(), 'not preloaded: a move held in its copy');
# A row written meanwhile reaches the destination through the stream.
$a->safe_psql('n1', "INSERT INTO accounts VALUES ('$tt', 990001, 'during')");
$tsum = shard_sum($a, 'n1', $T);
release_table($b, 'n2', $h);
ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE map = 'bank' AND logical = $T AND phase = 'catching_up'", '1', 120),
	'the move copied the shard and catches up');
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'logical replication%' AND wait_event = 'PgSleep'", '1', 60),
	'its apply worker holds the catch-up');
config_subscriptions(0);
$coord->safe_psql('postgres', 'DROP DATABASE coord WITH (FORCE)');
$mv->{h}->finish;
pass('not preloaded: DROP DATABASE coord WITH (FORCE) goes through');
my $q = q{SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM sharding.frozen_shards)
	|| '/' || (SELECT count(*) FROM sharding.move_decoding)};
sub nodes_left { return 'n1:' . $a->safe_psql('n1', $q) . ' n2:' . $b->safe_psql('n2', $q); }
is(nodes_left(), 'n1:1/0/1/0/1 n2:0/1/0/0/0', 'not preloaded: the forced drop leaves the move\'s slot, publication, decoding row and subscription');
ok(shard_rows($b, 'n2', $T) > 0, 'and the rows it copied at the destination');
# The clean-up of docs/moves.md, "Dropping the coordinator's database":
# at the destination, then at the source. The name
# (sharding_move_<tag>_<map>_<logical>) is the source's slot's.
my $name = $a->safe_psql('n1', "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%'");
like($name, qr/^sharding_move_[0-9a-f]{6}_bank_${T}$/, "the move's objects are named $name");
$b->safe_psql('n2', "ALTER SUBSCRIPTION $name DISABLE;
                     ALTER SUBSCRIPTION $name SET (slot_name = NONE);
                     DROP SUBSCRIPTION $name;
                     SET session_replication_role = replica;
                     DELETE FROM accounts WHERE sharding.logical_shard('bank', tenant) = $T;");
$a->safe_psql('n1', "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '$name' AND active_pid IS NOT NULL");
wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$name' AND active_pid IS NOT NULL", '0');
$a->safe_psql('n1', "SELECT pg_drop_replication_slot('$name');
                     DROP PUBLICATION IF EXISTS $name;
                     DELETE FROM sharding.move_decoding WHERE slot = '$name';
                     SELECT sharding._thaw_shard('bank', $T);");
is(nodes_left(), 'n1:0/0/0/0/0 n2:0/0/0/0/0', 'after the documented clean-up nothing of the move is left at the nodes');
is(shard_sum($a, 'n1', $T) . ' ' . shard_rows($b, 'n2', $T), "$tsum 0", 'the source keeps every row of the shard, the destination none');

done_testing();
