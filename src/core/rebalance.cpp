// The rebalance planner (see rebalance.hpp).
//
// Why it is minimal: a shard stays put only if its owner is a target that
// keeps it, and a target i keeps at most min(have_i, quota_i). Quotas are
// floor(L/k) plus one extra for L mod k targets; handing the extras to the
// targets that already own the most maximises the sum of min(have, quota),
// so no plan moves fewer shards. Ties go to the earlier target, as
// create_map deals the larger ranges to the first nodes.
#include "core/rebalance.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <tuple>
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


// ---------------------------------------------------------------------------
// The load-aware planner (rebalance_by_load).
//
// Two steps. First the bound: the plan must hold every target at or under
// cap = max(max_imbalance x mean, M), where M is the lowest largest-node
// load any placement reaches (found by a branch-and-bound search seeded with
// the longest-processing-time packing; the heaviest shard and the mean are
// floors no placement goes below). So the target is met whenever it can be,
// and otherwise the largest node is as light as the shards allow. Second, the
// fewest moves under that cap: a greedy pass (shards leaving non-target nodes
// go heaviest first to the lightest target; then an overloaded target sheds
// the one shard that brings it under the cap, or else its heaviest shard
// that fits the lightest target) gives a plan, and a branch-and-bound search
// (each shard tries its owner first, then the other targets; pruned by the
// moves of the best plan so far plus the shards that must leave non-targets)
// improves it and proves it minimal when it finishes within its step budget,
// as it does on small maps (12 shards over 3 nodes, for instance).

