// Unit tests of the pure C++ bar and imbalance (src/core/observe_core.hpp), no
// PostgreSQL needed. Emits TAP. Built and run by test/harness/unit.sh.
#include "core/observe_core.hpp"
#include "tap.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace {
using tap::check;

// Length of a bar in eighths of a character, parsed back from its UTF-8.
long eighths_of(const std::string &bar) {
    long total = 0;
    for (size_t i = 0; i < bar.size(); i += 3) {
        std::string ch = bar.substr(i, 3);
        if (ch == sharding::kBarFull) {
            total += 8;
            continue;
        }
        int found = -1;
        for (int e = 1; e < 8; e++)
            if (ch == sharding::kBarEighths[e]) found = e;
        if (found < 0 || i + 3 != bar.size()) return -1;  // partial block only at the end
        total += found;
    }
    return total;
}
}  // namespace

int main() {
    std::printf("1..7\n");
    using sharding::bar;
    const double nan = std::numeric_limits<double>::quiet_NaN();

    check(bar(8, 8, 40) == [] {
        std::string s;
        for (int i = 0; i < 40; i++) s += sharding::kBarFull;
        return s;
    }(), "the maximum draws width full blocks");

    bool proportional = true;
    for (int width : {1, 7, 40, 1000})
        for (int v = 0; v <= 997; v++) {
            long want = std::lround(v / 997.0 * width * 8);
            if (v > 0 && want == 0) want = 1;
            proportional &= eighths_of(bar(v, 997, width)) == want;
        }
    check(proportional, "bars are value/max of the width, to the nearest eighth, well formed");

    check(bar(0, 8, 40).empty() && bar(-1, 8, 40).empty() && bar(nan, 8, 40).empty() &&
              bar(3, 0, 40).empty() && bar(3, -2, 40).empty() && bar(3, nan, 40).empty() &&
              bar(3, 8, 0).empty(),
          "zero, negative and NaN values or maxima, and width 0, draw nothing");
    check(bar(1e-300, 1e300, 40) == sharding::kBarEighths[1] && bar(1, 1e12, 1) == sharding::kBarEighths[1],
          "any positive value draws at least one eighth");
    check(bar(9, 8, 3) == bar(8, 8, 3) && bar(std::numeric_limits<double>::infinity(), 1, 2) == bar(1, 1, 2),
          "values above max are clipped to the width");

    sharding::Imbalance even, seed, zero, none;
    for (int i = 0; i < 4; i++) even.add(5);
    for (double l : {100.0, 100.0, 100.0, 490.0}) seed.add(l);
    zero.add(0);
    zero.add(0);
    check(even.defined() && even.value() == 1.0 &&
              std::fabs(seed.value() - 490.0 / (790.0 / 4)) < 1e-12,
          "imbalance is max / mean");
    check(!zero.defined() && !none.defined(), "imbalance is undefined for no loads or all zero");
    return tap::status();
}
