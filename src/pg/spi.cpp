// SPI, quoting, arguments, errors and subtransactions: see spi.hpp.
#include "pg/spi.hpp"

#include <new>
#include <stdexcept>

extern "C" {
#include "catalog/pg_type.h"
#include "common/md5.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "portability/instr_time.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/wait_event.h"
}

namespace sharding {
namespace {

struct SpiRows {
    int nrows;
    int ncols;
    char **cells;  // row-major; NULL for SQL NULL
};

// Glue: runs sql with parameters (Arg: text made from a C string, or a
// Datum) through SPI, read-write; copies every cell as text into `into`.
// keep: a plan kept for the backend (prepared and kept at its first use),
// or NULL to plan the statement each time.
SpiRows *spi_glue(const char *sql, int nargs, const Arg *args, MemoryContext into, SPIPlanPtr *keep) {
    Oid types[16];
    Datum vals[16];
    char nulls[16];
    if (nargs > 16) elog(ERROR, "too many SPI parameters");
    // The parameters in SPI's own memory, freed by SPI_finish (a procedure
    // that loops, rebalance_run, runs for as long as its job).
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    for (int i = 0; i < nargs; i++) {
        types[i] = args[i].type;
        vals[i] = args[i].isnull ? (Datum)0 : args[i].text != NULL ? CStringGetTextDatum(args[i].text) : args[i].value;
        nulls[i] = args[i].isnull ? 'n' : ' ';
    }
    int rc;
    if (keep != NULL) {
        if (*keep == NULL) {
            SPIPlanPtr p = SPI_prepare(sql, nargs, types);
            if (p == NULL) elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql, SPI_result_code_string(SPI_result));
            if (SPI_keepplan(p) != 0) elog(ERROR, "SPI_keepplan failed");
            *keep = p;
        }
        rc = SPI_execute_plan(*keep, vals, nulls, false, 0);
    } else {
        rc = SPI_execute_with_args(sql, nargs, types, vals, nulls, false, 0);
    }
    if (rc < 0) elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
    MemoryContext old = MemoryContextSwitchTo(into);
    SpiRows *out = (SpiRows *)palloc0(sizeof(SpiRows));
    if (SPI_tuptable != NULL) {
        out->nrows = (int)SPI_processed;
        out->ncols = SPI_tuptable->tupdesc->natts;
        out->cells = (char **)palloc0(sizeof(char *) * Max(1, out->nrows * out->ncols));
        for (int r = 0; r < out->nrows; r++)
            for (int c = 0; c < out->ncols; c++)
                out->cells[r * out->ncols + c] = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, c + 1);
    }
    MemoryContextSwitchTo(old);
    SPI_finish();
    return out;
}

void free_rows(SpiRows *rows) {
    if (rows->cells != NULL) {
        for (int i = 0; i < rows->nrows * rows->ncols; i++)
            if (rows->cells[i] != NULL) pfree(rows->cells[i]);
        pfree(rows->cells);
    }
    pfree(rows);
}

char *arg_cstring(FunctionCallInfo fcinfo, int i) { return text_to_cstring(PG_GETARG_TEXT_PP(i)); }

char *arg_out_glue(FunctionCallInfo fcinfo, int i, Oid type) {
    Oid out;
    bool varlena;
    getTypeOutputInfo(type, &out, &varlena);
    return OidOutputFunctionCall(out, PG_GETARG_DATUM(i));
}

void warn_glue(const char *message, const char *hint) {
    if (hint != NULL)
        ereport(WARNING, (errmsg_internal("%s", message), errhint("%s", hint)));
    else
        ereport(WARNING, (errmsg_internal("%s", message)));
}

void sleep_glue(long ms) {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
}

bool try_lock_glue(int32 k1, int32 k2) {
    return DatumGetBool(DirectFunctionCall2(pg_try_advisory_lock_int4, Int32GetDatum(k1), Int32GetDatum(k2)));
}

// Glue: md5 of the bytes, 32 hex digits into hex.
void md5_glue(const char *buff, size_t len, char *hex) {
    const char *err = NULL;
    if (!pg_md5_hash(buff, len, hex, &err))
        ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("could not compute MD5 hash: %s", err)));
}

bool unlock_glue(int32 k1, int32 k2) {
    return DatumGetBool(DirectFunctionCall2(pg_advisory_unlock_int4, Int32GetDatum(k1), Int32GetDatum(k2)));
}

}  // namespace

namespace {
std::vector<Row> spi_run(const char *sql, const std::vector<Arg> &a, SPIPlanPtr *keep) {
    SpiRows *res = glue(spi_glue, sql, (int)a.size(), a.data(), CurrentMemoryContext, keep);
    std::vector<Row> rows;
    try {
        rows.reserve(res->nrows);
        for (int r = 0; r < res->nrows; r++) {
            Row row;
            for (int c = 0; c < res->ncols; c++) {
                char *v = res->cells[r * res->ncols + c];
                row.push_back(v != nullptr ? Text(v) : std::nullopt);
            }
            rows.push_back(std::move(row));
        }
    } catch (...) {
        glue(free_rows, res);
        throw;
    }
    glue(free_rows, res);
    return rows;
}

Text first(const std::vector<Row> &rows) {
    if (rows.empty() || rows[0].empty()) return std::nullopt;
    return rows[0][0];
}
}  // namespace

