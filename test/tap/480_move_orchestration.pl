# The C++ orchestration of moves and jobs (docs/moves.md: no PL/pgSQL on the
# move's path) on the paths the other move tests do not cross:
#   1. a cancel while the move waits for its destination to catch up
#      (_move_wait_flush, with a backlog the destination applies slowly):
#      the call ends at once with 57014, and the move is rolled back:
#      no row of the shard at the destination (also 10 s later), the source
#      keeps every row and writes again, nothing of the move is left;
#      meanwhile the live lag (_job_lag, as move_progress reads it) came
#      from the source without dblink on the coordinator;
#   2. _move_wait_flush called on its own: a statement_timeout ends it (the
#      poll running at the source is cancelled there) and its own timeout
#      gives 55000 naming the seconds;
#   3. the coordinator's server stopped -m immediate while the move deletes
#      the shard's rows at the source (after its switch): nobody calls
#      anything, and the jobs launcher's scan after the restart finishes the
#      move (_job_pickup, _move_recover, _move_resolve in C++);
#   4. CALL rebalance_run (a C procedure that commits between steps) with a
#      hostile search_path, carrying out a real move of rows: no function
#      or operator of the caller's schema runs; in a transaction block it
#      is refused with 2D000;
#   5. what the nodes answer is parsed, never spliced into the
#      coordinator's SQL: a source without a WAL flush position (section 2)
#      and a destination whose _move_pull answers SQL are 08P01.
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
load_rows($coord, $a, $b, 200);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my $sum = sub { $_[0]->safe_psql($_[1], "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $_[2], 'accounts')") };
my $S = 0;    # n1's
my @tenants = shard_tenants($coord, $S);
my $slot = $coord->safe_psql('coord', "SELECT sharding._move_name('bank', $S)");
# The capacity checks and the live lag ask the nodes without dblink now.
$coord->safe_psql('coord', 'DROP EXTENSION dblink');

# hold_copy(): a session at the destination holding a lock that the copy
# into accounts waits for (the move stays in its copy).
sub hold_copy { return psql_bg($b, 'n2', "BEGIN; LOCK accounts IN SHARE MODE; SELECT pg_sleep(600)"); }
sub release
{
	my ($n, $db, $h, $what) = @_;
	$n->safe_psql($db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%$what%' AND pid <> pg_backend_pid()");
	$h->{h}->finish;
}
sub journal { $coord->safe_psql('coord', "SELECT $_[0] FROM sharding.move_journal ORDER BY move DESC LIMIT 1") }

# 1. Cancel during the catch-up's wait. The backlog: 100 rows of the shard
# written at the source while the copy waits (after the slot's snapshot, so
# they travel in the stream), applied at 0.2 s per row.
slow_apply($b, 'n2', 0.2);
my $lock = hold_copy();
my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE phase = 'copying' AND pid IS NOT NULL", '1', 60),
	'catch-up: the move copies');
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'", '1', 60), "catch-up: the slot exists");
$a->safe_psql('n1', "INSERT INTO accounts SELECT '$tenants[0]', i, 'backlog-' || i FROM generate_series(5000001, 5000100) i");
my $src_sum = $sum->($a, 'n1', $S);
release($b, 'n2', $lock, 'LOCK accounts IN SHARE MODE');
ok(wait_for_sql($coord, 'coord', "SELECT phase = 'catching_up' AND lag_bytes > 0 FROM sharding.move_journal ORDER BY move DESC LIMIT 1", 't', 60),
	'catch-up: the move waits for its destination, with a lag in the journal');
is($coord->safe_psql('coord', "SELECT sharding._job_lag('n1', '$slot') > 0"), 't',
	'catch-up: the live lag is read at the source (no dblink here)');
is($coord->safe_psql('coord', "SELECT lag_bytes > 0 FROM sharding.move_progress WHERE logical = $S"), 't',
	'catch-up: move_progress shows it');
