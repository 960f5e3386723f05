// The queue (docs/queue.md): claiming work with FOR UPDATE SKIP
// LOCKED, leases, fenced completion, run_at / priority, backoff.
//
// The one queue engine (queue.hpp, "the one engine"): every statement of
// every claim kind is prepared once per backend per (queue table, kind, key
// column) and kept (SPI_keepplan) in one plan cache, in the cache module's
// memory (cache.hpp). The module's relcache callback marks a table's entry
// stale when its table changes (ALTER TABLE, DROP, new index, or a changed
// row in sharding.queue_settings, whose trigger sends the table's relcache
// invalidation), and the next call rebuilds it completely under a new
// stamp, which makes its plans and positions stale; what a rebuild
// replaces is retired by the module's one rule. The SQL text comes from
// the claim-SQL builder (core/claim_sql.hpp).
//
// The generated SQL qualifies every function and operator it uses
// (pg_catalog.now(), OPERATOR(pg_catalog.=)), so the functions run under
// the caller's search_path without a per-call SET search_path, and the
// caller's schemas cannot hijack them.
//
// Claims under a pinned MVCC horizon: see claim_common() and README
// "Claiming work". In short, each backend remembers, per queue, the claim-
// order key of the last row it claimed and normally scans the pending index
// from there ("resume"); every so often, and whenever such a full scan is
// cheap, it scans from the start of the index ("sweep"), which is exact.
//
// Boundary (boundary.hpp, rule 2): this file keeps no owning C++ object on
// the stack anywhere. SQL text is built in StringInfo (palloc), so SPI and
// catalog calls are made directly; user errors are thrown with
// sharding::fail, whose exception owns its message only while unwinding.
#include "queue/queue.hpp"

#include "core/claim_sql.hpp"
#include "core/sql_ops.hpp"
#include "pg/boundary.hpp"
#include "pg/cache.hpp"
#include "pg/keys.hpp"

#include <time.h>

extern "C" {
#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/objectaddress.h"
#include "common/hashfn.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tstoreReceiver.h"
#include "lib/stringinfo.h"
#include "optimizer/cost.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/plancache.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/typcache.h"
}

namespace sharding {
void queue_init();

namespace queue {

const char *qualified_name(Oid relid) {
    return quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
}

void require_update(Oid relid) {
    if (pg_class_aclcheck(relid, GetUserId(), ACL_UPDATE) == ACLCHECK_OK ||
        pg_attribute_aclcheck_all(relid, GetUserId(), ACL_UPDATE, ACLMASK_ANY) == ACLCHECK_OK)
        return;
    aclcheck_error(ACLCHECK_NO_PRIV, get_relkind_objtype(get_rel_relkind(relid)), get_rel_name(relid));
}

void open_queue(Oid relid) {
    if (!OidIsValid(relid) || !SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
        sharding::fail(ERRCODE_UNDEFINED_TABLE, "queue table with oid %u does not exist", relid);
    char kind = get_rel_relkind(relid);
    if (kind != RELKIND_RELATION && kind != RELKIND_PARTITIONED_TABLE)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue %s is not a table", qualified_name(relid));
    // SECURITY INVOKER: refuse early, before taking a lock, if the caller
    // may update neither the table nor any of its columns (a caller without
    // rights must not queue up behind an ACCESS EXCLUSIVE lock). Checked
    // again once the lock is held, as amcheck does: the table may have been
    // dropped, or its privileges changed, while we waited. The executor
    // checks again, column by column.
    require_update(relid);
    LockRelationOid(relid, RowExclusiveLock);
    if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
        sharding::fail(ERRCODE_UNDEFINED_TABLE, "queue table with oid %u does not exist", relid);
    require_update(relid);
}

namespace {

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

bool has_column_of_type(Oid relid, const char *col, Oid type) {
    AttrNumber att = get_attnum(relid, col);
    return att != InvalidAttrNumber && get_atttype(relid, att) == type;
}

}  // namespace

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

// The key column must exist and be of a shard key type (22023 otherwise).
void check_key_column(Oid relid, const char *column) {
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
}

QueueColumns check_queue_table(Oid relid) {
    const char *qname = qualified_name(relid);
    check_column(relid, qname, "id", INT8OID, false);
    check_column(relid, qname, "status", TEXTOID, false);
    check_column(relid, qname, "owner", TEXTOID, false);
    check_column(relid, qname, "claim_expires", TIMESTAMPTZOID, false);
    check_column(relid, qname, "created", TIMESTAMPTZOID, false);
    QueueColumns cols;
    cols.has_attempts = check_column(relid, qname, "attempts", INT4OID, true);
    // run_at and priority order claims only with the contract's types: a
    // table that had, say, an unrelated "priority integer" column before
    // version 1.2 keeps working as it did.
    cols.has_run_at = has_column_of_type(relid, "run_at", TIMESTAMPTZOID);
    cols.has_priority = has_column_of_type(relid, "priority", INT2OID);
    AttrNumber run_at = get_attnum(relid, "run_at"), priority = get_attnum(relid, "priority");
    cols.run_at_type = run_at == InvalidAttrNumber ? InvalidOid : get_atttype(relid, run_at);
    cols.priority_type = priority == InvalidAttrNumber ? InvalidOid : get_atttype(relid, priority);
    check_unique_id(relid, qname);
    return cols;
}

QueueColumns claim_columns(const Queue *q, bool ordered) {
    if (!ordered) return q->cols;
    // The ordered claims read run_at and priority wherever the columns
    // exist, so those must have the contract's types (priority: any
    // integer type).
    QueueColumns c = q->cols;
    c.has_run_at = OidIsValid(c.run_at_type);
    c.has_priority = OidIsValid(c.priority_type);
    if (c.has_run_at && c.run_at_type != TIMESTAMPTZOID)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "column \"run_at\" of queue table %s has type %s, not %s",
                       q->name, format_type_be(c.run_at_type), format_type_be(TIMESTAMPTZOID));
    if (c.has_priority && c.priority_type != INT2OID && c.priority_type != INT4OID && c.priority_type != INT8OID)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "column \"priority\" of queue table %s has type %s, not smallint",
                       q->name, format_type_be(c.priority_type));
    return c;
}

}  // namespace queue
}  // namespace sharding

