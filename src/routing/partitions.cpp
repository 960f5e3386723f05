// Native partitions (docs/partitions.md): the support functions of the hash
// operator classes text_shard_ops, bytea_shard_ops, int2/int4/int8_shard_ops
// (one family, integer_shard_ops) and uuid_shard_ops. See partition_hash.hpp for
// why the extended hash looks the way it does.
#include "pg/keys.hpp"
#include "core/partition_hash.hpp"

extern "C" {
#include "catalog/pg_collation.h"
#include "utils/lsyscache.h"
}

namespace {
using sharding::KeyType;

// Our hashes are over bytes, which agrees with text equality only under a
// deterministic collation (PostgreSQL's own hashtext hashes sort keys
// otherwise). Refuse rather than misroute or break hash joins.
template <KeyType K>
void check_collation(FunctionCallInfo fcinfo) {
    if constexpr (K == KeyType::Text) {
        Oid collid = PG_GET_COLLATION();
        if (collid == InvalidOid || collid == DEFAULT_COLLATION_OID || collid == C_COLLATION_OID ||
            collid == POSIX_COLLATION_OID)
            return;
        if (get_collation_isdeterministic(collid)) return;
        // Looked up before any C++ object exists (boundary.hpp, rule 2).
        const char *name = get_collation_name(collid);
        throw sharding::Error(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            sharding::format("sharding.text_shard_ops does not support nondeterministic "
                             "collation \"%s\"",
                             name ? name : "?"),
            "Equal strings under this collation may differ in their bytes, which are what "
            "shard_of hashes.",
            "Give the key column a deterministic collation, such as \"C\" or the default.");
    } else {
        (void)fcinfo;
    }
}

/*
 * partition_hash(key) RETURNS integer
 *
 * Hash support function 1: the low 32 bits of hash64(key).
 */
template <KeyType K>
Datum partition_hash_body(FunctionCallInfo fcinfo) {
    check_collation<K>(fcinfo);
    uint32_t h = sharding::standard_hash(sharding::key_hash<K>(fcinfo, 0));
    return Int32GetDatum(static_cast<int32>(h));
}

/*
 * partition_hash_extended(key, seed bigint) RETURNS bigint
 *
 * Hash support function 2: hash64(key) for seed 0; for PostgreSQL's hash
 * partition seed, the value that makes a single-column partition key route
 * every row to remainder shard_of(key, modulus); otherwise a seeded hash.
 */
template <KeyType K>
Datum partition_hash_extended_body(FunctionCallInfo fcinfo) {
    check_collation<K>(fcinfo);
    uint64_t seed = static_cast<uint64_t>(PG_GETARG_INT64(1));
    uint64_t h = sharding::extended_hash(sharding::key_hash<K>(fcinfo, 0), seed);
    return Int64GetDatum(static_cast<int64>(h));
}
}  // namespace

SHARDING_KEY_FUNCTIONS(sharding_partition_hash, partition_hash_body)
SHARDING_KEY_FUNCTIONS(sharding_partition_hash_extended, partition_hash_extended_body)
