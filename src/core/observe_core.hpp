// Drawing and measuring load: pure C++, no PostgreSQL header.
//
// bar() is the one place that turns a number into the Unicode histogram bar
// every observing function shows (sharding.bar, distribution, map_load), so
// that their pictures are drawn to the same scale rules.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace sharding {

// Full block and the seven partial blocks, one eighth to seven eighths.
inline constexpr const char *kBarFull = "\u2588";
inline constexpr const char *kBarEighths[8] = {
    "", "\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589"};

// The largest width bar() accepts (a bar is a picture, not a payload).
inline constexpr int32_t kBarMaxWidth = 1000;

// A bar `width` characters long for value == max, proportionally shorter for
// smaller values, to the nearest eighth of a character. Values at or below
// zero (or NaN) draw nothing; values above max are clipped to the full width;
// any positive value draws at least one eighth, so a small shard is never
// mistaken for an empty one. width is 0 .. kBarMaxWidth (checked by callers).
inline std::string bar(double value, double max, int32_t width) {
    if (!(value > 0) || !(max > 0) || width <= 0) return std::string();
    const int64_t total = static_cast<int64_t>(width) * 8;
    double ratio = value >= max ? 1.0 : value / max;
    int64_t eighths = static_cast<int64_t>(std::llround(ratio * static_cast<double>(total)));
    if (eighths < 1) eighths = 1;
    if (eighths > total) eighths = total;
    std::string out;
    out.reserve(static_cast<size_t>(eighths / 8 + 1) * 3);
    for (int64_t i = 0; i < eighths / 8; i++) out += kBarFull;
    out += kBarEighths[eighths % 8];
    return out;
}

// Running max / mean of non-negative loads (imbalance). NULL elements are
// skipped by the caller, as aggregates skip them.
class Imbalance {
  public:
    void add(double load) {
        sum_ += load;
        if (count_ == 0 || load > max_) max_ = load;
        count_++;
    }
    // false when undefined: no loads, or all of them zero.
    bool defined() const { return count_ > 0 && max_ > 0; }
    double value() const { return max_ / (sum_ / static_cast<double>(count_)); }

  private:
    double sum_ = 0, max_ = 0;
    int64_t count_ = 0;
};

}  // namespace sharding
