// The coordinator's two-phase transactions on its nodes (docs/ddl.md,
// CONTRACT 15.4): run_on_nodes and propagated DDL open one remote
// transaction per node inside the caller's transaction; this file's
// transaction callbacks end them with it.
//
//   PRE_COMMIT  one row per node in sharding.node_transactions (in the
//               coordinator's own transaction, so its commit is the
//               decision), then PREPARE TRANSACTION on every node: a node
//               that cannot prepare fails the commit, and everything rolls
//               back everywhere.
//   COMMIT      COMMIT PREPARED on every node. Past the local commit
//               nothing may fail: a node that does not answer is left to
//               recover_transactions (recover.cpp), which the background
//               worker runs every second until it is resolved.
//   ABORT       ROLLBACK PREPARED where prepared, else the remote
//               transaction is rolled back (its session closed).
//
// Savepoints: a remote command run inside a subtransaction is preceded by
// a remote SAVEPOINT named after the local subtransaction, so that rolling
// the local one back (a plpgsql EXCEPTION block) rolls the nodes' work back
// to the same point; a participant opened inside it is closed.
//
// A gid is sharding_<system identifier>_<database oid>_<full xid>_<n>:
// unique on a node shared by several coordinators or several of one
// server's databases (pg_prepared_xacts is server-wide); recovery finds its
// own by the prefix and decides from the coordinator's transaction status.
//
// Boundary (src/pg/boundary.hpp): connections live in plain C storage; the
// callbacks convert every C++ exception before PostgreSQL sees it; past
// the local commit only libpq runs (blocking, no ereport).
#include "ddl/ddl.hpp"
#include "pg/launcher.hpp"
#include "pg/spi.hpp"
#include "remote/move_remote.hpp"

#include <cstring>
#include <exception>
#include <sys/stat.h>

extern "C" {
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "utils/syscache.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "storage/latch.h"
#include "pgstat.h"
#include "utils/tuplestore.h"
}

namespace sharding {

char *ddl_fault = nullptr;
bool ddl_propagate = true;
bool ddl_hook_installed = false;

namespace {

constexpr int kMaxParticipants = 128;
constexpr int kMaxSavepoints = 32;
struct Participant {
    char node[NAMEDATALEN * 2];
    char gid[200];
    PGconn *conn;
    SubTransactionId opened_in;
    int nsp;
    SubTransactionId sp[kMaxSavepoints];
    bool prepared;
    bool sent;    // a statement sent, its results not collected yet
    bool broken;  // a savepoint rollback failed there: the commit fails
};
Participant parts[kMaxParticipants];
int nparts = 0;
bool callbacks_installed = false;

std::string node_prefix(const char *node) { return format("node \"%s\": ", node); }

// Blocking libpq, no ereport: for the callbacks past the point where an
// ERROR could be raised safely. Returns the error message ("" on success)
// and the SQLSTATE in *state.
std::string exec_plain(PGconn *conn, const char *sql, char state[6]) {
    state[0] = '\0';
    (void)PQsetnonblocking(conn, 0);
    PGresult *r = PQexec(conn, sql);
    std::string err;
    if (r == nullptr || (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)) {
        const char *m = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
        const char *s = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
        err = m ? m : PQerrorMessage(conn);
        if (err.empty()) err = "unknown error";
        if (s) strlcpy(state, s, 6);
    }
    if (r) PQclear(r);
    (void)PQsetnonblocking(conn, 1);
    return err;
}

void close_part(Participant &p) noexcept {
    if (p.conn != nullptr) {
        if (PQtransactionStatus(p.conn) == PQTRANS_ACTIVE) move::cancel_and_drain(p.conn);
        PQfinish(p.conn);
    }
    p = Participant{};
}

void reset_all() noexcept {
    for (int i = 0; i < nparts; i++) close_part(parts[i]);
    nparts = 0;
}

// Test-only (sharding.ddl_fault = '<phase>:<file>', docs/ddl.md): while
// <file> exists the transaction holds at <phase> ('prepared': after every
// node prepared, before the local commit; 'commit': after the local
// commit, before COMMIT PREPARED), at most 60 s.
void fault_hold(const char *phase) noexcept {
    if (ddl_fault == nullptr || ddl_fault[0] == '\0') return;
    size_t n = std::strlen(phase);
    if (std::strncmp(ddl_fault, phase, n) != 0 || ddl_fault[n] != ':') return;
    const char *file = ddl_fault + n + 1;
    struct stat st;
    for (int i = 0; i < 6000 && stat(file, &st) == 0; i++) pg_usleep(10000L);
}

}  // namespace

void become_table_owner(Oid rel, Oid *save_user, int *save_sec) {
    HeapTuple tup = SearchSysCache1(RELOID, ObjectIdGetDatum(rel));
    if (!HeapTupleIsValid(tup)) elog(ERROR, "cache lookup failed for relation %u", rel);
    Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tup))->relowner;
    ReleaseSysCache(tup);
    GetUserIdAndSecContext(save_user, save_sec);
    SetUserIdAndSecContext(owner, *save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
}

