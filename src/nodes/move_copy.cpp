// The move engine's copy and slot (docs/moves.md).
//
// _move_slot_create(source, slot, plugin): on the coordinator, opens a
//   logical replication connection to the source and creates the move's
//   slot there with an exported snapshot (CREATE_REPLICATION_SLOT ...
//   LOGICAL ... (SNAPSHOT 'export')). The connection stays open, idle, so
//   the snapshot stays importable, until _move_slot_close(slot) or the end
//   of the transaction. Every change committed after that snapshot is in the
//   slot's stream, every change before it in the copy: they never overlap.
//
// _move_pull(source, snapshot, rel, columns, query): on the destination,
//   pulls COPY (query) TO STDOUT from the source under the exported
//   snapshot and feeds it into `rel` through BeginCopyFrom with a data
//   source callback (as file_fdw feeds a file). Binary where every column's
//   type is built in and has binary I/O, else text. No program, no shell:
//   the source's connection string is read from this node's sharding.nodes,
//   so it appears in no statement, command line or process title.
#include "nodes/move_remote.hpp"

#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "access/table.h"
#include "access/transam.h"
#include "catalog/pg_type.h"
#include "commands/copy.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_node.h"
#include "parser/parse_relation.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
}

namespace sharding::move {

namespace {

std::string quote_literal(const std::string &v) {
    std::string out = "'";
    for (char c : v) {
        if (c == '\'') out += '\'';
        out += c;
    }
    return out + "'";
}

bool valid_slot_name(const std::string &s) {
    if (s.empty() || s.size() > 63) return false;
    for (char c : s)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
    return true;
}

// ---------------------------------------------------------------- the pull
// The data source callback of BeginCopyFrom has no argument: the copy in
// progress is here. Plain C state; the callback holds no C++ object, so an
// ERROR raised in it (a cancel) jumps to the pg_call around CopyFrom.
struct PullState {
    Remote *remote;
    const char *data;
    int len;
    int off;
    bool done;
    uint64 bytes;
};
PullState pull;

char pull_error[512];

// 1: a chunk, 0: the end, 2: none has arrived yet (only when !may_wait),
// negative: an error.
int read_chunk(Remote *r, const char **data, int *len, bool may_wait) {
    // C++ (Remote::read_copy) inside the callback: exceptions must not
    // cross PostgreSQL's C frames, so they are turned into an ERROR by the
    // caller, once no C++ object is alive.
    char *msg = pull_error;
    int code = 0;
    try {
        int rc = r->next_copy(data, len, may_wait);
        return rc < 0 ? 2 : rc;
    } catch (const Error &e) {
        code = e.sqlstate();
        strlcpy(msg, e.what(), sizeof pull_error);
    } catch (const std::exception &e) {
        code = ERRCODE_INTERNAL_ERROR;
        strlcpy(msg, e.what(), sizeof pull_error);
    } catch (...) {
        code = ERRCODE_INTERNAL_ERROR;
        strlcpy(msg, "unknown error", sizeof pull_error);
    }
    return -code - 1;  // negative: an error, reported by the caller (no C++ object alive there)
}

// Fills CopyFrom's buffer with every row that has already arrived (the
// source sends one CopyData message per row: one row per call would cost a
// call of the parser's buffer refill per row); waits only while it has
// nothing to give.
int pull_source(void *outbuf, int minread, int maxread) {
    (void)minread;
    int copied = 0;
    while (copied < maxread) {
        if (pull.off >= pull.len) {
            if (pull.done) break;
            const char *d = nullptr;
            int l = 0;
            int rc = read_chunk(pull.remote, &d, &l, copied == 0);
            if (rc < 0) ereport(ERROR, (errcode(-rc - 1), errmsg("copying from the source failed: %s", pull_error)));
            if (rc == 2) break;  // nothing more yet: give CopyFrom what it has
            CHECK_FOR_INTERRUPTS();
            if (rc == 0) {
                pull.done = true;
                break;
            }
            pull.data = d;
            pull.len = l;
            pull.off = 0;
            pull.bytes += l;
        }
        int n = pull.len - pull.off;
        if (n > maxread - copied) n = maxread - copied;
        memcpy(static_cast<char *>(outbuf) + copied, pull.data + pull.off, n);
        pull.off += n;
        copied += n;
    }
    return copied;
}

// Whether every column named can travel in binary: built-in types with
// binary input and output (the same at both ends of one major version).
bool binary_ok(Relation rel, ArrayType *cols) {
    Datum *names;
    bool *nulls;
    int n;
    deconstruct_array(cols, TEXTOID, -1, false, TYPALIGN_INT, &names, &nulls, &n);
    for (int i = 0; i < n; i++) {
        if (nulls[i]) return false;
        char *name = TextDatumGetCString(names[i]);
        AttrNumber a = get_attnum(RelationGetRelid(rel), name);
        if (a == InvalidAttrNumber) return false;
        Oid t = TupleDescAttr(RelationGetDescr(rel), a - 1)->atttypid;
        Oid elem = get_element_type(t);
        Oid base = OidIsValid(elem) ? elem : t;
        if (base >= FirstNormalObjectId) return false;
        HeapTuple tp = SearchSysCache1(TYPEOID, ObjectIdGetDatum(base));
        if (!HeapTupleIsValid(tp)) return false;
        Form_pg_type ty = (Form_pg_type)GETSTRUCT(tp);
        bool ok = OidIsValid(ty->typreceive) && OidIsValid(ty->typsend) && ty->typtype == TYPTYPE_BASE;
        ReleaseSysCache(tp);
        if (!ok) return false;
    }
    return true;
}

struct Opened {
    Relation rel;
    bool binary;
};

Opened open_target(Oid relid, ArrayType *cols) {
    Relation rel = table_open(relid, RowExclusiveLock);
    AclResult acl = pg_class_aclcheck(relid, GetUserId(), ACL_INSERT);
    if (acl != ACLCHECK_OK) aclcheck_error(acl, OBJECT_TABLE, RelationGetRelationName(rel));
    return Opened{rel, binary_ok(rel, cols)};
}

// COPY FROM inserts one row at a time (no multi-insert batching) into a
// table with any BEFORE ROW INSERT trigger, even one that cannot fire: the
// guard's trigger zz_sharding_guard is one during the copy, which runs
// under session_replication_role = replica (set by the orchestration), where
// triggers enabled 'O' (the default) or 'D' never fire. For the time of
// CopyFrom, this backend's relcache entry of the target carries a copy of
// its triggers without those (TriggerEnabled in trigger.c decides the same
// way per row), so CopyFrom batches as into a table without triggers. Only
// this backend, only this statement, only triggers that would not have run:
// the guard still refuses every other session's writes, and every trigger
// that fires in replica mode (ENABLE REPLICA / ALWAYS) is kept and runs.
bool fires_in_replica(const Trigger *t) {
    return t->tgenabled == TRIGGER_FIRES_ALWAYS || t->tgenabled == TRIGGER_FIRES_ON_REPLICA;
}

void free_trigger_fields(Trigger *t) {
    pfree(t->tgname);
    if (t->tgnattr > 0) pfree(t->tgattr);
    if (t->tgnargs > 0) {
        for (int i = 0; i < t->tgnargs; i++) pfree(t->tgargs[i]);
        pfree(t->tgargs);
    }
    if (t->tgqual) pfree(t->tgqual);
    if (t->tgoldtable) pfree(t->tgoldtable);
    if (t->tgnewtable) pfree(t->tgnewtable);
}

// The triggers of rel that can run during the copy (in CacheMemoryContext,
// as relcache owns it while it is installed), or NULL when none is left
// out (nothing to gain). *none: no trigger is left at all.
TriggerDesc *copy_triggers(Relation rel, bool *none) {
    *none = false;
    TriggerDesc *orig = rel->trigdesc;
    if (SessionReplicationRole != SESSION_REPLICATION_ROLE_REPLICA || orig == nullptr ||
        rel->rd_rel->relkind != RELKIND_RELATION || !orig->trig_insert_before_row)
        return nullptr;
    bool drop_any = false;
    for (int i = 0; i < orig->numtriggers; i++) {
        const Trigger *t = &orig->triggers[i];
        if (TRIGGER_FOR_ROW(t->tgtype) && TRIGGER_FOR_BEFORE(t->tgtype) && TRIGGER_FOR_INSERT(t->tgtype)) {
            if (fires_in_replica(t)) return nullptr;  // a BEFORE ROW trigger runs: CopyFrom cannot batch anyway
            drop_any = true;
        }
    }
    if (!drop_any) return nullptr;
    MemoryContext old = MemoryContextSwitchTo(CacheMemoryContext);
    TriggerDesc *td = CopyTriggerDesc(orig);
    MemoryContextSwitchTo(old);
    int kept = 0;
    for (int i = 0; i < td->numtriggers; i++) {
        Trigger *t = &td->triggers[i];
        if (TRIGGER_FOR_ROW(t->tgtype) && TRIGGER_FOR_BEFORE(t->tgtype) && TRIGGER_FOR_INSERT(t->tgtype)) {
            free_trigger_fields(t);
            continue;
        }
        if (kept != i) td->triggers[kept] = *t;
        kept++;
    }
    td->numtriggers = kept;
    td->trig_insert_before_row = false;  // every one left out; the other flags only say where to look
    if (kept == 0) {
        pfree(td->triggers);
        pfree(td);
        *none = true;
        return nullptr;
    }
    return td;
}

uint64 copy_from(Relation rel, ParseState *pstate, List *attnames, List *options) {
    CopyFromState cstate = BeginCopyFrom(pstate, rel, NULL, NULL, false, pull_source, attnames, options);
    uint64 rows = CopyFrom(cstate);
    EndCopyFrom(cstate);
    return rows;
}

// Installed for CopyFrom only (its executor state copies the triggers when
// it starts), put back on every exit. A relcache rebuild of rel meanwhile
// (an invalidation) replaces and frees the copy: then the entry holds the
// catalog's triggers again and the saved original is this function's to free.
void put_back(Relation rel, TriggerDesc *orig, TriggerDesc *batched) {
    if (rel->trigdesc == batched) {
        rel->trigdesc = orig;
        if (batched != nullptr) FreeTriggerDesc(batched);
    } else {
        FreeTriggerDesc(orig);
    }
}

uint64 copy_batched(Relation rel, ParseState *pstate, List *attnames, List *options, TriggerDesc *batched) {
    TriggerDesc *orig = rel->trigdesc;
    uint64 rows = 0;
    rel->trigdesc = batched;
    PG_TRY();
    {
        rows = copy_from(rel, pstate, attnames, options);
    }
    PG_CATCH();
    {
        put_back(rel, orig, batched);
        PG_RE_THROW();
    }
    PG_END_TRY();
    put_back(rel, orig, batched);
    return rows;
}

uint64 copy_into(Relation rel, ArrayType *cols, bool binary) {
    List *attnames = NIL;
    Datum *names;
    bool *nulls;
    int n;
    deconstruct_array(cols, TEXTOID, -1, false, TYPALIGN_INT, &names, &nulls, &n);
    for (int i = 0; i < n; i++) attnames = lappend(attnames, makeString(TextDatumGetCString(names[i])));
    List *options = list_make1(makeDefElem(pstrdup("format"), (Node *)makeString(pstrdup(binary ? "binary" : "text")), -1));
    if (!binary)
        options = lappend(options, makeDefElem(pstrdup("encoding"),
                                               (Node *)makeString(pstrdup(GetDatabaseEncodingName())), -1));
    // CopyFrom's executor state inserts through range table entry 1.
    ParseState *pstate = make_parsestate(NULL);
    (void)addRangeTableEntryForRelation(pstate, rel, RowExclusiveLock, NULL, false, false);
    bool none = false;
    TriggerDesc *batched = copy_triggers(rel, &none);
    if (batched == nullptr && !none) {
        uint64 rows = copy_from(rel, pstate, attnames, options);
        free_parsestate(pstate);
        return rows;
    }
    uint64 rows = copy_batched(rel, pstate, attnames, options, batched);
    free_parsestate(pstate);
    return rows;
}

void close_target(Relation rel) { table_close(rel, NoLock); }

}  // namespace

}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

