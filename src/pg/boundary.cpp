// The C/C++ boundary: see boundary.hpp for the rules.
#include "pg/boundary.hpp"

extern "C" {
#include "mb/pg_wchar.h"
}

#include <cstdarg>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

namespace sharding {

namespace {
std::string vformat(const char *fmt, va_list ap) pg_attribute_printf(1, 0);
std::string vformat(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap2);
    va_end(ap2);
    std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
    if (n > 0) std::vsnprintf(&out[0], out.size() + 1, fmt, ap);
    return out;
}
}  // namespace

std::string format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string out = vformat(fmt, ap);
    va_end(ap);
    return out;
}

void fail(Raised sqlstate, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string out = vformat(fmt, ap);
    va_end(ap);
    throw Error(sqlstate, std::move(out));
}

void fail(Raised sqlstate, Explain explain, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string out = vformat(fmt, ap);
    va_end(ap);
    throw Error(sqlstate, std::move(out), std::move(explain.detail), std::move(explain.hint));
}

namespace detail {

// What the failed call left behind. Plain storage, no destructor: it must
// survive the end of the catch block and the longjmp of ereport.
namespace {
struct Captured {
    int sqlstate;
    const char *file;  // where it was raised: string literals, static
    int line;
    const char *func;
    ErrorData *pg;  // set when a PostgreSQL ERROR is being carried
    char message[1024];
    char detail[1024];
    char hint[512];
    char schema[NAMEDATALEN], table[NAMEDATALEN], column[NAMEDATALEN];
};
Captured captured;

// Copies src into dst[size], cut (if it must be) at a character boundary
// of the server encoding, never in the middle of a multibyte character.
void copy_text(char *dst, size_t size, const char *src) {
    if (src == nullptr) src = "";
    size_t len = std::strlen(src);
    if (len >= size) len = static_cast<size_t>(pg_mbcliplen(src, static_cast<int>(std::min(len, size_t{1} << 30)),
                                                            static_cast<int>(size - 1)));
    std::memcpy(dst, src, len);
    dst[len] = '\0';
}
}  // namespace

void capture_current_exception() noexcept {
    captured.pg = nullptr;
    captured.detail[0] = captured.hint[0] = '\0';
    captured.schema[0] = captured.table[0] = captured.column[0] = '\0';
    captured.file = __FILE__;
    captured.line = __LINE__;
    captured.func = __func__;
    try {
        throw;
    } catch (const PgError &e) {
        captured.pg = e.data();
    } catch (const Error &e) {
        captured.sqlstate = e.sqlstate();
        captured.file = e.raised().file;
        captured.line = e.raised().line;
        captured.func = e.raised().func;
        copy_text(captured.message, sizeof captured.message, e.what());
        copy_text(captured.detail, sizeof captured.detail, e.detail().c_str());
        copy_text(captured.hint, sizeof captured.hint, e.hint().c_str());
        copy_text(captured.schema, sizeof captured.schema, e.schema().c_str());
        copy_text(captured.table, sizeof captured.table, e.table().c_str());
        copy_text(captured.column, sizeof captured.column, e.column().c_str());
    } catch (const std::invalid_argument &e) {
        // The pure core's way of refusing bad input (rank_core.hpp, ...).
        captured.sqlstate = ERRCODE_INVALID_PARAMETER_VALUE;
        copy_text(captured.message, sizeof captured.message, e.what());
    } catch (const std::bad_alloc &) {
        captured.sqlstate = ERRCODE_OUT_OF_MEMORY;
        copy_text(captured.message, sizeof captured.message, "out of memory in sharding");
    } catch (const std::exception &e) {
        captured.sqlstate = ERRCODE_INTERNAL_ERROR;
        copy_text(captured.message, sizeof captured.message, "unexpected C++ exception in sharding");
        copy_text(captured.detail, sizeof captured.detail, e.what());
    } catch (...) {
        captured.sqlstate = ERRCODE_INTERNAL_ERROR;
        copy_text(captured.message, sizeof captured.message, "unexpected C++ exception in sharding");
    }
}

void raise_captured() {
    if (captured.pg != nullptr) {
        ErrorData *edata = captured.pg;
        captured.pg = nullptr;
        ReThrowError(edata);
    }
    // ereport, with the location of the code that raised it.
    if (errstart(ERROR, TEXTDOMAIN)) {
        errcode(captured.sqlstate);
        errmsg("%s", captured.message);
        if (captured.detail[0]) errdetail("%s", captured.detail);
        if (captured.hint[0]) errhint("%s", captured.hint);
        if (captured.schema[0]) err_generic_string(PG_DIAG_SCHEMA_NAME, captured.schema);
        if (captured.table[0]) err_generic_string(PG_DIAG_TABLE_NAME, captured.table);
        if (captured.column[0]) err_generic_string(PG_DIAG_COLUMN_NAME, captured.column);
        errfinish(captured.file, captured.line, captured.func);
    }
    pg_unreachable();
}

void raise_drift(sigjmp_buf *stack, ErrorContextCallback *context) {
    PG_exception_stack = stack;
    error_context_stack = context;
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("sharding left PostgreSQL's error stack changed"),
                    errdetail("A call returned with PG_exception_stack or error_context_stack not restored."),
                    errhint("This is a bug in the sharding extension; please report it.")));
    pg_unreachable();
}

