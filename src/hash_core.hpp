// The stable shard hash: pure C++, no PostgreSQL header.
//
// These functions define the compatibility promise of section 1 of the
// contract: XXH3-64 with seed 0 over a key's canonical bytes, then either a
// plain modulo or Lamping-Veach jump consistent hashing. Their values must
// never change between versions, platforms or byte orders.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef SHARDING_XXH_LINKED
#include <xxhash.h>
#else
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace sharding {

// XXH3-64, seed 0, over raw bytes.
inline uint64_t hash_bytes(const void *data, size_t len) {
    return XXH3_64bits(data, len);
}

// Integers are widened to int64 and hashed as 8 bytes little-endian, whatever
// the byte order of the machine we run on.
inline uint64_t hash_int64(int64_t value) {
    uint64_t u = static_cast<uint64_t>(value);
    unsigned char bytes[8];
    for (int i = 0; i < 8; i++) bytes[i] = static_cast<unsigned char>(u >> (8 * i));
    return XXH3_64bits(bytes, sizeof bytes);
}

// Unsigned hash mod n; n must be >= 1.
inline int32_t shard_from_hash(uint64_t hash, int32_t n) {
    return static_cast<int32_t>(hash % static_cast<uint64_t>(n));
}

// Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm"
// (2014), with their LCG constant; n must be >= 1.
inline int32_t jump_from_hash(uint64_t key, int32_t n) {
    int64_t b = -1, j = 0;
    while (j < n) {
        b = j;
        key = key * 2862933555777941757ULL + 1;
        j = static_cast<int64_t>(static_cast<double>(b + 1) *
                                 (static_cast<double>(1LL << 31) /
                                  static_cast<double>((key >> 33) + 1)));
    }
    return static_cast<int32_t>(b);
}

// The contiguous-range dealing rule shared by create_map and worker_shards:
// `shards` items over `workers` owners in order, sizes differing by at most
// one, the first owners taking the larger ranges. Both arguments >= 1.
struct Range {
    int32_t first;  // first shard owned
    int32_t count;  // how many (may be 0 when workers > shards)
};

inline Range dealt_range(int32_t worker, int32_t workers, int32_t shards) {
    const int64_t base = shards / workers, extra = shards % workers;
    const int64_t w = worker;
    const int64_t first = w * base + (w < extra ? w : extra);
    return Range{static_cast<int32_t>(first), static_cast<int32_t>(base + (w < extra ? 1 : 0))};
}

// Inverse of dealt_range: which owner a shard is dealt to.
inline int32_t dealt_owner(int32_t shard, int32_t workers, int32_t shards) {
    const int64_t base = shards / workers, extra = shards % workers;
    const int64_t big = extra * (base + 1);  // shards held by the larger ranges
    if (shard < big) return static_cast<int32_t>(shard / (base + 1));
    return static_cast<int32_t>(extra + (shard - big) / base);
}

}  // namespace sharding
