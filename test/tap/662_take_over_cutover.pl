# The coordinator fails over while a move is in its cutover (docs/nodes.md,
# "Failover of the coordinator"; CONTRACT 15.3), once before and once after
# its owner switch committed.
#
# Instance c1 holds the coordinator (database coord), c2 its streaming
# standby; instance d holds the data nodes n1 and n2. Map m has 6 logical
# shards over n1 and n2, 3000 rows of table docs. The move of shard S from
# n1 to n2 is held in its cutover, deterministically:
#
# A. Before the switch: a session at c1 holds the row of shard S in
#    sharding.shards (FOR UPDATE), so the switch waits for it (with
#    sharding.move_freeze_timeout raised to 10 min): the journal says
#    'cutover', n1 has frozen the shard, n2 holds the copied rows. c1 is
#    killed (stop immediate), c2 promoted, take_over() run: the move is rolled
#    back (every row at n1, none at n2, node_for names n1, the shard writable
#    at n1 again).
# B. After the switch: c2 runs the same move, held the same way; both nodes'
#    configuration subscriptions are disabled and then the hold let go: the
#    switch commits at c2 (journal 'cleanup') and reaches no node, the
#    move's finish waits for the source to show it. c2 is killed, its standby
#    c3 promoted, take_over() run: the move is finished, never undone (every
#    row at n2, none at n1, node_for names n2 everywhere).
# In both, the old coordinator started again changes nothing on a node: its
# recovery of the move, its moves and its attach are refused (55000 naming
# the new coordinator).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib 'lib';
use ShardingNode;

my @nodes = qw(n1 n2);
my $c1 = sharding_node('c1', db => 'coord', conf => "wal_retrieve_retry_interval = 200ms\nwal_keep_size = '256MB'");
my $d = sharding_node('d', db => 'postgres', conf => 'wal_retrieve_retry_interval = 200ms');
my %dsn = map { $_ => sharding_dsn($d, $_) } @nodes;
sub n { my ($n, $sql, %o) = @_; return sharding_q($d, $n, $sql, %o); }
sub q1 { my ($sql, %o) = @_; return sharding_q($c1, 'coord', $sql, %o); }
my ($c2, $c3, $c4);
sub q2 { my ($sql, %o) = @_; return sharding_q($c2, 'coord', $sql, %o); }
sub q3 { my ($sql, %o) = @_; return sharding_q($c3, 'coord', $sql, %o); }
sub q4 { my ($sql, %o) = @_; return sharding_q($c4, 'coord', $sql, %o); }
sub lag_text { my ($ms) = @_; return defined $ms ? "${ms}ms" : "timeout (last: $ShardingNode::last_wait)"; }

for my $n (@nodes)
{
	n('postgres', "CREATE DATABASE $n");
	n($n, $SQLSTATE_OF . 'CREATE EXTENSION sharding; CREATE TABLE docs (k text PRIMARY KEY, v integer)');
}
$c1->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($c1, 'coord') . "'");
is( (split /\n/, q1(<<"SQL"))[-1],
CREATE TABLE docs (k text PRIMARY KEY, v integer);
SELECT sharding.add_node('n1', '$dsn{n1}'), sharding.add_node('n2', '$dsn{n2}');
SELECT sharding.create_map('m', 6, ARRAY['n1', 'n2']);
SELECT sharding.distribute('docs', 'k', 'm');
SELECT sharding.attach_node('n1'), sharding.attach_node('n2');
SELECT 'configured';
SQL
	'configured', 'c1: map m over n1 and n2, both attached');
for my $n (@nodes)
{
	n($n, "INSERT INTO docs SELECT 'key-' || i, i FROM generate_series(1, 3000) AS i WHERE sharding.node_for('m', 'key-' || i) = '$n'");
}
my $S = q1("SELECT min(logical) FROM sharding.shards WHERE map = 'm' AND node = 'n1'");
# rows/sum of shard S at a node.
sub shard_at
{
	my ($n) = @_;
	return n($n, "SELECT count(*) || '/' || coalesce(sum(v), 0) FROM docs WHERE sharding.logical_shard('m', k) = $S");
}
my $rows = q{SELECT count(*) || '/' || coalesce(sum(v), 0) FROM docs};
sub total
{
	my ($count, $sum) = (0, 0);
	for my $n (@nodes) { my ($c, $s) = split m{/}, n($n, $rows); $count += $c; $sum += $s; }
	return "$count/$sum";
}
my $sum_S = shard_at('n1');
like($sum_S, qr{^[1-9]\d*/\d+$}, "shard $S is at n1 ($sum_S rows/sum)");
is(total(), '3000/4501500', '3000 rows on n1 and n2');
# New keys: one of shard S, one of another shard n1 owns.
my ($new_S, $new_S2, $new_S3) = split /\n/, n('n1', "SELECT 'new-' || i FROM generate_series(1, 10000) AS i WHERE sharding.logical_shard('m', 'new-' || i) = $S ORDER BY i LIMIT 3");
my @other = map { n('n1', "SELECT 'other-$_-' || i FROM generate_series(1, 10000) AS i WHERE sharding.logical_shard('m', 'other-$_-' || i) <> $S "
	  . "AND sharding.node_for('m', 'other-$_-' || i) = 'n1' ORDER BY i LIMIT 1") } 1 .. 4;
