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
