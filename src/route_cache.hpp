// The in-memory routing table of one map: pure C++, no PostgreSQL header.
//
// node_for() runs once per row, so a lookup must cost a hash, a modulo, an
// array index and, when the map has pins, one probe of an open-addressing
// table. Nothing here allocates on lookup; everything is built once by
// MapRoutes::build and then only read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace sharding {

// Pins: key text -> node index. Keys are hashed with XXH3 over their text
// form, the hash the text overloads of node_for compute anyway.
class PinTable {
  public:
    // keys[i] is pinned to nodes[i]; hashes[i] is hash_bytes of keys[i].
    void build(const std::vector<std::string> &keys, const std::vector<uint64_t> &hashes,
               const std::vector<int32_t> &nodes);
    // Node index of the pin on `key` (hashed to `hash`), or -1.
    int32_t find(uint64_t hash, const char *key, size_t len) const {
        if (slots_.empty()) return -1;
        size_t i = static_cast<size_t>(hash) & mask_;
        for (;;) {
            const Slot &s = slots_[i];
            if (s.node < 0) return -1;
            if (s.hash == hash && s.len == len && std::memcmp(keys_.data() + s.offset, key, len) == 0)
                return s.node;
            i = (i + 1) & mask_;
        }
    }
    size_t size() const { return count_; }

  private:
    struct Slot {
        uint64_t hash;
        size_t offset;  // into keys_
        size_t len;
        int32_t node;  // -1: empty slot
    };
    std::vector<Slot> slots_;  // power-of-two size, at most half full
    std::string keys_;         // every pinned key, back to back
    size_t mask_ = 0;
    size_t count_ = 0;
};

// Everything node_for and logical_shard need about one map.
struct MapRoutes {
    std::string name;
    int32_t logical_shards = 0;
    std::vector<int32_t> owner;       // logical shard -> index into nodes
    std::vector<std::string> nodes;   // distinct node names
    PinTable pins;
    uint64_t generation = 0;          // cache generation it was built in

    // Interns a node name, returning its index (while building).
    int32_t node_index(const char *node, size_t len);
    // Drops what only building needed.
    void finish_build() { std::unordered_map<std::string, int32_t>().swap(node_ids_); }

  private:
    std::unordered_map<std::string, int32_t> node_ids_;
};

}  // namespace sharding
