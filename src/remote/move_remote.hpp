// libpq connections of the move engine (docs/moves.md): connect, run, copy out,
// every wait interruptible (WaitLatchOrSocket + CHECK_FOR_INTERRUPTS) and a
// remote statement cancelled (PQcancel) when the caller is cancelled or
// fails.
//
// Ownership and the error boundary (src/pg/boundary.hpp): a connection is
// owned by a Remote object, whose destructor closes it. Every PostgreSQL
// call that may ereport(ERROR) while a Remote is alive goes through
// pg_call/glue, so the ERROR becomes a C++ exception and the destructor
// runs. As a second line of defence every open connection is also listed
// in a backend-wide registry, closed at the end of the transaction that
// opened it (commit or abort) and at process exit: no PGconn can outlive
// its transaction, whatever jumped.
#pragma once

#include "pg/boundary.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

extern "C" {
#include "libpq-fe.h"
}

namespace sharding::move {

// The DSN of a node from this database's sharding.nodes (55000 if none).
std::string node_dsn(const std::string &node);

// The DSN the engine connects with: a DSN that is a node's shown DSN
// (sharding.nodes.dsn, its password masked as ********) becomes the whole
// one kept in sharding.node_secrets, read as the extension's owner (the
// table is the owner's alone; docs/nodes.md "Passwords"); any other DSN as
// it is. Every Remote connects through it; a subscription's CONNECTION
// needs it too.
std::string real_dsn(const std::string &dsn);

// The owner's credentials (the whole DSNs of sharding.node_secrets, the
// password of sharding.coordinator_dsn) serve only SQL the engine wrote
// (SEC-4, docs/nodes.md "What a sharding_admin member can do on the
// nodes"). may_use_owner_credentials(): the caller is a superuser, has the
// rights of the extension's owner, or runs inside one of the engine's own
// entry points (attach_node, detach_node, take_over, through
// sharding__engine_call, which enters the engine's scope). caller_dsn(dsn): for an
// internal function given a connection string by its SQL caller, the DSN as
// given; a node's masked DSN, which would become the whole one, is refused
// (42501) to a caller who may not use the owner's credentials.
bool may_use_owner_credentials();
std::string caller_dsn(const std::string &dsn);
// The engine's scope, in plain C form for glue code that may longjmp:
// enter returns the depth to restore, on every path (PG_FINALLY).
int engine_scope_enter();
void engine_scope_leave(int saved);
// A connection string with every password libpq would read (password,
// sslpassword; a URI's userinfo and query parameters, percent-encoded keys
// too) shown as ******** (CONTRACT 15.2); the form kept (key = value pairs
// or a URI). Checked by parsing (PQconninfoParse): should a password of
// the original still show, the parsed options are written out as
// key = value pairs instead, passwords masked; what does not parse is
// kept up to where it stops parsing, the rest shown as ********.
std::string mask_password(const std::string &dsn);
// Fencing (take_over.cpp and move_remote.cpp, docs/nodes.md "Failover of
// the coordinator"): every connection but a replication one first calls
// sharding._serve(serve_token()) there, where it has it, so that a database following another coordinator refuses the session
// (55000) before it runs anything; set_takeover_mode() lifts that for the
// connections the rest of this transaction opens (take_over's own).
std::optional<std::string> serve_token();
void set_takeover_mode();

class Remote {
  public:
    // Connects (interruptibly). replication: a logical replication
    // connection (replication=database). application_name names this
    // session there (an undo ends it by that name).
    // options: libpq's "options" (server settings of the session), or "".
    // own_login: dsn names the calling role itself as its user and carries
    // no password of another role (propagated DDL of a role that is not an
    // administrator, src/ddl/two_phase.cpp): the session is the caller's
    // own, so the password rule (which keeps a plain role from
    // logging in as another one on the server's credentials) is not
    // applied; the node's own authentication decides.
    Remote(const std::string &dsn, bool replication, const std::string &application_name,
           const std::string &options = std::string(), bool own_login = false);
    // Sessions to each of dsns (not replication connections), established
    // at once: every one started (the password rule's first half checked
    // for each in turn, a failure there raised at once), their handshakes
    // polled together, then each one in turn checked as the constructor
    // checks one (the password rule's second half, the session's first
    // checks). The failure raised is the first in dsns' order: one found
    // before the handshakes, else the first connection's that failed
    // (while an earlier one is still connecting, its outcome is awaited);
    // none of them is then open.
    static std::vector<std::unique_ptr<Remote>> open_all(const std::vector<std::string> &dsns,
                                                         const std::string &application_name);
    ~Remote();
    Remote(const Remote &) = delete;
    Remote &operator=(const Remote &) = delete;

    // Runs one statement; throws the remote error (its SQLSTATE) as
    // sharding::Error. Returns the first value of the first row ("" if none)
    // and, in *tuples, the result's rows when given.
    std::string run(const std::string &sql, PGresult **keep = nullptr);
    // Starts a COPY ... TO STDOUT; then read_copy() until it returns false.
    void start_copy_out(const std::string &sql);
    // The next chunk of COPY data (owned by the connection until the next
    // call); false at the end of the data (the COMMAND result checked).
    bool read_copy(const char **data, int *len);
    // The same, and with may_wait false: -1 at once when no whole chunk has
    // arrived yet (the socket read without waiting); 1 a chunk, 0 the end.
    int next_copy(const char **data, int *len, bool may_wait);
    // Starts a COPY ... FROM STDIN; then put_copy() for each chunk and
    // end_copy_in(), which returns the command's row count.
    void start_copy_in(const std::string &sql);
    void put_copy(const char *data, int len);
    int64 end_copy_in();
    // Sends a cancel request for what runs there (best effort, no throw).
    void cancel() noexcept;
    PGconn *conn() const { return conn_; }
    // Leaves the connection open past the end of this object (the
    // registry closes it at the end of the transaction).
    PGconn *release();
    // Takes the connection out of the transaction's registry and leaves it
    // to the caller, who closes it (the session's named connections,
    // remote_exec.cpp).
    PGconn *detach();

