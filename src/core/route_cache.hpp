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
// Laid out for the common case, a key that is not pinned, on a machine whose
// caches the scan and other processes share: a blocked bit filter (two bits
// in one 64-bit word, about 8 bits per pin: 100,000 pins take 128 KB, about
// 3% false positives) answers most misses with one load; behind it an
// open-addressing table of 24-byte slots. A key of up to 12 bytes (most
// ids and names) is stored in its slot, so a hit costs one slot; a longer
// key's bytes lie in one shared string, at the cost of a second load.
class PinTable {
  public:
    static constexpr size_t inline_bytes = 12;
    // keys[i] is pinned to nodes[i]; hashes[i] is hash_bytes of keys[i].
    void build(const std::vector<std::string> &keys, const std::vector<uint64_t> &hashes,
               const std::vector<int32_t> &nodes);
    // Node index of the pin on `key` (hashed to `hash`), or -1.
    int32_t find(uint64_t hash, const char *key, size_t len) const {
        if (count_ == 0) return -1;
        const uint64_t bits = filter_bits(hash);
        if ((filter_[(hash >> 32) & filter_mask_] & bits) != bits) return -1;
        const uint32_t tag = static_cast<uint32_t>(hash >> 32);
        size_t i = static_cast<size_t>(hash) & slot_mask_;
        for (;;) {
            const Slot &s = slots_[i];
            if (s.node == empty_node) return -1;
            if (s.tag == tag && s.len == len && s.node >= 0 &&
                std::memcmp(len <= inline_bytes ? s.key.bytes : keys_.data() + s.key.offset, key, len) == 0)
                return s.node;
            i = (i + 1) & slot_mask_;
        }
    }
    size_t size() const { return count_; }
    // Incremental changes (a pin changed in the config tables): pins (or
    // re-pins) one key, or removes its pin. Removal leaves a tombstone and
    // the key's filter bits; the table is rebuilt (compacted, filter
    // recomputed) when live entries and tombstones together pass half of
    // it, so the cost per change is constant, amortised.
    // Both return the node the key was pinned to before, or -1.
    int32_t upsert(uint64_t hash, const char *key, size_t len, int32_t node);
    int32_t erase(uint64_t hash, const char *key, size_t len);
    // Bytes held (slots, filter, long keys), for reports.
    size_t bytes() const {
        return slots_.capacity() * sizeof(Slot) + filter_.capacity() * sizeof(uint64_t) + keys_.capacity();
    }

  private:
    static constexpr int32_t empty_node = -1;
    static constexpr int32_t deleted_node = -2;  // tombstone: probes go on past it
    struct Slot {
        uint32_t tag;   // high 32 bits of the key's hash
        int32_t node;   // -1: empty slot, -2: removed
        uint32_t len;   // key length
        union {
            char bytes[inline_bytes];  // len <= inline_bytes: the key itself
            uint32_t offset;           // else: where it starts in keys_
        } key;
    };
    static_assert(sizeof(Slot) == 24, "three slots in 72 bytes");
    // Two bits of a filter word, from hash bits the word index and the slot
    // index do not use.
    static uint64_t filter_bits(uint64_t hash) {
        return (uint64_t{1} << ((hash >> 20) & 63)) | (uint64_t{1} << ((hash >> 26) & 63));
    }
    void rehash(size_t live);
    const char *bytes_of(const Slot &s) const { return s.len <= inline_bytes ? s.key.bytes : keys_.data() + s.key.offset; }
    CacheVector<uint64_t> filter_;  // power-of-two number of words
    CacheVector<Slot> slots_;       // power-of-two size, at most half full
    CacheString keys_;              // the keys longer than inline_bytes, back to back
    uint64_t filter_mask_ = 0;
    size_t slot_mask_ = 0;
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
