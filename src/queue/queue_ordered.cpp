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
#include "queue/ordered.hpp"
#include "queue/queue.hpp"
#include "routing/groups.hpp"

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
// The positions, turns, key sets and the fast pick (ordered.hpp).
using namespace sharding::queue::ordered;

// The plans live in the one plan cache of the queue engine (queue.hpp,
// cached_plan: keyed by table, OrderedPlans | variant and key column); the
// positions in the cache module's memory (ordered_positions.cpp).
SPIPlanPtr node_check_plan = nullptr;
SPIPlanPtr register_plan = nullptr;

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
    // A member of the map's worker group whose lease expired is noticed
    // here, before the map's lock (its shards are dealt again: docs/workers.md).
    sharding::groups_notice(map);
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

// --- one ordered claim, step by step ---
//
// claim_common runs these steps in order: begin_claim (the call checked,
// the map locked for claim_node, the queue validated), find_start (where
// the walk starts: a sweep, this backend's position or the queue's shared
// one, whose turn it takes), run_rounds (the picks), choose_batch (the
// first batch in claim order of what the rounds locked),
// remember_position (where the next claim resumes; the turn given up) and
// claim_batch (the UPDATE, its rows straight into the result). What a step
// leaves for the next lives in one OrderedClaim: plain data and palloc'd
// arrays, no owning C++ object (boundary.hpp, rule 2).
struct OrderedClaim {
    // The call (begin_claim).
    FunctionCallInfo fcinfo;
    const ClaimArgs *a;
    sharding::queue::ClaimCall call;
    uint32 variant;
    sharding::queue::Queue *q;
    sharding::queue::QueueColumns cols;
    int32 max_att;  // -1: the table has no attempts; 0: no limit
    bool has_priority, has_run_at;
    // Where it starts (find_start).
    OrderedState *st;
    uint32 fh;  // filter_hash
    FastPick fast;
    bool use_fast;
    Turn turn;
    int64 turn_waited, turn_taken, turn_held;  // monotonic us, for DEBUG1
    Oid relfilenode;
    bool sweep;
    KeySet probe;    // the keys left out of the walks (and probed)
    char **st_keys;  // the remembered keys, copied
    int nst_keys;
    // The rounds (run_rounds).
    int64 cpu_start, cpu;
    bool fresh_plan;
    PickRow *rows;  // what the rounds locked and saw
    int nrows, rows_cap;
    int64 *taken;  // ids locked
    int ntaken, taken_cap;
    OrderPos end;       // where the last walk ended
    OrderPos tail;      // the last pending row in claim order
    OrderPos frontier;  // the last round's last fresh row
    int walked_to_frontier;  // rows of the first round's walk up to its last row taken
    bool limit_hit;    // the last round took all it asked for
    bool reached_end;  // the last round's walk reached the end of the line
    // The batch (choose_batch).
    PickRow *locked;
    int nlocked, nclaim;
    Datum *ids;
};

constexpr int32 kMaxWalk = 1 << 20;

