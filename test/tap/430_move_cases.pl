# Online moves (docs/moves.md: move_shard_online, isolate): the cases
# the other move tests lack. (Was test/multinode/move.sh.)
#
# Topology (JobsCluster.pm): instance `coord` holds the coordinator
# (database coord), instance `data` the data nodes n1, n2 and n3. Map `bank`
# has 8 logical shards over n1 and n2; n3 owns none (dedicated capacity for
# a whale). Two co-located distributed tables, accounts and events. Every
# data node follows the coordinator (attach_node), so guards refuse what a
# node does not own.
#
# 1. A move under load: four writers on the coordinator (JobsCluster's)
#    insert, update and delete rows of both tables through dblink on the
#    node that node_for names, retrying when refused (55000), and log every
#    operation that committed; 60% of them go to the tenants of the moving
#    shard. Meanwhile a shard of n1 moves to n2. Afterwards every node holds
#    exactly what the log implies, the source none of the shard's rows, the
#    epoch rose by one, and no replication object of the move is left.
# 2. A cancelled move (pg_cancel_backend while it copies) and a failure
#    injected at the cutover (the switch on the coordinator raises): nothing
#    changes, nothing is left, then a retry succeeds. Leftovers of crashed
#    moves (before and after the switch) are cleaned up or finished by the
#    next call, a same-owner call included.
# 3. isolate moves a whale's rows to n3.
# 4. Refusals: same owner, no DSN, a node that does not follow, bad input,
#    a source whose wal_level is not logical.
# 5. copy_shard skips a pinned bytea key where bytea_output = escape.
# 6. No dblink in any database: a shard still moves.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 51;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;
use JobsCluster;

my ($coord, $data) = jobs_cluster(rows => 20000);
# qn(DB, SQL, %opts): sharding_q on the instance that holds DB.
sub qn { my ($db, $sql, %o) = @_; return sharding_q(node_of_db($db), $db, $sql, %o); }
sub dsn_of { return sharding_dsn(node_of_db($_[0]), $_[0]); }

# ------------------------------------------------------------------ setup
is(qn('coord', 'SHOW wal_level') . ' ' . qn('n1', 'SHOW wal_level'), 'logical logical',
	'two PostgreSQL instances with wal_level = logical');
