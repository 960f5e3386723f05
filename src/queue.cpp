// Section 3 of the contract: claiming work with FOR UPDATE SKIP LOCKED,
// leases, and fenced completion.
//
// Every queue statement is prepared once per backend per (queue table,
// statement kind) and kept (SPI_keepplan). The plans live in a hash table
// keyed by the table's oid; a relcache callback marks an entry stale when
// its table changes (ALTER TABLE, DROP, new index, or a changed row in
// sharding.queue_settings, whose trigger sends the table's relcache
// invalidation), and the next call rebuilds it completely.
//
// Boundary (boundary.hpp, rule 2): this file keeps no owning C++ object on
// the stack anywhere. SQL text is built in StringInfo (palloc), so SPI and
// catalog calls are made directly; user errors are thrown with
// sharding::fail, whose exception owns its message only while unwinding.
#include "boundary.hpp"
#include "keys.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tstoreReceiver.h"
#include "lib/stringinfo.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/typcache.h"
}

namespace sharding {
void queue_init();
}

namespace {

// The statements a queue needs. Each is prepared on first use.
enum PlanKind {
    ClaimPlan,
    CompletePlan,
    CompleteAttemptPlan,
    CompleteManyPlan,
    FailPlan,
    FailAttemptPlan,
    ExtendPlan,
    ExtendAttemptPlan,
    PlanKinds
};

// One queue table as this backend knows it.
struct QueueEntry {
    Oid relid;  // hash key
    bool valid;
    bool stale;  // set by the callback; a build it interrupts is not valid
    bool has_attempts;
    bool has_max_attempts;
    int32 max_attempts;
    char *name;  // quoted, schema-qualified; in queue_cxt
    SPIPlanPtr plans[PlanKinds];
    // claim_shards: the plan for the key column used last.
    NameData shard_column;
    SPIPlanPtr shard_plan;
};

MemoryContext queue_cxt = nullptr;
HTAB *queue_cache = nullptr;
// Plans and names a rebuild replaced. A call further up the stack (a trigger
// on the queue table that calls claim or complete, say) may still be
// executing them, so they are freed only at the end of the transaction, when
// nothing can be running (queue_xact_callback).
List *retired_plans = NIL;
List *retired_names = NIL;
SPIPlanPtr settings_plan = nullptr;  // SELECT max_attempts FROM sharding.queue_settings ...

// Relcache callback: only marks entries stale (no catalog access here).
void queue_relcache_callback(Datum, Oid relid) {
    if (queue_cache == nullptr) return;
    if (relid == InvalidOid) {
        HASH_SEQ_STATUS seq;
        hash_seq_init(&seq, queue_cache);
        while (QueueEntry *e = static_cast<QueueEntry *>(hash_seq_search(&seq))) {
            e->valid = false;
            e->stale = true;
        }
    } else if (QueueEntry *e = static_cast<QueueEntry *>(hash_search(queue_cache, &relid, HASH_FIND, nullptr))) {
        e->valid = false;
        e->stale = true;
    }
}

void ensure_cache() {
    if (queue_cache != nullptr) return;
    queue_cxt = AllocSetContextCreate(CacheMemoryContext, "sharding queue cache", ALLOCSET_SMALL_SIZES);
    HASHCTL ctl;
    memset(&ctl, 0, sizeof ctl);
    ctl.keysize = sizeof(Oid);
    ctl.entrysize = sizeof(QueueEntry);
    ctl.hcxt = queue_cxt;
    queue_cache = hash_create("sharding queues", 16, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

void retire_plan(SPIPlanPtr plan) {
    if (plan == nullptr) return;
    MemoryContext old = MemoryContextSwitchTo(queue_cxt);
    retired_plans = lappend(retired_plans, plan);
    MemoryContextSwitchTo(old);
}

void reset_entry(QueueEntry *e) {
    for (int k = 0; k < PlanKinds; k++) {
        retire_plan(e->plans[k]);
        e->plans[k] = nullptr;
    }
    retire_plan(e->shard_plan);
    e->shard_plan = nullptr;
    if (e->name != nullptr) {
        MemoryContext old = MemoryContextSwitchTo(queue_cxt);
        retired_names = lappend(retired_names, e->name);
        MemoryContextSwitchTo(old);
    }
    e->name = nullptr;
    e->valid = false;
}

// End of a transaction: nothing of ours is executing any more, so what
// rebuilds replaced can be freed.
void queue_xact_callback(XactEvent event, void *) {
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT && event != XACT_EVENT_PREPARE) return;
    ListCell *lc;
    foreach (lc, retired_plans) SPI_freeplan(static_cast<SPIPlanPtr>(lfirst(lc)));
    foreach (lc, retired_names) pfree(lfirst(lc));
    list_free(retired_plans);
    list_free(retired_names);
    retired_plans = retired_names = NIL;
}

// A schema was renamed (or otherwise changed): the cached statements spell
// tables by schema-qualified name, so every entry must be rebuilt.
void queue_namespace_callback(Datum, int, uint32) { queue_relcache_callback(0, InvalidOid); }

// The table's quoted, schema-qualified name (palloc'd).
const char *qualified_name(Oid relid) {
    return quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
}

// Checks that column `col` exists with type `type`; returns false if it is
// missing and `optional`.
bool check_column(Oid relid, const char *qname, const char *col, Oid type, bool optional) {
    AttrNumber att = get_attnum(relid, col);
    if (att == InvalidAttrNumber) {
        if (optional) return false;
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue table %s lacks column \"%s\" of type %s", qname, col,
                       format_type_be(type));
    }
    Oid actual = get_atttype(relid, att);
    if (actual != type)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "column \"%s\" of queue table %s has type %s, not %s",
                       col, qname, format_type_be(actual), format_type_be(type));
    return true;
}

