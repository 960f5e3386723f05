// Ordered claims (docs/ordered.md): claims that keep order per key
// (claim_ordered) and claims routed by a map with a safe handoff
// (claim_node).
//
// Per-key order without per-key bookkeeping. A job is claimable when it is
// the *head* of its key: no older (created, id) job of the key is pending
// or processing, and no other job of the key is processing under a live
// lease. The claim walks claimable rows in claim order (the pending index
// create_queue makes) and tests each candidate's head-ness with two probes
// of one partial index, (key, status, created, id) WHERE status IN
// ('pending', 'processing') (sharding.create_ordered_index makes it): one
// for an older pending job, one among the few processing jobs of the key.
// No row per key is ever written; the only state is the jobs themselves.
// A head is unique per key, so a batch holds at most one job per key; a
// concurrent claimer of the same head is excluded by the row lock
// (SKIP LOCKED, on the row version read). With the library preloaded, the
// claims on one queue take turns on one shared position ("one position per
// queue" below); the candidates are tested and locked in C where the queue
// has a usable head index ("the fast pick").
//
// Handoff (claim_node). A claim through node B leaves alone every key whose
// job is processing under a live lease and was claimed through another node
// (its owner is registered in sharding.claim_node_workers, one row per
// worker: the node it last claimed through, for a node other than B), and
// every logical shard such an unpinned key lies in: after a move A -> B, B takes nothing of the shard until A's
// leases end. claim_node holds a share lock on the map's lock tag (the one
// move_shard and rebalance take exclusively) for the rest of its
// transaction, so a move waits for the claims in flight and a claim after
// the move sees it and A's committed claims.
//
// This file is the ordered claims' executor (the rounds of the pick, the
// positions they resume from) and claim_node's first steps. The queue
// engine's shared parts are queue.cpp's (queue.hpp, "the one engine"): one
// queue entry and one plan cache (keyed by table, OrderedPlans | variant
// and key column; a plan is stale once its queue entry was rebuilt), one
// validation (lookup, claim_columns, check_key_column), one argument check
// (check_claim_call, from the description claim_ordered_args or
// claim_node_args); the SQL text is the claim-SQL builder's
// (core/claim_sql.cpp).
//
// Boundary (boundary.hpp, rule 2): no owning C++ object on the stack
// anywhere; SQL text lives in StringInfo (palloc).
#include "pg/boundary.hpp"
#include "core/claim_sql.hpp"
#include "core/hash_core.hpp"
#include "pg/cache.hpp"
#include "pg/keys.hpp"
#include "pg/shard_lock.hpp"
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

namespace {

// The variant bits of an ordered claim statement (Ordered ... Update) and
// the pick's parameters (PickParam) are the claim-SQL builder's
// (core/claim_sql.hpp), which builds the text of every claim kind.
using namespace sharding::claim_sql;  // Ordered ... Update, PickParam

// The plans live in the one plan cache of the queue engine (queue.hpp,
// cached_plan: keyed by table, OrderedPlans | variant and key column); the
// positions below in the cache module's memory.
MemoryContext ordered_cxt = nullptr;
SPIPlanPtr node_check_plan = nullptr;
SPIPlanPtr register_plan = nullptr;

void ensure_context() {
    if (ordered_cxt == nullptr) ordered_cxt = sharding::cache::entry_context("sharding ordered claim positions");
}

using sharding::queue::connect_spi;
using sharding::queue::keep;
using sharding::queue::qualified_name;
using sharding::queue::require;


// What the SQL text of a claim on one queue is built from.
struct Shape {
    Oid relid;
    const char *qname;
    const char *key;       // quoted key column
    const char *key_type;  // its type, as format_type_be spells it
    int key_att;           // its attribute number
    bool has_attempts, has_run_at, has_priority;
};


// Head of its key: no older pending job, no older processing job, no other
// job under a live lease (the last only arises when plain claim and
// claim_ordered share a queue). OFFSET 0 keeps the second a probe of the
// key's few processing rows per candidate, where an anti join would scan
// every live lease per candidate. Its ORDER BY is the order of the
// (key, status, created, id) index, so the probe descends that index: with
// statistics that count few processing rows, the planner otherwise took
// the (claim_expires) WHERE status = 'processing' index and read, per
// candidate, every entry in it, including the stale entries every
// completed job leaves until VACUUM, a cost that grew with the jobs done
// (the cause of claim_ordered's slowness with concurrent workers).
// `oldest_pending`: c is known to be its key's oldest pending job under the
// statement's snapshot (the fallback picks it so), and the first probe,
// which asks just that under the same snapshot, is left out.
//
// The processing probe first (CASE fixes the order), and backwards:
// a busy key's index range holds an entry for every job of it done
// lately, dead but not yet removable or killed (on a page that
// changes all the time, btree cannot mark them), all older than the
// job in flight, which a backward probe meets first. The pending
// probe then runs only for keys with nothing in flight.
//
// "status = ANY ('{pending,processing}') AND status > 'pending'" is
// status = 'processing' spelled so that only the (key, status,
// created, id) index can serve it: the partial index on claim_expires
// WHERE status = 'processing' cannot prove its predicate from it.
// Planned right after ANALYZE of a queue with nothing in flight, the
// generic plan otherwise took that index (estimated empty) and read
// all of it, with every entry a completed job leaves, per candidate:
// most of the CPU of a claim once workers had run a while.
// (The text: append_head_check in core/claim_sql.cpp.)

// The pick of an ordered claim: which rows it locks, in one statement per
// round (claim_ordered_common runs the rounds and the UPDATE). Keys take
// turns oldest head first: a batch of b holds the b first heads in claim
// order among the keys that have a claimable head, whatever the queue looks
// like (docs/ordered.md).
//
// A head is a key's oldest pending job (by created, id), claimable when no
// job of its key is processing under a live lease or older (the head
// check). The pick walks the pending jobs in claim order (the pending
// index create_queue makes) and tests, per key walked, its oldest walked
// job: only it can be the head. The rows of the keys in $14 are left out
// of the walk at the scan (a filter on the index scan: no row of theirs is
// materialised, sorted or tested), and each such key's head is looked up
// directly instead, one descent of the (key, status, created, id) index
// (probes). Those are the keys known to hold pending jobs in the part of
// the line already walked: blocked keys (their head in flight or not due),
// keys whose head was just taken, heads another worker had locked. So a
// whale's backlog at the front costs one probe per claim, not a walk over
// it. Expired leases are candidates too (each its key's oldest job).
// Candidates up to where the walk got (all of them if it reached the end of
// the line) are tested and locked (SKIP LOCKED) in claim order until $2 are
// taken: a claim locks only what it takes.
//
// Parameters: $1 worker, $2 batch (what the round still needs), $3 lease,
// $4 shards, $5 shard_count, $6 map, $7 node, $8 max_attempts, $9 the
// walk's length, $10-$13 the position the walk starts after (priority,
// run_at, created, id; the Resume variant), $14 the keys left out of the
// walk (text[]), $15 ids already taken by this claim, $16 whether this is
// the claim's first round (the reaper runs only then), $17 the keys probed
// (the remembered ones in the first round, then every key of $14: a left
// out key's head is tested in the round whose walk gets as far as it).
//
// It returns the rows it locked and what the walk saw, one row each:
//   'e' an expired lease locked (id, its claim-order key, key)
//   'f' a pending head locked
//   'w' per key walked and not taken: its first such row in claim order,
//       n: how many
//   'p' per probed key: its oldest pending job
//   'l' the walk's last row, n: how many rows the walk read
//   't' when the walk reached the end of the line: the last pending row in
//       claim order (unfiltered), if due
// The parameters' types, by PickParam (core/claim_sql.hpp).
Oid pick_types[PickParams] = {TEXTOID, INT4OID,        INTERVALOID,    INT4ARRAYOID, INT4OID,     TEXTOID,
                              TEXTOID, INT4OID,        INT4OID,        INT8OID,      TIMESTAMPTZOID, TIMESTAMPTZOID,
                              INT8OID, TEXTARRAYOID,   INT8ARRAYOID,   BOOLOID,      TEXTARRAYOID};

// The text of the pick and of the UPDATE (core/claim_sql.cpp).
sharding::claim_sql::OrderedTable ordered_table(const Shape &q) {
    return {{q.qname, q.has_attempts, q.has_run_at, q.has_priority}, q.key, q.key_type};
}

char *pick_sql(const Shape &q, uint32 variant) {
    if ((variant & ListedJob) == ListedJob)
        return sharding::queue::sql_text([&] { return sharding::claim_sql::listed_job(ordered_table(q)); });
    if (variant & Candidates)
        return sharding::queue::sql_text(
            [&] { return sharding::claim_sql::candidates(ordered_table(q), variant & ~static_cast<uint32>(Candidates)); });
    return sharding::queue::sql_text([&] { return sharding::claim_sql::pick(ordered_table(q), variant); });
}

// The claim's UPDATE: $1 worker, $2 the picked ids, $3 lease; the claimed
// rows come back in claim order.
char *update_sql(const Shape &q) {
    return sharding::queue::sql_text([&] { return sharding::claim_sql::update(ordered_table(q)); });
}
Oid update_types[3] = {TEXTOID, INT8ARRAYOID, INTERVALOID};
Oid listed_job_types[ListedJobParams] = {TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID};

// The shape of an ordered claim on the queue q (validated by lookup and
// claim_columns) and its key column.
Shape shape_of(const sharding::queue::Queue *q, const sharding::queue::QueueColumns &cols, const char *key_column) {
    Shape shape;
    shape.relid = q->relid;
    shape.qname = q->name;
    shape.key = quote_identifier(key_column);
    AttrNumber ka = get_attnum(q->relid, key_column);
    shape.key_type = ka == InvalidAttrNumber ? "text" : format_type_be_qualified(get_atttype(q->relid, ka));
    shape.key_att = ka;
    shape.has_attempts = cols.has_attempts;
    shape.has_run_at = cols.has_run_at;
    shape.has_priority = cols.has_priority;
    return shape;
}

// The kept plan of `variant` on the queue q (after lookup, claim_columns
// and check_key_column).
sharding::queue::PlanEntry *plan_for(const sharding::queue::Queue *q, const sharding::queue::QueueColumns &cols,
                                     uint32 variant, const char *key_column) {
    auto build = [&] {
        elog(DEBUG1, "sharding: preparing ordered claim variant %u on %s", variant, q->name);
        Shape shape = shape_of(q, cols, key_column);
        return (variant & ListedJob) == Update ? update_sql(shape) : pick_sql(shape, variant);
    };
    if ((variant & ListedJob) == ListedJob)
        return sharding::queue::cached_plan(q, sharding::queue::OrderedPlans | variant, key_column, ListedJobParams,
                                            listed_job_types, build);
    if (variant & Update)
        return sharding::queue::cached_plan(q, sharding::queue::OrderedPlans | variant, key_column, UpdateParams,
                                            update_types, build);
    return sharding::queue::cached_plan(q, sharding::queue::OrderedPlans | variant, key_column, PickParams,
                                        pick_types, build);
}

// --- argument checks (22023, naming the value) ---




// The handoff exclusion costs a scan of the queue's live leases on every
// claim_node. It can only matter while a worker registered with another
// node holds a job of a key this node now routes to. Through claim_node
// of the same map and key column, such a job arises only from a change of
// the routing (a move, rebalance, pin or unpin, each of which bumps the
// routing generation and waits for claims in flight through the map lock)
// or of the registrations (a fingerprint of the map's claim_node_workers
// rows). So once a claim found no job of another node's worker processing
// on this node's keys (live or expired: extend_lease can revive an
// expired one), the queue, key column, map and node are remembered as
// clear for that generation and fingerprint, and later claims leave the
// exclusion out until one of them changes. Jobs such workers take with
// claim, claim_shards or claim_ordered, or through claim_node with
// another map or key column, are outside the rule. A few slots, reused in
// turn.
struct HandoffClear {
    Oid relid;
    NameData column;
    uint64 map_node;  // hash of map and node
    uint64 generation;
    int64 registrations;
};
HandoffClear handoff_clear[16];
int handoff_next = 0;

// The whole map's lock (pg/shard_lock.hpp): move_shard and pin take it in
// RowExclusiveLock, rebalance and drop_map in ExclusiveLock; ShareLock here
// conflicts with them and with no claim or fence.
void lock_map_shared(text *map) {
    (void)sharding::lock_shard(map, sharding::map_level, ShareLock);
    // A move may have committed while we waited: see it in node_for.
    AcceptInvalidationMessages();
}

}  // namespace

