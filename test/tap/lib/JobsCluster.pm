# Helpers for the rebalance job tests (test/tap/5xx_*.pl, docs/rebalance.md).
#
# Topology: instance `coord` holds the coordinator (database coord, the
# library preloaded unless preload => 0); instance `data` holds data nodes
# n1, n2 and n3 (databases of those names), each following the coordinator
# (attach_node). Map `bank`: 8 logical shards over n1 and n2; n3 owns none.
# Two co-located distributed tables, accounts and events (tenant text, id
# bigint primary key, val text), 64 tenants, rows placed by node_for.
#
# Writers (start_writers) run on the coordinator: each inserts, updates
# and deletes rows through dblink on the node node_for names, retries a
# refusal (55000, the shard is being cut over or moved away), and logs every
# operation that committed in table oplog; the view `expected` is what the
# log implies. check_data compares every node with it.
package JobsCluster;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);
use ShardingNode;
use Exporter 'import';

our @EXPORT = qw(jobs_cluster start_writers stop_writers check_data leftovers wait_for
  node_of_db digest expected_digest followers_agree start_sampler finish_sampler $IN_FLIGHT);

my %HOST;    # database -> cluster object

sub node_of_db { return $HOST{ $_[0] }; }

sub q_db
{
	my ($db, $sql) = @_;
	return $HOST{$db}->safe_psql($db, $sql);
}