// The contract's "id bigint primary key": a unique, non-partial index on id
// alone, without which one claimed id could update several rows.
void check_unique_id(Oid relid, const char *qname) {
    AttrNumber id_att = get_attnum(relid, "id");
    Relation rel = table_open(relid, NoLock);
    List *indexes = RelationGetIndexList(rel);
    bool found = false;
    ListCell *lc;
    foreach (lc, indexes) {
        HeapTuple tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(lfirst_oid(lc)));
        if (!HeapTupleIsValid(tup)) continue;
        Form_pg_index idx = (Form_pg_index)GETSTRUCT(tup);
        if (idx->indisunique && idx->indimmediate && idx->indisvalid && idx->indnkeyatts == 1 &&
            idx->indkey.values[0] == id_att && heap_attisnull(tup, Anum_pg_index_indpred, nullptr) &&
            heap_attisnull(tup, Anum_pg_index_indexprs, nullptr))
            found = true;
        ReleaseSysCache(tup);
    }
    list_free(indexes);
    table_close(rel, NoLock);
    if (!found)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                       "queue table %s has no primary key or unique index on column \"id\"", qname);
}

// Reads the queue's max_attempts from sharding.queue_settings (by name, so
// that the setting survives dump and restore). Needs an SPI connection.
void load_settings(QueueEntry *e) {
    e->has_max_attempts = false;
    e->max_attempts = 0;
    if (settings_plan == nullptr) {
        Oid types[2] = {TEXTOID, TEXTOID};
        SPIPlanPtr p = SPI_prepare(
            "SELECT max_attempts FROM sharding.queue_settings WHERE schema_name = $1 AND table_name = $2", 2,
            types);
        if (p == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        SPI_keepplan(p);
        settings_plan = p;
    }
    Datum values[2] = {CStringGetTextDatum(get_namespace_name(get_rel_namespace(e->relid))),
                       CStringGetTextDatum(get_rel_name(e->relid))};
    int rc = SPI_execute_plan(settings_plan, values, nullptr, true, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "reading sharding.queue_settings failed: %s", SPI_result_code_string(rc));
    if (SPI_processed == 1) {
        bool isnull;
        Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        if (!isnull) {
            e->has_max_attempts = true;
            e->max_attempts = DatumGetInt32(d);
        }
    }
}

// Checks privileges, locks the table (which also processes pending
// invalidations), and returns its valid cache entry. Needs an SPI connection.
QueueEntry *lookup(Oid relid) {
    ensure_cache();
    if (!OidIsValid(relid) || !SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
        sharding::fail(ERRCODE_UNDEFINED_TABLE, "queue table with oid %u does not exist", relid);
    char kind = get_rel_relkind(relid);
    if (kind != RELKIND_RELATION && kind != RELKIND_PARTITIONED_TABLE)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue %s is not a table", qualified_name(relid));
    // SECURITY INVOKER: refuse early, before taking a lock, if the caller
    // may update neither the table nor any of its columns. The executor
    // checks again, column by column.
    if (pg_class_aclcheck(relid, GetUserId(), ACL_UPDATE) != ACLCHECK_OK &&
        pg_attribute_aclcheck_all(relid, GetUserId(), ACL_UPDATE, ACLMASK_ANY) != ACLCHECK_OK)
        sharding::fail(ERRCODE_INSUFFICIENT_PRIVILEGE, "permission denied for queue table %s",
                       qualified_name(relid));
    LockRelationOid(relid, RowExclusiveLock);

    bool found;
    QueueEntry *e = static_cast<QueueEntry *>(hash_search(queue_cache, &relid, HASH_ENTER, &found));
    if (!found) {
        memset(reinterpret_cast<char *>(e) + sizeof(Oid), 0, sizeof(QueueEntry) - sizeof(Oid));
    }
    if (e->valid) return e;
    reset_entry(e);
    e->stale = false;

    const char *qname = qualified_name(relid);
    check_column(relid, qname, "id", INT8OID, false);
    check_column(relid, qname, "status", TEXTOID, false);
    check_column(relid, qname, "owner", TEXTOID, false);
    check_column(relid, qname, "claim_expires", TIMESTAMPTZOID, false);
    check_column(relid, qname, "created", TIMESTAMPTZOID, false);
    e->has_attempts = check_column(relid, qname, "attempts", INT4OID, true);
    check_unique_id(relid, qname);
    load_settings(e);
    if (!e->has_attempts) e->has_max_attempts = false;
    e->name = MemoryContextStrdup(queue_cxt, qname);
    // Last: a failure above leaves the entry invalid, and so does an
    // invalidation that arrived while it was being built (this call uses
    // it; the next one rebuilds it).
    e->valid = !e->stale;
    return e;
}

// Prepares and keeps a statement. Always a generic plan: these statements
// are not parameter-sensitive (the partial indexes serve any value), and a
// custom plan per call would cost more planning than executing; with
// LIMIT $2 the plan cache would otherwise keep choosing custom plans.
SPIPlanPtr keep(const char *sql, int nargs, Oid *types) {
    SPIPlanPtr p = SPI_prepare_cursor(sql, nargs, types, CURSOR_OPT_GENERIC_PLAN);
    if (p == nullptr) elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql, SPI_result_code_string(SPI_result));
    SPI_keepplan(p);
    return p;
}

// The claim statement. Parameters: $1 worker, $2 batch, $3 lease,
// $4 max_attempts (NULL: unlimited), and for claim_shards $5 shards,
// $6 shard_count. `shard_filter` is NULL or "AND <condition>".
//
// Pending rows and expired leases are found by separate index paths (the
// partial indexes create_queue makes: (created, id) WHERE status =
// 'pending' and (claim_expires) WHERE status = 'processing'), each locked
// with SKIP LOCKED and limited to batch; the oldest batch of both is then
// updated. The CTEs are MATERIALIZED and the final pick is an InitPlan, so
// every LIMIT is evaluated once: a claim never takes more than batch rows.
char *claim_sql(const QueueEntry *e, const char *shard_filter) {
    const char *f = shard_filter ? shard_filter : "";
    StringInfoData s;
    initStringInfo(&s);
    appendStringInfoString(&s, "WITH ");
    if (e->has_max_attempts) {
        // Expired leases that used up max_attempts go to failed, not to a
        // worker. Only in queues with max_attempts set: an idle
        // data-modifying CTE still costs its executor setup on every call.
        appendStringInfo(&s,
                         "reaped AS (UPDATE %s AS sharding_reaped SET status = 'failed' "
                         "WHERE sharding_reaped.id IN (SELECT id FROM %s "
                         "WHERE status = 'processing' AND claim_expires < now() AND attempts >= $4 %s "
                         "FOR UPDATE SKIP LOCKED)), ",
                         e->name, e->name, f);
    }
    appendStringInfo(&s,
                     "expired AS MATERIALIZED (SELECT id, created FROM %s "
                     "WHERE status = 'processing' AND claim_expires < now() %s %s "
                     "ORDER BY created, id LIMIT $2 FOR UPDATE SKIP LOCKED), ",
                     e->name, e->has_max_attempts ? "AND (attempts IS NULL OR attempts < $4)" : "", f);
    appendStringInfo(&s,
                     "fresh AS MATERIALIZED (SELECT id, created FROM %s WHERE status = 'pending' %s "
                     "ORDER BY created, id LIMIT $2 FOR UPDATE SKIP LOCKED) ",
                     e->name, f);
    // The picked ids go to the UPDATE as one array (an InitPlan, computed
    // once): a primary key lookup per id whatever the generic plan
    // estimates, where a join on a CTE may become a merge join over the
    // whole primary key.
    appendStringInfo(&s,
                     "UPDATE %s AS sharding_claimed SET owner = $1, claim_expires = now() + $3, "
                     "status = 'processing'%s "
                     "WHERE sharding_claimed.id = ANY ((SELECT array_agg(c.id) FROM "
                     "(SELECT id, created FROM expired UNION ALL SELECT id, created FROM fresh "
                     "ORDER BY created, id LIMIT $2) AS c)::bigint[]) "
                     "RETURNING sharding_claimed.*",
                     e->name, e->has_attempts ? ", attempts = coalesce(sharding_claimed.attempts, 0) + 1" : "");
    return s.data;
}

// Builds the SQL text of one statement kind.
char *statement_sql(const QueueEntry *e, PlanKind kind) {
    StringInfoData s;
    initStringInfo(&s);
    // The fence: processing, owned by the worker, and (optionally) the
    // attempt number of the claim.
    const char *fence = "status = 'processing' AND owner = $2";
    bool attempt = kind == CompleteAttemptPlan || kind == FailAttemptPlan || kind == ExtendAttemptPlan;
    switch (kind) {
        case ClaimPlan:
            return claim_sql(e, nullptr);
        case CompletePlan:
        case CompleteAttemptPlan:
            // $1 id, $2 worker, $3 attempt
            appendStringInfo(&s, "UPDATE %s SET status = 'done' WHERE id = $1 AND %s%s", e->name, fence,
                             attempt ? " AND attempts = $3" : "");
            break;
        case CompleteManyPlan:
            // $1 ids, $2 worker
            appendStringInfo(&s, "UPDATE %s SET status = 'done' WHERE id = ANY ($1) AND %s", e->name, fence);
            break;
        case FailPlan:
        case FailAttemptPlan:
            // $1 id, $2 worker, $3 retry, $4 max_attempts, $5 attempt. A
            // retry goes back to pending unless max_attempts is used up.
            appendStringInfo(&s,
                             "UPDATE %s SET status = CASE WHEN $3 %s THEN 'pending' ELSE 'failed' END, "
                             "owner = CASE WHEN $3 %s THEN NULL ELSE owner END, "
                             "claim_expires = CASE WHEN $3 %s THEN NULL ELSE claim_expires END "
                             "WHERE id = $1 AND %s%s",
                             e->name, e->has_attempts ? "AND ($4 IS NULL OR attempts < $4)" : "",
                             e->has_attempts ? "AND ($4 IS NULL OR attempts < $4)" : "",
                             e->has_attempts ? "AND ($4 IS NULL OR attempts < $4)" : "", fence,
                             attempt ? " AND attempts = $5" : "");
            break;
        case ExtendPlan:
        case ExtendAttemptPlan:
            // $1 id, $2 worker, $3 lease, $4 attempt
            appendStringInfo(&s, "UPDATE %s SET claim_expires = now() + $3 WHERE id = $1 AND %s%s", e->name,
                             fence, attempt ? " AND attempts = $4" : "");
            break;
        case PlanKinds:
            break;
    }
    return s.data;
}

void connect_spi() {
    int rc = SPI_connect();
    if (rc != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed: %s", SPI_result_code_string(rc));
}

SPIPlanPtr plan_for(QueueEntry *e, PlanKind kind) {
    if (e->plans[kind] != nullptr) return e->plans[kind];
    Oid types[6];
    int nargs = 0;
    switch (kind) {
        case ClaimPlan:
            types[0] = TEXTOID, types[1] = INT4OID, types[2] = INTERVALOID, types[3] = INT4OID;
            nargs = 4;
            break;
        case CompletePlan:
        case CompleteAttemptPlan:
            types[0] = INT8OID, types[1] = TEXTOID, types[2] = INT4OID;
            nargs = kind == CompletePlan ? 2 : 3;
            break;
        case CompleteManyPlan:
            types[0] = INT8ARRAYOID, types[1] = TEXTOID;
            nargs = 2;
            break;
        case FailPlan:
        case FailAttemptPlan:
            types[0] = INT8OID, types[1] = TEXTOID, types[2] = BOOLOID, types[3] = INT4OID, types[4] = INT4OID;
            nargs = kind == FailPlan ? 4 : 5;
            break;
        case ExtendPlan:
        case ExtendAttemptPlan:
            types[0] = INT8OID, types[1] = TEXTOID, types[2] = INTERVALOID, types[3] = INT4OID;
            nargs = kind == ExtendPlan ? 3 : 4;
            break;
        case PlanKinds:
            elog(ERROR, "bad queue plan kind");
    }
    e->plans[kind] = keep(statement_sql(e, kind), nargs, types);
    return e->plans[kind];
}

// The shard filter of claim_shards on `column`, checked to be a key type.
char *shard_filter(Oid relid, const char *column) {
    AttrNumber att = get_attnum(relid, column);
    if (att == InvalidAttrNumber)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue table %s lacks key column \"%s\"",
                       qualified_name(relid), column);
    Oid type = getBaseType(get_atttype(relid, att));
    switch (type) {
        case TEXTOID:
        case VARCHAROID:
        case BPCHAROID:
        case BYTEAOID:
        case INT2OID:
        case INT4OID:
        case INT8OID:
        case UUIDOID:
            break;
        default:
            sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                           "key column \"%s\" of queue table %s has type %s, not a shard key type "
                           "(text, bytea, smallint, integer, bigint or uuid)",
                           column, qualified_name(relid), format_type_be(type));
    }
    return psprintf("AND sharding.shard_of(%s, $6) = ANY ($5)", quote_identifier(column));
}