// The call checked, the map locked (claim_node), the queue, its columns
// and key column validated; the variant of the statements.
void begin_claim(OrderedClaim *c) {
    FunctionCallInfo fcinfo = c->fcinfo;
    const ClaimArgs &a = *c->a;
    c->call = sharding::queue::check_claim_call(fcinfo, a);
    const Oid relid = c->call.relid;
    c->variant = Ordered;
    if (c->call.by_node) c->variant |= ByNode;
    if (c->call.by_shard) c->variant |= ByShard;

    connect_spi();
    sharding::queue::NodeClaim node_claim{false, 0};
    // Refuse a caller without rights before taking the map's lock.
    if ((c->variant & ByNode) && SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
        sharding::queue::require_update(relid);
    if (c->variant & ByNode)
        node_claim = sharding::queue::begin_node_claim(PG_GETARG_DATUM(a.map), PG_GETARG_DATUM(a.node),
                                                       PG_GETARG_DATUM(a.worker));
    // The one validation (queue.cpp): the queue table, the columns an
    // ordered claim reads, the key column.
    c->q = sharding::queue::lookup(relid);
    c->cols = sharding::queue::claim_columns(c->q, true);
    sharding::queue::check_key_column(relid, c->call.key_column);
    if ((c->variant & ByNode) && sharding::queue::handoff_needed(relid, c->call.key_column, PG_GETARG_DATUM(a.map),
                                                                 PG_GETARG_DATUM(a.node), node_claim))
        c->variant |= Handoff;
    // (A table without attempts has no max_attempts: lookup.)
    c->max_att = c->q->has_max_attempts ? c->q->max_attempts : -1;
    if (c->max_att > 0) c->variant |= Reap;
    c->has_priority = c->cols.has_priority;
    c->has_run_at = c->cols.has_run_at;
}

// Sweep or resume (see "where an ordered claim resumes"), from the
// queue's shared position when there is one (see "one position per
// queue"): then this claim's turn starts here and ends once its position
// is published (remember_position), before its UPDATE.
void find_start(OrderedClaim *c) {
    const ClaimArgs &a = *c->a;
    const Oid relid = c->call.relid;
    const char *key_column = c->call.key_column;
    c->st = state_for(relid, c->variant, key_column);
    OrderedState *st = c->st;
    c->fh = filter_hash(c->fcinfo, c->variant, a.shards, c->call.shard_count, a.map, a.node);
    // (Opened before the turn: the less a claim does in it, the better.)
    c->use_fast = begin_fast(&c->fast, c->q, key_column, st);
    c->turn = Turn{-1, false, 0, InvalidOid};
    c->relfilenode = InvalidOid;
    if (shared_positions() && !(c->variant & Handoff)) {
        c->relfilenode = table_filenode(relid);
        // st->stamp: the queue entry's stamp when this backend last used
        // the shared position (0: never).
        const uint64 seen = st->stamp;
        c->turn_waited = sharding::queue::monotonic_us();
        c->turn = take_turn(relid, c->variant, key_column, c->fh, st);
        c->turn_taken = sharding::queue::monotonic_us();
        c->turn_waited = c->turn_taken - c->turn_waited;
        if (c->turn.slot >= 0) {
            if (c->turn.relfilenode != c->relfilenode || (seen != 0 && seen != c->q->stamp)) st->valid = false;
            st->stamp = c->q->stamp;
            st->shared_copy = true;
        }
    }
    // A backend that falls back to its own position (every slot busy)
    // after using a shared one does not take a stale copy for its own.
    if (c->turn.slot < 0 && st->shared_copy) {
        st->valid = false;
        st->shared_copy = false;
    }
    c->sweep = !st->valid || st->stamp != c->q->stamp || st->filter_hash != c->fh ||
               sharding::queue::rolled_back(st->xid) || sharding::queue::sweep_due(st->clock) ||
               (c->variant & Handoff);
    keyset_init(&c->probe);
    // The remembered keys, copied (a trigger that claims again may replace
    // them while this claim runs).
    c->nst_keys = 0;
    c->st_keys = static_cast<char **>(palloc(sizeof(char *) * (kMaxProbed + 1)));
    if (c->sweep) return;
    for (int i = 0; i < st->nkeys; i++) {
        // Every remembered key is probed ($17); only those with a backlog
        // are left out of the walk ($14). A walked row of another one is
        // newer than its key's probed row, which DISTINCT ON keeps
        // instead, or, in a later round, fails the head check (the check,
        // not the list, decides what is a head, as for a key walked once
        // and not taken). Every row walked is compared with each key of
        // the list: with the 32 remembered keys in it, that cost ~15% of a
        // claim's CPU.
        if (st->backlog[i]) keyset_add(&c->probe, st->keys[i]);
        c->st_keys[c->nst_keys++] = pstrdup(st->keys[i]);
    }
}

// One round's pick statement (or candidates statement, tested and locked
// by the fast pick) from pos, walking at most `walk` rows for `need` more;
// its rows into *raw, their count returned.
int pick_round(OrderedClaim *c, int round, const OrderPos &pos, int32 walk, int32 need, PickRow **raw) {
    FunctionCallInfo fcinfo = c->fcinfo;
    const ClaimArgs &a = *c->a;
    const uint32 variant = c->variant;
    sharding::queue::PlanEntry *p =
        plan_for(c->q, c->cols,
                 variant | (pos.valid ? static_cast<uint32>(Resume) : 0u) |
                     (c->use_fast ? static_cast<uint32>(Candidates) : 0u),
                 c->call.key_column);
    c->fresh_plan = c->fresh_plan || !p->built;
    Datum values[PickParams] = {PG_GETARG_DATUM(a.worker),
                                Int32GetDatum(need),
                                c->call.lease,
                                (variant & ByShard) ? PG_GETARG_DATUM(a.shards) : (Datum)0,
                                Int32GetDatum(c->call.shard_count),
                                (variant & ByNode) ? PG_GETARG_DATUM(a.map) : (Datum)0,
                                (variant & ByNode) ? PG_GETARG_DATUM(a.node) : (Datum)0,
                                Int32GetDatum(c->max_att),
                                Int32GetDatum(walk),
                                Int64GetDatum(pos.priority),
                                TimestampTzGetDatum(pos.run_at),
                                TimestampTzGetDatum(pos.created),
                                Int64GetDatum(pos.id),
                                PointerGetDatum(text_array(c->probe.list, c->probe.n)),
                                (Datum)0,  // taken ids, below
                                BoolGetDatum(round == 0),
                                PointerGetDatum(round == 0 ? text_array(c->st_keys, c->nst_keys)
                                                           : text_array(c->probe.list, c->probe.n))};
    // Round 0 probes the remembered keys; each later round every key it
    // leaves out of its walk ($14), under its own snapshot. A left out
    // key's head may lie past where the earlier rounds' walks got (a key
    // remembered with a backlog whose head lies far ahead of the
    // position): it is tested only in the round whose walk gets that far,
    // and only if that round probes it. (Probing in one round only the
    // keys it began to leave out, a claim walked past such a head and took
    // younger ones: TAP 203.)
    {
        Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (c->ntaken + 1)));
        for (int i = 0; i < c->ntaken; i++) d[i] = Int64GetDatum(c->taken[i]);
        values[PTaken] = PointerGetDatum(construct_array(d, c->ntaken, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                                         TYPALIGN_DOUBLE));
    }
    ParamListInfo params = makeParamList(PickParams);
    params->numParams = PickParams;
    char nulls[PickParams];
    for (int i = 0; i < PickParams; i++) {
        bool isnull = (i == PShards || i == PShardCount) ? !(variant & ByShard)
                      : (i == PMap || i == PNode)          ? !(variant & ByNode)
                      : i == PMaxAttempts                  ? c->max_att <= 0
                      : (i >= PPosPriority && i <= PPosId) ? !pos.valid
                                                           : false;
        params->params[i].value = isnull ? (Datum)0 : values[i];
        params->params[i].isnull = isnull;
        params->params[i].pflags = PARAM_FLAG_CONST;
        params->params[i].ptype = pick_types[i];
        nulls[i] = isnull ? 'n' : ' ';
    }
    int rc = c->use_fast ? SPI_execute_snapshot(p->plan, values, nulls, fast_round_snapshot(&c->fast),
                                                InvalidSnapshot, false, true, 0)
                         : SPI_execute_plan_with_paramlist(p->plan, params, false, 0);
    p->built = true;
    if (rc != SPI_OK_SELECT) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
    return c->use_fast ? fast_round(&c->fast, need, walk, c->taken, c->ntaken, c->has_priority, c->has_run_at, raw)
                       : read_pick_rows(c->has_priority, c->has_run_at, raw);
}

