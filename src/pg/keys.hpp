// Reading a shard key argument of any of the six key types and hashing its
// canonical bytes (docs/hashing.md). Shared by hashing, routing and the
// operator classes, so that every path hashes a key the same way.
#pragma once

#include "pg/boundary.hpp"
#include "core/hash_core.hpp"

#include <optional>

extern "C" {
#include "utils/uuid.h"
}

namespace sharding {

enum class KeyType { Text, Bytea, Int2, Int4, Int8, Uuid };

// The one test of what a shard key may be (keys.cpp; SQL sees it as
// sharding._key_type): the KeyType a key of PostgreSQL type `type` is hashed
// as, or none. text and varchar are Text; a domain is its base type. May
// raise a PostgreSQL ERROR (a catalog lookup for types that are no key type).
std::optional<KeyType> key_type_of(Oid type);

// The PostgreSQL type of each KeyType (TEXTOID for Text).
Oid key_type_oid(KeyType k);

// Hash of argument `argno`, which must not be NULL. Raises no C++ exception;
// detoasting may raise a PostgreSQL ERROR, so call it before any owning C++
// object is created (boundary.hpp, rule 2).
template <KeyType K>
inline uint64_t key_hash(FunctionCallInfo fcinfo, int argno) {
    if constexpr (K == KeyType::Text || K == KeyType::Bytea) {
        struct varlena *v = PG_GETARG_VARLENA_PP(argno);
        uint64_t h = hash_bytes(VARDATA_ANY(v), VARSIZE_ANY_EXHDR(v));
        PG_FREE_IF_COPY(v, argno);
        return h;
    } else if constexpr (K == KeyType::Int2) {
        return hash_int64(PG_GETARG_INT16(argno));
    } else if constexpr (K == KeyType::Int4) {
        return hash_int64(PG_GETARG_INT32(argno));
    } else if constexpr (K == KeyType::Int8) {
        return hash_int64(PG_GETARG_INT64(argno));
    } else {
        pg_uuid_t *u = PG_GETARG_UUID_P(argno);
        return hash_bytes(u->data, UUID_LEN);
    }
}

// Validates a shard count argument (22023 naming the value).
inline int32_t check_shard_count(int32 n) {
    if (n < 1)
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "shard count must be between 1 and 2147483647, got %d", n);
    return n;
}

}  // namespace sharding

// Defines the SQL-callable C functions prefix_text, prefix_bytea, ...,
// prefix_uuid from one body template BODY<KeyType>(fcinfo).
#define SHARDING_KEY_FUNCTIONS(prefix, BODY)                                                      \
    SHARDING_FUNCTION(prefix##_text) { return BODY<::sharding::KeyType::Text>(fcinfo); }         \
    SHARDING_FUNCTION(prefix##_bytea) { return BODY<::sharding::KeyType::Bytea>(fcinfo); }       \
    SHARDING_FUNCTION(prefix##_int2) { return BODY<::sharding::KeyType::Int2>(fcinfo); }         \
    SHARDING_FUNCTION(prefix##_int4) { return BODY<::sharding::KeyType::Int4>(fcinfo); }         \
    SHARDING_FUNCTION(prefix##_int8) { return BODY<::sharding::KeyType::Int8>(fcinfo); }         \
    SHARDING_FUNCTION(prefix##_uuid) { return BODY<::sharding::KeyType::Uuid>(fcinfo); }