// _move_pull(source text, snapshot text, rel regclass, columns text[], query text) RETURNS bigint[]
// {rows, bytes}
SHARDING_FUNCTION(sharding__move_pull) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(2) || PG_ARGISNULL(3) || PG_ARGISNULL(4))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "source, rel, columns and query must not be NULL");
    std::string source = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(0)); });
    std::string snapshot =
        PG_ARGISNULL(1) ? std::string() : pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(1)); });
    Oid relid = PG_GETARG_OID(2);
    ArrayType *cols = pg_call([&]() -> ArrayType * { return PG_GETARG_ARRAYTYPE_P(3); });
    std::string query = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(4)); });

    std::string dsn = node_dsn(source);
    const char *appname = pg_call([]() -> const char * { return GetConfigOption("application_name", true, false); });
    Remote remote(dsn, false, std::string(appname ? appname : "sharding") + "_copy");
    Opened target = pg_call([&]() -> Opened { return open_target(relid, cols); });
    uint64 rows = 0;
    try {
        remote.run("SET search_path = pg_catalog, pg_temp");
        remote.run(std::string("SET client_encoding = ") +
                   quote_literal(pg_call([]() -> const char * { return GetDatabaseEncodingName(); })));
        remote.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
        if (!snapshot.empty()) remote.run("SET TRANSACTION SNAPSHOT " + quote_literal(snapshot));
        remote.start_copy_out("COPY (" + query + ") TO STDOUT" + (target.binary ? " (FORMAT binary)" : ""));
        pull = PullState{&remote, nullptr, 0, 0, false, 0};
        rows = pg_call([&]() -> uint64 { return copy_into(target.rel, cols, target.binary); });
        pull.remote = nullptr;
        remote.run("COMMIT");
    } catch (...) {
        pull.remote = nullptr;
        remote.cancel();
        throw;  // the relation is closed by the abort
    }
    uint64 bytes = pull.bytes;
    glue(close_target, target.rel);
    Datum out[2] = {Int64GetDatum((int64)rows), Int64GetDatum((int64)bytes)};
    ArrayType *arr = pg_call([&]() -> ArrayType * { return construct_array(out, 2, INT8OID, 8, true, TYPALIGN_DOUBLE); });
    PG_RETURN_ARRAYTYPE_P(arr);
}