# jobs_cluster(%opts): (coord cluster, data cluster). opts{rows}: initial
# rows per table (default 20000); opts{preload}: preload on the coordinator
# (default 1); opts{conf}, opts{data_conf}: extra configuration of the
# coordinator's and the data nodes' instance; opts{nodes}: the data nodes
# (default n1, n2, n3; the map's shards are on n1 and n2, every node
# attached and following it).
sub jobs_cluster
{
	my (%opts) = @_;
	my $rows = $opts{rows} // 20000;
	my $c = sharding_node('coord', db => 'coord',
		preload => (exists $opts{preload} ? $opts{preload} : 1),
		conf => "max_connections = 60\n" . ($opts{conf} // ''));
	my $d = sharding_node('data', conf => "max_connections = 80\n" . ($opts{data_conf} // ''));
	my @nodes = @{ $opts{nodes} // [qw(n1 n2 n3)] };
	%HOST = (coord => $c, map { $_ => $d } @nodes);
	my $tables = "CREATE TABLE accounts (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
	    CREATE TABLE events (tenant text NOT NULL, id bigint PRIMARY KEY, val text);
	    CREATE INDEX ON accounts (tenant); CREATE INDEX ON events (tenant);
	    CREATE UNIQUE INDEX accounts_identity ON accounts (id, tenant);
	    ALTER TABLE accounts REPLICA IDENTITY USING INDEX accounts_identity;
	    CREATE UNIQUE INDEX events_identity ON events (id, tenant);
	    ALTER TABLE events REPLICA IDENTITY USING INDEX events_identity;";
	for my $n (@nodes)
	{
		$d->safe_psql('postgres', "CREATE DATABASE $n");
		$d->safe_psql($n, "CREATE EXTENSION dblink; CREATE EXTENSION sharding; $tables");
	}
	$c->safe_psql('coord', $tables);
	my $dsn = sub { my $n = shift; return "host=" . $d->host . " port=" . $d->port . " dbname=$n"; };
	$c->safe_psql('coord', "
	    SELECT sharding.create_map('bank', 8, ARRAY['n1', 'n2']);
	    " . join('', map { "SELECT sharding.add_node('$_', '" . $dsn->($_) . "');\n" } @nodes) . "
	    SELECT sharding.distribute('accounts', 'tenant', 'bank'), sharding.distribute('events', 'tenant', 'bank');
	    " . join('', map { "SELECT sharding.attach_node('$_');\n" } @nodes));
	my $gen = "SELECT 't' || lpad((i % 64)::text, 2, '0') AS tenant, i::bigint AS id, 'initial-' || i AS val
	             FROM generate_series(1, $rows) AS i";
	# Each node follows the map: wait until it knows its own shards.
	for my $n (@nodes)
	{
		wait_for($n, "SELECT count(*) = 8 FROM sharding.shards WHERE map = 'bank'", 't', 30)
		  or die "node $n does not follow the map";
		$d->safe_psql($n, "
		    INSERT INTO accounts SELECT * FROM ($gen) g WHERE sharding.node_for('bank', g.tenant) = sharding.this_node();
		    INSERT INTO events SELECT * FROM ($gen) g WHERE sharding.node_for('bank', g.tenant) = sharding.this_node();");
	}
	$c->safe_psql('coord', <<"SQL");
CREATE TABLE oplog (seq bigserial PRIMARY KEY, writer integer NOT NULL, tbl text NOT NULL, id bigint NOT NULL,
                    tenant text NOT NULL, op text NOT NULL, val text, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE writer_stats (writer integer PRIMARY KEY, committed integer, refused integer, anomalies text[]);
CREATE TABLE stop_flag (stop boolean NOT NULL);
INSERT INTO stop_flag VALUES (false);
INSERT INTO oplog (writer, tbl, id, tenant, op, val) SELECT 0, 'accounts', id, tenant, 'insert', val FROM ($gen) g;
INSERT INTO oplog (writer, tbl, id, tenant, op, val) SELECT 0, 'events', id, tenant, 'insert', val FROM ($gen) g;
CREATE VIEW expected AS
SELECT tbl, id, tenant, val FROM (
    SELECT DISTINCT ON (tbl, id) tbl, id, tenant, op, val FROM oplog ORDER BY tbl, id, seq DESC) AS last
 WHERE op <> 'delete';
$NODE_EXEC
-- Writer w owns the ids congruent to w - 1 mod 4, so its log is in commit
-- order for every row it touches. hot: tenants that get 60% of the
-- operations (none by default: every tenant alike).
CREATE PROCEDURE writer(w integer, max_ops integer, hot text[] DEFAULT '{}') LANGUAGE plpgsql AS \$\$
DECLARE
    t_name text; op text; r record; dest text; sql text; tag text; v text;
    next_id bigint := w * 10000000;
    committed integer := 0; refused integer := 0; anomalies text[] := '{}';
    done boolean;
BEGIN
    CREATE TEMP TABLE live ON COMMIT PRESERVE ROWS AS
        SELECT tbl, id, tenant FROM oplog WHERE writer = 0 AND id % 4 = w - 1;
    COMMIT;
    FOR i IN 1 .. max_ops LOOP
        EXIT WHEN (SELECT stop FROM stop_flag);
        t_name := CASE WHEN random() < 0.5 THEN 'accounts' ELSE 'events' END;
        r := NULL;
        IF random() >= 0.4 THEN
            SELECT l.tbl AS f1, l.id AS f2, l.tenant AS f3 INTO r FROM live l WHERE l.tbl = t_name
             ORDER BY (l.tenant = ANY (hot)) AND random() < 0.6 DESC, random() LIMIT 1;
            op := CASE WHEN random() < 0.7 THEN 'update' ELSE 'delete' END;
        END IF;
        IF r IS NULL THEN
            next_id := next_id + 1;
            SELECT t_name AS f1, next_id AS f2,
                   CASE WHEN cardinality(hot) > 0 AND random() < 0.6 THEN hot[1 + floor(random() * cardinality(hot))::int]
                        ELSE 't' || lpad(floor(random() * 64)::int::text, 2, '0') END AS f3 INTO r;
            op := 'insert';
        END IF;
        v := format('w%s-op%s', w, i);
        sql := CASE op
            WHEN 'insert' THEN format('INSERT INTO %I VALUES (%L, %s, %L)', r.f1, r.f3, r.f2, v)
            WHEN 'update' THEN format('UPDATE %I SET val = %L WHERE id = %s', r.f1, v, r.f2)
            ELSE format('DELETE FROM %I WHERE id = %s', r.f1, r.f2) END;
        LOOP
            dest := sharding.node_for('bank', r.f3::text);
            BEGIN
                tag := node_exec(w, dest, sql);
                done := true;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                done := false;
            END;
            EXIT WHEN done;
            refused := refused + 1;
            IF refused > 50000 THEN
                RAISE EXCEPTION 'writer % gave up after % refusals', w, refused;
            END IF;
            COMMIT;   -- see the map change
            PERFORM pg_sleep(0.005);
        END LOOP;
        v := CASE op WHEN 'insert' THEN 'INSERT 0 1' WHEN 'update' THEN 'UPDATE 1' ELSE 'DELETE 1' END;
        IF tag <> v THEN
            anomalies := anomalies || format('%s %s %s on %s: %s', op, r.f1, r.f2, dest, tag);
        END IF;
        INSERT INTO oplog (writer, tbl, id, tenant, op, val) VALUES (w, r.f1, r.f2, r.f3, op, format('w%s-op%s', w, i));
        IF op = 'insert' THEN
            INSERT INTO live VALUES (r.f1, r.f2, r.f3);
        ELSIF op = 'delete' THEN
            DELETE FROM live l WHERE l.tbl = r.f1 AND l.id = r.f2;
        END IF;
        committed := committed + 1;
        COMMIT;
        PERFORM pg_sleep(0.005);
    END LOOP;
    INSERT INTO writer_stats VALUES (w, committed, refused, anomalies);
END \$\$;
SQL
	return ($c, $d);
}

# wait_for(db, sql, want, seconds): polls until sql returns want; true if it did.
sub wait_for
{
	my ($db, $sql, $want, $seconds) = @_;
	my $deadline = time + $seconds;
	while (time < $deadline)
	{
		my $got = $HOST{$db}->safe_psql($db, $sql);
		return 1 if $got eq $want;
		usleep(100_000);
	}
	return 0;
}

# The phases of a move in flight (for move_progress.phase).
our $IN_FLIGHT = "phase IN ('copying', 'catching_up', 'cutover', 'cleanup')";

# start_sampler(job, column => aggregate, ...): a session on the
# coordinator that, every 50 ms while the job is queued or running, adds a
# row to table samples (at, then each column) with each aggregate over the
# job's rows of sharding.move_progress. finish_sampler(handle) waits for it
# to end with the job and returns what it printed on stderr ('' if nothing).
sub start_sampler
{
	my ($job, @columns) = @_;
	my (@defs, @names, @aggs);
	while (my ($def, $agg) = splice(@columns, 0, 2))
	{
		push @defs, $def;
		push @names, (split ' ', $def)[0];
		push @aggs, $agg;
	}
	my $c = $HOST{coord};
	$c->safe_psql('coord', sprintf(<<'SQL', join(', ', @defs), join(', ', @names), join(', ', @aggs)));
CREATE TABLE samples (at timestamptz DEFAULT clock_timestamp(), %s);
CREATE PROCEDURE sampler(j bigint) LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        INSERT INTO samples (%s)
        SELECT %s
          FROM sharding.move_progress WHERE job = j;
        COMMIT;
        EXIT WHEN (SELECT state FROM sharding.rebalance_jobs WHERE job = j) NOT IN ('queued', 'running');
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
SQL
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-d', $c->connstr('coord'), '-c', "CALL sampler($job)" ],
		'>', \$out, '2>', \$err);
	return { h => $h, err => \$err };
}

sub finish_sampler
{
	my ($sampler) = @_;
	$sampler->{h}->finish;
	return ${ $sampler->{err} };
}

# start_writers(n[, hot => [tenants]]): n writer processes on the
# coordinator (psql CALL writer); hot tenants get 60% of the operations.
sub start_writers
{
	my ($n, %opts) = @_;
	my $hot = $opts{hot} ? ", ARRAY[" . join(',', map { "'$_'" } @{ $opts{hot} }) . "]::text[]" : '';
	my $c = $HOST{coord};
	$c->safe_psql('coord', 'UPDATE stop_flag SET stop = false');
	my @h;
	for my $w (1 .. $n)
	{
		my ($out, $err) = ('', '');
		my $h = IPC::Run::start([ 'psql', '-XAtq', '-d', $c->connstr('coord'), '-c', "CALL writer($w, 1000000$hot)" ],
			'>', \$out, '2>', \$err);
		push @h, [ $h, \$out, \$err ];
	}
	return \@h;
}

# stop_writers(handles): stops them; returns the errors they printed ('' if none).
sub stop_writers
{
	my ($h) = @_;
	$HOST{coord}->safe_psql('coord', 'UPDATE stop_flag SET stop = true');
	my $errors = '';
	for my $w (@$h)
	{
		$w->[0]->finish;
		$errors .= ${ $w->[2] };
	}
	return $errors;
}

sub digest
{
	my ($db, $filter) = @_;
	return q_db($db, "SELECT count(*) || ':' || coalesce(md5(string_agg(r, ',' ORDER BY r)), '-') FROM (
	    SELECT 'accounts|' || id || '|' || tenant || '|' || val AS r FROM accounts WHERE $filter
	    UNION ALL SELECT 'events|' || id || '|' || tenant || '|' || val FROM events WHERE $filter) AS x");
}

sub expected_digest
{
	my ($filter) = @_;
	return q_db('coord', "SELECT count(*) || ':' || coalesce(md5(string_agg(r, ',' ORDER BY r)), '-') FROM (
	    SELECT tbl || '|' || id || '|' || tenant || '|' || val AS r FROM expected WHERE $filter) AS x");
}

# check_data(label): every node holds exactly the rows the log implies for
# the keys the coordinator's map gives it, and nothing else.
sub check_data
{
	my ($label) = @_;
	for my $n (qw(n1 n2 n3))
	{
		my $ok = is(digest($n, 'true'), expected_digest("sharding.node_for('bank', tenant) = '$n'"),
			"$label: $n holds exactly the rows the writers' log implies for its keys");
		next if $ok;
		# Say which rows differ (at most 10).
		my %have = map { $_ => 1 } split /\n/, q_db($n,
			"SELECT 'accounts|' || id || '|' || tenant || '|' || val FROM accounts
			 UNION ALL SELECT 'events|' || id || '|' || tenant || '|' || val FROM events");
		my %want = map { $_ => 1 } split /\n/, q_db('coord',
			"SELECT tbl || '|' || id || '|' || tenant || '|' || val FROM expected WHERE sharding.node_for('bank', tenant) = '$n'");
		my @extra = grep { !$want{$_} } sort keys %have;
		my @missing = grep { !$have{$_} } sort keys %want;
		diag("$n: not in the log: @extra[0 .. ($#extra < 9 ? $#extra : 9)]") if @extra;
		diag("$n: missing: @missing[0 .. ($#missing < 9 ? $#missing : 9)]") if @missing;
		for my $r ((@extra, @missing)[0 .. 2])
		{
			next unless defined $r;
			my ($t, $id) = split /\|/, $r;
			diag("log of $t $id: " . q_db('coord', "SELECT string_agg(seq || ' ' || op || ' ' || coalesce(val, '') || ' ' || at, '; ' ORDER BY seq) FROM oplog WHERE tbl = '$t' AND id = $id"));
		}
	}
	return;
}

# followers_agree(nodes...): every data node (default n1 n2 n3) shows the
# coordinator's shards and epochs.
sub followers_agree
{
	my @nodes = @_ ? @_ : qw(n1 n2 n3);
	my $want = q_db('coord',
		"SELECT string_agg(logical || '=' || node || '\@' || epoch, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'");
	my $sql = "SELECT string_agg(logical || '=' || node || '\@' || epoch, ' ' ORDER BY logical) FROM sharding.shards WHERE map = 'bank'";
	my $ok = 1;
	for my $n (@nodes) { $ok &&= wait_for($n, $sql, $want, 20); }
	return $ok;
}

# leftovers(): replication objects, filter triggers and frozen shards of
# moves on every node, and live journal rows on the coordinator.
sub leftovers
{
	my $out = '';
	for my $n (qw(n1 n2 n3))
	{
		$out .= "$n:" . q_db($n, "SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
		    || '/' || (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%')
		    || '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
		    || '/' || (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'sharding_move%')
		    || '/' || (SELECT count(*) FROM sharding.frozen_shards)") . ' ';
	}
	return $out . 'coord:' . q_db('coord', 'SELECT count(*) FROM sharding.moves');
}

1;
