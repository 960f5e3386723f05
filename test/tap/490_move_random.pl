# Randomized online moves (contract 15.1; docs/testing.md, "The randomized
# move test"). One coordinator and two data nodes; each case is drawn from a
# seeded generator and gets a map (8 shards over n1 and n2) and a table of its
# own:
#   table kind   plain; hash-partitioned with sharding.<type>_shard_ops and
#                create_partitions; range-partitioned on another column; key
#                outside the primary key (REPLICA IDENTITY FULL); toasted
#                values; a generated column;
#   key type     text, smallint, integer, bigint, uuid, bytea;
#   move         move_shard_online(map, L, dest), or isolate(map, key, dest)
#                with the key in a spelling drawn from a list per type;
#   writes       while the copy is held (the destination's table locked in
#                SHARE mode) and while it runs, catches up and cuts over:
#                inserts, updates, toasted updates, deletes, key changes, at
#                times a TRUNCATE or an added column at one end;
#   faults       cancel or kill -9 of the coordinator's move session, an
#                immediate stop of the source or the destination (then a
#                start), while the copy is held or later; pin, unpin or
#                distribute on the map during the move;
#   concurrency  at times a second shard moved at once;
#   clean-up     for a shard move, at times deferred (sharding.move_cleanup:
#                the call returns before the source's delete, which the
#                move cleaner does; the oracle runs once it is done).
# Every write commits together with its line in a log table at the node that
# ran it (refused writes log their SQLSTATE), so the oracle is exact: after
# the move (and its recovery) the two nodes hold exactly the rows the logged
# writes imply, none lost, none twice, none resurrected, each at the node
# sharding.node_for names at the coordinator, and nothing of the move is left.
#
#   SHARDING_RANDOM_SEED=N    the seed (printed first as "# seed: N")
#   SHARDING_RANDOM_CASES=K   how many cases (case i depends only on seed and i)
#   SHARDING_RANDOM_ONLY=i,j  only these cases of the seed (replay)
#   SHARDING_RANDOM_STRICT=1  no TODO marks: every known-broken dimension fails
#   SHARDING_RANDOM_MOVE_TIMEOUT=S  seconds a move may take before it is
#                             cancelled and counted as failed (default 90,
#                             30 in a case with a known-broken dimension)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Digest::MD5 qw(md5_hex);
use Time::HiRes qw(time);
use IPC::Run;
use lib 'lib';
use ShardingNode;
use MoveTest;