namespace sharding {
namespace queue {

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

void connect_spi() {
    int rc = SPI_connect();
    if (rc != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed: %s", SPI_result_code_string(rc));
}

void require(FunctionCallInfo fcinfo, int argno, const char *what) {
    if (PG_ARGISNULL(argno)) sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "%s must not be null", what);
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

}  // namespace queue
}  // namespace sharding

namespace {

using sharding::queue::check_lease;
using sharding::queue::connect_spi;
using sharding::queue::keep;
using sharding::queue::monotonic_us;
using sharding::queue::require;
using sharding::queue::thread_cpu_us;
using sharding::queue::QueueColumns;
using sharding::queue::qualified_name;

// The fenced statements a queue needs (the claims' plans are
// sharding::claim_sql::ClaimPlan's). Each is prepared on first use.
enum PlanKind {
    CompletePlan,
    CompleteAttemptPlan,
    CompleteManyPlan,
    CompleteAttemptsPlan,  // complete(queue, ids, worker, attempts)
    FailPlan,
    FailAttemptPlan,
    ExtendPlan,
    ExtendAttemptPlan,
    PlanKinds
};

// Where a backend's last claim of a queue ended, in claim order: the
// pending index scan of the next claim may start past it (see claim_common).
struct Position {
    bool valid;
    int16 priority;
    TimestampTz run_at;
    TimestampTz created;
    int64 id;
    uint32 filter_hash;  // claim_shards: which shards/key column it is for
    TransactionId xid;   // the (sub)transaction of the claim that set it
};

using sharding::queue::SweepClock;

// One queue table as this backend knows it: the shared part (queue.hpp)
// first, the hash key at offset 0.
struct QueueEntry : sharding::queue::Queue {
    bool valid;
    bool stale;  // set by the callback; a build it interrupts is not valid
    bool has_backoff;
    Interval backoff_base;
    Interval backoff_max;
    Position pos, shard_pos, node_pos;
    SweepClock sweep, shard_sweep, node_sweep;
};

HTAB *queue_cache = nullptr;
HTAB *plan_cache = nullptr;  // the plans of every kind (queue.hpp, PlanEntry)
uint64 last_stamp = 0;       // of the last build of a queue entry
SPIPlanPtr settings_plan = nullptr;  // SELECT ... FROM sharding.queue_settings ...

// Cache module callbacks: they only mark entries stale.
void queue_relation_changed(Oid relid) {
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

// A schema was renamed (or otherwise changed): the cached statements spell
// tables by schema-qualified name, so every entry must be rebuilt.
void queue_namespace_changed(int, uint32) { queue_relation_changed(InvalidOid); }

const sharding::cache::Kind queue_kind = {"queue", queue_relation_changed, queue_namespace_changed, 1,
                                          {NAMESPACEOID, 0, 0, 0}};

void ensure_cache() {
    if (queue_cache != nullptr) return;
    queue_cache = sharding::cache::blob_hash(sharding::cache::context(), "sharding queues", 16, sizeof(Oid),
                                             sizeof(QueueEntry));
    plan_cache = sharding::cache::blob_hash(sharding::cache::context(), "sharding queue plans", 32,
                                            sizeof(sharding::queue::PlanKey), sizeof(sharding::queue::PlanEntry));
}

// What a rebuild replaces may still be executing further up the stack (a
// trigger on the queue table that calls claim or complete): the cache
// module frees it once no call of the extension runs any more.
void retire_plan(SPIPlanPtr plan) {
    if (plan != nullptr) sharding::cache::retire_plan(plan);
}

void free_name(void *name) { pfree(name); }

void retire_name(char *name) {
    if (name != nullptr) sharding::cache::retire(free_name, name);
}

// The plans of the entry's old build stay in the plan cache, stale by
// their stamp (plan_entry retires them).
void reset_entry(QueueEntry *e) {
    retire_name(e->name);
    e->name = nullptr;
    e->pos.valid = e->shard_pos.valid = e->node_pos.valid = false;
    e->sweep = e->shard_sweep = e->node_sweep = SweepClock{0, 0, 0};
    e->valid = false;
}

// Reads the queue's settings from sharding.queue_settings (by schema and
// table name, so that they survive dump and restore; columns by name).
// Needs an SPI connection.
void load_settings(QueueEntry *e) {
    e->has_max_attempts = false;
    e->max_attempts = 0;
    e->has_backoff = false;
    if (settings_plan == nullptr) {
        Oid types[2] = {TEXTOID, TEXTOID};
        SPIPlanPtr p = SPI_prepare(
            "SELECT s.* FROM sharding.queue_settings AS s "
            "WHERE s.schema_name OPERATOR(pg_catalog.=) $1 AND s.table_name OPERATOR(pg_catalog.=) $2",
            2, types);
        if (p == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        SPI_keepplan(p);
        settings_plan = p;
    }
    Datum values[2] = {CStringGetTextDatum(get_namespace_name(get_rel_namespace(e->relid))),
                       CStringGetTextDatum(get_rel_name(e->relid))};
    int rc = SPI_execute_plan(settings_plan, values, nullptr, true, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "reading sharding.queue_settings failed: %s", SPI_result_code_string(rc));
    if (SPI_processed != 1) return;
    HeapTuple row = SPI_tuptable->vals[0];
    TupleDesc desc = SPI_tuptable->tupdesc;
    // Columns by name; one a version has not created yet (a 1.1 catalog
    // under this library, before ALTER EXTENSION UPDATE) reads as NULL.
    auto column = [&](const char *name, bool *isnull) -> Datum {
        int att = SPI_fnumber(desc, name);
        *isnull = true;
        return att > 0 ? SPI_getbinval(row, desc, att, isnull) : (Datum)0;
    };
    bool isnull;
    Datum d = column("max_attempts", &isnull);
    if (!isnull) {
        e->has_max_attempts = true;
        e->max_attempts = DatumGetInt32(d);
    }
    bool base_null, max_null;
    Datum base = column("backoff_base", &base_null);
    Datum max = column("backoff_max", &max_null);
    if (!base_null && !max_null) {
        e->has_backoff = true;
        e->backoff_base = *DatumGetIntervalP(base);
        e->backoff_max = *DatumGetIntervalP(max);
    }
}

// Checks privileges, locks the table (which also processes pending
// invalidations), and returns its valid cache entry. Needs an SPI connection.
QueueEntry *lookup_entry(Oid relid) {
    ensure_cache();
    sharding::queue::open_queue(relid);

    bool found;
    QueueEntry *e = static_cast<QueueEntry *>(hash_search(queue_cache, &relid, HASH_ENTER, &found));
    if (!found) {
        memset(reinterpret_cast<char *>(e) + sizeof(Oid), 0, sizeof(QueueEntry) - sizeof(Oid));
    }
    if (e->valid) return e;
    reset_entry(e);
    e->stale = false;
    e->stamp = ++last_stamp;

    e->cols = sharding::queue::check_queue_table(relid);
    load_settings(e);
    if (!e->cols.has_attempts) e->has_max_attempts = false;
    if (!e->cols.has_run_at) e->has_backoff = false;
    e->name = MemoryContextStrdup(sharding::cache::context(), qualified_name(relid));
    // Last: a failure above leaves the entry invalid, and so does an
    // invalidation that arrived while it was being built (this call uses
    // it; the next one rebuilds it).
    e->valid = !e->stale;
    return e;
}


// Runs exec(), one SPI execution of `plan`, after building the plan's
// generic plan with sequential scans disabled when it needs (re)building:
// the first run, or after an invalidation (new statistics, ALTER TABLE). A
// generic plan built while the table was small would otherwise keep a
// sequential scan for the id lookups until the next invalidation, while the
// table grows fast (done rows, and dead ones while the horizon is pinned).
// Only the planning runs under the changed setting, restored before the
// statement executes (on error too): the statement fires the user's
// triggers on the queue table, which must plan their own queries with the
// session's settings (a trigger's sequential scan costed at 1e10 is also
// JIT-compiled, on every row).
template <typename F>
int execute_preferring_indexes(SPIPlanPtr plan, bool *built, F exec) {
    if (!*built || !SPI_plan_is_valid(plan)) {
        bool saved = enable_seqscan;
        enable_seqscan = false;
        PG_TRY();
        {
            // Builds (or revalidates) the kept generic plan, which exec()
            // then finds valid in the plan cache; locks taken here are held
            // to the end of the transaction, so no invalidation is taken in
            // between.
            CachedPlan *cplan = SPI_plan_get_cached_plan(plan);
            if (cplan != nullptr) ReleaseCachedPlan(cplan, CurrentResourceOwner);
        }
        PG_FINALLY();
        { enable_seqscan = saved; }
        PG_END_TRY();
        *built = true;
    }
    return exec();
}

// The qualified operators of the generated SQL: core/sql_ops.hpp.

// The parameters of every claim statement (core/claim_sql.hpp, ClaimParam),
// by their types.
using sharding::claim_sql::ClaimParams;
Oid claim_types[ClaimParams] = {TEXTOID, INT4OID,        INTERVALOID,    INT4OID, INT4ARRAYOID, INT4OID,
                                INT2OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID, TEXTOID,      TEXTOID};

// The claim statement of `plan` on the key column `column` (nullptr for
// claim), from the claim-SQL builder (core/claim_sql.cpp).
char *claim_sql(const QueueEntry *e, const char *column, const sharding::claim_sql::ClaimPlan &plan) {
    const char *key = column != nullptr ? quote_identifier(column) : nullptr;
    sharding::claim_sql::Table t{e->name, e->cols.has_attempts, e->cols.has_run_at, e->cols.has_priority};
    return sharding::queue::sql_text([&] { return sharding::claim_sql::claim(t, key, plan); });
}

// The new run_at of a retried job under backoff: now() + base *
// 2^(attempts - 1), capped at max ($6 base, $7 max). Computed in seconds
// first so that a large attempts count cannot overflow the interval.
const char *backoff_sql(const QueueEntry *e) {
    const char *exponent = e->cols.has_attempts
                               ? "LEAST(GREATEST(coalesce(attempts, 1)" " OPERATOR(pg_catalog.-) " "1, 0), 1000)"
                               : "0";
    return psprintf("CASE WHEN pg_catalog.date_part('epoch', $6)"
                    " OPERATOR(pg_catalog.*) pg_catalog.power(2::float8, %s)" GE "pg_catalog.date_part('epoch', $7) "
                    "THEN " NOW PLUS "$7 ELSE " NOW PLUS "($6 OPERATOR(pg_catalog.*) "
                    "pg_catalog.power(2::float8, %s)) END",
                    exponent, exponent);
}

// Builds the SQL text of one statement kind.
char *statement_sql(const QueueEntry *e, PlanKind kind) {
    StringInfoData s;
    initStringInfo(&s);
    // The fence: processing, owned by the worker, and (optionally) the
    // attempt number of the claim. The status test is written as a function
    // call on purpose: as an operator it would match the predicate of the
    // lease index (claim_expires) WHERE status = 'processing', and a generic
    // plan built while that index was nearly empty would scan all of it,
    // dead entries included, on every call, instead of looking the id up.
    const char *fence = "pg_catalog.texteq(status, 'processing') AND owner" EQ "$2";
    bool attempt = kind == CompleteAttemptPlan || kind == FailAttemptPlan || kind == ExtendAttemptPlan;
    switch (kind) {
        case CompletePlan:
        case CompleteAttemptPlan:
            // $1 id, $2 worker, $3 attempt. claim_expires becomes the time
            // the job finished (purge reads it).
            appendStringInfo(&s, "UPDATE %s SET status = 'done', claim_expires = " NOW " WHERE id" EQ "$1 AND %s%s",
                             e->name, fence, attempt ? " AND attempts" EQ "$3" : "");
            break;
        case CompleteManyPlan:
            // $1 ids, $2 worker
            appendStringInfo(&s,
                             "UPDATE %s SET status = 'done', claim_expires = " NOW " WHERE id" EQ "ANY ($1) AND %s",
                             e->name, fence);
            break;
        case CompleteAttemptsPlan:
            // $1 ids, $2 worker, $3 attempts (a NULL attempt: not checked)
            appendStringInfo(&s,
                             "UPDATE %s AS sharding_done SET status = 'done', claim_expires = " NOW " "
                             "FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($3)) AS f(id, attempt) "
                             "WHERE sharding_done.id" EQ "f.id AND pg_catalog.texteq(sharding_done.status, 'processing') "
                             "AND sharding_done.owner" EQ "$2 %s RETURNING sharding_done.id",
                             e->name,
                             e->cols.has_attempts ? "AND (f.attempt IS NULL OR sharding_done.attempts" EQ "f.attempt)"
                                                  : "AND f.attempt IS NULL");
            break;
        case FailPlan:
        case FailAttemptPlan: {
            // $1 id, $2 worker, $3 retry, $4 max_attempts, $5 attempt,
            // $6 backoff base, $7 backoff max. A retry goes back to pending
            // unless max_attempts is used up; with backoff, not before
            // now() plus the backoff.
            const char *retry =
                psprintf("$3 %s", e->cols.has_attempts ? "AND ($4 IS NULL OR attempts" LT "$4)" : "");
            appendStringInfo(&s,
                             "UPDATE %s SET status = CASE WHEN %s THEN 'pending' ELSE 'failed' END, "
                             "owner = CASE WHEN %s THEN NULL ELSE owner END, "
                             "claim_expires = CASE WHEN %s THEN NULL ELSE claim_expires END",
                             e->name, retry, retry, retry);
            if (e->cols.has_run_at)
                appendStringInfo(&s, ", run_at = CASE WHEN %s AND $6 IS NOT NULL THEN %s ELSE run_at END", retry,
                                 backoff_sql(e));
            appendStringInfo(&s, " WHERE id" EQ "$1 AND %s%s", fence, attempt ? " AND attempts" EQ "$5" : "");
            break;
        }
        case ExtendPlan:
        case ExtendAttemptPlan:
            // $1 id, $2 worker, $3 lease, $4 attempt
            appendStringInfo(&s, "UPDATE %s SET claim_expires = " NOW PLUS "$3 WHERE id" EQ "$1 AND %s%s", e->name,
                             fence, attempt ? " AND attempts" EQ "$4" : "");
            break;
        case PlanKinds:
            break;
    }
    return s.data;
}


// The plan of a fenced statement (complete, fail, extend_lease).
sharding::queue::PlanEntry *plan_for(QueueEntry *e, PlanKind kind) {
    sharding::queue::PlanEntry *p = sharding::queue::plan_entry(e, sharding::queue::FencedPlans | kind, nullptr);
    if (p->plan != nullptr) return p;
    Oid types[ClaimParams];
    int nargs = 0;
    switch (kind) {
        case CompletePlan:
        case CompleteAttemptPlan:
            types[0] = INT8OID, types[1] = TEXTOID, types[2] = INT4OID;
            nargs = kind == CompletePlan ? 2 : 3;
            break;
        case CompleteManyPlan:
            types[0] = INT8ARRAYOID, types[1] = TEXTOID;
            nargs = 2;
            break;
        case CompleteAttemptsPlan:
            types[0] = INT8ARRAYOID, types[1] = TEXTOID, types[2] = INT4ARRAYOID;
            nargs = 3;
            break;
        case FailPlan:
        case FailAttemptPlan:
            types[0] = INT8OID, types[1] = TEXTOID, types[2] = BOOLOID, types[3] = INT4OID, types[4] = INT4OID;
            types[5] = INTERVALOID, types[6] = INTERVALOID;
            nargs = 7;
            break;
        case ExtendPlan:
        case ExtendAttemptPlan:
            types[0] = INT8OID, types[1] = TEXTOID, types[2] = INTERVALOID, types[3] = INT4OID;
            nargs = kind == ExtendPlan ? 3 : 4;
            break;
        case PlanKinds:
            elog(ERROR, "bad queue plan kind");
    }
    p->plan = keep(statement_sql(e, kind), nargs, types);
    p->built = false;
    return p;
}

// The plan of claim, claim_shards or claim_node (unordered) on the key
// column `column` (nullptr for claim).
sharding::queue::PlanEntry *claim_plan_for(QueueEntry *e, const char *column,
                                           const sharding::claim_sql::ClaimPlan &plan) {
    return sharding::queue::cached_plan(e, sharding::queue::ClaimPlans | plan.bits(), column, ClaimParams,
                                        claim_types, [&] { return claim_sql(e, column, plan); });
}

// Runs the fenced statement `kind` of the queue (execute_preferring_indexes).
int run_fenced_plan(QueueEntry *e, PlanKind kind, Datum *values, const char *nulls) {
    sharding::queue::PlanEntry *pe = plan_for(e, kind);
    SPIPlanPtr plan = pe->plan;
    return execute_preferring_indexes(plan, &pe->built, [&] { return SPI_execute_plan(plan, values, nulls, false, 0); });
}

// --- argument checks (22023, naming the value) ---


Oid queue_arg(FunctionCallInfo fcinfo) {
    require(fcinfo, 0, "queue");
    return PG_GETARG_OID(0);
}

// The job id argument: bigint, or integer for the integer overloads.
Datum id_arg(FunctionCallInfo fcinfo, int argno, bool int4_id) {
    require(fcinfo, argno, "id");
    return int4_id ? Int64GetDatum(static_cast<int64>(PG_GETARG_INT32(argno))) : PG_GETARG_DATUM(argno);
}


// Runs a fenced single-row statement and reports whether it changed a row.
bool run_fenced(Oid relid, PlanKind kind, Datum *values, const char *nulls) {
    connect_spi();
    QueueEntry *e = lookup_entry(relid);
    if ((kind == CompleteAttemptPlan || kind == ExtendAttemptPlan) && !e->cols.has_attempts)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue table %s has no attempts column to check attempt %d",
                       e->name, DatumGetInt32(values[kind == CompleteAttemptPlan ? 2 : 3]));
    int rc = run_fenced_plan(e, kind, values, nulls);
    if (rc != SPI_OK_UPDATE) elog(ERROR, "queue update failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    SPI_finish();
    return n > 0;
}

// --- claims under a pinned horizon ---
//
// While a snapshot holds the xmin horizon back, the index entries of every
// job claimed since then stay in the pending index (their heap tuples are
// dead but not removable, so they cannot be marked killed either), exactly
// at the front of the claim's scan: each claim from the start of the index
// walks all of them. So a claim normally "resumes" past the claim-order key
// of the last row this backend claimed from that queue: every live pending
// row before it was, when that claim ran, claimed by it or locked by
// another claim. What can appear behind the position afterwards: a retried
// job that keeps its run_at, a job with a higher priority or an earlier
// run_at than the position's, a claim rolled back. A "sweep" (a claim that
// scans from the start, exactly in claim order, and also takes expired
// leases) finds them. A claim sweeps when this backend has no position,
// when the last sweep was cheap (under kCheapSweepUs of CPU: no dead rows
// worth skipping, then every claim is exact), and otherwise once the claims
// resumed since the last sweep have used kSweepRatio times its CPU cost, or
// kSweepWallRatio times its cost of wall-clock time has passed (a worker
// that claims rarely). So sweeps take at most about 1/kSweepRatio of a
// worker's claim time, whatever the number of workers and however starved
// the machine is for CPU (a budget of wall-clock time alone let many
// workers' sweeps eat it all), and a job behind the position waits at most
// that long.
}  // namespace

namespace sharding {
namespace queue {

int64 monotonic_us() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

int64 thread_cpu_us() {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// Whether the claim that set a position was rolled back (its jobs are
// pending again, behind the position). A position too old to tell is no
// position.
bool rolled_back(TransactionId xid) {
    if (!TransactionIdIsValid(xid)) return false;
    if (TransactionIdPrecedes(xid, sharding::compat::oldest_clog_xid())) return true;
    return TransactionIdDidAbort(xid);
}

bool sweep_due(const SweepClock &clock) {
    if (clock.cost_us < kCheapSweepUs) return true;
    return clock.cpu_since_us >= kSweepRatio * clock.cost_us ||
           monotonic_us() - clock.last_end_us >= kSweepWallRatio * clock.cost_us;
}

}  // namespace queue
}  // namespace sharding

namespace {

bool should_sweep(const Position &pos, const SweepClock &clock, uint32 filter_hash) {
    if (!pos.valid || pos.filter_hash != filter_hash || sharding::queue::rolled_back(pos.xid)) return true;
    return sharding::queue::sweep_due(clock);
}

// A DestReceiver that passes the claimed rows on to the tuplestore receiver
// and remembers the claim-order key of the last one (rows arrive in claim
// order).
struct KeyCapture {
    DestReceiver pub;  // first: the executor sees a DestReceiver
    DestReceiver *inner;
    const QueueColumns *cols;
    AttrNumber att_priority, att_run_at, att_created, att_id;
    Position last;
};

bool capture_receive(TupleTableSlot *slot, DestReceiver *self) {
    KeyCapture *k = reinterpret_cast<KeyCapture *>(self);
    if (k->att_id == InvalidAttrNumber) {
        TupleDesc d = slot->tts_tupleDescriptor;
        for (int i = 0; i < d->natts; i++) {
            const char *n = NameStr(TupleDescAttr(d, i)->attname);
            if (TupleDescAttr(d, i)->attisdropped) continue;
            if (strcmp(n, "id") == 0) k->att_id = i + 1;
            if (strcmp(n, "created") == 0) k->att_created = i + 1;
            if (strcmp(n, "run_at") == 0) k->att_run_at = i + 1;
            if (strcmp(n, "priority") == 0) k->att_priority = i + 1;
        }
    }
    bool id_null, created_null, run_at_null = false, priority_null = false;
    Datum id = slot_getattr(slot, k->att_id, &id_null);
    Datum created = slot_getattr(slot, k->att_created, &created_null);
    Datum run_at = k->cols->has_run_at ? slot_getattr(slot, k->att_run_at, &run_at_null) : (Datum)0;
    Datum priority = k->cols->has_priority ? slot_getattr(slot, k->att_priority, &priority_null) : (Datum)0;
    // A NULL key cannot be compared: no position then (the next claim sweeps).
    k->last.valid = !id_null && !created_null && !run_at_null && !priority_null;
    if (k->last.valid) {
        k->last.id = DatumGetInt64(id);
        k->last.created = DatumGetTimestampTz(created);
        k->last.run_at = k->cols->has_run_at ? DatumGetTimestampTz(run_at) : 0;
        k->last.priority = k->cols->has_priority ? DatumGetInt16(priority) : 0;
    }
    return k->inner->receiveSlot(slot, k->inner);
}

void capture_startup(DestReceiver *self, int operation, TupleDesc typeinfo) {
    KeyCapture *k = reinterpret_cast<KeyCapture *>(self);
    k->inner->rStartup(k->inner, operation, typeinfo);
}

void capture_shutdown(DestReceiver *self) {
    KeyCapture *k = reinterpret_cast<KeyCapture *>(self);
    k->inner->rShutdown(k->inner);
}

void capture_destroy(DestReceiver *self) {
    KeyCapture *k = reinterpret_cast<KeyCapture *>(self);
    k->inner->rDestroy(k->inner);
    pfree(k);
}

// A hash of what restricts a claim_shards scan (a position found with one
// set of shards is no position for another).
uint32 shard_filter_hash(const char *column, int32 shard_count, ArrayType *shards) {
    uint32 h = hash_bytes(reinterpret_cast<const unsigned char *>(column), static_cast<int>(strlen(column)));
    h = hash_combine(h, hash_bytes_uint32(static_cast<uint32>(shard_count)));
    return hash_combine(h, hash_bytes(reinterpret_cast<const unsigned char *>(ARR_DATA_PTR(shards)),
                                      static_cast<int>(ARR_SIZE(shards) - ARR_DATA_OFFSET(shards))));
}

// A hash of what restricts a claim_node scan: the key column, map and node,
// and the routing generation (sharding::routing_generation): once any map
// changed, a shard this node gained may hold rows behind the position, so
// the next claim sweeps.
uint32 node_filter_hash(const char *column, text *map, text *node) {
    uint32 h = hash_bytes(reinterpret_cast<const unsigned char *>(column), static_cast<int>(strlen(column)));
    h = hash_combine(h, hash_bytes(reinterpret_cast<const unsigned char *>(VARDATA_ANY(map)),
                                   static_cast<int>(VARSIZE_ANY_EXHDR(map))));
    h = hash_combine(h, hash_bytes(reinterpret_cast<const unsigned char *>(VARDATA_ANY(node)),
                                   static_cast<int>(VARSIZE_ANY_EXHDR(node))));
    return hash_combine(h, hash_bytes_uint32(static_cast<uint32>(sharding::routing_generation())));
}

using sharding::queue::ClaimArgs;
using sharding::queue::ClaimKind;

// claim, claim_shards and claim_node (unordered), as `a` describes them:
// validates, runs the claim statement, and returns the claimed rows (as
// the table's row type, in claim order) in materialize mode.
Datum claim_common(FunctionCallInfo fcinfo, const ClaimArgs &a) {
    sharding::queue::ClaimCall call = sharding::queue::check_claim_call(fcinfo, a);
    ReturnSetInfo *rsinfo = call.rsinfo;
    const Oid typid = call.typid, relid = call.relid;
    const int32 batch = call.batch;
    const bool by_shard = call.by_shard, by_node = call.by_node;
    const char *key_column = call.key_column;
    uint32 filter_hash = by_shard ? shard_filter_hash(key_column, call.shard_count, call.shards) : 0;

    connect_spi();
    bool handoff = false;
    sharding::queue::NodeClaim node_claim{false, 0};
    if (by_node) {
        // Refuse a caller without rights before taking the map's lock.
        if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid))) sharding::queue::require_update(relid);
        // The map's lock, 42704, the worker's registration (queue_ordered.cpp).
        node_claim = sharding::queue::begin_node_claim(PG_GETARG_DATUM(a.map), PG_GETARG_DATUM(a.node),
                                                       PG_GETARG_DATUM(a.worker));
        filter_hash = node_filter_hash(key_column, PG_GETARG_TEXT_PP(a.map), PG_GETARG_TEXT_PP(a.node));
    }
    QueueEntry *e = lookup_entry(relid);
    if (key_column != nullptr) sharding::queue::check_key_column(relid, key_column);
    if (by_node) {
        handoff = sharding::queue::handoff_needed(relid, key_column, PG_GETARG_DATUM(a.map), PG_GETARG_DATUM(a.node),
                                                  node_claim);
        // While the exclusion holds rows back, they fall behind the
        // position as the claims move on: no position then, every claim
        // sweeps (and the first claim after it sweeps too).
        if (handoff) filter_hash = hash_combine(filter_hash, 0x68616e64u);
    }
    // (The filter hash covers the key column: a claim on another one sweeps.)
    Position &pos = by_shard ? e->shard_pos : by_node ? e->node_pos : e->pos;
    SweepClock &clock = by_shard ? e->shard_sweep : by_node ? e->node_sweep : e->sweep;
    bool sweep = should_sweep(pos, clock, filter_hash) || handoff;
    using sharding::claim_sql::Filter;
    const sharding::claim_sql::ClaimPlan plan_kind = {by_shard ? Filter::Shards : by_node ? Filter::Node : Filter::None,
                                                      !sweep, handoff, e->has_max_attempts};
    sharding::queue::PlanEntry *pe = claim_plan_for(e, key_column, plan_kind);
    SPIPlanPtr plan = pe->plan;
    bool *built = &pe->built;
    // A plan built by this call costs its planning: not a measure of the scan.
    bool fresh_plan = !*built || !SPI_plan_is_valid(plan);

    using namespace sharding::claim_sql;  // ClaimParam
    Datum values[ClaimParams];
    values[CWorker] = PG_GETARG_DATUM(a.worker);
    values[CBatch] = Int32GetDatum(batch);
    values[CLease] = call.lease;
    values[CMaxAttempts] = Int32GetDatum(e->max_attempts);
    values[CShards] = PointerGetDatum(call.shards);
    values[CShardCount] = Int32GetDatum(call.shard_count);
    values[CPosPriority] = Int16GetDatum(pos.priority);
    values[CPosRunAt] = TimestampTzGetDatum(pos.run_at);
    values[CPosCreated] = TimestampTzGetDatum(pos.created);
    values[CPosId] = Int64GetDatum(pos.id);
    values[CMap] = by_node ? PG_GETARG_DATUM(a.map) : (Datum)0;
    values[CNode] = by_node ? PG_GETARG_DATUM(a.node) : (Datum)0;
    ParamListInfo params = makeParamList(ClaimParams);
    params->numParams = ClaimParams;
    for (int i = 0; i < ClaimParams; i++) {
        bool isnull = !claim_param_used(plan_kind, static_cast<ClaimParam>(i));
        params->params[i].value = isnull ? (Datum)0 : values[i];
        params->params[i].isnull = isnull;
        params->params[i].pflags = PARAM_FLAG_CONST;
        params->params[i].ptype = claim_types[i];
    }
    // The claimed rows go straight from the statement into the result.
    sharding::queue::ClaimResult result = sharding::queue::begin_result(rsinfo, typid);
    DestReceiver *inner = result.dest;
    KeyCapture *capture = static_cast<KeyCapture *>(palloc0(sizeof(KeyCapture)));
    capture->pub.receiveSlot = capture_receive;
    capture->pub.rStartup = capture_startup;
    capture->pub.rShutdown = capture_shutdown;
    capture->pub.rDestroy = capture_destroy;
    capture->pub.mydest = DestTuplestore;
    capture->inner = inner;
    capture->cols = &e->cols;
    SPIExecuteOptions options;
    memset(&options, 0, sizeof options);
    options.params = params;
    options.dest = &capture->pub;
    int64 cpu_start = thread_cpu_us();
    int rc = execute_preferring_indexes(plan, built, [&] { return SPI_execute_plan_extended(plan, &options); });
    int64 cpu = thread_cpu_us() - cpu_start;
    if (rc != SPI_OK_SELECT) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    // Defence in depth for the contract's "never more than batch".
    if (n > static_cast<uint64>(batch))
        elog(ERROR, "claim took %llu rows for a batch of %d", static_cast<unsigned long long>(n), batch);
    if (sweep && !fresh_plan)
        clock = SweepClock{monotonic_us(), cpu, 0};
    else if (!sweep)
        clock.cpu_since_us += cpu;
    // The last row claimed is the new position. A claim that took nothing
    // keeps the old one: it found nothing past it either.
    if (n > 0) {
        pos = capture->last;
        pos.filter_hash = filter_hash;
        pos.xid = GetCurrentTransactionIdIfAny();
    }
    capture->pub.rDestroy(&capture->pub);
    SPI_finish();
    return sharding::queue::finish_result(rsinfo, result);
}

// complete(queue, id, worker, attempt) for either id type.
Datum complete_one(FunctionCallInfo fcinfo, bool int4_id) {
    Oid relid = queue_arg(fcinfo);
    Datum id = id_arg(fcinfo, 1, int4_id);
    require(fcinfo, 2, "worker");
    bool attempt = !PG_ARGISNULL(3);
    Datum values[3] = {id, PG_GETARG_DATUM(2), attempt ? PG_GETARG_DATUM(3) : 0};
    PG_RETURN_BOOL(run_fenced(relid, attempt ? CompleteAttemptPlan : CompletePlan, values, nullptr));
}

// fail(queue, id, worker, retry, attempt) for either id type.
Datum fail_one(FunctionCallInfo fcinfo, bool int4_id) {
    Oid relid = queue_arg(fcinfo);
    Datum id = id_arg(fcinfo, 1, int4_id);
    require(fcinfo, 2, "worker");
    require(fcinfo, 3, "retry");
    bool attempt = !PG_ARGISNULL(4);
    connect_spi();
    QueueEntry *e = lookup_entry(relid);
    Datum values[7] = {id,
                       PG_GETARG_DATUM(2),
                       PG_GETARG_DATUM(3),
                       Int32GetDatum(e->max_attempts),
                       attempt ? PG_GETARG_DATUM(4) : 0,
                       IntervalPGetDatum(&e->backoff_base),
                       IntervalPGetDatum(&e->backoff_max)};
    char nulls[7] = {' ', ' ', ' ', e->has_max_attempts ? ' ' : 'n', attempt ? ' ' : 'n',
                     e->has_backoff ? ' ' : 'n', e->has_backoff ? ' ' : 'n'};
    if (attempt && !e->cols.has_attempts)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue table %s has no attempts column to check attempt %d",
                       e->name, PG_GETARG_INT32(4));
    PlanKind kind = attempt ? FailAttemptPlan : FailPlan;
    int rc = run_fenced_plan(e, kind, values, nulls);
    if (rc != SPI_OK_UPDATE) elog(ERROR, "queue update failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    // A job this backend sent back to pending may lie behind its position.
    if (n > 0 && PG_GETARG_BOOL(3)) {
        e->pos.valid = e->shard_pos.valid = e->node_pos.valid = false;
        sharding::queue::forget_ordered_positions(relid);
    }
    SPI_finish();
    PG_RETURN_BOOL(n > 0);
}

// extend_lease(queue, id, worker, lease, attempt) for either id type.
Datum extend_one(FunctionCallInfo fcinfo, bool int4_id) {
    Oid relid = queue_arg(fcinfo);
    Datum id = id_arg(fcinfo, 1, int4_id);
    require(fcinfo, 2, "worker");
    Datum lease = check_lease(fcinfo, 3);
    bool attempt = !PG_ARGISNULL(4);
    Datum values[4] = {id, PG_GETARG_DATUM(2), lease, attempt ? PG_GETARG_DATUM(4) : 0};
    PG_RETURN_BOOL(run_fenced(relid, attempt ? ExtendAttemptPlan : ExtendPlan, values, nullptr));
}

int compare_int64(const void *a, const void *b) {
    int64 x = *static_cast<const int64 *>(a), y = *static_cast<const int64 *>(b);
    return x < y ? -1 : x > y ? 1 : 0;
}

}  // namespace

namespace sharding {
// Called once from _PG_init.
void queue_init() {
    sharding::cache::register_kind(&queue_kind);
    sharding::queue::ordered_init();
}
}  // namespace sharding

/*
 * claim(queue anyelement, worker text, batch integer DEFAULT 50,
 *       lease interval DEFAULT '5 minutes') RETURNS SETOF anyelement
 *
 * Takes up to batch pending (and due) or expired rows in claim order
 * (priority, run_at, created, id) and leases them to worker; returns them in
 * that order. Called as SELECT * FROM sharding.claim(NULL::jobs, 'w1').
 */
SHARDING_FUNCTION(sharding_claim) { return claim_common(fcinfo, sharding::queue::claim_args); }

/*
 * claim_shards(queue anyelement, worker text, shards integer[],
 *              shard_count integer, batch integer DEFAULT 50,
 *              lease interval DEFAULT '5 minutes', key_column name DEFAULT 'key')
 *   RETURNS SETOF anyelement
 *
 * As claim, only rows whose shard_of(key_column, shard_count) is in shards.
 */
SHARDING_FUNCTION(sharding_claim_shards) { return claim_common(fcinfo, sharding::queue::claim_shards_args); }

namespace sharding {
namespace queue {
// claim_node with ordered => false (queue_ordered.cpp dispatches): the
// resumable claim of claim_shards, filtered by node_for.
Datum claim_node_unordered(FunctionCallInfo fcinfo) { return claim_common(fcinfo, claim_node_args); }
}  // namespace queue
}  // namespace sharding

/*
 * complete(queue regclass, id bigint, worker text, attempt integer DEFAULT NULL)
 *   RETURNS boolean
 *
 * Marks the row done if it is processing, owned by worker, and (when given)
 * in its claim number attempt.
 */
SHARDING_FUNCTION(sharding_complete) { return complete_one(fcinfo, false); }

/*
 * complete(queue regclass, id integer, worker text, attempt integer DEFAULT NULL)
 *   RETURNS boolean
 */
SHARDING_FUNCTION(sharding_complete_int4) { return complete_one(fcinfo, true); }

/*
 * complete(queue regclass, ids bigint[], worker text) RETURNS integer
 *
 * The batch form: completes every listed row that passes the fence, in one
 * statement, and returns how many.
 */
SHARDING_FUNCTION(sharding_complete_many) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "ids");
    require(fcinfo, 2, "worker");
    Datum values[2] = {PG_GETARG_DATUM(1), PG_GETARG_DATUM(2)};
    connect_spi();
    QueueEntry *e = lookup_entry(relid);
    int rc = run_fenced_plan(e, CompleteManyPlan, values, nullptr);
    if (rc != SPI_OK_UPDATE) elog(ERROR, "queue update failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    SPI_finish();
    PG_RETURN_INT32(static_cast<int32>(n));
}

