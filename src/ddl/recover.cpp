// In-doubt two-phase transactions (docs/ddl.md, CONTRACT 15.4): what a
// crash of the coordinator or of a node left prepared on a node is
// committed or rolled back as the coordinator decided.
//
// The decision is the coordinator's transaction itself (two_phase.cpp): its
// gid carries its full transaction id. Committed -> COMMIT PREPARED;
// aborted (also: in progress when the coordinator crashed) -> ROLLBACK
// PREPARED; still in progress -> left alone (it is deciding now). When its
// status is no longer known (older than the commit log kept), the record in
// sharding.node_transactions decides: written in that same transaction, it
// is visible exactly when it committed. Records of transactions no longer
// prepared anywhere are deleted.
//
// recover_transactions() runs it on demand; with the library preloaded the
// background worker's scanner (src/jobs/jobs.cpp) runs it in every database
// with the extension, and again every second while something is left.
#include "ddl/ddl.hpp"
#include "remote/move_remote.hpp"

#include <cstdlib>
#include <cstring>

extern "C" {
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "utils/syscache.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

namespace sharding {
namespace {

struct NodeRow {
    std::string node, dsn;
};

// Glue: sharding.nodes with a DSN, into palloc'd pairs.
int nodes_c(char ***names, char ***dsns) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    if (SPI_execute("SELECT n.node, n.dsn FROM sharding.nodes AS n WHERE n.dsn IS NOT NULL ORDER BY n.node COLLATE \"C\"",
                    true, 0) != SPI_OK_SELECT)
        elog(ERROR, "could not read sharding.nodes");
    int n = (int)SPI_processed;
    *names = static_cast<char **>(MemoryContextAlloc(CurTransactionContext, sizeof(char *) * (n + 1)));
    *dsns = static_cast<char **>(MemoryContextAlloc(CurTransactionContext, sizeof(char *) * (n + 1)));
    for (int i = 0; i < n; i++) {
        (*names)[i] = MemoryContextStrdup(CurTransactionContext, SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
        (*dsns)[i] = MemoryContextStrdup(CurTransactionContext, SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2));
    }
    SPI_finish();
    return n;
}

// Glue: the coordinator's decision for transaction xid ('c' commit, 'r'
// roll back, 'p' in progress), from its status, else from gid's record.
char decision_c(const char *xid, const char *gid) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[2] = {TEXTOID, TEXTOID};
    Datum vals[2] = {CStringGetTextDatum(xid), CStringGetTextDatum(gid)};
    // A new snapshot per call (read committed): a record committed since
    // the last one is seen.
    int rc = SPI_execute_with_args(
        "SELECT pg_catalog.pg_xact_status($1::pg_catalog.xid8), "
        "EXISTS (SELECT FROM sharding.node_transactions AS t WHERE t.gid = $2)",
        2, types, vals, nullptr, false, 1);
    if (rc != SPI_OK_SELECT || SPI_processed != 1) elog(ERROR, "could not read a transaction's status");
    char *status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
    char *recorded = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
    char d;
    if (status != nullptr && std::strcmp(status, "in progress") == 0)
        d = 'p';
    else if (status != nullptr && std::strcmp(status, "committed") == 0)
        d = 'c';
    else if (status != nullptr && std::strcmp(status, "aborted") == 0)
        d = 'r';
    else
        d = (recorded != nullptr && recorded[0] == 't') ? 'c' : 'r';
    SPI_finish();
    return d;
}

// Glue: the gids recorded for node (snapshot taken now), palloc'd.
int records_c(const char *node, char ***out) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[1] = {TEXTOID};
    Datum vals[1] = {CStringGetTextDatum(node)};
    if (SPI_execute_with_args("SELECT t.gid FROM sharding.node_transactions AS t WHERE t.node = $1", 1, types, vals,
                              nullptr, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "could not read sharding.node_transactions");
    int n = (int)SPI_processed;
    *out = static_cast<char **>(MemoryContextAlloc(CurTransactionContext, sizeof(char *) * (n + 1)));
    for (int i = 0; i < n; i++)
        (*out)[i] = MemoryContextStrdup(CurTransactionContext, SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
    SPI_finish();
    return n;
}

// Glue: deletes gid's record, as the table's owner.
void delete_record_c(const char *gid) {
    Oid nsp = get_namespace_oid("sharding", false);
    Oid rel = get_relname_relid("node_transactions", nsp);
    Oid save_user;
    int save_sec;
    become_table_owner(rel, &save_user, &save_sec);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[1] = {TEXTOID};
    Datum vals[1] = {CStringGetTextDatum(gid)};
    if (SPI_execute_with_args("DELETE FROM sharding.node_transactions AS t WHERE t.gid = $1", 1, types, vals, nullptr,
                              false, 0) != SPI_OK_DELETE)
        elog(ERROR, "could not delete a record of sharding.node_transactions");
    SPI_finish();
    SetUserIdAndSecContext(save_user, save_sec);
}

bool table_exists_c() {
    Oid nsp = get_namespace_oid("sharding", true);
    return OidIsValid(nsp) && OidIsValid(get_relname_relid("node_transactions", nsp));
}

std::string gid_prefix() { return format("sharding_" UINT64_FORMAT "_%u_", (uint64)GetSystemIdentifier(), MyDatabaseId); }

// Resolves what node holds of ours; returns how many were resolved, and
// sets *left when something stays in doubt.
int recover_node(const std::string &node, const std::string &dsn, bool *left) {
    char **recorded = nullptr;
    int nrec = glue(records_c, node.c_str(), &recorded);
    move::Remote r(dsn, false, "sharding recovery");
    std::string prefix = format("node \"%s\": ", node.c_str());
    std::string mine = gid_prefix();
    PGresult *res = move::run_statement(r.conn(), "SET search_path = pg_catalog, pg_temp", prefix.c_str(), true);
    if (res) PQclear(res);
    std::string q = "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE database = pg_catalog.current_database() "
                    "AND pg_catalog.starts_with(gid, '" + mine + "')";
    res = move::run_statement(r.conn(), q.c_str(), prefix.c_str(), true);
    std::vector<std::string> gids;
    for (int i = 0; res && i < PQntuples(res); i++) gids.emplace_back(PQgetvalue(res, i, 0));
    if (res) PQclear(res);
    int resolved = 0;
    std::vector<std::string> still;
    for (const auto &gid : gids) {
        // <prefix><full xid>_<n>
        std::string rest = gid.substr(mine.size());
        std::string xid = rest.substr(0, rest.find('_'));
        char d = glue(decision_c, xid.c_str(), gid.c_str());
        if (d == 'p') {
            *left = true;
            still.push_back(gid);
            continue;
        }
        std::string sql = format("%s PREPARED '%s'", d == 'c' ? "COMMIT" : "ROLLBACK", gid.c_str());
        try {
            res = move::run_statement(r.conn(), sql.c_str(), prefix.c_str(), true);
            if (res) PQclear(res);
            resolved++;
        } catch (const Error &e) {
            // Resolved meanwhile by the coordinator's own commit: done.
            if (e.sqlstate() != ERRCODE_UNDEFINED_OBJECT) throw;
        }
    }
    // Records read before the listing whose gid is no longer prepared there:
    // resolved.
    for (int i = 0; i < nrec; i++) {
        bool prepared = false;
        for (const auto &g : still) prepared = prepared || g == recorded[i];
        if (!prepared) glue(delete_record_c, (const char *)recorded[i]);
    }
    return resolved;
}

int recover(bool quiet, bool *left) {
    *left = false;
    if (!glue(table_exists_c)) return 0;
    char **names = nullptr, **dsns = nullptr;
    int n = glue(nodes_c, &names, &dsns);
    std::vector<std::string> attached = ddl_attached_nodes();
    int resolved = 0;
    for (int i = 0; i < n; i++) {
        try {
            resolved += recover_node(names[i], dsns[i], left);
        } catch (const Error &e) {
            // Out of reach: tried again soon if it may hold one of ours (it
            // is attached, or has records), else at the next scan.
            char **recorded = nullptr;
            bool mine = glue(records_c, (const char *)names[i], &recorded) > 0;
            for (const auto &a : attached) mine = mine || a == names[i];
            if (mine) *left = true;
            ereport(quiet ? DEBUG1 : WARNING,
                    (errmsg("could not recover the two-phase transactions of node \"%s\": %s", names[i], e.what())));
        }
    }
    return resolved;
}

}  // namespace

void ddl_recover_in_worker(bool *left) {
    // Anything but a node out of reach (logged by recover) is an ERROR of
    // the worker's transaction, raised once no C++ frame is left here.
    *left = true;
    try {
        bool l = false;
        int n = recover(true, &l);
        if (n > 0) ereport(LOG, (errmsg("sharding: resolved %d in-doubt two-phase transactions on nodes", n)));
        *left = l;
        return;
    } catch (...) {
        detail::capture_current_exception();
    }
    detail::raise_captured();
}

}  // namespace sharding

using namespace sharding;

// recover_transactions(): how many in-doubt transactions it resolved.
SHARDING_FUNCTION(sharding_recover_transactions) {
    (void)fcinfo;
    bool left = false;
    int n = recover(false, &left);
    PG_RETURN_INT32(n);
}
