# Pins at scale (docs/directory.md) on a follower: pins changed on the
# coordinator reach a follower through the configuration publication, and a
# follower backend that keeps the map cached sees them at its next call
# (logical-replication apply fires the row triggers; its commit bumps the
# follower's shared counters and fills its ring). 100,000 pins by pin_many,
# then one pin and one unpin; reports how long each took to reach the
# follower's routing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my $pins = 100_000;
my $coord = sharding_node('coord');
my $f1 = sharding_node('f1');
my $f1_dsn = 'host=' . $f1->host . ' port=' . $f1->port . ' dbname=postgres';
$coord->safe_psql('postgres', qq{
	SELECT sharding.add_node('f1', '$f1_dsn');
	SELECT sharding.create_map('m', 64, ARRAY['f1']);
	SELECT sharding.attach_node('f1');});
$f1->poll_query_until('postgres', q{SELECT count(*) = 64 FROM sharding.shards WHERE map = 'm'})
	or die 'the follower never received the map';

# A follower session kept open: its backend keeps the map cached.
my %s = (in => '', out => '', err => '');
$s{h} = IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $f1_dsn ],
	'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
sub query
{
	my ($sql) = @_;
	my $marker = 'done-' . int(rand(1e9));
	$s{out} = '';
	$s{in} .= "$sql;\n\\echo $marker\n";
	$s{h}->pump until $s{out} =~ /$marker/ || $s{err} =~ /ERROR/;
	die "query failed: $s{err}" if $s{err} =~ /ERROR/;
	(my $r = $s{out}) =~ s/\n?$marker\n//;
	return $r;
}
# Polls the follower session until the query answers `want` (30 s at most);
# the seconds it took, or undef.
sub until_seen
{
	my ($sql, $want, $since) = @_;
	while (time - $since < 30)
	{
		return time - $since if query($sql) eq $want;
		usleep(20_000);
	}
	return undef;
}
is(query(q{SELECT sharding.node_for('m', 'k1')}), 'f1', 'the follower routes with its copy of the map');

# 'm' is a database map (its node has a DSN): pin_many checks every node as
# pin does.
my ($rc, $out, $err) = $coord->psql('postgres', q{SELECT sharding.pin_many('m', ARRAY['a', 'b'], ARRAY['f1', 'nodsn'])},
	extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
like($err, qr/55000/, 'pin_many on a database map refuses a node without DSN (55000)');
$coord->safe_psql('postgres', q{
	SELECT sharding.add_node('w' || i, 'dbname=nowhere') FROM generate_series(0, 9) i;
	SELECT sharding.add_node('w99', 'dbname=nowhere');});

my $t0 = time;
$coord->safe_psql('postgres', qq{
	SELECT sharding.pin_many('m', array_agg('t' || i), array_agg('w' || i % 10)) FROM generate_series(1, $pins) i});
my $lag = until_seen(qq{SELECT sharding.node_for('m', 't$pins')}, 'w' . ($pins % 10), $t0);
ok(defined $lag, "$pins pins by pin_many reach the follower's routing") and note(sprintf('%d pins reached the follower in %.2f s', $pins, $lag));
is(query(q{SELECT count(*) FILTER (WHERE sharding.node_for('m', k) IS DISTINCT FROM coalesce(p.node, s.node))
	FROM (SELECT 't' || i AS k FROM generate_series(0, 200000) i) x
	LEFT JOIN sharding.pins p ON p.map = 'm' AND p.key = x.k
	JOIN sharding.shards s ON s.map = 'm' AND s.logical = sharding.shard_of(x.k, 64)}),
	'0', 'the follower routes 200,001 keys as its tables say');

$t0 = time;
$coord->safe_psql('postgres', q{SELECT sharding.pin('m', 'solo', 'w99')});
$lag = until_seen(q{SELECT sharding.node_for('m', 'solo')}, 'w99', $t0);
ok(defined $lag, 'one pin reaches the follower session that has the map cached') and note(sprintf('one pin: %.3f s', $lag));
$t0 = time;
$coord->safe_psql('postgres', q{SELECT sharding.unpin('m', 't7')});
$lag = until_seen(q{SELECT sharding.node_for('m', 't7')}, 'f1', $t0);
ok(defined $lag, 'one unpin reaches it too') and note(sprintf('one unpin: %.3f s', $lag));
is(query(q{SELECT sharding.node_for('m', 't8')}), 'w8', 'the other pins stay');

$s{in} .= "\\q\n";
$s{h}->finish;
$f1->stop;
$coord->stop;
done_testing();