namespace {

// The record of each participant's gid, as the table's owner (the caller
// may be any role that ran DDL of a distributed table). Glue: may ereport.
void insert_records(uint64 fxid) {
    Oid nsp = get_namespace_oid("sharding", false);
    Oid rel = get_relname_relid("node_transactions", nsp);
    if (!OidIsValid(rel))
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("sharding.node_transactions does not exist"),
                        errhint("ALTER EXTENSION sharding UPDATE to version 1.4 or later.")));
    Oid save_user;
    int save_sec;
    become_table_owner(rel, &save_user, &save_sec);
    // At PRE_COMMIT no snapshot is active any more.
    bool pushed = !ActiveSnapshotSet();
    if (pushed) PushActiveSnapshot(GetTransactionSnapshot());
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    char xid[32];
    snprintf(xid, sizeof xid, UINT64_FORMAT, fxid);
    for (int i = 0; i < nparts; i++) {
        Oid types[3] = {TEXTOID, TEXTOID, TEXTOID};
        Datum vals[3] = {CStringGetTextDatum(parts[i].gid), CStringGetTextDatum(parts[i].node),
                         CStringGetTextDatum(xid)};
        if (SPI_execute_with_args("INSERT INTO sharding.node_transactions (gid, node, coordinator_xid) "
                                  "VALUES ($1, $2, $3::pg_catalog.xid8)",
                                  3, types, vals, nullptr, false, 0) != SPI_OK_INSERT)
            elog(ERROR, "could not record a two-phase transaction");
    }
    SPI_finish();
    if (pushed) PopActiveSnapshot();
    SetUserIdAndSecContext(save_user, save_sec);
}

uint64 top_full_xid() { return U64FromFullTransactionId(GetTopFullTransactionId()); }