SPIPlanPtr shard_plan_for(QueueEntry *e, const char *column) {
    if (e->shard_plan != nullptr && strcmp(NameStr(e->shard_column), column) == 0) return e->shard_plan;
    retire_plan(e->shard_plan);  // an outer claim_shards may be running it
    e->shard_plan = nullptr;
    Oid types[6] = {TEXTOID, INT4OID, INTERVALOID, INT4OID, INT4ARRAYOID, INT4OID};
    SPIPlanPtr p = keep(claim_sql(e, shard_filter(e->relid, column)), 6, types);
    namestrcpy(&e->shard_column, column);
    e->shard_plan = p;
    return p;
}

// --- argument checks (22023, naming the value) ---

void require(FunctionCallInfo fcinfo, int argno, const char *what) {
    if (PG_ARGISNULL(argno)) sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "%s must not be null", what);
}

Oid queue_arg(FunctionCallInfo fcinfo) {
    require(fcinfo, 0, "queue");
    return PG_GETARG_OID(0);
}

Datum check_lease(FunctionCallInfo fcinfo, int argno) {
    require(fcinfo, argno, "lease");
    Datum lease = PG_GETARG_DATUM(argno);
    Interval zero;
    memset(&zero, 0, sizeof zero);
    if (DatumGetBool(DirectFunctionCall2(interval_lt, lease, IntervalPGetDatum(&zero))))
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "lease must not be negative, got %s",
                       DatumGetCString(DirectFunctionCall1(interval_out, lease)));
    return lease;
}

