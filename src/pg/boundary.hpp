// The C/C++ boundary: the one place where C++ exceptions and PostgreSQL's
// longjmp-based errors meet.
//
// The rules, for every file of this extension:
//
// 1. Every SQL-callable function is defined with SHARDING_FUNCTION(name). Its
//    body may throw anything; guarded() catches it and raises the ERROR only
//    after every C++ frame of the call has been unwound. No C++ exception
//    ever reaches PostgreSQL.
//
// 2. ereport(ERROR) is a longjmp: it skips C++ destructors. A PostgreSQL
//    function that may raise an ERROR (SPI, syscache, palloc, detoasting,
//    output functions, ...) may therefore be called directly only while no
//    C++ object that owns something (std::string, std::vector, a lock guard)
//    is alive anywhere between the call and the guarded() frame. Otherwise
//    call it through glue(fn, args...) (a named C-style glue function whose
//    parameters are plain C values; rank.cpp) or pg_call([&] { ... }): the
//    ERROR is caught with PG_TRY, copied, and thrown as PgError, so
//    destructors run; guarded() re-raises the original error (SQLSTATE,
//    message, detail) unchanged. The lambda itself must not own C++ objects,
//    and nothing throws inside PG_TRY.
//
// 3. C++ code reports user errors by throwing sharding::Error with a
//    SQLSTATE (sharding::fail), reported with the thrower's file and line;
//    it never calls ereport(ERROR) itself. The pure core (no PostgreSQL
//    header) throws std::invalid_argument for bad input: 22023. elog/ereport below ERROR
//    (NOTICE, WARNING) do not jump and are fine anywhere.
#pragma once

#include "pg/pg.hpp"

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

extern "C" {
#include "utils/elog.h"
}

namespace sharding {

// A SQLSTATE (MAKE_SQLSTATE value) and where the code that raises it is:
// converted implicitly from the SQLSTATE at the call site of fail() or
// Error(), whose file, line and function the ERROR then reports (psql's
// LOCATION), not boundary.cpp's.
struct Raised {
    Raised(int sqlstate_, const char *file_ = __builtin_FILE(), int line_ = __builtin_LINE(),
           const char *func_ = __builtin_FUNCTION())
        : sqlstate(sqlstate_), file(file_), line(line_), func(func_) {}
    int sqlstate;
    const char *file;
    int line;
    const char *func;
};

// A user-facing error: SQLSTATE, message, detail, hint (complete sentences).
class Error : public std::exception {
  public:
    Error(Raised sqlstate, std::string message, std::string detail = std::string(),
          std::string hint = std::string())
        : raised_(sqlstate), message_(std::move(message)), detail_(std::move(detail)),
          hint_(std::move(hint)) {}
    const char *what() const noexcept override { return message_.c_str(); }
    int sqlstate() const { return raised_.sqlstate; }
    const Raised &raised() const { return raised_; }
    const std::string &detail() const { return detail_; }
    const std::string &hint() const { return hint_; }
    // The column the error is about, reported as PostgreSQL's schema, table
    // and column name fields (as errtablecol does): throw
    // Error(...).on_column(schema, table, column).
    Error &&on_column(std::string schema, std::string table, std::string column) && {
        schema_ = std::move(schema);
        table_ = std::move(table);
        column_ = std::move(column);
        return std::move(*this);
    }
    const std::string &schema() const { return schema_; }
    const std::string &table() const { return table_; }
    const std::string &column() const { return column_; }

  private:
    Raised raised_;
    std::string message_, detail_, hint_;
    std::string schema_, table_, column_;
};

// A PostgreSQL ERROR caught by pg_call, carried across C++ frames.
class PgError : public std::exception {
  public:
    explicit PgError(ErrorData *data) : data_(data) {}
    const char *what() const noexcept override { return data_->message ? data_->message : "error"; }
    ErrorData *data() const { return data_; }

