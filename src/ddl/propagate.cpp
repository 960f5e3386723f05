// Propagated DDL (docs/ddl.md, CONTRACT 15.4): with the library preloaded,
// a ProcessUtility hook runs the DDL of a distributed table on every
// attached data node inside the coordinator's two-phase transaction
// (two_phase.cpp); without it, an event trigger refuses such DDL on a
// coordinator rather than let it change the coordinator alone.
//
// What propagates: ALTER TABLE, CREATE INDEX, DROP INDEX, ALTER INDEX,
// CREATE TRIGGER, DROP TRIGGER, COMMENT, DROP TABLE, and the renames of a
// column, constraint, trigger or index (ALTER TABLE ... RENAME), of a table
// in sharding.distributed_tables, where this database has attached data
// nodes and sharding.propagate_ddl is on. The text sent is the statement's
// own (its location and length in a query string of several), run there as
// the same role with the coordinator's search_path spelled out as schema
// names, so its names resolve there as here. Statements that cannot run in
// a transaction block (CREATE INDEX CONCURRENTLY, DROP INDEX CONCURRENTLY)
// run here, then on one node after another, with a NOTICE.
#include "ddl/ddl.hpp"

#include <cstring>

extern "C" {
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
}

namespace sharding {
namespace {

ProcessUtility_hook_type prev_utility = nullptr;

char *table_label(Oid rel);

// What a statement does to a distributed table: the table (InvalidOid:
// nothing to propagate), whether it cannot run in a transaction block.
struct Target {
    Oid table;
    bool concurrent;
};

Oid relation_of(RangeVar *rv) { return rv ? RangeVarGetRelid(rv, NoLock, true) : InvalidOid; }

// An index's table, or rel itself.
Oid table_of(Oid rel) {
    if (!OidIsValid(rel)) return InvalidOid;
    if (get_rel_relkind(rel) == RELKIND_INDEX || get_rel_relkind(rel) == RELKIND_PARTITIONED_INDEX)
        return IndexGetRelation(rel, true);
    return rel;
}

// A qualified name list minus its last `drop` names, as a relation.
Oid relation_of_names(List *names, int drop) {
    if (names == nullptr || list_length(names) <= drop) return InvalidOid;
    List *rel = list_copy_head(names, list_length(names) - drop);
    return relation_of(makeRangeVarFromNameList(rel));
}

// Glue: whether rel is in sharding.distributed_tables; its map into *map.
bool distributed_c(Oid rel, char **map) {
    *map = nullptr;
    if (!OidIsValid(rel)) return false;
    char *nsp = get_namespace_name(get_rel_namespace(rel));
    char *name = get_rel_name(rel);
    if (nsp == nullptr || name == nullptr) return false;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[2] = {TEXTOID, TEXTOID};
    Datum vals[2] = {CStringGetTextDatum(nsp), CStringGetTextDatum(name)};
    int rc = SPI_execute_with_args(
        "SELECT d.map FROM sharding.distributed_tables AS d WHERE d.schema_name = $1 AND d.table_name = $2", 2, types,
        vals, nullptr, true, 1);
    bool found = rc == SPI_OK_SELECT && SPI_processed == 1;
    if (found)
        *map = MemoryContextStrdup(CurTransactionContext,
                                   SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1));
    SPI_finish();
    return found;
}

// Glue: which table a statement changes (one distributed table is enough:
// the statement runs on the nodes as a whole).
Target classify(Node *stmt) {
    Target t{InvalidOid, false};
    switch (nodeTag(stmt)) {
    case T_AlterTableStmt: {
        auto *s = reinterpret_cast<AlterTableStmt *>(stmt);
        if (s->objtype == OBJECT_TABLE || s->objtype == OBJECT_INDEX) t.table = table_of(relation_of(s->relation));
        break;
    }
    case T_IndexStmt: {
        auto *s = reinterpret_cast<IndexStmt *>(stmt);
        t.table = relation_of(s->relation);
        t.concurrent = s->concurrent;
        break;
    }
    case T_CreateTrigStmt:
        t.table = relation_of(reinterpret_cast<CreateTrigStmt *>(stmt)->relation);
        break;
    case T_DropStmt: {
        auto *s = reinterpret_cast<DropStmt *>(stmt);
        if (s->removeType != OBJECT_TABLE && s->removeType != OBJECT_INDEX && s->removeType != OBJECT_TRIGGER) break;
        t.concurrent = s->concurrent;
        ListCell *lc;
        foreach (lc, s->objects) {
            List *names = static_cast<List *>(lfirst(lc));
            Oid rel = s->removeType == OBJECT_TRIGGER ? relation_of_names(names, 1) : table_of(relation_of_names(names, 0));
            char *map;
            if (distributed_c(rel, &map)) {
                t.table = rel;
                break;
            }
        }
        break;
    }
    case T_CommentStmt: {
        auto *s = reinterpret_cast<CommentStmt *>(stmt);
        if (!IsA(s->object, List)) break;
        List *names = castNode(List, s->object);
        if (s->objtype == OBJECT_TABLE || s->objtype == OBJECT_INDEX)
            t.table = table_of(relation_of_names(names, 0));
        else if (s->objtype == OBJECT_COLUMN || s->objtype == OBJECT_TRIGGER || s->objtype == OBJECT_TABCONSTRAINT)
            t.table = relation_of_names(names, 1);
        break;
    }
    case T_RenameStmt: {
        auto *s = reinterpret_cast<RenameStmt *>(stmt);
        if (s->renameType == OBJECT_COLUMN || s->renameType == OBJECT_TABCONSTRAINT ||
            s->renameType == OBJECT_TRIGGER)
            t.table = relation_of(s->relation);
        else if (s->renameType == OBJECT_INDEX)
            t.table = table_of(relation_of(s->relation));
        break;
    }
    default:
        break;
    }
    return t;
}

// Glue: a distributed table is known by its schema and name (its map's
// sharding.distributed_tables row, the nodes' copies of it, PL/Proxy's
// cluster_partitions): renaming it or moving it to another schema would
// leave the map naming a table that no longer exists, here and on every
// node. Refused (0A000) whatever sharding.propagate_ddl says; the way to do
// it is in the hint. Nothing else of the statement has run yet.
void refuse_rename_c(Node *stmt) {
    RangeVar *rv = nullptr;
    const char *what = nullptr;
    if (IsA(stmt, RenameStmt)) {
        auto *s = reinterpret_cast<RenameStmt *>(stmt);
        if (s->renameType == OBJECT_TABLE) {
            rv = s->relation;
            what = "renamed";
        }
    } else if (IsA(stmt, AlterObjectSchemaStmt)) {
        auto *s = reinterpret_cast<AlterObjectSchemaStmt *>(stmt);
        if (s->objectType == OBJECT_TABLE) {
            rv = s->relation;
            what = "moved to another schema";
        }
    }
    if (rv == nullptr) return;
    char *map;
    Oid rel = relation_of(rv);
    if (!distributed_c(rel, &map)) return;
    ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                    errmsg("distributed table %s cannot be %s", table_label(rel), what),
                    errdetail("Map \"%s\" knows its tables by schema and name, here and on every data node.", map),
                    errhint("Undistribute it (sharding.undistribute), change it here and on every node "
                            "(sharding.run_on_nodes), then distribute it again.")));
}