// Runs a fenced single-row statement and reports whether it changed a row.
bool run_fenced(Oid relid, PlanKind kind, Datum *values, const char *nulls) {
    connect_spi();
    QueueEntry *e = lookup(relid);
    if ((kind == CompleteAttemptPlan || kind == ExtendAttemptPlan) && !e->has_attempts)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue table %s has no attempts column to check attempt %d",
                       e->name, DatumGetInt32(values[kind == CompleteAttemptPlan ? 2 : 3]));
    int rc = SPI_execute_plan(plan_for(e, kind), values, nulls, false, 0);
    if (rc != SPI_OK_UPDATE) elog(ERROR, "queue update failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    SPI_finish();
    return n > 0;
}

// claim and claim_shards: validates, runs the claim statement, and returns
// the claimed rows (as the table's row type) in materialize mode.
Datum claim_common(FunctionCallInfo fcinfo, bool by_shard) {
    ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    if (rsinfo == nullptr || !IsA(rsinfo, ReturnSetInfo) || !(rsinfo->allowedModes & SFRM_Materialize))
        sharding::fail(ERRCODE_FEATURE_NOT_SUPPORTED, "set-valued function called in context that cannot accept a set");

    Oid typid = get_fn_expr_argtype(fcinfo->flinfo, 0);
    Oid relid = OidIsValid(typid) ? get_typ_typrelid(typid) : InvalidOid;
    if (!OidIsValid(relid))
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue must be a table's row type (e.g. NULL::jobs), got %s",
                       OidIsValid(typid) ? format_type_be(typid) : "unknown");
    require(fcinfo, 1, "worker");
    int batch_arg = by_shard ? 4 : 2, lease_arg = by_shard ? 5 : 3;
    require(fcinfo, batch_arg, "batch");
    int32 batch = PG_GETARG_INT32(batch_arg);
    if (batch < 1) sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "batch must be at least 1, got %d", batch);
    Datum lease = check_lease(fcinfo, lease_arg);
    const char *key_column = nullptr;
    int32 shard_count = 0;
    Datum shards = 0;
    if (by_shard) {
        require(fcinfo, 2, "shards");
        require(fcinfo, 3, "shard_count");
        require(fcinfo, 6, "key_column");
        shard_count = sharding::check_shard_count(PG_GETARG_INT32(3));
        ArrayType *arr = PG_GETARG_ARRAYTYPE_P(2);
        Datum *elems;
        bool *elem_nulls;
        int n;
        deconstruct_array(arr, INT4OID, sizeof(int32), true, TYPALIGN_INT, &elems, &elem_nulls, &n);
        for (int i = 0; i < n; i++) {
            if (elem_nulls[i]) sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "shards must not contain null");
            int32 s = DatumGetInt32(elems[i]);
            if (s < 0 || s >= shard_count)
                sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "shard must be between 0 and %d, got %d",
                               shard_count - 1, s);
        }
        shards = PointerGetDatum(arr);
        key_column = NameStr(*PG_GETARG_NAME(6));
    }

    connect_spi();
    QueueEntry *e = lookup(relid);
    SPIPlanPtr plan = by_shard ? shard_plan_for(e, key_column) : plan_for(e, ClaimPlan);
    Datum values[6] = {PG_GETARG_DATUM(1), Int32GetDatum(batch), lease, Int32GetDatum(e->max_attempts), shards,
                       Int32GetDatum(shard_count)};
    char nulls[6] = {' ', ' ', ' ', e->has_max_attempts ? ' ' : 'n', ' ', ' '};
    Oid types[6] = {TEXTOID, INT4OID, INTERVALOID, INT4OID, INT4ARRAYOID, INT4OID};
    ParamListInfo params = makeParamList(6);
    params->numParams = by_shard ? 6 : 4;
    for (int i = 0; i < params->numParams; i++) {
        params->params[i].value = values[i];
        params->params[i].isnull = nulls[i] == 'n';
        params->params[i].pflags = PARAM_FLAG_CONST;
        params->params[i].ptype = types[i];
    }

    // The claimed rows go straight from the UPDATE's RETURNING into the
    // result tuplestore, mapped onto the table's row type (which still
    // counts dropped columns). Not detoasted (the receiver cannot map and
    // detoast at once): the calling query reads them in this transaction,
    // which holds a lock on the table, so their TOAST values stay.
    MemoryContext per_query = rsinfo->econtext->ecxt_per_query_memory;
    MemoryContext old = MemoryContextSwitchTo(per_query);
    TupleDesc desc = lookup_rowtype_tupdesc_copy(typid, -1);
    Tuplestorestate *store =
        tuplestore_begin_heap((rsinfo->allowedModes & SFRM_Materialize_Random) != 0, false, work_mem);
    MemoryContextSwitchTo(old);
    DestReceiver *dest = CreateDestReceiver(DestTuplestore);
    SetTuplestoreDestReceiverParams(dest, store, per_query, false, desc,
                                    "claimed rows do not match the row type of the queue table");
    SPIExecuteOptions options;
    memset(&options, 0, sizeof options);
    options.params = params;
    options.dest = dest;
    int rc = SPI_execute_plan_extended(plan, &options);
    if (rc != SPI_OK_UPDATE_RETURNING) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    // Defence in depth for the contract's "never more than batch".
    if (n > static_cast<uint64>(batch))
        elog(ERROR, "claim took %llu rows for a batch of %d", static_cast<unsigned long long>(n), batch);
    dest->rDestroy(dest);
    SPI_finish();
    rsinfo->returnMode = SFRM_Materialize;
    rsinfo->setResult = store;
    rsinfo->setDesc = desc;
    return (Datum)0;
}

}  // namespace

