// Wake-ups of the background launcher of rebalance jobs (src/jobs/jobs.cpp,
// docs/rebalance.md) for the layers below jobs/: two-phase DDL left in
// doubt (src/ddl), a move's journal (src/move), take-over (src/datanode)
// and worker groups' leases (src/routing) ask the launcher to scan a
// database, or to wake, through these. jobs.cpp installs what they do at
// _PG_init (jobs_init); until then they do nothing, as they do anyway
// unless the library is preloaded (the launcher's shared memory exists
// only then).
#pragma once

#include "pg/pg.hpp"

namespace sharding {

// The launcher scans this database again soon (1 s), then again after 2,
// 4, 8, then every 10 s for as long as a scan leaves moves it could not
// resolve.
void jobs_recheck(Oid db) noexcept;
// The same; soon: every second without back-off (in-doubt two-phase
// transactions, src/ddl).
void jobs_recheck(Oid db, bool soon) noexcept;
// Wakes the launcher for its next round without a scan of the databases
// (worker groups: a lease that expires sooner than it was going to wake).
void jobs_poke_launcher() noexcept;
// Starts a short-lived background worker in this database (a dynamic one:
// with or without shared_preload_libraries) that finishes, as the
// extension's owner, the moves whose executor has let go of them
// (sharding._move_recover): a move's deferred clean-up
// (sharding.move_cleanup = deferred, src/move). False when no background
// worker slot is free; the launcher is asked to scan the database then
// (with the library preloaded).
bool jobs_clean_up(Oid db) noexcept;

// What jobs.cpp installs.
struct LauncherCalls {
    void (*recheck)(Oid db, bool soon) noexcept = nullptr;
    void (*poke)() noexcept = nullptr;
    bool (*clean_up)(Oid db) noexcept = nullptr;
};
void set_launcher_calls(const LauncherCalls &calls) noexcept;

}  // namespace sharding