void pre_commit() {
    for (int i = 0; i < nparts; i++)
        if (parts[i].broken)
            fail(ERRCODE_IN_FAILED_SQL_TRANSACTION,
                 "node \"%s\": a rolled-back savepoint could not be rolled back there", parts[i].node);
    uint64 fxid = glue(top_full_xid);
    for (int i = 0; i < nparts; i++)
        snprintf(parts[i].gid, sizeof parts[i].gid, "sharding_" UINT64_FORMAT "_%u_" UINT64_FORMAT "_%d",
                 (uint64)GetSystemIdentifier(), MyDatabaseId, fxid, i);
    glue(insert_records, fxid);
    // Every node prepares at once: sent to all, then collected in turn
    // (all of them, so every connection is ready for the rollback); the
    // first failure, in node order, fails the commit.
    std::exception_ptr first;
    for (int i = 0; i < nparts; i++) {
        std::string sql = format("PREPARE TRANSACTION '%s'", parts[i].gid);
        if (PQsendQuery(parts[i].conn, sql.c_str()) == 0 && !first)
            first = std::make_exception_ptr(Error(ERRCODE_CONNECTION_FAILURE,
                                                  node_prefix(parts[i].node) + "could not send PREPARE TRANSACTION"));
        else
            parts[i].sent = true;
    }
    for (int i = 0; i < nparts; i++) {
        Participant &p = parts[i];
        if (!p.sent) continue;
        p.sent = false;
        try {
            PGresult *r = move::collect_statement(p.conn, node_prefix(p.node).c_str(), true);
            if (r) PQclear(r);
            // A prepared transaction is no longer this session's: PREPARE
            // in a failed transaction block answers ROLLBACK (nothing
            // prepared).
            if (PQtransactionStatus(p.conn) != PQTRANS_IDLE)
                fail(ERRCODE_TRANSACTION_ROLLBACK, "node \"%s\": the transaction could not be prepared", p.node);
            p.prepared = true;
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    if (first) std::rethrow_exception(first);
    fault_hold("prepared");
}

// How long the commit (or rollback) waits, in all, for the nodes' answers
// to COMMIT PREPARED / ROLLBACK PREPARED once this transaction has ended
// here: a node that has not answered by then (or when the session is
// cancelled or terminated meanwhile) is left to recovery with a WARNING.
constexpr long kFinishWaitMs = 10000;

// Waits for conn's answer without raising anything (past the local commit):
// true when a result can be read without blocking; false when the
// connection broke, the deadline passed or an interrupt (cancel,
// statement_timeout, terminate) is pending.
bool wait_answer(PGconn *conn, TimestampTz deadline) noexcept {
    for (;;) {
        if (PQflush(conn) < 0) return false;
        if (PQconsumeInput(conn) == 0) return false;
        if (!PQisBusy(conn)) return true;
        if (QueryCancelPending || ProcDiePending) return false;
        long ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
        if (ms <= 0) return false;
        pgsocket sock = PQsocket(conn);
        if (sock == PGINVALID_SOCKET) return false;
        int rc = WaitLatchOrSocket(MyLatch, WL_LATCH_SET | WL_SOCKET_READABLE | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                                   sock, ms < 1000 ? ms : 1000, PG_WAIT_EXTENSION);
        if (rc & WL_LATCH_SET) ResetLatch(MyLatch);
    }
}

void finish(bool commit) noexcept {
    bool left = false;
    if (commit) fault_hold("commit");
    // Sent to every node at once, then each answer read, waiting at most
    // kFinishWaitMs in all and never past an interrupt (nothing here may
    // raise an ERROR any more).
    for (int i = 0; i < nparts; i++) {
        Participant &p = parts[i];
        if (!p.prepared) continue;
        char sql[256];
        snprintf(sql, sizeof sql, "%s PREPARED '%s'", commit ? "COMMIT" : "ROLLBACK", p.gid);
        (void)PQsetnonblocking(p.conn, 1);
        p.sent = PQsendQuery(p.conn, sql) != 0;
    }
    TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kFinishWaitMs);
    for (int i = 0; i < nparts; i++) {
        Participant &p = parts[i];
        if (!p.prepared) continue;
        std::string err;
        if (!p.sent) {
            err = PQerrorMessage(p.conn);
        } else {
            for (;;) {
                if (!wait_answer(p.conn, deadline)) {
                    if (PQstatus(p.conn) == CONNECTION_BAD)
                        err = PQerrorMessage(p.conn);
                    else if (QueryCancelPending || ProcDiePending)
                        err = "the wait for its answer was interrupted";
                    else
                        err = "no answer within 10 s";
                    // Not drained (it may never answer): closed as it is.
                    PQfinish(p.conn);
                    p.conn = nullptr;
                    break;
                }
                PGresult *r = PQgetResult(p.conn);
                if (r == nullptr) break;
                const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
                // 42704: no such prepared transaction any more: recovery
                // (recover.cpp, the same decision) resolved it meanwhile.
                bool resolved = state != nullptr && std::strcmp(state, "42704") == 0;
                if (PQresultStatus(r) != PGRES_COMMAND_OK && err.empty() && !resolved) {
                    const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
                    err = m ? m : PQerrorMessage(p.conn);
                }
                PQclear(r);
                if (PQstatus(p.conn) == CONNECTION_BAD) break;
            }
            if (err.empty() && p.conn != nullptr && PQstatus(p.conn) == CONNECTION_BAD) err = PQerrorMessage(p.conn);
        }
        if (!err.empty()) {
            left = true;
            ereport(WARNING, (errmsg("node \"%s\": %s of two-phase transaction %s failed: %s", p.node,
                                     commit ? "COMMIT PREPARED" : "ROLLBACK PREPARED", p.gid, err.c_str()),
                              errhint("It is resolved as decided by sharding.recover_transactions() "
                                      "(the background worker runs it when the library is preloaded).")));
        }
    }
    bool any = false;
    for (int i = 0; i < nparts; i++) any = any || parts[i].prepared;
    reset_all();
    // Left in doubt: recovery every second until resolved. Else (with the
    // library preloaded) the scanner's recovery deletes the records of what
    // was committed, a second from now.
    if (left)
        jobs_recheck(MyDatabaseId, true);
    else if (commit && any)
        jobs_recheck(MyDatabaseId);
}

void xact_callback(XactEvent event, void *) {
    if (nparts == 0) return;
    switch (event) {
    case XACT_EVENT_PRE_COMMIT:
    case XACT_EVENT_PARALLEL_PRE_COMMIT: {
        try {
            pre_commit();
            return;
        } catch (...) {
            detail::capture_current_exception();
        }
        detail::raise_captured();
    }
    case XACT_EVENT_PRE_PREPARE:
        ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                        errmsg("cannot PREPARE a transaction that ran commands on nodes (run_on_nodes or "
                               "propagated DDL)")));
        break;
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_PARALLEL_COMMIT:
        finish(true);
        break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_ABORT:
        finish(false);
        break;
    default:
        break;
    }
}