namespace sharding {
// Called once from _PG_init.
void queue_init() {
    CacheRegisterRelcacheCallback(queue_relcache_callback, (Datum)0);
    CacheRegisterSyscacheCallback(NAMESPACEOID, queue_namespace_callback, (Datum)0);
    RegisterXactCallback(queue_xact_callback, nullptr);
}
}  // namespace sharding

/*
 * claim(queue anyelement, worker text, batch integer DEFAULT 50,
 *       lease interval DEFAULT '5 minutes') RETURNS SETOF anyelement
 *
 * Takes up to batch pending or expired rows, oldest created first, and
 * leases them to worker. Called as SELECT * FROM sharding.claim(NULL::jobs, 'w1').
 */
SHARDING_FUNCTION(claim) { return claim_common(fcinfo, false); }

/*
 * claim_shards(queue anyelement, worker text, shards integer[],
 *              shard_count integer, batch integer DEFAULT 50,
 *              lease interval DEFAULT '5 minutes', key_column name DEFAULT 'key')
 *   RETURNS SETOF anyelement
 *
 * As claim, only rows whose shard_of(key_column, shard_count) is in shards.
 */
SHARDING_FUNCTION(claim_shards) { return claim_common(fcinfo, true); }

/*
 * complete(queue regclass, id bigint, worker text, attempt integer DEFAULT NULL)
 *   RETURNS boolean
 *
 * Marks the row done if it is processing, owned by worker, and (when given)
 * in its claim number attempt.
 */
