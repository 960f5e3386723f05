# Out-of-order storm: 4 concurrent sessions send 20,000 random status
# transitions over 200 orders, as plain UPDATEs (single and in small
# transactions) and as advance(). The same transitions go to three tables:
#   storm_t  text status, guard 'skip'
#   storm_e  enum status, guard 'error' (regressions fail their statement)
#   storm_u  text status, no guard (the control: it must go backwards)
# Afterwards each guarded order holds the highest rank ever sent to it, and an
# AFTER UPDATE audit trigger shows that no committed update lowered a rank.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use QueueTest;
use List::Util qw(min);
use Time::HiRes qw(time usleep);

my ($sessions, $transitions, $orders) = (4, 20000, 200);
my $node = queue_node('rank_storm');
sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{
CREATE TYPE storm_state AS ENUM ('placed', 'paid', 'packed', 'shipped', 'delivered');
CREATE TABLE storm_t (id int PRIMARY KEY, status text NOT NULL, touched int NOT NULL DEFAULT 0);
CREATE TABLE storm_e (id int PRIMARY KEY, status storm_state NOT NULL);
CREATE TABLE storm_u (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO storm_t (id, status) SELECT g, 'placed' FROM generate_series(1, 200) AS g;
INSERT INTO storm_e SELECT g, 'placed' FROM generate_series(1, 200) AS g;
INSERT INTO storm_u SELECT g, 'placed' FROM generate_series(1, 200) AS g;
SELECT sharding.guard_rank('storm_t', 'status', ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], 'skip');
SELECT sharding.guard_rank('storm_e', 'status', on_regress => 'error');

-- The audit ranks independently of the extension.
CREATE TABLE audit (tbl text, id int, old_rank int, new_rank int);
CREATE FUNCTION audit_rank() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit VALUES (TG_TABLE_NAME, NEW.id,
        array_position(ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], OLD.status::text) - 1,
        array_position(ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], NEW.status::text) - 1);
    RETURN NULL;
END $$;
CREATE TRIGGER audit AFTER UPDATE ON storm_t FOR EACH ROW EXECUTE FUNCTION audit_rank();
CREATE TRIGGER audit AFTER UPDATE ON storm_e FOR EACH ROW EXECUTE FUNCTION audit_rank();
CREATE TRIGGER audit AFTER UPDATE ON storm_u FOR EACH ROW EXECUTE FUNCTION audit_rank();
});

# The workload: one SQL script per session, and the highest rank sent per order.
my @ranks = qw(placed paid packed shipped delivered);
my %best = map { $_ => 0 } 1 .. $orders;
my @sizes = (1, 1, 1, 1, 1, 1, 1, 2, 3);    # a few small transactions
srand(20261129);
my @scripts;
for my $s (1 .. $sessions)
{
	my @out;
	my $left = $transitions / $sessions;
	while ($left > 0)
	{
		my $k = min($left, $sizes[ int(rand(@sizes)) ]);
		my @moves = sort { $a->[0] <=> $b->[0] || $a->[1] <=> $b->[1] }
		  map { [ 1 + int(rand($orders)), int(rand(@ranks)) ] } 1 .. $k;
		$left -= $k;
		$best{ $_->[0] } = $best{ $_->[0] } > $_->[1] ? $best{ $_->[0] } : $_->[1] for @moves;
		if ($k > 1)
		{
			# Rows locked in id order: no deadlocks.
			push @out, 'BEGIN;',
			  (map { "UPDATE storm_t SET status = '$ranks[$_->[1]]', touched = touched + 1 WHERE id = $_->[0];" } @moves),
			  'COMMIT;';
		}
		else
		{
			my ($i, $r) = @{ $moves[0] };
			push @out, rand() < 0.5
			  ? "UPDATE storm_t SET status = '$ranks[$r]', touched = touched + 1 WHERE id = $i;"
			  : "SELECT sharding.advance('storm_t', $i, '$ranks[$r]');";
		}
		for my $m (@moves)
		{
			my ($i, $r) = @$m;
			push @out, rand() < 0.5
			  ? "UPDATE storm_e SET status = '$ranks[$r]' WHERE id = $i;"
			  : "SELECT sharding.advance('storm_e', $i, '$ranks[$r]');";
			push @out, "UPDATE storm_u SET status = '$ranks[$r]' WHERE id = $i;";
		}
	}
	push @scripts, join("\n", @out) . "\n";
}

