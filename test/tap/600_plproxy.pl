# PL/Proxy across live nodes (docs/nodes.md): the shard map drives PL/Proxy
# across four PostgreSQL instances, and every data node follows the map's
# home through logical replication.
#
# Topology. Nodes n1..n4, each with a database `data` holding `documents`;
# n1..n3 own the 12 logical shards of map `docs` (4 each), n4 owns none and
# holds a pinned whale workspace. The database `proxy` on n1 is the
# coordinator: create_map, add_node, pin, distribute and move_shard happen
# there, and PL/Proxy routes from there with RUN ON sharding.partition_for.
#
# How the map reaches the data nodes: attach_node on the coordinator makes
# each `data` database follow it, so every later change reaches every node
# by itself. Each node knows its own name (this_node()) and guards the
# distributed table `documents`: a write of a workspace the node does not
# own is refused (55000), so the data-node writer (insert_document) names no
# node. 610_follow.pl proves the following and the guards in detail; this
# test proves PL/Proxy on top, and a shard moved by hand under writes.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 36;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

# fill(TEMPLATE, NAME => VALUE, ...): TEMPLATE with every __NAME__ replaced.
sub fill
{
	my ($text, %v) = @_;
	$text =~ s/__(\w+)__/exists $v{$1} ? $v{$1} : die "no value for __$1__"/ge;
	return $text;
}

my @names = qw(n1 n2 n3 n4);
my %node;
$node{$_} = sharding_node($_, db => 'data',
	conf => "max_sync_workers_per_subscription = 4\nwal_retrieve_retry_interval = 200ms")
  for @names;
my %dsn = map { $_ => sharding_dsn($node{$_}, 'data') } @names;
my $n1 = $node{n1};
# d(NODE, SQL): on a data node; p(SQL): on the coordinator (proxy).
sub d { my ($n, $sql, %o) = @_; return sharding_q($node{$n}, 'data', $sql, %o); }
sub p { my ($sql, %o) = @_; return sharding_q($n1, 'proxy', $sql, %o); }
# per_node(SQL): "n1=... n2=... n3=... n4=..." of SQL on every data node.
sub per_node { my ($sql) = @_; return join ' ', map { "$_=" . d($_, $sql) } @names; }

is(join(' ', map { $node{$_}->safe_psql('postgres', 'SHOW wal_level') } @names),
	'logical logical logical logical', 'four PostgreSQL instances with wal_level = logical');

# ---------------------------------------------------------------- data nodes
my $data_node_sql = <<'SQL';
CREATE TABLE documents (workspace_id text NOT NULL, id bigint PRIMARY KEY, body text);
ALTER TABLE documents REPLICA IDENTITY FULL;
CREATE INDEX ON documents (workspace_id);
-- The data node's writer. No node name in it: the guard on documents
-- refuses (55000) a workspace this node does not own now, and makes a move
-- of its shard wait for the writer.
CREATE FUNCTION insert_document(workspace_id text, id bigint, body text) RETURNS void
    LANGUAGE sql AS $$ INSERT INTO documents VALUES (workspace_id, id, body) $$;
CREATE FUNCTION get_documents(workspace_id text) RETURNS TABLE(id bigint, body text)
    LANGUAGE sql STABLE AS $$
    SELECT d.id, d.body FROM documents AS d WHERE d.workspace_id = $1 ORDER BY d.id
$$;
CREATE FUNCTION count_all() RETURNS bigint LANGUAGE sql STABLE AS $$ SELECT count(*) FROM documents $$;
-- Which connection string the proxy used to reach us.
CREATE FUNCTION remote_application_name(workspace_id text) RETURNS text
    LANGUAGE sql STABLE AS $$ SELECT current_setting('application_name') $$;
SELECT 'ready';
SQL
$data_node_sql = $SQLSTATE_OF . $data_node_sql;
is(join(' ', map { d($_, $data_node_sql) } @names), 'ready ready ready ready',
	'sharding, dblink and documents on every data node');

# ---------------------------------------------------------------- the proxy
$n1->safe_psql('postgres', 'CREATE DATABASE proxy');
# The coordinator's own DSN, which the data nodes' subscriptions use.
$n1->safe_psql('postgres',
	"ALTER DATABASE proxy SET sharding.coordinator_dsn = '" . sharding_dsn($n1, 'proxy') . "'");