is(scalar(grep {
			qn($_, "SELECT (SELECT count(*) FROM pg_extension WHERE extname IN ('sharding', 'dblink'))
			    || '|' || (SELECT count(*) FROM pg_class WHERE relname IN ('accounts', 'events') AND relkind = 'r')") eq '2|2'
		} qw(coord n1 n2 n3)),
	4, 'coordinator and three data nodes with sharding, dblink and the two tables');
ok(followers_agree() && qn('coord', "SELECT string_agg(node, ',' ORDER BY node) FROM sharding.nodes") eq 'n1,n2,n3'
	  && qn('coord', "SELECT count(*) FROM sharding.distributed_tables WHERE map = 'bank'") eq '2',
	'map bank over n1 and n2, both tables distributed, n1 n2 n3 attached');

# A whale: 3,000 + 1,000 rows on the node node_for places them, logged as
# writer -1 (the writers never pick them: their rows are writer 0's).
my $wsrc = qn('coord', "SELECT sharding.node_for('bank', 'whale'::text)");
for my $t ([ 'accounts', 3000 ], [ 'events', 1000 ])
{
	my $gen = "SELECT 'whale'::text AS tenant, 100000 + i::bigint AS id, 'initial-' || (100000 + i) AS val FROM generate_series(1, $t->[1]) AS i";
	qn($wsrc, "INSERT INTO $t->[0] SELECT * FROM ($gen) g");
	qn('coord', "INSERT INTO oplog (writer, tbl, id, tenant, op, val) SELECT -1, '$t->[0]', id, tenant, 'insert', val FROM ($gen) g");
}
is(qn('n1', 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)')
	  + qn('n2', 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)'),
	44000, '44,000 rows loaded where node_for places them');

my $CLEAN = 'n1:0/0/0/0/0 n2:0/0/0/0/0 n3:0/0/0/0/0 coord:0';
sub checksums
{
	my ($db, $s) = @_;
	return qn($db, "SELECT (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $s, 'accounts'))
	    || ' ' || (SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $s, 'events'))");
}
sub owner { return qn('coord', "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $_[0]"); }

# ------------------------------------------------------------------ 1. move under load
my $S = qn('coord', "SELECT s.logical FROM sharding.shards s WHERE s.map = 'bank' AND s.node = 'n1'
                     AND s.logical <> sharding.logical_shard('bank', 'whale'::text) ORDER BY s.logical LIMIT 1");
my @hot = split /\n/, qn('coord', "SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) x
                                   WHERE sharding.logical_shard('bank', t) = $S");
my $HOT = '{' . join(',', @hot) . '}';
my $epoch0 = qn('coord', "SELECT sharding.epoch('bank', $S)");
my $in_s = "sharding.logical_shard('bank', tenant) = $S";
note("shard $S (tenants $HOT) holds " . (split /:/, digest('n1', $in_s))[0] . " rows on n1 at epoch $epoch0");

my $writers = start_writers(4, hot => \@hot);
usleep(1_500_000);
my $t0 = time;
my ($move_rc, $epoch1, $move_err) = $coord->psql('coord',
	"SET client_min_messages = debug1; SELECT sharding.move_shard_online('bank', $S, 'n2')");
my $move_ms = int((time - $t0) * 1000);
usleep(1_500_000);
is(stop_writers($writers), '', 'four writers ran to the end without error');
note($_) for map { s/^.*DEBUG:  /  /r } grep { /DEBUG:  move sharding_move/ } split /\n/, $move_err;
my ($frozen_at) = $move_err =~ /: frozen at (.*)$/m;
my ($thawed_at) = $move_err =~ /: destination follows at (.*)$/m;
my $window_ms = defined $frozen_at && defined $thawed_at
  ? qn('coord', "SELECT round(extract(epoch FROM '$thawed_at'::timestamptz - '$frozen_at'::timestamptz) * 1000)") : '?';
is($epoch1, $epoch0 + 1,
	"move_shard_online returned the epoch raised by exactly one (${move_ms} ms; writes refused for ${window_ms} ms)")
  or diag($move_err);
is(owner($S), "n2|" . ($epoch0 + 1), 'the coordinator names n2 as the owner at that epoch');
is(join(' ', map { qn($_, "SELECT node || '|' || epoch FROM sharding.shards WHERE map = 'bank' AND logical = $S") } qw(n1 n2 n3)),
	join(' ', ('n2|' . ($epoch0 + 1)) x 3), 'every follower shows the switch');
my $stats = qn('coord', "SELECT sum(committed) || '|' || sum(refused) || '|' || coalesce(sum(cardinality(anomalies)), 0) FROM writer_stats");
my ($before_n, $after_n) = (0, 0);
($before_n, $after_n) = split /\|/, qn('coord', "SELECT count(*) FILTER (WHERE at < '$frozen_at') || '|' || count(*) FILTER (WHERE at > '$thawed_at')
                                                 FROM oplog WHERE writer > 0 AND $in_s") if defined $thawed_at;
note("writers committed " . (split /\|/, $stats)[0] . " operations, $before_n on shard $S before the freeze and $after_n after the thaw; refusals retried: " . (split /\|/, $stats)[1]);
ok($before_n > 0 && $after_n > 0, "writers committed operations on the moving shard both before and after the cutover ($before_n|$after_n)");
is((split /\|/, $stats)[2] . qn('coord', "SELECT coalesce(' ' || string_agg(a, '; '), '') FROM writer_stats, unnest(anomalies) a"),
	'0', 'every update and delete found its row on the node node_for named (no lost row)');
is(digest('n2', $in_s), expected_digest($in_s),
	"the destination holds exactly what the log implies for shard $S (nothing lost, resurrected or stale)");
is(digest('n1', $in_s), '0:-', "the source holds none of shard $S\'s rows");
is(digest('n1', 'true'), expected_digest("sharding.node_for('bank', tenant) = 'n1'"), 'every other row is where the log says: n1');
is(digest('n2', 'true'), expected_digest("sharding.node_for('bank', tenant) = 'n2'"), 'every other row is where the log says: n2');
is(leftovers(), $CLEAN, 'no publication, subscription, slot, filter trigger, frozen shard or journal row is left');
is(sharding_q($coord, 'postgres', "SELECT string_agg(regexp_replace(slot_name, '^sharding_config_[0-9a-f]{6}_', 'sharding_config_<tag>_'), ',' ORDER BY slot_name) FROM pg_replication_slots") . '|'
	  . sharding_q($data, 'postgres', "SELECT coalesce(string_agg(slot_name, ','), '') FROM pg_replication_slots"),
	'sharding_config_<tag>_n1,sharding_config_<tag>_n2,sharding_config_<tag>_n3|',
	"only the configuration slots remain (all at the coordinator's instance)");

# ------------------------------------------------------------------ 2. cancel and failure
my $S2 = qn('coord', "SELECT s.logical FROM sharding.shards s WHERE s.map = 'bank' AND s.node = 'n1'
                      AND s.logical <> sharding.logical_shard('bank', 'whale'::text) ORDER BY s.logical LIMIT 1");
my $in_s2 = "sharding.logical_shard('bank', tenant) = $S2";
my $epoch2 = qn('coord', "SELECT sharding.epoch('bank', $S2)");
my $sum_before = checksums('n1', $S2);
# A session on the destination holds a lock that stops the copy's INSERT.
my $locker = sharding_start($data, 'n2', 'BEGIN; LOCK TABLE accounts IN SHARE MODE; SELECT pg_sleep(3); COMMIT;');
usleep(300_000);
my $mover = sharding_start($coord, 'coord', "SET application_name = 'mover'; SELECT sharding.move_shard_online('bank', $S2, 'n2')");
my $state_ms = sharding_wait($coord, 'coord', "SELECT state FROM sharding.moves WHERE map = 'bank' AND logical = $S2", 'copying', 20);
usleep(300_000);
qn('coord', "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'mover'");
my (undef, undef, $cancel_err) = sharding_finish($mover);
sharding_finish($locker);
like($cancel_err, qr/canceling statement due to user request/,
	"a move cancelled while it copies (journal reached 'copying' after " . ($state_ms // 'timeout') . " ms) fails with 57014");
is(owner($S2), "n1|$epoch2", 'after the cancel: owner and epoch unchanged');
is(checksums('n1', $S2), $sum_before, "after the cancel: the source's rows are unchanged (shard_checksum of both tables)");
is(digest('n2', $in_s2), '0:-', "after the cancel: the destination holds none of the shard's rows");
is(leftovers(), $CLEAN, 'after the cancel: nothing of the move is left on any node');
my $hot2 = qn('coord', "SELECT t FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) x
                        WHERE sharding.logical_shard('bank', t) = $S2 LIMIT 1");
is(qn('n1', "INSERT INTO accounts VALUES ('$hot2', 900001, 'after cancel') RETURNING 'inserted'"), 'inserted',
	'after the cancel: the source still accepts writes to the shard');
$sum_before = checksums('n1', $S2);

qn('coord', <<'SQL');
CREATE FUNCTION inject_failure() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'injected failure at the switch' USING ERRCODE = 'P0001';
END $$;
CREATE TRIGGER inject_failure BEFORE UPDATE ON sharding.shards FOR EACH ROW EXECUTE FUNCTION inject_failure();
SQL
my $fail_out = qn('coord', "SET client_min_messages = debug1; SELECT sharding.move_shard_online('bank', $S2, 'n2')", stderr => 1);
ok($fail_out =~ /ERROR:  injected failure at the switch/ && $fail_out =~ /: caught up at/,
	'a failure injected at the switch (after the freeze and the catch-up) fails the move') or diag($fail_out);
qn('coord', 'DROP TRIGGER inject_failure ON sharding.shards');
is(owner($S2), "n1|$epoch2", 'after the failure: owner and epoch unchanged');
is(checksums('n1', $S2) . ' ' . digest('n2', $in_s2), "$sum_before 0:-",
	"after the failure: the source's rows are unchanged and the destination holds none");
is(leftovers(), $CLEAN, 'after the failure: nothing of the move is left, the source is not frozen');
is(qn('n1', "INSERT INTO accounts VALUES ('$hot2', 900002, 'after failure') RETURNING 'inserted'"), 'inserted',
	'after the failure: the source still accepts writes to the shard');
$sum_before = checksums('n1', $S2);

is(qn('coord', "SELECT sharding.move_shard_online('bank', $S2, 'n2')"), $epoch2 + 1, 'the retry succeeds: epoch ' . ($epoch2 + 1));
is(checksums('n2', $S2), $sum_before, "after the retry: the destination's shard_checksum equals the source's before");
is(digest('n1', $in_s2) . ' ' . leftovers(), "0:- $CLEAN", 'after the retry: the source holds none of the shard, nothing is left');

# A crash of the coordinator mid-move leaves a journal row and the move's
# objects: simulated by a journal row in state 'copying' plus a publication
# and a slot at the source; the next call cleans them up first.
my $S3 = qn('coord', "SELECT s.logical FROM sharding.shards s WHERE s.map = 'bank' AND s.node = 'n1' ORDER BY s.logical LIMIT 1");
my $epoch3 = qn('coord', "SELECT sharding.epoch('bank', $S3)");
my $name3 = qn('coord', "SELECT sharding._move_name('bank', $S3)");
qn('n1', "CREATE PUBLICATION $name3 FOR TABLE accounts; SELECT pg_create_logical_replication_slot('$name3', 'pgoutput');
          SELECT sharding._freeze_shard('bank', $S3)");
# (The row names the move, as a crashed move's row does since 1.4.)
qn('coord', "INSERT INTO sharding.move_journal (map, logical, source, destination, phase, name) VALUES ('bank', $S3, 'n1', 'n2', 'copying', '$name3')");
is(qn('coord', "SELECT sharding.move_shard_online('bank', $S3, 'n1')") . ' ' . leftovers(), "$epoch3 $CLEAN",
	'a same-owner call returns the current epoch and cleans up the leftovers of a crashed move');

# The same after the switch: journal state 'cleanup', the old source n1
# still frozen and holding stale rows of shard $S (owned by n2 since test 1),
# its publication and slot still there. The next call finishes the move.
my $name1 = qn('coord', "SELECT sharding._move_name('bank', $S)");
my $n2_before = digest('n2', $in_s);
my $epoch_s = qn('coord', "SELECT sharding.epoch('bank', $S)");
qn('n1', "SET session_replication_role = replica;
          INSERT INTO accounts SELECT tenant, 50000000 + row_number() OVER (), 'stale' FROM (SELECT unnest('$HOT'::text[]) AS tenant) t, generate_series(1, 5);
          CREATE PUBLICATION $name1 FOR TABLE accounts; SELECT pg_create_logical_replication_slot('$name1', 'pgoutput');
          SELECT sharding._freeze_shard('bank', $S)");
# A crashed executor's row keeps its pid (execute records it when it
# starts): the pid of a backend that has ended. Its clean-up was not
# deferred (cleanup_deferred false: a deferred one, sharding.move_cleanup,
# the next call leaves to its cleaner for 10 s).
my $dead = qn('coord', 'SELECT pg_backend_pid()');
qn('coord', "INSERT INTO sharding.move_journal (map, logical, source, destination, phase, name, pid) VALUES ('bank', $S, 'n1', 'n2', 'cleanup', '$name1', $dead)");
is(qn('n1', "SELECT (SELECT count(*) FROM accounts WHERE $in_s) || '|' || (SELECT count(*) FROM sharding.frozen_shards)
             || '|' || (SELECT count(*) FROM pg_publication WHERE pubname = '$name1') || '|' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$name1')"),
	(@hot * 5) . '|1|1|1', 'leftovers of a switched move in place: stale rows, a frozen shard, publication and slot at n1');
is(qn('coord', "SELECT sharding.move_shard_online('bank', $S, 'n2')") . ' ' . digest('n1', $in_s) . ' ' . digest('n2', $in_s) . ' ' . leftovers(),
	"$epoch_s 0:- $n2_before $CLEAN",
	'a crashed move that had switched: the next call finishes it (stale rows at the old source deleted, nothing left)');

# ------------------------------------------------------------------ 3. isolate
my $whale_rows = "tenant = 'whale'";
my $whale_before = digest($wsrc, $whale_rows);
is(qn('coord', "SELECT sharding.isolate('bank', 'whale', 'n3')"), '4000',
	"isolate moves the whale's 4,000 rows from $wsrc to n3 and says so");
is(join(' ', map { qn($_, "SELECT sharding.node_for('bank', 'whale'::text)") } qw(coord n1 n2 n3)), 'n3 n3 n3 n3',
	'the whale is pinned to n3 on the coordinator and on every follower');
is(digest('n3', $whale_rows) . ' ' . digest($wsrc, $whale_rows), "$whale_before 0:-",
	"after isolate: n3 holds the whale's rows as $wsrc held them (same digest), $wsrc none of them");
is(qn('n3', 'SELECT (SELECT count(*) FROM accounts) + (SELECT count(*) FROM events)'), '4000', 'n3 holds nothing but the whale');
is(leftovers(), $CLEAN, 'after isolate: nothing is left');
my $stray = qn($wsrc, "INSERT INTO accounts VALUES ('whale', 990002, 'stray')", verbose => 1);
is(qn('n3', "INSERT INTO accounts VALUES ('whale', 990001, 'on n3') RETURNING 'inserted'") . '|'
	  . ($stray =~ /ERROR:\s+(55000)/ ? $1 : $stray),
	'inserted|55000', "n3 accepts the whale's writes, $wsrc refuses them (55000)");

# ------------------------------------------------------------------ 4. refusals
# sqlstate(SQL): the SQLSTATE the coordinator raises for SQL, or its output.
sub sqlstate
{
	my $out = qn('coord', $_[0], verbose => 1);
	return $out =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "ok:$out";
}
my $own = qn('coord', "SELECT node FROM sharding.shards WHERE map = 'bank' AND logical = 1");
my $epoch_1 = qn('coord', "SELECT epoch FROM sharding.shards WHERE map = 'bank' AND logical = 1");
is(qn('coord', "SELECT sharding.move_shard_online('bank', 1, '$own')"), $epoch_1,
	'a move to the current owner is a no-op returning the epoch');
is(sqlstate("SELECT sharding.move_shard_online('bank', 1, 'nowhere')"), '55000', 'a node without a DSN: 55000');
qn('coord', "SELECT sharding.add_node('n9', '" . sharding_dsn($coord, 'postgres') . "')");
is(sqlstate("SELECT sharding.move_shard_online('bank', 1, 'n9')"), '55000', 'a node that does not follow this coordinator: 55000');
is(join(' ', map { sqlstate($_) } "SELECT sharding.move_shard_online('nomap', 1, 'n2')",
		"SELECT sharding.move_shard_online('bank', 8, 'n2')", "SELECT sharding.move_shard_online('bank', 1, NULL)",
		"SELECT sharding.isolate('bank', NULL, 'n2')"),
	'42704 22023 22023 22023', 'unknown map 42704, bad shard 22023, NULL node 22023, NULL key 22023');
# A source whose wal_level is not logical: an instance of its own (i3),
# attached, owning an empty shard.
my $i3 = PostgreSQL::Test::Cluster->new('i3');
$i3->init(allows_streaming => 1);
$i3->append_conf('postgresql.conf', "wal_level = replica\nshared_preload_libraries = 'sharding'\nfsync = off\n");
$i3->start;
$i3->safe_psql('postgres', 'CREATE DATABASE n4');
$i3->safe_psql('n4', 'CREATE EXTENSION sharding; CREATE EXTENSION dblink;
    CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
    CREATE TABLE events (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
    CREATE INDEX ON accounts (tenant); CREATE INDEX ON events (tenant);
    CREATE UNIQUE INDEX accounts_identity ON accounts (id, tenant);
    ALTER TABLE accounts REPLICA IDENTITY USING INDEX accounts_identity;
    CREATE UNIQUE INDEX events_identity ON events (id, tenant);
    ALTER TABLE events REPLICA IDENTITY USING INDEX events_identity;');
qn('coord', "SELECT sharding.add_node('n4', '" . sharding_dsn($i3, 'n4') . "'); SELECT sharding.attach_node('n4');
             SELECT sharding._switch_owner('bank', 7, 'n4')");
my $epoch7 = qn('coord', "SELECT epoch FROM sharding.shards WHERE map = 'bank' AND logical = 7");
is(sqlstate("SELECT sharding.move_shard_online('bank', 7, 'n2')") . ' ' . owner(7), "55000 n4|$epoch7",
	'a source whose wal_level is not logical: 55000, and nothing changes');
is(leftovers(), $CLEAN, 'the refused calls changed nothing and left nothing');

# ------------------------------------------------------------------ 5. copy_shard (kept, inserts only)
# Pins hold a bytea key in hex; a source whose bytea_output is 'escape' must
# still see the pinned key as pinned.
qn($_, 'CREATE TABLE blobs (k bytea PRIMARY KEY, v text)') for qw(coord n1 n3);
qn('n1', "INSERT INTO blobs SELECT decode(lpad(to_hex(i), 4, '0'), 'hex'), 'b' || i FROM generate_series(1, 400) i;
          ALTER DATABASE n1 SET bytea_output = escape");
my $pinned_blob = qn('coord', "SELECT '\\x' || encode(k, 'hex') FROM (SELECT decode(lpad(to_hex(i), 4, '0'), 'hex') AS k
                               FROM generate_series(1, 400) i) x WHERE sharding.logical_shard('bank', k) = 0 LIMIT 1");
qn('coord', "SELECT sharding.pin('bank', '$pinned_blob', 'n3')");
my $in_shard0 = qn('n1', 'SELECT count(*) FROM blobs WHERE sharding.shard_of(k, 8) = 0');
# Since 1.4 copy_shard runs on the engine's own connections: no dblink at
# either end of the call.
qn($_, 'DROP EXTENSION IF EXISTS dblink') for qw(coord n3);
is(qn('coord', "SELECT sharding.copy_shard('bank', 0, 'blobs', 'k', '" . dsn_of('n1') . "', '" . dsn_of('n3') . "')") . '|'
	  . qn('n3', "SELECT count(*) FROM blobs WHERE '\\x' || encode(k, 'hex') = '$pinned_blob'"),
	($in_shard0 - 1) . '|0',
	'copy_shard skips a pinned bytea key even where bytea_output = escape (' . ($in_shard0 - 1) . " of $in_shard0 rows)");
is(qn('coord', "SELECT sharding.copy_shard('bank', 0, 'blobs', 'k', '" . dsn_of('n1') . "', '" . dsn_of('n3') . "')"), '0',
	'copy_shard repeated: rows already there are skipped (0 inserted)');
# A shard larger than libpq's buffers, toasted values: every row of the
# shard and only those, byte for byte.
qn($_, 'CREATE TABLE big (k bigint PRIMARY KEY, pad text)') for qw(coord n1 n3);
qn('n1', "INSERT INTO big SELECT i, repeat(md5(i::text), 1 + i % 40) FROM generate_series(1, 30000) i");
my $sum = "SELECT count(*) || ':' || coalesce(md5(string_agg(k || pad, ',' ORDER BY k)), '-') FROM big";
my $src = qn('n1', "$sum WHERE sharding.shard_of(k, 8) = 3");
my ($rows) = split /:/, $src;
is(qn('coord', "SELECT sharding.copy_shard('bank', 3, 'big', 'k', '" . dsn_of('n1') . "', '" . dsn_of('n3') . "')")
	. '|' . qn('n3', $sum), "$rows|$src", "copy_shard of $rows rows (about 1 MB and more): the shard's rows exactly");

# ------------------------------------------------------------------ 6. no dblink anywhere
# Since 1.4 nothing of the extension uses dblink: with it dropped from every
# database, a shard of n1 still moves online to n2.
qn($_, 'DROP EXTENSION IF EXISTS dblink CASCADE') for qw(coord n1 n2 n3);
is(join(' ', map { qn($_, "SELECT count(*) FROM pg_extension WHERE extname = 'dblink'") } qw(coord n1 n2 n3)), '0 0 0 0',
	'dblink is in no database');
my $L = qn('coord', "SELECT s.logical FROM sharding.shards s WHERE s.map = 'bank' AND s.node = 'n1' ORDER BY s.logical LIMIT 1");
my $before = checksums('n1', $L);
my ($epoch_before) = owner($L) =~ /\|(\d+)$/;
qn('coord', "SELECT sharding.move_shard_online('bank', $L, 'n2')");
is(owner($L) . ' ' . checksums('n2', $L) . ' ' . checksums('n1', $L), 'n2|' . ($epoch_before + 1) . " $before 0/0 0/0",
	"without dblink: shard $L moved from n1 to n2 online ($before), none of its rows left at n1");
is(leftovers(), $CLEAN, '... and nothing of the move is left');
