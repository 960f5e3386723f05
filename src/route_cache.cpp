// Building the in-memory routing table (see route_cache.hpp).
#include "route_cache.hpp"

namespace sharding {

void PinTable::build(const std::vector<std::string> &keys, const std::vector<uint64_t> &hashes,
                     const std::vector<int32_t> &nodes) {
    size_t total = 0;
    for (const std::string &k : keys) total += k.size();
    std::string text;
    text.reserve(total);
    size_t cap = 16;
    while (cap < keys.size() * 2) cap <<= 1;  // load factor <= 1/2 keeps probes short
    std::vector<Slot> slots(cap, Slot{0, 0, 0, -1});
    size_t mask = cap - 1, count = 0;
    for (size_t k = 0; k < keys.size(); k++) {
        size_t i = static_cast<size_t>(hashes[k]) & mask;
        bool replaced = false;
        while (slots[i].node >= 0) {
            // The primary key makes duplicates impossible; keep the last anyway.
            if (slots[i].hash == hashes[k] && slots[i].len == keys[k].size() &&
                text.compare(slots[i].offset, slots[i].len, keys[k]) == 0) {
                slots[i].node = nodes[k];
                replaced = true;
                break;
            }
            i = (i + 1) & mask;
        }
        if (replaced) continue;
        slots[i] = Slot{hashes[k], text.size(), keys[k].size(), nodes[k]};
        text += keys[k];
        count++;
    }
    if (keys.empty()) slots.clear();  // find() short-circuits on an empty table
    slots_.swap(slots);
    keys_.swap(text);
    mask_ = mask;
    count_ = count;
}

int32_t MapRoutes::node_index(const char *node, size_t len) {
    // Pins may name many dedicated nodes, so intern through a hash.
    auto ins = node_ids_.emplace(std::string(node, len), static_cast<int32_t>(nodes.size()));
    if (ins.second) nodes.push_back(ins.first->first);
    return ins.first->second;
}

}  // namespace sharding
