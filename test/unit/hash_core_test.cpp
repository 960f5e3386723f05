// Unit tests of the pure C++ core (src/core/hash_core.hpp), no PostgreSQL needed.
// Emits TAP. Built and run by test/harness/unit.sh.
#include "core/hash_core.hpp"
#include "tap.hpp"

#include <cstdio>
#include <random>

namespace {
using tap::check;
}  // namespace

int main() {
    std::printf("1..6\n");
    std::mt19937_64 rng(20261129);

    // FastMod agrees with % for edge divisors and edge dividends.
    const uint64_t divisors[] = {1, 2, 3, 5, 7, 63, 64, 65, 127, 480, 1000003, 4294967295ull,
                                 2147483647, 2147483648ull, 1ull << 40, (1ull << 63) + 7, ~0ull};
    const uint64_t dividends[] = {0, 1, 2, 63, 64, 479, 480, 2147483646, 2147483647,
                                  ~0ull, ~0ull - 1, 1ull << 63, (1ull << 63) - 1};
    bool edges = true;
    for (uint64_t d : divisors) {
        sharding::FastMod fm;
        fm.set(d);
        for (uint64_t h : dividends) edges &= fm.mod(h) == h % d;
        for (int i = 0; i < 20000; i++) {
            uint64_t h = rng();
            edges &= fm.mod(h) == h % d;
        }
    }
    check(edges, "FastMod equals % for edge divisors and dividends");

    // Random divisors in the shard-count range.
    bool random_ok = true;
    for (int i = 0; i < 3000; i++) {
        uint64_t d = 1 + rng() % 2147483647ull;
        sharding::FastMod fm;
        fm.set(d);
        for (int j = 0; j < 1000; j++) {
            uint64_t h = rng();
            random_ok &= fm.mod(h) == h % d;
        }
    }
    check(random_ok, "FastMod equals % for 3,000,000 random (hash, n) pairs");

    // Jump hash: in range, and growing n moves keys only into the new bucket.
    bool jump_ok = true;
    for (int i = 0; i < 20000; i++) {
        uint64_t k = rng();
        int32_t prev = sharding::jump_from_hash(k, 1);
        jump_ok &= prev == 0;
        for (int32_t n = 2; n <= 200; n++) {
            int32_t b = sharding::jump_from_hash(k, n);
            jump_ok &= b >= 0 && b < n && (b == prev || b == n - 1);
            prev = b;
        }
    }
    check(jump_ok, "jump hash stays in range and only moves keys to the new bucket");

    // Dealing: contiguous, sizes differ by at most one, larger first, inverse agrees.
    bool deal_ok = true;
    for (int32_t workers = 1; workers <= 70; workers++) {
        for (int32_t shards = 1; shards <= 500; shards += (shards < 100 ? 1 : 37)) {
            int32_t next = 0, prev_count = shards + 1;
            for (int32_t w = 0; w < workers; w++) {
                sharding::Range r = sharding::dealt_range(w, workers, shards);
                deal_ok &= r.first == next && r.count <= prev_count && r.count >= 0;
                deal_ok &= r.count == shards / workers || r.count == shards / workers + 1;
                for (int32_t s = r.first; s < r.first + r.count; s++)
                    deal_ok &= sharding::dealt_owner(s, workers, shards) == w;
                next += r.count;
                prev_count = r.count;
            }
            deal_ok &= next == shards;
        }
    }
    check(deal_ok, "dealt_range deals contiguous near-equal ranges, larger first; dealt_owner inverts it");

    sharding::Range r = sharding::dealt_range(1, 4, 64);
    check(r.first == 16 && r.count == 16, "64 over 4: node 2 gets 16..31");
    bool ten = sharding::dealt_range(0, 4, 10).count == 3 && sharding::dealt_range(1, 4, 10).count == 3 &&
               sharding::dealt_range(2, 4, 10).count == 2 && sharding::dealt_range(3, 4, 10).count == 2;
    check(ten, "10 over 4: 3,3,2,2");
    return tap::status();
}