void subxact_callback(SubXactEvent event, SubTransactionId mySubid, SubTransactionId, void *) {
    if (event != SUBXACT_EVENT_ABORT_SUB || nparts == 0) return;
    int kept = 0;
    for (int i = 0; i < nparts; i++) {
        Participant &p = parts[i];
        if (p.opened_in >= mySubid) {
            close_part(p);
            continue;
        }
        int first = -1;
        for (int j = 0; j < p.nsp; j++)
            if (p.sp[j] >= mySubid) {
                first = j;
                break;
            }
        if (first >= 0) {
            if (PQtransactionStatus(p.conn) == PQTRANS_ACTIVE) move::cancel_and_drain(p.conn);
            char sql[96];
            snprintf(sql, sizeof sql, "ROLLBACK TO SAVEPOINT sharding_%u", p.sp[first]);
            char state[6];
            std::string err;
            try {
                err = exec_plain(p.conn, sql, state);
            } catch (...) {
                err = "out of memory";
            }
            if (!err.empty()) p.broken = true;
            p.nsp = first;
        }
        if (kept != i) {
            parts[kept] = p;
            parts[i] = Participant{};
        }
        kept++;
    }
    nparts = kept;
}

void install_callbacks() {
    if (callbacks_installed) return;
    RegisterXactCallback(xact_callback, nullptr);
    RegisterSubXactCallback(subxact_callback, nullptr);
    callbacks_installed = true;
}

// The calling role's name (run as that role on every node).
char *current_role_name() { return GetUserNameFromId(GetUserId(), false); }
char *quote_ident_c(const char *s) { return pstrdup(quote_identifier(s)); }

Participant *find_part(const std::string &node) {
    for (int i = 0; i < nparts; i++)
        if (node == parts[i].node) return &parts[i];
    return nullptr;
}

std::string run_there(Participant &p, const std::string &sql) {
    PGresult *r = move::run_statement(p.conn, sql.c_str(), node_prefix(p.node).c_str(), true);
    std::string tag;
    if (r != nullptr) {
        tag = PQcmdStatus(r);
        if (tag.empty() && PQresultStatus(r) == PGRES_TUPLES_OK) tag = format("SELECT %d", PQntuples(r));
        PQclear(r);
    }
    return tag;
}