namespace sharding {
namespace queue {

NodeClaim begin_node_claim(Datum map, Datum node, Datum worker) {
    lock_map_shared(DatumGetTextPP(map));
    if (node_check_plan == nullptr) {
        Oid types[3] = {TEXTOID, TEXTOID, TEXTOID};
        node_check_plan = keep("SELECT EXISTS (SELECT FROM sharding.maps m WHERE m.map = $1), "
                               "(SELECT w.node FROM sharding.claim_node_workers w WHERE w.map = $1 AND w.worker = $2), "
                               "(SELECT count(*) FROM sharding.claim_node_workers w WHERE w.map = $1 AND w.node <> $3), "
                               "(SELECT pg_catalog.bit_xor(pg_catalog.hashtextextended(w.worker || E'\\x01' || w.node, 0)) "
                               "# pg_catalog.count(*) FROM sharding.claim_node_workers w WHERE w.map = $1)",
                               3, types);
        Oid rtypes[3] = {TEXTOID, TEXTOID, TEXTOID};
        register_plan = keep("INSERT INTO sharding.claim_node_workers AS w (map, worker, node) VALUES ($1, $2, $3) "
                             "ON CONFLICT (map, worker) DO UPDATE SET node = EXCLUDED.node, since = pg_catalog.now()",
                             3, rtypes);
    }
    Datum values[3] = {map, worker, node};
    int rc = SPI_execute_plan(node_check_plan, values, nullptr, false, 1);
    if (rc != SPI_OK_SELECT || SPI_processed != 1) elog(ERROR, "claim_node: map lookup failed");
    HeapTuple row = SPI_tuptable->vals[0];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool isnull;
    bool exists = DatumGetBool(SPI_getbinval(row, desc, 1, &isnull));
    if (!exists)
        sharding::fail(ERRCODE_UNDEFINED_OBJECT, "map \"%s\" does not exist", TextDatumGetCString(map));
    NodeClaim c;
    c.others = DatumGetInt64(SPI_getbinval(row, desc, 3, &isnull)) > 0;
    Datum registrations = SPI_getbinval(row, desc, 4, &isnull);
    c.registrations = isnull ? 0 : DatumGetInt64(registrations);
    Datum current = SPI_getbinval(row, desc, 2, &isnull);
    if (isnull || !DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, current, node))) {
        Datum rvalues[3] = {map, worker, node};
        rc = SPI_execute_plan(register_plan, rvalues, nullptr, false, 0);
        if (rc != SPI_OK_INSERT) elog(ERROR, "claim_node: registering the worker failed");
    }
    return c;
}

bool handoff_needed(Oid relid, const char *key_column, Datum map, Datum node, const NodeClaim &c) {
    if (!c.others) return false;
    // Under REPEATABLE READ or SERIALIZABLE the check would read the
    // transaction's snapshot, taken before the map lock was granted: no
    // conclusion to remember, and the claim applies the exclusion.
    if (IsolationUsesXactSnapshot()) return true;
    text *m = DatumGetTextPP(map), *n = DatumGetTextPP(node);
    uint64 mn = sharding::hash_bytes(VARDATA_ANY(m), VARSIZE_ANY_EXHDR(m));
    mn = mn * 0x9E3779B97F4A7C15ull ^ sharding::hash_bytes(VARDATA_ANY(n), VARSIZE_ANY_EXHDR(n));
    uint64 generation = sharding::routing_generation();
    HandoffClear *slot = nullptr;
    for (HandoffClear &h : handoff_clear) {
        if (h.relid == relid && h.map_node == mn && strcmp(NameStr(h.column), key_column) == 0) {
            if (h.generation == generation && h.registrations == c.registrations) return false;
            slot = &h;
            break;
        }
    }
    // Are there any, live or not? (An expired lease still processing can
    // be extended by its worker, live again. The claim statement itself
    // computes which block what.)
    const char *qname = qualified_name(relid), *key = quote_identifier(key_column);
    const char *q = sql_text([&] { return "SELECT FROM " + claim_sql::foreign_jobs(qname, key, "$1", "$2", false) + " LIMIT 1"; });
    Oid types[2] = {TEXTOID, TEXTOID};
    Datum values[2] = {map, node};
    int rc = SPI_execute_with_args(q, 2, types, values, nullptr, false, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "claim_node: reading the live leases failed: %s", SPI_result_code_string(rc));
    if (SPI_processed > 0) return true;
    if (slot == nullptr) {
        slot = &handoff_clear[handoff_next];
        handoff_next = (handoff_next + 1) % lengthof(handoff_clear);
    }
    slot->relid = relid;
    namestrcpy(&slot->column, key_column);
    slot->map_node = mn;
    slot->generation = generation;
    slot->registrations = c.registrations;
    return false;
}

}  // namespace queue
}  // namespace sharding

