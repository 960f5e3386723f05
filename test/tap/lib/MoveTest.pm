# Helpers of the move engine's Perl TAP tests (test/tap/4xx_move*.pl): a
# coordinator and two data nodes, each its own PostgreSQL instance, a map
# 'bank' over n1 and n2 with the distributed table accounts, followers
# attached, writers that log every commit on the coordinator, and checks
# of what a move leaves.
package MoveTest;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardingNode;
use Exporter 'import';

our @EXPORT = qw(move_cluster load_rows start_writers stop_writers leftovers expected_vs_actual shard_rows
  wait_for_sql psql_bg usleep slow_apply shard_tenants shard_sum writers_kept mover_pid wait_for_restart deleting
  hold_row release_row load_parts hold_table release_table holding_table hold_switch release_switch switch_waits third_node);

# Table accounts. The key is not in the primary key: the replica identity
# carries it (a move refuses a table whose deletes would not name their
# shard).
my $accounts_sql = "CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text);"
  . " CREATE INDEX ON accounts (tenant);"
  . " CREATE UNIQUE INDEX accounts_identity ON accounts (id, tenant);"
  . " ALTER TABLE accounts REPLICA IDENTITY USING INDEX accounts_identity;";
# Table parts: one leaf per logical shard of an 8-shard map.
my $parts_sql = "CREATE TABLE parts (tenant text NOT NULL, id bigint NOT NULL, val text, PRIMARY KEY (tenant, id))
                 PARTITION BY HASH (tenant sharding.text_shard_ops);
             SELECT sharding.create_partitions('parts', 8);";

# move_cluster(opts): ($coord, $n1, $n2) clusters, databases coord, n1, n2.
# opts{node_conf}: extra postgresql.conf lines of the two data nodes.
sub move_cluster
{
	my %opts = @_;
	# The coordinator survives kill -9 of a backend (crash restart).
	my $coord = sharding_node('coord', db => 'coord', conf => 'restart_after_crash = on');
	my @nconf = $opts{node_conf} ? (conf => $opts{node_conf}) : ();
	my $a = sharding_node('i1', db => 'n1', @nconf);
	my $b = sharding_node('i2', db => 'n2', @nconf);
	$_->[0]->safe_psql($_->[1], $accounts_sql) for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
	my $dsn1 = $a->connstr('n1');
	my $dsn2 = $b->connstr('n2');
	$coord->safe_psql('coord', qq{
		SELECT sharding.create_map('bank', 8, ARRAY['n1', 'n2']);
		SELECT sharding.add_node('n1', \$\$$dsn1\$\$), sharding.add_node('n2', \$\$$dsn2\$\$);
		SELECT sharding.distribute('accounts', 'tenant', 'bank');
		SELECT sharding.attach_node('n1');
		SELECT sharding.attach_node('n2');
	});
	wait_for_sql($a, 'n1', "SELECT count(*) FROM sharding.distributed_tables", '1');
	wait_for_sql($b, 'n2', "SELECT count(*) FROM sharding.distributed_tables", '1');
	return ($coord, $a, $b);
}

# wait_for_sql(node, db, sql, expected[, seconds]): polls until sql returns expected.
sub wait_for_sql
{
	my ($node, $db, $sql, $want, $secs) = @_;
	$secs //= 60;
	my $got = '';
	for (1 .. $secs * 20)
	{
		$got = $node->safe_psql($db, $sql);
		return 1 if $got eq $want;
		usleep(50_000);
	}
	diag("waited $secs s for [$sql] = $want, got $got");
	return 0;
}

sub usleep { select(undef, undef, undef, $_[0] / 1_000_000); }

# mover_pid(coord): the pid of the session carrying out the move in
# progress (its journal row's), to cancel or kill it.
sub mover_pid
{
	my $coord = shift;
	return $coord->safe_psql('coord', "SELECT pid FROM sharding.move_journal WHERE phase NOT IN ('done', 'failed', 'cancelled')");
}

# deleting(): the condition on pg_stat_activity naming a session of a
# move's delete at a node (_move_delete_rows runs one _move_delete_local
# call per table there, each a statement of its own).
sub deleting { return "query LIKE 'SELECT sharding._move_delete_local(%'"; }

# wait_for_restart(coord): until the coordinator answers again after the
# crash restart a kill -9 of one of its backends causes (60 s).
sub wait_for_restart
{
	my $coord = shift;
	for (1 .. 600)
	{
		# (psql refused while the server is still in recovery may exit before
		# it reads its stdin; IPC::Run then dies of a broken pipe: seen once
		# on PostgreSQL 17. Not up yet, as any other refusal.)
		my $rc = eval { ($coord->psql('coord', 'SELECT 1'))[0] };
		return if defined $rc && $rc == 0;
		usleep(100_000);
	}
	die 'the coordinator did not come back';
}