// Glue: the first index of a DROP INDEX whose table is distributed (while
// the index still exists: the sql_drop event no longer knows its table);
// InvalidOid if none.
Oid dropped_index_table_c(Node *stmt) {
    if (!IsA(stmt, DropStmt)) return InvalidOid;
    auto *s = reinterpret_cast<DropStmt *>(stmt);
    if (s->removeType != OBJECT_INDEX) return InvalidOid;
    ListCell *lc;
    foreach (lc, s->objects) {
        Oid rel = table_of(relation_of_names(static_cast<List *>(lfirst(lc)), 0));
        char *map;
        if (distributed_c(rel, &map)) return rel;
    }
    return InvalidOid;
}

// Glue: SET LOCAL search_path spelling out this session's schemas, so that
// the statement's names resolve on the nodes as they do here.
char *search_path_setting() {
    List *path = fetch_search_path(false);
    StringInfoData buf;
    initStringInfo(&buf);
    appendStringInfoString(&buf, "SET LOCAL search_path = ");
    bool first = true;
    ListCell *lc;
    foreach (lc, path) {
        char *name = get_namespace_name(lfirst_oid(lc));
        if (name == nullptr) continue;
        if (!first) appendStringInfoString(&buf, ", ");
        appendStringInfoString(&buf, quote_identifier(name));
        first = false;
    }
    if (first) appendStringInfoString(&buf, "pg_catalog");
    return buf.data;
}

// Glue: waits for the moves of map in flight (at most lock_timeout), then
// 55006 naming the move (sharding._ddl_wait_for_moves).
void refuse_during_move(const char *map, const char *what) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[2] = {TEXTOID, TEXTOID};
    Datum vals[2] = {CStringGetTextDatum(map), CStringGetTextDatum(what)};
    (void)SPI_execute_with_args("SELECT sharding._ddl_wait_for_moves($1, $2)", 2, types, vals, nullptr, false, 0);
    SPI_finish();
}

// The extension in this database at version 1.4 or later (its record of
// two-phase transactions exists): older versions' databases run DDL as
// they did.
bool extension_here() {
    if (!OidIsValid(get_extension_oid("sharding", true))) return false;
    Oid nsp = get_namespace_oid("sharding", true);
    return OidIsValid(nsp) && OidIsValid(get_relname_relid("node_transactions", nsp)) &&
           OidIsValid(get_relname_relid("distributed_tables", nsp));
}