# The SQLSTATE of inserting key at node ('' if it succeeds; the row stays).
my $v = 100000;
sub write_at { my ($n, $key) = @_; $v++; return n($n, "SELECT sqlstate_of(\$\$INSERT INTO docs VALUES ('$key', $v)\$\$)"); }

# Every node's configuration of map m, as c-side text.
my $config = q{SELECT string_agg(map || '/' || logical || '/' || node || '/' || epoch, ',' ORDER BY map, logical) FROM sharding.shards};
my $owner = "SELECT sharding.node_for('m', '$new_S')";
sub owners { my ($q) = @_; return join(' ', $q->($owner), map { n($_, $owner) } @nodes); }
# What a move leaves at the nodes: publications, subscriptions, slots of
# moves, frozen shards.
my $leftovers = q{SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'sharding_move%')
	|| '/' || (SELECT count(*) FROM sharding.frozen_shards)};
sub leftovers { return join(' ', map { n($_, $leftovers) } @nodes); }
my $journal = "SELECT phase || '/' || undone FROM sharding.move_journal WHERE map = 'm' AND logical = $S ORDER BY move DESC LIMIT 1";

# hold_switch(node): a session at that coordinator holds shard S's row of
# sharding.shards; the move's owner switch waits for it. Returns the session.
my $holding = "query = 'SELECT pg_sleep(600)'";
sub hold_switch
{
	my ($c) = @_;
	my $h = sharding_start($c, 'coord',
		"BEGIN; SELECT 1 FROM sharding.shards WHERE map = 'm' AND logical = $S FOR UPDATE; SELECT pg_sleep(600)");
	ok(defined sharding_wait($c, 'coord', "SELECT count(*) FROM pg_stat_activity WHERE $holding AND wait_event = 'PgSleep'", '1', 60),
		'a session at the coordinator holds shard ' . $S . "'s row of sharding.shards");
	return $h;
}
sub release_switch
{
	my ($c, $h) = @_;
	sharding_q($c, 'coord', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE $holding");
	sharding_finish($h);
}
# start_move(coordinator): the move of shard S to n2 in the background,
# waiting up to 10 minutes for the switch; returns once its switch waits
# for the hold (journal 'cutover').
sub start_move
{
	my ($c, $label, $to) = @_;
	$to //= 'n2';
	my $m = sharding_start($c, 'coord', "SET sharding.move_freeze_timeout = '10min'; SELECT sharding.move_shard_online('m', $S, '$to')",
		on_error_stop => 0);
	my $ms = sharding_wait($c, 'coord', "SELECT ($journal) || '/' || (SELECT count(*) FROM pg_stat_activity "
		  . "WHERE wait_event_type = 'Lock' AND query LIKE '%sharding._switch_owner(%')", 'cutover/false/1', 90);
	ok(defined $ms, "$label: the move of shard $S (to $to) is in its cutover, its owner switch waiting for the hold")
		or diag(lag_text($ms) . "\n" . join("\n", sharding_finish($m)));
	return $m;
}

# log_within(node, offset, regexp): whether the server's log past offset
# matches within 60 s.
sub log_within
{
	my ($node, $offset, $re) = @_;
	for (1 .. 600)
	{
		return 1 if slurp_file($node->logfile, $offset) =~ $re;
		usleep(100_000);
	}
	diag(slurp_file($node->logfile, $offset));
	return 0;
}

# ---------------------------------------------------------------- the standby
$c2 = sharding_standby($c1, 'c2', 'base');

# ================================================================ A. before the switch
my $hold = hold_switch($c1);
my $move = start_move($c1, 'A');
is(n('n1', 'SELECT count(*) FROM sharding.frozen_shards') . ' ' . shard_at('n2'), "1 $sum_S",
	'A: n1 has frozen the shard, n2 holds the copied rows');
is(write_at('n1', $new_S) . '|' . write_at('n1', $other[0]), '55000|', "A: at n1 a write of shard $S is refused (55000), another shard's is not");
$c1->wait_for_catchup($c2, 'replay', $c1->lsn('insert'));
is(q2($journal), 'cutover/false', "A: c2 has replayed the journal's 'cutover'");

$c1->stop('immediate');
sharding_finish($move);
sharding_finish($hold);
my $t_kill = time;
$c2->promote;
$c2->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($c2, 'coord') . "'");
# Meanwhile the nodes keep their last configuration: only the frozen shard is refused.
is(write_at('n1', $new_S) . '|' . write_at('n1', $other[1]), '55000|',
	'A: until take_over, n1 still refuses the frozen shard only');
