// What an online move runs at its data nodes, in C++ (docs/moves.md: no
// PL/pgSQL on the move's path), each behind its SQL name as a thin LANGUAGE
// C wrapper with the SQLSTATEs and messages docs/moves.md lists:
//
//   _freeze_shard(map, logical): waits for the shard's guarded and fenced
//     writers (its exclusive shard lock), then records it frozen, so that
//     from its commit on the guard refuses its keys here until _thaw_shard;
//   _thaw_shard(map, logical): lifts it; whether it was frozen;
//   _install_guard(schema, table, key_column, map): the guard trigger
//     zz_sharding_guard on one distributed table, if it exists here (also
//     called by the triggers that follow sharding.distributed_tables);
//   _install_guards(): every distributed table of a following node.
//
// The guard itself and the local state it reads are guard.cpp's.
#include "pg/spi.hpp"
#include "routing/owner_switch.hpp"

#include <cstdlib>
#include <string>
#include <vector>

namespace sharding::move {

void freeze_shard(const Text &map, const Text &logical) {
    check_logical(map, logical, require_map(map, false));
    lock_shard_exclusive(map, logical);
    spi_value("INSERT INTO sharding.frozen_shards AS f (map, logical) VALUES ($1, $2::integer) ON CONFLICT DO NOTHING",
              {c(map), c(logical)});
}

bool thaw_shard(const Text &map, const Text &logical) {
    return !spi_rows("DELETE FROM sharding.frozen_shards AS f WHERE f.map = $1 AND f.logical = $2::integer RETURNING 1",
                     {c(map), c(logical)})
                .empty();
}

// Never raises once the table is found (it runs inside logical-replication
// apply, which an error would stop): a failure is a WARNING and the table
// stays unguarded. Returns whether it is guarded.
bool install_guard(const Text &schema, const Text &table, const Text &key_column, const Text &map) {
    // The name sorts last, so the guard sees the row as other BEFORE
    // triggers leave it.
    std::vector<Row> rel = spi_rows("SELECT r::pg_catalog.oid::text, r::text FROM "
                                    "pg_catalog.to_regclass(pg_catalog.format('%I.%I', $1, $2)) AS r",
                                    {c(schema), c(table)});
    if (rel.empty() || !rel[0][0]) return false;
    const std::string oid = *rel[0][0], name = must(rel[0][1]);
    Caught err;
    if (subxact(
            [&] {
                if (spi_value("SELECT EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $1::pg_catalog.oid "
                              "AND t.tgname = 'zz_sharding_guard' AND t.tgnargs = 2 "
                              "AND pg_catalog.encode(t.tgargs, 'hex') = "
                              "pg_catalog.encode(pg_catalog.convert_to($2, pg_catalog.getdatabaseencoding()), 'hex') "
                              "|| '00' || pg_catalog.encode(pg_catalog.convert_to($3, "
                              "pg_catalog.getdatabaseencoding()), 'hex') || '00')",
                              {oid.c_str(), c(map), c(key_column)}) == Text("t"))
                    return;
                if (spi_value("SELECT EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $1::pg_catalog.oid "
                              "AND t.tgname = 'zz_sharding_guard')",
                              {oid.c_str()}) == Text("t"))
                    spi_value(("DROP TRIGGER zz_sharding_guard ON " + name).c_str(), {});
                spi_value(("CREATE TRIGGER zz_sharding_guard BEFORE INSERT OR UPDATE OR DELETE ON " + name +
                           " FOR EACH ROW EXECUTE FUNCTION sharding._guard(" + lit(map) + ", " + lit(key_column) + ")")
                              .c_str(),
                          {});
            },
            &err))
        return true;
    if (not_others(err.code)) reraise(err);
    warn("could not guard distributed table " + name + ": " + err.message);
    return false;
}

int32 install_guards() {
    if (spi_value("SELECT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following)", {}) != Text("t")) return 0;
    int32 n = 0;
    for (const Row &d : spi_rows("SELECT d.schema_name, d.table_name, d.key_column, d.map "
                                 "FROM sharding.distributed_tables d ORDER BY d.schema_name, d.table_name",
                                 {}))
        if (install_guard(d[0], d[1], d[2], d[3])) n++;
    return n;
}

}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

// _freeze_shard(map text, logical integer): void. Run it in its own
// transaction (the coordinator does, over its connection to the node): the
// shard's lock is held until commit.
SHARDING_FUNCTION(sharding__freeze_shard) {
    freeze_shard(text_arg(fcinfo, 0), int_arg(fcinfo, 1));
    PG_RETURN_VOID();
}

// _thaw_shard(map text, logical integer): boolean, whether it was frozen.
SHARDING_FUNCTION(sharding__thaw_shard) {
    bool was = thaw_shard(text_arg(fcinfo, 0), int_arg(fcinfo, 1));
    PG_RETURN_BOOL(was);
}

// _install_guard(schema_name text, table_name text, key_column text, map
// text): boolean, whether the table is guarded.
SHARDING_FUNCTION(sharding__install_guard) {
    bool guarded = install_guard(text_arg(fcinfo, 0), text_arg(fcinfo, 1), text_arg(fcinfo, 2), text_arg(fcinfo, 3));
    PG_RETURN_BOOL(guarded);
}

// _install_guards(): integer, how many distributed tables are guarded here
// (0 where this database does not follow a coordinator).
SHARDING_FUNCTION(sharding__install_guards) {
    (void)fcinfo;
    PG_RETURN_INT32(install_guards());
}
