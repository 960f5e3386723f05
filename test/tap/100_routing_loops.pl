# When a change is seen (docs/directory.md), the minimal reproduction:
# node_for, logical_shard, partition_for, epoch and the guard, each called in
# a PL/pgSQL loop inside ONE transaction while another session commits a
# change (a move, a re-created map, a pin, a replicated owner switch), also
# under REPEATABLE READ. Every loop must see the change at its next call,
# within a second of the commit. Version 1.2 kept the map of the transaction's
# first call until the transaction ended: every loop ran to its limit with the
# old answer. Run once with the library preloaded (shared change counters) and
# once without (the per-backend fallback).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);
use lib 'lib';
use ShardingNode;

# A DO block that evaluates EXPR until its value differs from the first one
# (at most 600 times, 10 ms apart), then prints what it saw and when.
sub loop_sql
{
	my ($name, $expr) = @_;
	return qq{
DO \$do\$
DECLARE v0 text; v text; i int := 0;
BEGIN
  v0 := ($expr)::text;
  LOOP
    i := i + 1;
    v := ($expr)::text;
    EXIT WHEN v IS DISTINCT FROM v0 OR i >= 600;
    PERFORM pg_catalog.pg_sleep(0.01);
  END LOOP;
  RAISE NOTICE 'RESULT % % % % %', '$name', v0, v, i, extract(epoch FROM clock_timestamp());
END \$do\$;
};
}

# The guard's loop: an UPDATE of a row this node owns, until it is refused.
my $guard_loop = q{
DO $do$
DECLARE v0 text; v text; i int := 0;
BEGIN
  LOOP
    i := i + 1;
    BEGIN
      UPDATE docs SET v = docs.v + 1 WHERE k = 'kg';
      v := 'written';
    EXCEPTION WHEN object_not_in_prerequisite_state THEN
      v := 'refused';
    END;
    IF v0 IS NULL THEN v0 := v; END IF;
    EXIT WHEN v IS DISTINCT FROM v0 OR i >= 600;
    PERFORM pg_catalog.pg_sleep(0.01);
  END LOOP;
  RAISE NOTICE 'RESULT % % % % %', 'guard', v0, v, i, extract(epoch FROM clock_timestamp());
END $do$;
};

