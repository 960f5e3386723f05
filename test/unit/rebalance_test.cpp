// Property test of the pure C++ rebalance planner and pin table (no
// PostgreSQL): for many random maps, the plan balances, moves only what it
// must, and moves no more shards than a brute-force optimum. Emits TAP.
#include "core/rebalance.hpp"
#include "core/route_cache.hpp"
#include "core/hash_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>

using namespace sharding;

static int n_test = 0, n_failed = 0;
static void ok(bool cond, const std::string &what) {
    n_test++;
    if (!cond) n_failed++;
    std::printf("%s %d - %s\n", cond ? "ok" : "not ok", n_test, what.c_str());
}

// Fewest moves possible: L minus the most shards that can stay, trying every
// choice of which targets get the L mod k larger quotas.
static size_t optimum(const std::vector<std::string> &owners, const std::vector<std::string> &targets) {
    const size_t L = owners.size(), k = targets.size(), q = L / k, r = L % k;
    std::vector<size_t> have(k, 0);
    for (const auto &o : owners)
        for (size_t i = 0; i < k; i++)
            if (o == targets[i]) have[i]++;
    std::vector<bool> extra(k, false);
    std::fill(extra.begin(), extra.begin() + static_cast<long>(r), true);
    size_t best = 0;
    std::sort(extra.begin(), extra.end());
    do {
        size_t stay = 0;
        for (size_t i = 0; i < k; i++) stay += std::min(have[i], q + (extra[i] ? 1 : 0));
        best = std::max(best, stay);
    } while (std::next_permutation(extra.begin(), extra.end()));
    return L - best;
}

// ---------------------------------------------------------------------------
// rebalance_by_load against brute force: every placement of every shard on
// every target, enumerated.
struct Brute {
    double lowest;       // the lowest largest-target load of any placement
    size_t fewest;       // the fewest moves keeping every target at or under cap
    double cap;          // max(max_imbalance x mean, lowest)
};

static bool le(double a, double b) { return a <= b + 1e-9 * std::max(1.0, std::fabs(b)); }

static Brute brute(const std::vector<std::string> &owners, const std::vector<std::string> &targets,
                   const std::vector<double> &loads, double max_imbalance) {
    const size_t L = owners.size(), k = targets.size();
    size_t combos = 1;
    for (size_t i = 0; i < L; i++) combos *= k;
    double total = 0;
    for (double x : loads) total += x;
    const double target = max_imbalance * total / static_cast<double>(k);
    std::vector<double> big(combos);
    std::vector<size_t> moves(combos);
    Brute b{1e300, SIZE_MAX, 0};
    for (size_t c = 0; c < combos; c++) {
        std::vector<double> tl(k, 0);
        size_t m = 0, code = c;
        for (size_t l = 0; l < L; l++, code /= k) {
            tl[code % k] += loads[l];
            m += targets[code % k] != owners[l];
        }
        big[c] = *std::max_element(tl.begin(), tl.end());
        moves[c] = m;
        b.lowest = std::min(b.lowest, big[c]);
    }
    b.cap = std::max(target, b.lowest);
    for (size_t c = 0; c < combos; c++)
        if (le(big[c], b.cap)) b.fewest = std::min(b.fewest, moves[c]);
    return b;
}

// Applies a plan: false if a move is not from the current owner, repeats a
// shard, or goes to a node that is not a target.
static bool apply(std::vector<std::string> &owners, const std::vector<Move> &moves,
                  const std::vector<std::string> &targets) {
    std::set<int32_t> seen;
    int32_t prev = -1;
    for (const Move &m : moves) {
        if (m.logical <= prev || !seen.insert(m.logical).second) return false;
        prev = m.logical;
        if (owners[static_cast<size_t>(m.logical)] != m.from || m.from == m.to) return false;
        if (std::find(targets.begin(), targets.end(), m.to) == targets.end()) return false;
        owners[static_cast<size_t>(m.logical)] = m.to;
    }
    for (const auto &o : owners)
        if (std::find(targets.begin(), targets.end(), o) == targets.end()) return false;
    return true;
}

static double largest_load(const std::vector<std::string> &owners, const std::vector<double> &loads) {
    std::map<std::string, double> per;
    for (size_t l = 0; l < owners.size(); l++) per[owners[l]] += loads[l];
    double m = 0;
    for (const auto &kv : per) m = std::max(m, kv.second);
    return m;
}

// A random map for the property tests: 1..max_shards logical shards, each
// owned by one of a pool of 1..max_pool nodes (n0, n1, ...); the targets a
// shuffled 1..max_targets of the pool, and, while fewer than fresh_below,
// one time in three also a node that owns nothing yet ("fresh").
struct RandomMap {
    std::vector<std::string> owners, targets;
};

