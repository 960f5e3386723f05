// Building the in-memory routing table (see route_cache.hpp).
#include "core/route_cache.hpp"

#include <algorithm>
#include <cstring>

#include <cstdint>
#include <stdexcept>

namespace sharding {

void PinTable::build(const std::vector<std::string> &keys, const std::vector<uint64_t> &hashes,
                     const std::vector<int32_t> &nodes) {
    size_t total = 0;
    for (const std::string &k : keys)
        if (k.size() > inline_bytes) total += k.size();
    if (total > UINT32_MAX || keys.size() > INT32_MAX) throw std::length_error("too many pinned key bytes");
    size_t cap = 16;
    while (cap < keys.size() * 2) cap <<= 1;  // load factor <= 1/2 keeps probes short
    size_t words = 8;
    while (words * 64 < keys.size() * 8) words <<= 1;
    Slot empty;
    std::memset(&empty, 0, sizeof empty);
    empty.node = -1;
    CacheVector<Slot> slots(cap, empty);
    CacheVector<uint64_t> filter(words, 0);
    CacheString text;
    text.reserve(total);
    const size_t mask = cap - 1;
    size_t count = 0;
    auto bytes_of = [&](const Slot &s) { return s.len <= inline_bytes ? s.key.bytes : text.data() + s.key.offset; };
    for (size_t k = 0; k < keys.size(); k++) {
        const std::string &key = keys[k];
        const uint32_t tag = static_cast<uint32_t>(hashes[k] >> 32);
        size_t i = static_cast<size_t>(hashes[k]) & mask;
        bool replaced = false;
        while (slots[i].node >= 0) {
            // The primary key makes duplicates impossible; keep the last anyway.
            if (slots[i].tag == tag && slots[i].len == key.size() &&
                std::memcmp(bytes_of(slots[i]), key.data(), key.size()) == 0) {
                slots[i].node = nodes[k];
                replaced = true;
                break;
            }
            i = (i + 1) & mask;
        }
        if (replaced) continue;
        Slot s = empty;
        s.tag = tag;
        s.node = nodes[k];
        s.len = static_cast<uint32_t>(key.size());
        if (key.size() <= inline_bytes) {
            std::memcpy(s.key.bytes, key.data(), key.size());
        } else {
            s.key.offset = static_cast<uint32_t>(text.size());
            text.append(key.data(), key.size());
        }
        slots[i] = s;
        filter[(hashes[k] >> 32) & (words - 1)] |= filter_bits(hashes[k]);
        count++;
    }
    filter_.swap(filter);
    slots_.swap(slots);
    keys_.swap(text);
    filter_mask_ = words - 1;
    slot_mask_ = mask;
    count_ = count;
    tombstones_ = 0;
}

void PinTable::rehash(size_t live) {
    std::vector<std::string> keys;
    std::vector<uint64_t> hashes;
    std::vector<int32_t> nodes;
    keys.reserve(live);
    hashes.reserve(live);
    nodes.reserve(live);
    for (const Slot &s : slots_) {
        if (s.node < 0) continue;
        keys.emplace_back(bytes_of(s), s.len);
        hashes.push_back(hash_bytes(keys.back().data(), keys.back().size()));
        nodes.push_back(s.node);
    }
    build(keys, hashes, nodes);
}

int32_t PinTable::upsert(uint64_t hash, const char *key, size_t len, int32_t node) {
    // At most three quarters full (live and tombstones): a probe ends.
    if (slots_.empty() || (count_ + tombstones_ + 1) * 4 > slots_.size() * 3) rehash(count_ + 1);
    const uint32_t tag = static_cast<uint32_t>(hash >> 32);
    size_t i = static_cast<size_t>(hash) & slot_mask_;
    size_t reuse = SIZE_MAX;
    for (;;) {
        Slot &s = slots_[i];
        if (s.node == empty_node) break;
        if (s.node == deleted_node) {
            if (reuse == SIZE_MAX) reuse = i;
        } else if (s.tag == tag && s.len == len && std::memcmp(bytes_of(s), key, len) == 0) {
            const int32_t before = s.node;
            s.node = node;
            return before;
        }
        i = (i + 1) & slot_mask_;
    }
    if (len > inline_bytes && keys_.size() + len > UINT32_MAX) throw std::length_error("too many pinned key bytes");
    Slot fresh;
    std::memset(&fresh, 0, sizeof fresh);
    fresh.tag = tag;
    fresh.node = node;
    fresh.len = static_cast<uint32_t>(len);
    if (len <= inline_bytes) {
        std::memcpy(fresh.key.bytes, key, len);
    } else {
        fresh.key.offset = static_cast<uint32_t>(keys_.size());
        keys_.append(key, len);
    }
    if (reuse != SIZE_MAX) {
        i = reuse;
        tombstones_--;
    }
    slots_[i] = fresh;
    filter_[(hash >> 32) & filter_mask_] |= filter_bits(hash);
    count_++;
    // The filter was sized for the build's count; keep about 8 bits per pin.
    if (count_ * 4 > filter_.size() * 64) rehash(count_);
    return -1;
}

int32_t PinTable::erase(uint64_t hash, const char *key, size_t len) {
    if (count_ == 0) return -1;
    const uint32_t tag = static_cast<uint32_t>(hash >> 32);
    size_t i = static_cast<size_t>(hash) & slot_mask_;
    for (;;) {
        Slot &s = slots_[i];
        if (s.node == empty_node) return -1;
        if (s.node >= 0 && s.tag == tag && s.len == len && std::memcmp(bytes_of(s), key, len) == 0) {
            const int32_t before = s.node;
            s.node = deleted_node;
            count_--;
            tombstones_++;
            return before;
        }
        i = (i + 1) & slot_mask_;
    }
}

int32_t MapRoutes::find_or_add_node(const char *node, size_t len, bool *added) {
    *added = false;
    for (size_t n = 0; n < nodes.size(); n++)
        if (nodes[n].size() == len && std::memcmp(nodes[n].data(), node, len) == 0) return static_cast<int32_t>(n);
    nodes.emplace_back(node, len);
    *added = true;
    return static_cast<int32_t>(nodes.size() - 1);
}

void MapRoutes::compute_partitions() {
    node_partition.assign(nodes.size(), -1);
    for (int32_t l = 0; l < logical_shards; l++) {
        int32_t &p = node_partition[static_cast<size_t>(owner[static_cast<size_t>(l)])];
        if (p < 0) p = l;
    }
    std::vector<int32_t> pin_only;
    node_pins.resize(nodes.size(), 0);
    for (size_t n = 0; n < nodes.size(); n++)
        if (node_partition[n] < 0 && node_pins[n] > 0) pin_only.push_back(static_cast<int32_t>(n));
    // std::string compares like memcmp, then by length: PostgreSQL's "C" order.
    std::sort(pin_only.begin(), pin_only.end(),
              [this](int32_t a, int32_t b) { return nodes[static_cast<size_t>(a)] < nodes[static_cast<size_t>(b)]; });
    for (size_t i = 0; i < pin_only.size(); i++)
        node_partition[static_cast<size_t>(pin_only[i])] = logical_shards + static_cast<int32_t>(i);
}

int32_t MapRoutes::node_index(const char *node, size_t len) {
    // Pins may name many dedicated nodes, so intern through a hash.
    auto ins = node_ids_.emplace(std::string(node, len), static_cast<int32_t>(nodes.size()));
    if (ins.second) nodes.emplace_back(node, len);
    return ins.first->second;
}

}  // namespace sharding
