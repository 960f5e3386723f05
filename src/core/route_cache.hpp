// The in-memory routing table of one map: pure C++, no PostgreSQL header.
// Its containers allocate in the cache module's memory context
// (cache_alloc.hpp).
//
// node_for() runs once per row, so a lookup must cost a hash, a modulo, an
// array index and, when the map has pins, one probe of an open-addressing
// table. Nothing here allocates on lookup; everything is built once by
// MapRoutes::build and then only read.
#pragma once

#include "core/cache_alloc.hpp"
#include "core/hash_core.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace sharding {

// Pins: key text -> node index. Keys are hashed with XXH3 over their text
// form, the hash the text overloads of node_for compute anyway.
//
// Laid out for a machine whose caches the scan and other processes share
// (docs/directory.md, "What a lookup costs"): one random read of the table
// costs a miss of the last-level cache once a directory outgrows the L2
// cache, so a lookup makes at most one such read where it can.
//   - A blocked bit filter (three bits in one 64-bit word, 10 bits per pin
//     the table was sized for: 1,000,000 pins take 1.2 MB) answers most
//     keys that are not pinned: it lets 2.3% of them through (measured at
//     100,000, 400,000 and 1,000,000 pins, test/unit/route_cache_test.cpp).
//   - Behind it a table of 16-byte slots in 64-byte buckets (one cache
//     line), filled to at most 7/8 by linear probing from the key's home
//     bucket. A key of up to 12 bytes (most ids and names) lies in its slot
//     and is compared there, byte for byte, so a hit reads one line (two
//     when its home bucket overflowed); a longer key's bytes lie in one
//     shared string, at the cost of a second read.
// Identity is always the key's exact bytes: the hash only chooses where to
// look.
class PinTable {
  public:
    static constexpr size_t inline_bytes = 12;
    // Node indexes are stored in 24 bits.
    static constexpr int32_t max_node = (1 << 24) - 1;
    PinTable() = default;
    PinTable(const PinTable &) = delete;
    PinTable &operator=(const PinTable &) = delete;
    ~PinTable() { release(); }
    // A key's bytes, not owned.
    struct KeyRef {
        const char *data;
        size_t len;
    };
    // keys[i] is pinned to nodes[i]; hashes[i] is hash_bytes of keys[i].
    // The table is sized for max(n, capacity) pins (at most 3/4 full).
    // Throws std::length_error past the limits (4 GB of long key bytes,
    // 2^31 pins, node indexes above max_node), std::bad_alloc.
    void build(const KeyRef *keys, const uint64_t *hashes, const int32_t *nodes, size_t n, size_t capacity = 0);
    void build(const std::vector<std::string> &keys, const std::vector<uint64_t> &hashes,
               const std::vector<int32_t> &nodes, size_t capacity = 0);
    // Node index of the pin on `key` (hashed to `hash`), or -1.
    int32_t find(uint64_t hash, const char *key, size_t len) const {
        if (count_ == 0 || !filter_passes(hash)) return -1;
        // A bucket's four slots are compared without a branch per slot: one
        // branch on the bucket (found here, or not), which predicts well
        // whatever slot the key lies in.
        const Probe q(hash, key, len);
        size_t b = home_bucket(hash);
        for (;;) {
            const Slot *s = slots_ + b * bucket_slots;
            unsigned hit = 0, empty = 0;
            for (unsigned j = 0; j < bucket_slots; j++) {
                hit |= static_cast<unsigned>(q.same_words(s[j])) << j;
                empty |= static_cast<unsigned>((s[j].w0 & 0xff) == code_empty) << j;
            }
            for (; hit != 0; hit &= hit - 1) {
                const Slot &h = s[__builtin_ctz(hit)];
                if (len <= inline_bytes || std::memcmp(keys_.data() + (h.w0 >> 32), key, len) == 0) return node_of(h);
            }
            // A key lies before the first empty slot of its probe sequence.
            if (empty != 0) return -1;
            if (++b == nbuckets_) b = 0;
        }
    }
    // Whether the filter lets `hash` through (a key never pinned that it
    // lets through costs a read of the table).
    bool filter_passes(uint64_t hash) const {
        if (count_ == 0) return false;  // no filter allocated (find has checked already)
        const uint64_t bits = filter_bits(hash);
        return (filter_[filter_word(hash, filter_words_)] & bits) == bits;
    }
    size_t size() const { return count_; }
    // Incremental changes (a pin changed in the config tables): pins (or
    // re-pins) one key, or removes its pin. Removal leaves a tombstone and
    // the key's filter bits; the table is rebuilt (compacted, filter
    // recomputed) when live entries and tombstones together pass 7/8 of it:
    // with twice the slots when the live entries alone fill more than 3/4
    // (so growing to n pins one at a time rebuilds O(log n) times, and the
    // cost per change is constant, amortised), else sized for the live
    // entries, as a build.
    // Both return the node the key was pinned to before, or -1.
    int32_t upsert(uint64_t hash, const char *key, size_t len, int32_t node);
    int32_t erase(uint64_t hash, const char *key, size_t len);
    // Bytes held (slots, filter, long keys, alignment), for reports.
    size_t bytes() const { return slots_bytes_ + filter_bytes_ + keys_.capacity(); }
    // The longest run of slots a lookup of a pinned key reads (tests).
    size_t longest_probe() const;
    size_t slots() const { return nslots_; }

