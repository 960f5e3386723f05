// Section 2: logical-shard maps and the per-backend routing cache.
#pragma once

#include "pg.hpp"

namespace sharding {
// Registers the routing cache's relcache callback; called once, from _PG_init.
void maps_init();
}  // namespace sharding
