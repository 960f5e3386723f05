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
    std::printf("1..10\n");
    // 8 logical shards: a owns 0-2, b owns 3-5, a again 6, c owns 7; pins on
    // pin-only nodes "zeta", "Alpha", "beta" (byte order: Alpha < beta < zeta).
    sharding::MapRoutes m;
    m.logical_shards = 8;
    const char *owners[8] = {"a", "a", "a", "b", "b", "b", "a", "c"};
    for (const char *o : owners) m.owner.push_back(intern(m, o));
    int32_t zeta = intern(m, "zeta"), alpha = intern(m, "Alpha"), beta = intern(m, "beta");
    int32_t b = intern(m, "b");  // already known: same index
    // The build counts each node's pins: the three pin-only nodes hold one each.
    m.node_pins.assign(m.nodes.size(), 0);
    m.node_pins[static_cast<size_t>(zeta)] = m.node_pins[static_cast<size_t>(alpha)] =
        m.node_pins[static_cast<size_t>(beta)] = 1;
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
    // A pin-only node whose last pin was removed (in place) has no partition,
    // and the pin-only nodes after it move up, as a rebuild numbers them.
    m.node_pins[static_cast<size_t>(alpha)] = 0;
    m.compute_partitions();
    check(m.node_partition[static_cast<size_t>(alpha)] == -1 && m.node_partition[static_cast<size_t>(beta)] == 8 &&
              m.node_partition[static_cast<size_t>(zeta)] == 9,
          "a pin-only node without pins has no partition; the others follow in byte order");
    // Incremental changes against a reference: 20,000 upserts, erases and
    // re-pins of keys of 1 to 30 bytes (growth, tombstones, rehashes).
    {
        sharding::PinTable pins;
        pins.build({}, {}, {});
        std::vector<int32_t> ref(5000, -1);
        auto key_of = [](size_t i) { return std::string(1 + i % 30, 'a' + static_cast<char>(i % 26)) + std::to_string(i); };
        uint64_t x = 88172645463325252ull;
        bool same = true;
        size_t live = 0;
        for (int step = 0; step < 20000; step++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            const size_t i = x % ref.size();
            const std::string k = key_of(i);
            const uint64_t h = sharding::hash_bytes(k.data(), k.size());
            int32_t before;
            if (x % 3 == 0) {
                before = pins.erase(h, k.data(), k.size());
                if (ref[i] >= 0) live--;
                same = same && before == ref[i];
                ref[i] = -1;
            } else {
                const int32_t node = static_cast<int32_t>(x % 7);
                before = pins.upsert(h, k.data(), k.size(), node);
                if (ref[i] < 0) live++;
                same = same && before == ref[i];
                ref[i] = node;
            }
        }
        bool found = pins.size() == live;
        for (size_t i = 0; i < ref.size(); i++) {
            const std::string k = key_of(i);
            found = found && pins.find(sharding::hash_bytes(k.data(), k.size()), k.data(), k.size()) == ref[i];
        }
        check(same, "upsert and erase report the node a key was pinned to before");
        check(found, "after 20,000 random upserts and erases every key is found with its node, or not at all");
        // Erasing everything leaves an empty table that still answers.
        for (size_t i = 0; i < ref.size(); i++) {
            const std::string k = key_of(i);
            pins.erase(sharding::hash_bytes(k.data(), k.size()), k.data(), k.size());
        }
        const std::string k = key_of(7);
        check(pins.size() == 0 && pins.find(sharding::hash_bytes(k.data(), k.size()), k.data(), k.size()) == -1,
              "a table emptied by erases finds nothing");
    }
    return tap::status();
}
