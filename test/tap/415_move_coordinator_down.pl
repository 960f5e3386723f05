# The coordinator goes away while a move catches up, and stays away
# (docs/moves.md, While the coordinator is down: copying or applying started
# at the destination is stopped, not left running; nothing of the shard
# appears there later). Writers keep writing the shard at the source, on their
# own (the coordinator is down), and the destination applies slowly, so that
# it has a backlog. Twice:
#   1. kill -9 of the coordinator's backend that runs the move (the server
#      set not to restart after a crash: it stays down);
#   2. the coordinator's server stopped with -m immediate.
# Within a few seconds the destination's rows of the shard stop changing
# (sampled every second for 10 s, while the source's keep changing). After
# the coordinator is started again, the move is rolled back without a call
# (the jobs launcher), no row of the shard is at the destination, the
# source holds exactly what its writers committed, nothing of the move is
# left, and the next call succeeds. (Before the fix the destination went on
# applying the source's changes for as long as the coordinator was down.)
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
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';

# Writers at the source itself: each inserts rows of the shard and updates
# or deletes rows it inserted, logging every committed operation in wlog in
# the same transaction (ids from 100,000,000 on; the loaded rows are
# untouched).
$a->safe_psql('n1', q{
CREATE TABLE wlog (seq bigserial PRIMARY KEY, id bigint NOT NULL, tenant text, op text NOT NULL, val text);
CREATE TABLE wflag (stop boolean NOT NULL);
CREATE PROCEDURE src_writer(w integer, tenants text[]) LANGUAGE plpgsql AS $$
DECLARE
    base bigint := w * 100000000::bigint;
    nid bigint := w * 100000000::bigint;
    victim bigint; t text; v text;
BEGIN
    FOR i IN 1 .. 200000 LOOP
        EXIT WHEN (SELECT stop FROM wflag);
        v := format('src%s-%s', w, i);
        IF nid = base OR random() < 0.5 THEN
            nid := nid + 1;
            t := tenants[1 + floor(random() * cardinality(tenants))::int];
            INSERT INTO accounts VALUES (t, nid, v);
            INSERT INTO wlog (id, tenant, op, val) VALUES (nid, t, 'insert', v);
        ELSE
            victim := base + 1 + floor(random() * (nid - base))::bigint;
            IF random() < 0.7 THEN
                UPDATE accounts SET val = v WHERE id = victim;
                IF FOUND THEN INSERT INTO wlog (id, op, val) VALUES (victim, 'update', v); END IF;
            ELSE
                DELETE FROM accounts WHERE id = victim;
                IF FOUND THEN INSERT INTO wlog (id, op) VALUES (victim, 'delete'); END IF;
            END IF;
        END IF;
        COMMIT;
        PERFORM pg_sleep(0.01);
    END LOOP;
END $$;
});
# What the writers committed to shard $l and what the source holds of it.
sub writers_wrote
{
	my ($l) = @_;
	return $a->safe_psql('n1', qq{
	WITH last AS (SELECT DISTINCT ON (id) id, op, val FROM wlog ORDER BY id, seq DESC),
	     exp AS (SELECT l.id, i.tenant, l.val FROM last l JOIN wlog i ON i.id = l.id AND i.op = 'insert'
	              WHERE l.op <> 'delete' AND sharding.logical_shard('bank', i.tenant) = $l),
	     act AS (SELECT id, tenant, val FROM accounts
	              WHERE id >= 100000000 AND sharding.logical_shard('bank', tenant) = $l)
	SELECT (SELECT count(*) FROM exp) || ' rows, ' || (SELECT count(*) FROM (TABLE exp EXCEPT TABLE act) x)
	       || ' missing, ' || (SELECT count(*) FROM (TABLE act EXCEPT TABLE exp) y) || ' extra'});
}

sub start_src_writers
{
	my ($l) = @_;
	my $arr = 'ARRAY[' . join(',', map { "'$_'" } shard_tenants($coord, $l)) . ']';
	$a->safe_psql('n1', 'DELETE FROM wflag; INSERT INTO wflag VALUES (false)');
	# writer numbers (and so ids) of their own for each shard
	return [ map { psql_bg($a, 'n1', "CALL src_writer(" . ($l * 10 + $_) . ", $arr)") } (1, 2) ];
}

sub stop_src_writers
{
	my ($ws) = @_;
	$a->safe_psql('n1', 'UPDATE wflag SET stop = true');
	my $errors = 0;
	for my $w (@$ws)
	{
		$w->{h}->finish;
		if (${ $w->{err} } ne '') { $errors++; diag('source writer: ' . ${ $w->{err} }); }
	}
	return $errors;
}

