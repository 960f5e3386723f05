// Hash support functions that make PostgreSQL's hash partitioning agree with
// shard_of: pure C++, no PostgreSQL header.
//
// PostgreSQL routes a row of a hash-partitioned table by calling each key
// column's extended hash support function with HASH_PARTITION_SEED and
// folding the results, starting from 0, with hash_combine64 (partbounds.c,
// compute_partition_hash_value); the partition is that value mod the modulus.
// hash_combine64(0, b) = b + kCombineConstant, so for a single-column key the
// extended hash must return h - kCombineConstant (mod 2^64) for the row hash
// to be h, our XXH3 hash, and the remainder to be shard_of(key, modulus).
#pragma once

#include "core/hash_core.hpp"

#include <cstdint>

namespace sharding {

// catalog/partition.h
constexpr uint64_t kHashPartitionSeed = 0x7A5B22367996DCFDULL;
// common/hashfn.h, hash_combine64
constexpr uint64_t kCombineConstant = 0x49a0f4dd15e5a8e3ULL;

// PostgreSQL's hash_combine64, for documentation and tests of the identity.
constexpr uint64_t hash_combine64(uint64_t a, uint64_t b) {
    return a ^ (b + kCombineConstant + (a << 54) + (a >> 7));
}

// Support function 1 (standard 32-bit hash): the low 32 bits of h.
inline uint32_t standard_hash(uint64_t h) { return static_cast<uint32_t>(h); }

// Support function 2 (extended 64-bit hash with seed):
// - seed 0: h itself, so its low 32 bits are the standard hash (a hash
//   opclass must keep the two in step);
// - HASH_PARTITION_SEED: h - kCombineConstant, so that partition routing
//   computes hash_combine64(0, .) = h;
// - any other seed: an independent 64-bit hash of h under that seed.
inline uint64_t extended_hash(uint64_t h, uint64_t seed) {
    if (seed == 0) return h;
    if (seed == kHashPartitionSeed) return h - kCombineConstant;
    unsigned char bytes[8];
    for (int i = 0; i < 8; i++) bytes[i] = static_cast<unsigned char>(h >> (8 * i));
    return XXH3_64bits_withSeed(bytes, sizeof bytes, seed);
}

static_assert(hash_combine64(0, 0x1234567890abcdefULL - kCombineConstant) == 0x1234567890abcdefULL,
              "a single-column row hash must be our hash itself");

}  // namespace sharding
