// libpq connections of the move engine: see move_remote.hpp.
#include "remote/move_remote.hpp"
#include "pg/spi.hpp"
#include "pg/spi_snapshot.hpp"

#include <algorithm>
#include <cctype>
#include <sys/socket.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

extern "C" {
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "utils/syscache.h"
#include "utils/lsyscache.h"
#include "portability/instr_time.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/wait_event.h"
#include "utils/snapmgr.h"
}

namespace sharding::move {

namespace {

// Open connections of this backend (plain C storage: it must survive any
// longjmp). Closed at the end of the transaction that opened them.
constexpr int kMaxConns = 32;
PGconn *registry[kMaxConns];
struct Held {
    char slot[64];
    PGconn *conn;
};
Held held[kMaxConns];
bool callbacks_installed = false;
// take_over's connections skip the identity check until the transaction ends.
bool takeover_mode = false;
// How many of the engine's own entry points run in this backend
// (sharding__engine_call): the owner's credentials serve
// their statements (may_use_owner_credentials).
int engine_depth = 0;

void xact_callback(XactEvent event, void *) {
    switch (event) {
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_PARALLEL_COMMIT:
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_ABORT:
    case XACT_EVENT_PREPARE:
        close_all_connections();
        takeover_mode = false;
        engine_depth = 0;
        break;
    default:
        break;
    }
}

void exit_callback(int, Datum) { close_all_connections(); }


void install_callbacks() {
    if (callbacks_installed) return;
    RegisterXactCallback(xact_callback, nullptr);
    on_proc_exit(exit_callback, 0);
    callbacks_installed = true;
}

int wait_socket_quietly(int events, pgsocket sock, long timeout_ms);

// How long a cancel request may take to reach the node's postmaster, where
// libpq lets it be polled (17): its host or postmaster may not answer.
constexpr long kCancelMs = 10000;

void cancel_conn(PGconn *conn) noexcept {
    if (conn == nullptr || PQtransactionStatus(conn) != PQTRANS_ACTIVE) return;
#ifdef LIBPQ_HAS_ASYNC_CANCEL
    // libpq 17: the request's connection polled as a handshake is, for
    // kCancelMs at most (not at all once this backend is told to end or is
    // ending), so that a node whose host or postmaster does not answer
    // cannot keep this backend waiting, deaf to interrupts, as PQcancel
    // would (until TCP gives up, or without end). A request not confirmed
    // (the postmaster closing its connection) may still arrive later and
    // cancel whatever the session runs then: the session's socket is shut
    // down, so that nothing runs on it again (it counts as lost).
    if (!ProcDiePending && !proc_exit_inprogress) {
        PGcancelConn *cc = PQcancelCreate(conn);
        bool confirmed = false;
        if (cc != nullptr && PQcancelStart(cc) == 1) {
            instr_time start;
            INSTR_TIME_SET_CURRENT(start);
            PostgresPollingStatusType st = PGRES_POLLING_WRITING;
            while (st == PGRES_POLLING_READING || st == PGRES_POLLING_WRITING) {
                instr_time now;
                INSTR_TIME_SET_CURRENT(now);
                INSTR_TIME_SUBTRACT(now, start);
                const long left = kCancelMs - static_cast<long>(INSTR_TIME_GET_MILLISEC(now));
                const pgsocket sock = PQcancelSocket(cc);
                if (left <= 0 || ProcDiePending || sock == PGINVALID_SOCKET) break;
                try {
                    const int rc = glue(wait_socket_quietly,
                                        st == PGRES_POLLING_WRITING ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE, sock,
                                        left);
                    if (rc & (WL_SOCKET_WRITEABLE | WL_SOCKET_READABLE)) st = PQcancelPoll(cc);
                } catch (...) {
                    break;
                }
            }
            confirmed = st == PGRES_POLLING_OK;
        }
        if (cc != nullptr) PQcancelFinish(cc);
        if (!confirmed) {
            const pgsocket sock = PQsocket(conn);
            if (sock != PGINVALID_SOCKET) (void)shutdown(sock, SHUT_RDWR);
        }
        return;
    }
#endif
    PGcancel *c = PQgetCancel(conn);
    if (c == nullptr) return;
    char err[256];
    (void)PQcancel(c, err, sizeof err);
    PQfreeCancel(c);
}

void register_conn(PGconn *conn) {
    for (auto &slot : registry)
        if (slot == nullptr) {
            slot = conn;
            return;
        }
    PQfinish(conn);
    fail(ERRCODE_TOO_MANY_CONNECTIONS, "too many connections of the move engine in this session (%d)", kMaxConns);
}

void unregister_conn(PGconn *conn) noexcept {
    for (auto &slot : registry)
        if (slot == conn) slot = nullptr;
}

// Whether a connection string gives a non-empty password itself (not a
// password file, nor the environment of the server's OS user).
bool dsn_has_password(const char *dsn) {
    PQconninfoOption *opts = PQconninfoParse(dsn, nullptr);
    if (opts == nullptr) return false;
    bool found = false;
    for (PQconninfoOption *o = opts; o->keyword != nullptr; o++)
        if (std::strcmp(o->keyword, "password") == 0 && o->val != nullptr && o->val[0] != '\0') found = true;
    PQconninfoFree(opts);
    return found;
}

int sqlstate_of(const char *s) {
    if (s == nullptr || std::strlen(s) != 5) return ERRCODE_CONNECTION_FAILURE;
    return MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4]);
}

