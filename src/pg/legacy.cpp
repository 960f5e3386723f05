// The symbols the released (frozen) scripts link their C functions to from
// before every symbol was named sharding_<name>: sql/sharding--1.0.sql,
// sharding--1.0--1.1.sql, sharding--1.1.sql and, for partition_for,
// sharding--1.2.sql. A database still at such a version resolves its
// functions through these aliases until ALTER EXTENSION sharding UPDATE
// re-points them at the sharding_ symbols.
//
// The list is not written by hand: the Makefile generates
// src/pg/legacy_symbols.inc from those scripts (every name they link that is
// not sharding_*, each an alias of sharding_ plus that name), and
// src/pg/exports.map from every installable script. A name goes when the
// last released script that links it is no longer installable (removed from
// DATA in the Makefile). test/harness/layers.sh checks that sharding.so
// exports exactly what the scripts link.
#include "pg/boundary.hpp"

#include "pg/legacy_symbols.inc"

// The move engine's SQL wrappers that nothing called, dropped by the 1.4
// update (sql/upgrade/1.3--1.4/34_unused.sql). 1.3's frozen script still
// links their symbols, so a database not yet updated keeps them: each
// raises 0A000 naming itself and telling to update.
namespace {
[[noreturn]] void retired_in_1_4(const char *function) {
    sharding::fail(ERRCODE_FEATURE_NOT_SUPPORTED, sharding::Explain{"", "Run ALTER EXTENSION sharding UPDATE."},
                   "function sharding.%s was retired in version 1.4", function);
}
}  // namespace

SHARDING_FUNCTION(sharding__move_slot_close) { (void)fcinfo; retired_in_1_4("_move_slot_close"); }
SHARDING_FUNCTION(sharding__move_drop_replication) { (void)fcinfo; retired_in_1_4("_move_drop_replication"); }
SHARDING_FUNCTION(sharding__move_drop_triggers) { (void)fcinfo; retired_in_1_4("_move_drop_triggers"); }
SHARDING_FUNCTION(sharding__move_finish) { (void)fcinfo; retired_in_1_4("_move_finish"); }
SHARDING_FUNCTION(sharding__move_phase) { (void)fcinfo; retired_in_1_4("_move_phase"); }
SHARDING_FUNCTION(sharding__move_raise) { (void)fcinfo; retired_in_1_4("_move_raise"); }
SHARDING_FUNCTION(sharding__move_refuse_written) { (void)fcinfo; retired_in_1_4("_move_refuse_written"); }
