# move_progress while a move copies (docs/rebalance.md, Functions: current
# while the destination copies): a shard of 300,000 rows is moved while a
# procedure on the coordinator samples move_progress every 100 ms. While
# the phase is 'copying', rows_copied and bytes_copied grow (several
# distinct non-zero values, never decreasing); once done, rows_copied is
# the shard's row count. (Before the fix they stayed 0 until the copy of
# the table had ended.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
my $S = 0;    # one of n1's shards
my $tenants = join(',', map { "'$_'" } shard_tenants($coord, $S));
$a->safe_psql('n1', qq{
	INSERT INTO accounts
	SELECT (ARRAY[$tenants])[1 + i % cardinality(ARRAY[$tenants])], i, repeat('x', 100) || i
	  FROM generate_series(1, 300000) AS i;
	VACUUM ANALYZE accounts;
});
my $rows = shard_rows($a, 'n1', $S);
is($rows, '300000', 'the shard has 300,000 rows at its owner');

# A trigger that fires for the copy (ENABLE REPLICA: the copy runs under
# session_replication_role = replica) pauses the destination for 0.6 s at
# every 30,000th row: ten pauses, each longer than two of the move's 250 ms
# progress ticks, with the source's side of the copy stalled at a different
# row each time. So however fast the machine, the samples see several
# distinct values (a copy without pauses lasted under 0.75 s in one CI run).
$b->safe_psql('n2', q{
	CREATE FUNCTION copy_row() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
	    IF NEW.id % 30000 = 0 THEN PERFORM pg_sleep(0.6); END IF;
	    RETURN NEW;
	END $$;
	CREATE TRIGGER copy_row BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION copy_row();
	ALTER TABLE accounts ENABLE REPLICA TRIGGER copy_row;
});

$coord->safe_psql('coord', qq{
	CREATE TABLE samples (at timestamptz NOT NULL DEFAULT clock_timestamp(), phase text, rows_copied bigint,
		bytes_copied bigint);
	CREATE PROCEDURE sampler() LANGUAGE plpgsql AS \$\$
	DECLARE p text; seen boolean := false;
	BEGIN
	    -- until the move has left move_progress (a direct move, once ended)
	    FOR i IN 1 .. 3000 LOOP   -- 300 s at most
	        INSERT INTO samples (phase, rows_copied, bytes_copied)
	        SELECT m.phase, m.rows_copied, m.bytes_copied FROM sharding.move_progress m
	         WHERE m.logical = $S AND m.job IS NULL
	        RETURNING phase INTO p;
	        COMMIT;
	        EXIT WHEN p IS NULL AND seen;
	        seen := seen OR p IS NOT NULL;
	        PERFORM pg_sleep(0.1);
	    END LOOP;
	END \$\$;
});
my $sampler = psql_bg($coord, 'coord', 'CALL sampler()');
my $move = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
$move->{h}->finish;
$sampler->{h}->finish;
is(${ $move->{err} }, '', 'the move succeeds');
is(${ $sampler->{err} }, '', 'the sampler ran without error');

# What was seen while copying, in the order it was seen.
my @copying = map { [ split /\|/ ] } split /\n/, $coord->safe_psql('coord',
	"SELECT rows_copied || '|' || bytes_copied FROM samples WHERE phase = 'copying' ORDER BY at");
diag(scalar(@copying) . ' samples while copying; rows_copied seen: '
	  . join(' ', map { $_->[0] } @copying));
my %distinct = map { $_->[0] => 1 } grep { $_->[0] > 0 } @copying;
cmp_ok(scalar(keys %distinct), '>=', 3, 'while copying, rows_copied takes several non-zero values');
ok((grep { $_->[1] > 0 } @copying) >= 3, 'while copying, bytes_copied is non-zero too');
my $decreasing = 0;
for my $i (1 .. $#copying)
{
	$decreasing++ if $copying[$i][0] < $copying[ $i - 1 ][0] || $copying[$i][1] < $copying[ $i - 1 ][1];
}
is($decreasing, 0, 'rows_copied and bytes_copied never decrease');
ok(!grep({ $_->[0] > $rows } @copying), 'rows_copied never exceeds the shard');
is($coord->safe_psql('coord', "SELECT rows_copied FROM samples WHERE phase <> 'copying' ORDER BY at DESC LIMIT 1"),
	$rows, 'after the copy, move_progress shows the shard\'s row count');
is($coord->safe_psql('coord', "SELECT phase || ' ' || rows_copied FROM sharding.move_journal ORDER BY move DESC LIMIT 1"),
	"done $rows", 'the journal keeps it once the move is done');
is(shard_rows($b, 'n2', $S), $rows, 'the destination has every row');
done_testing();
