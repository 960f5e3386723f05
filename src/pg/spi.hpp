// SPI with parameters, quoting, arguments, errors and subtransactions for
// C++ that runs SQL (the move engine, rebalance jobs, the node steps, the
// owner switch, two-phase DDL): the glue every topic of the engine shares,
// every cell as text (Text: nullopt for SQL NULL).
//
// Boundary (src/pg/boundary.hpp): every PostgreSQL call that may ereport
// while a C++ object is alive goes through glue/pg_call; the SPI glue is
// C-style code with plain C parameters. An error is swallowed only inside
// subxact(), whose rollback undoes what the failed statement left (SPI,
// locks, memory), as a PL/pgSQL EXCEPTION block does.
#pragma once

#include "pg/boundary.hpp"

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

namespace sharding {

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

}  // namespace sharding