SHARDING_FUNCTION(complete) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "id");
    require(fcinfo, 2, "worker");
    bool attempt = !PG_ARGISNULL(3);
    Datum values[3] = {PG_GETARG_DATUM(1), PG_GETARG_DATUM(2), attempt ? PG_GETARG_DATUM(3) : 0};
    PG_RETURN_BOOL(run_fenced(relid, attempt ? CompleteAttemptPlan : CompletePlan, values, nullptr));
}

/*
 * complete(queue regclass, ids bigint[], worker text) RETURNS integer
 *
 * The batch form: completes every listed row that passes the fence, in one
 * statement, and returns how many.
 */
SHARDING_FUNCTION(complete_many) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "ids");
    require(fcinfo, 2, "worker");
    Datum values[2] = {PG_GETARG_DATUM(1), PG_GETARG_DATUM(2)};
    connect_spi();
    QueueEntry *e = lookup(relid);
    int rc = SPI_execute_plan(plan_for(e, CompleteManyPlan), values, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE) elog(ERROR, "queue update failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    SPI_finish();
    PG_RETURN_INT32(static_cast<int32>(n));
}

/*
 * fail(queue regclass, id bigint, worker text, retry boolean DEFAULT true,
 *      attempt integer DEFAULT NULL) RETURNS boolean
 *
 * Same fence as complete; sends the row back to pending (owner and lease
 * cleared) or, without retry or once max_attempts is used up, to failed.
 */
