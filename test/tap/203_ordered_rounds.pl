# claim_ordered takes, in every round of a claim, the heads of the keys it
# leaves out of its walk (docs/ordered.md). A key remembered with a backlog
# is left out of every round's walk; its head used to be looked up
# (probed) in the first round only. When that head lay past where the
# first round's walk got, no round tested it: the next rounds walked past it
# and took a younger head, so a claim passed over a free head (TAP 201's
# oracle caught it under load, at the end of a held key's chain: 'claim
# 2250 (batch 1, got 1) passed over 8041').
#
# Forced here in one session (its own position without preload, the
# queue's shared position with it), on the C test of the candidates and on
# the pick statement's:
#   C0, C1  claims that sweep: the walk meets W's backlog (left out from
#           then on) and K's two jobs behind K's first one, processing:
#           K is remembered with a backlog; C1 takes a1;
#   C2, C3  K's first job done: they take K's next two jobs (K's head,
#           probed, before the position), each job done in turn;
#   C4      K's head is now its last job kH, past 100 blocked keys' jobs:
#           the first round's walk stops before it, later rounds walk past
#           it to the free head z. C4 must take kH, not z.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib 'lib';
use ShardingNode;

# The queue q: W's backlog at the front (its first job processing), so that
# a sweep costs more than a cheap one (then every claim would sweep); K's
# first job processing and two jobs behind it; the free heads a0, a1; 100
# keys G each with a job processing and one pending; K's last job kH; the
# free head z. Ids in created order; one run_at for all.
my $jobs = q{
INSERT INTO %Q% (id, key, created, run_at, status, owner, claim_expires)
SELECT g, key, '2026-01-01'::timestamptz + g * interval '1 millisecond', '2026-01-01',
       CASE WHEN processing THEN 'processing' ELSE 'pending' END,
       CASE WHEN processing THEN 'x' END,
       CASE WHEN processing THEN now() + interval '1 hour' END
  FROM (SELECT g, 'W' AS key, g = 1 AS processing FROM generate_series(1, 50001) g
        UNION ALL VALUES (50002, 'K', true), (50003, 'K', false), (50004, 'K', false),
                         (50005, 'a0', false), (50006, 'a1', false)
        UNION ALL SELECT 50006 + i, 'G' || i, true FROM generate_series(1, 100) i
        UNION ALL SELECT 50106 + i, 'G' || i, false FROM generate_series(1, 100) i
        UNION ALL VALUES (50207, 'K', false), (50208, 'z', false)) j (g, key, processing);
ANALYZE %Q%;
};

my $claim = "SELECT coalesce(string_agg(id::text, ','), '-') FROM sharding.claim_ordered(NULL::%Q%, 'w', 1)";
my $script = join("\n",
	'SET client_min_messages = debug2;',
	"\\warn C0", "$claim;", "\\warn C1", "$claim;",
	"SELECT sharding.complete('%Q%', 50002, 'x');",
	"\\warn C2", "$claim;", "SELECT sharding.complete('%Q%', 50003, 'w');",
	"\\warn C3", "$claim;", "SELECT sharding.complete('%Q%', 50004, 'w');",
	"\\warn C4", "$claim;");

sub scenario
{
	my ($node, $q, $label, $path) = @_;
	(my $sql = $jobs) =~ s/%Q%/$q/g;
	$node->safe_psql('postgres', $sql);
	($sql = $script) =~ s/%Q%/$q/g;
	my ($rc, $out, $err) = $node->psql('postgres', $sql, on_error_stop => 1);
	is($rc, 0, "$label: the claims ran") or diag($err);
	my @got = grep { !/^t$/ } split /\n/, $out;
	is(join(' ', @got), '50005 50006 50003 50004 50207',
		"$label: C0-C3 take a0, a1 and K's next jobs; C4 takes K's head kH (50207), not the younger z (50208)");
	# What the claims did (their DEBUG1 summaries and DEBUG2 rounds): C1
	# swept, so that C2-C4 resumed from its position; C4 took more than one
	# round, walking past kH.
	my %by;
	my $cur = '';
	for my $line (split /\n/, $err)
	{
		if ($line =~ /^C(\d)$/) { $cur = $1; next; }
		$by{$cur} .= "$line\n";
	}
	like($by{0} // '', qr/ordered claim on \S+: sweep/, "$label: C0 swept");
	is(join(' ', map { ($by{$_} // '') =~ /ordered claim on \S+: (sweep|resume)/ ? $1 : '?' } 2 .. 4),
		'resume resume resume', "$label: C2-C4 resumed from the position");
	my $rounds = () = ($by{4} // '') =~ /ordered claim round \d+: .* \(\Q$path\E\)/g;
	cmp_ok($rounds, '>=', 2, "$label: C4 walked in $rounds rounds ($path)");
	note($by{4} // '');
}

for my $preload (1, 0)
{
	my $node = sharding_node($preload ? 'rounds' : 'rounds_np', preload => $preload);
	my $mode = $preload ? 'preload' : 'no preload';
	$node->safe_psql('postgres', q{
SELECT sharding.create_queue('fast');
SELECT count(*) FROM sharding.create_ordered_indexes('fast');
SELECT sharding.create_queue('slow');
CREATE INDEX ON slow (key, status, created DESC, id DESC) WHERE status IN ('pending', 'processing');
});
	scenario($node, 'fast', "$mode, C test", 'candidates tested here');
	scenario($node, 'slow', "$mode, statement", 'pick statement');
	$node->stop;
}
done_testing();