namespace {

// --- where an ordered claim resumes ---
//
// A sweep walks the line from its start: exact. Each backend also
// remembers, per queue, filter and key column, where its last claim's walk
// ended (the position P, a claim-order key) and the keys that still held
// pending jobs before P when it ran (at most kMaxProbed; they were blocked,
// or had their head taken, or another worker held it). Every pending job
// before P then belonged to one of those keys or was taken. The next claim
// walks only past P and probes those keys' heads: with a whale's backlog at
// the front, one probe instead of a walk over the backlog. A key leaves the
// list once none of its pending jobs lies before P (its oldest lies past P,
// and listed_job finds no other before it).
//
// What can appear before P afterwards, of a key not in the list: a job
// inserted with an older claim-order key, a job that became due with a
// higher priority than P's, a job sent back to pending by another backend's
// fail (this backend's fail forgets the positions of the queue), a claim
// rolled back (noticed by its xid). As for claim (queue.cpp), a sweep finds
// them: a claim sweeps when its backend has no position, when the last
// sweep was cheap (then every claim is exact), and otherwise by the budget
// of queue.hpp (SweepClock). A shared position is dropped at once for the
// last two (below).
constexpr int kMaxProbed = 32;

struct OrderPos {
    bool valid;
    int64 priority;
    TimestampTz run_at;
    TimestampTz created;
    int64 id;
};

struct StateKey {
    Oid relid;
    uint32 variant;  // ByShard | ByNode
    NameData key_column;
};

// The head index of a queue and key column (see "the fast pick").
struct HeadIndex {
    uint64 stamp;  // of the queue entry it was found under; 0: not looked for
    Oid index;     // InvalidOid: none usable
    AttrNumber key_att, status_att, created_att, id_att, expires_att;
    RegProcedure key_eq, status_eq;
    Oid key_collation, status_collation;
};

struct OrderedState {
    StateKey key;  // hash key
    bool valid;
    OrderPos pos;
    int nkeys;
    char *keys[kMaxProbed];  // in ordered_cxt
    // Per key: whether a walk saw it with a backlog (two or more pending
    // jobs walked and not taken). Only those are left out of the walks at
    // the scan; the others are only probed.
    bool backlog[kMaxProbed];
    uint32 filter_hash;
    TransactionId xid;  // of the claim that set it
    uint64 stamp;       // of the queue entry it was set under (queue.hpp)
    sharding::queue::SweepClock clock;
    bool shared_copy;   // pos and keys are a copy of the shared position
    // Rows the last claims walked per head they took, in 16ths (0: none
    // yet): the length of the next first walk (claim_common).
    uint32 walk_per_head;
    HeadIndex head;  // (this backend's, never shared)
};

HTAB *state_cache = nullptr;

OrderedState *state_for(Oid relid, uint32 variant, const char *key_column) {
    ensure_context();
    if (state_cache == nullptr) {
        HASHCTL ctl;
        memset(&ctl, 0, sizeof ctl);
        ctl.keysize = sizeof(StateKey);
        ctl.entrysize = sizeof(OrderedState);
        ctl.hcxt = ordered_cxt;
        state_cache = hash_create("sharding ordered claim positions", 16, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    }
    StateKey k;
    memset(&k, 0, sizeof k);
    k.relid = relid;
    k.variant = variant & (ByShard | ByNode);
    namestrcpy(&k.key_column, key_column);
    bool found;
    OrderedState *st = static_cast<OrderedState *>(hash_search(state_cache, &k, HASH_ENTER, &found));
    if (!found) {
        memset(reinterpret_cast<char *>(st) + sizeof(StateKey), 0, sizeof(OrderedState) - sizeof(StateKey));
    }
    return st;
}

struct KeySet;
bool keyset_has(const KeySet *k, const char *key);

// backlog: the keys seen with a backlog (see OrderedState::backlog).
void set_keys(OrderedState *st, char **keys, int n, const KeySet *backlog) {
    for (int i = 0; i < st->nkeys; i++) pfree(st->keys[i]);
    st->nkeys = 0;
    for (int i = 0; i < n && i < kMaxProbed; i++) {
        st->backlog[st->nkeys] = keyset_has(backlog, keys[i]);
        st->keys[st->nkeys++] = MemoryContextStrdup(ordered_cxt, keys[i]);
    }
}

void forget_positions(Oid relid) {
    if (state_cache == nullptr) return;
    HASH_SEQ_STATUS seq;
    hash_seq_init(&seq, state_cache);
    while (OrderedState *st = static_cast<OrderedState *>(hash_seq_search(&seq)))
        if (relid == InvalidOid || st->key.relid == relid) st->valid = false;
}

// --- one position per queue, shared by the backends (preload only) ---
//
// With shared_preload_libraries = 'sharding', the position and its keys
// live in shared memory, one per queue, filter and key column, and the
// ordered claims on it take turns: a claim holds the position's turn from
// reading the position to publishing the next one, that is for its pick
// rounds, and gives it up before its UPDATE. So a claim starts where the
// previous claim of any backend ended: it does not walk over, test or try
// to lock the heads other claims took a moment ago, and it starts with the
// keys the previous claim left listed. With a position per backend, each
// worker resumed from where its own last claim ended and re-walked what
// the others had taken since (8 workers: 3-5 ms of CPU per claim against
// 1.2 ms with one).
//
// The turn is not a lock manager lock: those are granted in line, to a
// waiter that may not be running yet, and with 8 workers on 2 cores the
// turn then sat idle while the next waiter was being scheduled. A claim
// that finds the turn free takes it; a waiter sleeps on the slot's
// condition variable, woken one at a time. It waits at most kTurnWaitMs
// (and not at all for its own backend's turn: a trigger's claim): then it
// claims from a copy of the position without publishing, as if alone.
// So no wait on a turn can deadlock.
//
// The order stays a single claimer's: every pending job before the
// position belongs to a listed key or was taken by a claim (held by its
// transaction or committed). What breaks that is handled here rather than
// left to the next sweep:
// - a claim that published and then rolls back (its jobs are pending
//   again, behind the position): the (sub)transaction's abort, or its
//   PREPARE, invalidates what it published (xact callbacks below);
// - fail(retry => true) sends a job back behind the position: its commit
//   invalidates the queue's positions;
// - the table was rewritten (TRUNCATE, VACUUM FULL: a new relfilenode), or
//   this backend's queue entry was rebuilt since it last used the
//   position (ALTER TABLE).
// Anything else (a job inserted with an older claim-order key, one that
// became due with a higher priority) waits for a sweep, on the budget of
// the position (SweepClock, one per position now).
//
// Without preload, or when all slots are busy, each backend keeps its own
// position, as before.
constexpr int kSharedSlots = 256;
constexpr int kSharedKeyBytes = 128;  // a longer key is not listed: the position stops before it
constexpr long kTurnWaitMs = 1000;

struct SharedSlot {
    // What it is the position of (all zero: free).
    Oid dbid, relid;
    uint32 variant;  // ByShard | ByNode
    uint32 filter_hash;
    NameData key_column;
    uint64 generation;  // bumped by every publication and invalidation
    uint64 last_used;   // SharedOrdered::tick when last taken
    int holder;         // pid of the backend whose turn it is, 0: none
    int waiters;        // backends waiting for the turn
    ConditionVariable turn;
    Oid relfilenode;  // of the table when the position was published
    bool valid;
    OrderPos pos;
    int nkeys;
    bool backlog[kMaxProbed];
    char keys[kMaxProbed][kSharedKeyBytes];
    sharding::queue::SweepClock clock;
    uint32 walk_per_head;  // OrderedState::walk_per_head
};

struct SharedOrdered {
    LWLock *lock;  // every field of every slot (not the condition variables)
    uint64 tick;
    SharedSlot slots[kSharedSlots];
};

SharedOrdered *shared_ordered = nullptr;
shmem_request_hook_type prev_ordered_shmem_request = nullptr;
shmem_startup_hook_type prev_ordered_shmem_startup = nullptr;

void ordered_shmem_request() {
    if (prev_ordered_shmem_request) prev_ordered_shmem_request();
    RequestAddinShmemSpace(MAXALIGN(sizeof(SharedOrdered)));
    RequestNamedLWLockTranche("sharding ordered claims", 1);
}

void ordered_shmem_startup() {
    if (prev_ordered_shmem_startup) prev_ordered_shmem_startup();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found;
    SharedOrdered *s =
        static_cast<SharedOrdered *>(ShmemInitStruct("sharding ordered claims", sizeof(SharedOrdered), &found));
    if (!found) {
        memset(s, 0, sizeof(SharedOrdered));
        s->lock = &(GetNamedLWLockTranche("sharding ordered claims"))->lock;
        for (SharedSlot &slot : s->slots) ConditionVariableInit(&slot.turn);
    }
    shared_ordered = s;
    LWLockRelease(AddinShmemInitLock);
}

// The turn this backend holds (slot index, -1: none) and the
// subtransaction that took it.
int turn_slot = -1;
SubTransactionId turn_subxact = InvalidSubTransactionId;
// The slot this backend is counted as waiting on (-1: none), so that an
// error while it sleeps (a cancel) uncounts it.
int wait_slot = -1;

void stop_waiting() {
    if (wait_slot < 0) return;
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    shared_ordered->slots[wait_slot].waiters--;
    LWLockRelease(shared_ordered->lock);
    wait_slot = -1;
}

// Gives the turn up and wakes one waiter. Never raises.
void give_turn() {
    if (turn_slot < 0) return;
    SharedSlot &s = shared_ordered->slots[turn_slot];
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    bool wake = false;
    if (s.holder == MyProcPid) {
        s.holder = 0;
        wake = s.waiters > 0;
    }
    LWLockRelease(shared_ordered->lock);
    turn_slot = -1;
    turn_subxact = InvalidSubTransactionId;
    if (wake) ConditionVariableSignal(&s.turn);
}

// What this transaction published, invalidated if it (or the
// subtransaction that published) aborts; the queues whose jobs it sent
// back to pending, invalidated when it commits.
constexpr int kMaxNoted = 16;
struct Published {
    int slot;
    SubTransactionId subxact;
};
struct XactNotes {
    int npublished;
    Published published[kMaxNoted];
    bool overflow;  // more than kMaxNoted: every slot of this database
    int nfailed;
    Oid failed[kMaxNoted];
    bool failed_overflow;
};
XactNotes xact_notes = {};

// Invalidates a slot (under the lock): its next claim sweeps, and a claim
// in flight on it publishes no position.
void invalidate_slot(SharedSlot &s) {
    s.valid = false;
    s.generation++;
}

// Invalidates every slot of this database's table relid (InvalidOid: of
// every table).
void invalidate_relation(Oid relid) {
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    for (SharedSlot &s : shared_ordered->slots)
        if (s.dbid == MyDatabaseId && (relid == InvalidOid || s.relid == relid)) invalidate_slot(s);
    LWLockRelease(shared_ordered->lock);
}

// Invalidates the slots this transaction published to (subxact: only those
// published in that subtransaction or its children, which it aborts).
// Whatever was published there since builds on its position: invalidated
// too.
void invalidate_published(SubTransactionId subxact) {
    XactNotes &n = xact_notes;
    if (n.overflow) {
        invalidate_relation(InvalidOid);
        return;
    }
    if (n.npublished == 0) return;
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    int kept = 0;
    for (int i = 0; i < n.npublished; i++) {
        if (subxact == InvalidSubTransactionId || n.published[i].subxact == subxact)
            invalidate_slot(shared_ordered->slots[n.published[i].slot]);
        else
            n.published[kept++] = n.published[i];
    }
    n.npublished = kept;
    LWLockRelease(shared_ordered->lock);
}

void ordered_xact_callback(XactEvent event, void *) {
    if (shared_ordered == nullptr) return;
    // A prepared transaction is committed or rolled back later, elsewhere:
    // what it published and its fail(retry) are invalidated now (a sweep
    // too many at worst).
    bool prepare = event == XACT_EVENT_PREPARE;
    bool commit = event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT || prepare;
    bool abort = event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT;
    if (!commit && !abort) return;
    stop_waiting();
    give_turn();
    XactNotes &n = xact_notes;
    if (abort || prepare) invalidate_published(InvalidSubTransactionId);
    if (commit && (n.nfailed > 0 || n.failed_overflow)) {
        if (n.failed_overflow) invalidate_relation(InvalidOid);
        for (int i = 0; i < n.nfailed && !n.failed_overflow; i++) invalidate_relation(n.failed[i]);
    }
    xact_notes = XactNotes{};
}

// A subtransaction that published may roll back its claim while the
// transaction goes on; one that commits hands its publications to its
// parent.
void ordered_subxact_callback(SubXactEvent event, SubTransactionId subxact, SubTransactionId parent, void *) {
    if (shared_ordered == nullptr) return;
    if (event == SUBXACT_EVENT_ABORT_SUB) {
        stop_waiting();
        if (turn_slot >= 0 && turn_subxact == subxact) give_turn();
        invalidate_published(subxact);
    } else if (event == SUBXACT_EVENT_COMMIT_SUB) {
        if (turn_slot >= 0 && turn_subxact == subxact) turn_subxact = parent;
        for (int i = 0; i < xact_notes.npublished; i++)
            if (xact_notes.published[i].subxact == subxact) xact_notes.published[i].subxact = parent;
    }
}

// The table's relfilenode: a rewrite (TRUNCATE, VACUUM FULL, a rewriting
// ALTER) changes it. 0 for a partitioned table.
Oid table_filenode(Oid relid) {
    Relation rel = RelationIdGetRelation(relid);
    if (rel == nullptr) return InvalidOid;
    Oid f = rel->rd_rel->relfilenode;
    RelationClose(rel);
    return f;
}

// The turn of a position, taken.
struct Turn {
    int slot;            // -1: no slot free, the backend's own position is used
    bool held;           // false: waited too long (or the turn is this backend's): a copy, not published
    uint64 generation;   // of the slot when it was read
    Oid relfilenode;     // of the slot's position (InvalidOid: none)
};

// Takes the turn of a position and copies it into st (its keys palloc'd in
// ordered_cxt). The slot, when it has none: the least recently used one
// that nobody holds or waits for.
Turn take_turn(Oid relid, uint32 variant, const char *key_column, uint32 fh, OrderedState *st) {
    Turn t = {-1, false, 0, InvalidOid};
    SharedOrdered &so = *shared_ordered;
    const int64 deadline = sharding::queue::monotonic_us() + kTurnWaitMs * 1000;
    bool waiting = false;
    OrderedState copy;
    char keys[kMaxProbed][kSharedKeyBytes];
    for (;;) {
        LWLockAcquire(so.lock, LW_EXCLUSIVE);
        int found = -1, victim = -1;
        for (int i = 0; i < kSharedSlots; i++) {
            SharedSlot &s = so.slots[i];
            if (s.dbid == MyDatabaseId && s.relid == relid && s.variant == (variant & (ByShard | ByNode)) &&
                s.filter_hash == fh && strcmp(NameStr(s.key_column), key_column) == 0) {
                found = i;
                break;
            }
            if (s.holder == 0 && s.waiters == 0 && (victim < 0 || s.last_used < so.slots[victim].last_used))
                victim = i;
        }
        if (found < 0 && victim >= 0) {
            // Reused: whoever held its old position finds a new generation
            // and publishes nothing there.
            found = victim;
            SharedSlot &s = so.slots[found];
            s.generation++;
            s.dbid = MyDatabaseId;
            s.relid = relid;
            s.variant = variant & (ByShard | ByNode);
            s.filter_hash = fh;
            namestrcpy(&s.key_column, key_column);
            s.relfilenode = InvalidOid;
            s.valid = false;
            s.nkeys = 0;
            s.clock = sharding::queue::SweepClock{0, 0, 0};
            s.walk_per_head = 0;
        }
        if (found < 0) {  // every slot busy: this backend's own position
            LWLockRelease(so.lock);
            if (waiting) ConditionVariableCancelSleep();
            return t;
        }
        SharedSlot &s = so.slots[found];
        if (waiting) {
            s.waiters--;
            wait_slot = -1;
        }
        bool free = s.holder == 0;
        if (free || s.holder == MyProcPid || sharding::queue::monotonic_us() >= deadline) {
            if (free) s.holder = MyProcPid;
            s.last_used = ++so.tick;
            t = Turn{found, free, s.generation, s.relfilenode};
            copy.valid = s.valid;
            copy.pos = s.pos;
            copy.nkeys = s.nkeys;
            copy.clock = s.clock;
            copy.walk_per_head = s.walk_per_head;
            memcpy(copy.backlog, s.backlog, sizeof copy.backlog);
            memcpy(keys, s.keys, sizeof keys);
            LWLockRelease(so.lock);
            break;
        }
        s.waiters++;
        wait_slot = found;
        if (!waiting) ConditionVariablePrepareToSleep(&s.turn);  // before the lock goes: no lost wake-up
        waiting = true;
        LWLockRelease(so.lock);
        long left = static_cast<long>((deadline - sharding::queue::monotonic_us()) / 1000) + 1;
        (void)ConditionVariableTimedSleep(&s.turn, left, PG_WAIT_EXTENSION);
    }
    if (waiting) ConditionVariableCancelSleep();
    if (t.held) {
        turn_slot = t.slot;
        turn_subxact = GetCurrentSubTransactionId();
    }
    // Into the backend's copy (palloc may raise: not under the lock).
    for (int i = 0; i < st->nkeys; i++) pfree(st->keys[i]);
    st->nkeys = 0;
    st->valid = copy.valid;
    st->pos = copy.pos;
    st->clock = copy.clock;
    st->walk_per_head = copy.walk_per_head;
    for (int i = 0; i < copy.nkeys; i++) {
        st->backlog[i] = copy.backlog[i];
        st->keys[st->nkeys++] = MemoryContextStrdup(ordered_cxt, keys[i]);
    }
    st->xid = InvalidTransactionId;
    st->filter_hash = fh;
    return t;
}

// Publishes st as the position of the turn's slot, unless the slot changed
// since it was read (an invalidation): then it stays no position. Gives
// the turn up. Noted for the transaction's abort.
void publish_and_give_turn(const Turn &t, const OrderedState *st, Oid relfilenode) {
    SharedSlot &s = shared_ordered->slots[t.slot];
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    bool published = false;
    if (s.generation == t.generation) {
        s.valid = st->valid;
        s.pos = st->pos;
        s.relfilenode = relfilenode;
        s.nkeys = 0;
        for (int k = 0; k < st->nkeys; k++) {
            size_t len = strlen(st->keys[k]);
            if (len >= kSharedKeyBytes) {  // (the claim cut its position before such a key)
                s.valid = false;
                break;
            }
            memcpy(s.keys[s.nkeys], st->keys[k], len + 1);
            s.backlog[s.nkeys++] = st->backlog[k];
        }
        s.clock = st->clock;
        s.walk_per_head = st->walk_per_head;
        s.generation++;
        published = true;
    }
    LWLockRelease(shared_ordered->lock);
    give_turn();
    if (!published) return;
    XactNotes &n = xact_notes;
    SubTransactionId sub = GetCurrentSubTransactionId();
    for (int k = 0; k < n.npublished; k++)
        if (n.published[k].slot == t.slot && n.published[k].subxact == sub) return;
    if (n.npublished == kMaxNoted)
        n.overflow = true;
    else
        n.published[n.npublished++] = Published{t.slot, sub};
}

// Claim order of two positions: negative if a comes first.
int compare_pos(bool has_priority, bool has_run_at, const OrderPos &a, const OrderPos &b) {
    if (has_priority && a.priority != b.priority) return a.priority > b.priority ? -1 : 1;
    if (has_run_at && a.run_at != b.run_at) return a.run_at < b.run_at ? -1 : 1;
    if (a.created != b.created) return a.created < b.created ? -1 : 1;
    if (a.id != b.id) return a.id < b.id ? -1 : 1;
    return 0;
}

// One row of a pick's result (see pick_sql).
struct PickRow {
    char kind;
    OrderPos pos;
    char *key;  // palloc'd
    int64 n;
};

// A hash of what restricts an ordered claim (a position found with one
// filter is no position for another): shards, or map, node and routing
// generation (a shard this node gained may hold jobs behind the position).
uint32 filter_hash(FunctionCallInfo fcinfo, uint32 variant, int shards_arg, int shard_count, int map_arg,
                   int node_arg) {
    uint32 h = hash_bytes_uint32(variant & (ByShard | ByNode));
    if (variant & ByShard) {
        ArrayType *arr = PG_GETARG_ARRAYTYPE_P(shards_arg);
        h = hash_combine(h, hash_bytes_uint32(static_cast<uint32>(shard_count)));
        h = hash_combine(h, hash_bytes(reinterpret_cast<const unsigned char *>(ARR_DATA_PTR(arr)),
                                       static_cast<int>(ARR_SIZE(arr) - ARR_DATA_OFFSET(arr))));
    }
    if (variant & ByNode) {
        text *map = PG_GETARG_TEXT_PP(map_arg), *node = PG_GETARG_TEXT_PP(node_arg);
        h = hash_combine(h, hash_bytes(reinterpret_cast<const unsigned char *>(VARDATA_ANY(map)),
                                       static_cast<int>(VARSIZE_ANY_EXHDR(map))));
        h = hash_combine(h, hash_bytes(reinterpret_cast<const unsigned char *>(VARDATA_ANY(node)),
                                       static_cast<int>(VARSIZE_ANY_EXHDR(node))));
        h = hash_combine(h, hash_bytes_uint32(static_cast<uint32>(sharding::routing_generation())));
    }
    return h;
}

// A set of keys in insertion order (palloc'd, open addressing on their
// hashes): the keys a claim leaves out of its walks can be many.
struct KeySet {
    char **list;
    int n, cap;
    int *slots;  // index into list + 1; 0: empty
    uint32 mask;
};

void keyset_init(KeySet *k) {
    k->n = 0;
    k->cap = 16;
    k->list = static_cast<char **>(palloc(sizeof(char *) * k->cap));
    k->mask = 31;
    k->slots = static_cast<int *>(palloc0(sizeof(int) * (k->mask + 1)));
}

uint32 key_hash(const char *key) {
    return hash_bytes(reinterpret_cast<const unsigned char *>(key), static_cast<int>(strlen(key)));
}

bool keyset_has(const KeySet *k, const char *key) {
    for (uint32 i = key_hash(key) & k->mask;; i = (i + 1) & k->mask) {
        if (k->slots[i] == 0) return false;
        if (strcmp(k->list[k->slots[i] - 1], key) == 0) return true;
    }
}

// Adds key unless it is there.
void keyset_add(KeySet *k, const char *key) {
    if (keyset_has(k, key)) return;
    if (k->n == k->cap) {
        k->cap *= 2;
        k->list = static_cast<char **>(repalloc(k->list, sizeof(char *) * k->cap));
    }
    k->list[k->n++] = pstrdup(key);
    if (static_cast<uint32>(k->n) * 2 > k->mask) {
        k->mask = k->mask * 2 + 1;
        pfree(k->slots);
        k->slots = static_cast<int *>(palloc0(sizeof(int) * (k->mask + 1)));
        for (int j = 0; j < k->n; j++) {
            uint32 i = key_hash(k->list[j]) & k->mask;
            while (k->slots[i] != 0) i = (i + 1) & k->mask;
            k->slots[i] = j + 1;
        }
        return;
    }
    uint32 i = key_hash(key) & k->mask;
    while (k->slots[i] != 0) i = (i + 1) & k->mask;
    k->slots[i] = k->n;
}

ArrayType *text_array(char **keys, int n) {
    Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
    for (int i = 0; i < n; i++) d[i] = CStringGetTextDatum(keys[i]);
    return construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT);
}

struct Entry {
    OrderPos pos;
    const char *key;
};
bool g_has_priority, g_has_run_at;  // for the qsort comparators
int compare_entries(const void *a, const void *b) {
    return compare_pos(g_has_priority, g_has_run_at, static_cast<const Entry *>(a)->pos,
                       static_cast<const Entry *>(b)->pos);
}
int compare_rows(const void *a, const void *b) {
    const PickRow *x = static_cast<const PickRow *>(a), *y = static_cast<const PickRow *>(b);
    if (x->pos.valid != y->pos.valid) return x->pos.valid ? -1 : 1;
    return compare_pos(g_has_priority, g_has_run_at, x->pos, y->pos);
}

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

// What the fast pick of one claim holds open across its rounds.
struct FastPick {
    Relation rel, index;
    HeadIndex head;
    IndexScanDesc pending, processing;  // the head check's two probes
    ScanKeyData pending_keys[2], processing_keys[2];
    TupleTableSlot *row, *probe;
    Snapshot snapshot;
    TimestampTz now;
    CommandId cid;
};

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

// One pending job of key at or before the position next in claim order
// (claim_sql::listed_job), into *found.
bool listed_job(const sharding::queue::Queue *q, const sharding::queue::QueueColumns &cols, const char *key_column,
                const char *key, const OrderPos &next, OrderPos *found) {
    sharding::queue::PlanEntry *p = plan_for(q, cols, Ordered | ListedJob, key_column);
    Datum values[ListedJobParams] = {CStringGetTextDatum(key), Int64GetDatum(next.priority),
                                     TimestampTzGetDatum(next.run_at), TimestampTzGetDatum(next.created),
                                     Int64GetDatum(next.id)};
    int rc = SPI_execute_plan(p->plan, values, nullptr, false, 1);
    p->built = true;
    if (rc != SPI_OK_SELECT) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
    bool got = false;
    if (SPI_processed > 0) {
        HeapTuple t = SPI_tuptable->vals[0];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool null_id, null_prio, null_run_at, null_created;
        found->id = DatumGetInt64(SPI_getbinval(t, desc, 1, &null_id));
        found->priority = DatumGetInt64(SPI_getbinval(t, desc, 2, &null_prio));
        found->run_at = DatumGetTimestampTz(SPI_getbinval(t, desc, 3, &null_run_at));
        found->created = DatumGetTimestampTz(SPI_getbinval(t, desc, 4, &null_created));
        found->valid = !null_id && !null_created && !(cols.has_priority && null_prio) && !(cols.has_run_at && null_run_at);
        got = found->valid;
    }
    SPI_freetuptable(SPI_tuptable);
    return got;
}

using sharding::queue::ClaimArgs;

// claim_ordered, and claim_node with ordered => true, as `a` describes them.
Datum claim_common(FunctionCallInfo fcinfo, const ClaimArgs &a) {
    sharding::queue::ClaimCall call = sharding::queue::check_claim_call(fcinfo, a);
    ReturnSetInfo *rsinfo = call.rsinfo;
    const Oid typid = call.typid, relid = call.relid;
    const int32 batch = call.batch, shard_count = call.shard_count;
    const Datum lease = call.lease;
    const char *key_column = call.key_column;
    uint32 variant = Ordered;
    if (call.by_node) variant |= ByNode;
    if (call.by_shard) variant |= ByShard;

    connect_spi();
    sharding::queue::NodeClaim node_claim{false, 0};
    // Refuse a caller without rights before taking the map's lock.
    if ((variant & ByNode) && SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
        sharding::queue::require_update(relid);
    if (variant & ByNode)
        node_claim = sharding::queue::begin_node_claim(PG_GETARG_DATUM(a.map), PG_GETARG_DATUM(a.node),
                                                       PG_GETARG_DATUM(a.worker));
    // The one validation (queue.cpp): the queue table, the columns an
    // ordered claim reads, the key column.
    sharding::queue::Queue *q = sharding::queue::lookup(relid);
    const sharding::queue::QueueColumns cols = sharding::queue::claim_columns(q, true);
    sharding::queue::check_key_column(relid, key_column);
    if ((variant & ByNode) && sharding::queue::handoff_needed(relid, key_column, PG_GETARG_DATUM(a.map),
                                                              PG_GETARG_DATUM(a.node), node_claim))
        variant |= Handoff;
    // (A table without attempts has no max_attempts: lookup.)
    const int32 max_att = q->has_max_attempts ? q->max_attempts : -1;
    if (max_att > 0) variant |= Reap;
    const bool has_priority = cols.has_priority, has_run_at = cols.has_run_at;

    // Sweep or resume (see "where an ordered claim resumes"), from the
    // queue's shared position when there is one (see "one position per
    // queue"): then this claim's turn starts here and ends once its
    // position is published, before its UPDATE.
    OrderedState *st = state_for(relid, variant, key_column);
    uint32 fh = filter_hash(fcinfo, variant, a.shards, shard_count, a.map, a.node);
    // (Opened before the turn: the less a claim does in it, the better.)
    FastPick fast;
    const bool use_fast = begin_fast(&fast, q, key_column, st);
    Turn turn = {-1, false, 0, InvalidOid};
    int64 turn_waited = 0, turn_taken = 0, turn_held = 0;  // monotonic us, for DEBUG1
    Oid relfilenode = InvalidOid;
    if (shared_ordered != nullptr && !(variant & Handoff)) {
        relfilenode = table_filenode(relid);
        // st->stamp: the queue entry's stamp when this backend last used
        // the shared position (0: never).
        const uint64 seen = st->stamp;
        turn_waited = sharding::queue::monotonic_us();
        turn = take_turn(relid, variant, key_column, fh, st);
        turn_taken = sharding::queue::monotonic_us();
        turn_waited = turn_taken - turn_waited;
        if (turn.slot >= 0) {
            if (turn.relfilenode != relfilenode || (seen != 0 && seen != q->stamp)) st->valid = false;
            st->stamp = q->stamp;
            st->shared_copy = true;
        }
    }
    // A backend that falls back to its own position (every slot busy)
    // after using a shared one does not take a stale copy for its own.
    if (turn.slot < 0 && st->shared_copy) {
        st->valid = false;
        st->shared_copy = false;
    }
    bool sweep = !st->valid || st->stamp != q->stamp || st->filter_hash != fh || sharding::queue::rolled_back(st->xid) ||
                 sharding::queue::sweep_due(st->clock) || (variant & Handoff);
    OrderPos start = {false, 0, 0, 0, 0};
    KeySet probe;
    keyset_init(&probe);
    // The remembered keys, copied (a trigger that claims again may replace
    // them while this claim runs).
    int nst_keys = 0;
    char **st_keys = static_cast<char **>(palloc(sizeof(char *) * (kMaxProbed + 1)));
    if (!sweep) {
        start = st->pos;
        for (int i = 0; i < st->nkeys; i++) {
            // Every remembered key is probed ($17); only those with a
            // backlog are left out of the walk ($14). A walked row of
            // another one is newer than its key's probed row, which
            // DISTINCT ON keeps instead, or, in a later round, fails the
            // head check (the check, not the list, decides what is a head,
            // as for a key walked once and not taken). Every row walked is
            // compared with each key of the list: with the 32 remembered
            // keys in it, that cost ~15% of a claim's CPU.
            if (st->backlog[i]) keyset_add(&probe, st->keys[i]);
            st_keys[nst_keys++] = pstrdup(st->keys[i]);
        }
    }

    // The rounds: a pick, and while it found fewer than batch and its walk
    // was cut short, another one past where that walk ended, leaving out
    // the keys it saw.
    int64 cpu_start = sharding::queue::thread_cpu_us();
    bool fresh_plan = false;
    int nrows = 0, rows_cap = 64;
    PickRow *rows = static_cast<PickRow *>(palloc(sizeof(PickRow) * rows_cap));
    int ntaken = 0, taken_cap = 64;
    int64 *taken = static_cast<int64 *>(palloc(sizeof(int64) * taken_cap));
    OrderPos pos = start, end = {false, 0, 0, 0, 0};
    // The first walk: twice the batch and some (a walk too short costs a
    // round), or, once claims resumed here, what they walked per head
    // taken, with a quarter to spare.
    const int32 first_walk = batch > (PG_INT32_MAX - 16) / 2 ? PG_INT32_MAX : batch * 2 + 16;
    int32 walk = first_walk;
    if (!sweep && st->walk_per_head > 0 && batch < (1 << 20)) {
        int64 w = (static_cast<int64>(batch) * st->walk_per_head * 5 / 4 + 15) / 16 + 8;
        if (w < walk) walk = static_cast<int32>(w);
        if (walk < batch + 8) walk = batch + 8;
    }
    int walked_to_frontier = 0;  // rows of the first round's walk up to its last row taken
    int covered = 0;      // rows locked that are final (see below)
    constexpr int32 kMaxWalk = 1 << 20;
    bool limit_hit = false;   // the last round took all it asked for
    bool reached_end = false;  // the last round's walk reached the end of the line
    OrderPos tail = end;       // the last pending row in claim order
    OrderPos frontier = end;  // then: its last fresh row
    for (int round = 0;; round++) {
        CHECK_FOR_INTERRUPTS();
        sharding::queue::PlanEntry *p =
            plan_for(q, cols,
                     variant | (pos.valid ? static_cast<uint32>(Resume) : 0u) |
                         (use_fast ? static_cast<uint32>(Candidates) : 0u),
                     key_column);
        fresh_plan = fresh_plan || !p->built;
        int32 need = batch - covered;
        Datum values[PickParams] = {PG_GETARG_DATUM(a.worker),
                                    Int32GetDatum(need),
                                    lease,
                                    (variant & ByShard) ? PG_GETARG_DATUM(a.shards) : (Datum)0,
                                    Int32GetDatum(shard_count),
                                    (variant & ByNode) ? PG_GETARG_DATUM(a.map) : (Datum)0,
                                    (variant & ByNode) ? PG_GETARG_DATUM(a.node) : (Datum)0,
                                    Int32GetDatum(max_att),
                                    Int32GetDatum(walk),
                                    Int64GetDatum(pos.priority),
                                    TimestampTzGetDatum(pos.run_at),
                                    TimestampTzGetDatum(pos.created),
                                    Int64GetDatum(pos.id),
                                    PointerGetDatum(text_array(probe.list, probe.n)),
                                    (Datum)0,  // taken ids, below
                                    BoolGetDatum(round == 0),
                                    PointerGetDatum(round == 0 ? text_array(st_keys, nst_keys)
                                                               : text_array(probe.list, probe.n))};
        // Round 0 probes the remembered keys; each later round every key
        // it leaves out of its walk ($14), under its own snapshot. A left
        // out key's head may lie past where the earlier rounds' walks got
        // (a key remembered with a backlog whose head lies far ahead of
        // the position): it is tested only in the round whose walk gets
        // that far, and only if that round probes it. (Probing in one
        // round only the keys it began to leave out, a claim walked past
        // such a head and took younger ones: TAP 203.)
        {
            Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (ntaken + 1)));
            for (int i = 0; i < ntaken; i++) d[i] = Int64GetDatum(taken[i]);
            values[PTaken] = PointerGetDatum(construct_array(d, ntaken, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                                         TYPALIGN_DOUBLE));
        }
        ParamListInfo params = makeParamList(PickParams);
        params->numParams = PickParams;
        char nulls[PickParams];
        for (int i = 0; i < PickParams; i++) {
            bool isnull = (i == PShards || i == PShardCount) ? !(variant & ByShard)
                          : (i == PMap || i == PNode)          ? !(variant & ByNode)
                          : i == PMaxAttempts                  ? max_att <= 0
                          : (i >= PPosPriority && i <= PPosId) ? !pos.valid
                                                               : false;
            params->params[i].value = isnull ? (Datum)0 : values[i];
            params->params[i].isnull = isnull;
            params->params[i].pflags = PARAM_FLAG_CONST;
            params->params[i].ptype = pick_types[i];
            nulls[i] = isnull ? 'n' : ' ';
        }
        int rc = use_fast ? SPI_execute_snapshot(p->plan, values, nulls, fast_round_snapshot(&fast), InvalidSnapshot,
                                                 false, true, 0)
                          : SPI_execute_plan_with_paramlist(p->plan, params, false, 0);
        p->built = true;
        if (rc != SPI_OK_SELECT) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
        int fresh = 0, walked = 0;
        OrderPos last = {false, 0, 0, 0, 0}, last_fresh = last;
        PickRow *raw;
        int nraw = use_fast ? fast_round(&fast, need, walk, taken, ntaken, has_priority, has_run_at, &raw)
                            : read_pick_rows(has_priority, has_run_at, &raw);
        for (int i = 0; i < nraw; i++) {
            PickRow r = raw[i];
            if (r.kind == 'l') {
                walked = static_cast<int>(r.n);
                last = r.pos;
                continue;
            }
            if (r.kind == 't') {
                tail = r.pos;
                continue;
            }
            if (r.kind == 'p' && round > 0) continue;  // only the first round's probes decide who stays listed
            if (r.kind == 'e' || r.kind == 'f') {
                if (ntaken == taken_cap) {
                    taken_cap *= 2;
                    taken = static_cast<int64 *>(repalloc(taken, sizeof(int64) * taken_cap));
                }
                taken[ntaken++] = r.pos.id;
                fresh++;
                if (!last_fresh.valid || (r.pos.valid && compare_pos(has_priority, has_run_at, last_fresh, r.pos) < 0))
                    last_fresh = r.pos;
            }
            if (nrows == rows_cap) {
                rows_cap *= 2;
                rows = static_cast<PickRow *>(repalloc(rows, sizeof(PickRow) * rows_cap));
            }
            rows[nrows++] = r;
            // Keys with a backlog (more than one job walked and not taken)
            // are left out of the next rounds' walks: their later jobs
            // cannot be heads. (A key with one, blocked or held by another
            // worker, is not worth the filter: a longer list costs every
            // row walked.) Their head may still lie ahead, later in claim
            // order than the jobs walked (a lower priority or a later
            // run_at than theirs, or beyond the walks of this claim): every
            // later round probes every key it leaves out.
            if (r.kind == 'w' && r.key != nullptr && r.n >= 2) keyset_add(&probe, r.key);
        }
        SPI_freetuptable(SPI_tuptable);
        elog(DEBUG2, "sharding: ordered claim round %d: walk %d of %d from %s, %d left out, %d fresh of %d, %d taken (%s)",
             round, walked, walk, pos.valid ? "a position" : "the start", probe.n, fresh, need, ntaken,
             use_fast ? "candidates tested here" : "pick statement");
        limit_hit = fresh >= need;
        frontier = last_fresh;
        if (round == 0) {
            // How far the walk had to go for what it took (the rows walked
            // and not taken before its last row taken, and those taken).
            walked_to_frontier = -1;
            if (limit_hit && need > 0) {
                walked_to_frontier = fresh;
                for (int i = 0; i < nrows; i++)
                    if (rows[i].kind == 'w') walked_to_frontier += static_cast<int>(rows[i].n);
            }
        }
        if (walked > 0) end = last;
        reached_end = walked < walk;
        // The claim takes the first batch in claim order of what it
        // locked: expired leases and fresh heads. Those up to where the
        // walk got are final (the rounds lock no other), and it walks on
        // until a batch is final.
        covered = 0;
        for (int i = 0; i < nrows; i++) {
            const PickRow &r = rows[i];
            if ((r.kind == 'e' || r.kind == 'f') &&
                (reached_end || (r.pos.valid && end.valid && compare_pos(has_priority, has_run_at, r.pos, end) <= 0)))
                covered++;
        }
        if (covered >= batch || reached_end) break;
        if (last.valid) {
            pos = last;
        } else {
            // A row without a claim-order key: walk from the start, longer.
            if (walk >= kMaxWalk) break;
            pos.valid = false;
            end.valid = false;
        }
        if (walk < kMaxWalk) walk = walk > kMaxWalk / 4 ? kMaxWalk : walk * 4;
    }

