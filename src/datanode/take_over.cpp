// The coordinator fails over (docs/nodes.md, "Failover of the coordinator";
// sql/install/97_take_over.sql has take_over itself, in PL/pgSQL). Here:
//
//   serve_check_sql(): the statement every session of the engine runs first
//     where it connects (move_remote.cpp): sharding._serve(<this database's
//     coordinator token>) where the other database has it, so that a node
//     that follows another coordinator refuses the session (55000) before
//     it runs anything;
//   _take_over_config(dsn, slot): a new logical slot at dsn (this server)
//     and the configuration read there in the slot's exported snapshot: a
//     node given those rows and then subscribed on that slot receives
//     every later change exactly once;
//   _take_over_mode(): take_over's own connections skip the check for the
//     rest of the transaction (a node's _take_over_accept decides there);
//   _take_over_later(): the jobs launcher scans this database again soon
//     (jobs.cpp), whose scanner calls _take_over_pending.
#include "move/move_engine.hpp"
#include "remote/move_remote.hpp"

#include <string>

namespace sharding::move {

std::string serve_check_sql() {
    if (spi_value("SELECT pg_catalog.to_regclass('sharding.coordinator_identity') IS NOT NULL", {}) != Text("t"))
        return std::string();
    Text token = spi_value("SELECT i.token::text FROM sharding.coordinator_identity AS i", {});
    // The token is a uuid (or nothing): a literal of hex digits and dashes.
    return "DO $sharding$ BEGIN IF pg_catalog.to_regprocedure('sharding._serve(text)') IS NOT NULL THEN "
           "PERFORM sharding._serve(" +
           lit(Text(token.value_or(std::string()))) + "); END IF; END $sharding$";
}

}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

// _take_over_config(dsn text, slot text): text (JSON).
SHARDING_FUNCTION(sharding__take_over_config) {
    // SEC-4: a node's masked DSN only within take_over.
    std::string dsn = caller_dsn(must(text_arg(fcinfo, 0)));
    std::string slot = must(text_arg(fcinfo, 1));
    for (char ch : slot)
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'))
            fail(ERRCODE_INVALID_PARAMETER_VALUE, "slot names are [a-z0-9_], not \"%s\"", slot.c_str());
    if (slot.empty() || slot.size() > 63) fail(ERRCODE_INVALID_PARAMETER_VALUE, "slot names are 1 to 63 characters");
    Remote repl(dsn, true, "sharding_take_over");
    PGresult *res = nullptr;
    repl.run("CREATE_REPLICATION_SLOT " + slot + " LOGICAL pgoutput (SNAPSHOT 'export')", &res);
    if (res == nullptr || PQntuples(res) != 1 || PQnfields(res) < 3 || PQgetisnull(res, 0, 2)) {
        if (res) PQclear(res);
        fail(ERRCODE_PROTOCOL_VIOLATION, "unexpected answer to CREATE_REPLICATION_SLOT");
    }
    std::string snap = PQgetvalue(res, 0, 2);
    PQclear(res);
    Remote reader(dsn, false, "sharding_take_over");
    reader.run("SET search_path = pg_catalog, pg_temp");
    reader.run("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY");
    reader.run("SET TRANSACTION SNAPSHOT " + lit(Text(snap)));
    std::string config = reader.run("SELECT sharding._config_json()::text");
    reader.run("COMMIT");
    PG_RETURN_DATUM(text_datum(config));
}

// _take_over_mode(): void.
SHARDING_FUNCTION(sharding__take_over_mode) {
    (void)fcinfo;
    set_takeover_mode();
    PG_RETURN_VOID();
}

// _take_over_later(): void.
SHARDING_FUNCTION(sharding__take_over_later) {
    (void)fcinfo;
    jobs_recheck(MyDatabaseId);
    PG_RETURN_VOID();
}