static RandomMap random_map(std::mt19937 &rng, size_t max_shards, size_t max_pool, size_t max_targets,
                            size_t fresh_below) {
    const size_t L = 1 + rng() % max_shards, pool = 1 + rng() % max_pool;
    std::vector<std::string> names;
    for (size_t i = 0; i < pool; i++) names.push_back("n" + std::to_string(i));
    RandomMap m;
    m.owners.resize(L);
    for (auto &o : m.owners) o = names[rng() % pool];
    m.targets = names;
    std::shuffle(m.targets.begin(), m.targets.end(), rng);
    m.targets.resize(1 + rng() % std::min<size_t>(pool, max_targets));
    if (m.targets.size() < fresh_below && rng() % 3 == 0) m.targets.push_back("fresh");
    return m;
}

static void load_tests(std::mt19937 &rng) {
    const double imbalances[] = {1.0, 1.05, 1.1, 1.25, 1.5, 2.0};
    int invalid = 0, over_cap = 0, not_fewest = 0, not_exact = 0, target_wrong = 0, moved_within = 0,
        nondeterministic = 0, within_cases = 0, impossible_cases = 0;
    const int cases = 300;
    for (int c = 0; c < cases; c++) {
        const RandomMap m = random_map(rng, 12, 4, 3, 3);
        const std::vector<std::string> &owners = m.owners, &targets = m.targets;
        const size_t L = owners.size();
        std::vector<double> loads(L);
        for (auto &x : loads) x = rng() % 4 == 0 ? 0 : static_cast<double>(rng() % 20);
        if (rng() % 4 == 0) loads[rng() % L] = static_cast<double>(30 + rng() % 100);  // a whale
        const double imb = imbalances[rng() % 6];

        Brute b = brute(owners, targets, loads, imb);
        LoadPlan plan = plan_rebalance_by_load(owners, targets, loads, imb);
        std::vector<std::string> after = owners;
        if (!apply(after, plan.moves, targets)) invalid++;
        double total = 0;
        for (double x : loads) total += x;
        const double target = imb * total / static_cast<double>(targets.size());
        if (!le(largest_load(after, loads), b.cap)) over_cap++;
        if (plan.moves.size() != b.fewest) not_fewest++;
        if (!plan.exact) not_exact++;
        if (plan.target_met != le(b.lowest, target)) target_wrong++;
        if (!le(b.lowest, target)) impossible_cases++;
        bool all_on_targets = std::all_of(owners.begin(), owners.end(), [&](const std::string &o) {
            return std::find(targets.begin(), targets.end(), o) != targets.end();
        });
        if (all_on_targets && le(largest_load(owners, loads), target)) {
            within_cases++;
            if (!plan.moves.empty()) moved_within++;
        }
        LoadPlan again = plan_rebalance_by_load(owners, targets, loads, imb);
        if (again.moves.size() != plan.moves.size() ||
            !std::equal(again.moves.begin(), again.moves.end(), plan.moves.begin(), [](const Move &x, const Move &y) {
                return x.logical == y.logical && x.from == y.from && x.to == y.to;
            }))
            nondeterministic++;
    }
    char what[200];
    ok(invalid == 0, "by load: every move leaves the owner for a target, once, in shard order; only targets own shards");
    std::snprintf(what, sizeof what,
                  "by load: the largest node is at or under max(target, lowest possible) (%d maps of <= 12 shards, "
                  "<= 3 nodes; %d where the target is impossible)", cases, impossible_cases);
    ok(over_cap == 0, what);
    ok(not_fewest == 0, "by load: every plan moves exactly the brute-force fewest shards");
    ok(not_exact == 0, "by load: the search proves minimality on every small map");
    ok(target_wrong == 0, "by load: target_met exactly when some placement meets the target");
    std::snprintf(what, sizeof what, "by load: a map already within max_imbalance gets no move (%d such maps)",
                  within_cases);
    ok(moved_within == 0 && within_cases > 0, what);
    ok(nondeterministic == 0, "by load: the same input gives the same plan");

    // The whale story: 64 shards dealt over 4 nodes, shard 5 carries 40% of
    // the load, the other 63 share the rest evenly. The target (1.1 x 25%)
    // cannot be met: the whale alone is 40%. The lowest possible is 40%, the
    // whale's node keeping only the whale: its 15 neighbours move.
    std::vector<std::string> four = {"a", "b", "c", "d"};
    std::vector<std::string> owners(64);
    std::vector<double> loads(64, 60.0 / 63.0);
    for (int l = 0; l < 64; l++) owners[l] = four[dealt_owner(l, 4, 64)];
    loads[5] = 40.0;
    LoadPlan whale = plan_rebalance_by_load(owners, four, loads, 1.10);
    std::vector<std::string> after = owners;
    bool valid = apply(after, whale.moves, four);
    bool neighbours_only = std::all_of(whale.moves.begin(), whale.moves.end(),
                                       [](const Move &m) { return m.from == "a" && m.logical != 5; });
    std::map<std::string, double> per;
    for (int l = 0; l < 64; l++) per[after[l]] += loads[l];
    ok(valid && whale.moves.size() == 15 && neighbours_only && !whale.target_met &&
           std::fabs(per["a"] - 40.0) < 1e-9 && std::fabs(largest_load(after, loads) - 40.0) < 1e-9,
       "whale story: 64 shards over 4 nodes, one shard 40% of load: its 15 neighbours move, the largest node is the "
       "whale alone (40%)");

    // A fifth node on an even 64-shard map: 1.10 x 12.8 allows 14 shards a
    // node, so each of the four sheds 2: 8 moves, target met.
    std::vector<std::string> five = {"a", "b", "c", "d", "e"};
    std::vector<double> even(64, 1.0);
    LoadPlan grow = plan_rebalance_by_load(owners, five, even, 1.10);
    after = owners;
    ok(apply(after, grow.moves, five) && grow.moves.size() == 8 && grow.target_met &&
           largest_load(after, even) <= 14.0,
       "64 even shards over 4 nodes plus a fifth: 8 moves, every node at most 1.10 x the mean");
}

