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

// The load-aware planner (rebalance_by_load). loads[l] >= 0 is the measured
// load of logical shard l. Afterwards only targets own shards, and the
// largest target load is at most max_imbalance x the mean target load, or,
// when no placement achieves that, as low as the planner can make it (the
// heaviest shard alone is a floor no plan goes below). Among such plans it
// moves as few shards as it can find: on small maps (the search below fits
// its step budget, e.g. 12 shards over 3 nodes) the fewest there are. A map
// already within max_imbalance, with every shard on a target, gets no move.
// Moves come out ordered by logical shard; the same input gives the same
// plan.
struct LoadPlan {
    std::vector<Move> moves;
    double max_load = 0;   // largest target load afterwards
    double mean_load = 0;  // total load / number of targets
    double cap = 0;        // the bound the plan was held to
    bool target_met = false;  // max_load <= max_imbalance x mean_load
    bool exact = false;       // the search proved the move count minimal
};
LoadPlan plan_rebalance_by_load(const std::vector<std::string> &owners,
                                const std::vector<std::string> &targets, const std::vector<double> &loads,
                                double max_imbalance);

}  // namespace sharding
