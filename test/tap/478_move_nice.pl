# sharding.move_nice (docs/moves.md; src/datanode/move_copy.cpp): the sessions
# of a move's copy run below the nodes' own work. Read at the destination;
# there each part's session raises its nice value by that much, and so does
# every COPY session at the source. The coordinator's own session at the
# destination (which goes on to stream and cut over) is left alone.
#   1. _move_nice itself: the step is added (at most to 19), bad steps are
#      refused with 22023 / 22004, and only sharding_admin may call it;
#   2. a move in parts, held at the destination by an uncommitted row of
#      the last part's: the parts at the destination and every COPY
#      session at the source run at the raised nice value, the
#      coordinator's session at the destination does not; then the move
#      finishes with every row;
#   3. with sharding.move_nice = 0 (the default) no session is raised.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

# nice_of(pid): the nice value of a process of this machine (field 19 of
# /proc/<pid>/stat; the fields after the command's closing parenthesis
# start at field 3).
sub nice_of
{
	my $pid = shift;
	open(my $fh, '<', "/proc/$pid/stat") or return 'gone';
	my $stat = <$fh>;
	close $fh;
	$stat =~ s/^.*\)\s+//s;
	my @f = split /\s+/, $stat;
	return $f[16];
}

# numerically: a sort order (the nodes below are $a and $b).
sub numerically { $::a <=> $::b }

# state_of(node, db, sql): the SQLSTATE sql fails with ('' if it succeeds).
sub state_of
{
	my ($node, $db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, $sql, extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
	return $rc == 0 ? '' : ($err =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : "rc $rc: $err");
}

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 200);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my @tenants = map { sprintf('t%02d', $_) } 0 .. 63;
my $S = 0;    # n1's
my $name = $coord->safe_psql('coord', "SELECT sharding._move_name('bank', $S)");
my $sum = sub { $_[0]->safe_psql($_[1], "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $S, 'accounts')") };

# 1. _move_nice in a session of its own (a background session: its backend
# lives between the calls).
my $s = $b->background_psql('n2', on_error_stop => 0);
my $pid = $s->query_safe('SELECT pg_backend_pid()');
chomp $pid;
my $base = nice_of($pid);
like($base, qr/^-?\d+$/, "a backend's nice value is readable ($base)");
my $want5 = $base + 5 > 19 ? 19 : $base + 5;
my $want8 = $base + 8 > 19 ? 19 : $base + 8;
my $got = $s->query_safe('SELECT sharding._move_nice(5)');
chomp $got;
is($got, $want5, '_move_nice(5) returns the raised value');
is(nice_of($pid), $want5, 'and the backend runs at it');
$got = $s->query_safe('SELECT sharding._move_nice(3)');
chomp $got;
is($got, $want8, 'a second call adds to it');
$got = $s->query_safe('SELECT sharding._move_nice(19)');
chomp $got;
is($got, '19', 'at most 19');
$got = $s->query_safe('SELECT sharding._move_nice(0)');
chomp $got;
is($got, '19', 'a step of 0 changes nothing');
$s->quit;
is(state_of($b, 'n2', 'SELECT sharding._move_nice(20)'), '22023', 'a step over 19 is refused (22023)');
is(state_of($b, 'n2', 'SELECT sharding._move_nice(-1)'), '22023', 'a negative step is refused (22023)');
is(state_of($b, 'n2', 'SELECT sharding._move_nice(NULL)'), '22004', 'a NULL step is refused (22004)');
$b->safe_psql('n2', 'CREATE ROLE nobody_nice LOGIN');
is(state_of($b, 'n2', "SET ROLE nobody_nice;\nSELECT sharding._move_nice(1)"), '42501',
	'a role without sharding_admin may not call it (42501)');
is(state_of($b, 'n2', 'SET sharding.move_nice = 20'), '22023', 'sharding.move_nice over 19 is refused');

# 2. A move in parts under sharding.move_nice = 7 at the destination. The
# table gets 150,000 more rows of the shard's first tenant at n1, enough
# for two parts (4 MB).
my $t = $coord->safe_psql('coord', "SELECT t FROM unnest(ARRAY[" . join(',', map { "'$_'" } @tenants)
	  . "]) t WHERE sharding.logical_shard('bank', t) = $S ORDER BY t LIMIT 1");
