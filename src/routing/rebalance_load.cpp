// The rebalance planners seen from SQL (rebalance and rebalance_by_load):
// arrays in, the pure C++ plan (rebalance.cpp) out as rows.
#include "pg/boundary.hpp"
#include "core/rebalance.hpp"

#include <cmath>
#include <string>
#include <vector>

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
}

namespace {

// Copies a text[] into out (the caller validated: one dimension), refusing
// a NULL element: "<what> must not contain NULL".
void text_array(ArrayType *arr, std::vector<std::string> &out, const char *what) {
    Datum *d;
    bool *n;
    int count;
    sharding::pg_call([&] { deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &d, &n, &count); });
    out.reserve(static_cast<size_t>(count));
    for (int i = 0; i < count; i++) {
        if (n[i]) sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "%s must not contain NULL", what);
        text *t = reinterpret_cast<text *>(DatumGetPointer(d[i]));
        out.emplace_back(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
    }
}

// Returns the moves as the rows (logical, from_node, to_node) of a
// materialized set.
Datum return_moves(FunctionCallInfo fcinfo, const std::vector<sharding::Move> &moves) {
    ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    sharding::pg_call([&] { InitMaterializedSRF(fcinfo, 0); });
    for (const sharding::Move &mv : moves) {
        sharding::pg_call([&] {
            Datum values[3] = {Int32GetDatum(mv.logical),
                               PointerGetDatum(cstring_to_text_with_len(mv.from.data(), mv.from.size())),
                               PointerGetDatum(cstring_to_text_with_len(mv.to.data(), mv.to.size()))};
            bool nulls[3] = {false, false, false};
            tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
        });
    }
    return (Datum)0;
}

}  // namespace

/*
 * _rebalance_plan(owners text[], targets text[])
 *     RETURNS TABLE(logical integer, from_node text, to_node text)
 *
 * Internal: the pure C++ planner (rebalance.cpp) seen from SQL. owners[i]
 * is the owner of logical shard i; the caller validated targets.
 */
SHARDING_FUNCTION(sharding__rebalance_plan) {
    ArrayType *owners_arr = PG_GETARG_ARRAYTYPE_P(0), *targets_arr = PG_GETARG_ARRAYTYPE_P(1);
    Datum *owner_d;
    bool *owner_n;
    int n_owners;
    deconstruct_array(owners_arr, TEXTOID, -1, false, TYPALIGN_INT, &owner_d, &owner_n, &n_owners);
    for (int i = 0; i < n_owners; i++)
        if (owner_n[i]) sharding::fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "owner of logical shard %d is NULL", i);
    std::vector<std::string> owners, targets;
    text_array(owners_arr, owners, "owners");
    text_array(targets_arr, targets, "nodes");
    return return_moves(fcinfo, sharding::plan_rebalance(owners, targets));
}

/*
 * _rebalance_by_load_plan(owners text[], nodes text[], loads float8[], max_imbalance float8)
 *     RETURNS TABLE(logical integer, from_node text, to_node text)
 *
 * Internal, for rebalance_by_load: owners[i] owns logical shard i, loads[i]
 * is its load (validated by the caller: same length, none NULL or negative).
 */
SHARDING_FUNCTION(sharding__rebalance_by_load_plan) {
    ArrayType *owners_arr = PG_GETARG_ARRAYTYPE_P(0), *nodes_arr = PG_GETARG_ARRAYTYPE_P(1),
              *loads_arr = PG_GETARG_ARRAYTYPE_P(2);
    const double max_imbalance = PG_GETARG_FLOAT8(3);
    Datum *load_d;
    bool *load_n;
    int n_loads;
    deconstruct_array(loads_arr, FLOAT8OID, sizeof(float8), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &load_d, &load_n,
                      &n_loads);
    std::vector<std::string> owners, nodes;
    text_array(owners_arr, owners, "node lists");
    text_array(nodes_arr, nodes, "node lists");
    std::vector<double> loads(static_cast<size_t>(n_loads));
    for (int i = 0; i < n_loads; i++) {
        if (load_n[i] || !(DatumGetFloat8(load_d[i]) >= 0) || std::isinf(DatumGetFloat8(load_d[i])))
            sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "loads[%d] must be a finite number >= 0", i + 1);
        loads[static_cast<size_t>(i)] = DatumGetFloat8(load_d[i]);
    }
    if (loads.size() != owners.size())
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "loads has %d entries, the map has %d logical shards",
                       n_loads, static_cast<int>(owners.size()));
    return return_moves(fcinfo, sharding::plan_rebalance_by_load(owners, nodes, loads, max_imbalance).moves);
}
