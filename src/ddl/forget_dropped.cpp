// DROP TABLE of a distributed table forgets it (issue 35; docs/ddl.md):
// sharding._ddl_forget_dropped, the sql_drop event trigger
// sharding_ddl_unlist_dropped, removes the dropped table's row from
// sharding.distributed_tables here; the data nodes' copies go with the
// configuration they follow (a follower itself does nothing: its copy is
// the coordinator's to change). Preloaded or not, DROP TABLE, DROP SCHEMA
// ... CASCADE, DROP OWNED. A move of the table's map in flight: the drop
// waits for it, at most lock_timeout, then 55006 naming the move
// (sharding._ddl_wait_for_moves, as the invoker; preloaded, the
// ProcessUtility hook has waited already).
//
// The table's owner, who may drop it, need not be allowed to change
// sharding.distributed_tables: the DELETE of exactly the rows of the
// tables this statement dropped (pg_event_trigger_dropped_objects, which
// exists only inside an sql_drop event) runs as the extension's owner,
// with search_path fixed by the function's SET and every name qualified.
// Not SECURITY DEFINER: nothing else runs with the owner's rights.
//
// Plain C-style glue under pg_call: no C++ object is alive when it ereports.
#include "pg/boundary.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/event_trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
}

namespace {

bool spi_bool(const char *sql) {
    bool out = false;
    if (SPI_execute(sql, false, 1) == SPI_OK_SELECT && SPI_processed == 1) {
        bool isnull;
        Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        out = !isnull && DatumGetBool(d);
    }
    return out;
}

// The row's DELETE as the extension's owner (a function of its own: PG_TRY
// in a loop would clobber its locals).
void delete_as_owner(Oid owner, const char *schema, const char *table, const char *what) {
    Oid save_user;
    int save_sec;
    GetUserIdAndSecContext(&save_user, &save_sec);
    SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
    PG_TRY();
    {
        Oid types[2] = {TEXTOID, TEXTOID};
        Datum vals[2] = {CStringGetTextDatum(schema), CStringGetTextDatum(table)};
        if (SPI_execute_with_args("DELETE FROM sharding.distributed_tables AS t "
                                  "WHERE t.schema_name OPERATOR(pg_catalog.=) $1 "
                                  "AND t.table_name OPERATOR(pg_catalog.=) $2",
                                  2, types, vals, nullptr, false, 0) != SPI_OK_DELETE)
            elog(ERROR, "could not forget distributed table %s", what);
    }
    PG_FINALLY();
    { SetUserIdAndSecContext(save_user, save_sec); }
    PG_END_TRY();
}

void forget_dropped_c() {
    Oid nsp = get_namespace_oid("sharding", true);
    // The extension itself going (DROP SCHEMA sharding CASCADE): nothing to forget.
    if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("distributed_tables", nsp)) ||
        !OidIsValid(get_relname_relid("local_node", nsp)))
        return;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    if (spi_bool("SELECT EXISTS (SELECT FROM sharding.local_node AS l WHERE l.following)")) {
        SPI_finish();
        return;
    }
    if (SPI_execute("SELECT t.schema_name, t.table_name, t.map FROM pg_catalog.pg_event_trigger_dropped_objects() AS o "
                    "JOIN sharding.distributed_tables AS t ON o.object_type OPERATOR(pg_catalog.=) 'table' "
                    "AND NOT o.is_temporary AND t.schema_name OPERATOR(pg_catalog.=) o.schema_name "
                    "AND t.table_name OPERATOR(pg_catalog.=) o.object_name ORDER BY 1, 2",
                    false, 0) != SPI_OK_SELECT)
        elog(ERROR, "could not read the dropped tables");
    const uint64 n = SPI_processed;
    if (n == 0) {
        SPI_finish();
        return;
    }
    // Copied out before the next statements (SPI's memory, until SPI_finish).
    char **cells = static_cast<char **>(palloc(sizeof(char *) * 3 * n));
    for (uint64 i = 0; i < n; i++)
        for (int c = 0; c < 3; c++) cells[i * 3 + c] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c + 1);
    Oid owner = InvalidOid;
    for (uint64 i = 0; i < n; i++) {
        char *schema = cells[i * 3], *table = cells[i * 3 + 1], *map = cells[i * 3 + 2];
        char *what = psprintf("DROP TABLE of distributed table %s", quote_qualified_identifier(schema, table));
        Oid wtypes[2] = {TEXTOID, TEXTOID};
        Datum wvals[2] = {CStringGetTextDatum(map), CStringGetTextDatum(what)};
        (void)SPI_execute_with_args("SELECT sharding._ddl_wait_for_moves($1, $2)", 2, wtypes, wvals, nullptr, false, 0);
        if (!OidIsValid(owner)) {
            if (SPI_execute("SELECT e.extowner FROM pg_catalog.pg_extension AS e "
                            "WHERE e.extname OPERATOR(pg_catalog.=) 'sharding'",
                            false, 1) == SPI_OK_SELECT &&
                SPI_processed == 1) {
                bool isnull;
                Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
                if (!isnull) owner = DatumGetObjectId(d);
            }
            if (!OidIsValid(owner)) elog(ERROR, "the extension sharding has no owner");
        }
        delete_as_owner(owner, schema, table, what);
    }
    SPI_finish();
}

}  // namespace

// _ddl_forget_dropped(): the sql_drop event trigger.
SHARDING_FUNCTION(sharding__ddl_forget_dropped) {
    if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
        sharding::fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "not fired by an event trigger");
    sharding::glue(forget_dropped_c);
    PG_RETURN_VOID();
}
