# pg_upgrade from an older PostgreSQL major to the one under test: a database
# upgraded in place keeps its maps, epochs, pins, rank guards and queues, and
# they keep working (routing, guarded updates, claims) on the new server.
# (Was test/harness/pg_upgrade.sh.)
#
# Needs a second, older PostgreSQL (server and headers) beside the one under
# test: test/versions.sh installs Debian 12's PostgreSQL 15 into the Debian 13
# root, so there this runs 15 -> 17. SHARDING_UPGRADE_FROM=NN picks the old
# major (default: the oldest installed one older than the one under test;
# named, it may even be the same major, which pg_upgrade accepts). Where
# there is none (the Debian 12 host has only 15) it is one skip.
#
# The extension is built for the old major from SHARDING_REPO (test/run.sh:
# a copy of the sources the server's OS user can read, else the checkout
# this file is in) in a directory of this test, and installed into a
# private copy of the old PostgreSQL tree (PostgreSQL finds its libraries
# and share directory relative to its binaries), so that this runs as the
# server's OS user and leaves every installed tree alone.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use IPC::Run;

# tail_of(TEXT, N): its last N lines.
sub tail_of { my @l = split /\n/, $_[0]; return join("\n", @l > $_[1] ? @l[-$_[1] .. -1] : @l); }

my $repo = $ENV{SHARDING_REPO} // "$FindBin::RealBin/../..";
my ($new_bin, $new_version) = map { my $o = `pg_config $_`; chomp $o; $o } ('--bindir', '--version');
my ($NEW) = $new_version =~ /PostgreSQL (\d+)/ or BAIL_OUT("pg_config --version: $new_version");
my $OLD = $ENV{SHARDING_UPGRADE_FROM};
if (!defined $OLD || $OLD eq '')
{
	($OLD) = sort { $a <=> $b } grep { /^\d+$/ && $_ < $NEW } map { s{.*/}{}r } glob('/usr/lib/postgresql/*');
}
if (!defined $OLD || !-x "/usr/lib/postgresql/$OLD/bin/pg_ctl" || !-f "/usr/include/postgresql/$OLD/server/postgres.h")
{
	plan tests => 1;
	if ($ENV{SHARDING_UPGRADE_FROM})    # asked for by name: missing is a failure
	{
		fail("PostgreSQL $OLD (server and headers) is installed for pg_upgrade");
	}
	else
	{
		SKIP: { skip("pg_upgrade needs an older PostgreSQL server and its headers beside $NEW"
			  . " (test/versions.sh trixie has 15 beside 17)", 1); }
	}
	exit 0;
}
plan tests => 12;

# 1. The same source, built for the old major (in a copy: objects built for
# the major under test are dropped) and installed into a private copy of
# its tree.
my $build = PostgreSQL::Test::Utils::tempdir();
my $root = PostgreSQL::Test::Utils::tempdir();
my $log = '';
my $built = IPC::Run::run([ 'cp', '-r', map({ "$repo/$_" } qw(Makefile sharding.control src sql)), $build ], '>&', \$log)
  && IPC::Run::run([ 'find', $build, '(', '-name', '*.o', '-o', '-name', '*.so', '-o', '-name', '*.bc', '-o', '-name', '.build-flags', ')', '-delete' ], '>&', \$log)
  && IPC::Run::run([ 'mkdir', '-p', "$root/usr/lib/postgresql", "$root/usr/share/postgresql" ], '>&', \$log)
  && IPC::Run::run([ 'cp', '-a', "/usr/lib/postgresql/$OLD", "$root/usr/lib/postgresql/" ], '>&', \$log)
  && IPC::Run::run([ 'cp', '-a', "/usr/share/postgresql/$OLD", "$root/usr/share/postgresql/" ], '>&', \$log)
  && IPC::Run::run([ 'make', '-s', '-j2', '-C', $build, "PG_CONFIG=/usr/lib/postgresql/$OLD/bin/pg_config" ], '>&', \$log)
  && IPC::Run::run([ 'make', '-s', '-C', $build, "PG_CONFIG=/usr/lib/postgresql/$OLD/bin/pg_config", "DESTDIR=$root", 'install' ], '>&', \$log);
ok($built, "the extension builds and installs for PostgreSQL $OLD") or diag(tail_of($log, 20));
my $old_bin = "$root/usr/lib/postgresql/$OLD/bin";