void rethrow_as_pg_error(MemoryContext cxt) {
    MemoryContextSwitchTo(cxt);
    ErrorData *edata = CopyErrorData();
    FlushErrorState();
    throw PgError(edata);
}

}  // namespace detail
}  // namespace sharding

/*
 * sharding._boundary_selftest(kind text) RETURNS bigint
 *
 * Exercises the boundary for the regression test: throws each kind of C++
 * exception, or raises a PostgreSQL ERROR through pg_call while C++ objects
 * that own memory are alive. Returns how many such objects have been
 * destroyed so far in this backend, which proves unwinding ran; 'call_depth'
 * returns how many calls of this extension are running, this one included
 * (the count the cache's retirement waits on, cache.hpp).
 */
namespace {
int64 destroyed = 0;
struct Witness {
    std::string payload = std::string(64, 'x');  // owns heap memory
    ~Witness() { destroyed++; }
};
}  // namespace

SHARDING_FUNCTION(sharding__boundary_selftest) {
    text *kind_text = PG_GETARG_TEXT_PP(0);
    std::string kind(VARDATA_ANY(kind_text), VARSIZE_ANY_EXHDR(kind_text));
    Witness witness;
    std::vector<int> owned(1000, 7);
    if (kind == "count") {
        return Int64GetDatum(destroyed);
    } else if (kind == "call_depth") {
        return Int64GetDatum(sharding::detail::call_depth);
    } else if (kind == "runtime_error") {
        throw std::runtime_error("boom from C++");
    } else if (kind == "bad_alloc") {
        throw std::bad_alloc();
    } else if (kind == "out_of_range") {
        // Opaque to the optimiser, which would otherwise warn (GCC 16,
        // -Warray-bounds) about the very access this case exists to make.
        volatile size_t past_end = 5000;
        return Int32GetDatum(owned.at(past_end));
    } else if (kind == "int") {
        throw 42;
    } else if (kind == "error") {
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "self-test error with value %d", 17);
    } else if (kind == "pg_error") {
        sharding::pg_call([] {
            ereport(ERROR, (errcode(ERRCODE_DIVISION_BY_ZERO), errmsg("division by zero raised by PostgreSQL"),
                            errdetail("Raised inside pg_call.")));
        });
    } else if (kind == "drift") {
        // A PG_TRY left open, as an exception thrown inside one would leave
        // it: guarded() must notice, restore the stack and raise an ERROR.
        static sigjmp_buf leaked;
        PG_exception_stack = &leaked;
        return Int64GetDatum(0);
    } else if (kind == "long_utf8") {
        // A message longer than the capture buffer, of 3-byte characters.
        std::string m = "x";  // so that the capture buffer (1024) ends inside a character
        while (m.size() < 3000) m += "\xe2\x82\xac";
        throw sharding::Error(ERRCODE_INVALID_PARAMETER_VALUE, m);
    } else if (kind == "glue_error") {
        // A glue function (here PostgreSQL's own) raising an ERROR.
        sharding::glue(pg_strtoint32, static_cast<const char *>("not a number"));
    } else if (kind == "glue_value") {
        return Int64GetDatum(sharding::glue(pg_strtoint32, static_cast<const char *>("4321")));
    } else if (kind == "pg_value") {
        int32 v = sharding::pg_call([&] { return pg_strtoint32("1234"); });
        return Int64GetDatum(v);
    }
    sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "unknown self-test kind \"%s\"", kind.c_str());
}
