// Benchmark (not a test): the pin table (src/core/route_cache.hpp) alone,
// outside PostgreSQL, as `test/bench/directory micro` runs it.
//
// A "scan" of 1,000,000 rows (40-byte tuples read in order from one array,
// as a sequential scan streams heap pages through the caches) hashes each
// row's key and looks it up, in the order test/bench/directory uses:
//   - floor: the scan and the hash, no lookup;
//   - small: a table of 10 pins ('small' in the benchmark);
//   - huge: a table of PINS pins, the rows' keys all pinned ('p-' keys) or
//     never pinned ('u-' keys).
// Reports ns per row, medians of RUNS rounds, and the ratio of whole scans
// (floor + lookup), huge against small, as the benchmark's target reads.
// Also the share of keys never pinned that the filter lets through, the
// growth of a table one pin at a time (grow), and the memory latency of
// this machine: a dependent chase of random cache lines over working sets
// from 256 KB to 64 MB (the floor any table that outgrows a cache level
// pays per lookup).
#include "core/route_cache.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Rows {  // 40-byte "tuples": a length byte and the key
    std::vector<char> heap;
    size_t n = 0;
    static constexpr size_t stride = 40;
    void add(const std::string &k) {
        heap.resize((n + 1) * stride);
        heap[n * stride] = static_cast<char>(k.size());
        std::memcpy(&heap[n * stride + 1], k.data(), k.size());
        n++;
    }
};

void table_of(sharding::PinTable &t, size_t pins) {
    std::vector<std::string> keys;
    std::vector<uint64_t> hashes;
    std::vector<int32_t> nodes;
    for (size_t i = 1; i <= pins; i++) {
        keys.push_back("p-" + std::to_string(i));
        hashes.push_back(sharding::hash_bytes(keys.back().data(), keys.back().size()));
        nodes.push_back(static_cast<int32_t>(i % 64));
    }
    t.build(keys, hashes, nodes);
}

// ns per row of one scan; `sum` keeps the work. When `dependent`, a row
// is read only once the previous row's answer is known (the next index
// depends on it), so no two lookups overlap: in PostgreSQL the executor's
// few hundred instructions per row fill the CPU's window while a lookup
// waits, and the next row's lookup cannot start early either.
double scan(const Rows &r, const sharding::PinTable *t, int64_t *sum, bool dependent) {
    const double t0 = now();
    int64_t s = 0;
    for (size_t i = 0; i < r.n;) {
        const char *tup = &r.heap[i * Rows::stride];
        const size_t len = static_cast<unsigned char>(tup[0]);
        const uint64_t h = sharding::hash_bytes(tup + 1, len);
        const int64_t found = t ? t->find(h, tup + 1, len) : static_cast<int64_t>(h & 1);
        s += found;
        i += dependent ? 1 + static_cast<size_t>(found < -1) : 1;  // found >= -1: always 1, but not known before
    }
    *sum += s;
    return (now() - t0) * 1e9 / static_cast<double>(r.n);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Growing a table to `pins` pins one upsert at a time, as a backend that
// has the map cached applies pins added one by one: the whole growth, the
// slowest single upsert (a rebuild of the whole table) and how many times
// the table was resized, medians of `runs` rounds; then one build of as
// many pins at once.
void grow(size_t pins, int runs) {
    std::vector<std::string> keys;
    std::vector<uint64_t> hashes;
    for (size_t i = 1; i <= pins; i++) {
        keys.push_back("p-" + std::to_string(i));
        hashes.push_back(sharding::hash_bytes(keys.back().data(), keys.back().size()));
    }
    const std::vector<int32_t> nodes(pins, 1);
    std::vector<double> total, worst, build;
    size_t resizes = 0, bytes = 0;
    for (int r = 0; r < runs; r++) {
        sharding::PinTable t;
        t.build({}, {}, {});
        size_t slots = t.slots();
        resizes = 0;
        double w = 0;
        const double t0 = now();
        for (size_t i = 0; i < pins; i++) {
            const double a = now();
            t.upsert(hashes[i], keys[i].data(), keys[i].size(), static_cast<int32_t>(i % 64));
            w = std::max(w, now() - a);
            if (t.slots() != slots) resizes++, slots = t.slots();
        }
        total.push_back((now() - t0) * 1e3);
        worst.push_back(w * 1e3);
        bytes = t.bytes();
        sharding::PinTable b;
        const double b0 = now();
        b.build(keys, hashes, nodes);
        build.push_back((now() - b0) * 1e3);
    }
    std::printf("growing to %zu pins one at a time: %.1f ms, %zu resizes, slowest upsert %.2f ms, %.1f bytes per pin; "
                "one build of %zu pins %.1f ms\n",
                pins, median(total), resizes, median(worst), static_cast<double>(bytes) / static_cast<double>(pins), pins,
                median(build));
}

void latency() {
    std::printf("memory latency (dependent reads of random cache lines, best of 5):\n");
    for (size_t kb : {256, 1024, 2048, 4096, 8192, 16384, 24576, 32768, 65536}) {
        const size_t n = kb * 1024 / 64;
        std::vector<uint64_t> lines(n * 8);
        std::vector<uint32_t> perm(n);
        for (size_t i = 0; i < n; i++) perm[i] = static_cast<uint32_t>(i);
        std::mt19937_64 rng(42);
        std::shuffle(perm.begin() + 1, perm.end(), rng);
        for (size_t i = 0; i < n; i++) lines[perm[i] * 8] = perm[(i + 1) % n] * 8;
        double best = 1e9;
        uint64_t x = 0;
        for (int r = 0; r < 5; r++) {
            const size_t steps = 500000;
            const double t0 = now();
            for (size_t i = 0; i < steps; i++) x = lines[x];
            best = std::min(best, (now() - t0) * 1e9 / steps);
        }
        std::printf("  %6zu KB: %6.1f ns%s\n", kb, best, x == 1 ? " " : "");
    }
}
}  // namespace

