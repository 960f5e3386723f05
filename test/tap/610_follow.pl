# Followers and guarded writes (docs/nodes.md), on three live PostgreSQL
# instances.
#
# Topology: instance i1 holds the coordinator (database `coord`) and data
# node n1 (database `data`); i2 and i3 hold data nodes n2 and n3. Map `m`
# has 8 logical shards over n1..n3 and distributes table `docs` (text key);
# map `mi`, alike, distributes `items` (bigint key: a map's tables share one
# key type); `plain` is not distributed.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 57;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my %inst;
$inst{$_} = sharding_node($_, db => 'data', conf => 'wal_retrieve_retry_interval = 200ms') for qw(i1 i2 i3);
my %at = (n1 => 'i1', n2 => 'i2', n3 => 'i3');
my @nodes = qw(n1 n2 n3);
my %dsn = map { $_ => sharding_dsn($inst{ $at{$_} }, 'data') } @nodes;
my $i1 = $inst{i1};
# d(NODE, SQL): the node's database; c(SQL): the coordinator.
sub d { my ($n, $sql, %o) = @_; return sharding_q($inst{ $at{$n} }, 'data', $sql, %o); }
sub c { my ($sql, %o) = @_; return sharding_q($i1, 'coord', $sql, %o); }
# guard(SQL): the SQLSTATE of SQL on n2 ('' if it succeeds).
sub guard { my ($sql) = @_; return d('n2', "SELECT sqlstate_of(\$q\$$sql\$q\$)"); }
# copy_state(NODE, ROWS): the SQLSTATE of COPY docs FROM STDIN ('' if it passes).
sub copy_state
{
	my ($n, $rows) = @_;
	my $out = d($n, "COPY docs FROM STDIN;\n$rows\\.\n", verbose => 1);
	return $out =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : $out;
}
# wait_ms(NODE, SQL, EXPECTED, TIMEOUT): polls NODE's database, the ms waited or undef.
sub wait_ms { my ($n, $sql, $expected, $timeout) = @_; return sharding_wait($inst{ $at{$n} }, 'data', $sql, $expected, $timeout); }
sub lag_text { my ($ms) = @_; return defined $ms ? "${ms}ms" : "timeout (last: $ShardingNode::last_wait)"; }

is(join(' ', map { $inst{$_}->safe_psql('postgres', 'SHOW wal_level') } qw(i1 i2 i3)), 'logical logical logical',
	'three PostgreSQL instances with wal_level = logical');

my $node_schema = <<'SQL';
CREATE TABLE docs (k text PRIMARY KEY, v integer);
CREATE TABLE items (k bigint PRIMARY KEY, v integer);
CREATE TABLE spare (k text PRIMARY KEY);
CREATE TABLE plain (k text, v integer);
-- A writer function: guarded writes cover what functions write too.
CREATE FUNCTION put_doc(key text, val integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO docs VALUES (key, val);
END $$;
SELECT 'ready';
SQL
$node_schema = $SQLSTATE_OF . $node_schema;
$i1->safe_psql('postgres', 'CREATE DATABASE coord');
$i1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($i1, 'coord') . "'");
is(join(' ', (map { d($_, $node_schema) } @nodes), c("CREATE EXTENSION sharding; CREATE EXTENSION dblink;\n$node_schema")),
	'ready ready ready ready', 'coordinator and three data nodes created');

# n3 had a configuration of its own before it is attached: map m at a
# version above the coordinator's, which must never fall there.
d('n3', <<'SQL');
SELECT sharding.create_map('m', 2, ARRAY['n3']);
SELECT sharding.pin('m', 'k' || i, 'n3') FROM generate_series(1, 20) AS i;
SELECT sharding.create_map('local_only', 2, ARRAY['n3']);
SQL
my $n3_version_before = d('n3', "SELECT sharding.cluster_version('m')");

is( (split /\n/, c(<<"SQL"))[-1],
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}'),
       sharding.add_node('n3', '$dsn{n3}'), sharding.add_node('spare', 'host=127.0.0.1 port=1 dbname=none');