sub start_loop
{
	my ($node, $db, $sql) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-c', $sql ],
		'>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

sub run_case
{
	my ($preload) = @_;
	my $mode = $preload ? 'preloaded' : 'not preloaded';
	my $node = sharding_node($preload ? 'pre' : 'nopre', preload => $preload);
	$node->safe_psql('postgres', 'CREATE DATABASE g');
	$node->safe_psql('g', 'CREATE EXTENSION sharding');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_settings WHERE name = 'shared_preload_libraries' AND setting LIKE '%sharding%'}),
		$preload ? '1' : '0', "$mode: shared_preload_libraries as intended");

	# A key whose shard differs between 8 and 16 logical shards (for
	# logical_shard, whose change is a re-created map).
	my $key = $node->safe_psql('postgres', q{
		SELECT k FROM (SELECT 'k' || i AS k, i FROM generate_series(1, 100) i) s
		 WHERE sharding.shard_of(k, 8) <> sharding.shard_of(k, 16) ORDER BY i LIMIT 1});
	$node->safe_psql('postgres', qq{
		SELECT sharding.create_map('mn', 8, ARRAY['a', 'b']);
		SELECT sharding.create_map('ml', 8, ARRAY['a', 'b']);
		SELECT sharding.create_map('mp', 8, ARRAY['a', 'b']);
		SELECT sharding.create_map('me', 8, ARRAY['a', 'b']);});
	my $shard = $node->safe_psql('postgres', "SELECT sharding.logical_shard('mn', '$key')");
	my $owner = $node->safe_psql('postgres', "SELECT sharding.node_for('mn', '$key')");
	my $new16 = $node->safe_psql('postgres', "SELECT sharding.shard_of('$key'::text, 16)");

	# The guard: database g plays follower n1 (as attach_node leaves it).
	$node->safe_psql('g', q{
		SELECT sharding.create_map('mg', 4, ARRAY['n1', 'n2']);
		CREATE TABLE docs (k text PRIMARY KEY, v integer NOT NULL);
		SELECT sharding.distribute('docs', 'k', 'mg');
		UPDATE sharding.shards SET node = 'n1' WHERE map = 'mg' AND logical = sharding.logical_shard('mg', 'kg');
		INSERT INTO docs VALUES ('kg', 0);
		INSERT INTO sharding.local_node (node, coordinator_dsn, following) VALUES ('n1', 'dbname=nowhere', true);
		SELECT sharding._install_guards();});
	my $gshard = $node->safe_psql('g', "SELECT sharding.logical_shard('mg', 'kg')");

	my %loops = (
		node_for      => start_loop($node, 'postgres', loop_sql('node_for', "sharding.node_for('mn', '$key')")),
		logical_shard => start_loop($node, 'postgres', loop_sql('logical_shard', "sharding.logical_shard('ml', '$key')")),
		partition_for => start_loop($node, 'postgres', loop_sql('partition_for', "sharding.partition_for('mp', '$key')")),
		epoch         => start_loop($node, 'postgres', loop_sql('epoch', "sharding.epoch('me', $shard)")),
		guard         => start_loop($node, 'g', $guard_loop),
		# Under REPEATABLE READ the transaction snapshot is older than the
		# change: the caches read with the latest one.
		epoch_rr      => start_loop($node, 'postgres', 'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;'
			. loop_sql('epoch_rr', "sharding.epoch('me', $shard)") . 'COMMIT;'),
		node_for_rr   => start_loop($node, 'postgres', 'BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;'
			. loop_sql('node_for_rr', "sharding.node_for('me', '$key')") . 'COMMIT;'));
	sleep 1;    # every loop has made its first call
	my $other = $owner eq 'a' ? 'b' : 'a';
	my $committed = $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT sharding.move_shard('mn', $shard, 'zz');
		SELECT sharding.drop_map('ml');
		SELECT sharding.create_map('ml', 16, ARRAY['a', 'b']);
		SELECT sharding.pin('mp', '$key', 'dedicated');
		SELECT sharding.move_shard('me', $shard, '$other');
		COMMIT;
		SELECT extract(epoch FROM clock_timestamp());});
	$committed = (split /\n/, $committed)[-1];
	# A replicated owner switch, as logical-replication apply writes it.
	my $gcommitted = $node->safe_psql('g', qq{
		SET session_replication_role = replica;
		UPDATE sharding.shards SET node = 'n2', epoch = epoch + 1 WHERE map = 'mg' AND logical = $gshard;
		SELECT extract(epoch FROM clock_timestamp());});

	my %want = (
		node_for      => [ $owner, 'zz', $committed ],
		logical_shard => [ $shard, $new16, $committed ],
		partition_for => [ $shard, '8', $committed ],     # a pin-only node: partition logical_shards + 0
		epoch         => [ '1', '2', $committed ],
		epoch_rr      => [ '1', '2', $committed ],
		node_for_rr   => [ $owner, $other, $committed ],
		guard         => [ 'written', 'refused', $gcommitted ]);
	for my $name (sort keys %loops)
	{
		my $l = $loops{$name};
		$l->{h}->finish;
		my ($line) = ${ $l->{err} } =~ /RESULT (\S+ \S+ \S+ \S+ \S+)/;
		ok(defined $line, "$mode: $name loop finished") or diag(${ $l->{err} });
		next unless defined $line;
		my ($n, $v0, $v, $iterations, $seen) = split / /, $line;
		my ($start, $end, $at) = @{ $want{$name} };
		is("$v0 -> $v", "$start -> $end", "$mode: $name in a PL/pgSQL loop sees the committed change ($iterations calls)");
		cmp_ok($seen - $at, '<', 1.0, "$mode: $name saw it within a second of the commit");
		cmp_ok($iterations, '<', 600, "$mode: $name did not run to the loop's limit");
	}
	$node->stop;
}

run_case(1);
run_case(0);
done_testing();
