# Runs the multi-node examples (```sql node=NAME``` blocks) of README.md and
# of every page of docs/ (docs/*.md, whoever wrote it), with
# test/lib/readme_examples.py in `nodes` mode. Each file with such blocks
# runs, in document order, on a fresh instance of its own; files without
# them are skipped. Every check the script reports is one test here; the
# script's own plan and exit status are checked too (a failure if wrong).
# (Was test/multinode/readme.sh.)
#
# The instance (wal_level = logical, enough slots and workers; prepared
# transactions only for docs/nodes.md, whose example changes a distributed
# table on every node: README.md's runs as in 1.3, without them, which
# checks that distribute involves no node that has its table) holds the
# databases the examples name: `coord` (the coordinator) and the data nodes
# `n1`, `n2`, `n3`, created empty (the examples install what they need).
# The server runs with PGHOST and PGPORT of its own socket in its
# environment (PostgreSQL::Test::Cluster starts it so), so that the
# examples' DSNs ('dbname=n1'), used by dblink, PL/Proxy and the followers'
# subscriptions, reach it. The pages and the script are read from
# SHARDING_REPO (test/run.sh: a copy the server's OS user can read), else
# from the checkout this file is in.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use FindBin;
use lib 'lib';
use ShardingNode;

my $repo = $ENV{SHARDING_REPO} // "$FindBin::RealBin/../..";
my $script = "$repo/test/lib/readme_examples.py";

my @pages;
for my $f ("$repo/README.md", sort glob("$repo/docs/*.md"))
{
	next unless -f $f;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'python3', $script, 'list', $f ], '>', \$out, '2>', \$err)
	  or BAIL_OUT("cannot list the examples of $f: $err");
	push @pages, $f if $out =~ / sql node=/;
}
plan skip_all => 'no page has sql node=NAME blocks' unless @pages;

my $i = 0;
for my $f (@pages)
{
	(my $page = $f) =~ s{^\Q$repo\E/}{};
	note($page);
	my $node = sharding_node('readme' . ++$i, conf => join("\n",
		'max_connections = 120', 'max_replication_slots = 24', 'max_wal_senders = 24',
		'max_logical_replication_workers = 16', 'max_sync_workers_per_subscription = 4',
		'max_worker_processes = 32', "wal_retrieve_retry_interval = '200ms'",
		'max_prepared_transactions = ' . ($page eq 'docs/nodes.md' ? 10 : 0)));
	$node->safe_psql('postgres', "CREATE DATABASE $_") for qw(coord n1 n2 n3);
	my ($out, $err) = ('', '');
	{
		local %ENV = $node->_get_env();
		IPC::Run::run([ 'python3', $script, 'nodes', $f, map { "$_=dbname=$_" } qw(coord n1 n2 n3) ],
			'<', \undef, '>', \$out, '2>', \$err);
	}
	my $rc = $? >> 8;
	# Each result of the script is a test here; its comments are diagnostics.
	my ($reported, $failed, $planned) = (0, 0, undef);
	for (split /\n/, $out)
	{
		if (/^(not )?ok \d+ (?:- )?(.*)$/)
		{
			my ($bad, $desc) = ($1, $2);
			$reported++;
			if ($desc =~ /^(.*?) # SKIP (.*)$/)
			{
				SKIP: { skip("$page: $2", 1); }
				next;
			}
			$failed++ if $bad;
			ok(!$bad, "$page: $desc");
		}
		elsif (/^1\.\.(\d+)$/) { $planned = $1; }
		elsif (/^#/) { diag($_); }
	}
	diag($err) if $err ne '';
	# Not a test of its own (the page's checks are): a failure when the
	# script stopped short of its plan, reported nothing, or exited non-zero
	# without a failed check.
	fail("$page: readme_examples.py reported its whole plan ($reported of " . ($planned // 'no plan') . "), exit status $rc")
	  unless defined $planned && $planned == $reported && $reported > 0 && ($rc == 0) == ($failed == 0);
	$node->stop;
}
done_testing();