// Takes one round's rows into the claim: the rows locked ('e', 'f') and
// seen ('w', 'p'; 'p' of the first round only), the walk's end ('l') and
// the line's tail ('t'). Returns how many it locked; *walked and *last:
// how far the walk got.
int absorb_round(OrderedClaim *c, int round, const PickRow *raw, int nraw, int *walked, OrderPos *last,
                 OrderPos *last_fresh) {
    int fresh = 0;
    for (int i = 0; i < nraw; i++) {
        PickRow r = raw[i];
        if (r.kind == 'l') {
            *walked = static_cast<int>(r.n);
            *last = r.pos;
            continue;
        }
        if (r.kind == 't') {
            c->tail = r.pos;
            continue;
        }
        if (r.kind == 'p' && round > 0) continue;  // only the first round's probes decide who stays listed
        if (r.kind == 'e' || r.kind == 'f') {
            if (c->ntaken == c->taken_cap) {
                c->taken_cap *= 2;
                c->taken = static_cast<int64 *>(repalloc(c->taken, sizeof(int64) * c->taken_cap));
            }
            c->taken[c->ntaken++] = r.pos.id;
            fresh++;
            if (!last_fresh->valid ||
                (r.pos.valid && compare_pos(c->has_priority, c->has_run_at, *last_fresh, r.pos) < 0))
                *last_fresh = r.pos;
        }
        if (c->nrows == c->rows_cap) {
            c->rows_cap *= 2;
            c->rows = static_cast<PickRow *>(repalloc(c->rows, sizeof(PickRow) * c->rows_cap));
        }
        c->rows[c->nrows++] = r;
        // Keys with a backlog (more than one job walked and not taken) are
        // left out of the next rounds' walks: their later jobs cannot be
        // heads. (A key with one, blocked or held by another worker, is
        // not worth the filter: a longer list costs every row walked.)
        // Their head may still lie ahead, later in claim order than the
        // jobs walked (a lower priority or a later run_at than theirs, or
        // beyond the walks of this claim): every later round probes every
        // key it leaves out.
        if (r.kind == 'w' && r.key != nullptr && r.n >= 2) keyset_add(&c->probe, r.key);
    }
    return fresh;
}