int main(int argc, char **argv) {
    const size_t pins = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1000000;
    const int runs = argc > 2 ? std::atoi(argv[2]) : 5;
    const size_t rows = 1000000;
    sharding::PinTable small, huge;
    table_of(small, 10);
    table_of(huge, pins);
    Rows pinned, unpinned;
    for (size_t i = 1; i <= rows; i++) {
        pinned.add("p-" + std::to_string(1 + (i * 7919) % pins));
        unpinned.add("u-" + std::to_string(i));
    }
    int64_t sum = 0;
    std::printf("pin table: %zu pins, %zu bytes (%.1f MB, %zu slots), median of %d rounds of %zu rows\n", huge.size(),
                huge.bytes(), huge.bytes() / 1048576.0, huge.slots(), runs, rows);
    for (bool dependent : {false, true}) {
        std::vector<double> f, sp, hp, su, hu;
        for (int r = 0; r <= runs; r++) {
            double a = scan(pinned, nullptr, &sum, dependent), b = scan(pinned, &small, &sum, dependent),
                   c = scan(pinned, &huge, &sum, dependent), d = scan(unpinned, &small, &sum, dependent),
                   e = scan(unpinned, &huge, &sum, dependent);
            if (r == 0) continue;  // warm-up
            f.push_back(a), sp.push_back(b), hp.push_back(c), su.push_back(d), hu.push_back(e);
        }
        std::printf("%s: scan + hash (floor) %.1f ns/row; huge minus small, ns/row: pinned %.1f (%.1f - %.1f), "
                    "unpinned %.1f (%.1f - %.1f)\n",
                    dependent ? "lookups one after another" : "lookups overlapping     ", median(f),
                    median(hp) - median(sp), median(hp), median(sp), median(hu) - median(su), median(hu), median(su));
    }
    {
        size_t passed = 0;
        for (size_t i = 0; i < unpinned.n; i++) {
            const char *tup = &unpinned.heap[i * Rows::stride];
            passed += huge.filter_passes(sharding::hash_bytes(tup + 1, static_cast<unsigned char>(tup[0])));
        }
        std::printf("keys never pinned that pass the filter of 'huge': %.2f%%\n",
                    100.0 * static_cast<double>(passed) / static_cast<double>(unpinned.n));
    }
    grow(pins, runs);
    std::printf("(%lld)\n", static_cast<long long>(sum % 2));
    if (argc > 3) latency();
    return 0;
}