// Whether the calling role is an administrator (CONTRACT 15.4): a superuser,
// the extension's owner or a role with sharding_admin's privileges. Glue.
bool caller_is_admin() {
    Oid me = GetUserId();
    if (superuser_arg(me)) return true;
    Oid admin = get_role_oid("sharding_admin", true);
    if (OidIsValid(admin) && has_privs_of_role(me, admin)) return true;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[1] = {OIDOID};
    Datum vals[1] = {ObjectIdGetDatum(me)};
    int rc = SPI_execute_with_args(
        "SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'sharding' AND e.extowner = $1", 1, types, vals,
        nullptr, true, 1);
    bool owner = rc == SPI_OK_SELECT && SPI_processed == 1;
    SPI_finish();
    return owner;
}

// A libpq value quoted for a connection string.
std::string conninfo_quote(const char *v) {
    std::string out = "'";
    for (const char *c = v; *c; c++) {
        if (*c == '\'' || *c == '\\') out += '\\';
        out += *c;
    }
    return out + "'";
}

// The node's DSN with its user and password replaced by role (no
// password): the node's own authentication (pg_hba.conf, a password file,
// certificates) decides whether role logs in.
std::string dsn_as_role(const std::string &dsn, const std::string &role) {
    char *err = nullptr;
    PQconninfoOption *opts = PQconninfoParse(dsn.c_str(), &err);
    if (opts == nullptr) {
        std::string m = err ? err : "out of memory";
        if (err) PQfreemem(err);
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "invalid connection string: %s", m.c_str());
    }
    std::string out;
    for (PQconninfoOption *o = opts; o->keyword != nullptr; o++) {
        if (o->val == nullptr || o->val[0] == '\0') continue;
        if (std::strcmp(o->keyword, "user") == 0 || std::strcmp(o->keyword, "password") == 0) continue;
        out += std::string(o->keyword) + "=" + conninfo_quote(o->val) + " ";
    }
    PQconninfoFree(opts);
    return out + "user=" + conninfo_quote(role.c_str());
}

// Connects to node and prepares its session: the checks of CONTRACT 15.4
// (max_prepared_transactions, the role), search_path pinned. Leaves the
// connection to the caller (closed on a throw).
//
// The role (docs/ddl.md, "Privileges"): a superuser's or the extension
// owner's session logs in with the node's DSN and switches to the caller's
// role (SET ROLE); any other role (a member of sharding_admin too, SEC-4)
// logs in as itself (the DSN's host, port, database and the
// like, user = the role, never the DSN's password), so that nothing its
// statement runs there (a DEFAULT, a USING expression, a function of its
// own) can RESET ROLE back to the DSN's user: no role gains a right there.
PGconn *connect_node(const std::string &node, bool begin) {
    std::string dsn = move::node_dsn(node);
    char *me = glue(current_role_name);
    std::string role(me);
    // SEC-4: the DSN's login (the owner's credentials) only for a superuser
    // or the extension's owner; a member of sharding_admin who is neither
    // logs in as itself, as any other role: its statement could otherwise
    // RESET ROLE back to the DSN's user.
    bool admin = glue(caller_is_admin) && move::may_use_owner_credentials();
    PGconn *conn = nullptr;
    try {
        if (admin) {
            move::Remote r(dsn, false, "sharding ddl");
            conn = r.detach();
        } else {
            move::Remote r(dsn_as_role(dsn, role), false, "sharding ddl", std::string(), true);
            conn = r.detach();
        }
    } catch (const Error &e) {
        std::string what = e.what();
        // The node refused the role's own login (a server's FATAL): 42501,
        // with what allows it.
        if (!admin && what.find("FATAL") != std::string::npos)
            throw Error(ERRCODE_INSUFFICIENT_PRIVILEGE,
                        node_prefix(node.c_str()) + format("role \"%s\" could not log in there: %s", role.c_str(),
                                                           what.c_str()),
                        "DDL of a role that is not an administrator (a superuser, the extension's owner or a member "
                        "of sharding_admin) runs on each node in a session of that role, logged in as itself.",
                        "Let the role log in on the node (LOGIN, a pg_hba.conf entry, a password file or certificate "
                        "of the coordinator's server), or have an administrator run the statement.");
        throw Error(e.sqlstate(), node_prefix(node.c_str()) + e.what(), e.detail(), e.hint());
    }
    try {
        std::string prefix = node_prefix(node.c_str());
        PGresult *r = move::run_statement(
            conn,
            "SET search_path = pg_catalog, pg_temp; "
            "SELECT pg_catalog.current_setting('max_prepared_transactions')::integer, CURRENT_USER::text",
            prefix.c_str(), true);
        int mpt = r && PQntuples(r) == 1 ? std::atoi(PQgetvalue(r, 0, 0)) : 0;
        std::string remote_user = r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 1) : "";
        if (r) PQclear(r);
        if (begin && mpt == 0)
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"Statements run on every node commit there through two-phase commit (PREPARE "
                         "TRANSACTION).",
                         "Set max_prepared_transactions (at least the number of such transactions at once, e.g. "
                         "max_connections) in the node's postgresql.conf and restart it."},
                 "node \"%s\" has max_prepared_transactions = 0", node.c_str());
        // The same role as here (CONTRACT 15.4): an administrator's DSN
        // user switches to it, which must exist there and be one it may SET
        // ROLE to (a plain role logged in as itself).
        if (remote_user != role) {
            char *q = glue(quote_ident_c, role.c_str());
            std::string set = std::string("SET ROLE ") + q;
            r = move::run_statement(conn, set.c_str(), prefix.c_str(), true);
            if (r) PQclear(r);
        }
        if (begin) {
            r = move::run_statement(conn, "BEGIN", prefix.c_str(), true);
            if (r) PQclear(r);
        }
    } catch (...) {
        PQfinish(conn);
        throw;
    }
    return conn;
}