my $t0 = time;
is($coord->safe_psql('coord', "SELECT pg_cancel_backend(" . mover_pid($coord) . ")"), 't', 'catch-up: the caller is cancelled');
$mv->{h}->finish;
my $took = time - $t0;
like(${ $mv->{err} }, qr/canceling statement due to user request/, 'catch-up: move_shard_online reports the cancel (57014)');
ok($took < 15, sprintf('catch-up: the call ended %.1f s after the cancel, with the backlog still unapplied', $took));
is(journal('phase || \' \' || undone'), 'cancelled true', 'catch-up: the journal says cancelled, rolled back');
is(shard_rows($b, 'n2', $S), '0', 'catch-up: no row of the shard at the destination');
is($sum->($a, 'n1', $S), $src_sum, 'catch-up: the source keeps every row of the shard');
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
	'catch-up: the old owner is in charge');
is(leftovers($coord, $a, $b), $clean, 'catch-up: no slot, publication, subscription, freeze or live journal row on any node');
my ($irc, $iout, $ierr) = $a->psql('n1', "INSERT INTO accounts VALUES ('$tenants[0]', 5000101, 'after the cancel')");
is("$irc $ierr", '0 ', 'catch-up: the source takes writes of the shard again (thawed)');
sleep 10;
is(shard_rows($b, 'n2', $S), '0', 'catch-up: ... nor 10 s later');
$b->safe_psql('n2', 'DROP TRIGGER slow_apply ON accounts');

# 2. _move_wait_flush on its own, on the move's connections (a slot that
# never confirms anything: it does not exist).
my ($rc, $out, $err) = $coord->psql('coord', q{
	SELECT sharding._move_connect('n1', 'n2');
	SET statement_timeout = '300ms';
	SELECT sharding._move_wait_flush('sharding_move_nosuch_1', NULL);
	RESET statement_timeout;
	SELECT 'still usable: ' || sharding._dbl_value('sharding_move_src', 'SELECT 1');
	SELECT sharding._move_wait_flush('sharding_move_nosuch_1', 0.25);
	\set VERBOSITY verbose
	SELECT sharding._move_wait_flush(NULL, 0.25);
	SELECT sharding._move_resolve(424242);
	SELECT sharding._move_resolve(NULL);
	\set VERBOSITY default
	SELECT sharding._move_disconnect();}, on_error_stop => 0);
like($err, qr/canceling statement due to statement timeout/, 'wait_flush: statement_timeout ends it');
like($out, qr/still usable: 1/, 'wait_flush: the source connection is usable after the cancel');
like($err, qr/the destination of move sharding_move_nosuch_1 did not catch up with the source within 0.25 s/,
	'wait_flush: its own timeout, 55000 with the seconds');
