// The fast pick of an ordered claim (docs/ordered.md): a round's
// candidates tested and locked in C instead of inside the pick statement.
// The claim that runs the rounds is queue_ordered.cpp's.
#include "pg/boundary.hpp"
#include "core/claim_sql.hpp"
#include "core/hash_core.hpp"
#include "pg/cache.hpp"
#include "queue/ordered.hpp"
#include "queue/queue.hpp"

extern "C" {
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator_d.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/tstoreReceiver.h"
#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "storage/bufmgr.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/itemptr.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/typcache.h"
#include "utils/wait_event.h"
}

namespace sharding {
namespace queue {
namespace ordered {

// --- the fast pick: the candidates' tests and locks in C ---
//
// The pick statement tests and locks its candidates itself, one LockRows
// and two head-check subplans per candidate, inside a plan of some sixty
// nodes: setting that plan up and tearing it down cost more than the tests
// (perf at 8 clients: ExecutorStart 18% of the pick, sorts and tuple
// copies another 10%). Where it can, a round instead runs the candidates
// statement (claim_sql::candidates: the same walk, probes, expired leases
// and tail, untested and unlocked) and tests and locks the candidates here,
// with the same rules: per key its oldest candidate (created, id), in claim
// order; the head check of append_head_check, as two probes of the (key,
// status, created, id) index under the statement's snapshot; then SKIP
// LOCKED on exactly the row version the statement read (one updated since
// is skipped, as _current_version skips it). The rows it returns are the
// pick's ('e', 'f', 'w', 'p', 'l', 't').
//
// It is used for an ordinary heap table the caller may SELECT from, without
// row level security for the caller (its policies would apply to the
// pick's subqueries), with a usable head index: a valid btree whose first
// four columns are the key column, status, created and id with their
// default operator classes, the columns' collations, ascending, and a
// predicate (if any) that status = 'pending' and status = 'processing'
// each imply. Otherwise the pick statement runs, as before.


// Whether the index predicate pred (implicit AND, Vars of varno 1) holds
// for every row whose status (attribute att, collation coll) is `value`.
bool implied_by_status(List *pred, AttrNumber att, Oid coll, const char *value) {
    if (pred == NIL) return true;
    Var *var = makeVar(1, att, TEXTOID, -1, coll, 0);
    Const *c = makeConst(TEXTOID, -1, DEFAULT_COLLATION_OID, -1, CStringGetTextDatum(value), false, false);
    Expr *clause = make_opclause(TextEqualOperator, BOOLOID, false, reinterpret_cast<Expr *>(var),
                                 reinterpret_cast<Expr *>(c), InvalidOid, coll);
    set_opfuncid(reinterpret_cast<OpExpr *>(clause));
    return predicate_implied_by(pred, list_make1(clause), false);
}

// The equality procedure of an index column's operator family for its
// input type (InvalidOid: none).
RegProcedure index_equality(Relation index, int col) {
    Oid op = get_opfamily_member(index->rd_opfamily[col], index->rd_opcintype[col], index->rd_opcintype[col],
                                 BTEqualStrategyNumber);
    return OidIsValid(op) ? get_opcode(op) : InvalidOid;
}

// Looks for a head index of table rel and key column key_att (see above).
HeadIndex find_head_index(Relation rel, AttrNumber key_att) {
    HeadIndex h;
    memset(&h, 0, sizeof h);
    Oid relid = RelationGetRelid(rel);
    h.key_att = key_att;
    h.status_att = get_attnum(relid, "status");
    h.created_att = get_attnum(relid, "created");
    h.id_att = get_attnum(relid, "id");
    h.expires_att = get_attnum(relid, "claim_expires");
    if (h.key_att == InvalidAttrNumber || h.status_att == InvalidAttrNumber || h.created_att == InvalidAttrNumber ||
        h.id_att == InvalidAttrNumber || h.expires_att == InvalidAttrNumber)
        return h;
    const AttrNumber want[4] = {h.key_att, h.status_att, h.created_att, h.id_att};
    List *indexes = RelationGetIndexList(rel);
    ListCell *lc;
    foreach (lc, indexes) {
        Relation index = try_relation_open(lfirst_oid(lc), AccessShareLock);
        if (index == nullptr) continue;
        if (index->rd_rel->relkind != RELKIND_INDEX) {
            relation_close(index, NoLock);
            continue;
        }
        Form_pg_index form = index->rd_index;
        bool ok = index->rd_rel->relam == BTREE_AM_OID && form->indisvalid && form->indisready && form->indislive &&
                  form->indnkeyatts >= 4;
        for (int i = 0; ok && i < 4; i++) {
            AttrNumber att = want[i];
            Form_pg_attribute a = TupleDescAttr(RelationGetDescr(rel), att - 1);
            Oid opclass = GetDefaultOpClass(a->atttypid, BTREE_AM_OID);
            ok = form->indkey.values[i] == att && OidIsValid(opclass) &&
                 get_opclass_family(opclass) == index->rd_opfamily[i] && index->rd_indoption[i] == 0 &&
                 index->rd_indcollation[i] == a->attcollation;
        }
        if (ok) {
            Oid status_coll = index->rd_indcollation[1];
            List *pred = RelationGetIndexPredicate(index);
            ok = implied_by_status(pred, h.status_att, status_coll, "pending") &&
                 implied_by_status(pred, h.status_att, status_coll, "processing");
        }
        if (ok) {
            h.key_eq = index_equality(index, 0);
            h.status_eq = index_equality(index, 1);
            h.key_collation = index->rd_indcollation[0];
            h.status_collation = index->rd_indcollation[1];
            // The candidates are grouped by their keys' text: a
            // nondeterministic collation would call two of them one key.
            ok = OidIsValid(h.key_eq) && OidIsValid(h.status_eq) &&
                 (!OidIsValid(h.key_collation) || get_collation_isdeterministic(h.key_collation)) &&
                 (!OidIsValid(h.status_collation) || get_collation_isdeterministic(h.status_collation));
        }
        relation_close(index, NoLock);
        if (ok) {
            h.index = lfirst_oid(lc);
            break;
        }
    }
    list_free(indexes);
    return h;
}

// The head index of (q, key column), kept in the backend's state of the
// claim and looked for again when the queue entry was rebuilt (a new or
// dropped index invalidates it).
const HeadIndex &head_index(const sharding::queue::Queue *q, Relation rel, const char *key_column, OrderedState *st) {
    if (st->head.stamp != q->stamp) {
        st->head.stamp = 0;  // (find_head_index may raise)
        HeadIndex h = find_head_index(rel, get_attnum(q->relid, key_column));
        h.stamp = q->stamp;
        st->head = h;
    }
    return st->head;
}


IndexScanDesc begin_index_scan(Relation heap, Relation index, Snapshot snapshot, int nkeys) {
    return sharding::compat::index_beginscan(heap, index, snapshot, nkeys, 0);
}

void scan_key(ScanKey k, AttrNumber att, RegProcedure eq, Oid collation, Datum value) {
    ScanKeyEntryInitialize(k, 0, att, BTEqualStrategyNumber, InvalidOid, collation, eq, value);
}

// Whether this claim can test and lock in C (see above); opens what it
// needs in f. The queue table is locked (open_queue).
bool begin_fast(FastPick *f, const sharding::queue::Queue *q, const char *key_column, OrderedState *st) {
    Oid relid = q->relid;
    // Under REPEATABLE READ and SERIALIZABLE the pick statement's FOR
    // UPDATE raises a serialization failure for a row updated since the
    // transaction's snapshot (here it would be skipped), and reads take
    // predicate locks: the statement does it.
    if (IsolationUsesXactSnapshot()) return false;
    if (get_rel_relkind(relid) != RELKIND_RELATION) return false;
    if (pg_class_aclcheck(relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK) return false;
    if (check_enable_rls(relid, InvalidOid, true) == RLS_ENABLED) return false;
    Relation rel = table_open(relid, NoLock);
    if (rel->rd_tableam != GetHeapamTableAmRoutine()) {
        table_close(rel, NoLock);
        return false;
    }
    const HeadIndex &h = head_index(q, rel, key_column, st);
    if (!OidIsValid(h.index)) {
        table_close(rel, NoLock);
        return false;
    }
    f->rel = rel;
    f->head = h;
    f->index = index_open(h.index, AccessShareLock);
    f->row = table_slot_create(rel, nullptr);
    f->probe = table_slot_create(rel, nullptr);
    f->snapshot = nullptr;
    f->pending = f->processing = nullptr;
    f->now = GetCurrentTransactionStartTimestamp();
    f->cid = InvalidCommandId;
    scan_key(&f->pending_keys[0], 1, h.key_eq, h.key_collation, (Datum)0);
    scan_key(&f->pending_keys[1], 2, h.status_eq, h.status_collation, CStringGetTextDatum("pending"));
    scan_key(&f->processing_keys[0], 1, h.key_eq, h.key_collation, (Datum)0);
    scan_key(&f->processing_keys[1], 2, h.status_eq, h.status_collation, CStringGetTextDatum("processing"));
    return true;
}

// The snapshot of a round: its candidates statement runs under it and the
// head checks read with it, as the pick statement's subplans read under
// the pick's (so a job the round's reaper fails still blocks its key until
// the next claim, on either path).
Snapshot fast_round_snapshot(FastPick *f) {
    if (f->snapshot != nullptr) {
        index_endscan(f->pending);
        index_endscan(f->processing);
        UnregisterSnapshot(f->snapshot);
    }
    CommandCounterIncrement();  // (earlier rounds' statements visible, as to the next statement)
    f->snapshot = RegisterSnapshot(GetTransactionSnapshot());
    f->pending = begin_index_scan(f->rel, f->index, f->snapshot, 2);
    f->processing = begin_index_scan(f->rel, f->index, f->snapshot, 2);
    return f->snapshot;
}

void end_fast(FastPick *f) {
    if (f->snapshot != nullptr) {
        index_endscan(f->pending);
        index_endscan(f->processing);
        UnregisterSnapshot(f->snapshot);
    }
    ExecDropSingleTupleTableSlot(f->row);
    ExecDropSingleTupleTableSlot(f->probe);
    index_close(f->index, NoLock);
    table_close(f->rel, NoLock);
}

// (created, id) of o before (created, id) of c, as SQL's row comparison
// decides it (a NULL created decides nothing: false).
bool older(bool o_null, TimestampTz o_created, int64 o_id, bool c_null, TimestampTz c_created, int64 c_id) {
    if (o_null || c_null) return false;
    return o_created < c_created || (o_created == c_created && o_id < c_id);
}

// The head check of append_head_check for the row in f->row: no other job
// of its key processing that is older or under a live lease, no older job
// of its key pending.
bool fast_is_head(FastPick *f) {
    const HeadIndex &h = f->head;
    bool key_null, id_null, created_null;
    Datum key = slot_getattr(f->row, h.key_att, &key_null);
    int64 id = DatumGetInt64(slot_getattr(f->row, h.id_att, &id_null));
    TimestampTz created = DatumGetTimestampTz(slot_getattr(f->row, h.created_att, &created_null));
    if (key_null || id_null) return false;
    // Processing: newest first, as the pick's probe (a busy key's range
    // holds the entries of its jobs done lately, all older than the one in
    // flight, which a backward probe meets first).
    f->processing_keys[0].sk_argument = key;
    index_rescan(f->processing, f->processing_keys, 2, nullptr, 0);
    while (index_getnext_slot(f->processing, BackwardScanDirection, f->probe)) {
        bool o_id_null, o_created_null, expires_null;
        int64 o_id = DatumGetInt64(slot_getattr(f->probe, h.id_att, &o_id_null));
        if (!o_id_null && o_id == id) continue;
        TimestampTz o_created = DatumGetTimestampTz(slot_getattr(f->probe, h.created_att, &o_created_null));
        if (!o_id_null && older(o_created_null, o_created, o_id, created_null, created, id)) return false;
        TimestampTz expires = DatumGetTimestampTz(slot_getattr(f->probe, h.expires_att, &expires_null));
        if (!expires_null && expires >= f->now) return false;
    }
    // Pending: the index holds the key's pending jobs by (created, id), so
    // the first one visible decides; the row itself first (its own entry,
    // the usual case) needs no fetch.
    f->pending_keys[0].sk_argument = key;
    index_rescan(f->pending, f->pending_keys, 2, nullptr, 0);
    while (ItemPointer tid = index_getnext_tid(f->pending, ForwardScanDirection)) {
        if (ItemPointerEquals(tid, &f->row->tts_tid)) return true;
        if (!index_fetch_heap(f->pending, f->probe)) continue;  // not visible
        bool o_id_null, o_created_null;
        int64 o_id = DatumGetInt64(slot_getattr(f->probe, h.id_att, &o_id_null));
        TimestampTz o_created = DatumGetTimestampTz(slot_getattr(f->probe, h.created_att, &o_created_null));
        return o_id_null || !older(o_created_null, o_created, o_id, created_null, created, id);
    }
    return true;
}

// Whether the row in f->row has status `status`.
bool status_is(FastPick *f, const char *status) {
    bool null;
    Datum s = slot_getattr(f->row, f->head.status_att, &null);
    if (null) return false;
    text *st = DatumGetTextPP(s);
    size_t len = strlen(status);
    return VARSIZE_ANY_EXHDR(st) == len && memcmp(VARDATA_ANY(st), status, len) == 0;
}

// Takes the candidate at tid if it is a head: the row version the
// statement read (under the round's snapshot) still has `status` and
// passes the head check, then is locked, SKIP LOCKED and only that
// version (one updated since is not followed: as _current_version leaves
// it). Checked before it is locked, so no row that is not taken stays
// locked (as in the pick statement).
bool fast_take(FastPick *f, ItemPointer tid, const char *status) {
    ItemPointerData t = *tid;
    if (!table_tuple_fetch_row_version(f->rel, &t, f->snapshot, f->row)) return false;
    if (!status_is(f, status) || !fast_is_head(f)) return false;
    TM_FailureData tmfd;
    TM_Result r = table_tuple_lock(f->rel, &t, f->snapshot, f->row, f->cid, LockTupleExclusive, LockWaitSkip, 0, &tmfd);
    return r == TM_Ok && status_is(f, status);
}

// A candidate of the candidates statement.
struct Candidate {
    char kind;  // 'e', 'w', 'p'
    PickRow row;  // kind, position, key
    bool priority_null, created_null;
    ItemPointerData tid;
    bool taken;
};

// Claim order as the statements' ORDER BY spells it: priority DESC (NULLs
// first), run_at, created (NULLs last), id.
int compare_candidates(const Candidate &a, const Candidate &b, bool has_priority, bool has_run_at) {
    if (has_priority) {
        if (a.priority_null != b.priority_null) return a.priority_null ? -1 : 1;
        if (a.row.pos.priority != b.row.pos.priority) return a.row.pos.priority > b.row.pos.priority ? -1 : 1;
    }
    if (has_run_at && a.row.pos.run_at != b.row.pos.run_at) return a.row.pos.run_at < b.row.pos.run_at ? -1 : 1;
    if (a.created_null != b.created_null) return a.created_null ? 1 : -1;
    if (a.row.pos.created != b.row.pos.created) return a.row.pos.created < b.row.pos.created ? -1 : 1;
    if (a.row.pos.id != b.row.pos.id) return a.row.pos.id < b.row.pos.id ? -1 : 1;
    return 0;
}
bool g_fast_priority, g_fast_run_at;  // for the qsort comparator
int compare_candidate_ptrs(const void *a, const void *b) {
    return compare_candidates(**static_cast<Candidate *const *>(a), **static_cast<Candidate *const *>(b),
                              g_fast_priority, g_fast_run_at);
}

// The position columns of a pick or candidates row (2 to 5) into r.
void read_position(HeapTuple t, TupleDesc desc, bool has_priority, bool has_run_at, PickRow *r, bool *priority_null,
                   bool *created_null) {
    bool null_id, null_prio, null_run_at, null_created;
    r->pos.id = DatumGetInt64(SPI_getbinval(t, desc, 2, &null_id));
    r->pos.priority = DatumGetInt64(SPI_getbinval(t, desc, 3, &null_prio));
    r->pos.run_at = DatumGetTimestampTz(SPI_getbinval(t, desc, 4, &null_run_at));
    r->pos.created = DatumGetTimestampTz(SPI_getbinval(t, desc, 5, &null_created));
    r->pos.valid = !null_id && !null_created && !(has_priority && null_prio) && !(has_run_at && null_run_at);
    if (null_id) r->pos.id = 0;
    if (null_prio) r->pos.priority = 0;
    if (null_run_at) r->pos.run_at = 0;
    if (null_created) r->pos.created = 0;
    *priority_null = has_priority && null_prio;
    *created_null = null_created;
}

// The rows of a pick statement (SPI_tuptable) as PickRows.
int read_pick_rows(bool has_priority, bool has_run_at, PickRow **out) {
    TupleDesc desc = SPI_tuptable->tupdesc;
    PickRow *rows = static_cast<PickRow *>(palloc(sizeof(PickRow) * (SPI_processed + 1)));
    for (uint64 i = 0; i < SPI_processed; i++) {
        HeapTuple t = SPI_tuptable->vals[i];
        bool null_kind, null_key, null_n, pn, cn;
        PickRow &r = rows[i];
        r.kind = DatumGetChar(SPI_getbinval(t, desc, 1, &null_kind));
        read_position(t, desc, has_priority, has_run_at, &r, &pn, &cn);
        Datum key = SPI_getbinval(t, desc, 6, &null_key);
        Datum n = SPI_getbinval(t, desc, 7, &null_n);
        r.key = null_key ? nullptr : TextDatumGetCString(key);
        r.n = null_n ? 0 : DatumGetInt64(n);
    }
    *out = rows;
    return static_cast<int>(SPI_processed);
}

int compare_by_key(const void *a, const void *b) {
    const Candidate *x = *static_cast<Candidate *const *>(a), *y = *static_cast<Candidate *const *>(b);
    int c = strcmp(x->row.key, y->row.key);
    if (c != 0) return c;
    return compare_candidates(*x, *y, g_fast_priority, g_fast_run_at);
}

// DISTINCT ON (k) ... ORDER BY k, created, id: created NULLs last.
int compare_by_key_age(const void *a, const void *b) {
    const Candidate *x = *static_cast<Candidate *const *>(a), *y = *static_cast<Candidate *const *>(b);
    int c = strcmp(x->row.key, y->row.key);
    if (c != 0) return c;
    if (x->created_null != y->created_null) return x->created_null ? 1 : -1;
    if (x->row.pos.created != y->row.pos.created) return x->row.pos.created < y->row.pos.created ? -1 : 1;
    if (x->row.pos.id != y->row.pos.id) return x->row.pos.id < y->row.pos.id ? -1 : 1;
    return 0;
}

bool in_ids(const int64 *ids, int n, int64 id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

// One round of the fast pick, from the candidates statement's rows
// (SPI_tuptable, its walk asked for `walk` rows): tests and locks at most
// need candidates, never one of the ids this claim took already, and
// returns the rows the pick statement would have returned.
int fast_round(FastPick *f, int32 need, int32 walk, const int64 *taken, int ntaken, bool has_priority,
               bool has_run_at, PickRow **out) {
    g_fast_priority = has_priority, g_fast_run_at = has_run_at;
    f->cid = GetCurrentCommandId(true);  // the statement's, as its FOR UPDATE would have locked with
    TupleDesc desc = SPI_tuptable->tupdesc;
    const int n = static_cast<int>(SPI_processed);
    Candidate *cands = static_cast<Candidate *>(palloc(sizeof(Candidate) * (n + 1)));
    Candidate **heads = static_cast<Candidate **>(palloc(sizeof(Candidate *) * (n + 1)));
    Candidate **walked = static_cast<Candidate **>(palloc(sizeof(Candidate *) * (n + 1)));
    PickRow *rows = static_cast<PickRow *>(palloc(sizeof(PickRow) * (2 * n + 2)));
    int nheads = 0, nwalked = 0, nrows = 0;
    Candidate *last_walked = nullptr;
    for (int i = 0; i < n; i++) {
        HeapTuple t = SPI_tuptable->vals[i];
        Candidate &c = cands[i];
        bool null_kind, null_key, null_tid, null_ok;
        c.kind = DatumGetChar(SPI_getbinval(t, desc, 1, &null_kind));
        const bool ok = DatumGetBool(SPI_getbinval(t, desc, 8, &null_ok)) && !null_ok;
        c.row.kind = c.kind;
        c.row.n = 0;
        read_position(t, desc, has_priority, has_run_at, &c.row, &c.priority_null, &c.created_null);
        Datum key = SPI_getbinval(t, desc, 6, &null_key);
        Datum tid = SPI_getbinval(t, desc, 7, &null_tid);
        c.row.key = null_key ? nullptr : TextDatumGetCString(key);
        if (!null_tid) c.tid = *reinterpret_cast<ItemPointer>(DatumGetPointer(tid));
        c.taken = false;
        if (c.kind == 't') {
            rows[nrows++] = c.row;
            continue;
        }
        if (c.kind == 'p') rows[nrows++] = c.row;
        if (c.kind == 'w') {
            walked[nwalked++] = &c;
            if (last_walked == nullptr || compare_candidates(*last_walked, c, has_priority, has_run_at) < 0)
                last_walked = &c;
        }
        if (null_tid || c.row.key == nullptr || !ok) continue;  // (the statement filters NULL keys)
        heads[nheads++] = &c;
    }
    // A candidate past where the walk got may be preceded by a head the
    // walk has not reached: only if it reached the end of the line.
    const bool reached_end = nwalked < walk;

    // Per key its oldest candidate (an expired lease is its key's oldest
    // job), then in claim order.
    qsort(heads, nheads, sizeof(Candidate *), compare_by_key_age);
    int m = 0;
    for (int i = 0; i < nheads; i++)
        if (i == 0 || strcmp(heads[i]->row.key, heads[i - 1]->row.key) != 0) heads[m++] = heads[i];
    nheads = m;
    qsort(heads, nheads, sizeof(Candidate *), compare_candidate_ptrs);
    int took = 0;
    Candidate *last_taken = nullptr;
    for (int i = 0; i < nheads && took < need; i++) {
        Candidate &c = *heads[i];
        CHECK_FOR_INTERRUPTS();
        if (!reached_end && (last_walked == nullptr || compare_candidates(c, *last_walked, has_priority, has_run_at) > 0))
            break;
        if (in_ids(taken, ntaken, c.row.pos.id)) continue;
        if (!fast_take(f, &c.tid, c.kind == 'e' ? "processing" : "pending")) continue;
        c.taken = true;
        rows[nrows] = c.row;
        rows[nrows++].kind = c.kind == 'e' ? 'e' : 'f';
        took++;
        last_taken = &c;  // (in claim order: the last one taken is the last)
    }

    // Per key walked and not taken: its first row in claim order and how
    // many; when the round took all it asked for, only the rows up to its
    // last row taken (as the pick statement's ROW(...) <= ... test: a NULL
    // priority or created compares to nothing).
    const bool cut = took >= need;
    auto has_null = [&](const Candidate *c) { return c->priority_null || c->created_null; };
    int nleft = 0;
    for (int i = 0; i < nwalked; i++) {
        Candidate *c = walked[i];
        if (c->taken) continue;
        if (cut && (last_taken == nullptr || has_null(last_taken) || has_null(c) ||
                    compare_candidates(*c, *last_taken, has_priority, has_run_at) > 0))
            continue;
        walked[nleft++] = c;
    }
    qsort(walked, nleft, sizeof(Candidate *), compare_by_key);
    for (int i = 0; i < nleft;) {
        int j = i + 1;
        while (j < nleft && strcmp(walked[j]->row.key, walked[i]->row.key) == 0) j++;
        rows[nrows] = walked[i]->row;
        rows[nrows].kind = 'w';
        rows[nrows++].n = j - i;
        i = j;
    }
    if (last_walked != nullptr) {
        rows[nrows] = last_walked->row;
        rows[nrows].kind = 'l';
        rows[nrows++].n = nwalked;
    }
    *out = rows;
    return nrows;
}

}  // namespace ordered
}  // namespace queue
}  // namespace sharding
