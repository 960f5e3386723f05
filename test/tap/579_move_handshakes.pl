# A move's sessions at the source and at the destination are established at
# once (Remote::open_all, their handshakes polled together); the failure
# raised is the first in order (the source's), and no later than when they
# connected one after the other (round 13's review findings):
#   - a source refused at once is raised at once, while the destination's
#     handshake still waits for a server that never answers (a silent port:
#     listening, never accepting; its connect_timeout is ten minutes);
#   - the destination's half-open connection is closed when the move fails
#     (nothing of a failed open_all is left open);
#   - the other way round (the destination refused, the source silent) the
#     move waits for the source, the first in order, and raises its failure
#     once the source's handshake ends (here: its port goes away).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IO::Socket::INET;
use IO::Select;
use IPC::Run;
use lib 'lib';
use ShardingNode;

my $i = sharding_node('handshakes', db => 'coord');
sub sq { my ($sql) = @_; return $i->safe_psql('coord', $sql); }

# A silent port (the kernel completes each connection into the backlog and
# keeps what the client sends unread) and a refused one (bound, then closed:
# nothing listens there).
sub silent_port
{
	my $s = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp')
	  or die "cannot listen: $!";
	return $s;
}
my $silent = silent_port();
my $refused_sock = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp')
  or die "cannot listen: $!";
my $refused = $refused_sock->sockport;
close($refused_sock);
my ($rc0, $out0, $err0) = $i->psql('coord', "SELECT 1", connstr => "host=127.0.0.1 port=$refused dbname=x connect_timeout=5");
like($err0, qr/refused/i, "port $refused refuses connections") or diag($err0);

sub dsn_of
{
	my ($port) = @_;
	return "host=127.0.0.1 port=$port dbname=x sslmode=disable gssencmode=disable connect_timeout=600";
}

# move(SQL): runs SQL in psql, with 120 s to end; returns (ended, stderr).
sub move
{
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $i->connstr('coord'), '-c', $sql ],
		'>', \$out, '2>', \$err, IPC::Run::timeout(120));
	my $ended = eval { $h->finish; 1 };
	$h->kill_kill unless $ended;
	return ($ended ? 1 : 0, $err);
}

# The first connection waiting in the silent port's backlog: accepted, read
# until its client closes it (1) or 30 s pass with it still open (0).
sub closed_by_client
{
	my ($listener) = @_;
	my $sel = IO::Select->new($listener);
	return 0 unless $sel->can_read(30);
	my $c = $listener->accept or return 0;
	my $cs = IO::Select->new($c);
	my $t0 = time;
	while (time - $t0 < 30)
	{
		next unless $cs->can_read(1);
		my $n = sysread($c, my $buf, 4096);
		return 1 if defined $n && $n == 0;
		return 1 unless defined $n;    # reset by the client
	}
	return 0;
}

sq("SELECT sharding.add_node('src', '" . dsn_of($refused) . "'),
           sharding.add_node('dst', '" . dsn_of($silent->sockport) . "');
    SELECT sharding.create_map('m', 2, ARRAY['src', 'dst'])");
my $S = sq("SELECT min(logical) FROM sharding.shards WHERE map = 'm' AND node = 'src'");

# 1. The source refused at once, the destination silent.
my ($ended, $err) = move("SET client_min_messages = warning; SELECT sharding.move_shard_online('m', $S, 'dst')");
ok($ended, 'a source refused at once: the move ends without waiting for the silent destination');
like($err, qr/ERROR:.*could not connect.*port $refused/s, "the error raised is the source's (port $refused)")
  or diag($err);
is(sq("SELECT phase || ' ' || error_state FROM sharding.move_journal WHERE map = 'm' AND logical = $S"),
	'failed 08001', 'the move is recorded as failed, with 08001');
ok(closed_by_client($silent), "the destination's half-open connection was closed by the failed move");
is(sq("SELECT node FROM sharding.shards WHERE map = 'm' AND logical = $S"), 'src', 'the source still owns the shard');

# 2. The other way round: the destination refused at once, the source
# silent. The move waits for the source (the first in order); when the
# source's port goes away its handshake fails, and that failure is raised.
my $silent2 = silent_port();
my $sport = $silent2->sockport;
sq("UPDATE sharding.nodes SET dsn = '" . dsn_of($sport) . "' WHERE node = 'src';
    UPDATE sharding.nodes SET dsn = '" . dsn_of($refused) . "' WHERE node = 'dst'");
my ($out2, $err2) = ('', '');
my $h2 = IPC::Run::start([ 'psql', '-XAtq', '-d', $i->connstr('coord'), '-c',
		"SET client_min_messages = warning; SELECT sharding.move_shard_online('m', $S, 'dst')" ],
	'>', \$out2, '2>', \$err2, IPC::Run::timeout(120));
ok($i->poll_query_until('coord', "SELECT count(*) > 0 FROM sharding.move_journal WHERE map = 'm' AND logical = $S
                                  AND phase NOT IN ('failed', 'done', 'cancelled')", 't'),
	'the second move is under way');
# Its source's connection is in the silent port's backlog: the move waits
# for it (the destination's refusal is not raised before the source's end).
my $sel = IO::Select->new($silent2);
ok($sel->can_read(60), "the source's connection reached the silent port");
sleep 1;
$h2->pump_nb;
ok($h2->pumpable, 'the move still waits for the source, the first in order');
# The source's server "answers" by closing: accept its connection and close it.
my $c = $silent2->accept;
close($c) if $c;
close($silent2);
my $ended2 = eval { $h2->finish; 1 };
$h2->kill_kill unless $ended2;
ok($ended2, 'the move ends once the source handshake fails');
unlike($err2, qr/port $refused/, "the error raised is not the destination's") or diag($err2);
like($err2, qr/ERROR:.*could not connect/s, "the error raised is the source's") or diag($err2);
is(sq("SELECT node FROM sharding.shards WHERE map = 'm' AND logical = $S"), 'src', 'the source still owns the shard');
is(sq("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND state = 'active'
       AND query LIKE '%move_shard_online%' AND pid <> pg_backend_pid()"), '0', 'no move is left running');

done_testing();