char *table_label(Oid rel) {
    return quote_qualified_identifier(get_namespace_name(get_rel_namespace(rel)), get_rel_name(rel));
}

void call_next(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree, ProcessUtilityContext context,
               ParamListInfo params, QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc) {
    if (prev_utility)
        prev_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
    else
        standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
}

// The part of the hook in C++ (propagation); the local statement runs in
// between (run_local).
struct Plan {
    std::vector<std::string> nodes;
    std::string text;
    std::string path;
    bool concurrent;
};

void open_all(const Plan &p) {
    if (!p.concurrent)
        for (const auto &n : p.nodes) ddl_open(n);
}

void run_remote(const Plan &p) {
    if (p.concurrent) {
        ereport(NOTICE, (errmsg("the statement cannot run in a transaction block: it runs on %zu nodes one after "
                                "another, not atomically",
                                p.nodes.size())));
        std::string set = p.path.substr(std::strlen("SET LOCAL "));
        for (const auto &n : p.nodes) (void)ddl_run_alone(n, "SET " + set, p.text);
        return;
    }
    (void)ddl_run_on_all(p.nodes, p.path + ";\n" + p.text);
}

void ddl_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree, ProcessUtilityContext context,
                 ParamListInfo params, QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc) {
    Node *stmt = pstmt->utilityStmt;
    NodeTag tag = nodeTag(stmt);
    if ((tag == T_RenameStmt || tag == T_AlterObjectSchemaStmt) && !creating_extension && !IsBinaryUpgrade &&
        IsTransactionState() && extension_here())
        refuse_rename_c(stmt);
    bool candidate = ddl_propagate && !creating_extension && !IsBinaryUpgrade &&
                     (context == PROCESS_UTILITY_TOPLEVEL || context == PROCESS_UTILITY_QUERY) &&
                     (tag == T_AlterTableStmt || tag == T_IndexStmt || tag == T_CreateTrigStmt ||
                      tag == T_DropStmt || tag == T_CommentStmt || tag == T_RenameStmt) &&
                     queryString != nullptr && IsTransactionState() && !RecoveryInProgress() && extension_here();
    if (!candidate) {
        call_next(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
        return;
    }
    Target t = classify(stmt);
    char *map = nullptr;
    if (!distributed_c(t.table, &map)) {
        call_next(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
        return;
    }
    // Plan (C++), checks on every node before anything runs; the local
    // statement; then the nodes. Errors of the C++ parts are raised once
    // their frames are gone.
    Plan *plan = nullptr;
    try {
        // A move of the map in flight: wait for it (DDL and moves never
        // break each other), wherever the table's rows are.
        char *label = glue(table_label, t.table);
        std::string what = std::string("DDL of distributed table ") + label;
        glue(refuse_during_move, (const char *)map, what.c_str());
        std::vector<std::string> nodes = ddl_attached_nodes();
        if (!nodes.empty()) {
            plan = new Plan();
            plan->nodes = std::move(nodes);
            int loc = pstmt->stmt_location < 0 ? 0 : pstmt->stmt_location;
            int len = pstmt->stmt_len;
            plan->text = len > 0 ? std::string(queryString + loc, len) : std::string(queryString + loc);
            plan->concurrent = t.concurrent;
            plan->path = ddl_search_path_setting();
            open_all(*plan);
        }
    } catch (...) {
        delete plan;
        plan = nullptr;
        detail::capture_current_exception();
        detail::raise_captured();
    }
    if (plan == nullptr) {
        call_next(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
        return;
    }
    PG_TRY();
    { call_next(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc); }
    PG_CATCH();
    {
        delete plan;
        PG_RE_THROW();
    }
    PG_END_TRY();
    bool failed = false;
    try {
        run_remote(*plan);
    } catch (...) {
        failed = true;
        detail::capture_current_exception();
    }
    delete plan;
    if (failed) detail::raise_captured();
}

}  // namespace

std::string ddl_search_path_setting() {
    char *s = glue(search_path_setting);
    std::string out(s);
    return out;
}

void ddl_init() {
    DefineCustomBoolVariable("sharding.propagate_ddl",
                             "Runs DDL of a distributed table on every attached data node in the same transaction.",
                             "On a coordinator with the library preloaded (docs/ddl.md); off: the statement changes "
                             "this database only.",
                             &ddl_propagate, true, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomStringVariable("sharding.ddl_fault",
                               "Test only: holds a two-phase transaction on nodes at a phase while a file exists.",
                               "'prepared:<file>' or 'commit:<file>' (docs/ddl.md); empty in production.",
                               &ddl_fault, "", PGC_SUSET, GUC_NOT_IN_SAMPLE, nullptr, nullptr, nullptr);
    if (!process_shared_preload_libraries_in_progress) return;
    prev_utility = ProcessUtility_hook;
    ProcessUtility_hook = ddl_utility;
    ddl_hook_installed = true;
}

}  // namespace sharding

using namespace sharding;

namespace {
// Glue: the first distributed table the event's objects touch ("" none).
char *touched_c(bool drop) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    const char *sql =
        drop ? "SELECT pg_catalog.format('%I.%I', d.schema_name, d.table_name) "
               "FROM pg_catalog.pg_event_trigger_dropped_objects() AS o JOIN sharding.distributed_tables AS d "
               "ON (o.object_type = 'table' AND d.schema_name = o.schema_name AND d.table_name = o.object_name) "
               "OR (o.object_type = 'trigger' AND d.schema_name = o.address_names[1] "
               "AND d.table_name = o.address_names[2]) LIMIT 1"
             : "SELECT pg_catalog.format('%I.%I', d.schema_name, d.table_name) "
               "FROM pg_catalog.pg_event_trigger_ddl_commands() AS c JOIN pg_catalog.pg_class AS r ON r.oid = "
               "CASE c.classid WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN coalesce((SELECT i.indrelid "
               "FROM pg_catalog.pg_index AS i WHERE i.indexrelid = c.objid), c.objid) "
               "WHEN 'pg_catalog.pg_trigger'::pg_catalog.regclass THEN (SELECT t.tgrelid FROM "
               "pg_catalog.pg_trigger AS t WHERE t.oid = c.objid) END "
               "JOIN pg_catalog.pg_namespace AS n ON n.oid = r.relnamespace "
               "JOIN sharding.distributed_tables AS d ON d.schema_name = n.nspname AND d.table_name = r.relname "
               "LIMIT 1";
    char *out = pstrdup("");
    // Not read-only: a fresh snapshot sees the catalog rows the command made.
    if (SPI_execute(sql, false, 1) == SPI_OK_SELECT && SPI_processed == 1) {
        char *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
        if (v) out = MemoryContextStrdup(CurTransactionContext, v);
    }
    SPI_finish();
    return out;
}
}  // namespace

// _ddl_refuse(): event trigger (ddl_command_end, sql_drop). Refuses, on a
// coordinator without the library preloaded, DDL of a distributed table.
SHARDING_FUNCTION(sharding__ddl_refuse) {
    if (!CALLED_AS_EVENT_TRIGGER(fcinfo)) fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "not fired by an event trigger");
    // Preloaded: the hook propagates. sharding.propagate_ddl = off: the
    // statement is meant for this database only.
    if (ddl_hook_installed || !ddl_propagate) PG_RETURN_VOID();
    auto *ev = reinterpret_cast<EventTriggerData *>(fcinfo->context);
    bool drop = std::strcmp(ev->event, "sql_drop") == 0;
    if (ddl_attached_nodes().empty()) PG_RETURN_VOID();
    char *table = glue(touched_c, drop);
    if (table[0] == '\0') PG_RETURN_VOID();
    fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
         Explain{"This database is a coordinator with attached data nodes; the statement would change it alone.",
                 "Preload the library (shared_preload_libraries = 'sharding') so that DDL of distributed tables runs "
                 "on every node, or run it with sharding.run_on_nodes()."},
         "DDL of distributed table %s is not propagated to the nodes without the library preloaded", table);
}

