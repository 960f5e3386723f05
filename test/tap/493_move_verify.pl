# A move compares the shard's rows at both ends before it deletes the
# source's copy (sharding.move_verify, on by default; docs/moves.md,
# "Verified before anything is deleted"). The comparison runs after the
# switch: per table, count and an order-independent checksum of the rows
# at the source (frozen since the cutover) against the destination's as
# of the switch.
#   1. A plain move is verified (its DEBUG trace says so) and ends done.
#   2. A destination that silently changes one copied row (a trigger ENABLE
#      ALWAYS that rewrites a value, as a faulty replica of a table could):
#      the move fails with XX001 naming the table and both counts; routing
#      stays with the destination; the source keeps every row of the
#      shard; the journal row ends 'failed' with the error, and
#      move_progress shows it; nothing of the move's replication is left.
#   3. One that silently drops a copied row: the same, the counts differ.
#   4. The same fault with sharding.move_verify = off: the move ends done
#      and the source's rows are deleted (what 1.3 did whatever happened).
#   5. After the operator repairs, the next move of another shard is
#      verified and done.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 200);    # 12,800 rows over 8 shards
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my %db = (n1 => $a, n2 => $b);
my $owner = sub { $coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $_[0]") };
my @n1_shards = split /\n/, $coord->safe_psql('coord',
	"SELECT logical FROM sharding.shards WHERE map = 'bank' AND node = 'n1' ORDER BY logical");
cmp_ok(scalar(@n1_shards), '>=', 4, 'n1 owns at least four shards');

# move(logical, settings): the move's result, stderr and SQLSTATE.
sub move
{
	my ($l, $settings) = @_;
	$settings //= '';
	my ($rc, $out, $err) = $coord->psql('coord',
		"$settings SELECT sharding.move_shard_online('bank', $l, 'n2')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($rc, $out, $err, $state // '');
}

# 1. A plain move, verified.
my $L = $n1_shards[0];
my $before = shard_sum($a, 'n1', $L);
my ($rc, $out, $err, $state) = move($L, "SET client_min_messages = debug1;");
is($rc, 0, "1: the move of shard $L succeeds") or diag($err);
like($err, qr/move \S+_$L: verified in [0-9.]+ s/, '1: the move compared the copies');
is($owner->($L), 'n2', '1: n2 owns it');
is(shard_sum($b, 'n2', $L), $before, '1: n2 has the rows n1 had');
is(shard_rows($a, 'n1', $L), '0', "1: n1's copy is deleted");
is(leftovers($coord, $a, $b), $clean, '1: nothing of the move is left');

# A trigger at n2 that fires for the copy and the apply (ENABLE ALWAYS):
# `body` decides what the destination keeps of a row of tenant $t.
sub corrupt
{
	my ($t, $body) = @_;
	$b->safe_psql('n2', qq{
		CREATE OR REPLACE FUNCTION corrupt() RETURNS trigger LANGUAGE plpgsql AS \$\$
		BEGIN
			IF NEW.tenant = '$t' AND NEW.id = (SELECT max(id) FROM public.corrupt_target) THEN $body END IF;
			RETURN NEW;
		END \$\$;
		CREATE TRIGGER corrupt BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION corrupt();
		ALTER TABLE accounts ENABLE ALWAYS TRIGGER corrupt;
	});
}
sub uncorrupt { $b->safe_psql('n2', 'DROP TRIGGER corrupt ON accounts; DELETE FROM corrupt_target'); }
$b->safe_psql('n2', 'CREATE TABLE corrupt_target (id bigint)');

# faulty(case, logical, body, expect): a move of `logical` to a destination
# whose trigger runs `body` for one row; the checks of a refused one.
sub faulty
{
	my ($case, $l, $body, $want) = @_;
	my ($t, $id) = split /\|/, $a->safe_psql('n1',
		"SELECT tenant || '|' || id FROM accounts WHERE sharding.logical_shard('bank', tenant) = $l ORDER BY id LIMIT 1");
	$b->safe_psql('n2', "INSERT INTO corrupt_target VALUES ($id)");
	corrupt($t, $body);
	my $src = shard_sum($a, 'n1', $l);
	my $nrows = shard_rows($a, 'n1', $l);
	my ($rc, $out, $err, $state) = move($l);
	isnt($rc, 0, "$case: the move of shard $l fails");
	is($state, 'XX001', "$case: with XX001") or diag($err);
	like($err, qr/the rows of table \S*accounts moved with logical shard $l of map "bank" differ: the source has $nrows rows \(checksum -?\d+\), the destination $want rows/,
		"$case: naming the table and both counts");
	is($owner->($l), 'n2', "$case: routing stays with the destination, which owns the shard");
	is(shard_sum($a, 'n1', $l), $src, "$case: the source keeps every row of the shard");
	is($coord->safe_psql('coord', "SELECT phase || ' ' || error_state || ' ' || (error LIKE 'the rows of table %')::int "
		  . "FROM sharding.move_journal WHERE map = 'bank' AND logical = $l ORDER BY move DESC LIMIT 1"),
		'failed XX001 1', "$case: the journal row ended failed, with the error");
	is($coord->safe_psql('coord', "SELECT phase || ' ' || (error LIKE 'the rows of table %')::int FROM sharding.move_progress "
		  . "WHERE map = 'bank' AND logical = $l"),
		'failed 1', "$case: move_progress shows it");
	is(leftovers($coord, $a, $b), $clean, "$case: nothing of the move's replication is left, nothing frozen");
	ok($a->psql('n1', "INSERT INTO accounts VALUES ('$t', 900000 + $l, 'late')") != 0,
		"$case: the source's guard refuses the shard's keys");
	uncorrupt();
}

# 2. One value rewritten at the destination: the counts agree, the checksums not.
my $nrows2 = shard_rows($a, 'n1', $n1_shards[1]);
faulty('2 (a value changed)', $n1_shards[1], "NEW.val := NEW.val || ' (changed)';", $nrows2);
# 3. One row dropped at the destination.
my $nrows3 = shard_rows($a, 'n1', $n1_shards[2]);
faulty('3 (a row dropped)', $n1_shards[2], 'RETURN NULL;', $nrows3 - 1);

# 4. The same fault without the verification: done, and the source's copy gone.
$L = $n1_shards[3];
my ($t4, $id4) = split /\|/, $a->safe_psql('n1',
	"SELECT tenant || '|' || id FROM accounts WHERE sharding.logical_shard('bank', tenant) = $L ORDER BY id LIMIT 1");
$b->safe_psql('n2', "INSERT INTO corrupt_target VALUES ($id4)");
corrupt($t4, 'RETURN NULL;');
my $n4 = shard_rows($a, 'n1', $L);
($rc, $out, $err, $state) = move($L, 'SET sharding.move_verify = off;');
is($rc, 0, '4: with move_verify off the move succeeds') or diag($err);
is(shard_rows($a, 'n1', $L) . ' ' . shard_rows($b, 'n2', $L), '0 ' . ($n4 - 1),
	'4: and the row the destination dropped is lost (what the verification prevents)');
uncorrupt();

# 5. The next move of a shard n2 owns back to n1 is verified and done.
my ($rc5, $out5, $err5) = $coord->psql('coord',
	"SET client_min_messages = debug1; SELECT sharding.move_shard_online('bank', $n1_shards[0], 'n1')");
is($rc5, 0, '5: a move back to n1 succeeds') or diag($err5);
like($err5, qr/verified in/, '5: verified');
is(leftovers($coord, $a, $b), $clean, '5: nothing of the moves is left');
done_testing();