std::vector<Row> spi_rows(const char *sql, std::initializer_list<const char *> args) {
    return spi_run(sql, std::vector<Arg>(args.begin(), args.end()), nullptr);
}

std::vector<Row> spi_rows_typed(const char *sql, const std::vector<Arg> &args) { return spi_run(sql, args, nullptr); }

Text spi_value(const char *sql, std::initializer_list<const char *> args) { return first(spi_rows(sql, args)); }

std::vector<Row> spi_kept_rows(KeptPlan *plan, const char *sql, std::initializer_list<const char *> args) {
    return spi_run(sql, std::vector<Arg>(args.begin(), args.end()), reinterpret_cast<SPIPlanPtr *>(&plan->plan));
}

Text spi_kept_value(KeptPlan *plan, const char *sql, std::initializer_list<const char *> args) {
    return first(spi_kept_rows(plan, sql, args));
}

std::string ident(const std::string &s) {
    const char *q = glue(quote_identifier, s.c_str());
    std::string r(q);
    if (q != s.c_str()) pfree((void *)q);
    return r;
}

std::string lit(const Text &s) {
    if (!s) return "NULL";
    char *q = glue(quote_literal_cstr, s->c_str());
    std::string r(q);
    pfree(q);
    return r;
}

Text text_arg(FunctionCallInfo fcinfo, int i) {
    if (PG_ARGISNULL(i)) return std::nullopt;
    char *s = glue(arg_cstring, fcinfo, i);
    std::string r(s);
    pfree(s);
    return r;
}

Text arg_out(FunctionCallInfo fcinfo, int i, Oid type) {
    if (PG_ARGISNULL(i)) return std::nullopt;
    char *s = glue(arg_out_glue, fcinfo, i, type);
    std::string r(s);
    pfree(s);
    return r;
}

Text int_arg(FunctionCallInfo fcinfo, int i) {
    if (PG_ARGISNULL(i)) return std::nullopt;
    return std::to_string(PG_GETARG_INT32(i));
}

Text bigint_arg(FunctionCallInfo fcinfo, int i) {
    if (PG_ARGISNULL(i)) return std::nullopt;
    return std::to_string(PG_GETARG_INT64(i));
}

void require_node(const Text &node) {
    if (!node || node->empty())
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "node name must not be empty or NULL, got %s",
             literal_or_null(node).c_str());
}

Datum text_datum(const std::string &s) {
    return PointerGetDatum(glue(cstring_to_text_with_len, s.c_str(), (int)s.size()));
}

void catch_current(Caught *out) {
    try {
        throw;
    } catch (const Error &e) {
        out->code = e.sqlstate();
        out->message = e.what();
        out->detail = e.detail();
        out->hint = e.hint();
    } catch (const PgError &e) {
        ErrorData *d = e.data();
        out->code = d->sqlerrcode;
        out->message = d->message ? d->message : "";
        out->detail = d->detail ? d->detail : "";
        out->hint = d->hint ? d->hint : "";
        out->context = d->context ? d->context : "";
        // Copied: the ErrorData pg_call made goes (a loop that swallows
        // errors, rebalance_run's claims, would keep every one).
        glue(FreeErrorData, d);
    } catch (const std::bad_alloc &) {
        out->code = ERRCODE_OUT_OF_MEMORY;
        out->message = "out of memory";
    } catch (const std::invalid_argument &e) {
        out->code = ERRCODE_INVALID_PARAMETER_VALUE;
        out->message = e.what();
    } catch (const std::exception &e) {
        out->message = e.what();
    } catch (...) {
        out->message = "unknown C++ exception";
    }
}

void reraise(const Caught &e) { throw Error(e.code, e.message, e.detail, e.hint); }

void warn(const std::string &message, const std::string &hint) {
    glue(warn_glue, message.c_str(), hint.empty() ? (const char *)nullptr : hint.c_str());
}

void sleep_ms(long ms) { glue(sleep_glue, ms); }

double clock_seconds() {
    instr_time t;
    INSTR_TIME_SET_CURRENT(t);
    return INSTR_TIME_GET_DOUBLE(t);
}

std::string float_text(double v) {
    char *s = glue(float8out_internal, v);
    std::string r(s);
    pfree(s);
    return r;
}

std::string md5_hex(const std::string &s) {
    char hex[33];
    glue(md5_glue, s.c_str(), s.size(), (char *)hex);
    return std::string(hex, 32);
}

bool try_session_lock(int32 k1, int32 k2) { return glue(try_lock_glue, k1, k2); }
void session_unlock(int32 k1, int32 k2) { (void)glue(unlock_glue, k1, k2); }

}  // namespace sharding