my $SEED = $ENV{SHARDING_RANDOM_SEED} // 20261206;
my $CASES = $ENV{SHARDING_RANDOM_CASES} // 40;
my %ONLY = map { $_ => 1 } split /,/, ($ENV{SHARDING_RANDOM_ONLY} // '');
my $STRICT = $ENV{SHARDING_RANDOM_STRICT} // 0;
print "# seed: $SEED\n";
diag("seed: $SEED, $CASES cases (replay: SHARDING_RANDOM_SEED=$SEED SHARDING_RANDOM_CASES=$CASES)");

# Dimensions that lose rows or break the contract on the engine as it is: a
# case that has one of them runs its checks as TAP TODO (unless
# SHARDING_RANDOM_STRICT=1). Remove an entry when its fix is merged.
# Dimensions known to fail (each a TAP TODO until fixed): none since 1.4
# fixed DL-1, DL-2 and DL-3 and compares schemas. On 1.3 they were
# kind:hashpart and kind:rangepart (DL-1), every non-canonical
# spelling:<type>:<name> (DL-3), admin:pin, admin:unpin, admin:distribute
# (DL-2) and ddl:addcol-src, ddl:addcol-dst (15.1): see the CHANGELOG.
my %KNOWN_BROKEN = ();

# ------------------------------------------------------------------ the generator
# A stream of numbers in [0, 1) from md5(seed:case:n): the same on every
# machine and Perl, and case i's draws do not depend on any other case.
{
	package Rng;
	sub new { my ($c, $s) = @_; return bless { s => $s, n => 0 }, $c; }
	sub next { my $r = shift; return CORE::hex(substr(Digest::MD5::md5_hex($r->{s} . ':' . $r->{n}++), 0, 8)) / 4294967296; }
	sub below { my ($r, $n) = @_; return CORE::int($r->next * $n); }
	sub pick { my ($r, @l) = @_; return $l[ $r->below(scalar @l) ]; }
	sub chance { my ($r, $p) = @_; return $r->next < $p; }
	sub hexs { my ($r, $n) = @_; return join '', map { sprintf('%x', $r->below(16)) } 1 .. $n; }
}

our $TODO;
my %SQLTYPE = (text => 'text', int2 => 'smallint', int4 => 'integer', int8 => 'bigint', uuid => 'uuid', bytea => 'bytea');

# key(rng, type): { canon => its text output, lit => a typed SQL literal, spellings => { name => text } }.
sub key
{
	my ($r, $t) = @_;
	my ($canon, %sp);
	if ($t eq 'text')
	{
		$canon = 'k' . $r->hexs(6);
		%sp = (canonical => $canon);
	}
	elsif ($t =~ /^int/)
	{
		my $n = $t eq 'int2' ? 1 + $r->below(32000) : $t eq 'int4' ? $r->below(2_000_000_000) : $r->below(1e15);
		$canon = "$n";
		%sp = (canonical => $canon, zeros => "00$n", spaces => "  $n ", plus => "+$n", plus_zeros => "+0$n");
	}
	elsif ($t eq 'uuid')
	{
		my $h = $r->hexs(32);
		$canon = join '-', substr($h, 0, 8), substr($h, 8, 4), substr($h, 12, 4), substr($h, 16, 4), substr($h, 20);
		%sp = (canonical => $canon, upper => uc $canon, braces => "{$canon}", no_dashes => uc $h);
	}
	else
	{
		my $h = $r->hexs(2 * (1 + $r->below(6)));
		$canon = "\\x$h";
		%sp = (canonical => $canon, upper_hex => "\\x" . uc $h,
			escape => join('', map { sprintf('\\%03o', CORE::hex($_)) } $h =~ /(..)/g));
	}
	return { canon => $canon, lit => "'$canon'::$SQLTYPE{$t}", spellings => \%sp };
}

# case(i): the description of case i of the seed.
sub gen_case
{
	my $i = shift;
	my $r = Rng->new("$SEED:$i");
	my %c = (i => $i, r => $r, map => sprintf('rnd%03d', $i), tbl => sprintf('rt%03d', $i));
	$c{kind} = $r->pick(qw(plain hashpart rangepart keynotpk toast generated));
	$c{type} = $r->pick(qw(text int2 int4 int8 uuid bytea));
	my %seen;
	$c{keys} = [ grep { !$seen{ $_->{canon} }++ } map { key($r, $c{type}) } 1 .. 24 ];
	$c{how} = $r->chance(0.35) ? 'isolate' : 'move';
	if ($c{how} eq 'isolate')
	{
		my @names = sort keys %{ $c{keys}[0]{spellings} };
		$c{spelling} = $r->pick(@names);
	}
	# The change at one end while the copy is held (at most one).
	my $x = $r->next;
	$c{ddl} = $x < 0.07 ? 'truncate-src' : $x < 0.12 ? 'truncate-dst' : $x < 0.17 ? 'addcol-src' : $x < 0.22 ? 'addcol-dst' : '';
	$x = $r->next;
	$c{fault} = $x < 0.08 ? 'cancel' : $x < 0.15 ? 'kill9' : $x < 0.20 ? 'stop-src' : $x < 0.25 ? 'stop-dst' : '';
	$c{fault_when} = $r->chance(0.5) ? 'held' : 'running';
	$c{fault_delay} = $r->below(800);
	# The destination applies the stream slowly (20 ms a row, in the apply
	# worker only), so that the catch-up lasts: always before a fault that
	# lands after the copy is let go.
	$c{slow} = ($c{fault} && $c{fault_when} eq 'running') || $r->chance(0.3) ? 1 : 0;
	$x = $r->next;
	$c{admin} = $x < 0.07 ? 'pin' : $x < 0.14 ? 'unpin' : $x < 0.20 ? 'distribute' : '';
	$c{second} = $c{how} eq 'move' && $r->chance(0.2) ? 1 : 0;
	# The clean-up deferred (sharding.move_cleanup) for a shard move, drawn
	# from a stream of its own: the other draws stay what they were.
	$c{cleanup} = $c{how} eq 'move' && Rng->new("$SEED:$i:cleanup")->chance(0.4) ? 'deferred' : '';
	$c{rows} = 120 + $r->below(120);
	$c{ops1} = 40 + $r->below(80);
	$c{ops2} = 40 + $r->below(80);
	return \%c;
}

sub describe
{
	my $c = shift;
	return join ' ', "case $c->{i}:", $c->{kind}, $c->{type},
	  ($c->{how} eq 'isolate' ? "isolate($c->{spelling})" : 'move_shard_online'),
	  ($c->{second} ? 'two-moves' : ()), ($c->{cleanup} ? 'cleanup-deferred' : ()), ($c->{slow} ? 'slow-apply' : ()),
	  ($c->{ddl} ? $c->{ddl} : ()),
	  ($c->{fault} ? "$c->{fault}\@$c->{fault_when}" : ()), ($c->{admin} ? "$c->{admin}-during" : ());
}

# The dimensions a case has (the keys %KNOWN_BROKEN is written in).
sub dims
{
	my $c = shift;
	my @d = ("kind:$c->{kind}", "type:$c->{type}", "how:$c->{how}");
	push @d, "spelling:$c->{type}:$c->{spelling}" if $c->{how} eq 'isolate';
	push @d, "ddl:$c->{ddl}" if $c->{ddl};
	push @d, "fault:$c->{fault}" if $c->{fault};
	push @d, "admin:$c->{admin}" if $c->{admin};
	push @d, 'second' if $c->{second};
	push @d, "cleanup:$c->{cleanup}" if $c->{cleanup};
	return @d;
}

# ------------------------------------------------------------------ the cluster
my ($coord, $n1, $n2) = move_cluster();
my %NODE = (n1 => $n1, n2 => $n2);
my $setup = q{
CREATE FUNCTION bigval(t text) RETURNS text LANGUAGE sql IMMUTABLE
    AS $$ SELECT string_agg(md5(t || g), '') FROM generate_series(1, 80) g $$;
CREATE TABLE rnd_wlog (c integer, batch text, opno integer, n bigint, err text,
    at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (c, batch, opno));
-- rnd_run(c, batch, ops, pause): each statement in its own transaction, which
-- also logs it (its row count) in rnd_wlog; a refused one logs its SQLSTATE.
CREATE PROCEDURE rnd_run(c integer, batch text, ops text[], pause float8) LANGUAGE plpgsql AS $$
DECLARE n bigint; e text; i integer := 0; s text;
BEGIN
    FOREACH s IN ARRAY ops LOOP
        i := i + 1; e := NULL;
        BEGIN
            EXECUTE s;
            GET DIAGNOSTICS n = ROW_COUNT;
            INSERT INTO rnd_wlog (c, batch, opno, n) VALUES (c, batch, i, n);
        EXCEPTION WHEN OTHERS THEN
            e := SQLSTATE || ' ' || SQLERRM;
        END;
        IF e IS NOT NULL THEN
            INSERT INTO rnd_wlog (c, batch, opno, err) VALUES (c, batch, i, e);
        END IF;
        COMMIT;
        IF pause > 0 THEN PERFORM pg_sleep(pause); END IF;
    END LOOP;
END $$;
-- rnd_slow(): a replica trigger that sleeps in the apply worker only.
CREATE FUNCTION rnd_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid()) IN ('logical replication worker', 'logical replication apply worker') THEN
        PERFORM pg_sleep(0.02);
    END IF;
    RETURN coalesce(NEW, OLD);
END $$;
};
$coord->safe_psql('coord', "CREATE FUNCTION bigval(t text) RETURNS text LANGUAGE sql IMMUTABLE
    AS \$\$ SELECT string_agg(md5(t || g), '') FROM generate_series(1, 80) g \$\$");
$_->[0]->safe_psql($_->[1], $setup) for ([$n1, 'n1'], [$n2, 'n2']);

# sq(node, db, sql): (sqlstate or '', output, messages); never dies.
sub sq
{
	my ($node, $db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, "\\set VERBOSITY verbose\n$sql");
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	$state //= ($rc == 0 ? '' : 'psql');
	return ($state, $out, $err);
}

# bg(node, db, @statements): psql running them in the background, each its
# own -c (VERBOSITY verbose).
sub bg
{
	my ($node, $db, @sql) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d', $node->connstr($db), map { ('-c', $_) } @sql ],
		'<', '/dev/null', '>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

# wait_bg(h, seconds): 1 when it ended in time.
sub wait_bg
{
	my ($b, $secs) = @_;
	my $until = time + $secs;
	while (time < $until)
	{
		$b->{h}->pump_nb if $b->{h}->pumpable;
		return 1 unless $b->{h}->pumpable;
		usleep(50_000);
	}
	return 0;
}

sub finish_bg
{
	my $b = shift;
	eval { $b->{h}->finish; };
	eval { $b->{h}->kill_kill; } if $@;
	my ($state) = ${ $b->{err} } =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($state // (${ $b->{err} } =~ /\S/ ? 'psql' : ''), ${ $b->{out} } =~ s/\s+$//r, ${ $b->{err} });
}

# The holder: a session at the destination that holds the case's table in
# SHARE mode (the copy into it waits), and can run more in that transaction.
sub hold
{
	my ($node, $db, $tbl) = @_;
	my ($in, $out, $err) = ('', '', '');
	my $h = IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db) ],
		'<', \$in, '>', \$out, '2>', \$err);
	my $hd = { h => $h, in => \$in, out => \$out, err => \$err, n => 0 };
	hold_run($hd, "BEGIN; LOCK $tbl IN SHARE MODE") or die "the holder did not lock $tbl: $err";
	return $hd;
}

