# Pins at scale (docs/directory.md): a directory of 100,000 pins. pin_many
# loads it in one statement (and refuses bad input with 22023, pinning
# nothing); node_for and partition_for route pinned and unpinned keys exactly
# as the config tables say (checked against a join over every key); another
# backend's next call after one pin, unpin or move sees it without rebuilding
# the map (the pin is re-read, the map's cache context keeps its size) and
# without touching another map's cache; a backend's memory for the directory
# is bounded (pg_backend_memory_contexts). Preloaded, and once without
# preload.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use lib 'lib';
use ShardingNode;

my $pins = 100_000;

# A psql session kept open (its backend keeps its routing cache).
sub session
{
	my ($node) = @_;
	my %s = (in => '', out => '', err => '');
	$s{h} = IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
	return \%s;
}

sub query
{
	my ($s, $sql) = @_;
	my $marker = 'done-' . int(rand(1e9));
	$s->{out} = '';
	$s->{in} .= "$sql;\n\\echo $marker\n";
	$s->{h}->pump until $s->{out} =~ /$marker/ || $s->{err} =~ /ERROR/;
	die "query failed: $s->{err}" if $s->{err} =~ /ERROR/;
	(my $r = $s->{out}) =~ s/\n?$marker\n//;
	return $r;
}

