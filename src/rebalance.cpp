// The rebalance planner (see rebalance.hpp).
//
// Why it is minimal: a shard stays put only if its owner is a target that
// keeps it, and a target i keeps at most min(have_i, quota_i). Quotas are
// floor(L/k) plus one extra for L mod k targets; handing the extras to the
// targets that already own the most maximises the sum of min(have, quota),
// so no plan moves fewer shards. Ties go to the earlier target, as
// create_map deals the larger ranges to the first nodes.
#include "rebalance.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace sharding {

std::vector<Move> plan_rebalance(const std::vector<std::string> &owners,
                                 const std::vector<std::string> &targets) {
    const size_t L = owners.size(), k = targets.size();
    std::vector<Move> moves;
    if (L == 0 || k == 0) return moves;

    std::unordered_map<std::string, size_t> target_of;
    for (size_t i = 0; i < k; i++) target_of.emplace(targets[i], i);

    // Shards each target owns now, in ascending logical order.
    std::vector<std::vector<int32_t>> held(k);
    std::vector<int32_t> leaving;  // shards on nodes that are not targets
    for (size_t l = 0; l < L; l++) {
        auto it = target_of.find(owners[l]);
        if (it == target_of.end())
            leaving.push_back(static_cast<int32_t>(l));
        else
            held[it->second].push_back(static_cast<int32_t>(l));
    }

    // Quotas: the L mod k extras go to the targets holding the most.
    std::vector<size_t> order(k);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return held[a].size() > held[b].size(); });
    std::vector<size_t> quota(k, L / k);
    for (size_t r = 0; r < L % k; r++) quota[order[r]]++;

    // Targets above quota give up their highest-numbered shards, so the
    // ranges create_map dealt stay as contiguous as possible.
    std::vector<std::pair<int32_t, size_t>> outgoing;  // (logical, from target or k)
    for (int32_t l : leaving) outgoing.emplace_back(l, k);
    for (size_t i = 0; i < k; i++)
        for (size_t j = quota[i]; j < held[i].size(); j++) outgoing.emplace_back(held[i][j], i);
    std::sort(outgoing.begin(), outgoing.end());

    // Fill the targets below quota in the order the caller listed them.
    size_t receiver = 0, room = 0;
    auto next_receiver = [&]() {
        while (receiver < k && held[receiver].size() >= quota[receiver]) receiver++;
        room = receiver < k ? quota[receiver] - held[receiver].size() : 0;
    };
    next_receiver();
    moves.reserve(outgoing.size());
    for (const auto &out : outgoing) {
        // Counting guarantees a receiver exists: sum of quotas equals L.
        moves.push_back(Move{out.first, owners[static_cast<size_t>(out.first)], targets[receiver]});
        if (--room == 0) {
            receiver++;
            next_receiver();
        }
    }
    return moves;
}

}  // namespace sharding
