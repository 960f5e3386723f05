# Keys stored out of line (review RB-8, issue 35): a text key of 2,100
# random characters (under the btree's 2,704-byte limit) with STORAGE
# EXTERNAL, beside a payload: the key lives in the TOAST table. An UPDATE
# that leaves such a key unchanged logs the new tuple with the key's
# on-disk TOAST pointer (no value), and the old tuple (the replica
# identity, WAL-logged because its value is stored externally) with the
# key inline. The decoder must take the key from the old tuple; reading
# the new tuple's pointer fails in decoding (no snapshot to read the
# TOAST table with), and so did the move.
#   1. a plain table docs (primary key k): during the move of a shard of
#      n1 (its copy held at the destination by an uncommitted row), every
#      row of the shard updated (payload), some deleted, some inserted;
#   2. the same on a table hash-partitioned by the key
#      (sharding.text_shard_ops, create_partitions(8)).
# The move succeeds, the destination holds exactly the source's rows and
# payloads as the writes left them, and the source none of the shard.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;
use MoveTest;

my ($coord, $a, $b) = move_cluster();
load_rows($coord, $a, $b, 20);
my $clean = 'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0';
my $tables = q{
	CREATE TABLE docs (k text NOT NULL PRIMARY KEY, id integer NOT NULL, payload text);
	ALTER TABLE docs ALTER COLUMN k SET STORAGE EXTERNAL;
	CREATE TABLE tparts (k text NOT NULL, id integer NOT NULL, payload text, PRIMARY KEY (k))
	    PARTITION BY HASH (k sharding.text_shard_ops);
	SELECT sharding.create_partitions('tparts', 8);
	ALTER TABLE tparts ALTER COLUMN k SET STORAGE EXTERNAL;
	CREATE FUNCTION rkey() RETURNS text LANGUAGE sql VOLATILE
	    AS $$ SELECT string_agg(chr(65 + floor(random() * 58)::int), '') FROM generate_series(1, 2100) $$;
};
$_->[0]->safe_psql($_->[1], $tables) for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
$coord->safe_psql('coord', "SELECT sharding.distribute('docs', 'k', 'bank'); SELECT sharding.distribute('tparts', 'k', 'bank')");
wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables", '3') for ([$a, 'n1'], [$b, 'n2']);
for my $t ('docs', 'tparts')
{
	for ([$a, 'n1', 0], [$b, 'n2', 10000])
	{
		my ($n, $db, $base) = @$_;
		$n->safe_psql($db, "INSERT INTO $t SELECT k, $base + i, 'p-' || i FROM (SELECT rkey() AS k, i FROM generate_series(1, 400) i) s"
			  . " WHERE sharding.node_for('bank', k) = '$db'");
	}
}
my $S = $coord->safe_psql('coord', "SELECT min(logical) FROM sharding.shards WHERE map = 'bank' AND node = 'n1'");
my $of_shard = "sharding.logical_shard('bank', k) = $S";
for my $t ('docs', 'tparts')
{
	# (Out of line: the TOAST tables hold at least 2,000 bytes per row.)
	is($a->safe_psql('n1', "SELECT (SELECT count(*) > 10 AND bool_and(length(k) = 2100) FROM $t WHERE $of_shard)"
		  . " AND (SELECT sum(pg_relation_size(c.reltoastrelid)) FROM pg_class c WHERE c.oid IN (SELECT '$t'::regclass UNION SELECT relid FROM pg_partition_tree('$t'))"
		  . " AND c.reltoastrelid <> 0) >= 2000 * (SELECT count(*) FROM $t)"),
		't', "$t: shard $S has rows at n1, each key of 2,100 characters stored out of line (in the TOAST table)");
}

# digest(node, db, table): rows/md5 of the shard's keys, ids and payloads.
sub digest
{
	my ($n, $db, $t) = @_;
	return $n->safe_psql($db, "SELECT count(*) || '/' || coalesce(md5(string_agg(md5(k) || ':' || id || ':' || payload, ',' ORDER BY k)), '')"
		  . " FROM $t WHERE $of_shard");
}