sub run_case
{
	my ($preload) = @_;
	my $mode = $preload ? 'preloaded' : 'not preloaded';
	my $node = sharding_node($preload ? 'dir' : 'dir_nopre', preload => $preload);
	$node->safe_psql('postgres', q{
		SELECT sharding.create_map('dir', 4096, ARRAY['b1', 'b2', 'b3', 'b4']);
		SELECT sharding.create_map('other', 64, ARRAY['o1', 'o2']);});

	# Bad input: 22023 and nothing pinned.
	for my $bad ([ q{ARRAY['a', 'b'], ARRAY['x']}, 'arrays of different lengths' ],
		[ q{ARRAY['a', NULL], ARRAY['x', 'y']}, 'a NULL key' ],
		[ q{ARRAY['a', 'b'], ARRAY['x', '']}, 'an empty node' ],
		[ q{NULL, ARRAY['x']}, 'a NULL array' ])
	{
		my ($rc, $out, $err) = $node->psql('postgres', "SELECT sharding.pin_many('dir', $bad->[0])",
			extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
		like($err, qr/22023/, "$mode: pin_many with $bad->[1]: 22023");
	}
	my ($rc, $out, $err) = $node->psql('postgres', "SELECT sharding.pin_many('nope', ARRAY['a'], ARRAY['x'])",
		extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
	like($err, qr/42704/, "$mode: pin_many on an unknown map: 42704");
	# The references of sharding.pins, checked per statement: a direct write
	# naming an unknown map or node is refused as a foreign key refused it.
	for my $bad ([ q{INSERT INTO sharding.pins VALUES ('nope', 'k', 'b1')}, 'an unknown map' ],
		[ q{INSERT INTO sharding.pins VALUES ('dir', 'k', 'b1'), ('dir', 'k2', 'nonode')}, 'an unknown node' ])
	{
		my ($rc, $out, $err) = $node->psql('postgres', $bad->[0], extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
		like($err, qr/23503/, "$mode: a direct insert of a pin with $bad->[1]: 23503");
	}
	is($node->safe_psql('postgres', 'SELECT count(*) FROM sharding.pins'), '0', "$mode: nothing pinned by bad calls");

	# The directory: every tenth key of 1M pinned to one of 50 dedicated nodes.
	is($node->safe_psql('postgres', qq{
		SELECT sharding.pin_many('dir', array_agg('t' || i * 10 ORDER BY i), array_agg('w' || i % 50 ORDER BY i))
		  FROM generate_series(1, $pins) i}), $pins, "$mode: pin_many pinned $pins keys");
	is($node->safe_psql('postgres', q{SELECT sharding.pin_many('dir', ARRAY['t10', 't10'], ARRAY['w7', 'w1'])}),
		'1', "$mode: a key given twice counts once");
	is($node->safe_psql('postgres', q{SELECT node FROM sharding.pins WHERE map = 'dir' AND key = 't10'}),
		'w1', "$mode: the last node given for a key wins");
	($rc, $out, $err) = $node->psql('postgres', q{DELETE FROM sharding.nodes WHERE node = 'w1'},
		extra_params => [ '-v', 'VERBOSITY=sqlstate' ]);
	like($err, qr/23503/, "$mode: a node pins name cannot be deleted: 23503");

	my $r = session($node);
	my $o = session($node);
	# Every key of 0..1M routed by the cache against the tables.
	my $check = q{
		SELECT count(*) FILTER (WHERE sharding.node_for('dir', k) IS DISTINCT FROM coalesce(p.node, s.node)),
		       count(*) FILTER (WHERE p.node IS NOT NULL)
		  FROM (SELECT 't' || i AS k FROM generate_series(0, 1000000) i) x
		  LEFT JOIN sharding.pins p ON p.map = 'dir' AND p.key = x.k
		  JOIN sharding.shards s ON s.map = 'dir' AND s.logical = sharding.shard_of(x.k, 4096)};
	is(query($r, $check), "0|$pins", "$mode: node_for routes 1,000,001 keys ($pins pinned) as the tables say");
	# Pin-only nodes take partitions 4096, 4097, ... in byte order of their names.
	my $part = $node->safe_psql('postgres', q{SELECT 4096 + count(*) FROM (SELECT DISTINCT node FROM sharding.pins WHERE map = 'dir') d
		WHERE d.node COLLATE "C" < (SELECT node FROM sharding.pins WHERE map = 'dir' AND key = 't20')});
	is(query($r, q{SELECT sharding.partition_for('dir', 't20'), sharding.partition_for('dir', 't21') = sharding.logical_shard('dir', 't21')}),
		"$part|t", "$mode: partition_for of a pinned key is its node's partition, of an unpinned key its shard");
	query($r, q{SELECT sharding.node_for('other', 'x')});

	my $mem = q{SELECT coalesce(sum(total_bytes), 0) FROM pg_backend_memory_contexts WHERE name = 'sharding cache'};
	my $bytes = query($r, $mem);
	# 16-byte slots, at most 3/4 full, and a byte of filter per pin: 2.3 MB
	# for 100,000 pins (the table of 24-byte slots at most half full took
	# 6.5 MB).
	cmp_ok($bytes, '<', 4 * 1024 * 1024, "$mode: the routing cache of $pins pins takes less than 4 MB ($bytes bytes)");
	note("$mode: cache context with $pins pins: $bytes bytes");

	# One pin, one unpin, one move from another backend: seen at the next call.
	query($o, q{SELECT sharding.pin('dir', 't1', 'solo')});
	is(query($r, q{SELECT sharding.node_for('dir', 't1')}), 'solo', "$mode: another backend's pin is seen at the next call");
	query($o, q{SELECT sharding.unpin('dir', 't30')});
	is(query($r, q{SELECT sharding.node_for('dir', 't30') = (SELECT node FROM sharding.shards WHERE map = 'dir' AND logical = sharding.shard_of('t30', 4096))}),
		't', "$mode: another backend's unpin is seen at the next call");
	my $l = query($r, q{SELECT sharding.logical_shard('dir', 't31')});
	query($o, qq{SELECT sharding.move_shard('dir', $l, 'moved')});
	is(query($r, q{SELECT sharding.node_for('dir', 't31'), sharding.node_for('dir', 't40')}),
		'moved|w4', "$mode: a move is seen at the next call, pins stay");
	is(query($r, $check), '0|' . ($pins), "$mode: after the changes every key still routes as the tables say");
	is(query($r, q{SELECT count(*) FROM sharding.pins WHERE map = 'dir'}), $pins, "$mode: (one pin added, one removed)");

	# Own changes: seen by the next statement, gone after a rollback (also
	# of a subtransaction).
	is(query($r, q{BEGIN; SELECT sharding.pin('dir', 't50', 'mine'); SELECT sharding.node_for('dir', 't50')}) =~ s/^\n*//r,
		'mine', "$mode: a backend's own pin is seen by its next statement");
	is(query($r, q{ROLLBACK; SELECT sharding.node_for('dir', 't50')}), 'w5', "$mode: and is gone after ROLLBACK");
	is(query($r, q{BEGIN; SAVEPOINT s; SELECT sharding.unpin('dir', 't60'); ROLLBACK TO s; SELECT sharding.node_for('dir', 't60'); COMMIT}) =~ s/^t\n//r,
		'w6', "$mode: an unpin rolled back to a savepoint is gone");
	# Many small changes from another backend, checked every 100.
	for my $round (1 .. 3)
	{
		query($o, qq{SELECT count(*) FROM (SELECT CASE WHEN i % 3 = 0 THEN sharding.unpin('dir', 't' || (i * 70 + $round))::text
			ELSE (sharding.pin('dir', 't' || (i * 70 + $round), 'r' || (i % 7)))::text END FROM generate_series(1, 100) i) x});
		my ($bad) = split /\|/, query($r, $check);
		is($bad, '0', "$mode: after 100 more pins and unpins by another backend (round $round) every key routes as the tables say");
	}
	my $after = query($r, $mem);
	cmp_ok($after, '<=', $bytes * 1.5, "$mode: the cache did not grow past half again ($after bytes)");

	if ($preload)
	{
		# Per map: a change of 'other' does not touch 'dir', and one pin by
		# another backend refreshes 'dir' in place instead of rebuilding its
		# 100,000 pins (the counters of sharding._routing_cache_counts:
		# {builds, refreshes}; counted, not timed, so a loaded machine
		# cannot fail it).
		my $cc = q{SELECT array_to_string(sharding._routing_cache_counts(), '|')};
		query($r, q{SELECT sharding.node_for('dir', 't1')});
		my ($mb0, $mf0) = split /\|/, query($r, $cc);
		query($o, q{SELECT sharding.move_shard('other', 1, 'o2')});
		query($r, q{SELECT sharding.node_for('dir', 't1'), sharding.node_for('other', 't1')});
		my ($mb1, $mf1) = split /\|/, query($r, $cc);
		is($mb1, $mb0,
			"$mode: after a move in another map, routing 'dir' and 'other' rebuilt neither ('other' refreshed in place: builds $mb0 -> $mb1, refreshes $mf0 -> $mf1)");
		query($o, q{SELECT sharding.pin('dir', 't2', 'solo2')});
		is(query($r, q{SELECT sharding.node_for('dir', 't2')}), 'solo2', "$mode: another backend's pin is seen by the next node_for");
		my ($pb1, $pf1) = split /\|/, query($r, $cc);
		ok($pb1 == $mb1 && $pf1 > $mf1,
			"$mode: after one pin by another backend, 'dir' was refreshed in place, not rebuilt (builds $mb1 -> $pb1, refreshes $mf1 -> $pf1)");

		# A transaction publishes the pin keys it logged itself, from its
		# first noted change on, also when that change was of a map's row
		# (create_map here): after 1,100 pins by one backend (more than the
		# 1,024 keys its own log holds), its next transaction that creates a
		# map and pins one key makes another backend re-read that key, not
		# rebuild the map (the counters of sharding._routing_cache_counts:
		# {builds, refreshes}). Before the fix such a transaction published
		# every key the backend had ever logged, and past 1,024 "every pin".
		query($o, q{DO $$ BEGIN FOR i IN 1 .. 1100 LOOP PERFORM sharding.pin('dir', 'many' || i, 'm' || i % 5); COMMIT; END LOOP; END $$});
		query($r, q{SELECT sharding.node_for('dir', 'many1')});
		my $counts = q{SELECT array_to_string(sharding._routing_cache_counts(), '|')};
		my ($b0, $f0) = split /\|/, query($r, $counts);
		query($o, q{BEGIN; SELECT sharding.create_map('side', 8, ARRAY['s1']); SELECT sharding.pin('dir', 'many1', 'again'); COMMIT});
		is(query($r, q{SELECT sharding.node_for('dir', 'many1')}), 'again',
			"$mode: after 1,100 pins by one backend, its create_map and pin in one transaction are seen by another");
		my ($b1, $f1) = split /\|/, query($r, $counts);
		is($b1 - $b0, 0, "$mode: ... which did not rebuild the map (builds $b0 -> $b1)");
		cmp_ok($f1 - $f0, '>=', 1, "$mode: ... but refreshed it in place (refreshes $f0 -> $f1)");
	}
	# Keys longer than the 12 bytes a slot holds: compared in the table's
	# string of long keys. 2,000 keys, every other one pinned.
	$node->safe_psql('postgres', q{
		SELECT sharding.pin_many('dir', array_agg('a-much-longer-tenant-key-' || i), array_agg('long' || i % 7))
		  FROM generate_series(0, 1999, 2) i});
	is(query($r, q{
		SELECT count(*) FILTER (WHERE sharding.node_for('dir', k) IS DISTINCT FROM coalesce(p.node, s.node)),
		       count(*) FILTER (WHERE p.node IS NOT NULL)
		  FROM (SELECT 'a-much-longer-tenant-key-' || i AS k FROM generate_series(0, 1999) i) x
		  LEFT JOIN sharding.pins p ON p.map = 'dir' AND p.key = x.k
		  JOIN sharding.shards s ON s.map = 'dir' AND s.logical = sharding.shard_of(x.k, 4096)}), '0|1000',
		"$mode: 2,000 keys of 26-29 bytes (1,000 pinned) route as the tables say");

	# The pins of a node are found through pins_node, not by reading every
	# pin: add_node and drop_node of an unused node, drop_node refused for a node pins
	# name (55000), a delete of such a node refused (23503); the scans of
	# sharding.pins are counted by the transaction that ran them.
	$node->safe_psql('postgres', q{ANALYZE sharding.pins});
	my @by_node = split /\n/, $node->safe_psql('postgres', q{
		BEGIN;
		CREATE TEMP TABLE outcome (what text);
		SELECT sharding.add_node('idle', 'dbname=nowhere');
		SELECT sharding.drop_node('idle');
		DO $$ BEGIN PERFORM sharding.drop_node('w3'); INSERT INTO outcome VALUES ('drop_node: done');
		   EXCEPTION WHEN object_not_in_prerequisite_state THEN INSERT INTO outcome VALUES ('drop_node: 55000'); END $$;
		DO $$ BEGIN DELETE FROM sharding.nodes WHERE node = 'w4'; INSERT INTO outcome VALUES ('delete: done');
		   EXCEPTION WHEN foreign_key_violation THEN INSERT INTO outcome VALUES ('delete: 23503'); END $$;
		SELECT string_agg(what, ', ' ORDER BY what) FROM outcome;
		SELECT (SELECT count(*) FROM sharding.nodes WHERE node IN ('idle', 'w3', 'w4')) || '|' || seq_scan || '|' || idx_scan
		  FROM pg_stat_xact_user_tables WHERE schemaname = 'sharding' AND relname = 'pins';
		COMMIT;});
	is($by_node[-2], 'delete: 23503, drop_node: 55000', "$mode: drop_node and a delete of a node pins name are refused");
	my ($left, $seq, $idx) = split /\|/, $by_node[-1];
	is("$left|$seq", '2|0', "$mode: ... the unused node is gone, and no sequential scan of sharding.pins was needed");
	cmp_ok($idx, '>=', 4, "$mode: ... the pins of the nodes were looked up in an index ($idx index scans)");

	$r->{in} .= "\\q\n";
	$r->{h}->finish;
	$o->{in} .= "\\q\n";
	$o->{h}->finish;
	$node->stop;
}

run_case(1);
run_case(0);
done_testing();
