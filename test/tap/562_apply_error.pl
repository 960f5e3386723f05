# RB-6: a change the destination cannot apply (here a row its CHECK
# constraint rejects, written at the source while the shard is copied)
# fails the move within seconds, naming the destination's apply errors,
# instead of waiting up to 600 s per catch-up round; the move is rolled
# back (the source keeps the shard and its rows, nothing of the move left).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($c, $d) = jobs_cluster(rows => 2000);
my $q = sub { return $c->safe_psql('coord', $_[0]); };
my $logical = $q->("SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $tenant = $q->("SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) AS i) x
	WHERE sharding.logical_shard('bank', t) = $logical ORDER BY t LIMIT 1");
# n3 rejects what n1 accepts.
$d->safe_psql('n3', "ALTER TABLE accounts ADD CONSTRAINT no_poison CHECK (val <> 'poison')");

# The copy into n3 waits behind a lock until the poison row is written at
# the source (after the move's slot exists: it is in the stream).
my $hold = $d->background_psql('n3', on_error_stop => 1);
$hold->query_safe('BEGIN; LOCK TABLE accounts IN SHARE MODE');
my $mover = $c->background_psql('coord', on_error_stop => 0);
my $t0 = time;
$mover->query_until(qr/started/, "\\echo started\nSET statement_timeout = '100s';\n\\set VERBOSITY verbose\n"
	  . "SELECT sharding.move_shard_online('bank', $logical, 'n3');\n\\echo done\n");
ok(wait_for('coord', "SELECT phase FROM sharding.move_journal WHERE map = 'bank' AND logical = $logical
	AND phase NOT IN ('done', 'failed', 'cancelled')", 'copying', 60), 'the move is copying');
ok(wait_for('n1', "SELECT count(*) FROM pg_replication_slots WHERE slot_name ~ '^sharding_move_[0-9a-f]{6}_bank_$logical\$'", '1', 60),
	"its slot exists at the source (what is written now reaches the destination through the stream)");
$d->safe_psql('n1', "INSERT INTO accounts VALUES ('$tenant', 99999999, 'poison')");
$hold->quit;

ok(wait_for('coord', "SELECT count(*) FROM sharding.move_journal WHERE map = 'bank' AND logical = $logical
	AND phase IN ('failed', 'cancelled')", '1', 110), 'the move ended');
my $took = time - $t0;
my ($phase, $state, $error) = split /\|/,
  $q->("SELECT phase, error_state, error FROM sharding.move_journal WHERE map = 'bank' AND logical = $logical ORDER BY move DESC LIMIT 1");
is("$phase $state", 'failed 55000', 'RB-6: the move failed with 55000');
like($error, qr/^the destination of move sharding_move_[0-9a-f]{6}_bank_$logical cannot apply the source's changes/,
	"RB-6: its error names the destination's apply errors ($error)");
diag(sprintf("RB-6: the move failed %.1f s after it started", $took));
ok($took < 60, sprintf('RB-6: within a minute of its start (%.1f s), not after a 600 s catch-up round', $took));
$mover->quit;

is($q->("SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $logical"), 'n1', 'the source keeps the shard');
$d->safe_psql('n1', "DELETE FROM accounts WHERE id = 99999999");
check_data('after the failed move');
is(leftovers(), 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0', 'nothing of the move is left');

done_testing();