std::string chomp(const char *m) {
    std::string s = m ? m : "";
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// A remote error: its SQLSTATE, message, detail and hint, raised here.
[[noreturn]] void throw_result(PGresult *res, PGconn *conn, const char *prefix = "remote: ") {
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    std::string msg = chomp(res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : nullptr);
    if (msg.empty()) msg = chomp(PQerrorMessage(conn));
    std::string detail = chomp(res ? PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : nullptr);
    std::string hint = chomp(res ? PQresultErrorField(res, PG_DIAG_MESSAGE_HINT) : nullptr);
    int code = sqlstate_of(state);
    if (res) PQclear(res);
    throw Error(code, prefix + msg, detail, hint);
}

// One interruptible wait for the socket (glue: may ereport), waking after
// timeout_ms at the latest (-1: no limit).
int wait_socket_timeout(int events, pgsocket sock, long timeout_ms) {
    if (timeout_ms >= 0) events |= WL_TIMEOUT;
    InvalidateCatalogSnapshotConditionally();
    int rc = WaitLatchOrSocket(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH | events, sock, timeout_ms, PG_WAIT_EXTENSION);
    if (rc & WL_LATCH_SET) ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
    return rc;
}

// A wait for the socket or timeout_ms, not interruptible (glue: may
// ereport only if the wait itself fails): a drain after a cancel (the
// interrupt being handled is still pending); the latch is reset.
int wait_socket_quietly(int events, pgsocket sock, long timeout_ms) {
    int rc = WaitLatchOrSocket(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH | WL_TIMEOUT | events, sock, timeout_ms,
                               PG_WAIT_EXTENSION);
    if (rc & WL_LATCH_SET) ResetLatch(MyLatch);
    return rc;
}

// One interruptible wait for any of n sockets (glue: may ereport), each
// with its events (WL_SOCKET_READABLE or WL_SOCKET_WRITEABLE), for
// timeout_ms at most (-1: no limit); ready[i] set for each socket that is. From 17 the set is the resource owner's
// (an ERROR before FreeWaitEventSet closes it at the transaction's end);
// before 17 an ERROR of AddWaitEventToSet (epoll_ctl) or WaitEventSetWait
// would leave its descriptor open for the backend's life, as
// WaitLatchOrSocket's does.
void wait_sockets(int n, const pgsocket *socks, const int *events, bool *ready, long timeout_ms) {
    InvalidateCatalogSnapshotConditionally();
    WaitEvent *occurred = static_cast<WaitEvent *>(palloc(sizeof(WaitEvent) * (n + 2)));
#if PG_VERSION_NUM >= 170000
    WaitEventSet *set = CreateWaitEventSet(CurrentResourceOwner, n + 2);
#else
    WaitEventSet *set = CreateWaitEventSet(CurrentMemoryContext, n + 2);
#endif
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    for (int i = 0; i < n; i++)
        AddWaitEventToSet(set, events[i], socks[i], nullptr, reinterpret_cast<void *>(static_cast<intptr_t>(i)));
    const int k = WaitEventSetWait(set, timeout_ms, occurred, n + 2, PG_WAIT_EXTENSION);
    FreeWaitEventSet(set);
    for (int i = 0; i < k; i++) {
        if (occurred[i].events & WL_LATCH_SET) ResetLatch(MyLatch);
        if (occurred[i].events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
            ready[reinterpret_cast<intptr_t>(occurred[i].user_data)] = true;
    }
    pfree(occurred);
    CHECK_FOR_INTERRUPTS();
}

// libpq's connect_timeout of a connection (its connection string, else
// PGCONNECT_TIMEOUT), in milliseconds; -1 when there is none. libpq
// applies it only when it connects itself (PQconnectdb), not to a
// handshake polled as Remote::handshake polls: that applies it, to each
// host tried, as libpq does (a value of 1 counts as 2 seconds).
long connect_timeout_ms(PGconn *conn) {
    PQconninfoOption *opts = PQconninfo(conn);
    if (opts == nullptr) return -1;
    long ms = -1;
    for (PQconninfoOption *o = opts; o->keyword != nullptr; o++)
        if (std::strcmp(o->keyword, "connect_timeout") == 0 && o->val != nullptr && *o->val != '\0') {
            char *end = nullptr;
            const long secs = std::strtol(o->val, &end, 10);
            while (end != o->val && std::isspace(static_cast<unsigned char>(*end))) end++;
            if (end != o->val && *end == '\0' && secs > 0) ms = (secs == 1 ? 2 : std::min(secs, 86400L)) * 1000;
        }
    PQconninfoFree(opts);
    return ms;
}

// The host and port a connection in progress is trying.
std::string trying(PGconn *conn) {
    const char *h = PQhost(conn);
    const char *p = PQport(conn);
    return std::string(h ? h : "") + ":" + (p ? p : "");
}

// How long a drain after a cancel waits for the server's answer.
constexpr long kDrainMs = 30000;

// The tick of the live WaitTick (plain C storage).
const std::function<void()> *tick_fn = nullptr;
long tick_ms = 0;
instr_time tick_last;
bool tick_running = false;

// Milliseconds until the tick is due: -1 none (or it is running), 0 now.
long tick_due() {
    if (tick_fn == nullptr || tick_running) return -1;
    instr_time now;
    INSTR_TIME_SET_CURRENT(now);
    INSTR_TIME_SUBTRACT(now, tick_last);
    long left = tick_ms - (long)INSTR_TIME_GET_MILLISEC(now);
    return left > 0 ? left : 0;
}

void run_tick() {
    tick_running = true;
    try {
        (*tick_fn)();
    } catch (...) {
        tick_running = false;
        INSTR_TIME_SET_CURRENT(tick_last);
        throw;
    }
    tick_running = false;
    INSTR_TIME_SET_CURRENT(tick_last);
}

}  // namespace

WaitTick::WaitTick(std::function<void()> tick, long ms)
    : tick_(std::move(tick)), prev_tick_(tick_fn), prev_ms_(tick_ms) {
    tick_fn = &tick_;
    tick_ms = ms;
    INSTR_TIME_SET_CURRENT(tick_last);
}

WaitTick::~WaitTick() {
    tick_fn = prev_tick_;
    tick_ms = prev_ms_;
}

void close_all_connections() noexcept {
    for (auto &slot : registry)
        if (slot != nullptr) {
            cancel_conn(slot);
            PQfinish(slot);
            slot = nullptr;
        }
    for (auto &h : held) h = Held{};
}

void close_connection(PGconn *conn) noexcept {
    if (conn == nullptr) return;
    cancel_conn(conn);
    unregister_conn(conn);
    PQfinish(conn);
}

void hold_connection(const std::string &slot, PGconn *conn) {
    for (auto &h : held)
        if (h.conn == nullptr) {
            strlcpy(h.slot, slot.c_str(), sizeof h.slot);
            h.conn = conn;
            return;
        }
    close_connection(conn);
    fail(ERRCODE_TOO_MANY_CONNECTIONS, "too many held replication connections in this session");
}

bool close_held(const std::string &slot) noexcept {
    bool found = false;
    for (auto &h : held)
        if (h.conn != nullptr && slot == h.slot) {
            close_connection(h.conn);
            h = Held{};
            found = true;
        }
    return found;
}

// The fencing check every session of the engine runs where it connects
// (after the session guard, kSessionGuard below): this database's
// coordinator token (sharding.coordinator_identity; "" without a row), or
// none where this database has no such table (nothing to check). The other
// end calls sharding._serve(token) where it has it, so that a node that
// follows another coordinator refuses the session (55000) before it runs
// anything.
Text serve_token() {
    if (spi_value("SELECT pg_catalog.to_regclass('sharding.coordinator_identity') IS NOT NULL", {}) != Text("t"))
        return std::nullopt;
    return spi_value("SELECT i.token::text FROM sharding.coordinator_identity AS i", {}).value_or(std::string());
}

void set_takeover_mode() {
    glue(install_callbacks);
    takeover_mode = true;
}

std::string node_dsn(const std::string &node) {
    // SPI from C++: through pg_call (it may ereport), with plain C values.
    const char *name = node.c_str();
    char *dsn = pg_call([&]() -> char * {
        char *out = nullptr;
        bool pushed = SPI_connect() == SPI_OK_CONNECT;
        const bool snap = sharding::spi_snapshot_push();
        Oid types[1] = {TEXTOID};
        Datum vals[1] = {CStringGetTextDatum(name)};
        if (SPI_execute_with_args("SELECT n.dsn FROM sharding.nodes n WHERE n.node = $1", 1, types, vals, nullptr,
                                  true, 1) == SPI_OK_SELECT &&
            SPI_processed == 1) {
            char *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
            if (v != nullptr) out = MemoryContextStrdup(TopTransactionContext, v);
        }
        sharding::spi_snapshot_pop(snap);
        if (pushed) SPI_finish();
        return out;
    });
    if (dsn == nullptr)
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"Moving a shard online connects to its source and its destination.",
                     "Call sharding.add_node() with its connection string first."},
             "node \"%s\" has no connection string", node.c_str());
    std::string s(dsn);
    pfree(dsn);
    return s;
}