/*
 * complete(queue regclass, ids bigint[], worker text, attempts integer[])
 *   RETURNS bigint[]
 *
 * The batch form fenced per id: completes every listed row that is
 * processing, owned by worker and (where its attempt is not NULL) in that
 * claim number, in one statement; returns the ids that passed, in the
 * order given (each once).
 */
SHARDING_FUNCTION(sharding_complete_attempts) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "ids");
    require(fcinfo, 2, "worker");
    require(fcinfo, 3, "attempts");
    ArrayType *ids = PG_GETARG_ARRAYTYPE_P(1);
    ArrayType *attempts = PG_GETARG_ARRAYTYPE_P(3);
    if (ARR_NDIM(ids) > 1 || ARR_NDIM(attempts) > 1)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "ids and attempts must be one-dimensional arrays");
    int n_ids = ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids));
    int n_attempts = ArrayGetNItems(ARR_NDIM(attempts), ARR_DIMS(attempts));
    if (n_ids != n_attempts)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                       "ids and attempts must have the same length, got %d ids and %d attempts", n_ids, n_attempts);
    Datum *id_elems;
    bool *id_nulls;
    int n;
    deconstruct_array(ids, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &id_elems, &id_nulls, &n);
    connect_spi();
    QueueEntry *e = lookup_entry(relid);
    bool any_attempt = false;
    if (!e->cols.has_attempts) {
        Datum *att_elems;
        bool *att_nulls;
        int m;
        deconstruct_array(attempts, INT4OID, sizeof(int32), true, TYPALIGN_INT, &att_elems, &att_nulls, &m);
        for (int i = 0; i < m; i++) any_attempt = any_attempt || !att_nulls[i];
    }
    if (any_attempt)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue table %s has no attempts column to check attempts",
                       e->name);
    Datum values[3] = {PointerGetDatum(ids), PG_GETARG_DATUM(2), PointerGetDatum(attempts)};
    int rc = run_fenced_plan(e, CompleteAttemptsPlan, values, nullptr);
    if (rc != SPI_OK_UPDATE_RETURNING) elog(ERROR, "queue update failed: %s", SPI_result_code_string(rc));
    uint64 done = SPI_processed;
    int64 *passed = static_cast<int64 *>(SPI_palloc(sizeof(int64) * (done + 1)));
    for (uint64 i = 0; i < done; i++) {
        bool isnull;
        passed[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
    }
    SPI_finish();
    qsort(passed, done, sizeof(int64), compare_int64);
    // In the order given, each id once.
    Datum *out = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
    bool *taken = static_cast<bool *>(palloc0(sizeof(bool) * (done + 1)));
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        if (id_nulls[i]) continue;
        int64 id = DatumGetInt64(id_elems[i]);
        int64 *hit = static_cast<int64 *>(bsearch(&id, passed, done, sizeof(int64), compare_int64));
        if (hit == nullptr || taken[hit - passed]) continue;
        taken[hit - passed] = true;
        out[n_out++] = Int64GetDatum(id);
    }
    PG_RETURN_ARRAYTYPE_P(construct_array(out, n_out, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/*
 * fail(queue regclass, id bigint, worker text, retry boolean DEFAULT true,
 *      attempt integer DEFAULT NULL) RETURNS boolean
 *
 * Same fence as complete; sends the row back to pending (owner and lease
 * cleared; with the queue's backoff, run_at = now() + backoff) or, without
 * retry or once max_attempts is used up, to failed.
 */
SHARDING_FUNCTION(sharding_fail) { return fail_one(fcinfo, false); }

/*
 * fail(queue regclass, id integer, worker text, retry boolean DEFAULT true,
 *      attempt integer DEFAULT NULL) RETURNS boolean
 */
SHARDING_FUNCTION(sharding_fail_int4) { return fail_one(fcinfo, true); }

/*
 * extend_lease(queue regclass, id bigint, worker text, lease interval,
 *              attempt integer DEFAULT NULL) RETURNS boolean
 *
 * Same fence as complete; claim_expires = now() + lease.
 */
SHARDING_FUNCTION(sharding_extend_lease) { return extend_one(fcinfo, false); }

/*
 * extend_lease(queue regclass, id integer, worker text, lease interval,
 *              attempt integer DEFAULT NULL) RETURNS boolean
 */
SHARDING_FUNCTION(sharding_extend_lease_int4) { return extend_one(fcinfo, true); }

/*
 * _queue_sql(queue regclass, kind text) RETURNS text
 *
 * Internal: the SQL text of one queue statement as this backend prepares
 * it (for EXPLAIN in the tests and when troubleshooting a slow queue).
 */
SHARDING_FUNCTION(sharding__queue_sql) {
    Oid relid = queue_arg(fcinfo);
    require(fcinfo, 1, "kind");
    char *kind = text_to_cstring(PG_GETARG_TEXT_PP(1));
    connect_spi();
    QueueEntry *e = lookup_entry(relid);
    char *sql;
    if (strcmp(kind, "claim") == 0)
        sql = claim_sql(e, nullptr, {sharding::claim_sql::Filter::None, false, false, e->has_max_attempts});
    else if (strcmp(kind, "claim_resume") == 0)
        sql = claim_sql(e, nullptr, {sharding::claim_sql::Filter::None, true, false, e->has_max_attempts});
    else if (strncmp(kind, "claim_shards:", 13) == 0) {
        sharding::queue::check_key_column(relid, kind + 13);
        sql = claim_sql(e, kind + 13, {sharding::claim_sql::Filter::Shards, false, false, e->has_max_attempts});
    } else if (strcmp(kind, "complete") == 0)
        sql = statement_sql(e, CompleteAttemptPlan);
    else if (strcmp(kind, "complete_many") == 0)
        sql = statement_sql(e, CompleteManyPlan);
    else if (strcmp(kind, "complete_attempts") == 0)
        sql = statement_sql(e, CompleteAttemptsPlan);
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
SHARDING_FUNCTION(sharding__queue_settings_changed) {
    if (!CALLED_AS_TRIGGER(fcinfo)) elog(ERROR, "_queue_settings_changed must be called as a trigger");
    TriggerData *td = reinterpret_cast<TriggerData *>(fcinfo->context);
    HeapTuple rows[2] = {td->tg_trigtuple, td->tg_newtuple};
    TupleDesc desc = td->tg_relation->rd_att;
    // Columns by name: the table may gain columns in later versions.
    int schema_att = SPI_fnumber(desc, "schema_name"), table_att = SPI_fnumber(desc, "table_name");
    if (schema_att <= 0 || table_att <= 0) elog(ERROR, "sharding.queue_settings lacks schema_name or table_name");
    for (HeapTuple row : rows) {
        if (row == nullptr) continue;
        bool null_schema, null_table;
        Datum schema = heap_getattr(row, schema_att, desc, &null_schema);
        Datum table = heap_getattr(row, table_att, desc, &null_table);
        if (null_schema || null_table) continue;
        Oid nsp = get_namespace_oid(TextDatumGetCString(schema), true);
        if (!OidIsValid(nsp)) continue;
        Oid relid = get_relname_relid(TextDatumGetCString(table), nsp);
        if (OidIsValid(relid)) CacheInvalidateRelcacheByRelid(relid);
    }
    return PointerGetDatum(nullptr);
}

namespace sharding {
namespace queue {

Queue *lookup(Oid relid) { return lookup_entry(relid); }

ClaimResult begin_result(ReturnSetInfo *rsinfo, Oid typid) {
    ClaimResult r;
    MemoryContext per_query = rsinfo->econtext->ecxt_per_query_memory;
    MemoryContext old = MemoryContextSwitchTo(per_query);
    r.desc = lookup_rowtype_tupdesc_copy(typid, -1);
    r.store = tuplestore_begin_heap((rsinfo->allowedModes & SFRM_Materialize_Random) != 0, false, work_mem);
    MemoryContextSwitchTo(old);
    r.dest = CreateDestReceiver(DestTuplestore);
    SetTuplestoreDestReceiverParams(r.dest, r.store, per_query, false, r.desc,
                                    "claimed rows do not match the row type of the queue table");
    return r;
}

Datum finish_result(ReturnSetInfo *rsinfo, const ClaimResult &r) {
    rsinfo->returnMode = SFRM_Materialize;
    rsinfo->setResult = r.store;
    rsinfo->setDesc = r.desc;
    return (Datum)0;
}

PlanEntry *plan_entry(const Queue *q, uint32 kind, const char *key_column) {
    PlanKey k;
    memset(&k, 0, sizeof k);
    k.relid = q->relid;
    k.kind = kind;
    if (key_column != nullptr) namestrcpy(&k.key_column, key_column);
    bool found;
    PlanEntry *p = static_cast<PlanEntry *>(hash_search(plan_cache, &k, HASH_ENTER, &found));
    if (!found) {
        p->plan = nullptr;
        p->built = false;
    } else if (p->plan != nullptr && p->stamp != q->stamp) {
        // Prepared for an older build of the queue entry: an outer call
        // (a trigger that claims) may still be running it.
        retire_plan(p->plan);
        p->plan = nullptr;
        p->built = false;
    }
    p->stamp = q->stamp;
    return p;
}

void check_shards(ArrayType *arr, int32 shard_count) {
    if (ARR_NDIM(arr) > 1)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "shards must be a one-dimensional array");
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
}

ClaimCall check_claim_call(FunctionCallInfo fcinfo, const ClaimArgs &a) {
    ClaimCall c;
    memset(&c, 0, sizeof c);
    c.rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    if (c.rsinfo == nullptr || !IsA(c.rsinfo, ReturnSetInfo) || !(c.rsinfo->allowedModes & SFRM_Materialize))
        sharding::fail(ERRCODE_FEATURE_NOT_SUPPORTED, "set-valued function called in context that cannot accept a set");
    c.typid = get_fn_expr_argtype(fcinfo->flinfo, 0);
    c.relid = OidIsValid(c.typid) ? get_typ_typrelid(c.typid) : InvalidOid;
    if (!OidIsValid(c.relid))
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "queue must be a table's row type (e.g. NULL::jobs), got %s",
                       OidIsValid(c.typid) ? format_type_be(c.typid) : "unknown");
    if (a.map >= 0) {
        require(fcinfo, a.map, "map");
        require(fcinfo, a.node, "node");
        require(fcinfo, a.ordered_arg, "ordered");
        c.by_node = true;
    }
    require(fcinfo, a.worker, "worker");
    require(fcinfo, a.batch, "batch");
    c.batch = PG_GETARG_INT32(a.batch);
    if (c.batch < 1) sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "batch must be at least 1, got %d", c.batch);
    c.lease = check_lease(fcinfo, a.lease);
    if (a.kind == ClaimKind::Shards) {
        // Shards required (and checked before the key column, as always).
        require(fcinfo, a.shards, "shards");
        require(fcinfo, a.shard_count, "shard_count");
        require(fcinfo, a.key_column, "key_column");
        c.shard_count = sharding::check_shard_count(PG_GETARG_INT32(a.shard_count));
        c.shards = PG_GETARG_ARRAYTYPE_P(a.shards);
        check_shards(c.shards, c.shard_count);
        c.by_shard = true;
        c.key_column = NameStr(*PG_GETARG_NAME(a.key_column));
        return c;
    }
    if (a.key_column >= 0) {
        require(fcinfo, a.key_column, "key_column");
        c.key_column = NameStr(*PG_GETARG_NAME(a.key_column));
    }
    if (a.shards >= 0) {
        // Optional (claim_ordered): both or neither.
        bool has_shards = !PG_ARGISNULL(a.shards), has_count = !PG_ARGISNULL(a.shard_count);
        if (has_shards != has_count)
            sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                           has_shards ? "shards needs shard_count, got NULL" : "shard_count %d needs shards, got NULL",
                           has_count ? PG_GETARG_INT32(a.shard_count) : 0);
        if (has_count) {
            c.shard_count = sharding::check_shard_count(PG_GETARG_INT32(a.shard_count));
            c.shards = PG_GETARG_ARRAYTYPE_P(a.shards);
            check_shards(c.shards, c.shard_count);
            c.by_shard = true;
        }
    }
    return c;
}

}  // namespace queue
}  // namespace sharding
