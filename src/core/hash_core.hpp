// The stable shard hash: pure C++, no PostgreSQL header.
//
// These functions define the compatibility promise of docs/hashing.md
// ("Computing the same shard outside the database"): XXH3-64 with seed 0
// over a key's canonical bytes, then either a plain modulo or Lamping-Veach
// jump consistent hashing. Their values must
// never change between versions, platforms or byte orders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    std::memcpy(bytes, &u, sizeof bytes);
#else
    for (int i = 0; i < 8; i++) bytes[i] = static_cast<unsigned char>(u >> (8 * i));
#endif
    return XXH3_64bits(bytes, sizeof bytes);
}

// Unsigned hash mod n; n must be >= 1.
inline int32_t shard_from_hash(uint64_t hash, int32_t n) {
    return static_cast<int32_t>(hash % static_cast<uint64_t>(n));
}

// h mod n without a 64-bit division, for a divisor reused across many calls.
// Powers of two use a mask; other divisors use Lemire, Kaser & Kurz, "Faster
// Remainder by Direct Computation" (2019): with M = floor((2^128 - 1) / n) + 1,
// h mod n = ((M * h mod 2^128) * n) >> 128, exact for every 64-bit h and every
// n < 2^64. M is kept as two 64-bit halves so that the struct needs only
// 8-byte alignment (it may live in palloc'd memory).
struct FastMod {
    uint64_t n = 0, mask = 0, m_hi = 0, m_lo = 0;
    bool pow2 = false;

    void set(uint64_t divisor) {
        n = divisor;
        pow2 = (divisor & (divisor - 1)) == 0;
        mask = divisor - 1;
        if (!pow2) {
            unsigned __int128 m = ~static_cast<unsigned __int128>(0) / divisor + 1;
            m_hi = static_cast<uint64_t>(m >> 64);
            m_lo = static_cast<uint64_t>(m);
        }
    }

    uint64_t mod(uint64_t h) const {
        if (pow2) return h & mask;
        unsigned __int128 m = (static_cast<unsigned __int128>(m_hi) << 64) | m_lo;
        unsigned __int128 low = m * h;  // mod 2^128
        unsigned __int128 bottom = (static_cast<unsigned __int128>(static_cast<uint64_t>(low)) * n) >> 64;
        unsigned __int128 top = static_cast<unsigned __int128>(static_cast<uint64_t>(low >> 64)) * n;
        return static_cast<uint64_t>((bottom + top) >> 64);
    }
};

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
