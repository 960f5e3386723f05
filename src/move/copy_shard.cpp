// copy_shard(map, logical, tbl, key_column, from_dsn, to_dsn): the low-level
// copy kept from 1.1 (moves use move_shard_online since 1.2), on the
// engine's own libpq connections (move_remote.hpp) since 1.4:
//
//   the source runs COPY (SELECT <stored columns> FROM tbl WHERE the key is
//   in the shard and not pinned) TO STDOUT; this backend passes each chunk
//   on to the destination, into a temporary table there, which one
//   INSERT ... SELECT ... ON CONFLICT DO NOTHING then adds to tbl, all in
//   one transaction at the destination. Rows already there are skipped, so
//   a repeated copy carries inserts only. Returns the rows inserted.
//
// Both sessions pin search_path and name everything qualified; every
// identifier is quoted, the pinned keys a literal. The password rule
// of every Remote applies to both DSNs (docs/nodes.md "Passwords"), and a
// node's masked DSN becomes the whole one only for a caller who may use
// the owner's credentials (caller_dsn, SEC-4).
#include "pg/spi.hpp"
#include "remote/move_remote.hpp"

#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
#include "mb/pg_wchar.h"
#include "utils/guc.h"
}

namespace sharding::move {
namespace {

// What copy_shard reads here before it connects anywhere.
struct CopyPlan {
    std::string rel;      // schema-qualified, quoted
    std::string columns;  // stored columns, quoted, in order
    std::string source_query;
};

CopyPlan plan_copy(const Text &map, const Text &logical, const Text &tbl, const Text &key_column) {
    Text shards = spi_value("SELECT m.logical_shards::text FROM sharding.maps AS m WHERE m.map = $1", {c(map)});
    if (!shards) fail(ERRCODE_UNDEFINED_OBJECT, "map \"%s\" does not exist", c(map));
    const long n = std::strtol(c(shards), nullptr, 10);
    const long l = std::strtol(c(logical), nullptr, 10);
    if (l < 0 || l >= n)
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "logical shard must be between 0 and %ld for map \"%s\", got %ld", n - 1,
             c(map), l);
    // As it is hashed (varchar as text, a domain as its base); 42703 or 22023.
    Text key_type = spi_value("SELECT sharding._key_column_type($1::oid::regclass, $2::name)::oid::text",
                              {c(tbl), c(key_column)});
    CopyPlan p;
    p.rel = must(spi_value("SELECT pg_catalog.format('%I.%I', n.nspname, r.relname) FROM pg_catalog.pg_class AS r "
                           "JOIN pg_catalog.pg_namespace AS n ON n.oid = r.relnamespace WHERE r.oid = $1::oid",
                           {c(tbl)}));
    p.columns = must(spi_value("SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY a.attnum) "
                               "FROM pg_catalog.pg_attribute AS a WHERE a.attrelid = $1::oid AND a.attnum > 0 "
                               "AND NOT a.attisdropped AND a.attgenerated = ''",
                               {c(tbl)}));
    // Pinned keys live on their pin's node, not on the shard's owner. Pins
    // hold the key's canonical text form (bytea in hex): compared in that
    // form, not ::text, which for bytea follows the source's bytea_output.
    Text pinned = spi_value("SELECT coalesce(pg_catalog.array_agg(p.key), '{}')::text FROM sharding.pins AS p "
                            "WHERE p.map = $1",
                            {c(map)});
    Text key_text = spi_value("SELECT sharding._key_text_sql(pg_catalog.quote_ident($1), $2::oid::regtype)",
                              {c(key_column), c(key_type)});
    p.source_query = "SELECT " + p.columns + " FROM " + p.rel + " WHERE sharding.shard_of(" + ident(must(key_column)) +
                     ", " + must(shards) + ") = " + std::to_string(l) + " AND NOT (" + must(key_text) +
                     " = ANY (" + lit(pinned) + "::pg_catalog.text[]))";
    return p;
}

int64 copy_between(const CopyPlan &p, const std::string &from, const std::string &to) {
    const std::string encoding = lit(Text(glue(GetDatabaseEncodingName)));
    Remote src(from, false, "sharding_copy_shard");
    Remote dst(to, false, "sharding_copy_shard");
    for (Remote *r : {&src, &dst}) {
        r->run("SET search_path = pg_catalog, pg_temp");
        r->run("SET client_encoding = " + encoding);
    }
    dst.run("BEGIN");
    dst.run("CREATE TEMPORARY TABLE sharding_copy_shard ON COMMIT DROP AS SELECT " + p.columns + " FROM " + p.rel +
            " WITH NO DATA");
    src.start_copy_out("COPY (" + p.source_query + ") TO STDOUT");
    dst.start_copy_in("COPY pg_temp.sharding_copy_shard FROM STDIN");
    const char *data = nullptr;
    int len = 0;
    while (src.read_copy(&data, &len)) dst.put_copy(data, len);
    (void)dst.end_copy_in();
    PGresult *res = nullptr;
    dst.run("INSERT INTO " + p.rel + " (" + p.columns + ") SELECT " + p.columns +
                " FROM pg_temp.sharding_copy_shard ON CONFLICT DO NOTHING",
            &res);
    const int64 inserted = res != nullptr ? std::strtoll(PQcmdTuples(res), nullptr, 10) : 0;
    if (res != nullptr) PQclear(res);
    dst.run("COMMIT");
    return inserted;
}

}  // namespace
}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

// copy_shard(map text, logical integer, tbl regclass, key_column name,
// from_dsn text, to_dsn text) RETURNS bigint (STRICT).
SHARDING_FUNCTION(sharding_copy_shard) {
    Text map = text_arg(fcinfo, 0);
    Text logical = int_arg(fcinfo, 1);
    Text tbl = Text(std::to_string(PG_GETARG_OID(2)));
    Text key_column = Text(std::string(NameStr(*PG_GETARG_NAME(3))));
    Text from = text_arg(fcinfo, 4);
    Text to = text_arg(fcinfo, 5);
    CopyPlan p = plan_copy(map, logical, tbl, key_column);
    // DSNs given by the caller: a node's masked DSN (which would become the
    // whole one) only for a caller who may use the owner's credentials.
    const std::string from_dsn = caller_dsn(must(from));
    const std::string to_dsn = caller_dsn(must(to));
    PG_RETURN_INT64(copy_between(p, from_dsn, to_dsn));
}
