// Worker groups' lease expiries (groups.cpp, docs/queues.md) as the jobs
// launcher (src/jobs/jobs.cpp) and claim_node (src/queue/queue_ordered.cpp)
// ask for them.
#pragma once

#include "pg/pg.hpp"

namespace sharding {
// For the launcher: the databases whose next lease expiry has come (at most
// max, into dbs), each marked reaping; in *next_ms the milliseconds until
// the next one not due (-1: none).
int groups_take_due(Oid *dbs, int max, long *next_ms) noexcept;
// A reaper of db ended, or could not be started; forget: db has no
// extension (its entry goes).
void groups_reaper_done(Oid db, bool forget) noexcept;
// claim_node's first step: the map's worker group reaped now if a member's
// lease has expired. C-style: may ereport (under SPI).
void groups_notice(Datum map);
}  // namespace sharding
