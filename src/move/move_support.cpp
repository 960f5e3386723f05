// What the orchestration of moves shares: see move_engine.hpp.
#include "move/move_engine.hpp"
#include "routing/owner_switch.hpp"

namespace sharding::move {

const char *const kSrc = "sharding_move_src";
const char *const kDst = "sharding_move_dst";
const char *const kSelf = "sharding_move_self";
const char *const kLive = "phase NOT IN " PHASE_SQL_FINAL;

Text dbl(const char *conn, const std::string &sql) {
    std::string v;
    if (named_run(conn, sql.c_str(), &v)) return v;
    return std::nullopt;
}

Text journal(const std::string &sql) {
    // The engine's own connection to this database, in whatever
    // transaction the engine left it (connect() opens it with the
    // coordinator's DSN); one opened by an SQL caller under the same name
    // (_dbl_connect) or given its statements, or opened as another role,
    // is replaced (named_keep).
    if (!named_keep(kSelf, nullptr, false)) {
        Text dsn = coordinator_dsn();
        named_connect(kSelf, c(dsn));
    }
    return dbl(kSelf, sql);
}

}  // namespace sharding::move