my $t0 = time;
my $took = q2('SELECT sharding.take_over()', stderr => 1);
my $t_took = time;
like($took, qr/^2\n/, 'A: take_over() on c2: 2 nodes follow it') or diag($took);
my $ms = sharding_wait($c2, 'coord', $journal, 'failed/true', 60);
my $t_done = time;
ok(defined $ms, "A: the move before its switch is rolled back (journal failed, undone; " . lag_text($ms) . ' after take_over returned)')
	or diag(q2("SELECT * FROM sharding.move_journal WHERE map = 'm' AND logical = $S"));
diag(sprintf('figures A: promote to take_over returned %.0f ms (take_over %.0f ms), move rolled back %.0f ms after promotion',
	($t_took - $t_kill) * 1000, ($t_took - $t0) * 1000, ($t_done - $t_kill) * 1000));
is(shard_at('n1') . ' ' . shard_at('n2'), "$sum_S 0/0", "A: every row of shard $S is at n1, none left at n2");
is(owners(\&q2), 'n1 n1 n1', 'A: node_for names n1 at c2, n1 and n2');
is(leftovers(), '0/0/0/0 0/0/0/0', 'A: nothing of the move is left at the nodes, the shard is not frozen');
is(write_at('n1', $new_S) . '|' . write_at('n2', $new_S), '|55000', "A: shard $S is writable again at n1 (and refused at n2)");
my $sum_S_now = shard_at('n1');
is(join(' ', map { n($_, $config) eq q2($config) ? 'same' : 'differs' } @nodes), 'same same', "A: every node's shards equal c2's");

# The old coordinator comes back: its journal still says 'cutover'. Its
# recovery of the move (its jobs launcher's, or this call's, whichever
# takes the move first) is refused, in its log.
my $offset = -s $c1->logfile;
$c1->start;
is(q1($journal), 'cutover/false', "A: c1 started again, its journal still says 'cutover'");
q1('SELECT sharding._move_recover()');
ok(log_within($c1, $offset, qr/could not recover move \d+: .*database "n[12]" follows coordinator host=\S+ port=${\ $c2->port} dbname=coord since/),
	"A: c1's recovery of the move is refused by the nodes (naming c2)");
my $S2 = q2("SELECT min(logical) FROM sharding.shards WHERE map = 'm' AND node = 'n2'");
like(q1("SELECT sharding.move_shard_online('m', $S2, 'n1')", verbose => 1), qr/ERROR:\s+55000: .*follows coordinator host=\S+ port=${\ $c2->port}/,
	"A: c1's move of another shard is refused (55000 naming c2)");
like(q1("SELECT sharding.attach_node('n1')", verbose => 1), qr/ERROR:\s+55000: .*follows coordinator host=\S+ port=${\ $c2->port}/,
	"A: c1's attach_node is refused (55000 naming c2)");
is(shard_at('n1') . ' ' . shard_at('n2') . ' ' . leftovers() . ' ' . owners(\&q2), "$sum_S_now 0/0 0/0/0/0 0/0/0/0 n1 n1 n1",
	'A: ... and nothing changed at any node');
$c1->stop;

# ================================================================ B. after the switch
$c3 = sharding_standby($c2, 'c3', 'base2');
my $sum_B = shard_at('n1');
my $total_B = total();
$hold = hold_switch($c2);
$move = start_move($c2, 'B');
# The nodes' configuration stops flowing: the switch will reach neither.
n($_, "ALTER SUBSCRIPTION sharding_config_$_ DISABLE") for @nodes;
ok(defined sharding_wait($d, 'postgres', "SELECT count(*) FROM pg_stat_subscription WHERE subname LIKE 'sharding_config_%' AND pid IS NOT NULL", '0', 30),
	"B: the nodes' configuration subscriptions are stopped");