int main() {
    std::mt19937 rng(12345);
    const int cases = 400;
    int unbalanced = 0, not_minimal = 0, bad_moves = 0, nondeterministic = 0, unordered = 0;
    for (int c = 0; c < cases; c++) {
        const RandomMap m = random_map(rng, 70, 9, 8, SIZE_MAX);
        const std::vector<std::string> &owners = m.owners, &targets = m.targets;
        const size_t L = owners.size();

        std::vector<Move> plan = plan_rebalance(owners, targets);
        std::vector<std::string> after = owners;
        std::set<int32_t> seen;
        int32_t prev = -1;
        for (const Move &m : plan) {
            if (m.logical <= prev) unordered++;
            prev = m.logical;
            if (m.from != after[static_cast<size_t>(m.logical)] || m.from == m.to || !seen.insert(m.logical).second)
                bad_moves++;
            after[static_cast<size_t>(m.logical)] = m.to;
        }
        std::map<std::string, size_t> count;
        for (const auto &o : after) count[o]++;
        const size_t q = L / targets.size();
        for (const auto &kv : count)
            if (std::find(targets.begin(), targets.end(), kv.first) == targets.end() || kv.second < q ||
                kv.second > q + 1)
                unbalanced++;
        for (const auto &t : targets)
            if (count[t] < q) unbalanced++;
        if (plan.size() != optimum(owners, targets)) not_minimal++;
        std::vector<Move> again = plan_rebalance(owners, targets);
        if (again.size() != plan.size() ||
            !std::equal(again.begin(), again.end(), plan.begin(), [](const Move &a, const Move &b) {
                return a.logical == b.logical && a.from == b.from && a.to == b.to;
            }))
            nondeterministic++;
    }
    std::printf("1..18\n");
    ok(unbalanced == 0, "every target ends with floor(L/k) or ceil(L/k), no other node owns any (400 random maps)");
    ok(not_minimal == 0, "every plan moves exactly the brute-force minimum");
    ok(bad_moves == 0, "every move starts at the current owner, changes it, and moves a shard once");
    ok(unordered == 0, "moves come ordered by logical shard");
    ok(nondeterministic == 0, "the same input gives the same plan");

    // The cases.
    std::vector<std::string> four = {"a", "b", "c", "d"}, five = {"a", "b", "c", "d", "e"};
    std::vector<std::string> owners64(64);
    for (int l = 0; l < 64; l++) owners64[l] = four[dealt_owner(l, 4, 64)];
    ok(plan_rebalance(owners64, five).size() == 12, "64 over 4, add a fifth node: 12 moves");
    std::vector<std::string> w32, w33;
    for (int i = 0; i < 33; i++) {
        if (i < 32) w32.push_back("w" + std::to_string(i));
        w33.push_back("w" + std::to_string(i));
    }
    std::vector<std::string> owners480(480);
    for (int l = 0; l < 480; l++) owners480[l] = w32[dealt_owner(l, 32, 480)];
    ok(plan_rebalance(owners480, w33).size() == 14, "480 over 32 -> 33: 14 moves");

    // Pin table: every pinned key found, unpinned keys not.
    std::vector<std::string> keys;
    std::vector<uint64_t> hashes;
    std::vector<int32_t> nodes;
    for (int i = 0; i < 100000; i++) {
        keys.push_back("key-" + std::to_string(i * 10));
        hashes.push_back(hash_bytes(keys.back().data(), keys.back().size()));
        nodes.push_back(i % 7);
    }
    PinTable pins;
    pins.build(keys, hashes, nodes);
    int wrong = 0;
    for (int i = 0; i < 1000000; i++) {
        std::string k = "key-" + std::to_string(i);
        int32_t got = pins.find(hash_bytes(k.data(), k.size()), k.data(), k.size());
        int32_t want = i % 10 == 0 ? (i / 10) % 7 : -1;
        if (got != want) wrong++;
    }
    ok(wrong == 0 && pins.size() == 100000, "pin table: 100,000 pins, 1,000,000 lookups all right");
    PinTable empty;
    empty.build({}, {}, {});
    ok(empty.find(hash_bytes("x", 1), "x", 1) == -1, "empty pin table finds nothing");

    load_tests(rng);
    return n_failed > 0;
}