SELECT sharding.create_map('m', 8, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.create_map('mi', 8, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.distribute('docs', 'k', 'm');
SELECT sharding.distribute('items', 'k', 'mi');
SELECT 'configured';
SQL
	'configured', 'coordinator: nodes, map m, docs and items distributed');

# ---------------------------------------------------------------- attach
my $t0 = time;
my $attached = grep { c("SELECT sharding.attach_node('$_')") eq '' } @nodes;
my $attach_ms = int((time - $t0) * 1000);
is($attached, 3, "attach_node n1, n2, n3 (${attach_ms} ms for the three)");
my $digest = 'SELECT md5(string_agg(format($$%s/%s/%s/%s$$, map, logical, node, epoch), $$,$$ ORDER BY map, logical))
          || (SELECT count(*) FROM sharding.nodes) || (SELECT count(*) FROM sharding.distributed_tables)
          || (SELECT count(*) FROM sharding.pins) FROM sharding.shards';
my $home = c($digest);
for my $n (@nodes)
{
	is(d($n, $digest) . '|' . d($n, 'SELECT sharding.this_node()'), "$home|$n",
		"$n: a full copy of the coordinator's configuration, this_node() = $n");
}
is(d('n3', "SELECT count(*) FROM sharding.maps WHERE map = 'local_only'"), '0',
	"n3's own map local_only is gone (the coordinator's configuration replaced it)");
my $n3_version_after = d('n3', "SELECT sharding.cluster_version('m')");
cmp_ok($n3_version_after, '>=', $n3_version_before,
	"cluster_version('m') did not fall on n3 when it started following ($n3_version_before -> $n3_version_after)");
is(c('SELECT sharding.this_node()'), '', 'this_node() is NULL on the coordinator, which was never attached');
# One list of the configuration tables (sharding._config_tables): what the
# publication carries, what each node synchronised, what followers guard.
my $config_tables = c("SELECT array_to_string(array(SELECT t FROM unnest(sharding._config_tables()) t ORDER BY 1), ' ')");
is(c("SELECT string_agg(tablename, ' ' ORDER BY tablename) FROM pg_publication_tables
       WHERE pubname = 'sharding_config' AND schemaname = 'sharding'") . '|'
	  . d('n1', "SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
                  WHERE g.tgname = 'refuse_on_follower'"),
	"$config_tables|$config_tables",
	'publication sharding_config carries the tables of _config_tables(), and followers refuse writes to just those');
is(join(' ', map { d($_, "SELECT count(*) FILTER (WHERE r.srsubstate IN ('r', 's')) FROM pg_subscription_rel r
                            JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = 'sharding_config_$_'") } @nodes),
	join(' ', map { scalar(split / /, $config_tables) } @nodes),
	'each node synchronised every configuration table before attach_node returned');
is( c("SELECT sharding.attach_node('n2')") . '|'
	  . d('n2', "SELECT count(*) FROM pg_subscription WHERE subname = 'sharding_config_n2'") . '|'
	  . c("SELECT count(*) FROM pg_replication_slots WHERE slot_name = sharding._config_slot('n2')"),
	'|1|1', 'repeating attach_node is harmless (one subscription, one slot)');
is(c("SELECT sqlstate_of(\$\$SELECT sharding.attach_node('ghost')\$\$) || '|' || sqlstate_of(\$\$SELECT sharding.attach_node(NULL)\$\$)"),
	'55000|22023', 'attach_node of a node without DSN: 55000; NULL: 22023');
is(join(' ', map { "$_=" . sharding_guards($inst{ $at{$_} }, 'data') } @nodes), 'n1=2 n2=2 n3=2',
	'every data node guards docs and items, not plain');

# ---------------------------------------------------------------- following
# A change on the coordinator reaches every follower: the lag is the time
# until node_for (a pin) and epoch (a move) answer the new way there.
c("SELECT sharding.pin('m', 'probe', 'n3')");
my @lags = map { "$_=" . lag_text(wait_ms($_, "SELECT sharding.node_for('m', 'probe')", 'n3', 30)) } @nodes;
is(scalar(grep { /ms$/ } @lags), 3, "a pin on the coordinator is seen by node_for on every follower (lag: @lags)");
c("SELECT sharding._switch_owner('m', 0, 'n2')");
@lags = map {
	"$_=" . lag_text(wait_ms($_, "SELECT sharding.epoch('m', 0) || '/' || sharding.shards_of('m', 'n2')::text", '2/{0,3,4,5}', 30))
} @nodes;
is(scalar(grep { /ms$/ } @lags), 3, "a move on the coordinator is seen by epoch and shards_of on every follower (lag: @lags)");
my $version = c("SELECT sharding.cluster_version('m')");
is(join(' ', map { d($_, "SELECT sharding.cluster_version('m')") } @nodes), "$version $version $version",
	"cluster_version is the coordinator's on every follower");

# The same backend of a follower sees a replicated change at its next
# statement (its routing cache is invalidated by the apply).
my $key0 = c("SELECT k FROM (SELECT 'w' || i AS k FROM generate_series(1, 1000) AS i) AS t
               WHERE sharding.logical_shard('m', k) = 0 ORDER BY k LIMIT 1");
my $session = sharding_start($inst{i2}, 'data', <<"SQL");
SELECT 'before:' || sharding.node_for('m', '$key0');
SELECT pg_sleep(2);
SELECT 'after:' || sharding.node_for('m', '$key0');
SQL
usleep(500_000);
c("SELECT sharding._switch_owner('m', 0, 'n1')");
my (undef, $session_out) = sharding_finish($session);
is(join(' ', grep { /^(before|after):/ } split /\n/, $session_out), 'before:n2 after:n1',
	'a running session on n2 routes by the moved shard at its next statement');

# A node that is down while the configuration changes catches up on restart.
$inst{i3}->stop('fast');
c(<<'SQL');
SELECT sharding._switch_owner('m', 1, 'n3');
SELECT sharding.pin('m', 'while-down', 'n1');
SELECT sharding.unpin('m', 'probe');
SQL
$inst{i3}->start;
my $probe_now = c("SELECT sharding.node_for('m', 'probe')");
my $lag = wait_ms('n3',
	"SELECT sharding.epoch('m', 1) || '/' || sharding.node_for('m', 'while-down') || '/' || sharding.node_for('m', 'probe')",
	"2/n1/$probe_now", 60);
ok(defined $lag, 'n3, stopped during three changes, has all of them after its restart (' . lag_text($lag) . ' after start)');
is(d('n3', "SELECT sharding.cluster_version('m')"), c("SELECT sharding.cluster_version('m')"),
	"n3's cluster_version caught up too");

# ---------------------------------------------------------------- followers refuse changes
is( d(  'n2', <<'SQL'),
SELECT string_agg(s, ' ') FROM (VALUES
  (sqlstate_of($$SELECT sharding.create_map('x', 2, ARRAY['n2'])$$)),
  (sqlstate_of($$SELECT sharding.drop_map('m')$$)),
  (sqlstate_of($$SELECT sharding.pin('m', 'a', 'n2')$$)),
  (sqlstate_of($$SELECT sharding.unpin('m', 'while-down')$$)),
  (sqlstate_of($$SELECT sharding.move_shard('m', 2, 'n3')$$)),
  (sqlstate_of($$SELECT * FROM sharding.rebalance('m', ARRAY['n1', 'n2'])$$)),
  (sqlstate_of($$SELECT sharding.add_node('n9', 'dbname=x')$$)),
  (sqlstate_of($$SELECT sharding.drop_node('spare')$$)),
  (sqlstate_of($$SELECT sharding.distribute('spare', 'k', 'm')$$)),
  (sqlstate_of($$SELECT sharding.undistribute('docs')$$)),
  (sqlstate_of($$INSERT INTO sharding.maps VALUES ('y', 1)$$)),
  (sqlstate_of($$UPDATE sharding.shards SET epoch = epoch + 1$$)),
  (sqlstate_of($$DELETE FROM sharding.pins$$)),
  (sqlstate_of($$TRUNCATE sharding.map_versions CASCADE$$))) AS t(s)
SQL
	join(' ', ('55000') x 14),
	'a follower refuses create_map, drop_map, pin, unpin, move_shard, rebalance, add_node, drop_node, distribute, undistribute and direct writes (55000)');
my $home_now = c($digest);
my $hinted = d('n2', "SELECT sharding.pin('m', 'a', 'n2')", stderr => 1) =~ /HINT:\s+Make the change on the coordinator/ ? 1 : 0;
is("$hinted|" . d('n2', $digest), "1|$home_now", '... with a hint to change it on the coordinator, and nothing changed there');

# ---------------------------------------------------------------- guarded writes
# Keys by owner (as the coordinator routes them now), and the int8 keys.
sub keys_of
{
	my ($owner, $n) = @_;
	return split ' ', c("SELECT string_agg(k, ' ') FROM (SELECT k FROM (SELECT 'key-' || i AS k FROM generate_series(1, 400) AS i) AS t
                        WHERE sharding.node_for('m', k) = '$owner' ORDER BY k LIMIT $n) AS s");
}
my ($own1, $own2, $own3, $own4, $own5) = keys_of('n2', 5);
my ($foreign1, $foreign2) = keys_of('n1', 2);
my $int_own = c("SELECT min(i) FROM generate_series(1, 400) AS i WHERE sharding.node_for('mi', i::bigint) = 'n2'");
my $int_foreign = c("SELECT min(i) FROM generate_series(1, 400) AS i WHERE sharding.node_for('mi', i::bigint) = 'n3'");
# A row n2 does not own, as a faulty load might have left it (replica role
# writes past the guard, as replication apply does).
d('n2', "SET session_replication_role = replica; INSERT INTO docs VALUES ('$foreign2', 0)");

is(guard("INSERT INTO docs VALUES ('$foreign1', 1)"), '55000', 'n2 refuses INSERT of a key n1 owns (55000)');
is(guard("UPDATE docs SET v = 9 WHERE k = '$foreign2'"), '55000', 'n2 refuses UPDATE of a row whose key n1 owns (55000)');
is(guard("DELETE FROM docs WHERE k = '$foreign2'"), '55000', 'n2 refuses DELETE of a row whose key n1 owns (55000)');
is(copy_state('n2', "$own1\t1\n$foreign1\t1\n"), '55000', 'n2 refuses COPY of a key n1 owns (55000)');
is(guard("SELECT put_doc('$foreign1', 1)"), '55000', 'n2 refuses a write from inside a function (55000)');
is(guard("INSERT INTO docs VALUES ('$own1', 1)") . '|' . guard("UPDATE docs SET k = '$foreign1' WHERE k = '$own1'"),
	'|55000', "n2 refuses an UPDATE moving an owned key to n1's (55000)");
is(guard("INSERT INTO items VALUES ($int_foreign, 1)"), '55000', 'n2 refuses a bigint key n3 owns, on items (55000)');
like(d('n2', "INSERT INTO docs VALUES ('$foreign1', 1)"),
	qr/key "\Q$foreign1\E" of map "m" belongs to node "n1", not to this node "n2"/, 'the refusal names map, key and owner');
is( d(  'n2', "SELECT count(*) || '|' || min(v) FILTER (WHERE k = '$foreign2') || '|' || count(*) FILTER (WHERE k = '$foreign1') FROM docs")
	  . '|' . d('n2', 'SELECT count(*) FROM items'),
	'2|0|0|0', 'nothing of the refused writes reached docs or items on n2');
is( d(  'n2', <<"SQL"),
SELECT string_agg(s, ',') FROM (VALUES
  (sqlstate_of(\$\$INSERT INTO docs VALUES ('$own2', 1)\$\$)),
  (sqlstate_of(\$\$UPDATE docs SET v = 2 WHERE k = '$own2'\$\$)),
  (sqlstate_of(\$\$UPDATE docs SET k = '$own3' WHERE k = '$own2'\$\$)),
  (sqlstate_of(\$\$DELETE FROM docs WHERE k = '$own3'\$\$)),
  (sqlstate_of(\$\$SELECT put_doc('$own4', 4)\$\$)),
  (sqlstate_of(\$\$INSERT INTO items VALUES ($int_own, 1)\$\$)),
  (sqlstate_of(\$\$INSERT INTO plain VALUES ('$foreign1', 1)\$\$)),
  (sqlstate_of(\$\$UPDATE plain SET v = 2\$\$)),
  (sqlstate_of(\$\$DELETE FROM plain\$\$))) AS t(s)
SQL
	',,,,,,,,', 'owned keys pass: INSERT, UPDATE, key-changing UPDATE, DELETE, function; a bigint key; plain is unaffected');
is(copy_state('n2', "$own5\t5\n") . '|' . d('n2', "SELECT count(*) FROM docs WHERE k = '$own5'"), '|1',
	'COPY of owned keys passes');

# A pin sends a key elsewhere: n1 now owns own4 on every node.
c("SELECT sharding.pin('m', '$own4', 'n1')");
wait_ms('n2', "SELECT sharding.node_for('m', '$own4')", 'n1', 30);
wait_ms('n1', "SELECT sharding.node_for('m', '$own4')", 'n1', 30);
is(guard("UPDATE docs SET v = 5 WHERE k = '$own4'") . '|' . d('n1', "SELECT sqlstate_of(\$\$INSERT INTO docs VALUES ('$own4', 5)\$\$)"),
	'55000|', 'after the coordinator pins a key to n1, n2 refuses it and n1 takes it');

# A frozen shard refuses its owned keys too, on this node only, until thawed.
my $s5 = c("SELECT sharding.logical_shard('m', '$own5')");
my $frozen_key = c("SELECT k FROM (SELECT 'g' || i AS k FROM generate_series(1, 400) AS i) AS t
                     WHERE sharding.logical_shard('m', k) = $s5 AND sharding.node_for('m', k) = 'n2' LIMIT 1");
d('n2', "SELECT sharding._freeze_shard('m', $s5)");
is( join(' ',
		guard("INSERT INTO docs SELECT k, 1 FROM (SELECT 'f' || i AS k FROM generate_series(1, 400) AS i) AS t
               WHERE sharding.logical_shard('m', k) = $s5 AND sharding.node_for('m', k) = 'n2' LIMIT 1"),
		guard("UPDATE docs SET v = 6 WHERE k = '$own5'"),
		guard("DELETE FROM docs WHERE k = '$own5'"),
		copy_state('n2', "$frozen_key\t1\n"),
		guard("INSERT INTO plain VALUES ('$own5', 1)")),
	'55000 55000 55000 55000 ',
	"frozen shard $s5 on n2: INSERT, UPDATE, DELETE and COPY of its owned keys get 55000; plain is unaffected");
like(d('n2', "UPDATE docs SET v = 6 WHERE k = '$own5'"), qr/is in logical shard $s5, which is frozen on node "n2"/,
	'the frozen refusal says so');
is( d('n2', "SELECT sharding._thaw_shard('m', $s5)") . '|'
	  . guard("UPDATE docs SET v = 7 WHERE k = '$own5'") . '|'
	  . d('n2', "SELECT sharding._thaw_shard('m', $s5)"),
	't||f', '_thaw_shard: true, then writes pass again; false the second time');

# _freeze_shard waits for a guarded writer holding the shard's share lock.
my $holder = sharding_start($inst{i2}, 'data', <<"SQL");
BEGIN;
UPDATE docs SET v = 8 WHERE k = '$own5';
SELECT pg_sleep(1);
COMMIT;
SQL
wait_ms('n2', "SELECT count(*) FROM pg_stat_activity WHERE datname = 'data' AND wait_event = 'PgSleep'", '1', 5);
$t0 = time;
d('n2', "SELECT sharding._freeze_shard('m', $s5)");
my $waited = int((time - $t0) * 1000);
my ($holder_rc) = sharding_finish($holder);
is(($waited >= 400 ? 1 : 0) . "|$holder_rc|" . d('n2', "SELECT v FROM docs WHERE k = '$own5'"), '1|0|8',
	"_freeze_shard waited for the writer holding the share lock (${waited} ms), whose update committed");
d('n2', "SELECT sharding._thaw_shard('m', $s5)");

# ---------------------------------------------------------------- guards follow distribute
# A table distributed on the coordinator is guarded on a node where it
# exists; a distributed table created on the node later is guarded at once;
# undistributing removes the guard.
# (sharding.propagate_ddl = off: distribute leaves the nodes' tables to
# them, as before 1.4, where it creates them on the attached nodes lacking
# them; 650_ddl.pl tests that.)
d('n2', 'CREATE TABLE early (k text PRIMARY KEY)');
c("CREATE TABLE early (k text PRIMARY KEY); CREATE TABLE late (k uuid PRIMARY KEY);
   SELECT sharding.create_map('mu', 8, ARRAY['n1', 'n2', 'n3']);
   SET sharding.propagate_ddl = off;
   SELECT sharding.distribute('early', 'k', 'm'), sharding.distribute('late', 'k', 'mu')");
$lag = wait_ms('n2', "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'early'::regclass AND tgname = 'zz_sharding_guard'", '1', 30);
ok(defined $lag, 'distribute on the coordinator guards the table on the node (' . lag_text($lag) . ')');
wait_ms('n2', "SELECT count(*) FROM sharding.distributed_tables WHERE table_name = 'late'", '1', 30);
d('n2', 'CREATE TABLE late (k uuid PRIMARY KEY)');
my $uuid_foreign = c("SELECT u FROM (SELECT md5(i::text)::uuid AS u FROM generate_series(1, 100) AS i) AS t
                      WHERE sharding.node_for('mu', u) <> 'n2' LIMIT 1");
is(sharding_guards($inst{i2}, 'data', 'late') . '|' . guard("INSERT INTO late VALUES ('$uuid_foreign')"), '1|55000',
	'a distributed table created on the node afterwards is guarded at once (uuid key refused: 55000)');
c("SELECT sharding.undistribute('early')");
$lag = wait_ms('n2', "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'early'::regclass AND tgname = 'zz_sharding_guard'", '0', 30);
ok(defined $lag, "undistribute on the coordinator removes the node's guard (" . lag_text($lag) . ')');

# ---------------------------------------------------------------- attach refusals
$inst{i2}->safe_psql('postgres', 'CREATE DATABASE bare');
my $slots_before = c('SELECT count(*) FROM pg_replication_slots');
c(  "SELECT sharding.add_node('self', '" . sharding_dsn($i1, 'coord') . "');
     SELECT sharding.add_node('n2again', '$dsn{n2}');
     SELECT sharding.add_node('bare', '" . sharding_dsn($inst{i2}, 'bare') . "');");
is( c(  "SELECT sqlstate_of(\$\$SELECT sharding.attach_node('self')\$\$) || '|' || sqlstate_of(\$\$SELECT sharding.attach_node('n2again')\$\$)
              || '|' || sqlstate_of(\$\$SELECT sharding.attach_node('bare')\$\$)"),
	'55000|55000|55000',
	'attach_node refuses the coordinator itself, a database following as another node, one without the extension (55000)');
is( (split /\n/, c("BEGIN; INSERT INTO plain VALUES ('x', 1); SELECT sqlstate_of(\$\$SELECT sharding.attach_node('n2')\$\$); ROLLBACK"))[0],
	'25001', "attach_node in a transaction that has already written: 25001 (the node's slot would wait for it)");
is( c('SELECT count(*) FROM pg_replication_slots') . '|' . d('n2', 'SELECT node || $$|$$ || following FROM sharding.local_node'),
	"$slots_before|n2|true", '... leaving no slot behind, and n2 following as n2');

# ---------------------------------------------------------------- shard_checksum
# The same rows of one logical shard on n2 and n3 (copied past the guard, in
# another order) give the same checksum; one changed value changes it.
d('n2', "SET session_replication_role = replica;
         INSERT INTO docs SELECT k, length(k) FROM (SELECT 'sum-' || i AS k FROM generate_series(1, 300) AS i) AS t
          WHERE sharding.logical_shard('m', k) = $s5 ORDER BY k");
my $rows2 = d('n2', "SELECT string_agg(format('(%L,%s)', k, coalesce(v::text, 'NULL')), ',' ORDER BY k DESC) FROM docs
                      WHERE sharding.logical_shard('m', k) = $s5");
d('n3', "SET session_replication_role = replica; DELETE FROM docs; INSERT INTO docs VALUES $rows2");
my $checksum_sql = "SELECT rows || '/' || checksum FROM sharding.shard_checksum('m', $s5, 'docs')";
my $sum2 = d('n2', $checksum_sql);
is(d('n3', $checksum_sql), $sum2, "shard_checksum: the same rows on n2 and n3 give the same result ($sum2)");
d('n3', 'SET session_replication_role = replica; UPDATE docs SET v = v + 1 WHERE k = (SELECT min(k) FROM docs)');
my $sum3b = d('n3', $checksum_sql);
my ($rows_of) = map { (split m{/})[0] } $sum2;
is((split m{/}, $sum3b)[0] . '|' . ($sum3b ne $sum2 ? 1 : 0), "$rows_of|1",
	'one changed value changes the checksum, not the row count');
my $pinned_in_s5 = c("SELECT k FROM (SELECT 'pin-' || i AS k FROM generate_series(1, 400) AS i) AS t
                       WHERE sharding.logical_shard('m', k) = $s5 LIMIT 1");
c("SELECT sharding.pin('m', '$pinned_in_s5', 'n3')");
wait_ms('n2', "SELECT sharding.node_for('m', '$pinned_in_s5')", 'n3', 30);
d('n2', "SET session_replication_role = replica; INSERT INTO docs VALUES ('$pinned_in_s5', 1)");
is(d('n2', $checksum_sql), $sum2, "a pinned key's row is not part of its logical shard's checksum");

# ---------------------------------------------------------------- detach
my $v_before = d('n3', "SELECT sharding.cluster_version('m')");
is(c("SELECT sharding.detach_node('n3')"), '', "detach_node('n3')");
is( d('n3', 'SELECT count(*) FROM pg_subscription') . '|'
	  . c("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_config%n3'") . '|'
	  . d('n3', 'SELECT sharding.this_node()') . '|' . sharding_guards($inst{i3}, 'data'),
	'0|0|n3|0', "n3: no subscription; the coordinator: no slot for it; this_node() still n3; guards gone");
is( d('n3', "SELECT sqlstate_of(\$\$SELECT sharding.pin('m', 'mine', 'n3')\$\$)") . '|'
	  . d('n3', "SELECT sqlstate_of(\$\$SELECT sharding.create_map('n3map', 2, ARRAY['n3'])\$\$)") . '|'
	  . d('n3', "SELECT sqlstate_of(\$\$INSERT INTO docs VALUES ('$foreign1', 1)\$\$)") . '|' . $home_now,
	"|||$home_now", 'n3 keeps its copy, editable again (pin, create_map), and writes any key');
my $v_local = d('n3', "SELECT sharding.cluster_version('m')");
cmp_ok($v_local, '>', $v_before, "cluster_version on the detached n3 rises above the copied one ($v_before -> $v_local)");
c("SELECT sharding._switch_owner('m', 2, 'n3')");
usleep(500_000);
is(d('n3', "SELECT sharding.epoch('m', 2)"), '1', "a detached node no longer sees the coordinator's changes");
is(c("SELECT sharding.detach_node('n3')"), '', 'detach_node again is harmless');
c("SELECT sharding.attach_node('n3')");
is(d('n3', $digest) . '|' . d('n3', "SELECT count(*) FROM sharding.maps WHERE map = 'n3map'"), c($digest) . '|0',
	"attached again: n3 follows (coordinator's configuration, its own map gone)");
my $v_again = d('n3', "SELECT sharding.cluster_version('m')");
cmp_ok($v_again, '>=', $v_local, "cluster_version never fell on n3 across detach and attach ($v_before -> $v_local -> $v_again)");
is(c("SELECT count(*) || '|' || count(*) FILTER (WHERE active) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_config_%'"),
	'3|3', 'the coordinator holds one slot per follower, all active');
