// The pure core of rank guards (docs/rank.md): the ranks of one column,
// lowest first, and how values map onto them. No PostgreSQL header (src/core/,
// checked by make check-layers); the glue in rank.cpp reads catalogs and
// trigger arguments and hands plain data here.
//
// Bad input (an empty rank, a rank listed twice) throws
// std::invalid_argument, which the boundary reports as 22023
// (invalid_parameter_value) with its message.
#pragma once

#include "core/cache_alloc.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sharding {

// An enum member as pg_enum describes it.
struct EnumMember {
    uint32_t oid;
    float sort;  // enumsortorder
    std::string_view label;
};

class Ranks {
  public:
    Ranks() = default;
    // Labels are views into pool_: a copy or move would dangle.
    Ranks(const Ranks &) = delete;
    Ranks &operator=(const Ranks &) = delete;
    Ranks(Ranks &&) = delete;
    Ranks &operator=(Ranks &&) = delete;

    void clear() {
        by_label_.clear();
        by_enum_.clear();
        enum_oid_.clear();
        spans_.clear();
        pool_.clear();
    }
    // Sets the labels; `what` names the guard in error messages.
    void assign(const std::vector<std::string_view> &labels, const std::string &what) {
        clear();
        size_t total = 0;
        for (auto l : labels) total += l.size();
        pool_.reserve(total);
        for (auto l : labels) {
            if (l.empty()) throw std::invalid_argument(what + " lists an empty rank");
            spans_.emplace_back(static_cast<uint32_t>(pool_.size()), static_cast<uint32_t>(l.size()));
            pool_.insert(pool_.end(), l.begin(), l.end());
        }
        // Views into pool_ stay valid: it is never resized again.
        for (int r = 0; r < size(); r++)
            if (!by_label_.emplace(label(r), r).second)
                throw std::invalid_argument(what + " lists rank \"" + std::string(label(r)) + "\" twice");
    }
    // The members of the column's enum type: with `declared_order`, their
    // labels in enumsortorder become the ranks; either way enum values are
    // mapped to the ranks of the same label.
    void set_enum(std::vector<EnumMember> members, bool declared_order, const std::string &what) {
        std::sort(members.begin(), members.end(),
                  [](const EnumMember &a, const EnumMember &b) { return a.sort < b.sort; });
        if (declared_order) {
            std::vector<std::string_view> labels;
            labels.reserve(members.size());
            for (const EnumMember &m : members) labels.push_back(m.label);
            assign(labels, what);
        }
        by_enum_.clear();
        enum_oid_.assign(static_cast<size_t>(size()), 0);
        for (const EnumMember &m : members) {
            int r = find(m.label);
            if (r >= 0) {
                by_enum_.emplace(m.oid, r);
                enum_oid_[static_cast<size_t>(r)] = m.oid;
            }
        }
    }
    int size() const { return static_cast<int>(spans_.size()); }
    std::string_view label(int r) const {
        return {pool_.data() + spans_[static_cast<size_t>(r)].first, spans_[static_cast<size_t>(r)].second};
    }
    // Rank of a label, or -1.
    int find(std::string_view v) const {
        auto it = by_label_.find(v);
        return it == by_label_.end() ? -1 : it->second;
    }
    // Rank of an enum value (by oid), or -1.
    int find_enum(uint32_t e) const {
        auto it = by_enum_.find(e);
        return it == by_enum_.end() ? -1 : it->second;
    }
    // The enum value of rank r, or 0 (InvalidOid) if the enum has none.
    uint32_t enum_oid(int r) const {
        return r < static_cast<int>(enum_oid_.size()) ? enum_oid_[static_cast<size_t>(r)] : 0;
    }
    // "a, b, c" for messages.
    std::string list() const {
        std::string out;
        for (int r = 0; r < size(); r++) {
            if (r > 0) out += ", ";
            out += label(r);
        }
        return out;
    }

  private:
    template <class K, class V>
    using Map = std::unordered_map<K, V, std::hash<K>, std::equal_to<K>, CacheAllocator<std::pair<const K, V>>>;
    CacheVector<char> pool_;
    CacheVector<std::pair<uint32_t, uint32_t>> spans_;
    Map<std::string_view, int> by_label_;
    Map<uint32_t, int> by_enum_;
    CacheVector<uint32_t> enum_oid_;
};

}  // namespace sharding