namespace {

constexpr double kRelEps = 1e-9;
constexpr long kSearchBudget = 4000000;

bool fits(double load, double cap) { return load <= cap + kRelEps * std::max(1.0, std::fabs(cap)); }

struct LoadProblem {
    size_t L = 0, k = 0;
    std::vector<int> home;  // target index of the owner, -1 for a node that is not a target
    std::vector<double> load;
    std::vector<size_t> heavy_first;  // shards by load, heaviest first, then by number
};

double largest(const LoadProblem &p, const std::vector<int> &a) {
    std::vector<double> tl(p.k, 0);
    for (size_t l = 0; l < p.L; l++) tl[static_cast<size_t>(a[l])] += p.load[l];
    return p.k ? *std::max_element(tl.begin(), tl.end()) : 0;
}

size_t moves_of(const LoadProblem &p, const std::vector<int> &a) {
    size_t m = 0;
    for (size_t l = 0; l < p.L; l++) m += a[l] != p.home[l];
    return m;
}

size_t lightest(const std::vector<double> &tl, size_t except = SIZE_MAX) {
    size_t best = SIZE_MAX;
    for (size_t t = 0; t < tl.size(); t++)
        if (t != except && (best == SIZE_MAX || tl[t] < tl[best])) best = t;
    return best;
}

// Longest processing time first: every shard, heaviest first, to the
// lightest target. Ignores where shards are now.
std::vector<int> lpt(const LoadProblem &p) {
    std::vector<int> a(p.L);
    std::vector<double> tl(p.k, 0);
    for (size_t l : p.heavy_first) {
        size_t t = lightest(tl);
        a[l] = static_cast<int>(t);
        tl[t] += p.load[l];
    }
    return a;
}

// Relabels the bins of an assignment so that as many shards as possible stay
// on their owner (a bin's load does not depend on which target holds it).
std::vector<int> relabel(const LoadProblem &p, const std::vector<int> &a) {
    std::vector<std::vector<size_t>> overlap(p.k, std::vector<size_t>(p.k, 0));  // [bin][target]
    for (size_t l = 0; l < p.L; l++)
        if (p.home[l] >= 0) overlap[static_cast<size_t>(a[l])][static_cast<size_t>(p.home[l])]++;
    std::vector<int> bin_to(p.k, -1);
    std::vector<bool> taken(p.k, false);
    for (size_t round = 0; round < p.k; round++) {
        size_t bb = SIZE_MAX, bt = SIZE_MAX;
        for (size_t b = 0; b < p.k; b++) {
            if (bin_to[b] >= 0) continue;
            for (size_t t = 0; t < p.k; t++)
                if (!taken[t] && (bb == SIZE_MAX || overlap[b][t] > overlap[bb][bt])) bb = b, bt = t;
        }
        bin_to[bb] = static_cast<int>(bt);
        taken[bt] = true;
    }
    std::vector<int> out(p.L);
    for (size_t l = 0; l < p.L; l++) out[l] = bin_to[static_cast<size_t>(a[l])];
    return out;
}

// The greedy pass at `cap`; false when it cannot bring every target under it.
bool greedy(const LoadProblem &p, double cap, std::vector<int> &out) {
    std::vector<int> a = p.home;
    std::vector<double> tl(p.k, 0);
    for (size_t l = 0; l < p.L; l++)
        if (p.home[l] >= 0) tl[static_cast<size_t>(p.home[l])] += p.load[l];
    std::vector<size_t> held(p.k, 0);  // shard counts break ties (all-zero loads spread out)
    for (size_t l = 0; l < p.L; l++)
        if (p.home[l] >= 0) held[static_cast<size_t>(p.home[l])]++;
    for (size_t l : p.heavy_first) {
        if (p.home[l] >= 0) continue;
        size_t t = 0;
        for (size_t u = 1; u < p.k; u++)
            if (tl[u] < tl[t] || (tl[u] == tl[t] && held[u] < held[t])) t = u;
        a[l] = static_cast<int>(t);
        tl[t] += p.load[l];
        held[t]++;
    }
    for (size_t iter = 0; iter < p.L * p.k + 16; iter++) {
        size_t over = 0;
        for (size_t t = 1; t < p.k; t++)
            if (tl[t] > tl[over]) over = t;
        if (fits(tl[over], cap)) {
            out = a;
            return true;
        }
        if (p.k < 2) return false;
        const size_t r = lightest(tl, over);
        const double excess = tl[over] - cap, room = cap - tl[r];
        // Candidates: shards on `over` that fit the lightest target. Prefer
        // the move that adds the fewest moves to the plan (a shard going back
        // home removes one), then the lightest shard that alone clears the
        // excess, else the heaviest that fits.
        size_t pick = SIZE_MAX;
        auto key = [&](size_t l) {
            int delta = (static_cast<int>(r) != p.home[l]) - (static_cast<int>(over) != p.home[l]);
            bool clears = p.load[l] >= excess;
            return std::make_tuple(delta, clears ? 0 : 1, clears ? p.load[l] : -p.load[l], l);
        };
        for (size_t l = 0; l < p.L; l++) {
            if (a[l] != static_cast<int>(over) || !fits(p.load[l], room) || p.load[l] <= 0) continue;
            if (pick == SIZE_MAX || key(l) < key(pick)) pick = l;
        }
        if (pick == SIZE_MAX) return false;
        a[pick] = static_cast<int>(r);
        tl[over] -= p.load[pick];
        tl[r] += p.load[pick];
    }
    return false;
}

// Branch and bound: the lowest largest-target load of any placement.
struct MakespanSearch {
    const LoadProblem &p;
    std::vector<double> tl;
    std::vector<int> a, best_a;
    double best;
    long steps = 0;
    bool aborted = false;

    MakespanSearch(const LoadProblem &problem, const std::vector<int> &seed)
        : p(problem), tl(problem.k, 0), a(problem.L, 0), best_a(seed), best(largest(problem, seed)) {}

    void dfs(size_t i, double cur) {
        if (++steps > kSearchBudget) {
            aborted = true;
            return;
        }
        if (!(cur < best - kRelEps * std::max(1.0, best))) return;
        if (i == p.L) {
            best = cur;
            best_a = a;
            return;
        }
        const size_t l = p.heavy_first[i];
        for (size_t t = 0; t < p.k && !aborted; t++) {
            bool seen = false;  // targets of equal load are interchangeable here
            for (size_t u = 0; u < t; u++) seen = seen || tl[u] == tl[t];
            if (seen) continue;
            tl[t] += p.load[l];
            a[l] = static_cast<int>(t);
            dfs(i + 1, std::max(cur, tl[t]));
            tl[t] -= p.load[l];
        }
    }
};

// Branch and bound: the fewest moves keeping every target under `cap`.
struct MoveSearch {
    const LoadProblem &p;
    double cap;
    std::vector<double> tl;
    std::vector<int> a, best_a;
    size_t best;
    std::vector<size_t> must_leave_after;  // shards on non-targets among heavy_first[i..]
    long steps = 0;
    bool aborted = false;

