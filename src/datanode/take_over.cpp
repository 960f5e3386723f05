// The coordinator fails over (docs/nodes.md, "Failover of the coordinator";
// sql/install/97_take_over.sql has take_over itself, in PL/pgSQL; the
// check every remote session runs first, serve_token, is
// src/remote/move_remote.cpp's). Here:
//
//   _take_over_config(dsn, slot): a new logical slot at dsn (this server)
//     and the configuration read there in the slot's exported snapshot: a
//     node given those rows and then subscribed on that slot receives
//     every later change exactly once;
//   _take_over_mode(): take_over's own connections skip the check for the
//     rest of the transaction (a node's _take_over_accept decides there);
//   _take_over_later(): the jobs launcher scans this database again soon
//     (jobs.cpp), whose scanner calls _take_over_pending.
#include "pg/launcher.hpp"
#include "pg/spi.hpp"
#include "remote/move_remote.hpp"

#include <string>

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
