// The shard key types (docs/hashing.md): which column and value types a
// shard key may have, and as which type each is hashed. The one test, used by
// C++ (key_type_of) and exposed to SQL (sharding._key_type), so that every
// check of a key column agrees.
#include "pg/keys.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/lsyscache.h"
}

namespace sharding {

std::optional<KeyType> key_type_of(Oid type) {
    switch (type) {
    case TEXTOID:
    case VARCHAROID:  // varchar is text with a length limit: hashed as the text it casts to
        return KeyType::Text;
    case BYTEAOID:
        return KeyType::Bytea;
    case INT2OID:
        return KeyType::Int2;
    case INT4OID:
        return KeyType::Int4;
    case INT8OID:
        return KeyType::Int8;
    case UUIDOID:
        return KeyType::Uuid;
    default:
        // A domain is hashed as its base type; any other type is no key.
        if (get_typtype(type) != TYPTYPE_DOMAIN) return std::nullopt;
        return key_type_of(getBaseType(type));
    }
}

Oid key_type_oid(KeyType k) {
    switch (k) {
    case KeyType::Text:
        return TEXTOID;
    case KeyType::Bytea:
        return BYTEAOID;
    case KeyType::Int2:
        return INT2OID;
    case KeyType::Int4:
        return INT4OID;
    case KeyType::Int8:
        return INT8OID;
    case KeyType::Uuid:
        return UUIDOID;
    }
    return InvalidOid;
}

}  // namespace sharding

/*
 * _key_type(t regtype) RETURNS regtype
 *
 * Internal: the type a shard key of type t is hashed as (text for text,
 * varchar and domains over them; bytea, smallint, integer, bigint, uuid and
 * domains over them as themselves), NULL when t is not a shard key type.
 */
SHARDING_FUNCTION(sharding__key_type) {
    std::optional<sharding::KeyType> k = sharding::key_type_of(PG_GETARG_OID(0));
    if (!k) PG_RETURN_NULL();
    PG_RETURN_OID(sharding::key_type_oid(*k));
}
