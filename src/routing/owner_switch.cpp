// The coordinator's checks and switch on a move's path, in C++ (docs/moves.md:
// no PL/pgSQL on the move's path), each behind its SQL name as a thin
// LANGUAGE C wrapper with the SQLSTATEs and messages docs/moves.md lists:
//
//   _require_map(map, for_update): a map's logical shard count (22023 for
//     NULL, 42704 unknown), its row locked when for_update;
//   _check_logical(map, logical, logical_shards): 22023 out of range;
//   _check_database_nodes(map, nodes): 55000 for a node without DSN handed
//     shards or pins of a database map;
//   _switch_owner(map, logical, node): the owner switch of move_shard and of
//     an online move's cutover (epoch + 1, after fenced writers);
//   _coordinator_dsn(): the DSN this database is reached by;
//   key_shard (_job_key_shard's): the logical shard of a key given as text.
//
// _require_map and _check_database_nodes run on every pin as well: their
// statements are prepared once per backend and kept (spi_kept_rows), as
// PL/pgSQL kept its plans. Statements run through SPI with text parameters
// (src/pg/spi.cpp), in the caller's transaction, each with a new
// snapshot as PL/pgSQL ran them.
#include "routing/owner_switch.hpp"
#include "pg/keys.hpp"
#include "pg/shard_lock.hpp"
#include "remote/move_remote.hpp"

#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
}

namespace sharding::move {
namespace {

// A text[] of one element, as its output function writes it ({"a b"}).
std::string one_element_array(const std::string &s) {
    std::string out = "{\"";
    for (char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
    }
    return out + "\"}";
}

// Glue: the settings and names _coordinator_dsn writes (palloc'd). As
// current_setting(name, true) reads them: NULL if unknown, 42501 for a
// setting the role may not read.
char *setting_glue(const char *name) {
    const char *v = GetConfigOption(name, true, true);
    return v != nullptr ? pstrdup(v) : nullptr;
}
char *database_glue() { return get_database_name(MyDatabaseId); }
char *user_glue() { return GetUserNameFromId(GetUserId(), false); }

// Glue: _lock_shard's two locks, of the map and of the shard.
void lock_shard_glue(const char *map, size_t len, uint32 logical) {
    (void)lock_shard(map, len, map_level, RowExclusiveLock);
    (void)lock_shard(map, len, logical, ExclusiveLock);
}

Text owned(char *s) {
    if (s == nullptr) return std::nullopt;
    std::string r(s);
    pfree(s);
    return r;
}

// pg_catalog.btrim(s): spaces off both ends.
std::string btrim(const std::string &s) {
    size_t b = s.find_first_not_of(' ');
    if (b == std::string::npos) return std::string();
    return s.substr(b, s.find_last_not_of(' ') - b + 1);
}

}  // namespace

Text require_map(const Text &map, bool for_update) {
    static KeptPlan plain, locking;
    if (!map) fail(ERRCODE_INVALID_PARAMETER_VALUE, "map name must not be NULL");
    std::vector<Row> r =
        for_update ? spi_kept_rows(&locking, "SELECT m.logical_shards FROM sharding.maps m WHERE m.map = $1 FOR UPDATE",
                                   {c(map)})
                   : spi_kept_rows(&plain, "SELECT m.logical_shards FROM sharding.maps m WHERE m.map = $1", {c(map)});
    if (r.empty()) fail(ERRCODE_UNDEFINED_OBJECT, "map \"%s\" does not exist", map->c_str());
    return r[0][0];
}

void check_logical(const Text &map, const Text &logical, const Text &shards) {
    // As the PL/pgSQL's IF: an unknown count (NULL) refuses only NULL or
    // negative shards.
    const long long l = logical ? std::strtoll(logical->c_str(), nullptr, 10) : 0;
    const long long n = shards ? std::strtoll(shards->c_str(), nullptr, 10) : 0;
    if (!logical || l < 0 || (shards && l >= n))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "logical shard must be between 0 and %s for map \"%s\", got %s",
             shards ? std::to_string(n - 1).c_str() : "<NULL>", shown(map).c_str(), logical ? logical->c_str() : "NULL");
}

