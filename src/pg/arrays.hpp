// Reading the elements of an array whose element type is known only at run
// time (key = ANY(array) in fan-out counting, imbalance(anyarray)).
#pragma once

#include "pg/pg.hpp"

extern "C" {
#include "utils/array.h"
#include "utils/lsyscache.h"
}

namespace sharding {

// The elements of `a`, flattened in storage order, NULL elements flagged in
// `nulls`. Raises no C++ exception; the catalog lookup and palloc may raise a
// PostgreSQL ERROR, so call it while no owning C++ object is alive
// (boundary.hpp, rule 2).
struct ArrayElements {
    Datum *values;
    bool *nulls;
    int count;
};

inline ArrayElements array_elements(ArrayType *a) {
    Oid elem = ARR_ELEMTYPE(a);
    int16 typlen;
    bool byval;
    char align;
    get_typlenbyvalalign(elem, &typlen, &byval, &align);
    ArrayElements e;
    deconstruct_array(a, elem, typlen, byval, align, &e.values, &e.nulls, &e.count);
    return e;
}

}  // namespace sharding