// The rounds: a pick, and while it found fewer than batch and its walk
// was cut short, another one past where that walk ended, leaving out the
// keys it saw.
void run_rounds(OrderedClaim *c) {
    const int32 batch = c->call.batch;
    const OrderedState *st = c->st;
    c->cpu_start = sharding::queue::thread_cpu_us();
    c->fresh_plan = false;
    c->nrows = 0, c->rows_cap = 64;
    c->rows = static_cast<PickRow *>(palloc(sizeof(PickRow) * c->rows_cap));
    c->ntaken = 0, c->taken_cap = 64;
    c->taken = static_cast<int64 *>(palloc(sizeof(int64) * c->taken_cap));
    const OrderPos none = {false, 0, 0, 0, 0};
    OrderPos pos = c->sweep ? none : st->pos;
    c->end = c->tail = c->frontier = none;
    // The first walk: twice the batch and some (a walk too short costs a
    // round), or, once claims resumed here, what they walked per head
    // taken, with a quarter to spare.
    int32 walk = batch > (PG_INT32_MAX - 16) / 2 ? PG_INT32_MAX : batch * 2 + 16;
    if (!c->sweep && st->walk_per_head > 0 && batch < (1 << 20)) {
        int64 w = (static_cast<int64>(batch) * st->walk_per_head * 5 / 4 + 15) / 16 + 8;
        if (w < walk) walk = static_cast<int32>(w);
        if (walk < batch + 8) walk = batch + 8;
    }
    c->walked_to_frontier = 0;
    int covered = 0;  // rows locked that are final (see below)
    c->limit_hit = c->reached_end = false;
    for (int round = 0;; round++) {
        CHECK_FOR_INTERRUPTS();
        int32 need = batch - covered;
        PickRow *raw;
        int nraw = pick_round(c, round, pos, walk, need, &raw);
        int walked = 0;
        OrderPos last = none, last_fresh = none;
        int fresh = absorb_round(c, round, raw, nraw, &walked, &last, &last_fresh);
        SPI_freetuptable(SPI_tuptable);
        elog(DEBUG2, "sharding: ordered claim round %d: walk %d of %d from %s, %d left out, %d fresh of %d, %d taken (%s)",
             round, walked, walk, pos.valid ? "a position" : "the start", c->probe.n, fresh, need, c->ntaken,
             c->use_fast ? "candidates tested here" : "pick statement");
        c->limit_hit = fresh >= need;
        c->frontier = last_fresh;
        if (round == 0) {
            // How far the walk had to go for what it took (the rows walked
            // and not taken before its last row taken, and those taken).
            c->walked_to_frontier = -1;
            if (c->limit_hit && need > 0) {
                c->walked_to_frontier = fresh;
                for (int i = 0; i < c->nrows; i++)
                    if (c->rows[i].kind == 'w') c->walked_to_frontier += static_cast<int>(c->rows[i].n);
            }
        }
        if (walked > 0) c->end = last;
        c->reached_end = walked < walk;
        // The claim takes the first batch in claim order of what it
        // locked: expired leases and fresh heads. Those up to where the
        // walk got are final (the rounds lock no other), and it walks on
        // until a batch is final.
        covered = 0;
        for (int i = 0; i < c->nrows; i++) {
            const PickRow &r = c->rows[i];
            if ((r.kind == 'e' || r.kind == 'f') &&
                (c->reached_end ||
                 (r.pos.valid && c->end.valid && compare_pos(c->has_priority, c->has_run_at, r.pos, c->end) <= 0)))
                covered++;
        }
        if (covered >= batch || c->reached_end) break;
        if (last.valid) {
            pos = last;
        } else {
            // A row without a claim-order key: walk from the start, longer.
            if (walk >= kMaxWalk) break;
            pos.valid = false;
            c->end.valid = false;
        }
        if (walk < kMaxWalk) walk = walk > kMaxWalk / 4 ? kMaxWalk : walk * 4;
    }
}