void check_database_nodes(const Text &map, const Text &nodes) {
    static KeptPlan any_dsn, worker_map, first_missing;
    if (spi_kept_value(&any_dsn, "SELECT EXISTS (SELECT FROM sharding.nodes n WHERE n.dsn IS NOT NULL)", {}) != Text("t"))
        return;
    // A worker map: any name goes. Cheapest first: a node of `nodes` or an
    // owner of the map's shards with a DSN; only then the map's pins (no
    // index by node), a join that stops at the first pin held by a node
    // with a DSN.
    if (spi_kept_value(&worker_map,
                       "SELECT NOT EXISTS (SELECT FROM sharding.nodes n WHERE n.dsn IS NOT NULL "
                       "AND n.node = ANY ($2::text[])) "
                       "AND NOT EXISTS (SELECT FROM sharding.shards s JOIN sharding.nodes n ON n.node = s.node "
                       "WHERE s.map = $1 AND n.dsn IS NOT NULL) "
                       "AND NOT EXISTS (SELECT FROM sharding.pins p JOIN sharding.nodes n ON n.node = p.node "
                       "WHERE p.map = $1 AND n.dsn IS NOT NULL)",
                       {c(map), c(nodes)}) == Text("t"))
        return;
    std::vector<Row> missing = spi_kept_rows(&first_missing,
                                             "SELECT u.node FROM pg_catalog.unnest($1::text[]) WITH ORDINALITY "
                                             "AS u(node, i) LEFT JOIN sharding.nodes n ON n.node = u.node "
                                             "WHERE n.dsn IS NULL ORDER BY u.i LIMIT 1",
                                             {c(nodes)});
    if (missing.empty()) return;
    const Text &m = missing[0][0];
    fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
         Explain{"Other nodes of the map have DSNs; PL/Proxy could not reach this one.",
                 "Call sharding.add_node(" + literal_or_null(m) + ", '<dsn>') first."},
         "node \"%s\" has no connection string, and map \"%s\" is a database map", shown(m).c_str(),
         shown(map).c_str());
}

void lock_shard_exclusive(const Text &map, const Text &logical) {
    const long long l = std::strtoll(must(logical).c_str(), nullptr, 10);
    if (l < 0)  // -1 would be the map-level lock tag
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "logical shard must not be negative, got %lld", l);
    glue(lock_shard_glue, must(map).c_str(), must(map).size(), static_cast<uint32>(l));
}

Text switch_owner(const Text &map, const Text &logical, const Text &node) {
    require_node(node);
    Text shards = require_map(map, false);
    check_logical(map, logical, shards);
    // On a database map the new owner needs a DSN.
    check_database_nodes(map, Text(one_element_array(*node)));
    // Waits for every writer fenced on the shard (and any rebalance).
    lock_shard_exclusive(map, logical);
    std::vector<Row> cur = spi_rows("SELECT s.node, s.epoch::text FROM sharding.shards s "
                                    "WHERE s.map = $1 AND s.logical = $2::integer FOR UPDATE",
                                    {c(map), c(logical)});
    if (cur.empty()) fail(ERRCODE_UNDEFINED_OBJECT, "map \"%s\" does not exist", map->c_str());
    // Moving a shard to its owner changes nothing: fenced writers stay valid.
    if (cur[0][0] == node) return cur[0][1];
    spi_value("INSERT INTO sharding.nodes (node) VALUES ($1) ON CONFLICT DO NOTHING", {c(node)});
    Text epoch = spi_value("UPDATE sharding.shards s SET node = $3, epoch = s.epoch + 1 "
                           "WHERE s.map = $1 AND s.logical = $2::integer RETURNING s.epoch::text",
                           {c(map), c(logical), c(node)});
    spi_value("SELECT sharding._touch_map($1)", {c(map)});
    return epoch;
}

