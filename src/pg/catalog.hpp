// Column numbers of the extension's configuration tables, for C++ that reads
// their tuples directly (heap_getattr, SPI_getbinval), in the style of
// PostgreSQL's own Anum_pg_* constants.
//
// They MUST follow the column order of the CREATE TABLE statements in
// sql/install/ (named beside each table below). test/tap/335_catalog.pl
// compares every constant here with pg_attribute of the installed table, so
// reordering, adding before, or renaming a column without updating this file
// fails a test. One constant per column that the C++ reads; add a column
// here (and nowhere else) before reading it.
#pragma once

namespace sharding::catalog {

// sharding.maps: sql/install/20_maps.sql
constexpr int Anum_maps_map = 1;             // text
constexpr int Anum_maps_logical_shards = 2;  // integer

// sharding.distributed_tables: sql/install/70_distribute.sql
constexpr int Anum_distributed_tables_schema_name = 1;  // text
constexpr int Anum_distributed_tables_table_name = 2;   // text
constexpr int Anum_distributed_tables_key_column = 3;   // text
constexpr int Anum_distributed_tables_map = 4;          // text

// sharding.move_decoding: sql/install/90_move.sql (read by the move's
// output plugin, src/datanode/move_decoder.cpp)
constexpr int Anum_move_decoding_slot = 1;         // text
constexpr int Anum_move_decoding_shards = 3;       // integer
constexpr int Anum_move_decoding_logical = 4;      // integer
constexpr int Anum_move_decoding_key = 5;          // text
constexpr int Anum_move_decoding_pins = 6;         // text[]
constexpr int Anum_move_decoding_tables = 7;       // oid[]
constexpr int Anum_move_decoding_key_columns = 8;  // text[]

}  // namespace sharding::catalog
