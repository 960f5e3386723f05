// A snapshot for SPI where none is active: a job's worker runs a move
// without one of its own for the whole call (src/nodes/jobs.cpp, review
// RB-10: the move would hold the coordinator's xmin for its length), so
// each SPI statement of the engine pushes one for itself, as a READ
// COMMITTED statement takes its own. An ERROR in between pops it with the
// (sub)transaction's abort.
#pragma once

extern "C" {
#include "postgres.h"
#include "utils/snapmgr.h"
}

namespace sharding {

// Whether it pushed one (give it to spi_snapshot_pop).
inline bool spi_snapshot_push() {
    if (ActiveSnapshotSet()) return false;
    PushActiveSnapshot(GetTransactionSnapshot());
    return true;
}
inline void spi_snapshot_pop(bool pushed) {
    if (pushed) PopActiveSnapshot();
}

}  // namespace sharding