// The first batch of what was locked, in claim order, is claimed.
void choose_batch(OrderedClaim *c) {
    g_has_priority = c->has_priority, g_has_run_at = c->has_run_at;
    c->nlocked = 0;
    c->locked = static_cast<PickRow *>(palloc(sizeof(PickRow) * (c->ntaken + 1)));
    for (int i = 0; i < c->nrows; i++)
        if (c->rows[i].kind == 'e' || c->rows[i].kind == 'f') c->locked[c->nlocked++] = c->rows[i];
    qsort(c->locked, c->nlocked, sizeof(PickRow), compare_rows);
    c->nclaim = c->nlocked < c->call.batch ? c->nlocked : c->call.batch;
    c->ids = static_cast<Datum *>(palloc(sizeof(Datum) * (c->nclaim + 1)));
    for (int i = 0; i < c->nclaim; i++) c->ids[i] = Int64GetDatum(c->locked[i].pos.id);
    // The pick's CPU time, for the sweep budget.
    c->cpu = sharding::queue::thread_cpu_us() - c->cpu_start;
}

// The keys listed at the next position: those that hold a pending job
// before it. At most kMaxProbed (and, in a shared position, none too long
// for it): the position is cut before one too many. Sets st.
void list_keys(OrderedClaim *c, OrderPos next) {
    OrderedState *st = c->st;
    const bool has_priority = c->has_priority, has_run_at = c->has_run_at;
    int nentries = 0;
    Entry *entries = static_cast<Entry *>(palloc(sizeof(Entry) * (c->nrows + 1)));
    auto before = [&](const OrderPos &p) { return p.valid && compare_pos(has_priority, has_run_at, p, next) <= 0; };
    for (int i = 0; i < c->nrows; i++) {
        const PickRow &r = c->rows[i];
        if (r.key == nullptr) continue;
        bool listed = false;
        if (r.kind == 'w' || r.kind == 'p') listed = before(r.pos);
        if (r.kind == 'f') {  // locked but not claimed (expired leases came first)
            listed = before(r.pos);
            for (int j = 0; j < c->nclaim && listed; j++)
                if (c->locked[j].pos.id == r.pos.id) listed = false;
        }
        if (listed) entries[nentries++] = Entry{r.pos, r.key};
    }
    // A probed key whose oldest pending job lies past the next position
    // may still have a pending job before it, later in created order but
    // earlier in claim order (a higher priority, an earlier run_at): it
    // stays listed while it has one, or that job, once the oldest is done,
    // would lie behind the position unlisted.
    KeySet seen;
    keyset_init(&seen);
    for (int i = 0; i < nentries; i++) keyset_add(&seen, entries[i].key);
    for (int i = 0; i < c->nrows; i++) {
        const PickRow &r = c->rows[i];
        if (r.kind != 'p' || r.key == nullptr || keyset_has(&seen, r.key)) continue;
        keyset_add(&seen, r.key);
        OrderPos found;
        if (listed_job(c->q, c->cols, c->call.key_column, r.key, next, &found))
            entries[nentries++] = Entry{found, r.key};
    }
    qsort(entries, nentries, sizeof(Entry), compare_entries);
    KeySet keys;
    keyset_init(&keys);
    for (int i = 0; i < nentries; i++) {
        if ((keys.n == kMaxProbed && !keyset_has(&keys, entries[i].key)) ||
            (c->turn.slot >= 0 && strlen(entries[i].key) >= static_cast<size_t>(kSharedKeyBytes))) {
            // One key too many (or too long for the shared list): resume
            // just before this row.
            next = entries[i].pos;
            next.id = next.id - 1;
            break;
        }
        keyset_add(&keys, entries[i].key);
    }
    set_keys(st, keys.list, keys.n, &c->probe);
    st->pos = next;
    st->valid = true;
    st->filter_hash = c->fh;
    st->xid = c->turn.slot >= 0 ? InvalidTransactionId : GetCurrentTransactionIdIfAny();
    st->stamp = c->q->stamp;
}

