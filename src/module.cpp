// The loadable module: PostgreSQL's magic block and _PG_init.
#include "pg.hpp"
#include "rank.hpp"

extern "C" {
PG_MODULE_MAGIC;

void _PG_init(void);
}

namespace sharding {
// Per-topic initialisation hooks (cache callbacks and the like) are called
// from here, once per backend.
}

/*
 * _PG_init: runs once when a backend loads sharding.so.
 */
void _PG_init(void) { sharding::rank_init(); }
