// Unit tests of the rank core (src/core/rank_core.hpp): labels, duplicates,
// enum members in declared order, lookups.
#include "core/rank_core.hpp"

#include "tap.hpp"

#include <type_traits>

using tap::check;

int main() {
    std::printf("1..9\n");
    sharding::Ranks r;
    r.assign({"new", "shipped", "delivered"}, "guard");
    check(r.size() == 3 && r.find("new") == 0 && r.find("delivered") == 2, "labels rank in the order given");
    check(r.find("lost") == -1 && r.find("") == -1, "an unknown value has no rank");
    check(r.list() == "new, shipped, delivered", "list() names the ranks lowest first");
    bool threw = false;
    try {
        r.assign({"a", "b", "a"}, "guard on x");
    } catch (const std::invalid_argument &e) {
        threw = std::string(e.what()) == "guard on x lists rank \"a\" twice";
    }
    check(threw, "a rank listed twice is refused, naming it");
    threw = false;
    try {
        r.assign({"a", ""}, "guard on x");
    } catch (const std::invalid_argument &e) {
        threw = std::string(e.what()) == "guard on x lists an empty rank";
    }
    check(threw, "an empty rank is refused");
    sharding::Ranks e;
    e.set_enum({{30, 3.0f, "c"}, {10, 1.0f, "a"}, {20, 1.5f, "b"}}, true, "enum");
    check(e.size() == 3 && e.label(0) == "a" && e.label(1) == "b" && e.label(2) == "c",
          "enum labels rank in enumsortorder, not oid or listing order");
    check(e.find_enum(20) == 1 && e.find_enum(99) == -1 && e.enum_oid(2) == 30, "enum values map to ranks and back");
    sharding::Ranks g;
    g.assign({"c", "a"}, "guard");
    g.set_enum({{10, 1.0f, "a"}, {20, 2.0f, "b"}, {30, 3.0f, "c"}}, false, "guard");
    check(g.size() == 2 && g.find_enum(30) == 0 && g.find_enum(10) == 1 && g.find_enum(20) == -1 &&
              g.enum_oid(1) == 10,
          "a guard's own order wins over the enum's; values outside it have no rank");
    check(!std::is_copy_constructible_v<sharding::Ranks> && !std::is_move_constructible_v<sharding::Ranks>,
          "Ranks can be neither copied nor moved (its labels point into itself)");
    return tap::status();
}