release_switch($c2, $hold);
$ms = sharding_wait($c2, 'coord', $journal, 'cleanup/false', 60);
ok(defined $ms, "B: the switch committed at c2 (journal 'cleanup')") or diag(lag_text($ms));
my $epoch = q2("SELECT epoch FROM sharding.shards WHERE map = 'm' AND logical = $S");
is(owners(\&q2), 'n2 n1 n1', 'B: c2 names n2, no node has seen the switch');
is(n('n1', 'SELECT count(*) FROM sharding.frozen_shards') . ' ' . shard_at('n2'), "1 $sum_B",
	'B: the source stays frozen, the destination holds every row: the finish waits for the nodes');
$c2->wait_for_catchup($c3, 'replay', $c2->lsn('insert'));
is(q3($journal), 'cleanup/false', "B: c3 has replayed the switch and the journal's 'cleanup'");

$c2->stop('immediate');
sharding_finish($move);
$t_kill = time;
$c3->promote;
$c3->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($c3, 'coord') . "'");
$t0 = time;
$took = q3('SELECT sharding.take_over()', stderr => 1);
$t_took = time;
like($took, qr/^2\n/, 'B: take_over() on c3: 2 nodes follow it') or diag($took);
$ms = sharding_wait($c3, 'coord', $journal, 'done/false', 60);
$t_done = time;
ok(defined $ms, "B: the move after its switch is finished, never undone (journal done; " . lag_text($ms) . ' after take_over returned)')
	or diag(q3("SELECT * FROM sharding.move_journal WHERE map = 'm' AND logical = $S"));
diag(sprintf('figures B: promote to take_over returned %.0f ms (take_over %.0f ms), move finished %.0f ms after promotion',
	($t_took - $t_kill) * 1000, ($t_took - $t0) * 1000, ($t_done - $t_kill) * 1000));
is(shard_at('n2') . ' ' . shard_at('n1'), "$sum_B 0/0", "B: every row of shard $S is at n2, none left at n1");
is(total(), $total_B, 'B: no row lost, none doubled');
is(owners(\&q3), 'n2 n2 n2', 'B: node_for names n2 at c3, n1 and n2');
is(q3("SELECT epoch FROM sharding.shards WHERE map = 'm' AND logical = $S"), $epoch, "B: c3 keeps the switch's epoch ($epoch)");
is(leftovers(), '0/0/0/0 0/0/0/0', 'B: nothing of the move is left at the nodes, the shard is not frozen');
is(write_at('n2', $new_S2) . '|' . write_at('n1', $new_S2) . '|' . write_at('n1', $other[2]), '|55000|',
	"B: shard $S takes writes at n2 and is refused at n1; n1's other shards take writes");
is(join(' ', map { n($_, "SELECT subenabled::text || '/' || (subconninfo = '" . sharding_dsn($c3, 'coord') . "')::text "
	  . "FROM pg_subscription WHERE subname = 'sharding_config_$_'") } @nodes), 'true/true true/true',
	"B: every node's configuration subscription points at c3, enabled");
is(join(' ', map { n($_, $config) eq q3($config) ? 'same' : 'differs' } @nodes), 'same same', "B: every node's shards equal c3's");
my $sums_B = shard_at('n2');

# The old coordinator comes back: its journal still says 'cleanup'.
$offset = -s $c2->logfile;
$c2->start;
is(q2($journal), 'cleanup/false', "B: c2 started again, its journal still says 'cleanup'");
q2('SELECT sharding._move_recover()');
ok(log_within($c2, $offset, qr/could not recover move \d+: .*database "n[12]" follows coordinator host=\S+ port=${\ $c3->port} dbname=coord since/),
	"B: c2's recovery of the move is refused by the nodes (naming c3)");
like(q2("SELECT sharding.move_shard_online('m', $S, 'n1')", verbose => 1), qr/ERROR:\s+55\d\d\d: /,
	"B: c2's move of the shard back is refused");
like(q2("SELECT sharding.attach_node('n2')", verbose => 1), qr/ERROR:\s+55000: .*follows coordinator host=\S+ port=${\ $c3->port}/,
	"B: c2's attach_node is refused (55000 naming c3)");