    // The first batch of what was locked, in claim order, is claimed.
    g_has_priority = has_priority, g_has_run_at = has_run_at;
    int nlocked = 0;
    PickRow *locked = static_cast<PickRow *>(palloc(sizeof(PickRow) * (ntaken + 1)));
    for (int i = 0; i < nrows; i++)
        if (rows[i].kind == 'e' || rows[i].kind == 'f') locked[nlocked++] = rows[i];
    qsort(locked, nlocked, sizeof(PickRow), compare_rows);
    int nclaim = nlocked < batch ? nlocked : batch;
    Datum *ids = static_cast<Datum *>(palloc(sizeof(Datum) * (nclaim + 1)));
    for (int i = 0; i < nclaim; i++) ids[i] = Int64GetDatum(locked[i].pos.id);

    // The pick's CPU time, for the sweep budget.
    int64 cpu = sharding::queue::thread_cpu_us() - cpu_start;
    // Where the next claim resumes: past the last row the walks examined,
    // with the keys that hold pending jobs before it listed. A last walk
    // that reached the end of the line examined everything up to its tail
    // (the rows it left out are the listed keys'): past the tail then, so
    // that the next claims do not read a left-out backlog again.
    OrderPos next = limit_hit && frontier.valid ? frontier : reached_end && tail.valid ? tail : end;
    if (!next.valid || (variant & Handoff)) {
        st->valid = false;
    } else {
        int nentries = 0;
        Entry *entries = static_cast<Entry *>(palloc(sizeof(Entry) * (nrows + 1)));
        auto before = [&](const OrderPos &p) { return p.valid && compare_pos(has_priority, has_run_at, p, next) <= 0; };
        for (int i = 0; i < nrows; i++) {
            const PickRow &r = rows[i];
            if (r.key == nullptr) continue;
            bool listed = false;
            if (r.kind == 'w' || r.kind == 'p') listed = before(r.pos);
            if (r.kind == 'f') {  // locked but not claimed (expired leases came first)
                listed = before(r.pos);
                for (int j = 0; j < nclaim && listed; j++)
                    if (locked[j].pos.id == r.pos.id) listed = false;
            }
            if (listed) entries[nentries++] = Entry{r.pos, r.key};
        }
        // A probed key whose oldest pending job lies past the next
        // position may still have a pending job before it, later in
        // created order but earlier in claim order (a higher priority, an
        // earlier run_at): it stays listed while it has one, or that job,
        // once the oldest is done, would lie behind the position unlisted.
        KeySet seen;
        keyset_init(&seen);
        for (int i = 0; i < nentries; i++) keyset_add(&seen, entries[i].key);
        for (int i = 0; i < nrows; i++) {
            const PickRow &r = rows[i];
            if (r.kind != 'p' || r.key == nullptr || keyset_has(&seen, r.key)) continue;
            keyset_add(&seen, r.key);
            OrderPos found;
            if (listed_job(q, cols, key_column, r.key, next, &found)) entries[nentries++] = Entry{found, r.key};
        }
        qsort(entries, nentries, sizeof(Entry), compare_entries);
        KeySet keys;
        keyset_init(&keys);
        for (int i = 0; i < nentries; i++) {
            if ((keys.n == kMaxProbed && !keyset_has(&keys, entries[i].key)) ||
                (turn.slot >= 0 && strlen(entries[i].key) >= static_cast<size_t>(kSharedKeyBytes))) {
                // One key too many (or too long for the shared list):
                // resume just before this row.
                next = entries[i].pos;
                next.id = next.id - 1;
                break;
            }
            keyset_add(&keys, entries[i].key);
        }
        set_keys(st, keys.list, keys.n, &probe);
        st->pos = next;
        st->valid = true;
        st->filter_hash = fh;
        st->xid = turn.slot >= 0 ? InvalidTransactionId : GetCurrentTransactionIdIfAny();
        st->stamp = q->stamp;
    }
    // The next first walk's length: what this one needed per head, if it
    // found its batch (a moving average); else the default again.
    if (walked_to_frontier > 0 && !sweep) {
        uint32 per = static_cast<uint32>(static_cast<int64>(walked_to_frontier) * 16 / batch);
        st->walk_per_head = st->walk_per_head == 0 ? per : (3 * st->walk_per_head + per) / 4;
    } else if (walked_to_frontier < 0 && !reached_end) {
        st->walk_per_head = 0;
    }
    // (A sweep that built a plan cost more than the next one will; its own
    // backend sweeps again soon. A shared position records it anyway: each
    // backend's first claim builds its plans, and with the sweep left
    // unrecorded each one swept, in turn.)
    if (sweep && (!fresh_plan || turn.held))
        st->clock = sharding::queue::SweepClock{sharding::queue::monotonic_us(), cpu, 0};
    else if (!sweep)
        st->clock.cpu_since_us += cpu;
    if (turn.held) {
        publish_and_give_turn(turn, st, relfilenode);
        turn_held = sharding::queue::monotonic_us() - turn_taken;
    }
    if (use_fast) end_fast(&fast);