std::string coordinator_dsn() {
    Text dsn = owned(glue(setting_glue, "sharding.coordinator_dsn"));
    if (dsn && !btrim(*dsn).empty()) return *dsn;
    // The address this session reached the server at (NULL over a Unix
    // socket), else the first socket directory, else localhost.
    Text host = spi_value("SELECT pg_catalog.host(pg_catalog.inet_server_addr())", {});
    if (!host) {
        const std::string dirs = owned(glue(setting_glue, "unix_socket_directories")).value_or("");
        host = btrim(dirs.substr(0, dirs.find(',')));
    }
    if (host->empty()) host = std::string("localhost");
    return "host=" + lit(host) + " port=" + owned(glue(setting_glue, "port")).value_or("") +
           " dbname=" + lit(owned(glue(database_glue))) + " user=" + lit(owned(glue(user_glue)));
}

std::optional<KeyType> map_key_type(const Text &map) {
    Text column_type = spi_value("SELECT a.atttypid::pg_catalog.text "
                                 "FROM sharding.distributed_tables d JOIN pg_catalog.pg_attribute a "
                                 "ON a.attrelid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', d.schema_name, d.table_name)) "
                                 "AND a.attname = d.key_column "
                                 "WHERE d.map = $1 ORDER BY d.schema_name, d.table_name LIMIT 1",
                                 {c(map)});
    if (!column_type) return std::nullopt;
    return glue(key_type_of, static_cast<Oid>(std::strtoul(column_type->c_str(), nullptr, 10)));
}

// The logical shard of a pinned key (pins are by text form): computed by
// the type of the map's distributed key columns, as writers route it (the
// type a key is hashed as: key_type_of).
Text key_shard(const Text &map, const Text &key) {
    const std::optional<KeyType> type = map_key_type(map);
    const char *name = nullptr;  // text (and no type): the text function
    if (type) switch (*type) {
        case KeyType::Text: break;
        case KeyType::Bytea: name = "bytea"; break;
        case KeyType::Int2: name = "int2"; break;
        case KeyType::Int4: name = "int4"; break;
        case KeyType::Int8: name = "int8"; break;
        case KeyType::Uuid: name = "uuid"; break;
        }
    if (!name) return spi_value("SELECT sharding.logical_shard($1, $2)::text", {c(map), c(key)});
    const std::string sql = "SELECT sharding.logical_shard($1, $2::pg_catalog." + std::string(name) + ")::text";
    return spi_value(sql.c_str(), {c(map), c(key)});
}

}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

// _require_map(map text, for_update boolean DEFAULT false): integer. Not
// STRICT: a NULL map raises 22023.
SHARDING_FUNCTION(sharding__require_map) {
    Text map = text_arg(fcinfo, 0);
    const bool for_update = !PG_ARGISNULL(1) && PG_GETARG_BOOL(1);
    Text l = require_map(map, for_update);
    if (!l) PG_RETURN_NULL();
    PG_RETURN_INT32(std::atoi(l->c_str()));
}

// _check_logical(map text, logical integer, logical_shards integer): void.
// Not STRICT: a NULL shard raises 22023.
SHARDING_FUNCTION(sharding__check_logical) {
    check_logical(text_arg(fcinfo, 0), int_arg(fcinfo, 1), int_arg(fcinfo, 2));
    PG_RETURN_VOID();
}

// _check_database_nodes(map text, nodes text[]): void.
SHARDING_FUNCTION(sharding__check_database_nodes) {
    check_database_nodes(text_arg(fcinfo, 0), arg_out(fcinfo, 1, TEXTARRAYOID));
    PG_RETURN_VOID();
}

// _switch_owner(map text, logical integer, node text): bigint, the shard's
// epoch afterwards. Not STRICT: NULL arguments raise 22023.
SHARDING_FUNCTION(sharding__switch_owner) {
    Text epoch = switch_owner(text_arg(fcinfo, 0), int_arg(fcinfo, 1), text_arg(fcinfo, 2));
    if (!epoch) PG_RETURN_NULL();
    PG_RETURN_INT64(std::strtoll(epoch->c_str(), nullptr, 10));
}

// _coordinator_dsn(): text.
SHARDING_FUNCTION(sharding__coordinator_dsn) {
    (void)fcinfo;
    // SEC-4: its password for the engine's own statements (attach_node,
    // take_over), the extension's owner and superusers; masked for others.
    std::string dsn = coordinator_dsn();
    if (!may_use_owner_credentials()) dsn = mask_password(dsn);
    PG_RETURN_DATUM(text_datum(dsn));
}