my $proxy_sql = fill(<<'SQL', N1 => $dsn{n1}, N2 => $dsn{n2}, N3 => $dsn{n3}, N4 => $dsn{n4});
CREATE EXTENSION plproxy;
CREATE EXTENSION sharding;
CREATE EXTENSION dblink;
SELECT sharding.add_node('n1', '__N1__'), sharding.add_node('n2', '__N2__'),
       sharding.add_node('n3', '__N3__'), sharding.add_node('n4', '__N4__');
SELECT sharding.create_map('docs', 12, ARRAY['n1', 'n2', 'n3']);
SELECT sharding.pin('docs', 'whale', 'n4');
SELECT sharding.plproxy_install();
-- The table's definition, to distribute it (its rows live on the nodes).
CREATE TABLE documents (workspace_id text NOT NULL, id bigint PRIMARY KEY, body text);
ALTER TABLE documents REPLICA IDENTITY FULL;
SELECT sharding.distribute('documents', 'workspace_id', 'docs');

CREATE FUNCTION insert_document(workspace_id text, id bigint, body text) RETURNS void
    LANGUAGE plproxy AS $$
    CLUSTER 'docs';
    RUN ON sharding.partition_for('docs', workspace_id);
$$;
CREATE FUNCTION get_documents(workspace_id text) RETURNS TABLE(id bigint, body text)
    LANGUAGE plproxy AS $$
    CLUSTER 'docs';
    RUN ON sharding.partition_for('docs', workspace_id);
$$;
CREATE FUNCTION count_all() RETURNS SETOF bigint
    LANGUAGE plproxy AS $$
    CLUSTER 'docs';
    RUN ON ALL;
$$;
CREATE FUNCTION remote_application_name(workspace_id text) RETURNS text
    LANGUAGE plproxy AS $$
    CLUSTER 'docs';
    RUN ON sharding.partition_for('docs', workspace_id);
$$;

-- A client that keeps writing while a shard moves: one backend, one commit
-- per document; a write refused by a fence (55000) is retried, and the
-- retry goes wherever the proxy routes by then.
CREATE PROCEDURE write_docs(first_id bigint, n integer, workspaces text[], INOUT retries integer DEFAULT 0)
    LANGUAGE plpgsql AS $$
DECLARE
    done boolean;
BEGIN
    FOR i IN 0 .. n - 1 LOOP
        LOOP
            BEGIN
                PERFORM insert_document(workspaces[1 + i % cardinality(workspaces)], first_id + i, 'concurrent');
                done := true;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                done := false;
            END;
            COMMIT;
            EXIT WHEN done;
            retries := retries + 1;
            IF retries > 3000 THEN
                RAISE EXCEPTION 'gave up after % retries', retries;
            END IF;
            PERFORM pg_sleep(0.005);
        END LOOP;
        PERFORM pg_sleep(0.003);
    END LOOP;
END $$;
SELECT 'ready';
SQL
my ($rc, $out, $err) = $n1->psql('proxy', $proxy_sql);
is($rc, 0, 'proxy database: map docs, node DSNs, whale pin, plproxy_install, PL/Proxy functions')
  or diag($err);
BAIL_OUT('proxy set-up failed') if $rc;

# Every data node follows the coordinator.
is(join(' ', map { (split /\n/, p("SELECT sharding.attach_node('$_'); SELECT 'attached'"))[-1] } @names), 'attached attached attached attached',
	'attach_node: the four data nodes follow the coordinator');
my $map_digest = 'SELECT md5(string_agg(format($$%s/%s/%s/%s$$, map, logical, node, epoch), $$,$$ ORDER BY map, logical)) FROM sharding.shards';
my $home_digest = p($map_digest);
is(join(' ', map { d($_, $map_digest) . '|' . d($_, 'SELECT sharding.this_node()') } @names),
	join(' ', map { "$home_digest|$_" } @names),
	"every data node has the coordinator's map and knows its own name (this_node)");
is(join(' ', map { "$_=" . sharding_guards($node{$_}, 'data', 'documents') } @names),
	'n1=1 n2=1 n3=1 n4=1', 'every data node guards documents');
