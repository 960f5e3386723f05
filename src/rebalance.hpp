// The rebalance planner: pure C++, no PostgreSQL header.
//
// Given the current owner of every logical shard and the target nodes, it
// plans the fewest moves after which every target owns floor(L/k) or
// ceil(L/k) shards and no other node owns any.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sharding {

struct Move {
    int32_t logical;
    std::string from;
    std::string to;
};

// owners[l] is the node owning logical shard l; targets are distinct and
// non-empty (the caller validates). Moves come out ordered by logical shard,
// and the same input always gives the same plan.
std::vector<Move> plan_rebalance(const std::vector<std::string> &owners,
                                 const std::vector<std::string> &targets);

}  // namespace sharding