// The owner of sharding.node_secrets: the extension's owner (the
// extension script made it); InvalidOid if there is none.
static Oid secrets_owner() {
    Oid nsp = get_namespace_oid("sharding", true);
    Oid rel = OidIsValid(nsp) ? get_relname_relid("node_secrets", nsp) : InvalidOid;
    if (!OidIsValid(rel)) return InvalidOid;
    HeapTuple tup = SearchSysCache1(RELOID, ObjectIdGetDatum(rel));
    if (!HeapTupleIsValid(tup)) return InvalidOid;
    Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tup))->relowner;
    ReleaseSysCache(tup);
    return owner;
}

// Glue: whether the current user is a superuser or has the rights of the
// extension's owner.
static bool owner_or_superuser() {
    if (!IsTransactionState()) return false;
    if (superuser()) return true;
    Oid owner = secrets_owner();
    return OidIsValid(owner) && has_privs_of_role(GetUserId(), owner);
}

// real_dsn's catalog part, C-style (it may ereport): the whole DSN whose
// masked form is `shown`, palloc'd in the current memory context, or NULL.
// The table's owner is the extension's owner (the extension script made it).
// The user id is restored on every path; SECURITY_RESTRICTED_OPERATION as
// for any code run on another role's behalf, every name and operator
// schema-qualified.
static char *unmask_as_owner(const char *shown) {
    if (!IsTransactionState()) return nullptr;
    Oid owner = secrets_owner();
    if (!OidIsValid(owner)) return nullptr;

    Oid save_user;
    int save_sec;
    GetUserIdAndSecContext(&save_user, &save_sec);
    MemoryContext caller = CurrentMemoryContext;
    char *out = nullptr;
    SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
    PG_TRY();
    {
        if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
        const bool snap = sharding::spi_snapshot_push();
        Oid types[1] = {TEXTOID};
        Datum vals[1] = {CStringGetTextDatum(shown)};
        if (SPI_execute_with_args(
                "SELECT s.dsn FROM sharding.node_secrets AS s JOIN sharding.nodes AS n "
                "ON n.node OPERATOR(pg_catalog.=) s.node "
                "WHERE n.dsn OPERATOR(pg_catalog.=) $1 AND sharding._mask_password(s.dsn) OPERATOR(pg_catalog.=) $1 "
                "ORDER BY s.node COLLATE \"C\" LIMIT 1",
                1, types, vals, nullptr, true, 1) == SPI_OK_SELECT &&
            SPI_processed == 1) {
            char *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
            if (v != nullptr) out = MemoryContextStrdup(caller, v);
        }
        sharding::spi_snapshot_pop(snap);
        SPI_finish();
    }
    PG_FINALLY();
    {
        SetUserIdAndSecContext(save_user, save_sec);
    }
    PG_END_TRY();
    return out;
}