  private:
    // A slot is two words. w0: bits 0-7 a code (0 empty, 1-13 an inline
    // key of code - 1 bytes, 14 a long key, 15 removed), bits 8-31 the
    // node, bits 32-63 the key's bytes 0-3 (inline) or its offset in keys_
    // (long). w1: the key's bytes 4-11, zero-padded (inline), or its length
    // and the low 32 bits of its hash (long).
    struct Slot {
        uint64_t w0, w1;
    };
    static_assert(sizeof(Slot) == 16, "four slots in a 64-byte bucket");
    static constexpr uint64_t code_empty = 0, code_long = 14, code_removed = 15;
    static constexpr size_t bucket_slots = 4;
    // What a slot holding the key looks like, but for the node (and, for a
    // long key, its offset).
    struct Probe {
        uint64_t mask, w0, w1;
        Probe(uint64_t hash, const char *key, size_t len) {
            if (len <= inline_bytes) {
                char pad[inline_bytes] = {};
                std::memcpy(pad, key, len);
                uint32_t lo;
                std::memcpy(&lo, pad, 4);
                std::memcpy(&w1, pad + 4, 8);
                w0 = (len + 1) | (uint64_t{lo} << 32);
                mask = 0xffffffff000000ffull;
            } else {
                w0 = code_long;
                w1 = static_cast<uint64_t>(len) | (hash << 32);
                mask = 0xff;
            }
        }
        // Whether slot s holds the key; a long key's bytes start at
        // long_keys + its offset.
        bool same_words(const Slot &s) const { return ((s.w0 & mask) == w0) & (s.w1 == w1); }
        bool holds(const Slot &s, const char *long_keys, const char *key, size_t len) const {
            return same_words(s) &&
                   (len <= inline_bytes || std::memcmp(long_keys + (s.w0 >> 32), key, len) == 0);
        }
    };
    static int32_t node_of(const Slot &s) { return static_cast<int32_t>(static_cast<uint32_t>(s.w0) >> 8); }
    static void set_node(Slot &s, int32_t node) {
        s.w0 = (s.w0 & 0xffffffff000000ffull) | (static_cast<uint64_t>(node) << 8);
    }
    // The key a used slot holds.
    std::string key_of(const Slot &s) const;
    // Its bytes: in the slot (copied to buf) or in keys_.
    KeyRef key_ref(const Slot &s, char (&buf)[inline_bytes]) const;
    // The filter word of a hash: its low 32 bits scaled to the word count
    // (any count, not only a power of two, so the filter takes 10 bits per
    // pin, not 8 to 16), and three bits of it from hash bits 32-49, which
    // the word index does not use. (The home bucket takes the hash's high
    // bits too, but the filter and the table are independent.)
    static size_t filter_word(uint64_t hash, size_t words) {
        return static_cast<size_t>(((hash & 0xffffffffull) * words) >> 32);
    }
    static uint64_t filter_bits(uint64_t hash) {
        return (uint64_t{1} << ((hash >> 32) & 63)) | (uint64_t{1} << ((hash >> 38) & 63)) |
               (uint64_t{1} << ((hash >> 44) & 63));
    }
    static constexpr size_t filter_bits_per_pin = 10;
    // The key's home bucket (from the hash's high bits), and its first slot.
    static size_t bucket_of(uint64_t hash, size_t nbuckets) {
        return static_cast<size_t>((static_cast<unsigned __int128>(hash) * nbuckets) >> 64);
    }
    size_t home_bucket(uint64_t hash) const { return bucket_of(hash, nbuckets_); }
    size_t home(uint64_t hash) const { return home_bucket(hash) * bucket_slots; }
    // Rebuilds from the slots (no tombstones, long keys compacted), sized
    // for max(size(), capacity) pins.
    void rehash(size_t capacity);
    // Allocates a table for max(n, capacity) pins and fills it with the n
    // pins next() returns one by one (long_bytes: their long keys' bytes).
    // `dups` when keys may repeat (the last one wins). The table is swapped
    // in only when filled: on an exception it is as it was.
    struct Entry {
        KeyRef key;
        uint64_t hash;
        int32_t node;
    };
    template <class Next>
    void fill(size_t n, size_t capacity, size_t long_bytes, bool dups, Next next);
    void release();
    Slot *slots_ = nullptr;         // nslots_ slots, 64-byte aligned, at most 7/8 used
    uint64_t *filter_ = nullptr;    // filter_words_ words
    void *slots_raw_ = nullptr;     // the allocations behind them
    void *filter_raw_ = nullptr;
    CacheString keys_;              // the keys longer than inline_bytes, back to back
    size_t nslots_ = 0, nbuckets_ = 0, filter_words_ = 0;
    size_t slots_bytes_ = 0, filter_bytes_ = 0;  // allocated, alignment included
    size_t count_ = 0;
    size_t tombstones_ = 0;
};

