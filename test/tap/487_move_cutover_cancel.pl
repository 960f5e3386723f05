# A cancel that lands while the owner switch commits (docs/moves.md, Cancel,
# failure, crash). The switch and the journal's 'cleanup' commit together in
# one statement over the engine's own connection to the coordinator; a
# cancel of the caller that arrives once that commit is under way is
# ignored there (the shard has switched) but raised here. The move must then
# be finished, never undone: an undo would delete the rows at the
# destination, which owns the shard.
#
# 1. _move_undo refuses (55000) a move whose journal row is in 'cleanup' and
#    changes nothing: the rows stay at the new owner; _move_recover then
#    finishes the row.
# 2. The cancel itself, made deterministic with synchronous replication to
#    a standby that never comes: on the coordinator only the switch's
#    transaction (a trigger on the journal leaves synchronous_commit 'on'
#    only where a row turns 'cleanup') waits after its local commit (wait
#    event SyncRep) until it is cancelled; then _move_cancel cancels the
#    mover. The cancel of the wait keeps the commit (a WARNING there), the
#    mover sees its cancel: the shard is at the destination with every row,
#    the source holds none, the journal says done, nothing is left.
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
my @n1 = split /\n/, $coord->safe_psql('coord',
	"SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n1' ORDER BY logical LIMIT 2");
my ($S, $T) = @n1;
sub owner { return $coord->safe_psql('coord', "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $_[0]"); }

# ------------------------------------------------------------------ 1. _move_undo after the switch
my $sum = shard_sum($a, 'n1', $S);
$coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
is(shard_sum($b, 'n2', $S), $sum, "shard $S moved to n2 with its rows ($sum)");
my $epoch = $coord->safe_psql('coord', "SELECT epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S");
# A journal row as a move leaves it when its cleanup could not run.
$coord->safe_psql('coord', "INSERT INTO sharding.move_journal (map, logical, source, destination, phase, new_epoch)
                            VALUES ('bank', $S, 'n1', 'n2', 'cleanup', $epoch)");
my ($rc, $out, $err) = $coord->psql('coord', "\\set VERBOSITY verbose\n"
	  . "SELECT sharding._move_connect('n1', 'n2');\nSELECT sharding._move_undo('bank', $S, NULL);");
like($err, qr/ERROR:  55000: the move of logical shard $S of map "bank" cannot be undone/,
	'_move_undo refuses a move in cleanup with 55000') or diag($err);
is(shard_sum($b, 'n2', $S) . ' ' . shard_rows($a, 'n1', $S) . ' ' . owner($S), "$sum 0 n2|$epoch",
	'nothing changed: the new owner keeps every row, the source has none');
is($coord->safe_psql('coord', "SELECT phase || '|' || undone FROM sharding.move_journal WHERE map = 'bank' AND logical = $S
                                AND phase NOT IN ('done', 'failed', 'cancelled')"),
	'cleanup|false', 'the journal row stays in cleanup, not undone');
is($coord->safe_psql('coord', 'SELECT sharding._move_recover()'), '1', '_move_recover finishes it');
is(leftovers($coord, $a, $b) . ' ' . shard_sum($b, 'n2', $S), "$clean $sum", 'nothing is left, the rows are at n2');

# ------------------------------------------------------------------ 2. the cancel while the switch commits
$coord->safe_psql('coord', q{
	CREATE FUNCTION public.journal_sync() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
	    IF NEW.phase IS DISTINCT FROM 'cleanup' OR (TG_OP = 'UPDATE' AND OLD.phase = 'cleanup') THEN
	        PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
	    END IF;
	    RETURN NEW;
	END $$;
	CREATE TRIGGER journal_sync BEFORE INSERT OR UPDATE ON sharding.move_journal
	    FOR EACH ROW EXECUTE FUNCTION public.journal_sync();
	ALTER SYSTEM SET synchronous_commit = local;
	ALTER SYSTEM SET synchronous_standby_names = 'nobody';
	SELECT pg_reload_conf();
});
my $tsum = shard_sum($a, 'n1', $T);
my $tepoch = $coord->safe_psql('coord', "SELECT epoch FROM sharding.shards WHERE map = 'bank' AND logical = $T");
my $mover = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $T, 'n2')");
ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'", '1'),
	'the switch has committed at the coordinator and waits for its standby');
my $move = $coord->safe_psql('coord', "SELECT move FROM sharding.move_journal WHERE map = 'bank' AND logical = $T
                                        AND phase NOT IN ('done', 'failed', 'cancelled')");
is($coord->safe_psql('coord', "SELECT sharding._move_cancel($move)"), 't', '_move_cancel cancels the mover');
$mover->{h}->finish;
like(${ $mover->{err} }, qr/ERROR:  logical shard $T of map "bank" moved to "n2" \(epoch ${\($tepoch + 1)}\) and was finished, but the call failed: canceling statement/,
	'the call raises the cancel, saying that the shard moved') or diag(${ $mover->{err} });
$coord->safe_psql('coord', q{
	ALTER SYSTEM RESET synchronous_standby_names;
	ALTER SYSTEM RESET synchronous_commit;
	SELECT pg_reload_conf();
	DROP TRIGGER journal_sync ON sharding.move_journal;
});
is(owner($T), 'n2|' . ($tepoch + 1), 'the switch stands: n2 owns the shard at the next epoch');
is(shard_sum($b, 'n2', $T) . ' ' . shard_rows($a, 'n1', $T), "$tsum 0",
	'the destination holds every row of the shard, the source none (the move was finished, not undone)');
is($coord->safe_psql('coord', "SELECT phase || '|' || undone FROM sharding.move_journal WHERE move = $move"),
	'done|false', 'the journal says done');
is(leftovers($coord, $a, $b), $clean, 'no publication, subscription, slot, frozen shard or live journal row is left');

done_testing();
