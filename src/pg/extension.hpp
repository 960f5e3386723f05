// The extension in the current database, read from the catalogs (for
// background workers, which find the extension's functions by oid, not by
// a search_path). C-style glue: may ereport; in a transaction.
#pragma once

#include "pg/pg.hpp"

namespace sharding {

// The extension (oid InvalidOid: not installed).
struct Extension {
    Oid oid;
    Oid owner;
    Oid schema;
};
Extension find_extension();
// The extension's function name(argtypes), InvalidOid unless it is one of
// the extension's members.
Oid extension_function(const Extension &e, const char *name, int nargs, const Oid *argtypes);

}  // namespace sharding
