// Hashing (docs/hashing.md): hash64, shard_of and jump_shard for every key
// type, and the dealing rule of worker_shards / worker_of.
#include "pg/keys.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/array.h"
}

namespace {
using sharding::KeyType;

// hash64(key) -> bigint: the unsigned XXH3 value reinterpreted as signed.
template <KeyType K>
Datum hash64_body(FunctionCallInfo fcinfo) {
    return Int64GetDatum(static_cast<int64>(sharding::key_hash<K>(fcinfo, 0)));
}

// The divisor of this call site, prepared once: n is almost always the same
// constant for every row, and a 64-bit division costs more than the hash.
const sharding::FastMod &call_site_mod(FunctionCallInfo fcinfo, int32 n) {
    auto *fm = static_cast<sharding::FastMod *>(fcinfo->flinfo->fn_extra);
    if (unlikely(fm == nullptr)) {
        fm = static_cast<sharding::FastMod *>(
            MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(sharding::FastMod)));
        fcinfo->flinfo->fn_extra = fm;
    }
    if (unlikely(fm->n != static_cast<uint64_t>(n))) fm->set(static_cast<uint64_t>(n));
    return *fm;
}

// shard_of(key, n integer) -> integer in [0, n).
template <KeyType K>
Datum shard_of_body(FunctionCallInfo fcinfo) {
    int32 n = sharding::check_shard_count(PG_GETARG_INT32(1));
    uint64_t h = sharding::key_hash<K>(fcinfo, 0);
    return Int32GetDatum(static_cast<int32>(call_site_mod(fcinfo, n).mod(h)));
}

// jump_shard(key, n integer) -> integer in [0, n).
template <KeyType K>
Datum jump_shard_body(FunctionCallInfo fcinfo) {
    int32 n = sharding::check_shard_count(PG_GETARG_INT32(1));
    return Int32GetDatum(sharding::jump_from_hash(sharding::key_hash<K>(fcinfo, 0), n));
}

void check_workers(int32 workers, int32 shards) {
    if (workers < 1)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                       "worker count must be between 1 and 2147483647, got %d", workers);
    sharding::check_shard_count(shards);
}

// The first argument of worker_shards (a worker of `workers`) and worker_of
// (a shard of `shards`): between 0 and count - 1.
void check_index(const char *what, int32 index, int32 count) {
    if (index < 0 || index >= count)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "%s must be between 0 and %d, got %d", what, count - 1,
                       index);
}
}  // namespace

SHARDING_KEY_FUNCTIONS(sharding_hash64, hash64_body)
SHARDING_KEY_FUNCTIONS(sharding_shard_of, shard_of_body)
SHARDING_KEY_FUNCTIONS(sharding_jump_shard, jump_shard_body)

/*
 * worker_shards(worker integer, workers integer, shards integer) RETURNS integer[]
 *
 * The contiguous range of shards dealt to `worker` (0-based), by the rule
 * create_map uses to deal logical shards to nodes.
 */
SHARDING_FUNCTION(sharding_worker_shards) {
    int32 worker = PG_GETARG_INT32(0), workers = PG_GETARG_INT32(1), shards = PG_GETARG_INT32(2);
    check_workers(workers, shards);
    check_index("worker", worker, workers);
    sharding::Range r = sharding::dealt_range(worker, workers, shards);
    // No C++ object owns anything from here on: palloc may raise.
    Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * (r.count > 0 ? r.count : 1)));
    for (int32 i = 0; i < r.count; i++) elems[i] = Int32GetDatum(r.first + i);
    ArrayType *arr = construct_array(elems, r.count, INT4OID, sizeof(int32), true, TYPALIGN_INT);
    PG_RETURN_ARRAYTYPE_P(arr);
}

/*
 * worker_of(shard integer, workers integer, shards integer) RETURNS integer
 *
 * The worker (0-based) that worker_shards deals `shard` to.
 */
SHARDING_FUNCTION(sharding_worker_of) {
    int32 shard = PG_GETARG_INT32(0), workers = PG_GETARG_INT32(1), shards = PG_GETARG_INT32(2);
    check_workers(workers, shards);
    check_index("shard", shard, shards);
    PG_RETURN_INT32(sharding::dealt_owner(shard, workers, shards));
}
