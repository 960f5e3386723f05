# Propagated DDL gives no role a right it lacks (docs/ddl.md, "Privileges";
# CONTRACT 15.4). The nodes' DSNs log in as bob, a superuser, with his
# password. alice owns a distributed table but is neither a superuser nor
# sharding_admin: her DDL reaches each node as alice herself (her login
# there, without the DSN's password), never as bob switched to alice with
# SET ROLE, so code her statement runs on a node (a volatile DEFAULT calling
# a function she created there, which tries set_config('role', ...), RESET
# ROLE and ALTER ROLE ... SUPERUSER) cannot become anyone else. A node that
# refuses her login: 42501 naming the node, nothing kept anywhere.
#
# One instance (max_prepared_transactions = 10): the coordinator's database
# coord and data nodes n1 and n2 (databases data1 and data2).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More tests => 10;
use lib 'lib';
use ShardingNode;

my $i1 = sharding_node('i1', db => 'data1', conf => "max_prepared_transactions = 10\nwal_retrieve_retry_interval = 200ms");
my $hba = $i1->data_dir . '/pg_hba.conf';
my $rest = slurp_file($hba);
open(my $fh, '>', $hba) or die "cannot write $hba: $!";
print $fh "local all bob scram-sha-256\n$rest";
close $fh;
$i1->reload;
$i1->safe_psql('postgres', q{CREATE ROLE bob LOGIN SUPERUSER PASSWORD 'secret'; CREATE ROLE alice LOGIN; CREATE DATABASE data2; CREATE DATABASE coord});
$i1->safe_psql('data2', 'CREATE EXTENSION dblink; CREATE EXTENSION sharding');
my %db = (n1 => 'data1', n2 => 'data2');
my @nodes = qw(n1 n2);
my %dsn = map { $_ => sharding_dsn($i1, $db{$_}) . ' user=bob password=secret' } @nodes;
$i1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($i1, 'coord') . "'");
sub d { my ($n, $sql, %o) = @_; return sharding_q($i1, $db{$n}, $sql, %o); }
sub c { my ($sql, %o) = @_; return sharding_q($i1, 'coord', $sql, %o); }
sub on_all { my ($sql) = @_; return join(' ', map { d($_, $sql) } @nodes); }
# as_alice(SQL): on the coordinator, logged in as alice (SQLSTATEs shown).
sub as_alice
{
	my ($rc, $out, $err) = $i1->psql('coord', "\\set VERBOSITY verbose\n$_[0]",
		connstr => $i1->connstr('coord') . ' user=alice', on_error_stop => 1);
	return "$out$err";
}

is((split /\n/, c(<<"SQL"))[-1], 'configured', 'coordinator: n1, n2 attached, t distributed and owned by alice');
CREATE EXTENSION dblink; CREATE EXTENSION sharding;
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}');
SELECT sharding.attach_node('n1'), sharding.attach_node('n2');
SELECT sharding.create_map('m', 4, ARRAY['n1', 'n2']);
CREATE TABLE t (k text PRIMARY KEY, v integer);
SELECT sharding.distribute('t', 'k', 'm');
ALTER TABLE t OWNER TO alice;
GRANT CREATE ON SCHEMA public TO alice;
SELECT 'configured';
SQL
is(on_all(q{SELECT tableowner FROM pg_tables WHERE tablename = 't'}), 'alice alice', 't exists on n1 and n2, owned by alice');

# On every database, alice's function: it tries to become postgres, records
# who it runs as, and tries to make alice a superuser.
my $grab = <<'SQL';
GRANT CREATE ON SCHEMA public TO alice;
SET ROLE alice;
CREATE TABLE public.evidence (who text, sess text);
CREATE FUNCTION public.grab() RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    BEGIN PERFORM pg_catalog.set_config('role', 'postgres', false); EXCEPTION WHEN others THEN NULL; END;
    INSERT INTO public.evidence VALUES (current_user::text, session_user::text);
    BEGIN EXECUTE 'RESET ROLE'; EXCEPTION WHEN others THEN NULL; END;
    INSERT INTO public.evidence VALUES (current_user::text, session_user::text);
    -- On one node only (n1 and n2 share this instance's roles: a second
    -- ALTER ROLE would wait for the first one's row lock).
    IF pg_catalog.current_database() = 'data1' THEN
        BEGIN EXECUTE 'ALTER ROLE alice SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
    END IF;
    RETURN 1;
END $$;
RESET ROLE;
SELECT 'ok';
SQL
is(join(' ', (map { d($_, $grab) } @nodes), c($grab)), 'ok ok ok', 'alice\'s function on n1, n2 and the coordinator');
for my $n (@nodes)
{
	d($n, qq{INSERT INTO t SELECT 'k' || g, g FROM generate_series(1, 40) AS g WHERE sharding.node_for('m', 'k' || g) = sharding.this_node()});
}
like(on_all('SELECT count(*) > 0 FROM t'), qr/^t t$/, 'rows on n1 and n2 (the DEFAULT runs there)');

my $out = as_alice(q{ALTER TABLE t ADD COLUMN c integer DEFAULT public.grab(); SELECT 'altered'});
like($out, qr/altered/, 'alice adds a column with a volatile DEFAULT calling her function');
is(c(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'}), 'f', 'alice is not a superuser afterwards');
is(on_all(q{SELECT coalesce(string_agg(DISTINCT who || '/' || sess, ','), 'none') FROM public.evidence}), 'alice/alice alice/alice',
	'on n1 and n2 her function ran as alice only, in a session of alice (never another role)');
is(on_all(q{SELECT count(*) FILTER (WHERE c = 1) = count(*) FROM t}), 't t', 'the column was added on both nodes');

# A node that refuses alice's login: 42501 naming it, nothing kept anywhere.
$i1->safe_psql('postgres', q{CREATE ROLE alice_nologin NOLOGIN});
c(q{ALTER TABLE t OWNER TO alice_nologin});
$out = sharding_q($i1, 'coord', q{SET ROLE alice_nologin; ALTER TABLE t ADD COLUMN e integer}, verbose => 1);
like($out, qr/ERROR:\s+42501: node "n1": .*alice_nologin/, 'a role the node does not let log in: 42501 naming the node');
is(on_all(q{SELECT count(*) FROM pg_attribute WHERE attrelid = 't'::regclass AND attname = 'e'}), '0 0', '... and nothing kept on any node');