std::string real_dsn(const std::string &dsn) {
    if (dsn.find("********") == std::string::npos) return dsn;
    const char *shown = dsn.c_str();
    char *whole = pg_call([&]() -> char * { return unmask_as_owner(shown); });
    if (whole == nullptr) return dsn;
    std::string s(whole);
    pfree(whole);
    return s;
}

bool may_use_owner_credentials() { return engine_depth > 0 || glue(owner_or_superuser); }

std::string caller_dsn(const std::string &dsn) {
    if (may_use_owner_credentials() || real_dsn(dsn) == dsn) return dsn;
    fail(ERRCODE_INSUFFICIENT_PRIVILEGE,
         Explain{"The whole connection strings of the nodes (sharding.node_secrets) serve only the statements the "
                 "extension itself runs: attach_node, detach_node, moves, rebalance jobs, take_over.",
                 "Give a connection string with a password of your own, or call the extension's public functions."},
         "permission denied to use the connection string of a node with its password masked");
}

int engine_scope_enter() { return engine_depth++; }
void engine_scope_leave(int saved) { engine_depth = saved; }

namespace {

bool is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

bool is_secret_key(const std::string &key) { return key == "password" || key == "sslpassword"; }

const char *const kStars = "********";

// A URI's query keyword as libpq reads it (%XX decoded); "" if malformed.
std::string uri_decode(const std::string &s) {
    std::string out;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] != '%') {
            out += s[i];
            continue;
        }
        if (i + 2 >= s.size() || !std::isxdigit((unsigned char)s[i + 1]) || !std::isxdigit((unsigned char)s[i + 2]))
            return std::string();
        out += (char)std::stoi(s.substr(i + 1, 2), nullptr, 16);
        i += 2;
    }
    return out;
}

// A URI, as libpq's conninfo_uri_parse_options reads it: the user
// information runs up to the first '@' met before any '/' (a '?' or ':'
// there is the password's); the query parameters start at the first '?'
// after it, separated by '&', their keywords percent-decoded.
std::string mask_uri(const std::string &dsn) {
    std::string out = dsn;
    size_t start = out.find("://") + 3;
    size_t end = out.find_first_of("@/", start);
    size_t after = start;
    if (end != std::string::npos && out[end] == '@') {
        size_t colon = out.find(':', start);
        if (colon != std::string::npos && colon < end) {
            out.replace(colon + 1, end - colon - 1, kStars);
            end = colon + 1 + std::strlen(kStars);
        }
        after = end + 1;
    }
    size_t q = out.find('?', after);
    if (q == std::string::npos) return out;
    for (size_t p = q + 1; p <= out.size();) {
        size_t amp = out.find('&', p);
        if (amp == std::string::npos) amp = out.size();
        size_t eq = out.find('=', p);
        if (eq != std::string::npos && eq < amp && is_secret_key(uri_decode(out.substr(p, eq - p)))) {
            out.replace(eq + 1, amp - eq - 1, kStars);
            amp = eq + 1 + std::strlen(kStars);
        }
        p = amp + 1;
    }
    return out;
}

// key = value pairs, as libpq's conninfo_parse reads them.
std::string mask_pairs(const std::string &dsn) {
    std::string out;
    size_t i = 0, n = dsn.size();
    while (i < n) {
        size_t ws = i;
        while (i < n && is_space(dsn[i])) i++;
        size_t k = i;
        while (i < n && !is_space(dsn[i]) && dsn[i] != '=') i++;
        const std::string key = dsn.substr(k, i - k);
        while (i < n && is_space(dsn[i])) i++;
        if (i >= n || dsn[i] != '=') {
            out += dsn.substr(ws);
            return out;
        }
        i++;
        while (i < n && is_space(dsn[i])) i++;
        size_t v = i;
        if (i < n && dsn[i] == '\'') {
            i++;
            while (i < n && dsn[i] != '\'') i += (dsn[i] == '\\' && i + 1 < n) ? 2 : 1;
            if (i >= n) {  // unterminated: hide the rest
                out += dsn.substr(ws, v - ws) + kStars;
                return out;
            }
            i++;
        } else {
            while (i < n && !is_space(dsn[i])) i += (dsn[i] == '\\' && i + 1 < n) ? 2 : 1;
        }
        out += dsn.substr(ws, v - ws);
        out += is_secret_key(key) ? std::string(kStars) : dsn.substr(v, i - v);
    }
    return out;
}

// The options libpq reads from dsn (nullptr if it does not parse).
struct Parsed {
    PQconninfoOption *opts;
    explicit Parsed(const std::string &dsn) : opts(PQconninfoParse(dsn.c_str(), nullptr)) {}
    ~Parsed() {
        if (opts != nullptr) PQconninfoFree(opts);
    }
    Parsed(const Parsed &) = delete;
    Parsed &operator=(const Parsed &) = delete;
};

