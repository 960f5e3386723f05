# The column numbers the C++ reads the configuration tables by
# (src/pg/catalog.hpp, Anum_<table>_<column>) agree with pg_attribute of the
# tables a fresh CREATE EXTENSION makes, so that reordering or renaming a
# column in sql/install/ without updating the header fails here. Each table
# is named by a "// sharding.<table>:" line of the header; every constant
# after it must be Anum_<table>_<column> for an existing column at that
# position. (Was test/harness/catalog.sh.) The header is read from
# SHARDING_REPO (test/run.sh: a copy of the sources the server's OS user
# can read), else from the checkout this file is in.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib 'lib';
use ShardingNode;

my $repo = $ENV{SHARDING_REPO} // "$FindBin::RealBin/../..";
my $header = PostgreSQL::Test::Utils::slurp_file("$repo/src/pg/catalog.hpp");

# constants(TEXT): [table, column, number] for every constant of a header;
# table 'BAD' for a constant not under a table's line or not named after it.
sub constants
{
	my ($text) = @_;
	my ($t, @c) = ('');
	for (split /\n/, $text)
	{
		if (m{^// sharding\.([a-z_]+):}) { $t = $1; next; }
		next unless /constexpr int (Anum_\w+)\s*=\s*(\d+)\s*;/;
		my ($name, $num) = ($1, $2);
		my $prefix = "Anum_${t}_";
		if ($t eq '' || index($name, $prefix) != 0) { push @c, [ 'BAD', $name, $num ]; next; }
		push @c, [ $t, substr($name, length $prefix), $num ];
	}
	return @c;
}

my $node = sharding_node('catalog');
# compare(TEXT): [table, column, header's number, installed number] for
# every constant; installed is '' when the column does not exist.
sub compare
{
	return map {
		my ($table, $column, $num) = @$_;
		[ $table, $column, $num, $node->safe_psql('postgres', "SELECT attnum FROM pg_catalog.pg_attribute
		    WHERE attrelid = 'sharding.$table'::regclass AND attname = '$column' AND NOT attisdropped") ]
	} grep { $_->[0] ne 'BAD' } constants($_[0]);
}
sub mismatches { return scalar grep { $_->[2] ne $_->[3] } compare($_[0]); }

my @constants = constants($header);
plan tests => @constants + 3;
is(scalar(grep { $_->[0] eq 'BAD' } @constants), 0,
	'every constant of src/pg/catalog.hpp is Anum_<table>_<column> under its table\'s line');
for (compare($header))
{
	my ($table, $column, $num, $got) = @$_;
	is($got, $num, "sharding.$table.$column is column $num, as Anum_${table}_${column} says");
}
# The check can fail: a header with two columns swapped, or a renamed one.
(my $swapped = $header) =~ s/Anum_maps_map = 1;/Anum_maps_map = 2;/;
$swapped =~ s/Anum_maps_logical_shards = 2;/Anum_maps_logical_shards = 1;/;
is(mismatches($swapped), 2, "a header with sharding.maps' columns swapped gives two mismatches");
(my $renamed = $header) =~ s/Anum_distributed_tables_map = /Anum_distributed_tables_mapname = /;
is(mismatches($renamed), 1, 'a header naming a missing column gives a mismatch');