my $t0 = time;
my @h = map { start_script($node, 'postgres', $_) } @scripts;
# Meanwhile, replace the text guard (same ranks) a few times: every session
# must pick up the new trigger and keep the promise.
my $guard_errors = '';
for (1 .. 3)
{
	usleep(300_000);
	my ($rc, $out, $err) = $node->psql('postgres',
		"SELECT sharding.guard_rank('storm_t', 'status', ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], 'skip')");
	$guard_errors .= "exit status $rc: " if $rc != 0;
	$guard_errors .= $err;
}
my @results = map { [ sharding_finish($_) ] } @h;
diag(sprintf('storm of %d transitions x 3 tables in %.1fs', $transitions, time - $t0));
my $failed = grep { $_->[0] != 0 } @results;
is($failed, 0, "all $sessions sessions ran to the end");
is($guard_errors, '', 'guard replaced three times during the storm');

my @err_lines = map { split /\n/, $_->[2] } @results;
my $errors = grep { /^psql.*ERROR/ } @err_lines;
my $refused = grep { /ERROR:  rank guard refuses to lower column "status" of relation "storm_e"/ } @err_lines;
ok($errors > 0 && $errors == $refused,
	"the error guard refused $refused plain UPDATEs with 23514, and nothing else failed ($errors errors)");
my @other_errors = grep { /ERROR/ && !/rank guard refuses/ } @err_lines;
diag($_) for @other_errors[0 .. min(4, $#other_errors)];

sql("CREATE TABLE expected (id int, status text);
     INSERT INTO expected VALUES " . join(', ', map { "($_, '$ranks[$best{$_}]')" } sort { $a <=> $b } keys %best));
my $wrong_t = sql("SELECT count(*) FROM storm_t JOIN expected USING (id) WHERE storm_t.status <> expected.status");
my $wrong_e = sql("SELECT count(*) FROM storm_e JOIN expected USING (id) WHERE storm_e.status::text <> expected.status");
my $rows = sql("SELECT count(*) FROM expected");
ok($wrong_t == 0 && $rows == $orders, "text/skip: every order holds the highest rank sent to it ($wrong_t of $rows differ)");
ok($wrong_e == 0, "enum/error: every order holds the highest rank sent to it ($wrong_e of $rows differ)");
my $lowered_t = sql("SELECT count(*) FROM audit WHERE tbl = 'storm_t' AND new_rank < old_rank");
my $lowered_e = sql("SELECT count(*) FROM audit WHERE tbl = 'storm_e' AND new_rank < old_rank");
my $audited_t = sql("SELECT count(*) FROM audit WHERE tbl = 'storm_t'");
my $audited_e = sql("SELECT count(*) FROM audit WHERE tbl = 'storm_e'");
ok($lowered_t == 0 && $audited_t > 0, "text/skip: no committed update lowered a rank ($audited_t audited)");
ok($lowered_e == 0 && $audited_e > 0, "enum/error: no committed update lowered a rank ($audited_e audited)");
is(sql("SELECT count(*) FROM audit WHERE old_rank IS NULL OR new_rank IS NULL"), '0', 'every audited value is a rank');
# The control proves the storm really is out of order.
my $lowered_u = sql("SELECT count(*) FROM audit WHERE tbl = 'storm_u' AND new_rank < old_rank");
my $wrong_u = sql("SELECT count(*) FROM storm_u JOIN expected USING (id) WHERE storm_u.status <> expected.status");
ok($lowered_u > 1000 && $wrong_u > 0,
	"control: the unguarded table was lowered $lowered_u times and ends wrong for $wrong_u orders");
# Skipped rows still count as sent: the other column moved only with status.
my $touched = sql("SELECT sum(touched) FROM storm_t");
my $plain_t = grep { /^UPDATE storm_t/ } map { split /\n/ } @scripts;
ok($touched > 0 && $touched < $plain_t, "skip: $touched of $plain_t plain UPDATEs of storm_t applied, the rest were skipped");
# Every advance() that returned true raised the rank by one audited update.
my @out_lines = map { split /\n/, $_->[1] } @results;
my $adv_true = grep { $_ eq 't' } @out_lines;
my $adv_false = grep { $_ eq 'f' } @out_lines;
my $adv_sent = grep { /^SELECT sharding.advance/ } map { split /\n/ } @scripts;
ok($adv_true + $adv_false == $adv_sent && $adv_true > 0 && $adv_false > 0,
	"advance answered all $adv_sent calls: $adv_true moved a row forward, $adv_false did not");
my $raised = sql("SELECT count(*) FROM audit WHERE new_rank > old_rank");
cmp_ok($raised, '>=', $adv_true, "audited forward moves ($raised) cover every advance that reported true");
done_testing();