Participant &open_part(const std::string &node) {
    if (Participant *p = find_part(node)) return *p;
    if (nparts == kMaxParticipants)
        fail(ERRCODE_TOO_MANY_CONNECTIONS, "too many nodes in one transaction (%d)", kMaxParticipants);
    if (node.size() >= sizeof parts[0].node) fail(ERRCODE_NAME_TOO_LONG, "node name too long");
    glue(install_callbacks);
    PGconn *conn = connect_node(node, true);
    Participant &p = parts[nparts++];
    p = Participant{};
    strlcpy(p.node, node.c_str(), sizeof p.node);
    p.conn = conn;
    p.opened_in = GetCurrentSubTransactionId();
    return p;
}

}  // namespace

void ddl_open(const std::string &node) { (void)open_part(node); }

std::vector<std::string> ddl_run_on_all(const std::vector<std::string> &nodes, const std::string &sql) {
    std::vector<Participant *> ps;
    for (const auto &n : nodes) {
        Participant &p = open_part(n);
        if (p.broken) fail(ERRCODE_IN_FAILED_SQL_TRANSACTION, "node \"%s\": its transaction failed", p.node);
        SubTransactionId cur = GetCurrentSubTransactionId();
        if (cur > p.opened_in && (p.nsp == 0 || p.sp[p.nsp - 1] != cur)) {
            if (p.nsp == kMaxSavepoints) fail(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "too many savepoints on a node");
            run_there(p, format("SAVEPOINT sharding_%u", cur));
            p.sp[p.nsp++] = cur;
        }
        ps.push_back(&p);
    }
    // The statement runs on every node at once; each answer is collected
    // (all of them, so that every connection is ready for what follows),
    // the first failure in node order raised.
    std::exception_ptr first;
    for (Participant *p : ps) {
        if (PQsendQuery(p->conn, sql.c_str()) == 0) {
            if (!first)
                first = std::make_exception_ptr(
                    Error(ERRCODE_CONNECTION_FAILURE, node_prefix(p->node) + "could not send the statement"));
            continue;
        }
        p->sent = true;
    }
    std::vector<std::string> tags(ps.size());
    for (size_t i = 0; i < ps.size(); i++) {
        Participant &p = *ps[i];
        if (!p.sent) continue;
        p.sent = false;
        try {
            PGresult *r = move::collect_statement(p.conn, node_prefix(p.node).c_str(), true);
            if (r != nullptr) {
                tags[i] = PQcmdStatus(r);
                if (tags[i].empty() && PQresultStatus(r) == PGRES_TUPLES_OK) tags[i] = format("SELECT %d", PQntuples(r));
                PQclear(r);
            }
            if (PQtransactionStatus(p.conn) != PQTRANS_INTRANS)
                fail(ERRCODE_INVALID_TRANSACTION_TERMINATION,
                     Explain{"The command runs inside a two-phase transaction on every node.",
                             "Leave out COMMIT, ROLLBACK and the like."},
                     "node \"%s\": the command ended its transaction there", p.node);
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    if (first) std::rethrow_exception(first);
    return tags;
}

std::string ddl_run_alone(const std::string &node, const std::string &setup, const std::string &sql) {
    PGconn *conn = connect_node(node, false);
    std::string tag;
    try {
        PGresult *r = move::run_statement(conn, setup.c_str(), node_prefix(node.c_str()).c_str(), true);
        if (r) PQclear(r);
        r = move::run_statement(conn, sql.c_str(), node_prefix(node.c_str()).c_str(), true);
        if (r) {
            tag = PQcmdStatus(r);
            PQclear(r);
        }
    } catch (...) {
        PQfinish(conn);
        throw;
    }
    PQfinish(conn);
    return tag;
}

// Which of nodes lack the table named (qualified, as to_regclass reads it):
// each asked in a session of its own, outside any transaction (no
// two-phase commit, no max_prepared_transactions needed).
std::vector<std::string> ddl_nodes_lacking(const std::vector<std::string> &nodes, const std::string &qualified) {
    std::vector<std::string> out;
    char *lit = glue(quote_literal_cstr, qualified.c_str());
    std::string sql = std::string("SELECT pg_catalog.to_regclass(") + lit + ") IS NULL";
    for (const auto &n : nodes) {
        PGconn *conn = connect_node(n, false);
        bool lacks = false;
        try {
            PGresult *r = move::run_statement(conn, sql.c_str(), node_prefix(n.c_str()).c_str(), true);
            lacks = r != nullptr && PQntuples(r) == 1 && std::strcmp(PQgetvalue(r, 0, 0), "t") == 0;
            if (r) PQclear(r);
        } catch (...) {
            PQfinish(conn);
            throw;
        }
        PQfinish(conn);
        if (lacks) out.push_back(n);
    }
    return out;
}

namespace {
// SPI glue: the attached data nodes into a palloc'd array.
int attached_nodes_c(char ***out) {
    *out = nullptr;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    // A node's slot in this database: _config_slot_here finds 1.4's tagged
    // name and 1.3's; before ALTER EXTENSION UPDATE (1.3's SQL, no
    // _config_slot_here) 1.3's _config_slot names the slots 1.3 made.
    int rc = SPI_execute("SELECT pg_catalog.to_regprocedure('sharding._config_slot_here(text)') IS NOT NULL", true, 1);
    bool here = false;
    if (rc == SPI_OK_SELECT && SPI_processed == 1) {
        char *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
        here = v && v[0] == 't';
    }
    rc = SPI_execute(here ? "SELECT n.node FROM sharding.nodes AS n WHERE n.dsn IS NOT NULL AND EXISTS (SELECT FROM "
                            "pg_catalog.pg_replication_slots AS s WHERE s.slot_name = sharding._config_slot_here(n.node) "
                            "AND s.database = pg_catalog.current_database()) ORDER BY n.node COLLATE \"C\""
                          : "SELECT n.node FROM sharding.nodes AS n WHERE n.dsn IS NOT NULL AND EXISTS (SELECT FROM "
                            "pg_catalog.pg_replication_slots AS s WHERE s.slot_name = sharding._config_slot(n.node) "
                            "AND s.database = pg_catalog.current_database()) ORDER BY n.node COLLATE \"C\"",
                     true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "could not list the attached nodes");
    int n = (int)SPI_processed;
    char **names = static_cast<char **>(MemoryContextAlloc(CurTransactionContext, sizeof(char *) * (n + 1)));
    for (int i = 0; i < n; i++) {
        char *v = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
        names[i] = MemoryContextStrdup(CurTransactionContext, v ? v : "");
    }
    SPI_finish();
    *out = names;
    return n;
}

// Whether node is in sharding.nodes (glue).
bool node_known(const char *node) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[1] = {TEXTOID};
    Datum vals[1] = {CStringGetTextDatum(node)};
    int rc = SPI_execute_with_args("SELECT FROM sharding.nodes AS n WHERE n.node = $1", 1, types, vals, nullptr,
                                   true, 1);
    bool found = rc == SPI_OK_SELECT && SPI_processed == 1;
    SPI_finish();
    return found;
}
}  // namespace

std::vector<std::string> ddl_attached_nodes() {
    char **names = nullptr;
    int n = glue(attached_nodes_c, &names);
    std::vector<std::string> out;
    for (int i = 0; i < n; i++) out.emplace_back(names[i]);
    return out;
}

}  // namespace sharding