    sharding::queue::ClaimResult result = sharding::queue::begin_result(rsinfo, typid);
    uint64 n = 0;
    if (nclaim > 0) {
        sharding::queue::PlanEntry *up = plan_for(q, cols, Ordered | Update, key_column);
        DestReceiver *dest = result.dest;
        ParamListInfo params = makeParamList(3);
        params->numParams = 3;
        Datum uv[3] = {PG_GETARG_DATUM(a.worker),
                       PointerGetDatum(construct_array(ids, nclaim, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                                       TYPALIGN_DOUBLE)),
                       lease};
        for (int i = 0; i < 3; i++) {
            params->params[i].value = uv[i];
            params->params[i].isnull = false;
            params->params[i].pflags = PARAM_FLAG_CONST;
            params->params[i].ptype = update_types[i];
        }
        SPIExecuteOptions options;
        memset(&options, 0, sizeof options);
        options.params = params;
        options.dest = dest;
        fresh_plan = fresh_plan || !up->built;
        int rc = SPI_execute_plan_extended(up->plan, &options);
        up->built = true;
        if (rc != SPI_OK_SELECT) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
        n = SPI_processed;
        dest->rDestroy(dest);
    }
    if (n > static_cast<uint64>(batch))
        elog(ERROR, "claim took %llu rows for a batch of %d", static_cast<unsigned long long>(n), batch);
    elog(DEBUG1,
         "sharding: ordered claim on %s: %s, %d probed keys, %d locked, %d claimed, %ld us of %ld in the pick; "
         "turn %s: waited %ld us, held %ld us",
         get_rel_name(relid), sweep ? "sweep" : "resume", probe.n, nlocked, nclaim,
         static_cast<long>(sharding::queue::thread_cpu_us() - cpu_start), static_cast<long>(cpu),
         turn.held ? "held" : turn.slot >= 0 ? "not held (a copy)" : "none", static_cast<long>(turn_waited),
         static_cast<long>(turn_held));
    SPI_finish();
    return sharding::queue::finish_result(rsinfo, result);
}

}  // namespace