// Where the next claim resumes: past the last row the walks examined, with
// the keys that hold pending jobs before it listed. A last walk that
// reached the end of the line examined everything up to its tail (the
// rows it left out are the listed keys'): past the tail then, so that the
// next claims do not read a left-out backlog again. Then the turn is
// given up, the position published.
void remember_position(OrderedClaim *c) {
    OrderedState *st = c->st;
    const int32 batch = c->call.batch;
    OrderPos next = c->limit_hit && c->frontier.valid ? c->frontier
                    : c->reached_end && c->tail.valid ? c->tail
                                                      : c->end;
    if (!next.valid || (c->variant & Handoff))
        st->valid = false;
    else
        list_keys(c, next);
    // The next first walk's length: what this one needed per head, if it
    // found its batch (a moving average); else the default again.
    if (c->walked_to_frontier > 0 && !c->sweep) {
        uint32 per = static_cast<uint32>(static_cast<int64>(c->walked_to_frontier) * 16 / batch);
        st->walk_per_head = st->walk_per_head == 0 ? per : (3 * st->walk_per_head + per) / 4;
    } else if (c->walked_to_frontier < 0 && !c->reached_end) {
        st->walk_per_head = 0;
    }
    // (A sweep that built a plan cost more than the next one will; its own
    // backend sweeps again soon. A shared position records it anyway: each
    // backend's first claim builds its plans, and with the sweep left
    // unrecorded each one swept, in turn.)
    if (c->sweep && (!c->fresh_plan || c->turn.held))
        st->clock = sharding::queue::SweepClock{sharding::queue::monotonic_us(), c->cpu, 0};
    else if (!c->sweep)
        st->clock.cpu_since_us += c->cpu;
    if (c->turn.held) {
        publish_and_give_turn(c->turn, st, c->relfilenode);
        c->turn_held = sharding::queue::monotonic_us() - c->turn_taken;
    }
    if (c->use_fast) end_fast(&c->fast);
}

// The claim's UPDATE of the chosen ids, its rows straight into the
// result; how many it claimed.
uint64 claim_batch(OrderedClaim *c, const sharding::queue::ClaimResult &result) {
    if (c->nclaim == 0) return 0;
    FunctionCallInfo fcinfo = c->fcinfo;
    sharding::queue::PlanEntry *up = plan_for(c->q, c->cols, Ordered | Update, c->call.key_column);
    DestReceiver *dest = result.dest;
    ParamListInfo params = makeParamList(3);
    params->numParams = 3;
    Datum uv[3] = {PG_GETARG_DATUM(c->a->worker),
                   PointerGetDatum(construct_array(c->ids, c->nclaim, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                                   TYPALIGN_DOUBLE)),
                   c->call.lease};
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
    c->fresh_plan = c->fresh_plan || !up->built;
    int rc = SPI_execute_plan_extended(up->plan, &options);
    up->built = true;
    if (rc != SPI_OK_SELECT) elog(ERROR, "claim failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    dest->rDestroy(dest);
    return n;
}

// claim_ordered, and claim_node with ordered => true, as `a` describes them.
Datum claim_common(FunctionCallInfo fcinfo, const ClaimArgs &a) {
    OrderedClaim *c = static_cast<OrderedClaim *>(palloc0(sizeof(OrderedClaim)));
    c->fcinfo = fcinfo;
    c->a = &a;
    begin_claim(c);
    find_start(c);
    run_rounds(c);
    choose_batch(c);
    remember_position(c);
    sharding::queue::ClaimResult result = sharding::queue::begin_result(c->call.rsinfo, c->call.typid);
    uint64 n = claim_batch(c, result);
    if (n > static_cast<uint64>(c->call.batch))
        elog(ERROR, "claim took %llu rows for a batch of %d", static_cast<unsigned long long>(n), c->call.batch);
    elog(DEBUG1,
         "sharding: ordered claim on %s: %s, %d probed keys, %d locked, %d claimed, %ld us of %ld in the pick; "
         "turn %s: waited %ld us, held %ld us",
         get_rel_name(c->call.relid), c->sweep ? "sweep" : "resume", c->probe.n, c->nlocked, c->nclaim,
         static_cast<long>(sharding::queue::thread_cpu_us() - c->cpu_start), static_cast<long>(c->cpu),
         c->turn.held ? "held" : c->turn.slot >= 0 ? "not held (a copy)" : "none", static_cast<long>(c->turn_waited),
         static_cast<long>(c->turn_held));
    SPI_finish();
    return sharding::queue::finish_result(c->call.rsinfo, result);
}

}  // namespace

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