q2("SELECT sharding.pin('m', 'from-c2', 'n1')");
q3("SELECT sharding.pin('m', 'from-c3', 'n1')");
my @lags = map { "$_=" . lag_text(sharding_wait($d, $_, "SELECT sharding.node_for('m', 'from-c3')", 'n1', 10)) } @nodes;
is(scalar(grep { /ms$/ } @lags), 2, "a pin made on c3 reaches every node within 10 s (@lags)");
is(join(' ', map { n($_, "SELECT count(*) FROM sharding.pins WHERE key = 'from-c2'") } @nodes), '0 0', "c2's pin reached no node");
is(shard_at('n2') . ' ' . shard_at('n1') . ' ' . leftovers() . ' ' . owners(\&q3), "$sums_B 0/0 0/0/0/0 0/0/0/0 n2 n2 n2",
	'B: ... and nothing changed at any node');
$c2->stop;

# ================================================================ C. an asynchronous standby that missed the switch
# The old coordinator moves shard S to the other node; its standby has
# replayed the journal's 'cutover' and stops before the switch: the move
# then ends on the old coordinator (switch, the rows deleted at the source)
# and the new owner takes a write of the shard. The old coordinator is
# killed, the standby (which never saw the switch) promoted. The
# destination's word comes before the standby's journal: take_over takes the
# switch (a WARNING) and the move is finished, never undone; once with
# take_over(), once with take_over(force => true), which raises every
# shard's epoch (the move then finishes at the raised epoch).
my ($write_n, $cur) = (0, $c3);
for my $force (0, 1)
{
	my ($from, $to) = $force ? ('n1', 'n2') : ('n2', 'n1');
	my $L = $force ? 'C (force)' : 'C';
	my $new = PostgreSQL::Test::Cluster->new($force ? 'c5' : 'c4');
	my $qo = sub { my ($sql, %o) = @_; return sharding_q($cur, 'coord', $sql, %o); };
	my $qn = sub { my ($sql, %o) = @_; return sharding_q($new, 'coord', $sql, %o); };
	$cur->backup("base_$L");
	$new->init_from_backup($cur, "base_$L", has_streaming => 1);
	$new->start;
	my $sum = shard_at($from);
	$hold = hold_switch($cur);
	$move = start_move($cur, $L, $to);
	$cur->wait_for_catchup($new, 'replay', $cur->lsn('insert'));
	is($qn->($journal), 'cutover/false', "$L: the standby has replayed the journal's 'cutover'");
	$new->stop;
	release_switch($cur, $hold);
	my @r = sharding_finish($move);
	is($qo->($journal) . ' ' . shard_at($to) . ' ' . shard_at($from), "done/false $sum 0/0",
		"$L: on the old coordinator the move ended: shard $S at $to, none left at $from") or diag(join("\n", @r));
	my $key = n($to, "SELECT 'after-' || i FROM generate_series(1, 10000) AS i WHERE sharding.logical_shard('m', 'after-' || i) = $S "
		  . "AND NOT EXISTS (SELECT FROM docs WHERE k = 'after-' || i) ORDER BY i LIMIT 1");
	is(write_at($to, $key), '', "$L: $to, the new owner, takes a write of the shard");
	my $sum2 = shard_at($to);
	my $total = total();
	$cur->stop('immediate');
	$new->start;
	$new->promote;
	$new->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($new, 'coord') . "'");
	is($qn->($journal) . ' ' . $qn->($owner), "cutover/false $from",
		"$L: the standby, promoted, never saw the switch: its journal says 'cutover', it names $from");
	$took = $qn->($force ? 'SELECT sharding.take_over(force => true)' : 'SELECT sharding.take_over()', stderr => 1);
	like($took, qr/^2\n.*WARNING:\s+the destination "$to" of the move of logical shard $S of map "m" owns it: this server missed its owner switch, which it takes/s,
		"$L: take_over takes the switch the destination shows (a WARNING), 2 nodes follow it") or diag($took);
	unless ($took =~ /^2\n/)
	{
		$took = $qn->('SELECT sharding.take_over(force => true)', stderr => 1);
		diag("take_over(force => true): $took");
	}
	$ms = sharding_wait($new, 'coord', $journal, 'done/false', 60);
	ok(defined $ms, "$L: the move is finished on the new coordinator, never undone (" . lag_text($ms) . ')')
		or diag($qn->("SELECT * FROM sharding.move_journal WHERE map = 'm' AND logical = $S"));
	is(shard_at($to) . ' ' . shard_at($from), "$sum2 0/0", "$L: every row of shard $S is at $to (the write after the switch too), none at $from");
	is(total(), $total, "$L: no row lost, none doubled");
	is(owners($qn), "$to $to $to", "$L: node_for names $to at the new coordinator, n1 and n2");
	is(leftovers(), '0/0/0/0 0/0/0/0', "$L: nothing of the move is left at the nodes");
	is(join(' ', map { n($_, $config) eq $qn->($config) ? 'same' : 'differs' } @nodes), 'same same', "$L: every node's shards equal the new coordinator's");
	$cur = $new;
}