my $gen = "SELECT '$t'::text AS tenant, i::bigint AS id, 'big-' || i AS val FROM generate_series(2000001, 2150000) i";
$a->safe_psql('n1', "INSERT INTO accounts $gen");
$a->safe_psql('n1', 'VACUUM ANALYZE accounts');
ok($a->safe_psql('n1', "SELECT pg_relation_size('accounts') / 8192 >= 512") eq 't',
	'the source table is large enough to be copied in two parts');
$b->safe_psql('n2', 'ALTER DATABASE n2 SET sharding.move_nice = 7');

my $pulls = "SELECT string_agg(pid::text, ' ' ORDER BY pid) FROM pg_stat_activity WHERE application_name = '$name' "
  . "AND query LIKE 'SELECT sharding._move_pull(%'";
my $copies = "SELECT string_agg(pid::text, ' ' ORDER BY pid) FROM pg_stat_activity WHERE application_name = '${name}_copy'";
# hold_part(): an uncommitted row at the destination with the key of the
# source's last row (the last part's); that part waits for it.
sub hold_part { return hold_row($b, 'n2', $t, 2150000); }
sub release { release_row($b, 'n2', $_[0]); }
# move_held(what, step): a move n1 -> n2 whose copy is held by an
# uncommitted row; checks the nice values of the destination's three
# sessions (the two parts of the copy's queue and the coordinator's own,
# which waits) and of the source's COPY sessions, lets it go, then checks that
# it moved every row.
sub move_held
{
	my ($what, $step) = @_;
	my $hold = hold_part();
	my $holder_pid = $b->safe_psql('n2', "SELECT pid FROM pg_stat_activity WHERE query LIKE '%''holder''); SELECT pg_sleep(600)'");
	my $base_b = nice_of($holder_pid);
	my $want = $base_b + $step > 19 ? 19 : $base_b + $step;
	my $before = $sum->($a, 'n1');
	my $mv = psql_bg($coord, 'coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')");
	ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$name' "
		  . "AND query LIKE 'SELECT sharding._move_pull(%' AND wait_event_type = 'Lock'", '1', 120),
		"$what: a part of the copy waits for the held key");
	my @dst = split / /, $b->safe_psql('n2', $pulls);
	is(scalar(@dst), 2, "$what: two parts copy at the destination");
	my @own = split / /, $b->safe_psql('n2', "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity "
		  . "WHERE application_name = '$name' AND query NOT LIKE 'SELECT sharding._move_pull(%'");
	is(scalar(@own), 1, "$what: the coordinator's own session at the destination waits, copying nothing");
	my @src = split / /, $a->safe_psql('n1', $copies);
	# The held part's COPY session at least (the other part's ends with it:
	# the shard's rows may all lie in the last part's blocks, the first one
	# then done at once).
	ok(@src >= 1, "$what: the source has the held part's COPY session (" . scalar(@src) . ")");
	is(join(',', map { nice_of($_) } @dst, @own), join(',', $want, $want, $base_b),
		"$what: the two parts at the destination run at nice $want, the coordinator's session at $base_b");
	is(join(',', map { nice_of($_) } @src), join(',', map { $want } @src),
		"$what: every COPY session at the source runs at nice $want");
	release($hold);
	$mv->{h}->finish;
	like(${ $mv->{out} }, qr/^\d+$/m, "$what: the move finishes (" . ${ $mv->{err} } . ")");
	is($sum->($b, 'n2'), $before, "$what: the destination has the shard as the source had it");
	is(shard_rows($a, 'n1', $S), '0', "$what: the source holds no row of the shard");
	is(leftovers($coord, $a, $b), $clean, "$what: nothing of the move is left");
}

move_held('move_nice = 7', 7);

# 3. Back to n1, then again with the default at the destination.
$coord->safe_psql('coord', "SELECT sharding.move_shard_online('bank', $S, 'n1')");
$a->safe_psql('n1', 'VACUUM ANALYZE accounts');
$b->safe_psql('n2', 'ALTER DATABASE n2 RESET sharding.move_nice');
move_held('move_nice = 0 (the default)', 0);
done_testing();
