// The session's named remote connections: one libpq helper for the move's
// orchestration (sharding._dbl_connect/_dbl_run/_dbl_value/_dbl_disconnect/
// _dbl_open): the engine's remote sessions, one libpq stack.
//
// A named connection lives for the session (as a named connection of contrib's
// did): the move journal's own connection is opened once and reused by
// later transactions. It is closed by _dbl_disconnect, by a _dbl_connect of
// the same name, or at process exit.
//
// Every wait is interruptible (WaitLatchOrSocket + CHECK_FOR_INTERRUPTS,
// through move_remote's Remote for connecting, its run_statement for
// statements: the one statement loop of Remote::run and of these). When
// the caller is cancelled or fails while a statement runs there, the remote
// statement is cancelled (PQcancel) and its results consumed before the
// error goes on: it does not run on (a cancelled cutover's _freeze_shard
// would freeze the shard after the undo thawed it), and the connection is
// ready for the undo's own calls.
//
// Boundary (src/pg/boundary.hpp): PGconn pointers are kept in plain C
// storage, never owned by a C++ object across a PostgreSQL call; every
// PostgreSQL call that may ereport while a std::string is alive goes
// through glue/pg_call.
#include "remote/move_remote.hpp"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_proc.h"
#include "fmgr.h"
#include "nodes/makefuncs.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/wait_event.h"
}

namespace sharding::move {
namespace {

// The move's three, and one per node a job runner asks about capacity.
constexpr int kMaxNamed = 64;
struct Named {
    char name[NAMEDATALEN];
    PGconn *conn;
    // Opened by the engine itself (named_connect from C++, or a caller who
    // may use the owner's credentials): its login may be the owner's.
    bool engine;
    // What it was opened with (named_keep): the DSN, and the role this
    // backend acted as then (the password rule was checked for that role).
    std::string dsn;
    Oid user;
    // Opened by the engine's C++ (named_connect) and never given a
    // statement of an SQL caller's (_dbl_connect, _dbl_run, _dbl_value,
    // 1.3's _move_journal): its session state is the engine's.
    bool pristine;
};
Named named[kMaxNamed];
bool exit_installed = false;

void close_named_all(int, Datum) {
    for (auto &n : named)
        if (n.conn != nullptr) {
            PQfinish(n.conn);
            n = Named{};
        }
}

void install_exit() {
    if (exit_installed) return;
    on_proc_exit(close_named_all, 0);
    exit_installed = true;
}

Named *find(const char *name) {
    for (auto &n : named)
        if (n.conn != nullptr && std::strcmp(n.name, name) == 0) return &n;
    return nullptr;
}

void drop(const char *name) noexcept {
    Named *n = find(name);
    if (n == nullptr) return;
    PQfinish(n->conn);
    *n = Named{};
}

// A statement that carries a password (CREATE or ALTER SUBSCRIPTION ...
// CONNECTION with a DSN, say) must not reach the node's log (CONTRACT
// 15.2): around it the session logs no statement text (log_statement,
// log_min_error_statement, log_min_duration_statement), when its role may
// set them (a superuser; another role's session logs as configured).
// Returns whether they were set (then reset after the statement).
bool quiet_logging(PGconn *conn) {
    PGresult *r = run_statement(
        conn,
        "SELECT pg_catalog.count(pg_catalog.set_config(v.n, v.v, false))::text FROM (VALUES ('log_statement', "
        "'none'), ('log_min_error_statement', 'panic'), ('log_min_duration_statement', '-1')) AS v(n, v) "
        "WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = CURRENT_USER AND r.rolsuper)",
        "", true);
    bool set = r != nullptr && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
               std::strcmp(PQgetvalue(r, 0, 0), "3") == 0;
    if (r != nullptr) PQclear(r);
    return set;
}

void loud_logging(PGconn *conn) {
    // In a failed transaction block the settings go back at its rollback.
    if (PQtransactionStatus(conn) != PQTRANS_IDLE && PQtransactionStatus(conn) != PQTRANS_INTRANS) return;
    PGresult *r = run_statement(conn, "RESET log_statement; RESET log_min_error_statement; RESET log_min_duration_statement",
                                "", true);
    if (r != nullptr) PQclear(r);
}

bool carries_password(const char *sql) { return strcasestr(sql, "password") != nullptr; }

// Runs sql (one or more statements) there. Returns whether the answer is
// not NULL, and in *out: for a last result with rows, the first column of
// its first row (NULL if none); for a command, its tag. A remote error is
// thrown with its SQLSTATE, message, detail and hint.
bool run(PGconn *conn, const char *sql, std::string *out) {
    PGresult *last = nullptr;
    if (carries_password(sql) && quiet_logging(conn)) {
        try {
            last = run_statement(conn, sql, "", true);
        } catch (...) {
            try {
                loud_logging(conn);
            } catch (...) {
            }
            throw;
        }
        loud_logging(conn);
    } else {
        last = run_statement(conn, sql, "", true);
    }
    bool has = false;
    if (last != nullptr) {
        if (PQresultStatus(last) == PGRES_TUPLES_OK) {
            if (PQntuples(last) > 0 && PQnfields(last) > 0 && !PQgetisnull(last, 0, 0)) {
                *out = PQgetvalue(last, 0, 0);
                has = true;
            }
        } else {
            *out = PQcmdStatus(last);
            has = true;
        }
        PQclear(last);
    }
    return has;
}

// The password rule is Remote's (move_remote.cpp): every connection
// is checked as it is established.

PGconn *named_conn(const char *name) {
    Named *n = find(name);
    if (n == nullptr)
        fail(ERRCODE_CONNECTION_DOES_NOT_EXIST, "no connection named \"%s\" is open", name);
    if (PQstatus(n->conn) == CONNECTION_BAD) {
        drop(name);
        fail(ERRCODE_CONNECTION_FAILURE, "connection \"%s\" was lost", name);
    }
    return n->conn;
}

Datum text_or_null(bool has, const std::string &v) {
    return has ? PointerGetDatum(glue(cstring_to_text_with_len, v.c_str(), (int)v.size())) : (Datum)0;
}

}  // namespace
}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