    MoveSearch(const LoadProblem &problem, double c, const std::vector<int> &seed, size_t seed_moves)
        : p(problem), cap(c), tl(problem.k, 0), a(problem.L, 0), best_a(seed), best(seed_moves),
          must_leave_after(problem.L + 1, 0) {
        for (size_t i = p.L; i-- > 0;)
            must_leave_after[i] = must_leave_after[i + 1] + (p.home[p.heavy_first[i]] < 0);
    }

    void place(size_t i, size_t moves, size_t t) {
        const size_t l = p.heavy_first[i];
        if (!fits(tl[t] + p.load[l], cap)) return;
        tl[t] += p.load[l];
        a[l] = static_cast<int>(t);
        dfs(i + 1, moves + (static_cast<int>(t) != p.home[l]));
        tl[t] -= p.load[l];
    }

    void dfs(size_t i, size_t moves) {
        if (++steps > kSearchBudget) {
            aborted = true;
            return;
        }
        if (moves + must_leave_after[i] >= best) return;
        if (i == p.L) {
            best = moves;
            best_a = a;
            return;
        }
        const int h = p.home[p.heavy_first[i]];
        if (h >= 0) place(i, moves, static_cast<size_t>(h));
        for (size_t t = 0; t < p.k && !aborted; t++)
            if (static_cast<int>(t) != h) place(i, moves, t);
    }
};

}  // namespace

LoadPlan plan_rebalance_by_load(const std::vector<std::string> &owners,
                                const std::vector<std::string> &targets, const std::vector<double> &loads,
                                double max_imbalance) {
    LoadPlan plan;
    LoadProblem p;
    p.L = owners.size();
    p.k = targets.size();
    if (p.L == 0 || p.k == 0 || loads.size() != p.L) return plan;
    std::unordered_map<std::string, int> target_of;
    for (size_t t = 0; t < p.k; t++) target_of.emplace(targets[t], static_cast<int>(t));
    p.home.resize(p.L);
    for (size_t l = 0; l < p.L; l++) {
        auto it = target_of.find(owners[l]);
        p.home[l] = it == target_of.end() ? -1 : it->second;
    }
    p.load = loads;
    p.heavy_first.resize(p.L);
    std::iota(p.heavy_first.begin(), p.heavy_first.end(), 0);
    std::stable_sort(p.heavy_first.begin(), p.heavy_first.end(),
                     [&](size_t a, size_t b) { return p.load[a] > p.load[b]; });

    double total = 0, heaviest = 0;
    for (double x : loads) total += x, heaviest = std::max(heaviest, x);
    plan.mean_load = total / static_cast<double>(p.k);
    const double target_cap = max_imbalance * plan.mean_load;

    std::vector<int> chosen;
    bool all_home = std::all_of(p.home.begin(), p.home.end(), [](int h) { return h >= 0; });
    if (all_home && fits(largest(p, p.home), target_cap)) {
        chosen = p.home;  // already within: no move
        plan.cap = target_cap;
        plan.exact = true;
    } else {
        // The bound: as low as the shards allow, never below the target.
        double floor_ = std::max(heaviest, plan.mean_load);
        std::vector<int> packed = lpt(p);
        double lowest = largest(p, packed);
        std::vector<int> lowest_a = packed;
        if (!fits(lowest, std::max(floor_, target_cap))) {
            MakespanSearch ms(p, packed);
            ms.dfs(0, 0);
            lowest = ms.best;
            lowest_a = ms.best_a;
        }
        plan.cap = std::max(target_cap, lowest);
        // The moves: greedy, else the lowest packing relabeled; then search.
        std::vector<int> seed;
        if (!greedy(p, plan.cap, seed)) seed = relabel(p, lowest_a);
        if (!fits(largest(p, seed), plan.cap)) seed = lowest_a;
        MoveSearch search(p, plan.cap, seed, moves_of(p, seed));
        search.dfs(0, 0);
        chosen = search.best_a;
        plan.exact = !search.aborted;
    }
    plan.max_load = largest(p, chosen);
    plan.target_met = fits(plan.max_load, target_cap);
    for (size_t l = 0; l < p.L; l++)
        if (chosen[l] != p.home[l])
            plan.moves.push_back(Move{static_cast<int32_t>(l), owners[l], targets[static_cast<size_t>(chosen[l])]});
    return plan;
}

}  // namespace sharding
