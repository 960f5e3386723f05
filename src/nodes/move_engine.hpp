// What the C++ orchestration of online moves and rebalance jobs shares
// (docs/moves.md, docs/rebalance.md): SPI with parameters, quoting for
// remote SQL, subtransactions in place of PL/pgSQL's EXCEPTION blocks, the
// session's named connections of the move (sharding_move_src, _dst, _self)
// and the journal written over _self.
//
// move_orchestrate.cpp: the move itself (_move_online and its steps);
// move_journal.cpp: the journal interface (_move_enqueue, _move_execute,
// _move_resolve, _move_cancel, _move_recover, _move_raise) and the public
// move_shard_online and isolate; jobs_run.cpp: what rebalance jobs decide
// (claims, capacity, starts, cancels); jobs.cpp: the background workers.
//
// Boundary (src/pg/boundary.hpp): every PostgreSQL call that may ereport
// while a C++ object is alive goes through glue/pg_call; the SPI glue is
// C-style code with plain C parameters. An error is swallowed only inside
// subxact(), whose rollback undoes what the failed statement left (SPI,
// locks, memory), as a PL/pgSQL EXCEPTION block does.
#pragma once

#include "nodes/move_remote.hpp"

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
}

namespace sharding::move {

using Text = std::optional<std::string>;
using Row = std::vector<Text>;

// ------------------------------------------------------------------ SPI

// Runs sql with text parameters (nullptr: SQL NULL; cast them in the SQL)
// through SPI, read-write (a fresh snapshot per statement, as PL/pgSQL runs
// a volatile function's statements); every cell as text.
std::vector<Row> spi_rows(const char *sql, std::initializer_list<const char *> args);
// The first value of the first row (nullopt: NULL or no row).
Text spi_value(const char *sql, std::initializer_list<const char *> args);
// The same through a plan prepared at its first use and kept for the
// backend (for statements of calls that run often, as PL/pgSQL keeps its
// plans); one static KeptPlan per statement.
struct KeptPlan {
    void *plan = nullptr;  // SPIPlanPtr
};
std::vector<Row> spi_kept_rows(KeptPlan *plan, const char *sql, std::initializer_list<const char *> args);
Text spi_kept_value(KeptPlan *plan, const char *sql, std::initializer_list<const char *> args);
inline const char *c(const Text &t) { return t ? t->c_str() : nullptr; }
// A parameter of spi_rows_typed: text from a C string (nullptr: NULL), or
// a Datum of its own type, valid for the call (a float8 keeps every
// digit, whatever extra_float_digits makes of its text form).
struct Arg {
    Arg(const char *text) : type(TEXTOID), text(text), value(0), isnull(text == nullptr) {}
    Arg(Oid type, Datum value, bool isnull) : type(type), text(nullptr), value(value), isnull(isnull) {}
    Oid type;
    const char *text;
    Datum value;
    bool isnull;
};
// spi_rows with typed parameters.
std::vector<Row> spi_rows_typed(const char *sql, const std::vector<Arg> &args);
// A value that the SQL never returns NULL for (count(*), a NOT NULL column).
inline std::string must(const Text &t) { return t.value_or(std::string()); }

// ------------------------------------------------------------------ quoting

// As pg_catalog.format's %I and %L (NULL unquoted).
std::string ident(const std::string &s);
std::string lit(const Text &s);
// What PL/pgSQL's RAISE prints for a value: NULL as <NULL>.
inline std::string shown(const Text &t) { return t.value_or("<NULL>"); }
// quote_literal(v), or NULL for NULL (the messages of the node checks).
inline std::string literal_or_null(const Text &t) { return t ? lit(t) : std::string("NULL"); }

// ------------------------------------------------------------------ arguments

// Argument i as text (nullopt: NULL).
Text text_arg(FunctionCallInfo fcinfo, int i);
// Argument i of type `type` as its output function writes it (an array's
// {...}, an interval); cast it back in SQL.
Text arg_out(FunctionCallInfo fcinfo, int i, Oid type);
// An integer or bigint argument as text (nullopt: NULL).
Text int_arg(FunctionCallInfo fcinfo, int i);
Text bigint_arg(FunctionCallInfo fcinfo, int i);
// 22023 for a node name that is NULL or empty.
void require_node(const Text &node);
// A text result.
Datum text_datum(const std::string &s);

// ------------------------------------------------------------------ errors

// An error caught by a block, as GET STACKED DIAGNOSTICS reads it.
struct Caught {
    int code = ERRCODE_INTERNAL_ERROR;
    std::string message, detail, hint, context;
};

// Inside a catch block: what is being handled.
void catch_current(Caught *out);
// What PL/pgSQL's WHEN OTHERS does not catch.
inline bool not_others(int code) { return code == ERRCODE_QUERY_CANCELED || code == ERRCODE_ASSERT_FAILURE; }
// Raises it again: SQLSTATE, message, detail and hint.
[[noreturn]] void reraise(const Caught &e);

// Runs body in a subtransaction (a PL/pgSQL block with an EXCEPTION
// clause): released if it returns, rolled back if it throws, the error in
// *caught. The caller's memory context and resource owner are restored.
template <typename F>
bool subxact(F &&body, Caught *caught) {
    MemoryContext cxt = CurrentMemoryContext;
    ResourceOwner owner = CurrentResourceOwner;
    glue(BeginInternalSubTransaction, (const char *)nullptr);
    MemoryContextSwitchTo(cxt);
    bool ok = true;
    try {
        body();
    } catch (...) {
        ok = false;
        catch_current(caught);
    }
    if (ok)
        glue(ReleaseCurrentSubTransaction);
    else
        glue(RollbackAndReleaseCurrentSubTransaction);
    MemoryContextSwitchTo(cxt);
    CurrentResourceOwner = owner;
    return ok;
}

// A WARNING (does not jump).
void warn(const std::string &message, const std::string &hint = std::string());

// ------------------------------------------------------------------ time

// An interruptible sleep, as pg_sleep.
void sleep_ms(long ms);
// Seconds since an earlier clock_seconds().
double clock_seconds();
// A float8 as float8out writes it (RAISE's %, format's %s).
std::string float_text(double v);
// md5(s) as 32 hex digits.
std::string md5_hex(const std::string &s);

// ------------------------------------------------------------------ locks

// pg_try_advisory_lock / pg_advisory_unlock (session level, two int4 keys).
bool try_session_lock(int32 k1, int32 k2);
void session_unlock(int32 k1, int32 k2);

// ------------------------------------------------------------------ maps (owner_switch.cpp)

// _require_map: the map's logical shard count (22023 for NULL, 42704 for
// a map that does not exist); for_update locks its row.
Text require_map(const Text &map, bool for_update);
// _check_logical: 22023 unless 0 <= logical < shards.
void check_logical(const Text &map, const Text &logical, const Text &shards);
// _check_database_nodes: nodes is a text[]'s text form.
void check_database_nodes(const Text &map, const Text &nodes);
// _switch_owner: the shard's epoch afterwards.
Text switch_owner(const Text &map, const Text &logical, const Text &node);
// _coordinator_dsn.
std::string coordinator_dsn();
// _job_key_shard (jobs_run.cpp): the logical shard of a key given as text,
// hashed as the type of the map's key columns, as writers route it.
Text key_shard(const Text &map, const Text &key);
// _move_enqueue of a job's move (jobs_run.cpp): 42501 unless the current
// role has the privileges of the role the job runs as (no role adds a move
// that runs with rights it does not have: CONTRACT 15.2).
void require_job_role(const Text &job);

// ------------------------------------------------------------------ remote

extern const char *const kSrc;   // sharding_move_src: the move's source
extern const char *const kDst;   // sharding_move_dst: its destination
extern const char *const kSelf;  // sharding_move_self: this database (the journal)
extern const char *const kLive;  // a journal row's phase is not final

// A statement over a named connection: a query's first value, a command's
// tag (nullopt: NULL).
Text dbl(const char *conn, const std::string &sql);
// A statement on the journal over sharding_move_self
// (committed at once, whatever this transaction does); its first value.
Text journal(const std::string &sql);

// ------------------------------------------------------------------ the move

// _move_name: the publication, slot, subscription and origin of a move.
std::string move_name(const std::string &map, int32 logical);

// A distributed table of a map, as _move_tables returns it.
struct MoveTable {
    std::string rel;             // schema-qualified, quoted
    std::string key_column;
    Oid key_type = InvalidOid;   // a domain's base type; InvalidOid: no such column
    std::string cols, coldefs, vals, pk_match;
    std::vector<std::string> attnames;  // the copied columns (not generated), in order
};
std::vector<MoveTable> move_tables(const std::string &map);
// _move_filter_sql: the condition selecting what a move carries.
// pins: a text[]'s text form, npins its elements.
std::string filter_sql(const Text &key_column, Oid key_type, const Text &shards, const Text &logical, const Text &key,
                       const Text &pins, int npins);

// _move_connect / _move_disconnect: sharding_move_src, _dst and _self.
void check_dsns(const Text &destination, const Text &source);
void connect(const Text &source, const Text &destination);
void disconnect();
// _move_refuse_written: 25001 in a transaction that has written.
void refuse_written();
// _move_wait_flush: until the move's slot has confirmed the source's
// flushed WAL position (55000 after `seconds`); the seconds waited. The
// lag is noted on the journal rows `journal_where` selects (a WHERE
// clause naming the move's row, read through its index).
double wait_flush(const std::string &name, double seconds, const std::string &journal_where);

struct MoveResult {
    Text new_epoch;
    int64 moved = 0;
};
// _move_online: the move itself; _move_finish and _move_undo.
MoveResult move_online(const Text &map, int32 logical, const Text &key, const std::string &node);
// before_delete, when given, runs once the replication is dropped and
// before the source's rows are deleted (the verification).
int64 finish(const std::string &map, int32 logical, const Text &key, const std::string &destination,
             const Text &new_epoch, const std::function<void()> &before_delete = nullptr);
bool undo(const std::string &map, int32 logical, const Text &key);  // false: finished instead
// How many moves are in flight (a live executor, copying to cleanup) into
// or out of a node of the live move of (map, logical), itself included
// (at least 1), as this coordinator's journal says, read over
// sharding_move_self (1 when that connection is not open or cannot
// answer). Parallel moves share sharding.move_parallel's sessions between
// them, so that moves at once do not run more copy and delete sessions at
// a node than one move would (docs/performance.md: two moves of 2
// sessions each on 2 cores waited on each other's relation extension
// locks and CPUs).
int moves_sharing(const std::string &map, int32 logical);
// The rows of a move's shard deleted at one end over the named connection
// conn (kSrc after the switch, kDst when undone), by the plan its journal
// row fixed (move_delete.cpp); how many.
int64 delete_shard_rows(const char *conn, const std::string &map, int32 logical, const Text &key);
// The move's slot at node `source`, made over a replication connection
// that exports its snapshot and is held until close_held(slot)
// (move_copy.cpp).
struct SlotMade {
    std::string lsn, snapshot;
};
SlotMade create_slot(const std::string &source, const std::string &slot, const std::string &plugin,
                     const std::string &options);
void call_fn(const char *conn, const std::string &fn, const std::string &map, int32 logical);

// The journal interface (move_journal.cpp).
int64 enqueue(const Text &job, const Text &map, const Text &logical, const Text &key, const Text &destination);
std::string execute(int64 id);
std::string resolve(int64 id, const std::string &final_phase);
bool cancel(int64 id);
int32 recover();
// The executor's session-level advisory lock of a move,
// (executor_lock_class(), executor_lock_obj(move)) =
// (hashtext('sharding.move_journal'), move % (2^31 - 1)): held by whoever
// carries the move out, resolves it (recovery, a cancel) or has claimed it
// for a rebalance job; a move whose lock is free and whose phase is not
// final was interrupted.
int32 executor_lock_class();
inline int32 executor_lock_obj(int64 id) { return (int32)(id % 2147483647); }

}  // namespace sharding::move

namespace sharding {
// jobs.cpp: the launcher scans this database again soon (1 s), then again
// after 2, 4, 8, then every 10 s for as long as a scan leaves moves it
// could not resolve (no-op unless the library is preloaded).
void jobs_recheck(Oid db) noexcept;
// The same; soon: every second without back-off (in-doubt two-phase
// transactions, src/ddl).
void jobs_recheck(Oid db, bool soon) noexcept;
// jobs.cpp: how many move workers of job (in this database) failed to
// start in a row (ended before running anything: a FATAL at connect); the
// launcher's scan fails a job past jobs_max_failed_starts instead of
// starting workers for it for ever.
int jobs_failed_starts(int64 job) noexcept;
constexpr int jobs_max_failed_starts = 5;
}  // namespace sharding