// Whether `shown` gives libpq no password of `orig` (each one absent or
// ********, and no password of orig's anywhere in its text).
bool hides(const Parsed &orig, const std::string &shown) {
    Parsed after(shown);
    if (after.opts == nullptr) return false;
    for (PQconninfoOption *o = after.opts; o->keyword != nullptr; o++)
        if (is_secret_key(o->keyword) && o->val != nullptr && o->val[0] != '\0' && std::strcmp(o->val, kStars) != 0)
            return false;
    for (PQconninfoOption *o = orig.opts; o->keyword != nullptr; o++)
        if (is_secret_key(o->keyword) && o->val != nullptr && o->val[0] != '\0' && std::strcmp(o->val, kStars) != 0 &&
            shown.find(o->val) != std::string::npos)
            return false;
    return true;
}

// The options as key = 'value' pairs, the passwords masked.
std::string pairs_of(const Parsed &p) {
    std::string out;
    for (PQconninfoOption *o = p.opts; o->keyword != nullptr; o++) {
        if (o->val == nullptr) continue;
        if (!out.empty()) out += ' ';
        out += o->keyword;
        out += '=';
        if (is_secret_key(o->keyword)) {
            out += kStars;
            continue;
        }
        out += '\'';
        for (const char *c = o->val; *c; c++) {
            if (*c == '\'' || *c == '\\') out += '\\';
            out += *c;
        }
        out += '\'';
    }
    return out;
}

}  // namespace

std::string mask_password(const std::string &dsn) {
    const bool uri = dsn.rfind("postgresql://", 0) == 0 || dsn.rfind("postgres://", 0) == 0;
    std::string shown = uri ? mask_uri(dsn) : mask_pairs(dsn);
    Parsed orig(dsn);
    if (orig.opts == nullptr) return shown;  // libpq reads no password from it either
    if (hides(orig, shown)) return shown;
    return pairs_of(orig);
}

void cancel_and_drain(PGconn *conn) noexcept {
    cancel_conn(conn);
    // The statement's results, read as they come, for kDrainMs at most:
    // a server's backend that does not answer (stopped) would otherwise
    // keep this backend waiting, deaf to cancel and terminate, until TCP
    // gives up. Then, or at once when this backend is told to end
    // (pg_terminate_backend, a shutdown) or is ending, the socket is shut
    // down: the connection is lost (CONNECTION_BAD) for whoever uses it
    // next, and the server's backend ends its statement and transaction
    // when it sees that (the engine's sessions check every second,
    // client_connection_check_interval).
    instr_time start;
    INSTR_TIME_SET_CURRENT(start);
    bool give_up = false;
    while (!give_up) {
        if (PQstatus(conn) == CONNECTION_BAD) return;
        if (PQflush(conn) < 0 || PQconsumeInput(conn) == 0) break;
        bool wait = false;
        while (!wait && !give_up) {
            if (PQisBusy(conn)) {
                wait = true;
                break;
            }
            PGresult *r = PQgetResult(conn);
            if (r == nullptr) return;  // drained
            const ExecStatusType st = PQresultStatus(r);
            PQclear(r);
            if (PQstatus(conn) == CONNECTION_BAD) return;
            if (st == PGRES_COPY_IN) {
                // A copy into the server: ended as failed (it rolls back).
                const int ended = PQputCopyEnd(conn, "cancelled");
                if (ended < 0) give_up = true;
                if (ended == 0) wait = true;
            } else if (st == PGRES_COPY_OUT) {
                // A copy out of it: its data read and dropped to its end.
                char *buf = nullptr;
                int n;
                while ((n = PQgetCopyData(conn, &buf, 1)) > 0) PQfreemem(buf);
                if (n == 0) wait = true;
                if (n == -2) give_up = true;
            } else if (st == PGRES_COPY_BOTH) {
                give_up = true;
            }
        }
        if (give_up) break;
        instr_time now;
        INSTR_TIME_SET_CURRENT(now);
        INSTR_TIME_SUBTRACT(now, start);
        const long left = kDrainMs - static_cast<long>(INSTR_TIME_GET_MILLISEC(now));
        const pgsocket sock = PQsocket(conn);
        if (left <= 0 || ProcDiePending || proc_exit_inprogress || sock == PGINVALID_SOCKET) break;
        // (Output still queued, a copy's end say: writable or readable,
        // as libpq's own wait, so that a server writing to us is read.)
        const int events = PQflush(conn) == 1 ? (WL_SOCKET_WRITEABLE | WL_SOCKET_READABLE) : WL_SOCKET_READABLE;
        try {
            glue(wait_socket_quietly, events, sock, left);
        } catch (...) {
            break;
        }
    }
    // Given up: the socket shut down, what libpq still holds consumed (it
    // sees the end of the connection at once).
    const pgsocket sock = PQsocket(conn);
    if (sock != PGINVALID_SOCKET) (void)shutdown(sock, SHUT_RDWR);
    for (int i = 0; i < 16; i++) {
        if (PQconsumeInput(conn) == 0 || PQstatus(conn) == CONNECTION_BAD) break;
        if (PQisBusy(conn)) continue;
        PGresult *r = PQgetResult(conn);
        if (r == nullptr) break;
        PQclear(r);
    }
}

PGresult *next_result(PGconn *conn) {
    for (;;) {
        int flushed = PQflush(conn);
        if (flushed < 0) fail(ERRCODE_CONNECTION_FAILURE, "lost the connection: %s", chomp(PQerrorMessage(conn)).c_str());
        if (flushed == 0) {
            if (PQconsumeInput(conn) == 0)
                fail(ERRCODE_CONNECTION_FAILURE, "lost the connection: %s", chomp(PQerrorMessage(conn)).c_str());
            if (!PQisBusy(conn)) return PQgetResult(conn);
        }
        pgsocket sock = PQsocket(conn);
        if (sock == PGINVALID_SOCKET) fail(ERRCODE_CONNECTION_FAILURE, "the connection has no socket");
        long due = tick_due();
        if (due == 0) {
            run_tick();
            continue;
        }
        glue(wait_socket_timeout, flushed == 1 ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE, sock, due);
    }
}