using namespace sharding;

namespace {
struct NodeArg {
    char **names;
    int n;
};
// The nodes argument (text[]) as C strings; a NULL element is 22004.
NodeArg node_array(ArrayType *arr) {
    Datum *elems;
    bool *nulls;
    int n;
    deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
    char **names = static_cast<char **>(palloc(sizeof(char *) * (n + 1)));
    for (int i = 0; i < n; i++) {
        if (nulls[i])
            ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("node names must not be NULL")));
        names[i] = TextDatumGetCString(elems[i]);
    }
    return NodeArg{names, n};
}

void put_row(ReturnSetInfo *rsinfo, const char *node, const char *tag) {
    Datum values[2] = {CStringGetTextDatum(node), CStringGetTextDatum(tag)};
    bool nulls[2] = {false, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}
void init_srf(FunctionCallInfo fcinfo) { InitMaterializedSRF(fcinfo, 0); }
}  // namespace

namespace {
ArrayType *text_array(const std::vector<std::string> *v) {
    Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (v->size() + 1)));
    for (size_t i = 0; i < v->size(); i++) d[i] = CStringGetTextDatum((*v)[i].c_str());
    return construct_array(d, (int)v->size(), TEXTOID, -1, false, TYPALIGN_INT);
}
}  // namespace

// _ddl_nodes_lacking(qualified text): text[], the attached data nodes where
// to_regclass(qualified) is NULL (distribute creates the table there only).
SHARDING_FUNCTION(sharding_ddl_nodes_lacking) {
    if (PG_ARGISNULL(0)) fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the table name must not be NULL");
    std::string qualified = text_to_cstring(PG_GETARG_TEXT_PP(0));
    std::vector<std::string> lacking = ddl_nodes_lacking(ddl_attached_nodes(), qualified);
    PG_RETURN_ARRAYTYPE_P(glue(text_array, &lacking));
}