# The copy held at the destination by an uncommitted row of accounts.
my ($ht, $hid) = split /\|/, $a->safe_psql('n1',
	"SELECT tenant || '|' || id FROM accounts WHERE sharding.logical_shard('bank', tenant) = $S ORDER BY id DESC LIMIT 1");
my $hold = hold_row($b, 'n2', $ht, $hid);
my $log_at = -s $a->logfile;
# (At most 4 minutes: a move whose stream fails waits for its catch-up.)
my $mv = psql_bg($coord, 'coord', "SET statement_timeout = '240s'; SELECT sharding.move_shard_online('bank', $S, 'n2')");
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT sharding._move_pull(%' "
	  . "AND wait_event_type = 'Lock'", '1', 120), 'the copy waits for the held key (its slot exists)');
# The writes, at the source, after the slot, each its own transaction:
# payloads of every row of the shard (the key unchanged, out of line),
# deletes of some of them, new rows (their keys toasted in the same
# transaction), payloads again.
for my $t ('docs', 'tparts')
{
	$a->safe_psql('n1', "UPDATE $t SET payload = 'updated-' || id WHERE $of_shard");
	$a->safe_psql('n1', "DELETE FROM $t WHERE $of_shard AND id % 7 = 0");
	$a->safe_psql('n1', "INSERT INTO $t SELECT k, 50000 + i, 'new-' || i FROM (SELECT rkey() AS k, i FROM generate_series(1, 200) i) s"
		  . " WHERE $of_shard");
	$a->safe_psql('n1', "UPDATE $t SET payload = payload || '-again' WHERE $of_shard AND id % 3 = 0");
}
my %want = map { $_ => digest($a, 'n1', $_) } ('docs', 'tparts');
# The subscription held until VACUUM at the source has removed the deleted
# rows and their keys' TOAST chunks: the stream then decodes updates whose
# new tuples point to chunks no longer there (the slot keeps catalog rows,
# not a table's). Only the old tuple still has those keys.
my $subs = $b->background_psql('n2', on_error_stop => 1);
$subs->query_safe('BEGIN');
$subs->query_safe('LOCK TABLE pg_catalog.pg_subscription IN EXCLUSIVE MODE');
release_row($b, 'n2', $hold);
ok(wait_for_sql($b, 'n2', "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE SUBSCRIPTION%' AND wait_event_type = 'Lock'",
	'1', 120), 'the copy is done, the move\'s subscription waits (held by the test)');
my $chunks = sub {
	my $toast = $a->safe_psql('n1', "SELECT reltoastrelid::regclass FROM pg_class WHERE oid = 'docs'::regclass");
	return $a->safe_psql('n1', "SELECT count(DISTINCT chunk_id) FROM $toast");
};
my $before = $chunks->();
$a->safe_psql('n1', 'VACUUM docs; VACUUM tparts');
is($chunks->(), $a->safe_psql('n1', 'SELECT count(*) FROM docs'),
	"VACUUM at the source removed the deleted rows' keys from the TOAST table (values before: $before)");
$subs->query_safe('COMMIT');
$subs->quit;
$mv->{h}->finish;
is(${ $mv->{err} }, '', 'the move succeeds');
diag('the source logged: ' . join(' | ', grep { /ERROR/ } split /\n/, slurp_file($a->logfile, $log_at))) if ${ $mv->{err} } ne '';
is($coord->safe_psql('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = $S"), 'n2',
	"shard $S is n2's");
for my $t ('docs', 'tparts')
{
	is(digest($b, 'n2', $t), $want{$t}, "$t: n2 holds every row of the shard with the payload its writes left (rows/md5)");
	is($a->safe_psql('n1', "SELECT count(*) FROM $t WHERE $of_shard"), '0', "$t: n1 holds no row of the shard");
	is($b->safe_psql('n2', "SELECT count(*) FROM $t WHERE sharding.node_for('bank', k) <> 'n2'"), '0',
		"$t: n2 holds no row of a shard it does not own");
}
is(leftovers($coord, $a, $b), $clean, 'nothing of the move is left');

done_testing();