  private:
    // Only starts connecting (the password rule's first half checked):
    // handshake() ends it (the public constructor, open_all).
    struct Deferred {};
    Remote(Deferred, const std::string &dsn, bool replication, const std::string &application_name,
           const std::string &options, bool own_login);
    // Polls the handshakes of rs[0..n) together until every one is
    // established; else raises the first failure in order (see open_all).
    static void handshake(Remote *const *rs, int n);
    // After the handshake: non-blocking, and the password rule's second half.
    void established();
    [[noreturn]] void connect_failed();
    // The session's first statements (not on a replication connection).
    void first_checks();
    void wait(bool for_write);
    void flush_out();
    // Sends a COPY statement and waits until its copy begins (`started`:
    // PGRES_COPY_OUT or PGRES_COPY_IN); else throws its error.
    void start_copy(const std::string &sql, ExecStatusType started);
    bool own_login_ = false;
    bool replication_ = false;
    PGresult *next_result();
    PGconn *conn_ = nullptr;
    char *copy_buf_ = nullptr;
};

// A replication connection kept open past the call that opened it (its
// exported snapshot stays importable), by slot name, until close_held or
// the end of the transaction.
// The one statement loop of every remote call (Remote::run, the named
// connections, follow's _remote): sends sql, collects its results waiting
// interruptibly, returns the last one (the caller clears it; NULL if none).
// A remote error is thrown with its SQLSTATE, message (after prefix),
// detail and hint; a COPY is a protocol violation. If waiting fails (the
// caller is cancelled, the connection lost) and drain is set, the remote
// statement is cancelled (PQcancel) and its results consumed, so the
// connection is ready for the next statement.
PGresult *run_statement(PGconn *conn, const char *sql, const char *prefix, bool drain);
// Its second half, for a statement already sent (PQsendQuery): several
// connections can run one each at once, collected in turn.
PGresult *collect_statement(PGconn *conn, const char *prefix, bool drain);
// The next result of the running command, waiting interruptibly.
PGresult *next_result(PGconn *conn);
// While a WaitTick lives, every wait for a remote answer (next_result)
// wakes at least every `ms` milliseconds and calls `tick` there, never
// nested (the statements the tick runs wait plainly); what the tick throws
// ends the wait as a failed statement would. The orchestration keeps
// move_progress current this way while it waits for the destination's copy.
class WaitTick {
  public:
    WaitTick(std::function<void()> tick, long ms);
    ~WaitTick();
    WaitTick(const WaitTick &) = delete;
    WaitTick &operator=(const WaitTick &) = delete;

  private:
    std::function<void()> tick_;
    const std::function<void()> *prev_tick_;
    long prev_ms_;
};
// Cancels what runs there and consumes its results (no throw).
void cancel_and_drain(PGconn *conn) noexcept;

// The session's named connections (remote_exec.cpp; SQL: _dbl_connect,
// _dbl_open, _dbl_disconnect, _dbl_run/_dbl_value): kept across
// transactions, every wait interruptible, a statement running there
// cancelled when the caller is. named_connect: dsn nullptr is 55000;
// named_run: whether the answer is not NULL, in *out a query's first value
// or a command's tag; a remote error thrown with its SQLSTATE, message,
// detail and hint.
void named_connect(const char *name, const char *dsn);
// Two at once (their handshakes together, Remote::open_all): on a
// failure, neither is open.
void named_connect_both(const char *name, const char *dsn, const char *name2, const char *dsn2);
bool named_open(const char *name);
// Whether connection `name` is open, was opened by the engine's C++
// (named_connect, not _dbl_connect) with this dsn (any, if nullptr) and as
// the role this backend acts as now, was never named by an SQL caller to
// an internal that takes a connection's name (check_named_for_caller:
// _dbl_run, _dbl_value, _move_call, _move_delete_rows, ...) nor used by
// 1.3's _move_journal (named_taint), and, with idle, is in no transaction:
// a caller that would open it again may keep it (a connection costs a new
// backend there, tens of milliseconds).
bool named_keep(const char *name, const char *dsn, bool idle);
void named_taint(const char *name) noexcept;
void named_disconnect(const char *name) noexcept;
bool named_run(const char *name, const char *sql, std::string *out);
// The libpq connection behind a name (as named_run finds it), for a caller
// that runs statements on several connections at once (move_delete.cpp).
PGconn *named_connection(const char *name);
// For an internal function given a connection name by its SQL caller
// (_dbl_run, _dbl_value, _move_delete_rows, _move_call, _move_sees_switch,
// _move_stop_backends): one of the engine's own named connections (logged
// in with the owner's credentials) is refused (42501) to a caller who may
// not use them (SEC-4); any other name goes on as before.
void check_named_for_caller(const char *name);

void hold_connection(const std::string &slot, PGconn *conn);
bool close_held(const std::string &slot) noexcept;
// Cancels what runs there, unregisters and closes a connection.
void close_connection(PGconn *conn) noexcept;

// The registry's backstop (see the header comment): closes every
// connection this transaction opened. Installed on first use.
void close_all_connections() noexcept;

}  // namespace sharding::move
