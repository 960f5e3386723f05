# One database's slow recovery stalls no other (RB-3 of the 1.3 review,
# docs/rebalance.md "Where jobs run"). After a restart the launcher starts a
# move scanner in every database; a scanner whose recovery waits on a node
# that never answers (here: a TCP port that accepts connections and never
# says a word, as a host behind a dead load balancer does) must not hold up
# the next database's scan.
#
# One instance, library preloaded. Database a_coord (created first, so
# scanned first) journals an interrupted move between nodes x1 and x2 whose
# DSNs lead to that silent port; database b_coord journals an interrupted
# move between its nodes b1 and b2 (databases b_n1 and b_n2 of the same
# instance). After an immediate restart: b_coord's move is rolled back
# within seconds while a_coord's scanner still waits; once the silent port
# closes, a_coord's move is rolled back too.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 5;
use IO::Socket::INET;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my $i = sharding_node('stall', db => 'a_coord');
sub sq { my ($db, $sql) = @_; return $i->safe_psql($db, $sql); }

# The silent port: listening, with a backlog, never accepting: the kernel
# completes every connection and keeps what the client sends unread.
my $silent = IO::Socket::INET->new(Listen => 16, LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp')
  or die "cannot listen: $!";
my $port = $silent->sockport;

for my $db (qw(b_coord b_n1 b_n2))
{
	$i->safe_psql('postgres', "CREATE DATABASE $db");
	sq($db, 'CREATE EXTENSION sharding');
}
ok(sq('postgres', "SELECT (SELECT oid FROM pg_database WHERE datname = 'a_coord') < (SELECT oid FROM pg_database WHERE datname = 'b_coord')"),
	'a_coord comes before b_coord');

# An interrupted move in each coordinator: phase 'copying', no executor.
sq('a_coord', "SELECT sharding.add_node('x1', 'host=127.0.0.1 port=$port dbname=x1'),
                     sharding.add_node('x2', 'host=127.0.0.1 port=$port dbname=x2');
              SELECT sharding.create_map('m', 2, ARRAY['x1', 'x2']);
              INSERT INTO sharding.move_journal (map, logical, source, destination, phase, started)
              VALUES ('m', 0, 'x1', 'x2', 'copying', now())");
sq('b_coord', "SELECT sharding.add_node('b1', '" . sharding_dsn($i, 'b_n1') . "'),
                     sharding.add_node('b2', '" . sharding_dsn($i, 'b_n2') . "');
              SELECT sharding.create_map('m', 2, ARRAY['b1', 'b2']);
              INSERT INTO sharding.move_journal (map, logical, source, destination, phase, started)
              VALUES ('m', 0, 'b1', 'b2', 'copying', now())");

$i->stop('immediate');
$i->start;
my $t0 = time;
my $phase = "SELECT phase FROM sharding.move_journal";
ok($i->poll_query_until('b_coord', "SELECT phase = 'failed' FROM sharding.move_journal", 't'),
	"b_coord's interrupted move was rolled back by its scanner while a_coord's waits");
diag(sprintf("b_coord's move rolled back %.1f s after the restart", time - $t0));
is(sq('a_coord', $phase) . ' ' . sq('postgres', "SELECT count(*) FROM pg_stat_activity WHERE datname = 'a_coord'
                                              AND backend_type = 'sharding move scanner'"),
	'copying 1', "meanwhile a_coord's scanner still waits for the silent node, its move still journaled as copying");

# The silent port goes away: a_coord's scanner fails to connect, and a later
# recheck rolls its move back once the nodes answer (they never will here:
# it stays, with a WARNING, and its database is rechecked).
close($silent);
ok($i->poll_query_until('postgres', "SELECT count(*) FROM pg_stat_activity WHERE datname = 'a_coord'
                                     AND backend_type = 'sharding move scanner'", '0'),
	"a_coord's scanner ended once the port closed");
is(sq('b_coord', "SELECT count(*) FROM sharding.move_journal WHERE phase <> 'failed'"), '0',
	"b_coord's journal has no live move");