# 2. An old cluster with every kind of state.
my @initdb = (extra => [ '-E', 'UTF8', '--locale=C.UTF-8' ]);
my $old = PostgreSQL::Test::Cluster->new('old_cluster', install_path => "$root/usr/lib/postgresql/$OLD");
$old->init(@initdb);
$old->start;
$old->safe_psql('postgres', 'CREATE DATABASE upgraded');
my ($rc, $out, $err) = $old->psql('upgraded', <<'SQL', on_error_stop => 1);
CREATE EXTENSION sharding;
SELECT sharding.create_map('orders', 16, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.move_shard('orders', 3, 'n3');
SELECT sharding.move_shard('orders', 4, 'n9');
SELECT sharding.pin('orders', 'whale', 'dedicated');
CREATE TYPE stage AS ENUM ('new', 'open', 'closed');
CREATE TABLE tickets (id bigint PRIMARY KEY, status text, stage stage);
SELECT sharding.guard_rank('tickets', 'status', ARRAY['new', 'open', 'closed'], 'skip');
SELECT sharding.guard_rank('tickets', 'stage', NULL, 'error');
INSERT INTO tickets VALUES (1, 'closed', 'closed'), (2, 'new', 'new');
SELECT sharding.create_queue('jobs');
INSERT INTO jobs (key, payload) SELECT 'k' || i, pg_catalog.jsonb_build_object('i', i) FROM generate_series(1, 20) AS i;
SELECT count(*) FROM sharding.claim(NULL::jobs, 'w1', 5);
SQL
is($rc, 0, "PostgreSQL $OLD: maps, pins, guards and a queue set up") or diag($err);
my $snapshot = <<'SQL';
SELECT extversion FROM pg_extension WHERE extname = 'sharding';
SELECT map, logical_shards FROM sharding.maps ORDER BY map;
SELECT map, logical, node, epoch FROM sharding.shards ORDER BY map, logical;
SELECT map, key, node FROM sharding.pins ORDER BY map, key;
SELECT sharding.node_for('orders', 'k' || i) FROM generate_series(1, 40) AS i;
SELECT sharding.node_for('orders', 'whale');
SELECT schema_name, table_name, column_name, ranks, on_regress FROM sharding.rank_guards ORDER BY 1, 2, 3;
SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'tickets'::regclass ORDER BY 1;
SELECT status, count(*), count(owner) FROM jobs GROUP BY status ORDER BY status;
SELECT id, status, stage FROM tickets ORDER BY id;
SQL
my (undef, $before, $before_err) = $old->psql('upgraded', $snapshot);
$before .= $before_err;
$old->stop;

# 3. pg_upgrade into a new cluster of the major under test.
my $new = PostgreSQL::Test::Cluster->new('new_cluster');
# 18 turned data checksums on by default; the old cluster has none.
$new->init(extra => [ '-E', 'UTF8', '--locale=C.UTF-8', ($NEW >= 18 ? ('--no-data-checksums') : ()) ]);
my $upgrade_log = '';
{
	# pg_upgrade writes its logs into the current directory (up to 14) or
	# under the new data directory: run it from one of this test's.
	my $cwd = PostgreSQL::Test::Utils::tempdir();
	local %ENV = $new->_get_env();
	IPC::Run::run([ "$new_bin/pg_upgrade", '-b', $old_bin, '-B', $new_bin, '-d', $old->data_dir, '-D', $new->data_dir,
		'-p', $old->port, '-P', $new->port, '-s', $new->host ], '>&', \$upgrade_log, init => sub { chdir $cwd; });
	$rc = $? >> 8;
}
is($rc, 0, "pg_upgrade $OLD -> $NEW succeeds") or diag(tail_of($upgrade_log, 30));

$new->start;
my $q = sub { my ($r, $o, $e) = $new->psql('upgraded', $_[0]); return $r == 0 ? $o : "$o$e"; };
is($q->("SELECT pg_catalog.current_setting('server_version_num')::int / 10000 = $NEW"), 't',
	"the upgraded database runs on PostgreSQL $NEW");
my (undef, $after, $after_err) = $new->psql('upgraded', $snapshot);
$after .= $after_err;
ok($before ne '' && $before eq $after, 'maps, epochs, pins, routing, guards, queue rows and tickets are the same after the upgrade')
  or diag("before:\n$before\nafter:\n$after");

# 4. Everything still works on the new server.
is($q->("SELECT sharding.move_shard('orders', 3, 'n1') = 3 AND sharding.node_for('orders', 'whale') = 'dedicated'"), 't',
	'move_shard raises the epoch carried over; the pin still routes');
is($q->("WITH u AS (UPDATE tickets SET status = 'open' WHERE id = 1 RETURNING id) SELECT count(*) = 0 FROM u"), 't',
	'the guard still skips a regressing UPDATE');
is($q->("SELECT status = 'closed' FROM tickets WHERE id = 1"), 't', '... and the row kept its rank');
like($q->("UPDATE tickets SET stage = 'new' WHERE id = 1"), qr/rank guard refuses/,
	'the enum guard still raises on a regressing UPDATE');
is($q->("SELECT sharding.advance('tickets', 2::bigint, 'open')"), 't', 'advance moves a ticket forward');
is($q->("SELECT count(*) = 5 FROM sharding.claim(NULL::jobs, 'w2', 5)"), 't', 'claim takes the next five jobs');
is($q->("SELECT sharding.complete('jobs', (SELECT min(id) FROM jobs WHERE owner = 'w1'), 'w1')"), 't',
	'complete fences on the owner recorded before the upgrade');
