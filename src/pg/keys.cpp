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

namespace {
// Each KeyType and the PostgreSQL type it is (both directions read this).
struct KeyTypeOid {
    KeyType key;
    Oid oid;
};
constexpr KeyTypeOid kKeyTypeOids[] = {{KeyType::Text, TEXTOID}, {KeyType::Bytea, BYTEAOID},
                                        {KeyType::Int2, INT2OID}, {KeyType::Int4, INT4OID},
                                        {KeyType::Int8, INT8OID}, {KeyType::Uuid, UUIDOID}};
}  // namespace

std::optional<KeyType> key_type_of(Oid type) {
    // varchar is text with a length limit: hashed as the text it casts to.
    if (type == VARCHAROID) return KeyType::Text;
    for (const KeyTypeOid &k : kKeyTypeOids)
        if (k.oid == type) return k.key;
    // A domain is hashed as its base type; any other type is no key.
    if (get_typtype(type) != TYPTYPE_DOMAIN) return std::nullopt;
    return key_type_of(getBaseType(type));
}

Oid key_type_oid(KeyType key) {
    for (const KeyTypeOid &k : kKeyTypeOids)
        if (k.key == key) return k.oid;
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