// run_on_nodes(command text, nodes text[] DEFAULT NULL): TABLE(node, result).
SHARDING_FUNCTION(sharding_run_on_nodes) {
    if (PG_ARGISNULL(0)) fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the command must not be NULL");
    char *command = text_to_cstring(PG_GETARG_TEXT_PP(0));
    NodeArg arg{nullptr, -1};
    if (!PG_ARGISNULL(1)) arg = glue(node_array, PG_GETARG_ARRAYTYPE_P(1));
    glue(init_srf, fcinfo);
    ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    std::vector<std::string> nodes;
    if (arg.n < 0) {
        nodes = ddl_attached_nodes();
    } else {
        for (int i = 0; i < arg.n; i++) {
            std::string name(arg.names[i]);
            bool dup = false;
            for (const auto &s : nodes) dup = dup || s == name;
            if (dup) continue;
            if (!glue(node_known, arg.names[i]))
                fail(ERRCODE_UNDEFINED_OBJECT,
                     Explain{"", "sharding.add_node() gives a node its connection string."},
                     "node \"%s\" does not exist", arg.names[i]);
            nodes.push_back(name);
        }
    }
    // Every node is reached and checked before the command runs anywhere.
    for (const auto &n : nodes) ddl_open(n);
    // Names resolve there as here: this session's schemas, spelled out.
    std::string path = ddl_search_path_setting();
    std::vector<std::string> tags = ddl_run_on_all(nodes, path + ";\n" + command);
    for (size_t i = 0; i < nodes.size(); i++) glue(put_row, rsinfo, nodes[i].c_str(), tags[i].c_str());
    return (Datum)0;
}