namespace sharding::move {

namespace {
// Opens each of the named connections `want` (name, dsn) at once: their
// handshakes go on together (Remote::open_all, which says which failure
// is raised); on a failure none of them is open.
void connect_named(const std::vector<std::pair<const char *, const char *>> &want, bool engine, bool pristine) {
    for (const auto &w : want) {
        if (w.second == nullptr)
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "no connection string for connection \"%s\"", w.first);
        if (std::strlen(w.first) >= NAMEDATALEN) fail(ERRCODE_NAME_TOO_LONG, "connection name too long");
    }
    glue(install_exit);
    for (const auto &w : want) drop(w.first);
    int free_slots = 0;
    for (const auto &n : named)
        if (n.conn == nullptr) free_slots++;
    if (free_slots < (int)want.size())
        fail(ERRCODE_TOO_MANY_CONNECTIONS, "too many named connections in this session (%d)", kMaxNamed);
    std::vector<std::unique_ptr<Remote>> remotes;
    try {
        std::vector<std::string> dsns;
        for (const auto &w : want) dsns.emplace_back(w.second);
        remotes = Remote::open_all(dsns, std::string());
    } catch (const Error &e) {
        if (e.sqlstate() == ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION)
            throw Error(e.sqlstate(), "could not establish connection", e.what());
        throw;
    }
    std::string ignored;
    try {
        for (size_t i = 0; i < want.size(); i++) {
            Named *slot = nullptr;
            for (auto &n : named)
                if (n.conn == nullptr) {
                    slot = &n;
                    break;
                }
            // Every field before the connection: a slot without one is free.
            std::strncpy(slot->name, want[i].first, NAMEDATALEN - 1);
            slot->engine = engine;
            slot->dsn = want[i].second;
            slot->user = GetUserId();
            slot->pristine = pristine;
            slot->conn = remotes[i]->detach();
        }
        for (const auto &w : want) {
            PGconn *conn = find(w.first)->conn;
            run(conn, "SET search_path = pg_catalog, pg_temp", &ignored);
            run(conn, "SET synchronous_commit = on", &ignored);
        }
    } catch (...) {
        for (const auto &w : want) drop(w.first);
        throw;
    }
}

void connect_named(const char *name, const char *dsn, bool engine, bool pristine) {
    connect_named({{name, dsn}}, engine, pristine);
}

}  // namespace

