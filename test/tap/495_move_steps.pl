# One vocabulary for a move's steps (issue 37; docs/moves.md, "Steps"): the
# journal's phase, move_progress's phase and the step the engine says it is
# in (its DEBUG1 line on entering a step, and the step fail_move names) are
# the same word at every step. A move of shard S from n1 to n2 is held
#   1. in its copy (a session at the destination holds a row's key),
#   2. in its catch-up (another holds the key of a row written at the
#      source after the copy's snapshot, so the apply waits),
#   3. in its cutover (a fence at the source: the freeze waits),
#   4. in its clean-up (a row lock at the source: the delete waits),
# and at each hold the three agree; then a move back, held in its
# catch-up, is cancelled: fail_move names the journal's phase as its step.
# The journal's phases are exactly the contract's (section 13).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 20);
my $S = 0;    # n1's
my ($T) = shard_tenants($coord, $S);
my $id0 = $a->safe_psql('n1', "SELECT min(id) FROM accounts WHERE tenant = '$T'");

is($coord->safe_psql('coord', q{SELECT string_agg(w[1], ' ' ORDER BY n) FROM pg_constraint c,
		regexp_matches(pg_get_constraintdef(c.oid), '''([a-z_]+)''', 'g') WITH ORDINALITY AS r(w, n)
		WHERE c.conrelid = 'sharding.move_journal'::regclass AND c.contype = 'c'
		  AND pg_get_constraintdef(c.oid) LIKE '%phase%'}),
	'queued copying catching_up cutover cleanup done failed cancelled',
	"the journal's phases are the contract's");

# hold(node, db, tag, sql): a session there runs sql in a transaction it
# keeps open (until release(node, db, tag)).
sub hold
{
	my ($n, $db, $tag, $sql) = @_;
	my $h = psql_bg($n, $db, "BEGIN; $sql; SELECT 'hold-$tag', pg_sleep(600)");
	ok(wait_for_sql($n, $db, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%''hold-$tag'', pg_sleep(600)' "
			  . "AND wait_event = 'PgSleep'", '1', 60), "$db holds: $tag");
	return $h;
}
sub release
{
	my ($n, $db, $tag, $h) = @_;
	$n->safe_psql($db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
		  . "WHERE query LIKE '%''hold-$tag'', pg_sleep(600)' AND pid <> pg_backend_pid()");
	$h->{h}->finish;
}
# A key held at a node as a move's copy or apply would write it (the guard
# does not refuse under session_replication_role = replica).
sub hold_key
{
	my ($n, $db, $tag, $id) = @_;
	return hold($n, $db, $tag, "SET session_replication_role = replica; "
		  . "INSERT INTO accounts VALUES ('$T', $id, 'holder')");
}

# agree(step, log offset): the journal's phase, move_progress's and the
# engine's last step line (DEBUG1 "move <name>: <step> at <time>") are step.
my $journal = "SELECT phase FROM sharding.move_journal WHERE logical = $S ORDER BY move DESC LIMIT 1";
sub agree
{
	my ($step, $from) = @_;
	ok(wait_for_sql($coord, 'coord', $journal, $step, 120), "the journal says $step");
	is($coord->safe_psql('coord', "SELECT phase FROM sharding.move_progress WHERE logical = $S AND job IS NULL"),
		$step, "move_progress says $step");
	my $log = slurp_file($coord->logfile, $from);
	ok($log =~ /DEBUG:\s+move sharding_move\S*: \Q$step\E at \d{4}-/,
		"the engine's step line names $step")
	  or diag('the engine said: ' . join(', ', $log =~ /DEBUG:\s+move sharding_move\S*: (\S+) at \d{4}-/g));
}