sub hold_run
{
	my ($hd, $sql) = @_;
	my $tag = 'done' . ++$hd->{n};
	${ $hd->{in} } .= "$sql;\nSELECT '$tag';\n";
	my $until = time + 60;
	while (time < $until)
	{
		eval { $hd->{h}->pump_nb; };
		return 1 if ${ $hd->{out} } =~ /\b$tag\b/;
		return 0 if $@ || !$hd->{h}->pumpable || ${ $hd->{err} } =~ /ERROR/;
		usleep(20_000);
	}
	return 0;
}

sub release
{
	my ($hd, $commit) = @_;
	return unless $hd;
	${ $hd->{in} } .= ($commit ? "COMMIT;\n" : "ROLLBACK;\n") . "\\q\n";
	eval { $hd->{h}->finish; };
	eval { $hd->{h}->kill_kill; } if $@;
}

# ------------------------------------------------------------------ one case
sub run_case
{
	my $c = shift;
	my $r = $c->{r};
	my $desc = describe($c);
	my @dims = dims($c);
	my @broken = grep { $KNOWN_BROKEN{$_} } @dims;
	local $TODO = (!$STRICT && @broken) ? 'known broken: ' . join(', ', map { "$_ ($KNOWN_BROKEN{$_})" } @broken) : undef;
	my $move_timeout = $ENV{SHARDING_RANDOM_MOVE_TIMEOUT} // (@broken ? 30 : 90);
	my ($map, $t, $type, $sqlt) = ($c->{map}, $c->{tbl}, $c->{type}, $SQLTYPE{ $c->{type} });
	my $ops = "sharding.${type}_shard_ops";
	my $cols = "id bigint NOT NULL, k $sqlt NOT NULL, v text NOT NULL";
	my $ddl = {
		plain => "CREATE TABLE $t ($cols, PRIMARY KEY (k, id))",
		hashpart => "CREATE TABLE $t ($cols, PRIMARY KEY (k, id)) PARTITION BY HASH (k $ops); SELECT sharding.create_partitions('$t', 8)",
		rangepart => "CREATE TABLE $t ($cols, PRIMARY KEY (id, k)) PARTITION BY RANGE (id);"
		  . " CREATE TABLE ${t}_lo PARTITION OF $t FOR VALUES FROM (MINVALUE) TO (100);"
		  . " CREATE TABLE ${t}_hi PARTITION OF $t FOR VALUES FROM (100) TO (MAXVALUE)",
		keynotpk => "CREATE TABLE $t ($cols, PRIMARY KEY (id)); CREATE INDEX ON $t (k); ALTER TABLE $t REPLICA IDENTITY FULL",
		toast => "CREATE TABLE $t ($cols, big text, btag text, PRIMARY KEY (k, id))",
		generated => "CREATE TABLE $t ($cols, g text GENERATED ALWAYS AS (v || '#' || id::text) STORED, PRIMARY KEY (k, id))",
	}->{ $c->{kind} };
	my $xt = "x$t";
	for ([$coord, 'coord'], [$n1, 'n1'], [$n2, 'n2'])
	{
		$_->[0]->safe_psql($_->[1], $ddl);
		$_->[0]->safe_psql($_->[1], "CREATE TABLE $xt (id bigint PRIMARY KEY, k $sqlt NOT NULL, v text)") if $c->{admin} eq 'distribute';
	}
	$coord->safe_psql('coord', "SELECT sharding.create_map('$map', 8, ARRAY['n1', 'n2']); SELECT sharding.distribute('$t', 'k', '$map')");
	for my $n (qw(n1 n2))
	{
		wait_for_sql($NODE{$n}, $n, "SELECT count(*) FROM sharding.distributed_tables WHERE map = '$map'", '1');
	}

	# Facts about the keys, from the coordinator.
	my @keys = @{ $c->{keys} };
	my %K = map { $_->{canon} => $_ } @keys;
	my $vals = join ',', map { "($_->{lit})" } @keys;
	for (split /\n/, $coord->safe_psql('coord', "SELECT k::text || '|' || sharding.logical_shard('$map', k) || '|' || sharding.node_for('$map', k) FROM (VALUES $vals) s(k)"))
	{
		my ($k, $l, $n) = split /\|/;
		$K{$k}{logical} = $l;
		$K{$k}{owner} = $n;
	}

	# The initial rows.
	my %state;    # id -> { k, v, btag }
	for my $id (1 .. $c->{rows})
	{
		my $k = $r->pick(@keys);
		$state{$id} = { k => $k->{canon}, v => "i$id", btag => "i$id" };
	}
	my $rowsql = sub {
		my ($id, $row) = @_;
		my $lit = $K{ $row->{k} }{lit};
		return $c->{kind} eq 'toast' ? "($id, $lit, '$row->{v}', bigval('$row->{btag}'), '$row->{btag}')" : "($id, $lit, '$row->{v}')";
	};
	my $collist = $c->{kind} eq 'toast' ? '(id, k, v, big, btag)' : '(id, k, v)';
	my %start_owner = map { $_ => $K{$_}{owner} } keys %K;
	for my $n (qw(n1 n2))
	{
		my @ids = grep { $start_owner{ $state{$_}{k} } eq $n } sort { $a <=> $b } keys %state;
		next unless @ids;
		$NODE{$n}->safe_psql($n, "INSERT INTO $t $collist VALUES " . join(',', map { $rowsql->($_, $state{$_}) } @ids));
	}
	my %xstate;
	if ($c->{admin} eq 'distribute')
	{
		for my $id (1 .. 60) { $xstate{$id} = { k => $r->pick(@keys)->{canon}, v => "x$id" }; }
		for my $n (qw(n1 n2))
		{
			my @ids = grep { $start_owner{ $xstate{$_}{k} } eq $n } sort { $a <=> $b } keys %xstate;
			$NODE{$n}->safe_psql($n, "INSERT INTO $xt VALUES " . join(',', map { "($_, $K{ $xstate{$_}{k} }{lit}, '$xstate{$_}{v}')" } @ids)) if @ids;
		}
	}

	# What moves: a shard that has rows, or one key of it.
	my @with_rows = do { my %s; grep { !$s{$_}++ } map { $K{ $state{$_}{k} }{logical} } sort { $a <=> $b } keys %state };
	@with_rows = sort { $a <=> $b } @with_rows;
	my $L = $r->pick(@with_rows);
	my @Lkeys = grep { $K{$_}{logical} == $L } sort keys %K;
	my $src = $K{ $Lkeys[0] }{owner};
	my $dst = $src eq 'n1' ? 'n2' : 'n1';
	my ($S, $D) = ($NODE{$src}, $NODE{$dst});
	my ($iso, $L2);
	my @moving;    # the keys whose rows move
	if ($c->{how} eq 'isolate')
	{
		my @kr = grep { my $k = $_; grep { $state{$_}{k} eq $k } keys %state } @Lkeys;
		$iso = $K{ $r->pick(@kr) };
		@moving = ($iso->{canon});
	}
	else
	{
		@moving = @Lkeys;
		if ($c->{second})
		{
			my @others = grep { $_ != $L } do { my %s; grep { !$s{$_}++ } map { $K{$_}{logical} } grep { $K{$_}{owner} eq $src } sort keys %K };
			@others = sort { $a <=> $b } @others;
			if (@others) { $L2 = $r->pick(@others); push @moving, grep { $K{$_}{logical} == $L2 } sort keys %K; }
			else { $c->{second} = 0; }
		}
	}
	# The admin's key: another key of the shard (for isolate) or one of it;
	# a key pinned to the source (before or during the move) does not move.
	my @adm = grep { !$iso || $_ ne $iso->{canon} } @Lkeys;
	my $akey = @adm ? $K{ $r->pick(@adm) } : undef;
	# A shard move whose shard has no other key than the admin's pinned
	# one would move no row: no admin call then (seed 4242, case 15 checked
	# where the moved rows went when none had moved).
	$akey = undef if $akey && $c->{how} eq 'move' && $c->{admin} eq 'unpin' && !grep { $_ ne $akey->{canon} } @Lkeys;
	@moving = grep { $_ ne $akey->{canon} } @moving if $akey && $c->{admin} =~ /^(pin|unpin)$/;
	my %moving = map { $_ => 1 } @moving;
	if ($c->{admin} eq 'unpin' && $akey)
	{
		# Pinned where it is before the move starts (as isolate leaves it).
		$coord->safe_psql('coord', "SELECT sharding.pin('$map', $akey->{lit}, '$src')");
	}
	my $what = $c->{how} eq 'isolate' ? "isolate of key $iso->{canon} (shard $L)" : "shard $L" . (defined $L2 ? " and shard $L2" : '');
	note("$desc: $what from $src to $dst");

	# The writes: batches of statements, each logged where it runs.
	my $next_id = { b1 => 10000, b2 => 20000, d2 => 30000 };
	my %batch;    # batch -> [ { op, id, k, v } ]
	my $gen = sub {
		my ($bt, $node, $nops, $focus) = @_;
		my %model = map { $_ => { %{ $state{$_} } } } grep { $start_owner{ $state{$_}{k} } eq $node } keys %state;
		my @nk = grep { $start_owner{$_} eq $node } sort keys %K;
		my @fk = grep { $moving{$_} } @nk;
		return $batch{$bt} = [] unless @nk;
		my @list;
		for my $o (1 .. $nops)
		{
			my @ids = sort { $a <=> $b } keys %model;
			my @fids = grep { $moving{ $model{$_}{k} } } @ids;
			my $x = $r->next;
			my $v = "$bt-$o";
			my $id = $focus && @fids && $r->chance(0.7) ? $r->pick(@fids) : @ids ? $r->pick(@ids) : undef;
			if (!defined $id || $x < 0.3)
			{
				my $k = $focus && @fk && $r->chance(0.7) ? $r->pick(@fk) : $r->pick(@nk);
				$id = ++$next_id->{$bt};
				push @list, { op => 'insert', id => $id, k => $k, v => $v, btag => $v };
				$model{$id} = { k => $k, v => $v, btag => $v };
			}
			elsif ($x < 0.55) { push @list, { op => 'update', id => $id, v => $v }; $model{$id}{v} = $v; }
			elsif ($x < 0.65 && $c->{kind} eq 'toast') { push @list, { op => 'bigupd', id => $id, btag => $v }; $model{$id}{btag} = $v; }
			elsif ($x < 0.8)
			{
				my $k = $r->pick(@nk);
				push @list, { op => 'rekey', id => $id, k => $k, v => $v };
				$model{$id}{k} = $k;
				$model{$id}{v} = $v;
			}
			else { push @list, { op => 'delete', id => $id }; delete $model{$id}; }
		}
		$batch{$bt} = \@list;
	};
	my $sql_of = sub {
		my $o = shift;
		return {
			insert => sub { $c->{kind} eq 'toast'
				  ? "INSERT INTO $t (id, k, v, big, btag) VALUES ($o->{id}, $K{$o->{k}}{lit}, '$o->{v}', bigval('$o->{v}'), '$o->{v}')"
				  : "INSERT INTO $t (id, k, v) VALUES ($o->{id}, $K{$o->{k}}{lit}, '$o->{v}')" },
			update => sub { "UPDATE $t SET v = '$o->{v}' WHERE id = $o->{id}" },
			bigupd => sub { "UPDATE $t SET btag = '$o->{btag}', big = bigval('$o->{btag}') WHERE id = $o->{id}" },
			rekey => sub { "UPDATE $t SET k = $K{$o->{k}}{lit}, v = '$o->{v}' WHERE id = $o->{id}" },
			delete => sub { "DELETE FROM $t WHERE id = $o->{id}" },
			truncate => sub { "TRUNCATE $t" },
			addcol => sub { "ALTER TABLE $t ADD COLUMN extra integer" },
		}->{ $o->{op} }->();
	};
	my $call = sub {
		my ($b, $pause) = @_;
		my $arr = join(',', map { '$q$' . $sql_of->($_) . '$q$' } @{ $batch{$b} });
		return "CALL rnd_run($c->{i}, '$b', ARRAY[$arr]::text[], $pause)";
	};
	$gen->('b1', $src, $c->{ops1}, 1);
	# The change at one end while the copy is held: at the source, among the
	# first batch's statements; at the destination, in the holder's transaction.
	my $ddl_at = $c->{ddl} =~ /src$/ ? 'src' : $c->{ddl} =~ /dst$/ ? 'dst' : '';
	my $ddl_op = $c->{ddl} =~ /^truncate/ ? 'truncate' : $c->{ddl} =~ /^addcol/ ? 'addcol' : '';
	if ($ddl_at eq 'src')
	{
		splice @{ $batch{b1} }, $r->below(scalar @{ $batch{b1} }), 0, { op => $ddl_op };
	}

	# ---------------------------------------------------------------- the move
	$D->safe_psql($dst, "CREATE TRIGGER rnd_slow BEFORE INSERT OR UPDATE OR DELETE ON $t FOR EACH ROW EXECUTE FUNCTION rnd_slow();"
		  . " ALTER TABLE $t ENABLE REPLICA TRIGGER rnd_slow") if $c->{slow};
	my $hd = hold($D, $dst, $t);
	my $move_sql = $c->{how} eq 'isolate'
	  ? "SELECT sharding.isolate('$map', \$k\$$iso->{spellings}{$c->{spelling}}\$k\$, '$dst')"
	  : "SELECT sharding.move_shard_online('$map', $L, '$dst')";
	my @set = $c->{cleanup} ? ("SET sharding.move_cleanup = $c->{cleanup}") : ();
	my @mv = (bg($coord, 'coord', @set, $move_sql));
	push @mv, bg($coord, 'coord', @set, "SELECT sharding.move_shard_online('$map', $L2, '$dst')") if defined $L2;
	my $nmoves = scalar @mv;
	my $slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name ~ '^sharding_move_[0-9a-f]{6}_${map}_'";
	my ($held, $ended) = (0, 0);
	my $until = time + 60;
	while (time < $until)
	{
		$held = $S->safe_psql($src, "SELECT ($slots) >= $nmoves") eq 't'
		  && $D->safe_psql($dst, "SELECT count(*) >= $nmoves FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()") eq 't';
		last if $held;
		for (@mv) { $_->{h}->pump_nb if $_->{h}->pumpable; $ended = 1 unless $_->{h}->pumpable; }
		last if $ended;
		usleep(50_000);
	}
	ok($held, "$desc: the move is held in its copy (slot at the source, the copy waiting at the destination)")
	  or diag("$desc: " . ($ended ? 'a move ended before its copy' : 'not held after 60 s'));

	# While held: the first batch at the source, the admin's call, the
	# destination's change.
	my $b1 = bg($S, $src, 'SET lock_timeout = \'10s\'', $call->('b1', 0));
	wait_bg($b1, 120);
	my ($b1_state, undef, $b1_err) = finish_bg($b1);
	diag("$desc: first batch: $b1_err") if $b1_state ne '';
	my ($admin_state, $admin_err) = ('', '');
	if ($c->{admin} && ($akey || $c->{admin} eq 'distribute'))
	{
		my $sql = {
			pin => sub { "SELECT sharding.pin('$map', $akey->{lit}, '$src')" },
			unpin => sub { "SELECT sharding.unpin('$map', $akey->{lit})" },
			distribute => sub { "SELECT sharding.distribute('$xt', 'k', '$map')" },
		}->{ $c->{admin} }->();
		($admin_state, undef, $admin_err) = sq($coord, 'coord', $sql);
		# A pin of one of the moving shard's keys is refused while it moves
		# (55006, contract 15.1): in a shard move the key moves with the
		# shard after all (isolate moves its own key only).
		if ($c->{admin} eq 'pin' && $c->{how} ne 'isolate' && $akey && $admin_state eq '55006'
			&& !$moving{ $akey->{canon} })
		{
			$moving{ $akey->{canon} } = 1;
			push @moving, $akey->{canon};
		}
	}
	if ($ddl_at eq 'dst')
	{
		my $sql = $ddl_op eq 'truncate' ? "TRUNCATE $t" : "ALTER TABLE $t ADD COLUMN extra integer";
		# logged in the same transaction
		ok(hold_run($hd, "INSERT INTO rnd_wlog (c, batch, opno, n) VALUES ($c->{i}, 'h', 1, 0); $sql"), "$desc: $ddl_op at the destination while the copy is held");
		$batch{h} = [ { op => $ddl_op } ];
	}

	# A fault while held.
	my $fault_done = '';
	my $do_fault = sub {
		return if !$c->{fault} || $fault_done;
		my $pid = $coord->safe_psql('coord', "SELECT string_agg(pid::text, ',') FROM sharding.move_journal WHERE map = '$map' AND phase NOT IN ('done', 'failed', 'cancelled') AND pid IS NOT NULL");
		$fault_done = "$c->{fault} (phase "
		  . $coord->safe_psql('coord', "SELECT string_agg(phase, ',') FROM sharding.move_journal WHERE map = '$map' AND phase NOT IN ('done', 'failed', 'cancelled')") . ')';
		if ($c->{fault} eq 'cancel') { $coord->safe_psql('coord', "SELECT pg_cancel_backend(p::int) FROM unnest(string_to_array('$pid', ',')) p") if $pid; }
		elsif ($c->{fault} eq 'kill9') { if ($pid) { kill 'KILL', (split /,/, $pid)[0]; } }
		elsif ($c->{fault} eq 'stop-src') { $S->stop('immediate'); $S->start; }
		elsif ($c->{fault} eq 'stop-dst') { $D->stop('immediate'); $D->start; }
	};
	$do_fault->() if $c->{fault_when} eq 'held';
	if ($c->{fault} eq 'kill9' && $fault_done) { usleep(200_000); wait_for_restart($coord); }

	# Let the copy go; the second batches run during the copy, the catch-up,
	# the cutover and after it, at the source and at the destination.
	$gen->('b2', $src, $c->{ops2}, 1);
	$gen->('d2', $dst, 30, 0);
	my $b2 = bg($S, $src, $call->('b2', 0.01));
	my $d2 = bg($D, $dst, 'SET lock_timeout = \'20s\'', $call->('d2', 0.01));
	release($hd, 1);
	if ($c->{fault_when} eq 'running' && $c->{fault})
	{
		usleep($c->{fault_delay} * 1000);
		$do_fault->();
		if ($c->{fault} eq 'kill9' && $fault_done) { usleep(200_000); wait_for_restart($coord); }
	}
	my (@outcome, @messages);
	for my $m (@mv)
	{
		my $in_time = wait_bg($m, $move_timeout);
		if (!$in_time)
		{
			$coord->safe_psql('coord', "SELECT pg_cancel_backend(pid) FROM sharding.move_journal WHERE map = '$map' AND pid IS NOT NULL AND phase NOT IN ('done', 'failed', 'cancelled')");
			wait_bg($m, 30);
		}
		my ($st, $out, $err) = finish_bg($m);
		push @outcome, $in_time ? ($st eq '' ? 'ok' : $st) : 'timeout';
		push @messages, $1 if $err =~ /ERROR:\s+(.{1,110})/;
		diag("$desc: move: $err") if $st ne "" && !$c->{fault} && !$ddl_op;
	}
	wait_bg($_, 120) for ($b2, $d2);
	for ([$b2, 'b2'], [$d2, 'd2'])
	{
		my ($st, undef, $err) = finish_bg($_->[0]);
		diag("$desc: batch $_->[1]: $err") if $st ne '' && !$c->{fault};
	}
	# Recovery, after a fault (or a move that did not end).
	if ($c->{fault} || grep { $_ ne 'ok' } @outcome)
	{
		wait_for_restart($coord);
		sq($coord, 'coord', 'SELECT sharding._move_recover()');
		wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE map = '$map' AND phase NOT IN ('done', 'failed', 'cancelled')", '0', 90);
	}
	# A deferred clean-up ends by itself (the move cleaner), before the
	# oracle reads both nodes.
	if ($c->{cleanup})
	{
		ok(wait_for_sql($coord, 'coord', "SELECT count(*) FROM sharding.move_journal WHERE map = '$map' AND phase NOT IN ('done', 'failed', 'cancelled')", '0', 90),
			"$desc: the deferred clean-up ends without a call");
	}

	# ---------------------------------------------------------------- the oracle

	my $expect = $ddl_op || $c->{fault} ? undef : 'ok';
	$expect = '55000' if $ddl_op && !$c->{fault};
	my $outcome = join ',', @outcome;
	if (defined $expect)
	{
		is($outcome, join(',', ($expect) x $nmoves), "$desc: " . ($nmoves > 1 ? 'the moves' : 'the move')
			  . ($expect eq 'ok' ? ($nmoves > 1 ? ' succeed' : ' succeeds') : ($nmoves > 1 ? ' fail' : ' fails') . " with $expect"));
	}
	if ($c->{admin} && ($akey || $c->{admin} eq 'distribute'))
	{
		is($admin_state, '55006', "$desc: $c->{admin} on the map during the move is refused with 55006") or diag($admin_err);
	}

	# Replay the logs: every write whose statement committed.
	my %log;    # batch -> opno -> [n, err]
	for my $n (qw(n1 n2))
	{
		for (split /\n/, $NODE{$n}->safe_psql($n, "SELECT batch || '|' || opno || '|' || coalesce(n, -1) || '|' || coalesce(left(err, 5), '') FROM rnd_wlog WHERE c = $c->{i}"))
		{
			my ($bn, $o, $cnt, $e) = split /\|/, $_, -1;
			$log{$bn}{$o} = [ $cnt, $e ];
		}
	}
	my ($anomalies, $stale, $refused, $committed) = (0, 0, 0, 0);
	my @anom;
	my %exp = %state;
	$exp{$_} = { %{ $exp{$_} } } for keys %exp;
	my $truncate = sub {
		my $node = shift;
		delete $exp{$_} for grep { $start_owner{ $exp{$_}{k} } eq $node } keys %exp;
	};
	# The destination's change comes first (it committed before the copy went on).
	$truncate->($dst) if $ddl_at eq 'dst' && $ddl_op eq 'truncate' && $log{h}{1};
	for my $bn (qw(b1 b2 d2))
	{
		my $node = $bn eq 'd2' ? $dst : $src;
		my $opno = 0;
		for my $o (@{ $batch{$bn} // [] })
		{
			$opno++;
			my $l = $log{$bn}{$opno};
			next unless $l;    # never ran (a stop ended the batch)
			if ($l->[1] ne '') { $refused++; next; }
			$committed++;
			my $n = $l->[0];
			if ($o->{op} eq 'truncate') { $truncate->($node); next; }
			next if $o->{op} eq 'addcol';
			my $have = exists $exp{ $o->{id} };
			my $want = $o->{op} eq 'insert' ? 1 : $have ? 1 : 0;
			if ($n != $want)
			{
				# A write routed to the source after the switch finds no row
				# there (zero-row writes through stale routing, documented).
				if ($n == 0 && $have && $node eq $src && $moving{ $exp{ $o->{id} }{k} }) { $stale++; }
				else { $anomalies++; push @anom, "$bn#$opno $o->{op} id $o->{id}: $n rows, expected $want"; }
			}
			next if $n == 0;
			if ($o->{op} eq 'insert') { $exp{ $o->{id} } = { k => $o->{k}, v => $o->{v}, btag => $o->{v} }; }
			elsif ($o->{op} eq 'update') { $exp{ $o->{id} }{v} = $o->{v}; }
			elsif ($o->{op} eq 'bigupd') { $exp{ $o->{id} }{btag} = $o->{btag}; }
			elsif ($o->{op} eq 'rekey') { $exp{ $o->{id} }{k} = $o->{k}; $exp{ $o->{id} }{v} = $o->{v}; }
			elsif ($o->{op} eq 'delete') { delete $exp{ $o->{id} }; }
		}
	}
	is($anomalies, 0, "$desc: every committed update and delete found the rows the log implies ($committed committed, $refused refused, $stale stale)")
	  or diag("$desc: " . join('; ', @anom[0 .. ($#anom < 5 ? $#anom : 5)]));

	# The nodes' rows, each with the node node_for names at the coordinator.
	my %owner_now = map { my ($k, $n) = split /\|/; ($k => $n) } split /\n/,
	  $coord->safe_psql('coord', "SELECT k::text || '|' || sharding.node_for('$map', k) FROM (VALUES $vals) s(k)");
	my $extra_cols = { toast => " || '|' || coalesce(btag, 'NULL') || '|' || (big IS NOT DISTINCT FROM bigval(btag))::text",
		generated => " || '|' || coalesce(g, 'NULL')" }->{ $c->{kind} } // '';
	my $exp_row = sub {
		my ($id, $e) = @_;
		my $s = "$id|$e->{k}|$e->{v}";
		$s .= "|$e->{btag}|true" if $c->{kind} eq 'toast';
		$s .= "|$e->{v}#$id" if $c->{kind} eq 'generated';
		return $s;
	};
	my (%got, @dup);
	my %at;    # row -> node
	for my $n (qw(n1 n2))
	{
		for (split /\n/, $NODE{$n}->safe_psql($n, "SELECT id || '|' || k::text || '|' || v$extra_cols FROM $t"))
		{
			push @dup, "$_ (at $n" . ($at{$_} ? " and $at{$_})" : ')') if $got{$_}++;
			$at{$_} = $n;
		}
	}
	my %want = map { $exp_row->($_, $exp{$_}) => $_ } keys %exp;
	my @missing = sort grep { !$got{$_} } keys %want;
	my @extra = sort grep { !$want{$_} } keys %got;
	my @misplaced = sort grep { $want{$_} && $at{$_} ne $owner_now{ $exp{ $want{$_} }{k} } } keys %got;
	my $small = sub { my @l = @_; return join(', ', @l[0 .. ($#l < 4 ? $#l : 4)]) . (@l > 5 ? ', ...' : ''); };
	my $show = sub {
		my @l = @_;
		return $small->(map {
			my ($id, $k) = split /\|/;
			my $e = $exp{$id};
			"$_ [shard " . ($K{$k} ? $K{$k}{logical} : '?') . ($moving{$k} ? ', moved' : '') . (exists $at{$_} ? ", at $at{$_}" : '')
			  . ($e && $e->{k} ne $k ? ", log: key $e->{k}" : '') . ']' } @l);
	};
	is(scalar @missing, 0, "$desc: no row lost (" . scalar(keys %want) . ' rows expected)')
	  or diag("seed $SEED $desc: missing " . scalar(@missing) . ": " . $show->(@missing));
	is(scalar(@extra) + scalar(@dup), 0, "$desc: no row duplicated, resurrected or changed")
	  or diag("seed $SEED $desc: extra " . scalar(@extra) . ": " . $show->(@extra) . (@dup ? "; twice: " . $small->(@dup) : ''));
	is(scalar @misplaced, 0, "$desc: every row is at the node node_for names")
	  or diag("seed $SEED $desc: misplaced " . scalar(@misplaced) . ": " . $show->(@misplaced));
	# The moved keys: only at their owner now (the destination after a
	# switch, the source after a rollback), none left at the other node.
	my %moved_at = (n1 => 0, n2 => 0);
	for (keys %got) { my (undef, $k) = split /\|/; $moved_at{ $at{$_} }++ if $moving{$k}; }
	my %owners = map { $owner_now{$_} => 1 } @moving;
	my $where = join(',', sort keys %owners);
	my $other = $where eq 'n1' ? 'n2' : $where eq 'n2' ? 'n1' : '';
	my $switched = $where eq $dst ? 'switched' : $where eq $src ? 'rolled back' : 'split';
	is($other ? $moved_at{$other} : -1, 0, "$desc: the moved rows are only at $where ($switched; $moved_at{n1} at n1, $moved_at{n2} at n2)");
	if (defined $expect && $expect eq 'ok')
	{
		is($where, $dst, "$desc: node_for names the destination for every moved key");
	}
	if ($c->{admin} eq 'distribute')
	{
		my %xw = map { ("$_|$xstate{$_}{k}|$xstate{$_}{v}" => 1) } keys %xstate;
		my ($xlost, $xbad) = (0, 0);
		my %xg;
		for my $n (qw(n1 n2))
		{
			for (split /\n/, $NODE{$n}->safe_psql($n, "SELECT id || '|' || k::text || '|' || v FROM $xt"))
			{
				$xg{$_}++;
				my (undef, $k) = split /\|/;
				# Refused while the map's shard moves (55006), the table is
				# not distributed: its rows stay where they were written.
				my $want_at = $admin_state eq '55006' ? $start_owner{$k} : $owner_now{$k};
				$xbad++ if !$xw{$_} || $xg{$_} > 1 || $want_at ne $n;
			}
		}
		$xlost = grep { !$xg{$_} } keys %xw;
		is("$xlost/$xbad", '0/0', "$desc: the table distributed during the move keeps its rows, each where it belongs (lost/extra or misplaced)");
	}
	my $lq = qq{SELECT (SELECT count(*) FROM pg_publication WHERE pubname ~ '^sharding_move_[0-9a-f]{6}_${map}_')
		|| '/' || (SELECT count(*) FROM pg_subscription WHERE subname ~ '^sharding_move_[0-9a-f]{6}_${map}_')
		|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name ~ '^sharding_move_[0-9a-f]{6}_${map}_')
		|| '/' || (SELECT count(*) FROM sharding.frozen_shards WHERE map = '$map')
		|| '/' || (SELECT count(*) FROM sharding.move_decoding WHERE map = '$map')};
	is("n1:" . $n1->safe_psql('n1', $lq) . " n2:" . $n2->safe_psql('n2', $lq) . " coord:"
		  . $coord->safe_psql('coord', "SELECT count(*) FROM sharding.move_journal WHERE map = '$map' AND phase NOT IN ('done', 'failed', 'cancelled')"),
		'n1:0/0/0/0/0 n2:0/0/0/0/0 coord:0', "$desc: nothing of the move is left");
	$fault_done =~ s/\(phase \)/(after the move ended)/;
	return { desc => $desc, outcome => $outcome . (@messages ? " [$messages[0]]" : ''), fault => $fault_done, missing => scalar @missing,
		extra => scalar(@extra) + scalar(@dup), misplaced => scalar @misplaced, dims => \@dims };
}

# ------------------------------------------------------------------ the run
my $t0 = time;
my @summary;
my %bydim;
for my $i (1 .. $CASES)
{
	next if %ONLY && !$ONLY{$i};
	my $c = gen_case($i);
	my $t = time;
	my $first = Test::More->builder->current_test;
	my $res = run_case($c);
	my @d = (Test::More->builder->details)[ $first .. Test::More->builder->current_test - 1 ];
	my $failed = grep { !$_->{actual_ok} } @d;
	push @summary, sprintf('%s -> %s%s; lost %d, extra %d, misplaced %d; %d of %d checks failed (%.0f s)', $res->{desc}, $res->{outcome},
		$res->{fault} ? " after $res->{fault}" : '', $res->{missing}, $res->{extra}, $res->{misplaced}, $failed, scalar @d, time - $t);
	for my $dim (@{ $res->{dims} })
	{
		$bydim{$dim} //= [ 0, 0, 0 ];
		$bydim{$dim}[0]++;
		$bydim{$dim}[1]++ if $failed;
		$bydim{$dim}[2]++ if $res->{missing} || $res->{extra} || $res->{misplaced};
	}
}
diag("seed $SEED:\n" . join("\n", @summary) . sprintf("\n%d cases in %.0f s", scalar @summary, time - $t0));
diag("by dimension (cases, cases with a failed check, cases with rows lost, extra or misplaced):\n"
	  . join("\n", map { sprintf('%-28s %3d %3d %3d%s', $_, @{ $bydim{$_} }[0 .. 2], $KNOWN_BROKEN{$_} ? '  (known broken)' : '') }
		  map { $_->[0] } sort { $a->[1] cmp $b->[1] } map { [ $_, $_ ] } keys %bydim));
done_testing();