is( p(  "SELECT count(*), (array_agg(p))[1], (array_agg(p))[13], sharding.partition_for('docs', 'whale')
           FROM plproxy.get_cluster_partitions('docs') AS p"),
	"13|$dsn{n1}|$dsn{n4}|12",
	'13 PL/Proxy partitions: 12 logical shards, then the pin-only node n4');

# ---------------------------------------------------------------- 10,000 documents
my $ws_expr = q{'ws-' || lpad((i % 200)::text, 3, '0')};
is( p(  fill(<<'SQL', WS => $ws_expr)),
DO $$
BEGIN
    FOR i IN 1 .. 10000 LOOP
        PERFORM insert_document(__WS__, i, 'document ' || i);
    END LOOP;
    FOR i IN 20001 .. 20300 LOOP
        PERFORM insert_document('whale', i, 'whale document ' || i);
    END LOOP;
END $$;
SQL
	'', '10,000 documents over 200 workspaces and 300 whale documents inserted through the proxy');

my $expected_counts = p(
	"SELECT string_agg(node || '=' || c, ' ' ORDER BY node)
       FROM (SELECT sharding.node_for('docs', ws) AS node, count(*) AS c
               FROM (SELECT $ws_expr FROM generate_series(1, 10000) AS i
                     UNION ALL SELECT 'whale' FROM generate_series(1, 300)) AS t(ws)
              GROUP BY 1) AS per_node");
is(per_node('SELECT count(*) FROM documents'), $expected_counts,
	'each instance holds exactly the rows node_for sends it');
my $misplaced_sql = "SELECT count(*) FROM documents WHERE sharding.node_for('docs', workspace_id) <> sharding.this_node()";
is(per_node($misplaced_sql), 'n1=0 n2=0 n3=0 n4=0', 'no row lives on an instance node_for does not name');
is( p(  "SELECT count(*), count(DISTINCT d.id), bool_and(d.id % 200 = w)
           FROM generate_series(0, 199) AS w,
                LATERAL get_documents('ws-' || lpad(w::text, 3, '0')) AS d"),
	'10000|10000|t', 'get_documents finds every document of every workspace');
is(p('SELECT count(*), sum(c) FROM count_all() AS c'), '4|10300',
	'count_all runs once per instance (RUN ON ALL) and sums to 10,300');

# ---------------------------------------------------------------- the whale
is(per_node("SELECT count(*) FROM documents WHERE workspace_id = 'whale'"), 'n1=0 n2=0 n3=0 n4=300',
	'the pinned whale lands only on n4, which owns no logical shard');
is(d('n4', 'SELECT count(*) FROM documents') . '|' . p("SELECT count(*) FROM get_documents('whale')"),
	'300|300', 'n4 holds nothing but the whale, and get_documents finds all of it');

# A new DSN reaches a running proxy session on its next call: the same
# backend asks n4 which application_name it connected with, before and after
# add_node changes n4's connection string.
is( p(  "SELECT '[' || remote_application_name('whale') || ']';
         SELECT sharding.add_node('n4', '$dsn{n4} application_name=relocated');
         SELECT '[' || remote_application_name('whale') || ']';"),
	"[]\n\n[relocated]", "add_node's new DSN for n4 is used by a running proxy session on its next call");

# ---------------------------------------------------------------- moving shard 0 (n1 -> n2) under writes
my $shard = 0;
my $ws_list = p("SELECT string_agg(ws, ',' ORDER BY ws) FROM (SELECT DISTINCT $ws_expr AS ws FROM generate_series(0, 199) AS i) AS t
                  WHERE sharding.logical_shard('docs', ws) = $shard");
my ($first_ws) = split /,/, $ws_list;
is(p("SELECT node, epoch FROM sharding.shards WHERE map = 'docs' AND logical = $shard"), 'n1|1',
	"shard $shard is owned by n1 at epoch 1");
my $before_shard = d('n1', "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $shard");

# The writer: 800 documents into shard 0's workspaces through one proxy
# backend, then (same backend, after the switch) one more.
my $writer = sharding_start($n1, 'proxy', <<"SQL");
CALL write_docs(30001, 800, string_to_array('$ws_list', ','));
DO \$\$
BEGIN
    FOR i IN 1 .. 6000 LOOP
        EXIT WHEN (SELECT node FROM sharding.shards WHERE map = 'docs' AND logical = $shard) = 'n2';
        PERFORM pg_sleep(0.01);
    END LOOP;
END \$\$;
SELECT insert_document('$first_ws', 39999, 'after the switch');
SQL
usleep(300_000);

# A writer in flight on n1: its guarded insert holds shard 0's share lock
# until it commits, which it does only once the test lets it (it waits for
# an advisory lock that a session of the test holds), so the check below
# does not depend on how fast a loaded machine gets to the freeze.
my $gate = $n1->background_psql('data');
$gate->query_safe('SELECT pg_advisory_lock(600017)');
my $inflight = sharding_start($n1, 'data', <<"SQL");
BEGIN;
SELECT insert_document('$first_ws', 40000, 'in flight during the move');
SELECT pg_advisory_lock_shared(600017);
COMMIT;
SQL
# Until it holds the shard's lock (it waits for the gate inside its transaction).
sharding_wait($n1, 'data', "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 600017 AND NOT granted", '1', 30);

# This test moves the shard by hand, the way move_shard_online cuts over
# (without its online copy): freeze at the source, copy, switch the owner on
# the coordinator, thaw.
# 1. Freeze shard 0 on n1: waits for the in-flight writer; from then on n1
#    refuses every write of the shard, whoever writes.
my $freeze = sharding_start($n1, 'data', "SELECT sharding._freeze_shard('docs', $shard)");
my $blocked = sharding_wait($n1, 'data', "SELECT count(*) FROM pg_stat_activity
    WHERE query LIKE '%_freeze_shard(%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()", '1', 30);
ok(defined $blocked, "_freeze_shard on the source waits for the writer holding the shard's share lock");
# Open the gate: the writer commits, then the freeze goes through.
$gate->query_safe('SELECT pg_advisory_unlock(600017)');
$gate->quit;
my ($freeze_rc, undef, $freeze_err) = sharding_finish($freeze);
is($freeze_rc, 0, '_freeze_shard went through once the writer committed') or diag($freeze_err);
my ($inflight_rc, undef, $inflight_err) = sharding_finish($inflight);
is($inflight_rc, 0, 'the in-flight writer committed') or diag($inflight_err);
is(d('n1', "SELECT sqlstate_of(\$\$SELECT insert_document('$first_ws', 50001, 'frozen')\$\$)"), '55000',
	"n1 now refuses a write of its own (frozen) shard $shard: 55000");

# 2. Copy the shard's rows to n2 as replication apply writes them
#    (session_replication_role = replica: the guard stands aside).
my $copied = d('n2', "SET session_replication_role = replica;
    WITH c AS (INSERT INTO documents
               SELECT * FROM dblink('$dsn{n1}',
                   'SELECT workspace_id, id, body FROM documents
                     WHERE sharding.logical_shard(''docs'', workspace_id) = $shard
                       AND workspace_id NOT IN (SELECT key FROM sharding.pins WHERE map = ''docs'')')
                   AS d(workspace_id text, id bigint, body text)
               RETURNING 1)
    SELECT count(*) FROM c");
my $src_count = d('n1', "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $shard");
is($copied, $src_count, "all $src_count rows of shard $shard copied to n2");
my $checksum_sql = "SELECT rows || '/' || checksum FROM sharding.shard_checksum('docs', $shard, 'documents')";
my $sum1 = d('n1', $checksum_sql);
is(d('n2', $checksum_sql), $sum1, "shard_checksum of shard $shard is the same on n1 and n2 ($sum1)");

# 3. Switch on the coordinator: every follower sees the new owner and epoch.
is(p("SELECT sharding._switch_owner('docs', $shard, 'n2')"), '2', 'move_shard on the coordinator: epoch 2');
my @lags = map {
	my $ms = sharding_wait($node{$_}, 'data',
		"SELECT sharding.node_for('docs', '$first_ws') || '/' || sharding.epoch('docs', $shard)", 'n2/2', 30);
	"$_=" . (defined $ms ? "${ms}ms" : "timeout (last: $ShardingNode::last_wait)")
} @names;
is(scalar(grep { /ms$/ } @lags), 4, "every follower routes shard $shard to n2 at epoch 2 (seen after: @lags)");

# 4. Thaw, and delete at the source what it no longer owns (replica role:
#    the guard refuses these keys now).
is(d('n1', "SELECT sharding._thaw_shard('docs', $shard)"), 't', '_thaw_shard on n1');
is( d(  'n1', "SET session_replication_role = replica;
    WITH d AS (DELETE FROM documents WHERE sharding.node_for('docs', workspace_id) <> sharding.this_node() RETURNING 1)
    SELECT count(*) FROM d"),
	$src_count, 'the source deleted exactly the moved rows');

my ($writer_rc, $writer_out, $writer_err) = sharding_finish($writer);
my ($retries) = $writer_out =~ /^(\d+)$/m;
is($writer_rc, 0, 'the concurrent writer finished (retried ' . ($retries // '?') . ' refused writes)')
  or diag($writer_err);
is(per_node('SELECT count(*) FROM documents WHERE id BETWEEN 30001 AND 40000'), 'n1=0 n2=802 n3=0 n4=0',
	'no row lost: all 802 concurrent, in-flight and post-switch writes are on n2, once');
is(d('n2', 'SELECT count(*) FROM documents WHERE id = 39999') . '|' . d('n1', 'SELECT count(*) FROM documents WHERE id = 39999'),
	'1|0', 'the proxy routed the same backend\'s write after the switch to n2, without a restart');
is(d('n1', "SELECT count(*) FROM documents WHERE sharding.logical_shard('docs', workspace_id) = $shard"), '0',
	"n1 keeps no row of shard $shard");
is( p('SELECT sum(c) FROM count_all() AS c') . '|'
	  . p("SELECT count(*) FROM unnest(string_to_array('$ws_list', ',')) AS w, LATERAL get_documents(w)"),
	'11102|' . ($before_shard + 802),
	"through the proxy: every document is still found (count_all, get_documents of shard $shard)");
is(per_node($misplaced_sql), 'n1=0 n2=0 n3=0 n4=0', 'after the move, still no row outside the instance node_for names');

# ---------------------------------------------------------------- fencing on the data node
is(d('n1', "SELECT sqlstate_of(\$\$SELECT sharding.fence('docs', $shard, 1)\$\$)"), '55000',
	'on n1, a writer fenced on the old epoch is refused (55000)');
is(d('n1', "SELECT sqlstate_of(\$\$SELECT insert_document('$first_ws', 50000, 'stale')\$\$)"), '55000',
	'on n1, a direct write to the moved shard is refused by the guard (55000)');
is( d(  'n2', "SELECT sqlstate_of(\$\$SELECT sharding.fence('docs', $shard, 2)\$\$) || '|'
                   || sqlstate_of(\$\$SELECT sharding.fence('docs', $shard, 1)\$\$)"),
	'|55000', 'on n2, the new epoch passes the fence and the old one does not');

# ---------------------------------------------------------------- latency (a figure, not a test)
# Median of 3 pgbench runs of 1,000 calls each: get_documents of one
# workspace (50 rows) through the proxy, and the same call directly on the
# data node that owns it. The test is that every call ran and both paths
# return the same rows; the figures are printed for docs/performance.md.
my $ws_bench = 'ws-005';
my $owner = p("SELECT sharding.node_for('docs', '$ws_bench')");
my $rows_sql = "SELECT count(*) || '/' || sum(id) FROM get_documents('$ws_bench')";
my $script = PostgreSQL::Test::Utils::tempdir() . '/bench.sql';
PostgreSQL::Test::Utils::append_to_file($script, "SELECT * FROM get_documents('$ws_bench');\n");
sub median_latency
{
	my ($n, $db) = @_;
	my (@lat, $processed);
	for (1 .. 3)
	{
		local %ENV = $n->_get_env();
		my ($stdout, $stderr);
		IPC::Run::run([ 'pgbench', '-n', '-t', '1000', '-f', $script, '-h', $n->host, '-p', $n->port, $db ],
			'>', \$stdout, '2>', \$stderr);
		$processed++ if $stdout =~ m{number of transactions actually processed: 1000/1000};
		push @lat, $1 if $stdout =~ /^latency average = ([0-9.]+) ms$/m;
	}
	@lat = sort { $a <=> $b } @lat;
	return ($processed // 0, $lat[1]);
}
my ($via_ok, $via_proxy) = median_latency($n1, 'proxy');
my ($direct_ok, $direct) = median_latency($node{$owner}, 'data');
is("$via_ok|$direct_ok|" . p($rows_sql), '3|3|' . d($owner, $rows_sql),
	"pgbench: 3 x 1,000 calls through the proxy and directly on $owner all ran, and both paths return the same rows");
if (defined $via_proxy && defined $direct)
{
	my $load = (split ' ', PostgreSQL::Test::Utils::slurp_file('/proc/loadavg'))[0];
	diag(sprintf('latency per call: %s ms through the proxy, %s ms direct on %s (ratio %.1f; load average %s)',
			$via_proxy, $direct, $owner, $via_proxy / $direct, $load));
}