# The move, with a fence at the source (no transaction id: the slot's
# creation does not wait for it) holding its cutover, and the destination
# holding the copy of the tenant's first row.
my $gate = $a->background_psql('n1', on_error_stop => 1);
$gate->query_safe('BEGIN');
$gate->query_safe("SELECT sharding.fence('bank', $S, sharding.epoch('bank', $S))");
my $copy = hold_key($b, 'n2', 'copy', $id0);
my $from = -s $coord->logfile;
my $mv = psql_bg($coord, 'coord', "SET log_min_messages = debug1; SET sharding.move_freeze_timeout = '10min'; "
	  . "SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT sharding._move_pull(%' "
		  . "AND wait_event_type = 'Lock'", '1', 120), '1. the copy waits for the held key');
agree('copying', $from);

# 2. A row written at the source after the copy's snapshot, its key held at
# the destination: the catch-up's apply waits for it.
$a->safe_psql('n1', "INSERT INTO accounts VALUES ('$T', 9000001, 'after the snapshot')");
my $apply = hold_key($b, 'n2', 'apply', 9000001);
release($b, 'n2', 'copy', $copy);
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'logical replication%worker' "
		  . "AND wait_event_type = 'Lock'", '1', 120), '2. the apply waits for the held key');
agree('catching_up', $from);

# 3. The source's delete after the switch held by a row lock there; the
# apply let go: the cutover waits for the fence.
my $delete = hold($a, 'n1', 'delete', "SELECT id FROM accounts WHERE id = $id0 FOR UPDATE");
release($b, 'n2', 'apply', $apply);
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%_freeze_shard%' "
		  . "AND wait_event_type = 'Lock'", '1', 120), '3. the freeze waits for the fence');
agree('cutover', $from);

# 4. The fence let go: the switch commits, the delete waits.
$gate->query_safe('COMMIT');
$gate->quit;
my $deleting = deleting();
ok(wait_for_sql($a, 'n1', "SELECT count(*) > 0 FROM pg_stat_activity WHERE $deleting AND wait_event_type = 'Lock'",
		't', 120), '4. the source-side delete waits for the row lock');
agree('cleanup', $from);
release($a, 'n1', 'delete', $delete);
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move succeeds');
is($coord->safe_psql('coord', $journal), 'done', 'the journal says done');
is($coord->safe_psql('coord', "SELECT count(*) FROM sharding.move_progress WHERE logical = $S AND job IS NULL"), '0',
	'move_progress shows the direct move no more');

# 5. The move back, held in its catch-up, cancelled: fail_move names the
# step it failed in as the journal does.
$copy = hold_key($a, 'n1', 'copy', $id0);
$from = -s $coord->logfile;
$mv = psql_bg($coord, 'coord', "SET log_min_messages = debug1; SELECT sharding.move_shard_online('bank', $S, 'n1')");
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT sharding._move_pull(%' "
		  . "AND wait_event_type = 'Lock'", '1', 120), '5. the copy back waits for the held key');
$b->safe_psql('n2', "INSERT INTO accounts VALUES ('$T', 9000002, 'after the snapshot')");
$apply = hold_key($a, 'n1', 'apply', 9000002);
release($a, 'n1', 'copy', $copy);
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'logical replication%worker' "
		  . "AND wait_event_type = 'Lock'", '1', 120), '5. the apply waits for the held key');
agree('catching_up', $from);
is($coord->safe_psql('coord', "SELECT pg_cancel_backend(" . mover_pid($coord) . ")"), 't', '5. the move is cancelled');
release($a, 'n1', 'apply', $apply);
$mv->{h}->finish;
like(${ $mv->{err} }, qr/cancel/, '5. the move fails with the cancel');
my $log = slurp_file($coord->logfile, $from);
my ($failed_at) = $log =~ /DEBUG:\s+move sharding_move\S* failed at step (\S+):/;
is($failed_at, 'catching_up', "5. fail_move names the step as the journal did");
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n2',
	'5. the shard stays with n2');
is(leftovers($coord, $a, $b), 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0', '5. nothing of the move is left');
done_testing();