namespace sharding {
namespace queue {

void forget_ordered_positions(Oid relid) {
    forget_positions(relid);
    // The shared positions too: now, for this transaction's next claims,
    // and at commit, once the job is pending for everyone (a claim that
    // read the position meanwhile publishes none).
    if (shared_ordered == nullptr) return;
    invalidate_relation(relid);
    XactNotes &n = xact_notes;
    for (int i = 0; i < n.nfailed; i++)
        if (n.failed[i] == relid) return;
    if (n.nfailed == kMaxNoted)
        n.failed_overflow = true;
    else
        n.failed[n.nfailed++] = relid;
}

void ordered_init() {
    // Callbacks once per backend; they do nothing without shared memory.
    RegisterXactCallback(ordered_xact_callback, nullptr);
    RegisterSubXactCallback(ordered_subxact_callback, nullptr);
    if (!process_shared_preload_libraries_in_progress) return;
    prev_ordered_shmem_request = shmem_request_hook;
    shmem_request_hook = ordered_shmem_request;
    prev_ordered_shmem_startup = shmem_startup_hook;
    shmem_startup_hook = ordered_shmem_startup;
}

}  // namespace queue
}  // namespace sharding

/*
 * claim_ordered(queue anyelement, worker text, batch integer DEFAULT 50,
 *               lease interval DEFAULT '5 minutes', key_column name DEFAULT 'key',
 *               shards integer[] DEFAULT NULL, shard_count integer DEFAULT NULL)
 *   RETURNS SETOF anyelement
 *
 * As claim, but only heads of their keys: per-key FIFO, one job per key in
 * flight. Rows come back in claim order.
 */