# ================================================================ D. ... and the new owner out of reach
# As C, the move (n2 -> n1) ended on the old coordinator, which its
# standby missed; and n1, the new owner, is out of reach while take_over
# runs (its database refuses new connections; its clients, connected, go
# on writing the shard). The source's copy names n1: the switch is taken on
# its word, so the source does not take the shard back (it stays refused
# there, no two owners); once n1 answers, the jobs launcher re-points it and
# the move is finished, never undone.
{
	my $new = PostgreSQL::Test::Cluster->new('c6');
	my $qn = sub { my ($sql, %o) = @_; return sharding_q($new, 'coord', $sql, %o); };
	$cur->backup('base_D');
	$new->init_from_backup($cur, 'base_D', has_streaming => 1);
	$new->start;
	my $sum = shard_at('n2');
	$hold = hold_switch($cur);
	$move = start_move($cur, 'D', 'n1');
	$cur->wait_for_catchup($new, 'replay', $cur->lsn('insert'));
	$new->stop;
	release_switch($cur, $hold);
	my @r = sharding_finish($move);
	is(sharding_q($cur, 'coord', $journal) . ' ' . shard_at('n1') . ' ' . shard_at('n2'), "done/false $sum 0/0",
		"D: on the old coordinator the move ended: shard $S at n1, none left at n2") or diag(join("\n", @r));
	my $key = n('n1', "SELECT 'later-' || i FROM generate_series(1, 10000) AS i WHERE sharding.logical_shard('m', 'later-' || i) = $S ORDER BY i LIMIT 1");
	is(write_at('n1', $key), '', 'D: n1, the new owner, takes a write of the shard');
	my $sum2 = shard_at('n1');
	my $key2 = n('n2', "SELECT 'late2-' || i FROM generate_series(1, 10000) AS i WHERE sharding.logical_shard('m', 'late2-' || i) = $S ORDER BY i LIMIT 1");
	n('postgres', 'ALTER DATABASE n1 ALLOW_CONNECTIONS false');
	$cur->stop('immediate');
	$new->start;
	$new->promote;
	$new->safe_psql('postgres', "ALTER DATABASE coord SET sharding.coordinator_dsn = '" . sharding_dsn($new, 'coord') . "'");
	$took = $qn->('SELECT sharding.take_over()', stderr => 1);
	like($took, qr/^1\n.*WARNING:\s+node "n1" is out of reach.*WARNING:\s+the destination "n1" of the move of logical shard $S of map "m" owns it: this server missed its owner switch, which it takes.*node "n2" shows the switch/s,
		'D: take_over() with n1 out of reach takes the switch on the word of n2, the source: 1 node follows') or diag($took);
	is(write_at('n2', $key2), '55000', "D: n2, the source, does not take shard $S back (55000)");
	n('postgres', 'ALTER DATABASE n1 ALLOW_CONNECTIONS true');
	$ms = sharding_wait($new, 'coord', $journal, 'done/false', 60);
	ok(defined $ms, "D: once n1 answers, the move is finished, never undone (" . lag_text($ms) . ')')
		or diag($qn->("SELECT * FROM sharding.move_journal WHERE map = 'm' AND logical = $S"));
	ok(defined sharding_wait($new, 'coord', 'SELECT unreached FROM sharding.coordinator_identity', '{}', 30), 'D: ... and n1 follows the new coordinator');
	is(shard_at('n1') . ' ' . shard_at('n2'), "$sum2 0/0", "D: every row of shard $S is at n1 (the write after the switch too), none at n2");
	is(owners($qn), 'n1 n1 n1', 'D: node_for names n1 at the new coordinator, n1 and n2');
	is(leftovers(), '0/0/0/0 0/0/0/0', 'D: nothing of the move is left at the nodes');
}

done_testing();
