# A node that stops answering after the coordinator decided (docs/ddl.md,
# "How it commits"): COMMIT PREPARED is waited for at most 10 s, and never
# past a cancel of the coordinator's session; then a WARNING, and recovery
# commits it there once the node answers again. The node's session is
# stopped (SIGSTOP) while sharding.ddl_fault holds the commit between the
# local commit and COMMIT PREPARED.
#
# One instance (max_prepared_transactions = 10): the coordinator's database
# coord and data node n1 (database data1).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 8;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my $i1 = sharding_node('i1', db => 'data1', conf => "max_prepared_transactions = 10\nwal_retrieve_retry_interval = 200ms");
$i1->safe_psql('postgres', q{CREATE DATABASE coord});
$i1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($i1, 'coord') . "'");
sub d { my ($sql, %o) = @_; return sharding_q($i1, 'data1', $sql, %o); }
sub c { my ($sql, %o) = @_; return sharding_q($i1, 'coord', $sql, %o); }
is((split /\n/, c(<<"SQL"))[-1], 'ready', 'coordinator: n1 attached, t distributed');
CREATE EXTENSION dblink; CREATE EXTENSION sharding;
SELECT sharding.add_node('n1', '@{[ sharding_dsn($i1, 'data1') ]}');
SELECT sharding.attach_node('n1');
SELECT sharding.create_map('m', 2, ARRAY['n1']);
CREATE TABLE t (k text PRIMARY KEY, v integer);
SELECT sharding.distribute('t', 'k', 'm');
SELECT 'ready';
SQL

my $hold = PostgreSQL::Test::Utils::tempdir() . '/hold';
# stalled(column, cancel): runs ADD COLUMN with the commit held, stops n1's
# session once n1 prepared, releases the hold (and cancels the coordinator's
# session when asked); the seconds until the coordinator's session ended
# (undef if not within 40 s), its messages.
sub stalled
{
	my ($col, $cancel) = @_;
	append_to_file($hold, 'x');
	my $bg = sharding_start($i1, 'coord',
		"SET sharding.ddl_fault = 'commit:$hold';\nALTER TABLE t ADD COLUMN $col integer;\nSELECT 'returned';\n",
		on_error_stop => 0);
	defined sharding_wait($i1, 'data1', 'SELECT count(*) FROM pg_prepared_xacts', '1', 30) or return (undef, 'never prepared');
	my $pid = d(q{SELECT pid FROM pg_stat_activity WHERE datname = 'data1' AND application_name = 'sharding ddl'});
	kill 'STOP', $pid;
	unlink $hold;
	my $t0 = time;
	if ($cancel)
	{
		usleep(500_000);
		c(qq{SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = 'coord' AND query LIKE 'ALTER TABLE t ADD COLUMN $col%'});
	}
	my $took;
	while (time - $t0 < 40)
	{
		if (slurp_file("$bg->{base}.out") =~ /returned/) { $took = time - $t0; last; }
		usleep(50_000);
	}
	kill 'CONT', $pid;
	my ($rc, $out, $err) = sharding_finish($bg);
	return ($took, $err);
}

my ($took, $err) = stalled('c', 0);
ok(defined $took && $took < 25, 'a node that does not answer COMMIT PREPARED: the coordinator returns after a bounded wait')
  or diag('took ' . ($took // 'over 40 s'));
like($err, qr/WARNING:.*node "n1": COMMIT PREPARED of two-phase transaction \S+ failed/, '... with a WARNING naming the node');
ok(defined sharding_wait($i1, 'data1', 'SELECT count(*) FROM pg_prepared_xacts', '0', 30), '... and recovery commits it on n1 once it answers');
is(d(q{SELECT count(*) FROM pg_attribute WHERE attrelid = 't'::regclass AND attname = 'c'}), '1', '... the column is there');

($took, $err) = stalled('d', 1);
ok(defined $took && $took < 8, 'the same wait ends at a cancel of the coordinator\'s session (well before 10 s)')
  or diag('took ' . ($took // 'over 40 s'));
ok(defined sharding_wait($i1, 'data1', 'SELECT count(*) FROM pg_prepared_xacts', '0', 30), '... recovery commits it on n1');
is(d(q{SELECT count(*) FROM pg_attribute WHERE attrelid = 't'::regclass AND attname = 'd'}), '1', '... the column is there (the coordinator had decided)');
