// Section 4 of the contract: rank-guarded transitions (src/rank.cpp).
#pragma once

namespace sharding {

// Registers the rank caches' invalidation callbacks. Called once, from
// _PG_init.
void rank_init();

}  // namespace sharding