SHARDING_FUNCTION(sharding_claim_ordered) {
    return claim_common(fcinfo, sharding::queue::claim_ordered_args);
}

/*
 * claim_node(queue anyelement, map text, node text, worker text,
 *            batch integer DEFAULT 50, lease interval DEFAULT '5 minutes',
 *            key_column name DEFAULT 'key', ordered boolean DEFAULT false)
 *   RETURNS SETOF anyelement
 *
 * Claims only jobs that node_for(map, key) sends to node, never a key (or
 * the logical shard of an unpinned key) that another node's worker holds
 * under a live lease; with ordered, per key in order as claim_ordered.
 */
SHARDING_FUNCTION(sharding_claim_node) {
    // Unordered: the resumable claim of claim_shards (queue.cpp).
    if (!PG_ARGISNULL(7) && !PG_GETARG_BOOL(7)) return sharding::queue::claim_node_unordered(fcinfo);
    return claim_common(fcinfo, sharding::queue::claim_node_args);
}

/*
 * _claim_ordered_sql(queue regclass, variant integer, key_column name) RETURNS text
 *
 * Internal: the SQL text claim_ordered / claim_node prepare (for EXPLAIN in
 * the tests and when troubleshooting): the pick of one round (variant bits
 * 2 shards, 4 node, 8 max_attempts, 16 handoff exclusion (with node), 32
 * resume past a position), with bit 128 the candidates statement of such a
 * round (tested and locked in C), with bit 64 the claim's UPDATE, with both
 * the check that keeps a key listed (one of its pending jobs lies before the
 * next position).
 */