// _move_slot_create(source text, slot text, plugin text, options text, OUT lsn pg_lsn, OUT snapshot text)
// options: server settings for the replication session (e.g. the
// source's output_plugin_libraries plus "sharding"), or NULL.
SHARDING_FUNCTION(sharding__move_slot_create) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "source, slot and plugin must not be NULL");
    std::string source = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(0)); });
    std::string slot = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(1)); });
    std::string plugin = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(2)); });
    std::string options =
        PG_ARGISNULL(3) ? std::string() : pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(3)); });
    if (!valid_slot_name(slot) || !valid_slot_name(plugin))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "slot and plugin names must be [a-z0-9_]{1,63}");
    std::string dsn = node_dsn(source);
    auto remote = std::make_unique<Remote>(dsn, true, slot + "_slot", options);
    PGresult *res = nullptr;
    remote->run("CREATE_REPLICATION_SLOT " + slot + " LOGICAL " + plugin + " (SNAPSHOT 'export')", &res);
    if (res == nullptr || PQntuples(res) != 1 || PQnfields(res) < 3) {
        if (res) PQclear(res);
        fail(ERRCODE_PROTOCOL_VIOLATION, "unexpected answer to CREATE_REPLICATION_SLOT");
    }
    std::string lsn = PQgetvalue(res, 0, 1);
    std::string snap = PQgetisnull(res, 0, 2) ? std::string() : PQgetvalue(res, 0, 2);
    PQclear(res);
    hold_connection(slot, remote->release());

    TupleDesc desc;
    if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
        fail(ERRCODE_FEATURE_NOT_SUPPORTED, "_move_slot_create must return a record");
    const char *l = lsn.c_str();
    const char *s = snap.c_str();
    HeapTuple t = pg_call([&]() -> HeapTuple {
        Datum vals[2] = {DirectFunctionCall1(pg_lsn_in, CStringGetDatum(l)), CStringGetTextDatum(s)};
        bool nulls[2] = {false, false};
        return heap_form_tuple(BlessTupleDesc(desc), vals, nulls);
    });
    return HeapTupleGetDatum(t);
}

// _move_slot_close(slot text) RETURNS boolean: lets go of the exported
// snapshot (closes the replication connection); false if none was held.
SHARDING_FUNCTION(sharding__move_slot_close) {
    if (PG_ARGISNULL(0)) PG_RETURN_BOOL(false);
    std::string slot = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(0)); });
    bool found = close_held(slot);
    PG_RETURN_BOOL(found);
}