PGresult *run_statement(PGconn *conn, const char *sql, const char *prefix, bool drain) {
    if (PQsendQuery(conn, sql) == 0)
        fail(ERRCODE_CONNECTION_FAILURE, "could not send a statement: %s", chomp(PQerrorMessage(conn)).c_str());
    return collect_statement(conn, prefix, drain);
}

PGresult *collect_statement(PGconn *conn, const char *prefix, bool drain) {
    PGresult *last = nullptr;
    PGresult *failed = nullptr;
    try {
        for (PGresult *res; (res = next_result(conn)) != nullptr;) {
            ExecStatusType st = PQresultStatus(res);
            if (st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR) {
                if (failed == nullptr)
                    failed = res;
                else
                    PQclear(res);
                continue;
            }
            if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT || st == PGRES_COPY_BOTH) {
                PQclear(res);
                fail(ERRCODE_PROTOCOL_VIOLATION, "unexpected COPY from a statement");
            }
            if (last) PQclear(last);
            last = res;
        }
    } catch (...) {
        if (last) PQclear(last);
        if (failed) PQclear(failed);
        if (drain) cancel_and_drain(conn);
        throw;
    }
    if (failed != nullptr) {
        if (last) PQclear(last);
        throw_result(failed, conn, prefix);
    }
    return last;
}

// The first statements of every (non-replication) session: see the Remote
// constructor. In plain SQL (no DO block to compile in every new session;
// sharding._serve, PL/pgSQL itself, is called only where it exists), in
// one round trip: whether the database has a schema "sharding" that is
// not the extension's (then the session is refused, 42501, before anything
// runs there: a database without a schema "sharding" passes, nothing of
// the engine's can run there), the database's name as an identifier, and
// whether it has sharding._serve(text) (the fencing check, serve_token
// above).
const char *const kSessionGuard =
    "SET search_path = pg_catalog, pg_temp; "
    "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'sharding') "
    "AND NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e JOIN pg_catalog.pg_namespace AS n "
    "ON n.oid = e.extnamespace WHERE e.extname = 'sharding' AND n.nspname = 'sharding'), "
    "pg_catalog.quote_ident(pg_catalog.current_database()), "
    "pg_catalog.to_regprocedure('sharding._serve(text)') IS NOT NULL";

Remote::Remote(const std::string &dsn_in, bool replication, const std::string &application_name,
               const std::string &options, bool own_login)
    : Remote(Deferred{}, dsn_in, replication, application_name, options, own_login) {
    // The object is whole once the constructor it delegates to returns: a
    // throw from here runs ~Remote, which closes the connection.
    Remote *self = this;
    handshake(&self, 1);
    established();
    first_checks();
}

Remote::Remote(Deferred, const std::string &dsn_in, bool replication, const std::string &application_name,
               const std::string &options, bool own_login)
    : own_login_(own_login), replication_(replication) {
    glue(install_callbacks);
    // A node's shown DSN becomes its whole one (password included).
    const std::string dsn = real_dsn(dsn_in);
    // The password rule of PostgreSQL's own remote connectors (postgres_fdw's
    // password_required), for every connection the engine, the jobs and follow
    // make, checked before connecting: a role that is not a superuser must
    // give the password in the connection string itself. libpq would
    // otherwise take one from the server OS user's password file (or
    // environment) and log in on that user's behalf; established() then
    // checks that the server did ask for it.
    if (!own_login && !glue(superuser) && !dsn_has_password(dsn.c_str()))
        fail(ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED,
             Explain{"Non-superusers must provide a password in the connection string.",
                     "Give the node's connection string a password, or run the operation as a superuser."},
             "password is required");
    const char *keys[6];
    const char *vals[6];
    int n = 0;
    keys[n] = "dbname";
    vals[n++] = dsn.c_str();
    if (replication) {
        keys[n] = "replication";
        vals[n++] = "database";
    }
    keys[n] = "application_name";
    vals[n++] = application_name.c_str();
    keys[n] = "fallback_application_name";
    vals[n++] = "sharding";
    if (!options.empty()) {
        keys[n] = "options";
        vals[n++] = options.c_str();
    }
    keys[n] = nullptr;
    vals[n] = nullptr;
    conn_ = PQconnectStartParams(keys, vals, 1);
    if (conn_ == nullptr) fail(ERRCODE_OUT_OF_MEMORY, "could not allocate a connection");
    try {
        register_conn(conn_);
    } catch (...) {
        conn_ = nullptr;  // register_conn closed it
        throw;
    }
}

void Remote::first_checks() {
    if (!replication_) {
        // Every session first pins its search_path and checks that the
        // schema "sharding" there is the extension's: the engine calls
        // sharding.<function> on the other end, and its session may log
        // in with more rights than whoever can create objects in that
        // database (a superuser's move, a DSN another role wrote; a
        // database owner can make a schema of that name, not install
        // the extension, which needs a superuser). Then the fencing
        // check (serve_token).
        PGresult *res = nullptr;
        run(kSessionGuard, &res);
        std::unique_ptr<PGresult, decltype(&PQclear)> guard(res, &PQclear);
        if (res == nullptr || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 || PQnfields(res) != 3)
            fail(ERRCODE_PROTOCOL_VIOLATION, "unexpected answer to the session's first check");
        if (std::strcmp(PQgetvalue(res, 0, 0), "t") == 0)
            fail(ERRCODE_INSUFFICIENT_PRIVILEGE,
                 Explain{"", "CREATE EXTENSION sharding there (a superuser), or give the node a DSN of a database "
                             "that has it."},
                 "schema \"sharding\" of database %s is not the sharding extension's: the move engine runs "
                 "nothing there",
                 PQgetvalue(res, 0, 1));
        if (!takeover_mode && std::strcmp(PQgetvalue(res, 0, 2), "t") == 0) {
            // The token is a uuid (or nothing): a literal of hex digits and dashes.
            const Text token = serve_token();
            if (token) run("SELECT sharding._serve(" + lit(token) + ")");
        }
    }
}