# Waits until the coordinator's postmaster has exited by itself.
sub wait_down
{
	my $pid = $coord->{_pid};
	for (1 .. 600)
	{
		return 1 unless kill(0, $pid);
		usleep(100_000);
	}
	return 0;
}

slow_apply($b, 'n2', 0.05);
for my $case ([ 'kill -9 of the mover', 0 ], [ 'stop -m immediate', 1 ])
{
	my ($what, $S) = @$case;
	my $loaded = $a->safe_psql('n1',
		"SELECT count(*) || '/' || coalesce(sum(hashtext(tenant || id || val)), 0) FROM accounts "
		  . "WHERE id < 100000000 AND sharding.logical_shard('bank', tenant) = $S");
	my $ws = start_src_writers($S);
	my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
	ok(wait_for_sql($coord, 'coord',
			"SELECT count(*) FROM sharding.move_journal WHERE phase = 'catching_up' AND pid IS NOT NULL", '1', 120),
		"$what: the move catches up");
	# Something of the writers' backlog has reached the destination.
	ok(wait_for_sql($b, 'n2',
			"SELECT count(*) > 0 FROM accounts WHERE id >= 100000000 AND sharding.logical_shard('bank', tenant) = $S",
			't', 60),
		"$what: the destination applies the source's changes");
	if ($S == 0)
	{
		$coord->safe_psql('coord', 'ALTER SYSTEM SET restart_after_crash = off; SELECT pg_reload_conf()');
		# The postmaster has read it once a new session sees it.
		ok(wait_for_sql($coord, 'coord', 'SHOW restart_after_crash', 'off', 30), "$what: restart_after_crash is off");
		my $pid = $coord->safe_psql('coord', "SELECT pid FROM sharding.move_journal WHERE phase = 'catching_up'");
		kill 'KILL', $pid;
		ok(wait_down(), "$what: the coordinator is down");
		$coord->_update_pid(-1);
	}
	else
	{
		$coord->stop('immediate');
	}
	$mv->{h}->finish;
	ok(${ $mv->{err} } ne '', "$what: the call failed with its server");

	# A few seconds for what was on the way, then 10 s of samples.
	sleep 3;
	my @dest = (shard_sum($b, 'n2', $S));
	my $src_first = shard_sum($a, 'n1', $S);
	for (1 .. 10)
	{
		sleep 1;
		push @dest, shard_sum($b, 'n2', $S);
	}
	my $changes = grep { $dest[$_] ne $dest[ $_ - 1 ] } 1 .. $#dest;
	diag("$what: the destination's shard while the coordinator is down: @dest");
	is($changes, 0, "$what: the destination's rows of the shard stop changing within 3 s (sampled for 10 s)");
	isnt(shard_sum($a, 'n1', $S), $src_first, "$what: the source's writers kept writing meanwhile");

	# The coordinator again: its launcher rolls the move back by itself.
	$coord->start;
	$coord->safe_psql('coord', 'ALTER SYSTEM RESET restart_after_crash; SELECT pg_reload_conf()') if $S == 0;
	ok(wait_for_sql($coord, 'coord', 'SELECT phase FROM sharding.move_journal ORDER BY move DESC LIMIT 1', 'failed', 60),
		"$what: after the restart the move is rolled back without a call");
	is(shard_rows($b, 'n2', $S), '0', "$what: no row of the shard at the destination");
	is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n1',
		"$what: the old owner is in charge");
	is(stop_src_writers($ws), 0, "$what: the source's writers never failed");
	like(writers_wrote($S), qr/^[1-9]\d* rows, 0 missing, 0 extra$/,
		"$what: the source holds exactly what its writers committed");
	is($a->safe_psql('n1',
			"SELECT count(*) || '/' || coalesce(sum(hashtext(tenant || id || val)), 0) FROM accounts "
			  . "WHERE id < 100000000 AND sharding.logical_shard('bank', tenant) = $S"),
		$loaded, "$what: and its loaded rows unchanged");
	is(leftovers($coord, $a, $b), $clean, "$what: nothing of the move is left on any node");

	# The next call succeeds (the destination at full speed again).
	my $src = shard_sum($a, 'n1', $S);
	$b->safe_psql('n2', 'ALTER TABLE accounts DISABLE TRIGGER slow_apply');
	is($coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')"), '2',
		"$what: the next call succeeds");
	$b->safe_psql('n2', 'ALTER TABLE accounts ENABLE REPLICA TRIGGER slow_apply');
	is(shard_sum($b, 'n2', $S), $src, "$what: the destination has the shard as the source had it");
	is(leftovers($coord, $a, $b), $clean, "$what: and nothing is left");
}
done_testing();
