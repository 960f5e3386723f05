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
// (FOR UPDATE SKIP LOCKED, rechecked on the latest row version).
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
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "common/hashfn.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tstoreReceiver.h"
#include "lib/stringinfo.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/array.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "storage/itemptr.h"
#include "access/tableam.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/typcache.h"
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
// it. Candidates from the walk and the probes are tested and locked
// (SKIP LOCKED) in claim order until $2 are taken.
//
// Parameters: $1 worker, $2 batch (what the round still needs), $3 lease,
// $4 shards, $5 shard_count, $6 map, $7 node, $8 max_attempts, $9 the
// walk's length, $10-$13 the position the walk starts after (priority,
// run_at, created, id; the Resume variant), $14 the keys left out of the
// walk (text[]), $15 ids already taken by this claim, $16
// whether this is the claim's first round (expired leases and the reaper
// run only then), $17 the keys probed (the remembered ones, in the first
// round: a key a round left out was examined there already).
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
    return sharding::queue::sql_text([&] { return sharding::claim_sql::pick(ordered_table(q), variant); });
}

// The claim's UPDATE: $1 worker, $2 the picked ids, $3 lease; the claimed
// rows come back in claim order.
char *update_sql(const Shape &q) {
    return sharding::queue::sql_text([&] { return sharding::claim_sql::update(ordered_table(q)); });
}
Oid update_types[3] = {TEXTOID, INT8ARRAYOID, INTERVALOID};

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
        return (variant & Update) ? update_sql(shape) : pick_sql(shape, variant);
    };
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
// list once its oldest pending job lies past P, or it has none.
//
// What can appear before P afterwards, of a key not in the list: a job
// inserted with an older claim-order key, a job that became due with a
// higher priority than P's, a job sent back to pending by another backend's
// fail (this backend's fail forgets the positions of the queue), a claim
// rolled back (noticed by its xid), a newer job of a listed key with a
// higher priority than the key's older ones. As for claim (queue.cpp), a
// sweep finds them: a claim sweeps when its backend has no position, when
// the last sweep was cheap (then every claim is exact), and otherwise by
// the budget of queue.hpp (SweepClock).
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

    // Sweep or resume (see "where an ordered claim resumes").
    OrderedState *st = state_for(relid, variant, key_column);
    uint32 fh = filter_hash(fcinfo, variant, a.shards, shard_count, a.map, a.node);
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
    const int32 first_walk = batch > (PG_INT32_MAX - 16) / 2 ? PG_INT32_MAX : batch * 2 + 16;
    int32 walk = first_walk;
    constexpr int32 kMaxWalk = 1 << 20;
    bool limit_hit = false;   // the last round took all it asked for
    bool reached_end = false;  // the last round's walk reached the end of the line
    OrderPos tail = end;       // the last pending row in claim order
    OrderPos frontier = end;  // then: its last fresh row
    for (int round = 0;; round++) {
        CHECK_FOR_INTERRUPTS();
        sharding::queue::PlanEntry *p =
            plan_for(q, cols, variant | (pos.valid ? static_cast<uint32>(Resume) : 0u), key_column);
        fresh_plan = fresh_plan || !p->built;
        int32 need = batch - ntaken;
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
                                    PointerGetDatum(text_array(st_keys, round == 0 ? nst_keys : 0))};
        {
            Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (ntaken + 1)));
            for (int i = 0; i < ntaken; i++) d[i] = Int64GetDatum(taken[i]);
            values[PTaken] = PointerGetDatum(construct_array(d, ntaken, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                                         TYPALIGN_DOUBLE));
        }
        ParamListInfo params = makeParamList(PickParams);
        params->numParams = PickParams;
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
        }
        int rc = SPI_execute_plan_with_paramlist(p->plan, params, false, 0);
        p->built = true;
        if (rc != SPI_OK_SELECT) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
        int fresh = 0, walked = 0;
        OrderPos last = {false, 0, 0, 0, 0}, last_fresh = last;
        TupleDesc desc = SPI_tuptable->tupdesc;
        for (uint64 i = 0; i < SPI_processed; i++) {
            HeapTuple t = SPI_tuptable->vals[i];
            bool null_kind, null_id, null_prio, null_run_at, null_created, null_key, null_n;
            PickRow r;
            r.kind = DatumGetChar(SPI_getbinval(t, desc, 1, &null_kind));
            r.pos.id = DatumGetInt64(SPI_getbinval(t, desc, 2, &null_id));
            r.pos.priority = DatumGetInt64(SPI_getbinval(t, desc, 3, &null_prio));
            r.pos.run_at = DatumGetTimestampTz(SPI_getbinval(t, desc, 4, &null_run_at));
            r.pos.created = DatumGetTimestampTz(SPI_getbinval(t, desc, 5, &null_created));
            Datum key = SPI_getbinval(t, desc, 6, &null_key);
            Datum n = SPI_getbinval(t, desc, 7, &null_n);
            r.pos.valid = !null_id && !null_created && !(has_priority && null_prio) && !(has_run_at && null_run_at);
            if (null_id) r.pos.id = 0;
            if (null_prio) r.pos.priority = 0;
            if (null_run_at) r.pos.run_at = 0;
            if (null_created) r.pos.created = 0;
            r.key = null_key ? nullptr : TextDatumGetCString(key);
            r.n = null_n ? 0 : DatumGetInt64(n);
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
                if (r.kind == 'f') {
                    fresh++;
                    if (!last_fresh.valid || (r.pos.valid && compare_pos(has_priority, has_run_at, last_fresh, r.pos) < 0))
                        last_fresh = r.pos;
                }
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
            // row walked.)
            if (r.kind == 'w' && r.key != nullptr && r.n >= 2) keyset_add(&probe, r.key);
        }
        SPI_freetuptable(SPI_tuptable);
        elog(DEBUG2, "sharding: ordered claim round %d: walk %d of %d from %s, %d left out, %d fresh of %d, %d taken",
             round, walked, walk, pos.valid ? "a position" : "the start", probe.n, fresh, need, ntaken);
        limit_hit = fresh >= need;
        frontier = last_fresh;
        if (walked > 0) end = last;
        reached_end = walked < walk;
        if (ntaken >= batch || reached_end) break;
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
    int64 cpu = sharding::queue::thread_cpu_us() - cpu_start;

    elog(DEBUG1, "sharding: ordered claim on %s: %s, %d probed keys, %d locked, %d claimed, %ld us", get_rel_name(relid),
         sweep ? "sweep" : "resume", probe.n, nlocked, nclaim, static_cast<long>(cpu));
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
        qsort(entries, nentries, sizeof(Entry), compare_entries);
        KeySet keys;
        keyset_init(&keys);
        for (int i = 0; i < nentries; i++) {
            if (keys.n == kMaxProbed && !keyset_has(&keys, entries[i].key)) {
                // One key too many: resume just before this row.
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
        st->xid = GetCurrentTransactionIdIfAny();
        st->stamp = q->stamp;
    }
    if (sweep && !fresh_plan)
        st->clock = sharding::queue::SweepClock{sharding::queue::monotonic_us(), cpu, 0};
    else if (!sweep)
        st->clock.cpu_since_us += cpu;
    SPI_finish();
    return sharding::queue::finish_result(rsinfo, result);
}

}  // namespace

namespace sharding {
namespace queue {

void forget_ordered_positions(Oid relid) { forget_positions(relid); }

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
 * resume past a position) or, with bit 64, the claim's UPDATE.
 */
SHARDING_FUNCTION(sharding__claim_ordered_sql) {
    require(fcinfo, 0, "queue");
    require(fcinfo, 1, "variant");
    require(fcinfo, 2, "key_column");
    Oid relid = PG_GETARG_OID(0);
    if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
        sharding::fail(ERRCODE_UNDEFINED_TABLE, "queue table with oid %u does not exist", relid);
    int32 variant = PG_GETARG_INT32(1);
    if (variant < 0 || variant > 127)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "variant must be between 0 and 127, got %d", variant);
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
    PG_RETURN_TEXT_P(cstring_to_text((v & Update) ? update_sql(q) : pick_sql(q, v)));
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
