// Property test of the pure C++ rebalance planner and pin table (no
// PostgreSQL): for many random maps, the plan balances, moves only what it
// must, and moves no more shards than a brute-force optimum. Emits TAP.
#include "rebalance.hpp"
#include "route_cache.hpp"
#include "hash_core.hpp"

#include <algorithm>
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

int main() {
    std::mt19937 rng(12345);
    const int cases = 400;
    int unbalanced = 0, not_minimal = 0, bad_moves = 0, nondeterministic = 0, unordered = 0;
    for (int c = 0; c < cases; c++) {
        const size_t L = 1 + rng() % 70, pool = 1 + rng() % 9;
        std::vector<std::string> names;
        for (size_t i = 0; i < pool; i++) names.push_back("n" + std::to_string(i));
        std::vector<std::string> owners(L);
        for (auto &o : owners) o = names[rng() % pool];
        std::vector<std::string> targets = names;
        std::shuffle(targets.begin(), targets.end(), rng);
        targets.resize(1 + rng() % std::min<size_t>(pool, 8));
        if (rng() % 3 == 0) targets.push_back("fresh");

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
    std::printf("1..9\n");
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
    return n_failed > 0;
}
