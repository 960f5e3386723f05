// The loadable module: PostgreSQL's magic block and _PG_init.
#include "pg.hpp"

extern "C" {
SHARDING_MODULE_MAGIC;

void _PG_init(void);
}

// Per-topic initialisation, once per backend: each registers the one cache
// invalidation callback its per-backend cache needs (PostgreSQL allows only a
// few relcache callbacks per process, so each topic registers exactly one).
namespace sharding {
void maps_init();   // maps.cpp: routing cache
void queue_init();  // queue.cpp: prepared claim plans
void rank_init();   // rank.cpp: rank lists of guarded columns
}  // namespace sharding

/*
 * _PG_init: runs once when a backend loads sharding.so.
 */
void _PG_init(void) {
    sharding::maps_init();
    sharding::queue_init();
    sharding::rank_init();
}