is($a->safe_psql('n1', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%confirmed_flush_lsn%' AND state = 'active' AND pid <> pg_backend_pid()"),
	'0', 'wait_flush: no poll is left running at the source');
like($err, qr/ERROR:  22004: the move's name must not be NULL/, 'wait_flush: a NULL name is 22004 at once');
like($err, qr/ERROR:  42704: move 424242 does not exist/, '_move_resolve of a move that does not exist: 42704');
like($err, qr/ERROR:  42704: move <NULL> does not exist/, '_move_resolve(NULL): 42704');

# A source that gives no WAL flush position (a database of n1's instance
# whose pg_current_wal_flush_lsn() answers NULL, with a slot there that has
# confirmed something): an error, not a wait for 0/0 that returns at once
# (the cutover would switch before the destination applied the backlog).
$a->safe_psql('postgres', 'CREATE DATABASE hostile');
$a->safe_psql('hostile', q{
	CREATE OR REPLACE FUNCTION pg_catalog.pg_current_wal_flush_lsn() RETURNS pg_lsn LANGUAGE sql AS 'SELECT NULL::pg_lsn';
	SELECT pg_create_logical_replication_slot('hostile_slot', 'pgoutput');});
my $hostile = $a->connstr('hostile');
($rc, $out, $err) = $coord->psql('coord', qq{
	SELECT sharding._dbl_connect('sharding_move_src', \$\$$hostile\$\$);
	\\set VERBOSITY verbose
	SELECT 'waited ' || sharding._move_wait_flush('hostile_slot', 5);
	\\set VERBOSITY default
	SELECT sharding._move_disconnect();}, on_error_stop => 0);
unlike($out, qr/waited/, 'wait_flush: a source without a WAL flush position is not waited for as 0/0');
like($err, qr/ERROR:  08P01: the source answered NULL for its WAL flush position/, '... it is 08P01');
$a->safe_psql('hostile', "SELECT pg_drop_replication_slot('hostile_slot')");
$a->safe_psql('postgres', 'DROP DATABASE hostile');

# 3. The coordinator's server stops -m immediate while the move deletes
# the shard's rows at the source; nobody calls anything afterwards.
my $want = $sum->($a, 'n1', $S);
my ($want_rows) = split m{/}, $want;
$lock = hold_copy();
$mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'", '1', 60), 'crash: the slot exists');
# A row lock of the shard at the source, taken before the switch: the
# source-side delete of the cleanup waits for it.
my $row = psql_bg($a, 'n1', "BEGIN; SELECT id FROM accounts WHERE tenant = '$tenants[0]' AND id < 1000000 ORDER BY id LIMIT 1 FOR UPDATE; SELECT pg_sleep(600)");
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%FOR UPDATE; SELECT pg_sleep(600)%' AND state = 'active' AND wait_event = 'PgSleep'", '1', 60),
	'crash: a session at the source holds a row of the shard');
release($b, 'n2', $lock, 'LOCK accounts IN SHARE MODE');
ok(wait_for_sql($a, 'n1', "SELECT count(*) FROM pg_stat_activity WHERE " . deleting() . " AND wait_event_type = 'Lock'", '1', 120),
	'crash: the source-side delete waits for the row lock');
is(journal('phase'), 'cleanup', 'crash: the move has switched (journal cleanup)');
$coord->stop('immediate');
$mv->{h}->finish;
$coord->start;
release($a, 'n1', $row, 'FOR UPDATE; SELECT pg_sleep(600)');
ok(wait_for_sql($coord, 'coord', "SELECT phase FROM sharding.move_journal ORDER BY move DESC LIMIT 1", 'done', 120),
	'crash: the jobs launcher finished the move by itself (journal done)');
is(journal('rows_moved'), $want_rows, 'crash: the journal counts every row deleted at the source');
is(shard_rows($a, 'n1', $S), '0', 'crash: the source holds no row of the shard');
is($sum->($b, 'n2', $S), $want, 'crash: the destination has every row of the shard');
is($coord->safe_psql('coord', "SELECT node || ' ' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n2 2',
	'crash: the new owner is in charge');
is(leftovers($coord, $a, $b), $clean, 'crash: nothing of the move is left on any node');

# 4. rebalance_run pins its search_path for every step, although a
# procedure that commits has no SET clause: a schema ahead of pg_catalog
# with operators = of its own (bigint, integer, text) is never used while
# it carries out a real move of rows. Without the library preloaded, so
# that no background worker takes the job: rebalance_run runs it here.
$coord->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$coord->restart;
$coord->safe_psql('coord', q{
	CREATE SCHEMA evil;
	CREATE TABLE evil.calls (at timestamptz DEFAULT clock_timestamp(), what text);
	GRANT ALL ON SCHEMA evil TO PUBLIC;
	GRANT ALL ON evil.calls TO PUBLIC;
	CREATE FUNCTION evil.eq(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
	    $$ BEGIN INSERT INTO evil.calls (what) VALUES ('bigint'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
	CREATE FUNCTION evil.eq(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
	    $$ BEGIN INSERT INTO evil.calls (what) VALUES ('integer'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
	CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
	    $$ BEGIN INSERT INTO evil.calls (what) VALUES ('text'); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
	CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.eq);
	CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.eq);
	CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq);});
# After 3, n1 owns 3 shards of bank and n2 5: balancing them moves one.
my $job = $coord->safe_psql('coord', "SELECT sharding.rebalance_start('bank', ARRAY['n1', 'n2'])");
my $ml = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.move_journal WHERE job = $job");
is($coord->safe_psql('coord', "SELECT count(*) || ' ' || min(phase) || ' ' || min(source) || '>' || min(destination)
                               FROM sharding.move_journal WHERE job = $job"),
	'1 queued n2>n1', "search_path: the job plans one move (shard $ml), n2 to n1, queued");
my $msum = $sum->($b, 'n2', $ml);
($rc, $out, $err) = $coord->psql('coord', "SET search_path = evil, pg_catalog, public; CALL sharding.rebalance_run($job);"
	  . " SELECT 'run ok'; SELECT 1::bigint = 1::bigint;");
like($out, qr/run ok/, 'search_path: rebalance_run runs under a hostile search_path');
is($err, '', 'search_path: ... without an error or a warning');
is($coord->safe_psql('coord', "SELECT state || ' ' || moves_done || '/' || moves_total FROM sharding.rebalance_jobs WHERE job = $job"),
	'done 1/1', 'search_path: the job is done');
is($sum->($a, 'n1', $ml), $msum, "search_path: n1 holds shard ${ml}'s rows as n2 had them");
is(shard_rows($b, 'n2', $ml), '0', 'search_path: n2 holds none of them any more');
is($coord->safe_psql('coord', "SELECT string_agg(what, ',') FROM evil.calls"), 'bigint',
	'search_path: only the caller\'s own comparison used evil.=');
is(leftovers($coord, $a, $b), $clean, 'search_path: nothing of the move is left on any node');
($rc, $out, $err) = $coord->psql('coord', "BEGIN; CALL sharding.rebalance_run($job); COMMIT;");
like($err, qr/invalid transaction termination/, 'rebalance_run in a transaction block: 2D000');

# 5. What the destination's _move_pull answers is parsed, never spliced
# into the coordinator's SQL: a destination whose _move_pull answers a
# text with SQL in it (spliced into the journal's UPDATE, it would set
# every journal row's counts and create a table at the coordinator) fails
# the move with 08P01, and the move is rolled back.
$b->safe_psql('n2', q{
	ALTER EXTENSION sharding DROP FUNCTION sharding._move_pull(text, text, regclass, text[], text);
	DROP FUNCTION sharding._move_pull(text, text, regclass, text[], text);
	CREATE FUNCTION sharding._move_pull(text, text, regclass, text[], text) RETURNS text LANGUAGE sql
	    AS $$ SELECT '{1,2; CREATE TABLE public.injected (); SELECT 1 FROM sharding.move_journal}' $$;});
my $hl = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $copied = $coord->safe_psql('coord', q{SELECT sum(rows_copied) || '/' || sum(bytes_copied) FROM sharding.move_journal});
my $hsum = $sum->($a, 'n1', $hl);
($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\nSELECT sharding.move_shard_online('bank', $hl, 'n2')");
like($err, qr/ERROR:  08P01: the destination answered '2; CREATE TABLE public.injected \(\); SELECT 1 FROM sharding.move_journal' for the bytes it copied/,
	'hostile _move_pull: the move fails with 08P01');
is($coord->safe_psql('coord', "SELECT to_regclass('public.injected') IS NULL"), 't', 'hostile _move_pull: nothing ran at the coordinator');
is($coord->safe_psql('coord', q{SELECT sum(rows_copied) || '/' || sum(bytes_copied) FROM sharding.move_journal WHERE move < (SELECT max(move) FROM sharding.move_journal)}),
	$copied, 'hostile _move_pull: no other journal row changed');
is($coord->safe_psql('coord', "SELECT node || ' ' || phase FROM sharding.shards s, sharding.move_journal m
                               WHERE s.map = 'bank' AND s.logical = $hl AND m.move = (SELECT max(move) FROM sharding.move_journal)"),
	'n1 failed', 'hostile _move_pull: the shard stays at n1, the move failed');
is($sum->($a, 'n1', $hl), $hsum, 'hostile _move_pull: n1 keeps its rows');
is(leftovers($coord, $a, $b), $clean, 'hostile _move_pull: nothing of the move is left');

done_testing();
