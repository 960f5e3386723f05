// Unit tests of MapRoutes::compute_partitions (src/core/route_cache.hpp): the
// PL/Proxy partition of every node of a map. Emits TAP.
#include "core/route_cache.hpp"
#include "tap.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {
using tap::check;

int32_t intern(sharding::MapRoutes &m, const char *name) { return m.node_index(name, std::strlen(name)); }
}  // namespace

int main() {
    std::printf("1..6\n");
    // 8 logical shards: a owns 0-2, b owns 3-5, a again 6, c owns 7; pins on
    // pin-only nodes "zeta", "Alpha", "beta" (byte order: Alpha < beta < zeta).
    sharding::MapRoutes m;
    m.logical_shards = 8;
    const char *owners[8] = {"a", "a", "a", "b", "b", "b", "a", "c"};
    for (const char *o : owners) m.owner.push_back(intern(m, o));
    int32_t zeta = intern(m, "zeta"), alpha = intern(m, "Alpha"), beta = intern(m, "beta");
    int32_t b = intern(m, "b");  // already known: same index
    m.finish_build();
    m.compute_partitions();
    check(m.node_partition[static_cast<size_t>(m.owner[0])] == 0 && m.node_partition[static_cast<size_t>(b)] == 3 &&
              m.node_partition[static_cast<size_t>(m.owner[7])] == 7,
          "an owning node's partition is the lowest logical shard it owns");
    check(m.node_partition[static_cast<size_t>(alpha)] == 8 && m.node_partition[static_cast<size_t>(beta)] == 9 &&
              m.node_partition[static_cast<size_t>(zeta)] == 10,
          "pin-only nodes follow the logical partitions in byte order of their names");
    check(m.node_partition.size() == m.nodes.size(), "every node has a partition");

    sharding::MapRoutes plain;
    plain.logical_shards = 2;
    plain.owner.push_back(intern(plain, "x"));
    plain.owner.push_back(intern(plain, "y"));
    plain.finish_build();
    plain.compute_partitions();
    check(plain.node_partition[0] == 0 && plain.node_partition[1] == 1, "a map without pins: owners only");
    // Pins inline (<= 12 bytes) and out of line, around the boundary.
    {
        std::vector<std::string> keys;
        std::vector<uint64_t> hashes;
        std::vector<int32_t> nodes;
        for (size_t len = 0; len <= 40; len++) {
            keys.push_back(std::string(len, 'k'));
            hashes.push_back(sharding::hash_bytes(keys.back().data(), keys.back().size()));
            nodes.push_back(static_cast<int32_t>(len));
        }
        sharding::PinTable pins;
        pins.build(keys, hashes, nodes);
        bool all = pins.size() == keys.size(), none = true;
        for (size_t i = 0; i < keys.size(); i++) {
            const std::string &k = keys[i];
            all = all && pins.find(hashes[i], k.data(), k.size()) == nodes[i];
            std::string other = k + "x";  // a pinned key's extension is not pinned
            if (!k.empty()) other = k.substr(0, k.size() - 1) + "j";
            none = none && pins.find(sharding::hash_bytes(other.data(), other.size()), other.data(), other.size()) == -1;
        }
        check(all, "pins of 0 to 40 bytes, inline and out of line, are all found with their node");
        check(none, "keys differing in their last byte are not pinned");
    }
    return tap::status();
}
