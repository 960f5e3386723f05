# A move's sessions at the source and at the destination are established at
# once (Remote::open_all, their handshakes polled together); the failure
# raised is the first in order (the source's), and no later than when they
# connected one after the other (round 13's review findings):
#   - a source refused at once is raised at once, while the destination's
#     handshake still waits for a server that never answers (a silent port:
#     listening, never accepting; libpq's connect_timeout does not bound
#     a handshake polled as the engine polls it);
#   - the destination's half-open connection is closed when the move fails
#     (nothing of a failed open_all is left open);
#   - the other way round (the destination refused, the source silent) the
#     move waits for the source, the first in order, and raises its failure
#     once the source's handshake ends (here: its port goes away);
#   - a connect_timeout in a node's DSN bounds its handshake (libpq applies
#     it only when it connects itself; the engine polls, and applies it).
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
# keeps what the client sends unread) and a refused one (bound, nothing
# listens there).
sub silent_port
{
	my $s = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp')
	  or die "cannot listen: $!";
	return $s;
}
my $silent = silent_port();
# (Bound, not listening, and kept so to the end: nothing else can take
# the port meanwhile, and a connection to it is refused.)
my $refused_sock = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp')
  or die "cannot bind: $!";
my $refused = $refused_sock->sockport;
my ($rc0, $out0, $err0) = $i->psql('coord', "SELECT 1", connstr => "host=127.0.0.1 port=$refused dbname=x connect_timeout=5");
like($err0, qr/refused/i, "port $refused refuses connections") or diag($err0);

sub dsn_of
{
	my ($port) = @_;
	return "host=127.0.0.1 port=$port dbname=x sslmode=disable gssencmode=disable connect_timeout=600";
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

# 1. The source refused at once, the destination silent. The move runs in
# a session that stays in its transaction after it, its error caught (a
# subtransaction's end): the destination's connection must be closed by
# the failure itself, not by the transaction's end or the session's.
my ($in1, $out1, $err1) = ('', '', '');
my $h1 = IPC::Run::start([ 'psql', '-XAtq', '-d', $i->connstr('coord') ],
	'<', \$in1, '>', \$out1, '2>', \$err1, IPC::Run::timeout(120));
$in1 .= "BEGIN;\nDO \$\$ BEGIN PERFORM sharding.move_shard_online('m', $S, 'dst'); "
  . "EXCEPTION WHEN OTHERS THEN RAISE WARNING 'caught: % %', SQLSTATE, SQLERRM; END \$\$;\nSELECT 'after the move';\n";
my $ended = eval { $h1->pump until $out1 =~ /after the move/; 1 };
ok($ended, 'a source refused at once: the move ends without waiting for the silent destination');
like($err1, qr/caught: 08001/, "the error raised is 08001") or diag($err1);
ok(closed_by_client($silent), "the destination's half-open connection was closed by the failed move, its transaction still open");
$in1 .= "COMMIT;\n\\q\n";
eval { $h1->finish; 1 } or $h1->kill_kill;
like(sq("SELECT phase || ' ' || error_state || ' ' || error_detail FROM sharding.move_journal WHERE map = 'm' AND logical = $S"),
	qr/^failed 08001 .*port $refused/s, "the move is recorded as failed with the source's error (port $refused)");
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
is(sq("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND wait_event_type = 'Extension'
       AND query LIKE '%move_shard_online%' AND pid <> pg_backend_pid()"), '1',
	'the move still waits for the source, the first in order');
$h2->pump_nb;
is($err2, '', 'and has raised nothing');
# The source's server "answers" by closing: accept its connection and close it.
my $c = $silent2->accept;
close($c) if $c;
close($silent2);
my $ended2 = eval { $h2->finish; 1 };
$h2->kill_kill unless $ended2;
ok($ended2, 'the move ends once the source handshake fails');
like($err2, qr/ERROR:.*could not connect.*port $sport/s, "the error raised is the source's (port $sport)") or diag($err2);
is(sq("SELECT node FROM sharding.shards WHERE map = 'm' AND logical = $S"), 'src', 'the source still owns the shard');

# 3. connect_timeout bounds a handshake (libpq applies it only when it
# connects itself): the source silent with connect_timeout=2, the
# destination refused. The move fails once the source's time is up, with
# the source's timeout.
my $silent3 = silent_port();
my $tport = $silent3->sockport;
sq("UPDATE sharding.nodes SET dsn = 'host=127.0.0.1 port=$tport dbname=x sslmode=disable gssencmode=disable connect_timeout=2'
    WHERE node = 'src'");
my ($out3, $err3) = ('', '');
my $h3 = IPC::Run::start([ 'psql', '-XAtq', '-d', $i->connstr('coord'), '-c',
		"SET client_min_messages = warning; SELECT sharding.move_shard_online('m', $S, 'dst')" ],
	'>', \$out3, '2>', \$err3, IPC::Run::timeout(120));
my $ended3 = eval { $h3->finish; 1 };
$h3->kill_kill unless $ended3;
ok($ended3, 'a silent source with connect_timeout = 2: the move ends');
like($err3, qr/ERROR:.*could not connect.*127\.0\.0\.1:$tport failed: timeout expired/s,
	"with the source's timeout (port $tport)") or diag($err3);
close($silent3);

done_testing();