// Everything node_for and logical_shard need about one map.
struct MapRoutes {
    CacheString name;
    int32_t logical_shards = 0;
    FastMod shard_mod;                // h mod logical_shards, as shard_of computes it
    CacheVector<int32_t> owner;       // logical shard -> index into nodes
    CacheVector<int64_t> epoch;       // logical shard -> its epoch (sharding.epoch)
    CacheVector<CacheString> nodes;   // distinct node names
    CacheVector<const void *> node_results;  // per node: the result node_for returns (maps.cpp)
    CacheVector<int32_t> node_partition;     // per node: its PL/Proxy partition (compute_partitions)
    CacheVector<uint64_t> node_pins;         // per node: how many keys are pinned to it
    PinTable pins;
    uint32_t slot = 0;                // the map name's change slot (cache::map_slot)
    uint64_t stamp[3] = {0, 0, 0};    // its change counters (cache::MapStamp), read before the snapshot
    uint64_t cursor_shared = 0;       // where the pin logs stood then (cache::PinCursor)
    uint64_t cursor_own = 0;
    // Without shared memory, where sharding.pin_log stood then (maps.cpp):
    // its highest seq and the snapshot (pg_snapshot text) it was read in.
    int64_t log_seq = -1;             // -1: not read (no log): rebuild on a change
    CacheString log_snapshot;

    // shard_from_hash(hash, logical_shards), without a 64-bit division (the
    // same FastMod shard_of uses).
    int32_t shard_of_hash(uint64_t hash) const { return static_cast<int32_t>(shard_mod.mod(hash)); }
    // PL/Proxy partitions (docs/nodes.md, partition_for): a node that
    // owns logical shards is reached through the lowest one it owns; a node
    // that only holds pins gets its own partition after the logical ones, in
    // byte order of node names (as cluster_partitions lists them). A node
    // that owns nothing and holds no pin any more (after incremental
    // changes) has none (-1).
    void compute_partitions();
    // Interns a node name, returning its index (while building).
    int32_t node_index(const char *node, size_t len);
    // Drops what only building needed.
    void finish_build() { std::unordered_map<std::string, int32_t>().swap(node_ids_); }
    // A node's index after the build (a linear search: pins changed one by
    // one), appending it if new; returns whether it was appended.
    int32_t find_or_add_node(const char *node, size_t len, bool *added);

  private:
    std::unordered_map<std::string, int32_t> node_ids_;
};

}  // namespace sharding