SHARDING_FUNCTION(sharding__claim_ordered_sql) {
    require(fcinfo, 0, "queue");
    require(fcinfo, 1, "variant");
    require(fcinfo, 2, "key_column");
    Oid relid = PG_GETARG_OID(0);
    if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
        sharding::fail(ERRCODE_UNDEFINED_TABLE, "queue table with oid %u does not exist", relid);
    int32 variant = PG_GETARG_INT32(1);
    if (variant < 0 || variant > 255)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "variant must be between 0 and 255, got %d", variant);
    Shape q;
    q.relid = relid;
    q.qname = qualified_name(relid);
    q.key = quote_identifier(NameStr(*PG_GETARG_NAME(2)));
    {
        AttrNumber ka = get_attnum(relid, NameStr(*PG_GETARG_NAME(2)));
        q.key_type = ka == InvalidAttrNumber ? "text" : format_type_be_qualified(get_atttype(relid, ka));
        q.key_att = ka;
    }
    AttrNumber att = get_attnum(relid, "attempts");
    q.has_attempts = att != InvalidAttrNumber && get_atttype(relid, att) == INT4OID;
    q.has_run_at = get_attnum(relid, "run_at") != InvalidAttrNumber;
    q.has_priority = get_attnum(relid, "priority") != InvalidAttrNumber;
    uint32 v = static_cast<uint32>(variant);
    PG_RETURN_TEXT_P(cstring_to_text((v & ListedJob) == Update ? update_sql(q) : pick_sql(q, v)));
}

/*
 * _current_version(rel oid, tid tid) RETURNS boolean
 *
 * Internal, for the claim statements: whether the row version at `tid` of
 * table `rel` is still its row's latest committed version (no committed
 * transaction updated or deleted it since; an update still in progress
 * does not count). A claim's candidates are read under the statement's
 * snapshot; one that another worker claimed and committed meanwhile would,
 * under FOR UPDATE, have its newest version locked (PostgreSQL locks it
 * before rechecking the WHERE clause, and keeps the lock when the recheck
 * fails), making that worker's complete wait for this claim's transaction.
 * Checking just before the lock leaves such rows alone. True (no
 * opinion) without SELECT or UPDATE on the table, under row level
 * security, for other table access methods and for a tid past the end.
 */
SHARDING_FUNCTION(sharding__current_version) {
    Oid relid = PG_GETARG_OID(0);
    ItemPointer tid = reinterpret_cast<ItemPointer>(PG_GETARG_POINTER(1));
    // Only an optimisation: never an error. A caller without SELECT or
    // UPDATE on the table (a partition inherits no grants from its parent)
    // or under row level security learns nothing. Decided once per table
    // and call site (fn_extra lasts for the query): the function runs for
    // every candidate row.
    // nblocks: the table's size in blocks as last read here. It is read
    // again only for a tid at or past it (the table grew): asking the
    // storage manager per candidate row cost an lseek each. It never
    // shrinks while the claim runs: truncation (TRUNCATE, VACUUM's end)
    // needs AccessExclusiveLock, which the claim's RowExclusiveLock on the
    // queue excludes.
    struct Allowed {
        Oid relid;
        bool allowed;
        BlockNumber nblocks;
    };
    Allowed *a = static_cast<Allowed *>(fcinfo->flinfo->fn_extra);
    if (a == nullptr || a->relid != relid) {
        bool allowed = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT | ACL_UPDATE) == ACLCHECK_OK &&
                       check_enable_rls(relid, InvalidOid, true) != RLS_ENABLED;
        if (a == nullptr) a = static_cast<Allowed *>(MemoryContextAlloc(fcinfo->flinfo->fn_mcxt, sizeof(Allowed)));
        *a = Allowed{relid, allowed, 0};
        fcinfo->flinfo->fn_extra = a;
    }
    if (!a->allowed) PG_RETURN_BOOL(true);
    Relation rel = try_table_open(relid, AccessShareLock);
    if (rel == nullptr) PG_RETURN_BOOL(true);
    bool current = true;
    if (rel->rd_rel->relkind == RELKIND_RELATION && rel->rd_tableam == GetHeapamTableAmRoutine()) {
        HeapTupleData tuple;
        tuple.t_self = *tid;
        Buffer buffer = InvalidBuffer;
        if (ItemPointerIsValid(tid)) {
            BlockNumber block = ItemPointerGetBlockNumber(tid);
            if (block >= a->nblocks) a->nblocks = RelationGetNumberOfBlocks(rel);
            if (block < a->nblocks) current = heap_fetch(rel, SnapshotSelf, &tuple, &buffer, false);
        }
        if (BufferIsValid(buffer)) ReleaseBuffer(buffer);
    }
    table_close(rel, AccessShareLock);
    PG_RETURN_BOOL(current);
}
