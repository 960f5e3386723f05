// Observing load (docs/observe.md), the parts written in C++: the histogram bar
// shared by every observing function, and imbalance(anyarray). The
// table-scanning functions (distribution, whales, map_load) are SQL in
// sql/install/80_observe.sql: each is one aggregate query over the table.
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "core/observe_core.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"
}

namespace {

// The element value of a numeric array as a double. Raises no C++ exception;
// numeric_float8 may raise a PostgreSQL ERROR (out of memory), so it runs
// while no owning C++ object is alive (boundary.hpp, rule 2).
double element_as_double(Datum d, Oid elem) {
    switch (elem) {
        case INT2OID: return static_cast<double>(DatumGetInt16(d));
        case INT4OID: return static_cast<double>(DatumGetInt32(d));
        case INT8OID: return static_cast<double>(DatumGetInt64(d));
        case FLOAT4OID: return static_cast<double>(DatumGetFloat4(d));
        case FLOAT8OID: return DatumGetFloat8(d);
        default: return DatumGetFloat8(DirectFunctionCall1(numeric_float8, d));
    }
}

bool is_numeric_type(Oid t) {
    return t == INT2OID || t == INT4OID || t == INT8OID || t == FLOAT4OID || t == FLOAT8OID ||
           t == NUMERICOID;
}

}  // namespace

/*
 * bar(value float8, max float8, width integer DEFAULT 40) RETURNS text
 *
 * A Unicode bar (full blocks, then one of the eighth blocks) `width`
 * characters long when value = max, proportionally shorter otherwise; empty
 * for zero or negative values, clipped at width, at least one eighth for any
 * positive value. distribution and map_load draw their bars with it.
 */
SHARDING_FUNCTION(sharding_bar) {
    double value = PG_GETARG_FLOAT8(0), max = PG_GETARG_FLOAT8(1);
    int32 width = PG_GETARG_INT32(2);
    if (width < 0 || width > sharding::kBarMaxWidth)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "bar width must be between 0 and %d, got %d",
                       sharding::kBarMaxWidth, width);
    text *result;
    {
        std::string drawn = sharding::bar(value, max, width);
        // cstring_to_text_with_len only pallocs; a failure there is out of
        // memory, caught and re-raised by pg_call after `drawn` is freed.
        result = sharding::pg_call([&] { return cstring_to_text_with_len(drawn.data(), drawn.size()); });
    }
    PG_RETURN_TEXT_P(result);
}

/*
 * imbalance(loads anyarray) RETURNS float8
 *
 * max / mean of the array's elements (smallint, integer, bigint, real,
 * double precision or numeric; any number of dimensions). NULL elements are
 * skipped, as aggregates skip them; the result is NULL when no non-NULL
 * element remains or all are zero. A negative, NaN or infinite load is
 * 22023; an array of anything but numbers is 22023.
 */
SHARDING_FUNCTION(sharding_imbalance) {
    ArrayType *arr = PG_GETARG_ARRAYTYPE_P(0);
    Oid elem = ARR_ELEMTYPE(arr);
    if (!is_numeric_type(elem)) {
        const char *name = format_type_be(elem);
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                       "imbalance needs an array of numbers, got %s[]", name);
    }
    sharding::ArrayElements e = sharding::array_elements(arr);

    sharding::Imbalance acc;  // owns nothing: PostgreSQL calls below are safe
    for (int i = 0; i < e.count; i++) {
        if (e.nulls[i]) continue;
        double load = element_as_double(e.values[i], elem);
        if (!std::isfinite(load) || load < 0)
            sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                           "loads must be finite and non-negative, got %g at position %d", load, i + 1);
        acc.add(load);
    }
    if (!acc.defined()) PG_RETURN_NULL();
    PG_RETURN_FLOAT8(acc.value());
}
