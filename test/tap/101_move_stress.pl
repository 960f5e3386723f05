# When a change is seen (docs/directory.md), the stress test: 20 moves under 6
# writers on a busy machine.
#
# One cluster: a coordinator database (map 'acc', 8 logical shards over n1,
# n2, n3) and three data databases n1, n2, n3, each a guarded follower
# (sharding.local_node following, the guard on docs, which holds every key).
# Writers are PL/pgSQL procedures on the coordinator, one transaction per
# operation: route a key with node_for, UPDATE it on that node through
# dblink, and on 55000 retry inside the same transaction (an EXCEPTION block,
# then pg_sleep(0.01)). Every attempt is logged: when node_for answered,
# which node, what the node said.
#
# A move first switches the owner on the data nodes, as a replicated cutover
# would (the old owner refuses from then on), then, 200 ms later, commits
# move_shard on the coordinator. Writers caught in between retry inside
# their transaction: each retry must route to the new owner once the
# coordinator's move has committed. pgbench runs against another database
# and a CPU hog per core for the whole test.
#
# Fails on any node_for answer naming a node that had stopped owning the
# key's shard more than a second before it answered, and on a write that
# gave up. Version 1.2 kept routing to the old owner until the transaction
# ended, so every caught writer retried until it gave up.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep time);
use lib 'lib';
use ShardingNode;

my $writers = 6;
my $moves = 20;
my $keys = 64;

my $node = sharding_node('stress', db => 'coord', conf => 'max_connections = 60');
my $connstr = $node->connstr('coord');
my $host = $node->host;
my $port = $node->port;

for my $n (qw(n1 n2 n3))
{
	$node->safe_psql('postgres', "CREATE DATABASE $n");
	$node->safe_psql($n, qq{
		CREATE EXTENSION sharding;
		SELECT sharding.create_map('acc', 8, ARRAY['n1', 'n2', 'n3']);
		CREATE TABLE docs (k text PRIMARY KEY, v integer NOT NULL);
		SELECT sharding.distribute('docs', 'k', 'acc');
		INSERT INTO docs SELECT 'ten' || i, 0 FROM generate_series(0, $keys - 1) i;
		INSERT INTO sharding.local_node (node, coordinator_dsn, following) VALUES ('$n', 'dbname=coord', true);
		SELECT sharding._install_guards();});
}
$node->safe_psql('coord', qq{
	SELECT sharding.create_map('acc', 8, ARRAY['n1', 'n2', 'n3']);
	CREATE TABLE wlog (writer int, op int, attempt int, at timestamptz, k text, shard int, node text, said text);
	CREATE TABLE moves (n int, shard int, node text, began timestamptz, done timestamptz);
	CREATE TABLE stop (at timestamptz);
	INSERT INTO moves SELECT 0, logical, node, '-infinity', '-infinity' FROM sharding.shards WHERE map = 'acc';
	CREATE PROCEDURE writer(w int, seconds float8) LANGUAGE plpgsql AS \$p\$
	DECLARE
		deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
		k text; n text; s int; t timestamptz; r text; attempt int; op int := 0;
	BEGIN
		PERFORM dblink_connect(x, 'host=$host port=$port dbname=' || x) FROM unnest(ARRAY['n1', 'n2', 'n3']) x;
		WHILE clock_timestamp() < deadline AND NOT EXISTS (SELECT FROM stop) LOOP
			op := op + 1;
			k := 'ten' || floor(random() * $keys)::int;
			attempt := 0;
			LOOP
				attempt := attempt + 1;
				n := sharding.node_for('acc', k);
				t := clock_timestamp();
				s := sharding.logical_shard('acc', k);
				BEGIN
					r := dblink_exec(n, format('UPDATE docs SET v = v + 1 WHERE k = %L', k));
					INSERT INTO wlog VALUES (w, op, attempt, t, k, s, n, r);
					EXIT;
				EXCEPTION WHEN object_not_in_prerequisite_state THEN
					INSERT INTO wlog VALUES (w, op, attempt, t, k, s, n, '55000: ' || SQLERRM);
				END;
				IF attempt >= 300 THEN  -- three seconds and more of refusals
					INSERT INTO wlog VALUES (w, op, attempt, clock_timestamp(), k, s, n, 'gave up');
					EXIT;
				END IF;
				PERFORM pg_sleep(0.01);
			END LOOP;
			COMMIT;
		END LOOP;
	END \$p\$;});

# Keep the machine busy: pgbench against another database, a CPU hog per core.
my $run_seconds = 60;    # at most: the writers stop when the moves are done
$node->safe_psql('postgres', 'CREATE DATABASE bench');
$node->command_ok([ 'pgbench', '-i', '-q', '-s', '1', '-h', $host, '-p', $port, 'bench' ], 'pgbench initialised');
my @busy;
push @busy, IPC::Run::start([ 'pgbench', '-n', '-S', '-c', '2', '-j', '1', '-T', $run_seconds,
		'-h', $host, '-p', $port, 'bench' ], '>', \my $bench_out, '2>', \my $bench_err);
