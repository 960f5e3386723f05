# In-doubt two-phase transactions (docs/ddl.md, CONTRACT 15.4): a node
# stopped, or the coordinator killed, between PREPARE and COMMIT PREPARED of
# a propagated ALTER TABLE. With the library preloaded the background
# worker resolves them as the coordinator decided within 10 s of both being
# up: committed where the coordinator committed, rolled back where it had
# not decided.
#
# The window is held deterministically with the test-only setting
# sharding.ddl_fault = '<phase>:<file>' (superuser only): the transaction
# waits at <phase> ('prepared': every node prepared, the coordinator not yet
# committed; 'commit': committed here, COMMIT PREPARED not yet sent) for as
# long as <file> exists.
#
# Topology: instance i1 holds the coordinator (database `coord`) and data
# node n1 (database `data`); i2 holds n2. max_prepared_transactions = 10.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 17;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my %inst;
$inst{$_} = sharding_node($_, db => 'data',
	conf => "max_prepared_transactions = 10\nwal_retrieve_retry_interval = 200ms") for qw(i1 i2);
my %at = (n1 => 'i1', n2 => 'i2');
my @nodes = qw(n1 n2);
my %dsn = map { $_ => sharding_dsn($inst{ $at{$_} }, 'data') } @nodes;
my ($i1, $i2) = ($inst{i1}, $inst{i2});
sub d { my ($n, $sql, %o) = @_; return sharding_q($inst{ $at{$n} }, 'data', $sql, %o); }
sub c { my ($sql, %o) = @_; return sharding_q($i1, 'coord', $sql, %o); }
sub on_all { my ($sql) = @_; return join(' ', map { d($_, $sql) } @nodes); }
sub has_col { my ($col) = @_; return on_all("SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = '$col'"); }
sub prepared { return on_all('SELECT count(*) FROM pg_prepared_xacts'); }
# within(SECONDS, CODE): polls CODE until true; the ms it took, or undef.
sub within
{
	my ($s, $code) = @_;
	my $t0 = time;
	while (time - $t0 < $s) { return int((time - $t0) * 1000) if $code->(); usleep(50_000); }
	return undef;
}

my $schema = "CREATE TABLE docs (k text PRIMARY KEY, v integer); SELECT 'ready';";
$i1->safe_psql('postgres', 'CREATE DATABASE coord');
$i1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($i1, 'coord') . "'");
is(join(' ', (map { d($_, $schema) } @nodes), c("CREATE EXTENSION sharding; CREATE EXTENSION dblink; $schema")),
	'ready ready ready', 'coordinator and two data nodes created');
c(<<"SQL");
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}');
SELECT sharding.create_map('m', 4, ARRAY['n1', 'n2']);
SELECT sharding.distribute('docs', 'k', 'm');
SQL
is(scalar(grep { c("SELECT sharding.attach_node('$_')") eq '' } @nodes), 2, 'n1, n2 attached');

my $hold = PostgreSQL::Test::Utils::tempdir() . '/hold';
# held(PHASE, COLUMN): starts ALTER TABLE docs ADD COLUMN COLUMN in the
# background, held at PHASE while the file exists.
sub held
{
	my ($phase, $col) = @_;
	PostgreSQL::Test::Utils::append_to_file($hold, 'hold');
	return sharding_start($i1, 'coord',
		"SET sharding.ddl_fault = '$phase:$hold';\nALTER TABLE docs ADD COLUMN $col integer;\n");
}

# ---------------------------------------------------------------- 1. a node stops after the coordinator decided
my $bg = held('commit', 'c1');
ok(defined within(60, sub { c("SELECT count(*) FROM sharding.node_transactions") eq '2' && prepared() eq '1 1' }),
	'held after the coordinator committed: prepared on n1 and n2, the decision recorded');
$i2->stop('immediate');
unlink $hold;
my ($rc, $o, $err) = sharding_finish($bg);
like($err, qr/WARNING:.*node "n2": COMMIT PREPARED/, 'the coordinator\'s COMMIT PREPARED on the stopped n2 fails with a WARNING');
is($rc, 0, '... and its ALTER TABLE succeeds (committed: it was decided)');
is(d('n1', "SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = 'c1'"), '1',
	'n1 has the column');
$i2->start;
my $ms = within(10, sub { has_col('c1') eq '1 1' && prepared() eq '0 0' });
ok(defined $ms, 'n2 back: the transaction is committed there within 10 s' . (defined $ms ? " ($ms ms)" : ''));
diag('node restarted -> committed there: ' . ($ms // 'timeout') . ' ms');

# ---------------------------------------------------------------- 2. the coordinator dies before deciding
$bg = held('prepared', 'c2');
ok(defined within(60, sub { prepared() eq '1 1' }), 'held before the coordinator committed: prepared on n1 and n2');
$i1->stop('immediate');
unlink $hold;
sharding_finish($bg);
$i1->start;
$ms = within(10, sub { prepared() eq '0 0' });
ok(defined $ms, 'coordinator restarted: the prepared transactions are resolved within 10 s' . (defined $ms ? " ($ms ms)" : ''));
diag('coordinator restarted (undecided) -> rolled back: ' . ($ms // 'timeout') . ' ms');
is(has_col('c2'), '0 0', '... rolled back on every node (the coordinator had not committed)');
is(c("SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = 'c2'"), '0',
	'... as on the coordinator');

# ---------------------------------------------------------------- 3. the coordinator dies after deciding
$bg = held('commit', 'c3');
ok(defined within(60, sub { c("SELECT count(*) FROM sharding.node_transactions WHERE node = 'n2'") ne '0' && prepared() eq '1 1' }),
	'held after the coordinator committed: prepared on n1 and n2');
$i1->stop('immediate');
unlink $hold;
sharding_finish($bg);
$i1->start;
$ms = within(10, sub { has_col('c3') eq '1 1' && prepared() eq '0 0' });
ok(defined $ms, 'coordinator restarted: committed on every node within 10 s' . (defined $ms ? " ($ms ms)" : ''));
diag('coordinator restarted (decided) -> committed: ' . ($ms // 'timeout') . ' ms');
is(c("SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = 'c3'"), '1',
	'... as on the coordinator');

# ---------------------------------------------------------------- recover_transactions on demand
# A node stopped while the coordinator commits, the worker not yet there:
# recover_transactions() resolves it once the node is back.
$bg = held('commit', 'c4');
ok(defined within(60, sub { prepared() eq '1 1' && c("SELECT count(*) FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attname = 'c4'") eq '1' }),
	'held after the coordinator committed c4');
$i2->stop('immediate');
unlink $hold;
sharding_finish($bg);
$i2->start;
# The worker or this call resolves it: together exactly one transaction.
my $n = c('SELECT sharding.recover_transactions()');
ok(defined within(10, sub { has_col('c4') eq '1 1' && prepared() eq '0 0' }),
	"recover_transactions() (resolved $n itself) or the worker commits c4 on n2");
is(c('SELECT sharding.recover_transactions()'), '0', 'nothing left to resolve');