// _ddl_refuse_start(): event trigger (ddl_command_start of ALTER TABLE and
// DROP INDEX), with or without the library preloaded: renaming a
// distributed table or moving it to another schema is refused (0A000); and,
// without the hook, DROP INDEX of a distributed table's index (55000, as
// _ddl_refuse: at sql_drop the index's table is no longer known).
SHARDING_FUNCTION(sharding__ddl_refuse_start) {
    if (!CALLED_AS_EVENT_TRIGGER(fcinfo)) fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "not fired by an event trigger");
    auto *ev = reinterpret_cast<EventTriggerData *>(fcinfo->context);
    glue(refuse_rename_c, ev->parsetree);
    if (ddl_hook_installed || !ddl_propagate) PG_RETURN_VOID();
    Oid rel = glue(dropped_index_table_c, ev->parsetree);
    if (!OidIsValid(rel) || ddl_attached_nodes().empty()) PG_RETURN_VOID();
    char *table = glue(table_label, rel);
    fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
         Explain{"This database is a coordinator with attached data nodes; the statement would change it alone.",
                 "Preload the library (shared_preload_libraries = 'sharding') so that DDL of distributed tables runs "
                 "on every node, or run it with sharding.run_on_nodes()."},
         "DDL of distributed table %s is not propagated to the nodes without the library preloaded", table);
}