# load_rows(coord, n1, n2, rows per tenant): tenants t00..t63, each node
# inserts the rows it owns; the coordinator logs them (writer 0).
sub load_rows
{
	my ($coord, $a, $b, $per) = @_;
	my $gen = "SELECT 't' || lpad((i % 64)::text, 2, '0') AS tenant, i::bigint AS id, 'initial-' || i AS val"
	  . " FROM generate_series(1, 64 * $per) AS i";
	$a->safe_psql('n1', "INSERT INTO accounts SELECT * FROM ($gen) g WHERE sharding.node_for('bank', g.tenant) = 'n1'");
	$b->safe_psql('n2', "INSERT INTO accounts SELECT * FROM ($gen) g WHERE sharding.node_for('bank', g.tenant) = 'n2'");
	$coord->safe_psql('coord', qq{
		CREATE TABLE IF NOT EXISTS oplog (seq bigserial PRIMARY KEY, w integer NOT NULL, id bigint NOT NULL,
			tenant text NOT NULL, op text NOT NULL, val text, at timestamptz NOT NULL DEFAULT clock_timestamp());
		INSERT INTO oplog (w, id, tenant, op, val) SELECT 0, id, tenant, 'insert', val FROM ($gen) g;
	});
}

my $writer_sql = $NODE_EXEC . q{
CREATE TABLE IF NOT EXISTS stop_flag (stop boolean NOT NULL);
CREATE TABLE IF NOT EXISTS wstats (w integer, committed integer, refused integer, anomalies integer);
CREATE TABLE IF NOT EXISTS anomaly (w integer, id bigint, op text, tenant text, dest text, tag text, at timestamptz);
CREATE OR REPLACE PROCEDURE writer(w integer, tenants text[], max_ops integer) LANGUAGE plpgsql AS $$
DECLARE
    r record; op text; t_ text; nt text; id_ bigint; dest text; cmd text; v text; tag text;
    nid bigint := w * 10000000; c integer := 0; refused integer := 0; anomalies integer := 0; done boolean;
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS live (id bigint PRIMARY KEY, tenant text);
    FOR i IN 1 .. max_ops LOOP
        EXIT WHEN (SELECT stop FROM stop_flag);
        SELECT l.id, l.tenant INTO r FROM live l ORDER BY random() LIMIT 1;
        IF r.id IS NULL OR random() < 0.4 THEN
            nid := nid + 1; id_ := nid; op := 'insert';
            t_ := tenants[1 + floor(random() * cardinality(tenants))::int]; nt := t_;
        ELSE
            id_ := r.id; t_ := r.tenant;
            op := CASE WHEN random() < 0.15 THEN 'rekey' WHEN random() < 0.7 THEN 'update' ELSE 'delete' END;
            nt := CASE WHEN op = 'rekey' THEN tenants[1 + floor(random() * cardinality(tenants))::int] ELSE t_ END;
        END IF;
        v := format('w%s-%s', w, i);
        cmd := CASE op
            WHEN 'insert' THEN format('INSERT INTO accounts VALUES (%L, %s, %L)', t_, id_, v)
            WHEN 'update' THEN format('UPDATE accounts SET val = %L WHERE id = %s', v, id_)
            WHEN 'rekey' THEN format('UPDATE accounts SET tenant = %L, val = %L WHERE id = %s', nt, v, id_)
            ELSE format('DELETE FROM accounts WHERE id = %s', id_) END;
        done := false;
        FOR tries IN 1 .. 500 LOOP
            dest := sharding.node_for('bank', t_);
            -- a key change across nodes is no single statement: not tried
            EXIT WHEN op = 'rekey' AND sharding.node_for('bank', nt) <> dest;
            BEGIN
                tag := node_exec(w, dest, cmd);
                done := true;
                IF op <> 'insert' AND tag NOT LIKE '% 1' THEN
                    -- the row was not where node_for said: counted, not logged
                    anomalies := anomalies + 1;
                    INSERT INTO anomaly VALUES (w, id_, op, t_, dest, tag, clock_timestamp());
                    done := false;
                    EXIT;
                END IF;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                refused := refused + 1;
                -- a key change into or out of a moving shard: refused, not done
                EXIT WHEN op = 'rekey' AND SQLERRM LIKE '%being moved online%';
                PERFORM pg_sleep(0.005);
            END;
            EXIT WHEN done;
            COMMIT;   -- route anew with what this session has not seen yet
        END LOOP;
        IF done THEN
            INSERT INTO oplog (w, id, tenant, op, val) VALUES (w, id_, nt, op, v);
            IF op = 'delete' THEN DELETE FROM live WHERE id = id_;
            ELSIF op = 'insert' THEN INSERT INTO live VALUES (id_, nt);
            ELSE UPDATE live SET tenant = nt WHERE id = id_; END IF;
            c := c + 1;
        END IF;
        COMMIT;
    END LOOP;
    INSERT INTO wstats VALUES (w, c, refused, anomalies);
    COMMIT;
END $$;
DELETE FROM stop_flag; INSERT INTO stop_flag VALUES (false); DELETE FROM wstats;
};

