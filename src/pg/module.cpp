// The loadable module: PostgreSQL's magic block and _PG_init.
#include "pg/boundary.hpp"
#include "pg/cache.hpp"

extern "C" {
SHARDING_EXPORT const Pg_magic_struct *PG_MAGIC_FUNCTION_NAME(void);
SHARDING_MODULE_MAGIC;

SHARDING_EXPORT void _PG_init(void);
}

// Per-topic initialisation, once per backend (or once in the postmaster under
// shared_preload_libraries: nothing here allocates or reads a catalog). A
// topic with a per-backend cache registers its entry kind with the cache
// module (cache::register_kind, src/pg/cache.hpp), which owns the one relcache
// and one syscache callback (docs/architecture.md, "The cache module"). One
// line per topic.
namespace sharding {
void maps_init();   // maps.cpp: routing cache
void queue_init();  // queue.cpp: prepared claim plans
void rank_init();   // rank.cpp: rank lists of guarded columns
void fanout_init();  // fanout.cpp: shared counters and hooks (preload only)
void guard_init();  // guard.cpp: local state of a data node (this_node, frozen shards)
void jobs_init();   // jobs.cpp: sharding.max_move_workers, move workers (preload only)
void copy_init();   // move_copy.cpp: sharding.move_parallel
void freeze_init();  // move_orchestrate.cpp: sharding.move_freeze_timeout
void groups_init();  // groups.cpp: lease expiries for the background worker (preload only)
void ddl_init();     // ddl/: sharding.propagate_ddl, the ProcessUtility hook (preload only)
void dropdb_init();  // ddl/drop_database.cpp: DROP DATABASE refused during a move (preload only)
}  // namespace sharding

/*
 * _PG_init: runs once when a backend loads sharding.so.
 */
void _PG_init(void) {
    sharding::cache::shmem_init();  // counters of committed config changes (preload only)
    sharding::maps_init();
    sharding::queue_init();
    sharding::rank_init();
    sharding::fanout_init();
    sharding::guard_init();
    sharding::jobs_init();
    sharding::copy_init();
    sharding::freeze_init();
    sharding::groups_init();
    sharding::ddl_init();
    sharding::dropdb_init();
}
