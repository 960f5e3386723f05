# The copy's progress tick only reports (docs/moves.md, Progress): while the
# destination copies, the move notes every quarter of a second the rows the
# source has sent so far in the journal. A tick that fails (here the
# journal refuses every partial count: a trigger at the coordinator raises
# for a rows_copied below the shard's total, counting each refusal in a
# sequence) is logged, a WARNING the first time, and the move goes on: it
# completes, with the total noted at the end of the copy.
#
# The copy is made slow enough for ticks to see partial counts: the
# moving shard's rows are 1 kB each (3 MB in all, more than the sockets
# buffer) and the destination sleeps 1 ms per row it inserts (a trigger
# that fires in replica mode too), so the source's COPY waits for it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 5);
my $S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my ($tenant) = shard_tenants($coord, $S);
$a->safe_psql('n1', "INSERT INTO accounts SELECT '$tenant', 1000000 + i, repeat(md5(i::text), 32) FROM generate_series(1, 3000) i");
my $total = shard_rows($a, 'n1', $S);
my $sum = shard_sum($a, 'n1', $S);
ok($total > 3000, "shard $S holds $total rows on n1");

$b->safe_psql('n2', q{
	CREATE FUNCTION slow_copy() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN PERFORM pg_sleep(0.001); RETURN NEW; END $$;
	CREATE TRIGGER slow_copy BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION slow_copy();
	ALTER TABLE accounts ENABLE ALWAYS TRIGGER slow_copy;
});
$coord->safe_psql('coord', qq{
	CREATE SEQUENCE public.tick_refusals;
	CREATE FUNCTION public.refuse_partial() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
	    IF NEW.rows_copied IS DISTINCT FROM OLD.rows_copied AND NEW.rows_copied > 0 AND NEW.rows_copied < $total THEN
	        PERFORM pg_catalog.nextval('public.tick_refusals');
	        RAISE EXCEPTION 'partial count % refused', NEW.rows_copied;
	    END IF;
	    RETURN NEW;
	END \$\$;
	CREATE TRIGGER refuse_partial BEFORE UPDATE ON sharding.move_journal
	    FOR EACH ROW EXECUTE FUNCTION public.refuse_partial();
});

my ($rc, $epoch, $err) = $coord->psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
is($rc, 0, 'the move completes though its progress ticks fail') or diag($err);
my $refused = $coord->safe_psql('coord', 'SELECT last_value FROM public.tick_refusals WHERE is_called');
ok($refused ne '' && $refused > 0, "the journal refused partial counts (${\($refused || 0)} times)");
like($err, qr/WARNING:  could not note the progress of the copy of move sharding_move_[0-9a-f]{6}_bank_$S: .*partial count \d+ refused/,
	'the first failed tick is a WARNING');
is(($err =~ tr/\n//) <= 3 ? 'once' : 'more', 'once', 'and only the first');
is(shard_sum($b, 'n2', $S) . ' ' . shard_rows($a, 'n1', $S), "$sum 0", 'every row moved to n2, none left on n1');
is($coord->safe_psql('coord', "SELECT phase || '|' || rows_copied FROM sharding.move_journal WHERE map = 'bank' AND logical = $S"),
	"done|$total", 'the journal says done, with every row copied');
is(leftovers($coord, $a, $b), 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0', 'nothing of the move is left');

done_testing();