# psql_bg(node, db, sql): a psql running sql in the background (IPC::Run).
sub psql_bg
{
	my ($node, $db, $sql) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-c', $sql ],
		'>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

# hold_table(node, db, table): a session there holds table in SHARE mode
# (a move's copy into it and its delete there wait), once it holds it;
# release_table(node, db, session) ends it. holding_table(): the
# pg_stat_activity condition naming such a session.
sub holding_table { return "query LIKE 'BEGIN; LOCK TABLE % IN SHARE MODE; SELECT pg_sleep(600)'"; }
sub hold_table
{
	my ($node, $db, $table) = @_;
	my $h = psql_bg($node, $db, "BEGIN; LOCK TABLE $table IN SHARE MODE; SELECT pg_sleep(600)");
	wait_for_sql($node, $db, "SELECT count(*) FROM pg_stat_activity WHERE " . holding_table() . " AND wait_event = 'PgSleep'", '1', 60)
	  or die "$table was not locked at $db";
	return $h;
}
sub release_table
{
	my ($node, $db, $h) = @_;
	$node->safe_psql($db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE " . holding_table() . " AND pid <> pg_backend_pid()");
	$h->{h}->finish;
}

# hold_switch(coord, logical[, map]): a session at the coordinator locks the
# shard's row of sharding.shards (map 'bank' by default), once it does: a
# move's switch waits for it in its cutover, the source frozen.
# switch_waits(coord): whether a move waits there (2 minutes at most).
# release_switch(coord, session) ends the session.
my $holding_switch = "query LIKE 'BEGIN; SELECT 1 FROM sharding.shards %'";
sub hold_switch
{
	my ($coord, $logical, $map) = @_;
	$map //= 'bank';
	my $h = psql_bg($coord, 'coord', "BEGIN; SELECT 1 FROM sharding.shards WHERE map = '$map' AND logical = $logical FOR UPDATE; "
		  . "SELECT pg_sleep(600)");
	wait_for_sql($coord, 'coord', "SELECT count(*) FROM pg_stat_activity WHERE $holding_switch AND wait_event = 'PgSleep'", '1', 60)
	  or die "the row of shard $logical was not locked";
	return $h;
}
sub switch_waits
{
	my ($coord) = @_;
	return wait_for_sql($coord, 'coord', "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
		  . "AND query LIKE '%sharding._switch_owner(%'", '1', 120);
}
sub release_switch
{
	my ($coord, $h) = @_;
	$coord->safe_psql('coord', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE $holding_switch AND pid <> pg_backend_pid()");
	$h->{h}->finish;
}

# start_writers(coord, n, tenants): n writer procedures on the coordinator
# (writer numbers, and so their new ids, differ from every earlier round's).
my $round = 0;
sub start_writers
{
	my ($coord, $n, $tenants) = @_;
	$coord->safe_psql('coord', $writer_sql);
	my $arr = "ARRAY[" . join(',', map { "'$_'" } @$tenants) . "]";
	$round++;
	return [ map { psql_bg($coord, 'coord', "CALL writer(" . ($round * 10 + $_) . ", $arr, 1000000)") } 1 .. $n ];
}

# stop_writers(coord, writers): stops them; returns "committed|refused|anomalies|errors".
sub stop_writers
{
	my ($coord, $ws) = @_;
	$coord->safe_psql('coord', 'UPDATE stop_flag SET stop = true');
	my $errors = 0;
	for my $w (@$ws)
	{
		$w->{h}->finish;
		if (${ $w->{err} } ne '') { $errors++; diag("writer: " . ${ $w->{err} }); }
	}
	diag($coord->safe_psql('coord', "SELECT string_agg(w || ' ' || id || ' ' || op || ' ' || tenant || ' on ' || dest || ' ' || tag || ' ' || at, E'\\n') FROM anomaly"));
	$coord->safe_psql('coord', "DELETE FROM anomaly");
	return $coord->safe_psql('coord',
		"SELECT sum(committed) || '|' || sum(refused) || '|' || sum(anomalies) FROM wstats") . "|$errors";
}

# The rows the log implies (tenant|id|val, sorted), and the rows the
# nodes hold, each on the node node_for names.
sub expected_vs_actual
{
	my ($coord, $a, $b) = @_;
	my $exp = $coord->safe_psql('coord', q{
		SELECT coalesce(string_agg(tenant || '|' || id || '|' || val, E'\n' ORDER BY id), '')
		  FROM (SELECT DISTINCT ON (id) id, tenant, val, op FROM oplog ORDER BY id, seq DESC) l WHERE op <> 'delete'});
	my @rows;
	for ([$a, 'n1'], [$b, 'n2'])
	{
		my ($n, $db) = @$_;
		push @rows, grep { $_ ne '' } split /\n/, $n->safe_psql($db,
			"SELECT tenant || '|' || id || '|' || val || '|' || CASE WHEN sharding.node_for('bank', tenant) = '$db' THEN 't' ELSE 'f' END FROM accounts");
	}
	my @misplaced = grep { !/\|t$/ } @rows;
	s/\|[tf]$// for @rows;
	my @sorted = sort { (split /\|/, $a)[1] <=> (split /\|/, $b)[1] } @rows;
	my %e = map { $_ => 1 } grep { $_ ne '' } split /\n/, $exp;
	my %g = map { $_ => 1 } @sorted;
	my @missing = grep { !$g{$_} } sort keys %e;
	my @extra = grep { !$e{$_} } sort keys %g;
	diag("missing: @missing[0 .. ($#missing < 9 ? $#missing : 9)]") if @missing;
	diag("extra: @extra[0 .. ($#extra < 9 ? $#extra : 9)]") if @extra;
	return (scalar(keys %e) . " rows, " . scalar(@missing) . " missing, " . scalar(@extra) . " extra",
		scalar(@sorted) . " rows, " . scalar(grep { !$g{$_} } keys %e) . " missing, " . scalar(@extra) . " extra", scalar(@misplaced));
}

# writers_kept(coord, n1, n2, writers, label): stops the writers, then four
# tests (their names prefixed with label): they committed more than 50
# operations, every update and delete found its row and none failed, the
# nodes hold exactly what the log implies, and every row is on the node
# node_for names.
sub writers_kept
{
	my ($coord, $a, $b, $ws, $label) = @_;
	my ($stats) = stop_writers($coord, $ws);
	my ($committed, $refused, $anomalies, $errors) = split /\|/, $stats;
	Test::More::ok($committed > 50, "${label}writers committed $committed operations ($refused refusals retried)");
	Test::More::is("$anomalies|$errors", '0|0', "${label}every update and delete found its row, no writer failed");
	my ($exp, $got, $misplaced) = expected_vs_actual($coord, $a, $b);
	Test::More::is($got, $exp, "${label}the nodes hold exactly what the log implies, row for row");
	Test::More::is($misplaced, 0, "${label}every row is on the node node_for names");
}

# leftovers(coord, n1, n2): publications/subscriptions/slots of moves,
# frozen shards and decoding rows per node, live journal rows.
sub leftovers
{
	my ($coord, $a, $b) = @_;
	my $q = q{SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
		|| '/' || (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%')
		|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
		|| '/' || (SELECT count(*) FROM sharding.frozen_shards)
		|| '/' || (SELECT count(*) FROM sharding.move_decoding)};
	return 'n1:' . $a->safe_psql('n1', $q) . ' n2:' . $b->safe_psql('n2', $q) . ' coord:'
	  . $coord->safe_psql('coord', "SELECT count(*) FROM sharding.move_journal WHERE phase NOT IN ('done', 'failed', 'cancelled')");
}

# shard_sum(node, db, logical): "rows/checksum" of one logical shard of
# accounts there (sharding.shard_checksum).
sub shard_sum
{
	my ($node, $db, $l) = @_;
	return $node->safe_psql($db, "SELECT rows || '/' || checksum FROM sharding.shard_checksum('bank', $l, 'accounts')");
}

# shard_rows(node, db, logical): rows of one logical shard there.
sub shard_rows
{
	my ($node, $db, $l) = @_;
	return $node->safe_psql($db, "SELECT count(*) FROM accounts WHERE sharding.logical_shard('bank', tenant) = $l");
}


# slow_apply(node, db, seconds): the destination's apply worker sleeps that
# long per row of accounts (a trigger ENABLE REPLICA that sleeps only in the
# logical replication worker), so a move's catch-up has a backlog. Dropped
# with DROP TRIGGER slow_apply ON accounts.
sub slow_apply
{
	my ($node, $db, $seconds) = @_;
	$node->safe_psql($db, qq{
	CREATE OR REPLACE FUNCTION slow_apply() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
	    IF (SELECT backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid()) IN ('logical replication worker', 'logical replication apply worker') THEN
	        PERFORM pg_sleep($seconds);
	    END IF;
	    RETURN NEW;
	END \$\$;
	CREATE TRIGGER slow_apply BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION slow_apply();
	ALTER TABLE accounts ENABLE REPLICA TRIGGER slow_apply;
});
}

# shard_tenants(coord, logical): the tenants t00..t63 of one logical shard
# of 'bank', as a list (writers aimed at the moving shard).
sub shard_tenants
{
	my ($coord, $l) = @_;
	return split /,/, $coord->safe_psql('coord',
		"SELECT string_agg(t, ',') FROM (SELECT 't' || lpad(i::text, 2, '0') AS t FROM generate_series(0, 63) i) s WHERE sharding.logical_shard('bank', t) = $l");
}

# hold_row(node, db, tenant, id): a session there inserts, uncommitted, a
# row of accounts with that key, bypassing the guard as a move's copy does;
# a copy of a row with that key waits for it on its unique key. Returns
# the session, for release_row.
my $holding = "query LIKE '%''holder''); SELECT pg_sleep(600)'";
sub hold_row
{
	my ($node, $db, $tenant, $id) = @_;
	my $h = psql_bg($node, $db, "BEGIN; SET session_replication_role = replica; "
		  . "INSERT INTO accounts VALUES ('$tenant', $id, 'holder'); SELECT pg_sleep(600)");
	ok(wait_for_sql($node, $db, "SELECT count(*) FROM pg_stat_activity WHERE $holding AND wait_event = 'PgSleep'", '1', 60),
		'a session at the destination holds the last row\'s key');
	return $h;
}

# release_row(node, db, session): ends that session (its row rolls back).
sub release_row
{
	my ($node, $db, $h) = @_;
	$node->safe_psql($db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE $holding AND pid <> pg_backend_pid()");
	$h->{h}->finish;
}


# load_parts(coord, n1, n2): table parts, hash-partitioned with
# sharding.text_shard_ops into 8 leaves (create_partitions) at the
# coordinator and both nodes, distributed on map bank (the nodes wait until
# they follow it), 500 rows for each of the tenants t00..t63, each node
# inserting the rows it owns.
sub load_parts
{
	my ($coord, $a, $b) = @_;
	$_->[0]->safe_psql($_->[1], $parts_sql) for ([$coord, 'coord'], [$a, 'n1'], [$b, 'n2']);
	$coord->safe_psql('coord', "SELECT sharding.distribute('parts', 'tenant', 'bank')");
	wait_for_sql($_->[0], $_->[1], "SELECT count(*) FROM sharding.distributed_tables", '2') for ([$a, 'n1'], [$b, 'n2']);
	my $gen = "SELECT 't' || lpad((i % 64)::text, 2, '0') AS tenant, i::bigint AS id, 'p-' || i AS val"
	  . " FROM generate_series(1, 64 * 500) AS i";
	$a->safe_psql('n1', "INSERT INTO parts SELECT * FROM ($gen) g WHERE sharding.node_for('bank', g.tenant) = 'n1'");
	$b->safe_psql('n2', "INSERT INTO parts SELECT * FROM ($gen) g WHERE sharding.node_for('bank', g.tenant) = 'n2'");
}

# third_node(coord, opts): instance i3 with database n3, table accounts
# (and parts with opts{parts}), added and attached as node n3 of the
# coordinator, once it follows the distributed tables.
sub third_node
{
	my ($coord, %opts) = @_;
	my $c = sharding_node('i3', db => 'n3');
	$c->safe_psql('n3', $accounts_sql . ($opts{parts} ? $parts_sql : ''));
	my $dsn3 = $c->connstr('n3');
	$coord->safe_psql('coord', "SELECT sharding.add_node('n3', \$\$$dsn3\$\$); SELECT sharding.attach_node('n3');");
	wait_for_sql($c, 'n3', "SELECT count(*) FROM sharding.distributed_tables", $opts{parts} ? '2' : '1');
	return $c;
}
1;