SHARDING_FUNCTION(fail) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "id");
    require(fcinfo, 2, "worker");
    require(fcinfo, 3, "retry");
    bool attempt = !PG_ARGISNULL(4);
    connect_spi();
    QueueEntry *e = lookup(relid);
    Datum values[5] = {PG_GETARG_DATUM(1), PG_GETARG_DATUM(2), PG_GETARG_DATUM(3), Int32GetDatum(e->max_attempts),
                       attempt ? PG_GETARG_DATUM(4) : 0};
    char nulls[5] = {' ', ' ', ' ', e->has_max_attempts ? ' ' : 'n', ' '};
    if (attempt && !e->has_attempts)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue table %s has no attempts column to check attempt %d",
                       e->name, PG_GETARG_INT32(4));
    int rc = SPI_execute_plan(plan_for(e, attempt ? FailAttemptPlan : FailPlan), values, nulls, false, 0);
    if (rc != SPI_OK_UPDATE) elog(ERROR, "queue update failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    SPI_finish();
    PG_RETURN_BOOL(n > 0);
}

/*
 * extend_lease(queue regclass, id bigint, worker text, lease interval,
 *              attempt integer DEFAULT NULL) RETURNS boolean
 *
 * Same fence as complete; claim_expires = now() + lease.
 */