void named_connect(const char *name, const char *dsn) { connect_named(name, dsn, true, true); }

void named_connect_both(const char *name, const char *dsn, const char *name2, const char *dsn2) {
    connect_named({{name, dsn}, {name2, dsn2}}, true, true);
}

bool named_open(const char *name) {
    Named *n = find(name);
    if (n != nullptr && PQstatus(n->conn) == CONNECTION_BAD) {
        drop(name);
        n = nullptr;
    }
    return n != nullptr;
}

bool named_keep(const char *name, const char *dsn, bool idle) {
    if (!named_open(name)) return false;
    const Named *n = find(name);
    return n->engine && n->pristine && (!idle || PQtransactionStatus(n->conn) == PQTRANS_IDLE) &&
           (dsn == nullptr || n->dsn == dsn) && n->user == GetUserId();
}

void named_taint(const char *name) noexcept {
    if (Named *n = find(name)) n->pristine = false;
}

void named_disconnect(const char *name) noexcept {
    if (Named *n = find(name)) {
        cancel_and_drain(n->conn);
        drop(name);
    }
}

bool named_run(const char *name, const char *sql, std::string *out) { return run(named_conn(name), sql, out); }

PGconn *named_connection(const char *name) { return named_conn(name); }

void check_named_for_caller(const char *name) {
    Named *n = find(name);
    if (n != nullptr && n->engine && !may_use_owner_credentials())
        fail(ERRCODE_INSUFFICIENT_PRIVILEGE,
             Explain{"The extension's own connections log in with the nodes' kept passwords; they run only the "
                     "statements the extension writes.",
                     "Call the extension's public functions, or open a connection of your own with sharding._dbl_connect."},
             "permission denied to use connection \"%s\" of the extension", name);
    // Given an SQL caller's call: no longer the engine's alone (named_keep).
    if (n != nullptr) n->pristine = false;
}

}  // namespace sharding::move

// _dbl_connect(conn, dsn): opens the named connection (closing one of that
// name first); remote statements run with search_path pg_catalog, pg_temp
// and synchronous_commit on.
SHARDING_FUNCTION(sharding__dbl_connect) {
    if (PG_ARGISNULL(0)) fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the connection name must not be NULL");
    char *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
    char *dsn = PG_ARGISNULL(1) ? nullptr : text_to_cstring(PG_GETARG_TEXT_PP(1));
    // SEC-4: a caller who may not use the owner's credentials neither
    // replaces one of the engine's connections nor opens one with a node's
    // masked DSN.
    bool engine = may_use_owner_credentials();
    if (!engine) {
        check_named_for_caller(name);
        if (dsn != nullptr) (void)caller_dsn(dsn);
    }
    connect_named(name, dsn, engine, false);
    PG_RETURN_VOID();
}

// _dbl_disconnect(conn): closes the named connection if open.
SHARDING_FUNCTION(sharding__dbl_disconnect) {
    char *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
    named_disconnect(name);
    PG_RETURN_VOID();
}

// _dbl_open(conn): whether the named connection is open (and not lost).
SHARDING_FUNCTION(sharding__dbl_open) {
    char *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
    PG_RETURN_BOOL(named_open(name));
}

namespace {
// _dbl_value and _dbl_run: the statements' last result over the named
// connection, as text (a query's first value, a command's tag), or NULL.
Datum run_named(FunctionCallInfo fcinfo) {
    char *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
    char *sql = text_to_cstring(PG_GETARG_TEXT_PP(1));
    PGconn *conn = sharding::move::named_conn(name);
    // SEC-4: the engine's own connections run only the engine's statements.
    check_named_for_caller(name);
    bool has;
    Datum d;
    {
        std::string v;
        has = sharding::move::run(conn, sql, &v);
        d = sharding::move::text_or_null(has, v);
    }
    if (!has) PG_RETURN_NULL();
    PG_RETURN_DATUM(d);
}
}  // namespace

// _dbl_value(conn, sql): the first column of the first row of the (last)
// result, as text; a command's tag.
SHARDING_FUNCTION(sharding__dbl_value) { return run_named(fcinfo); }