my $cores = `nproc` || 2;
chomp $cores;
for (1 .. $cores)
{
	push @busy, IPC::Run::start([ $^X, '-e', 'my $t = time + ' . $run_seconds . '; 1 while time < $t' ]);
}

my @w;
for my $i (1 .. $writers)
{
	my ($out, $err) = ('', '');
	push @w, [ IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $connstr,
		'-c', "CALL writer($i, $run_seconds)" ], '>', \$out, '2>', \$err), \$err ];
}
sleep 1;

# The moves: shard i mod 8 to the next node, cut over on the data nodes
# first, then committed on the coordinator.
my %owner = map { split /\|/ } split /\n/,
	$node->safe_psql('coord', "SELECT logical, node FROM sharding.shards WHERE map = 'acc'");
my @nodes = qw(n1 n2 n3);
for my $i (1 .. $moves)
{
	my $s = ($i * 3) % 8;
	my ($idx) = grep { $nodes[$_] eq $owner{$s} } 0 .. 2;
	my $to = $nodes[ ($idx + 1) % 3 ];
	for my $n (@nodes)
	{
		$node->safe_psql($n, qq{SET session_replication_role = replica;
			UPDATE sharding.shards SET node = '$to', epoch = epoch + 1 WHERE map = 'acc' AND logical = $s;});
	}
	usleep(200_000);
	# Separate statements, each its own transaction: began is read before the
	# move commits, done after its commit returned.
	$node->safe_psql('coord', qq{CREATE TEMP TABLE t AS SELECT clock_timestamp() AS began;
		SELECT sharding._switch_owner('acc', $s, '$to');
		INSERT INTO moves SELECT $i, $s, '$to', began, clock_timestamp() FROM t;});
	$owner{$s} = $to;
	usleep(250_000);
}
usleep(500_000);
$node->safe_psql('coord', 'INSERT INTO stop VALUES (now())');

for my $h (@w)
{
	ok($h->[0]->finish, 'writer finished') or diag(${ $h->[1] });
}
$_->kill_kill for @busy;

my $summary = $node->safe_psql('coord', q{
	SELECT count(*), count(DISTINCT (writer, op)), count(*) FILTER (WHERE said LIKE '55000%'),
	       count(DISTINCT (writer, op)) FILTER (WHERE attempt > 1), count(*) FILTER (WHERE said = 'gave up')
	  FROM wlog});
my ($attempts, $ops, $refused, $retried, $gave_up) = split /\|/, $summary;
note("$ops operations, $attempts attempts, $refused refusals, $retried operations retried, $gave_up gave up");
is($node->safe_psql('coord', 'SELECT count(*) FROM moves WHERE n > 0'), $moves, "$moves moves committed");
cmp_ok($ops, '>', 200, 'the writers wrote');
cmp_ok($retried, '>=', 5, 'writers were caught by moves and retried inside their transaction');

# An answer is stale if the node it names was not the shard's owner at any
# instant of the second before it answered: node X owned the shard from the
# moment its move to X began (a move is visible at commit, between began and
# done) until the next move of the shard was done.
my $stale_rows = q{
	WITH own AS (SELECT shard, node, began,
	                    coalesce(lead(done) OVER (PARTITION BY shard ORDER BY n), 'infinity') AS until
	               FROM moves)
	SELECT l.*
	  FROM wlog l
	 WHERE NOT EXISTS (SELECT FROM own o WHERE o.shard = l.shard AND o.node = l.node
	                      AND o.began <= l.at AND o.until > l.at - interval '1 second')};
my $stale = $node->safe_psql('coord', qq{
	SELECT count(*) || ' ' || count(DISTINCT (writer, op)) FROM ($stale_rows) s});
diag($node->safe_psql('coord', "SELECT * FROM ($stale_rows) s ORDER BY at LIMIT 10")) unless $stale =~ /^0 /;
my ($nstale, $stale_ops) = split / /, $stale;
is($nstale, '0', "no node_for answer stale for more than a second after a committed move ($stale_ops operations had one)");
is($gave_up, '0', 'no write gave up');
# Every write that succeeded did so on the owner of its shard as the data
# nodes saw it (the guards refused the others).
is($node->safe_psql('coord', q{SELECT count(*) FROM wlog WHERE said NOT LIKE '55000%' AND said <> 'UPDATE 1' AND said <> 'gave up'}),
	'0', 'every write that passed the guard updated its row');
$node->stop;
done_testing();