  private:
    ErrorData *data_;  // palloc'd copy; PostgreSQL frees it with the context
};

// printf-style formatting into a std::string (for Error messages).
std::string format(const char *fmt, ...) pg_attribute_printf(1, 2);

// Throw an Error: fail(ERRCODE_INVALID_PARAMETER_VALUE, "bad %d", x).
[[noreturn]] void fail(Raised sqlstate, const char *fmt, ...) pg_attribute_printf(2, 3);

// The same with a detail and a hint (complete sentences; either may be
// empty): fail(ERRCODE_..., Explain{"The shard moved.", "Retry."}, "...", ...).
struct Explain {
    std::string detail;
    std::string hint;
};
[[noreturn]] void fail(Raised sqlstate, Explain explain, const char *fmt, ...) pg_attribute_printf(3, 4);

namespace detail {
// Records the exception being handled (called inside a catch block only).
void capture_current_exception() noexcept;
// Raises the recorded exception as a PostgreSQL ERROR. Called after the catch
// block has ended, so no C++ object of the failed call is alive any more.
[[noreturn]] void raise_captured();
void rethrow_as_pg_error(MemoryContext cxt);
// A call left PG_exception_stack or error_context_stack other than it found
// them (a PG_TRY left by an exception): restores them and raises an ERROR.
[[noreturn]] void raise_drift(sigjmp_buf *stack, ErrorContextCallback *context);
// The cache module's retirement (cache.hpp): calls of this extension now
// running in this backend, and whether retired objects wait for depth 0.
extern int call_depth;
extern bool retired_pending;
void free_retired() noexcept;
}  // namespace detail

// The wrapper around every SQL-callable function (see rule 1). It also
// counts the calls running (the cache frees what rebuilds replaced when the
// outermost call returns) and checks that the call left PostgreSQL's error
// stack as it found it.
template <Datum (*Impl)(FunctionCallInfo)>
inline Datum guarded(FunctionCallInfo fcinfo) {
    sigjmp_buf *const stack = PG_exception_stack;
    ErrorContextCallback *const context = error_context_stack;
    ++detail::call_depth;
    try {
        Datum result = Impl(fcinfo);
        --detail::call_depth;
        if (unlikely(PG_exception_stack != stack || error_context_stack != context))
            detail::raise_drift(stack, context);
        if (detail::call_depth == 0 && unlikely(detail::retired_pending)) detail::free_retired();
        return result;
    } catch (...) {
        detail::capture_current_exception();
    }
    --detail::call_depth;
    if (unlikely(PG_exception_stack != stack || error_context_stack != context))
        detail::raise_drift(stack, context);
    detail::raise_captured();
}

// Runs f, which may ereport(ERROR), turning such an ERROR into PgError (rule 2).
template <typename F>
auto pg_call(F &&f) -> decltype(f()) {
    using R = decltype(f());
    MemoryContext cxt = CurrentMemoryContext;
    volatile bool failed = false;
    if constexpr (std::is_void_v<R>) {
        PG_TRY();
        { f(); }
        PG_CATCH();
        { failed = true; }
        PG_END_TRY();
        if (failed) detail::rethrow_as_pg_error(cxt);
    } else {
        static_assert(std::is_trivially_copyable_v<R>, "pg_call returns plain values only");
        R result{};
        R *volatile out = &result;
        PG_TRY();
        { *out = f(); }
        PG_CATCH();
        { failed = true; }
        PG_END_TRY();
        if (failed) detail::rethrow_as_pg_error(cxt);
        return result;
    }
}

// Calls the glue function fn(args...) through pg_call: the structural form
// of rule 2. A glue function is C-style code (it may ereport) whose
// parameters and result are plain C values (OIDs, Datums, pointers, POD
// structs), so no C++ object is created or destroyed inside PG_TRY. Write
//   AttrNumber a = glue(get_attnum, relid, colname);
// instead of a lambda; fn may be a PostgreSQL function or a named glue
// function of the topic.
template <typename R, typename... P, typename... A>
R glue(R (*fn)(P...), A... args) {
    static_assert((std::is_trivially_copyable_v<std::decay_t<P>> && ...),
                  "glue functions take plain C values only");
    return pg_call([&]() -> R { return fn(args...); });
}

}  // namespace sharding

// Symbols sharding.so exports: the build hides everything else
// (-fvisibility=hidden); PostgreSQL 15's PGDLLEXPORT is empty outside Windows.
#define SHARDING_EXPORT __attribute__((visibility("default")))

// Defines SQL-callable function `name` (C linkage, V1 calling convention,
// exported) whose body runs inside guarded(). Use like a function header;
// the name is the C symbol, sharding_<sqlname> (the SQL says
// AS 'MODULE_PATHNAME', 'sharding_hash64_text'):
//   SHARDING_FUNCTION(sharding_hash64_text) { ... return ...; }
#define SHARDING_FUNCTION(name)                                                                  \
    static Datum name##_impl(FunctionCallInfo fcinfo);                                           \
    extern "C" {                                                                                 \
    SHARDING_EXPORT Datum name(PG_FUNCTION_ARGS);                                                \
    SHARDING_EXPORT const Pg_finfo_record *pg_finfo_##name(void);                                \
    PG_FUNCTION_INFO_V1(name);                                                                   \
    Datum name(PG_FUNCTION_ARGS) { return ::sharding::guarded<name##_impl>(fcinfo); }            \
    }                                                                                            \
    static Datum name##_impl(FunctionCallInfo fcinfo)

// An old symbol name that a released (frozen) install or upgrade script
// links to, kept exported so that databases not yet updated keep working; it
// calls `current`. The list is generated from those scripts by the Makefile
// (src/pg/legacy_symbols.inc, included by src/pg/legacy.cpp).
#define SHARDING_LEGACY_SYMBOL(old, current)                                                     \
    extern "C" {                                                                                 \
    Datum current(PG_FUNCTION_ARGS);                                                             \
    SHARDING_EXPORT Datum old(PG_FUNCTION_ARGS);                                                 \
    SHARDING_EXPORT const Pg_finfo_record *pg_finfo_##old(void);                                 \
    PG_FUNCTION_INFO_V1(old);                                                                    \
    Datum old(PG_FUNCTION_ARGS) { return current(fcinfo); }                                      \
    }