void Remote::connect_failed() {
    fail(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, "could not connect: %s",
         chomp(PQerrorMessage(conn_)).c_str());
}

void Remote::handshake(Remote *const *rs, int n) {
    // Every handshake goes on while the others wait for their server (the
    // backend's start there, its authentication): each connection polled
    // when its socket is ready. A failure is raised once every connection
    // before it in order is established, so that which error a caller sees
    // does not depend on timing, and never later than connecting one after
    // the other would. One connection (the constructor) is a list of one.
    // A connection with a connect_timeout fails when a host it tries has
    // not answered within it (timed_out).
    std::vector<PostgresPollingStatusType> st(n, PGRES_POLLING_WRITING);
    std::vector<pgsocket> socks(n);
    std::vector<int> events(n);
    std::vector<int> which(n);
    std::vector<long> limit(n);
    std::vector<instr_time> since(n);
    std::vector<std::string> host(n);
    std::vector<char> timed_out(n, 0);
    std::unique_ptr<bool[]> ready(new bool[n]);
    for (int i = 0; i < n; i++) {
        if (PQstatus(rs[i]->conn_) == CONNECTION_BAD) st[i] = PGRES_POLLING_FAILED;
        limit[i] = connect_timeout_ms(rs[i]->conn_);
        INSTR_TIME_SET_CURRENT(since[i]);
        host[i] = trying(rs[i]->conn_);
    }
    for (;;) {
        // The first connection in order not yet established: done when
        // there is none, or when it failed.
        int first = 0;
        while (first < n && st[first] == PGRES_POLLING_OK) first++;
        if (first == n) return;
        if (st[first] == PGRES_POLLING_FAILED) {
            if (timed_out[first])
                fail(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
                     "could not connect: connection to server at %s failed: timeout expired (connect_timeout)",
                     host[first].c_str());
            rs[first]->connect_failed();
        }
        int waiting = 0;
        long wait_ms = -1;
        bool failed_now = false;
        instr_time now;
        INSTR_TIME_SET_CURRENT(now);
        for (int i = 0; i < n; i++) {
            if (st[i] == PGRES_POLLING_OK || st[i] == PGRES_POLLING_FAILED) continue;
            const pgsocket sock = PQsocket(rs[i]->conn_);
            long left = -1;
            if (limit[i] >= 0) {
                instr_time spent = now;
                INSTR_TIME_SUBTRACT(spent, since[i]);
                left = limit[i] - static_cast<long>(INSTR_TIME_GET_MILLISEC(spent));
            }
            if ((st[i] != PGRES_POLLING_READING && st[i] != PGRES_POLLING_WRITING) || sock == PGINVALID_SOCKET ||
                (limit[i] >= 0 && left <= 0)) {
                // (PGRES_POLLING_ACTIVE is documented as unused.)
                timed_out[i] = limit[i] >= 0 && left <= 0;
                st[i] = PGRES_POLLING_FAILED;
                failed_now = true;
                continue;
            }
            if (left >= 0 && (wait_ms < 0 || left < wait_ms)) wait_ms = left;
            socks[waiting] = sock;
            events[waiting] = st[i] == PGRES_POLLING_WRITING ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE;
            which[waiting++] = i;
        }
        if (failed_now) continue;  // the check above decides first
        for (int j = 0; j < waiting; j++) ready[j] = false;
        glue(wait_sockets, waiting, socks.data(), static_cast<const int *>(events.data()), ready.get(), wait_ms);
        for (int j = 0; j < waiting; j++) {
            if (!ready[j]) continue;
            const int i = which[j];
            st[i] = PQconnectPoll(rs[i]->conn_);
            // Another host of the connection string tried: its own time.
            std::string h = trying(rs[i]->conn_);
            if (h != host[i]) {
                host[i] = std::move(h);
                INSTR_TIME_SET_CURRENT(since[i]);
            }
        }
    }
}

std::vector<std::unique_ptr<Remote>> Remote::open_all(const std::vector<std::string> &dsns,
                                                      const std::string &application_name) {
    std::vector<std::unique_ptr<Remote>> rs;
    std::vector<Remote *> raw;
    for (const std::string &dsn : dsns) {
        rs.push_back(std::unique_ptr<Remote>(new Remote(Deferred{}, dsn, false, application_name, std::string(), false)));
        raw.push_back(rs.back().get());
    }
    handshake(raw.data(), static_cast<int>(raw.size()));
    for (Remote *r : raw) {
        r->established();
        r->first_checks();
    }
    return rs;
}

void Remote::established() {
    if (PQsetnonblocking(conn_, 1) != 0)
        fail(ERRCODE_CONNECTION_FAILURE, "could not make the connection non-blocking");
    // The password rule, the second half: a role that is not a superuser may
    // only use a connection that authenticated with a password, never the
    // server's own identity (peer, trust).
    if (!own_login_ && !PQconnectionUsedPassword(conn_) && !glue(superuser))
        fail(ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED,
             Explain{"Non-superusers may connect only where the server asks for a password.",
                     "Give the node's connection string a password, or run the operation as a superuser."},
             "password is required");
}