SHARDING_FUNCTION(extend_lease) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "id");
    require(fcinfo, 2, "worker");
    Datum lease = check_lease(fcinfo, 3);
    bool attempt = !PG_ARGISNULL(4);
    Datum values[4] = {PG_GETARG_DATUM(1), PG_GETARG_DATUM(2), lease, attempt ? PG_GETARG_DATUM(4) : 0};
    PG_RETURN_BOOL(run_fenced(relid, attempt ? ExtendAttemptPlan : ExtendPlan, values, nullptr));
}

/*
 * _queue_sql(queue regclass, kind text) RETURNS text
 *
 * Internal: the SQL text of one queue statement as this backend prepares
 * it (for EXPLAIN in the tests and when troubleshooting a slow queue).
 */
SHARDING_FUNCTION(_queue_sql) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "kind");
    char *kind = text_to_cstring(PG_GETARG_TEXT_PP(1));
    connect_spi();
    QueueEntry *e = lookup(relid);
    char *sql;
    if (strcmp(kind, "claim") == 0)
        sql = statement_sql(e, ClaimPlan);
    else if (strncmp(kind, "claim_shards:", 13) == 0)
        sql = claim_sql(e, shard_filter(relid, kind + 13));
    else if (strcmp(kind, "complete") == 0)
        sql = statement_sql(e, CompleteAttemptPlan);
    else if (strcmp(kind, "complete_many") == 0)
        sql = statement_sql(e, CompleteManyPlan);
    else if (strcmp(kind, "fail") == 0)
        sql = statement_sql(e, FailAttemptPlan);
    else if (strcmp(kind, "extend_lease") == 0)
        sql = statement_sql(e, ExtendAttemptPlan);
    else
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "unknown queue statement kind \"%s\"", kind);
    size_t len = strlen(sql);
    char *copy = static_cast<char *>(SPI_palloc(len + 1));  // survives SPI_finish
    memcpy(copy, sql, len + 1);
    SPI_finish();
    PG_RETURN_TEXT_P(cstring_to_text(copy));
}

/*
 * _queue_settings_changed() RETURNS trigger
 *
 * AFTER trigger on sharding.queue_settings: sends a relcache invalidation
 * for the queue table a changed row names, so every backend reloads that
 * queue's settings on its next call (at commit of the change).
 */
SHARDING_FUNCTION(_queue_settings_changed) {
    if (!CALLED_AS_TRIGGER(fcinfo)) elog(ERROR, "_queue_settings_changed must be called as a trigger");
    TriggerData *td = reinterpret_cast<TriggerData *>(fcinfo->context);
    HeapTuple rows[2] = {td->tg_trigtuple, td->tg_newtuple};
    TupleDesc desc = td->tg_relation->rd_att;
    for (HeapTuple row : rows) {
        if (row == nullptr) continue;
        bool null_schema, null_table;
        Datum schema = heap_getattr(row, 1, desc, &null_schema);
        Datum table = heap_getattr(row, 2, desc, &null_table);
        if (null_schema || null_table) continue;
        Oid nsp = get_namespace_oid(TextDatumGetCString(schema), true);
        if (!OidIsValid(nsp)) continue;
        Oid relid = get_relname_relid(TextDatumGetCString(table), nsp);
        if (OidIsValid(relid)) CacheInvalidateRelcacheByRelid(relid);
    }
    return PointerGetDatum(nullptr);
}
