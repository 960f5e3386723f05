// The one definition of the shard lock tags (docs/ordered.md, docs/moves.md):
// fence, _lock_shard, _lock_map, pin, move_shard, rebalance, drop_map, the
// guard and claim_ordered all lock through these, so they conflict exactly
// as documented. Advisory lock method; field1 the database; field2 32 bits
// of the map name's hash (two maps sharing them only wait for each other
// needlessly); field3 the logical shard, or map_level for the whole map;
// field4 shard_lock_class, which no user advisory lock uses (those use 1
// or 2).
#pragma once

#include "pg/boundary.hpp"
#include "core/hash_core.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/lock.h"
}

namespace sharding {

constexpr uint32 shard_lock_class = 3;
constexpr uint32 map_level = 0xFFFFFFFFu;

inline void shard_lock_tag(LOCKTAG *tag, const char *map, size_t len, uint32 field3) {
    uint32 h = static_cast<uint32>(sharding::hash_bytes(map, len));
    SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, h, field3, shard_lock_class);
}

// Takes the lock in this transaction; true unless it was already held.
inline bool lock_shard(const char *map, size_t len, uint32 field3, LOCKMODE mode) {
    LOCKTAG tag;
    shard_lock_tag(&tag, map, len, field3);
    return LockAcquire(&tag, mode, false, false) != LOCKACQUIRE_ALREADY_HELD;
}

inline bool lock_shard(text *map, uint32 field3, LOCKMODE mode) {
    return lock_shard(VARDATA_ANY(map), VARSIZE_ANY_EXHDR(map), field3, mode);
}

}  // namespace sharding