Remote::~Remote() {
    if (copy_buf_ != nullptr) PQfreemem(copy_buf_);
    if (conn_ != nullptr) {
        cancel_conn(conn_);
        unregister_conn(conn_);
        PQfinish(conn_);
    }
}

PGconn *Remote::release() {
    PGconn *c = conn_;
    conn_ = nullptr;
    return c;
}

PGconn *Remote::detach() {
    unregister_conn(conn_);
    return release();
}

void Remote::cancel() noexcept { cancel_conn(conn_); }

void Remote::wait(bool for_write) {
    pgsocket sock = PQsocket(conn_);
    if (sock == PGINVALID_SOCKET) fail(ERRCODE_CONNECTION_FAILURE, "the connection has no socket");
    try {
        glue(wait_socket_timeout, for_write ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE, sock, -1L);
    } catch (...) {
        cancel();  // the caller is cancelled (or the server stops): so is the remote statement
        throw;
    }
}

PGresult *Remote::next_result() {
    try {
        return sharding::move::next_result(conn_);
    } catch (...) {
        cancel();
        throw;
    }
}

std::string Remote::run(const std::string &sql, PGresult **keep) {
    PGresult *last;
    try {
        last = run_statement(conn_, sql.c_str(), "remote: ", false);
    } catch (...) {
        cancel();  // the caller is cancelled (or the server stops): so is the remote statement
        throw;
    }
    std::string first;
    if (last != nullptr && PQresultStatus(last) == PGRES_TUPLES_OK && PQntuples(last) > 0 && PQnfields(last) > 0 &&
        !PQgetisnull(last, 0, 0))
        first = PQgetvalue(last, 0, 0);
    if (keep != nullptr)
        *keep = last;
    else if (last)
        PQclear(last);
    return first;
}

void Remote::start_copy(const std::string &sql, ExecStatusType started) {
    if (PQsendQuery(conn_, sql.c_str()) == 0)
        fail(ERRCODE_CONNECTION_FAILURE, "could not send a statement: %s", chomp(PQerrorMessage(conn_)).c_str());
    PGresult *res = next_result();
    if (res == nullptr || PQresultStatus(res) != started) throw_result(res, conn_);
    PQclear(res);
}

void Remote::start_copy_out(const std::string &sql) { start_copy(sql, PGRES_COPY_OUT); }

bool Remote::read_copy(const char **data, int *len) { return next_copy(data, len, true) == 1; }

int Remote::next_copy(const char **data, int *len, bool may_wait) {
    if (copy_buf_ != nullptr) {
        PQfreemem(copy_buf_);
        copy_buf_ = nullptr;
    }
    bool consumed = false;
    for (;;) {
        int n = PQgetCopyData(conn_, &copy_buf_, 1);
        if (n > 0) {
            *data = copy_buf_;
            *len = n;
            return 1;
        }
        if (n == 0) {
            if (!may_wait) {
                // What the socket has already, without waiting (once).
                if (consumed) return -1;
                consumed = true;
            } else {
                wait(false);
            }
            if (PQconsumeInput(conn_) == 0)
                fail(ERRCODE_CONNECTION_FAILURE, "lost the connection: %s", chomp(PQerrorMessage(conn_)).c_str());
            continue;
        }
        if (n == -2)
            fail(ERRCODE_CONNECTION_FAILURE, "the copy failed: %s", chomp(PQerrorMessage(conn_)).c_str());
        // -1: the end of the data; then the command's result.
        PGresult *failed = nullptr;
        for (PGresult *res; (res = next_result()) != nullptr;) {
            if (PQresultStatus(res) != PGRES_COMMAND_OK && failed == nullptr)
                failed = res;
            else
                PQclear(res);
        }
        if (failed != nullptr) throw_result(failed, conn_);
        return 0;
    }
}

void Remote::start_copy_in(const std::string &sql) { start_copy(sql, PGRES_COPY_IN); }

// What libpq has queued goes out, waiting (interruptibly) while the
// socket is full; what the server sent meanwhile is read, so neither side
// waits for the other.
void Remote::flush_out() {
    for (;;) {
        int r = PQflush(conn_);
        if (r == 0) return;
        if (r < 0) fail(ERRCODE_CONNECTION_FAILURE, "lost the connection: %s", chomp(PQerrorMessage(conn_)).c_str());
        wait(true);
        if (PQconsumeInput(conn_) == 0)
            fail(ERRCODE_CONNECTION_FAILURE, "lost the connection: %s", chomp(PQerrorMessage(conn_)).c_str());
    }
}

void Remote::put_copy(const char *data, int len) {
    for (;;) {
        int r = PQputCopyData(conn_, data, len);
        if (r == 1) break;
        if (r < 0) fail(ERRCODE_CONNECTION_FAILURE, "the copy failed: %s", chomp(PQerrorMessage(conn_)).c_str());
        flush_out();  // 0: libpq's buffer is full
    }
    flush_out();
}

int64 Remote::end_copy_in() {
    for (;;) {
        int r = PQputCopyEnd(conn_, nullptr);
        if (r == 1) break;
        if (r < 0) fail(ERRCODE_CONNECTION_FAILURE, "the copy failed: %s", chomp(PQerrorMessage(conn_)).c_str());
        flush_out();
    }
    flush_out();
    PGresult *failed = nullptr;
    int64 rows = 0;
    for (PGresult *res; (res = next_result()) != nullptr;) {
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
            if (failed == nullptr) {
                failed = res;
                continue;
            }
        } else {
            rows = std::strtoll(PQcmdTuples(res), nullptr, 10);
        }
        PQclear(res);
    }
    if (failed != nullptr) throw_result(failed, conn_);
    return rows;
}

}  // namespace sharding::move