// _dbl_run(conn, sql): runs statements there, interruptibly; the command
// tag of the last one (a query's first value).
SHARDING_FUNCTION(sharding__dbl_run) { return run_named(fcinfo); }

// _remote(dsn, query) and _remote_exec(dsn, command): follow's one-shot
// calls on the same helper: a connection for the call (closed when it
// returns, or at the end of the transaction whatever jumped), the
// statement in its own transaction there, interruptible, cancelled there
// when the caller is, with search_path = pg_catalog, pg_temp there first.
// _remote: the first column of the first row (NULL if none); _remote_exec:
// the command's tag.
static Datum one_shot(FunctionCallInfo fcinfo) {
    char *dsn = text_to_cstring(PG_GETARG_TEXT_PP(0));
    char *sql = text_to_cstring(PG_GETARG_TEXT_PP(1));
    bool has;
    Datum d;
    {
        std::string v;
        try {
            // SEC-4: a node's masked DSN only for the engine's statements.
            (void)caller_dsn(dsn);
            Remote r(dsn, false, std::string());
            // The node role's own search_path (ALTER DATABASE/ROLE ... SET
            // there) must not resolve what the statement names, as for a
            // named connection.
            run(r.conn(), "SET search_path = pg_catalog, pg_temp", &v);
            has = run(r.conn(), sql, &v);
        } catch (const Error &e) {
            if (e.sqlstate() == ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION)
                throw Error(e.sqlstate(), "could not establish connection", e.what());
            throw;
        }
        d = text_or_null(has, v);
    }
    if (!has) PG_RETURN_NULL();
    PG_RETURN_DATUM(d);
}

SHARDING_FUNCTION(sharding__remote) { return one_shot(fcinfo); }
SHARDING_FUNCTION(sharding__remote_exec) { return one_shot(fcinfo); }

namespace {
// Glue: calls the body of the engine's entry point fcinfo calls,
// sharding._<name>_body with the same arguments, by OID (fmgr checks no
// EXECUTE right: the body is the owner's alone), the engine scope set
// around it and restored on every path.
Datum call_body(FunctionCallInfo fcinfo, bool *isnull) {
    HeapTuple tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
    if (!HeapTupleIsValid(tup)) elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
    Form_pg_proc proc = (Form_pg_proc)GETSTRUCT(tup);
    char *body = psprintf("_%s_body", NameStr(proc->proname));
    char *schema = get_namespace_name(proc->pronamespace);
    int nargs = proc->pronargs;
    Oid *types = (Oid *)palloc(sizeof(Oid) * (nargs > 0 ? nargs : 1));
    for (int i = 0; i < nargs; i++) types[i] = proc->proargtypes.values[i];
    ReleaseSysCache(tup);
    Oid fn = LookupFuncName(list_make2(makeString(schema), makeString(body)), nargs, types, false);
    FmgrInfo flinfo;
    fmgr_info(fn, &flinfo);
    LOCAL_FCINFO(call, FUNC_MAX_ARGS);
    InitFunctionCallInfoData(*call, &flinfo, nargs, fcinfo->fncollation, nullptr, nullptr);
    for (int i = 0; i < nargs; i++) call->args[i] = fcinfo->args[i];
    int saved = sharding::move::engine_scope_enter();
    Datum result = (Datum)0;
    PG_TRY();
    {
        result = FunctionCallInvoke(call);
    }
    PG_FINALLY();
    {
        sharding::move::engine_scope_leave(saved);
    }
    PG_END_TRY();
    *isnull = call->isnull;
    return result;
}
}  // namespace

// The engine's entry points written in PL/pgSQL (attach_node, detach_node,
// take_over): LANGUAGE C, this function, which runs sharding._<name>_body
// in the engine's scope (SEC-4): the owner's credentials (the nodes' whole
// DSNs, the coordinator's password) serve the statements the body writes
// and nothing a caller passes to an internal function outside it.
SHARDING_FUNCTION(sharding__engine_call) {
    bool isnull = false;
    Datum d = glue(call_body, fcinfo, &isnull);
    if (isnull) PG_RETURN_NULL();
    return d;
}
