// Queue tables (docs/queue.md, docs/ordered.md): the one queue engine that
// every claim kind shares (queue.cpp; queue_ordered.cpp, with ordered_positions.cpp and ordered_fast.cpp, is the ordered
// claims' executor): the checks and column discovery, the queue entry and
// plan cache, the claim kinds' descriptions.
//
// Glue: these functions call PostgreSQL (syscache, relcache) and throw
// sharding::Error for user errors, so call them only where no owning C++
// object is alive (boundary.hpp, rule 2).
#pragma once

#include "pg/boundary.hpp"
#include "pg/pg.hpp"

#include <string>

extern "C" {
#include "executor/spi.h"
#include "executor/tstoreReceiver.h"
#include "fmgr.h"
#include "nodes/execnodes.h"
#include "utils/array.h"
#include "utils/tuplestore.h"
}

namespace sharding {

// maps.cpp: a counter bumped whenever this backend takes in a change of the
// routing tables (sharding.maps, shards, pins), of any map.
uint64_t routing_generation();

namespace queue {

// The optional columns a queue table has (the required ones are checked).
struct QueueColumns {
    bool has_attempts;  // attempts integer: counts claims, fencing token
    bool has_run_at;    // run_at timestamptz: not claimed before it
    bool has_priority;  // priority smallint: highest first
    // The types of run_at and priority, InvalidOid where the table has no
    // such column (claim_columns: an ordered claim reads them wherever
    // they exist).
    Oid run_at_type, priority_type;
};

// The table's quoted, schema-qualified name (palloc'd).
const char *qualified_name(Oid relid);

// Raises PostgreSQL's own 42501 ("permission denied for table jobs", through
// aclcheck_error) unless the caller may update the table or at least one of
// its columns. An ereport(ERROR), not a sharding::Error: call it only where
// no owning C++ object is alive.
void require_update(Oid relid);

// The one opening of a queue table by every claim kind (claim,
// claim_shards, claim_node, claim_ordered): it must exist and be an
// ordinary or partitioned table (42P01, 22023), the caller must be allowed
// to update it (require_update, before and again after the lock), and it
// is locked RowExclusiveLock (which also takes in pending invalidations).
// An ereport(ERROR) like require_update. Needs no SPI connection.
void open_queue(Oid relid);

// Checks that relid is a queue table: an ordinary or partitioned table with
// id bigint (unique, non-partial index on it alone), status text, owner
// text, claim_expires timestamptz, created timestamptz; attempts integer
// when present. 22023 otherwise. run_at and priority count only with the
// contract's types (timestamptz, smallint); other types are ignored.
QueueColumns check_queue_table(Oid relid);

// The contract's "id bigint primary key": a unique, non-partial index on id
// alone (22023 otherwise). qname is the table's name for the message.
void check_unique_id(Oid relid, const char *qname);

// The key column of a claim must exist and be of a shard key type (22023).
void check_key_column(Oid relid, const char *column);

// ------------------------------------------------------- the one engine
// Every claim kind (claim, claim_shards, claim_node, claim_ordered) and
// every fenced statement (complete, fail, extend_lease) goes through one
// queue entry per table and one plan cache, both on the cache module
// (cache.hpp: its context, its relcache and syscache callbacks, its
// retirement rule), one validation (lookup, claim_columns,
// check_key_column) and one claim-SQL builder (core/claim_sql.hpp).
//
// The queue entry: a table as this backend validated it, rebuilt
// completely (lookup) after the module's callback marked it stale (ALTER
// TABLE, DROP, a new index, a renamed schema, a changed row of
// sharding.queue_settings, whose trigger sends the table's relcache
// invalidation). Each build has a new stamp.
struct Queue {
    Oid relid;  // hash key
    uint64 stamp;  // of the build: a plan or position of an older one is stale
    QueueColumns cols;
    bool has_max_attempts;
    int32 max_attempts;
    char *name;  // quoted, schema-qualified; in the cache context
};
// Checks privileges, locks the table (open_queue), and returns its valid
// entry, validated as a queue table (check_queue_table) with its settings
// (sharding.queue_settings). Needs an SPI connection. Valid for the
// current call.
Queue *lookup(Oid relid);

// The columns a claim kind orders and counts by: the queue's (run_at and
// priority only with the contract's types), or for an ordered claim
// (ordered), run_at and priority wherever they exist, refused with 22023
// unless run_at is timestamptz and priority an integer type.
QueueColumns claim_columns(const Queue *q, bool ordered);

// The plan cache: one kept plan per (table, kind, key column), kind being
// a family of statements and the variant within it. A plan is valid for
// the queue entry's stamp it was prepared under; a stale one is retired
// (cache.hpp) when it is next looked up.
enum PlanFamily : uint32 {
    FencedPlans = 0,         // queue.cpp's PlanKind (complete, fail, ...)
    ClaimPlans = 1u << 8,    // claim_sql::ClaimPlan::bits()
    OrderedPlans = 2u << 8,  // claim_sql's ordered variant bits
};
struct PlanKey {
    Oid relid;
    uint32 kind;  // PlanFamily | variant
    NameData key_column;  // empty for the kinds without one
};
struct PlanEntry {
    PlanKey key;  // hash key
    SPIPlanPtr plan;  // nullptr: to be prepared
    uint64 stamp;     // Queue::stamp it was prepared under
    bool built;       // the plan has run (built its generic plan)
};
// The entry of (q, kind, key_column), its plan nullptr when it must be
// prepared (then the caller prepares it with keep, and sets built false).
PlanEntry *plan_entry(const Queue *q, uint32 kind, const char *key_column);
// The plan of (q, kind, key_column), prepared from build() (the SQL text,
// palloc'd) with the parameter types when missing or stale.
template <typename Build>
PlanEntry *cached_plan(const Queue *q, uint32 kind, const char *key_column, int nargs, Oid *types, Build build);

// Where the arguments of a claim kind are (-1: it has none), and what it
// is: the description of each claim kind that its SQL functions, the
// argument checks (check_claim_call) and the executors share.
enum class ClaimKind { Plain, Shards, Node, Ordered };
struct ClaimArgs {
    ClaimKind kind;
    bool ordered;  // per-key order (claim_ordered; claim_node with ordered => true)
    int worker, batch, lease, key_column;
    int shards, shard_count;  // claim_shards (required), claim_ordered (optional)
    int map, node, ordered_arg;  // claim_node
};
// claim(queue, worker, batch, lease)
constexpr ClaimArgs claim_args = {ClaimKind::Plain, false, 1, 2, 3, -1, -1, -1, -1, -1, -1};
// claim_shards(queue, worker, shards, shard_count, batch, lease, key_column)
constexpr ClaimArgs claim_shards_args = {ClaimKind::Shards, false, 1, 4, 5, 6, 2, 3, -1, -1, -1};
// claim_node(queue, map, node, worker, batch, lease, key_column, ordered)
constexpr ClaimArgs claim_node_args = {ClaimKind::Node, false, 3, 4, 5, 6, -1, -1, 1, 2, 7};
// claim_ordered(queue, worker, batch, lease, key_column, shards, shard_count)
constexpr ClaimArgs claim_ordered_args = {ClaimKind::Ordered, true, 1, 2, 3, 4, 5, 6, -1, -1, -1};

// A claim's arguments, checked (22023 naming the value; 0A000 outside a
// set-returning context), in the same order for every kind.
struct ClaimCall {
    ReturnSetInfo *rsinfo;
    Oid typid, relid;  // the queue's row type and table
    int32 batch;
    Datum lease;
    const char *key_column;  // nullptr for claim
    bool by_shard;           // shards and shard_count given
    int32 shard_count;
    ArrayType *shards;
    bool by_node;
};
ClaimCall check_claim_call(FunctionCallInfo fcinfo, const ClaimArgs &a);

// A claim's result (materialize mode): the tuplestore the claimed rows go
// straight to, mapped onto the queue's row type (which still counts dropped
// columns), in the query's memory, and a receiver that writes there. Not
// detoasted (the receiver cannot map and detoast at once): the calling
// query reads them in this transaction, which holds a lock on the table,
// so their TOAST values stay. finish_result hands it to the caller.
struct ClaimResult {
    Tuplestorestate *store;
    TupleDesc desc;
    DestReceiver *dest;
};
ClaimResult begin_result(ReturnSetInfo *rsinfo, Oid typid);
Datum finish_result(ReturnSetInfo *rsinfo, const ClaimResult &r);
// The shards of claim_shards and claim_ordered: a one-dimensional array
// without NULLs of shards in [0, shard_count) (22023).
void check_shards(ArrayType *shards, int32 shard_count);

// Runs a claim-SQL builder (core/claim_sql.hpp: a callable returning a
// std::string) and returns its text palloc'd in the current memory
// context. The copy is made through glue (boundary.hpp, rule 2): the
// std::string is alive while pnstrdup may ereport.
template <typename F>
char *sql_text(F &&build) {
    std::string text = build();
    return sharding::glue(pnstrdup, text.c_str(), static_cast<Size>(text.size()));
}

// claim_node (docs/ordered.md), first steps, in queue_ordered.cpp: takes
// the map's share lock (move_shard, rebalance and pin wait for the claim's
// transaction), raises 42704 for an unknown map, registers the worker's
// node in sharding.claim_node_workers, and returns what handoff_needed
// needs to know of the registrations. Needs an SPI connection.
struct NodeClaim {
    bool others;          // a worker is registered with another node of the map
    int64 registrations;  // fingerprint of the map's registrations
};
NodeClaim begin_node_claim(Datum map, Datum node, Datum worker);

// Whether the claim needs the handoff exclusion: a worker registered with
// another node holds a job of a key of `node` (remembered as clear while
// routing and registrations stay as they were; always true under
// REPEATABLE READ and SERIALIZABLE). After the queue table and key column
// were checked; needs an SPI connection.
bool handoff_needed(Oid relid, const char *key_column, Datum map, Datum node, const NodeClaim &c);

// The handoff exclusion's SQL, one text for every claim that uses it, is
// the claim-SQL builder's (core/claim_sql.hpp: foreign_jobs, handoff_ctes,
// handoff_exclusion).

// Argument checks and SPI helpers shared by every queue function
// (queue.cpp). require: 22023 "<what> must not be null" for a NULL argument.
// check_lease: the lease argument, 22023 if NULL or negative. keep: prepares
// and keeps a statement, always with a generic plan. connect_spi:
// SPI_connect or elog.
void require(FunctionCallInfo fcinfo, int argno, const char *what);
Datum check_lease(FunctionCallInfo fcinfo, int argno);
SPIPlanPtr keep(const char *sql, int nargs, Oid *types);
void connect_spi();

// Claims under a pinned horizon (queue.cpp, "claims under a pinned
// horizon"): a claim normally resumes past a remembered position and every
// so often sweeps from the start of the pending index, which is exact. A
// claim sweeps when the last sweep was cheap (under kCheapSweepUs of CPU),
// and otherwise once the claims resumed since have used kSweepRatio times
// its CPU cost, or kSweepWallRatio times its cost of wall-clock time passed.
constexpr int64 kCheapSweepUs = 1000;
constexpr int64 kSweepRatio = 16;
constexpr int64 kSweepWallRatio = 256;

// When this backend last swept a queue, and what that cost.
struct SweepClock {
    int64 last_end_us;   // monotonic clock
    int64 cost_us;       // CPU time of that claim; 0: unknown
    int64 cpu_since_us;  // CPU time of the resumed claims since
};
int64 monotonic_us();
int64 thread_cpu_us();
// Whether the next claim must sweep, by the clock alone.
bool sweep_due(const SweepClock &clock);
// Whether the (sub)transaction xid that set a position was rolled back (or
// is too old to tell). InvalidTransactionId: false.
bool rolled_back(TransactionId xid);

// ordered_positions.cpp: forgets the ordered claims' remembered positions of a
// queue (fail with retry sent a job back to pending, behind them).
void forget_ordered_positions(Oid relid);
// ordered_positions.cpp, from queue_init: the shared positions of the ordered
// claims (preload only) and their transaction callbacks.
void ordered_init();

// claim_node with ordered => false, in queue.cpp: the claim of
// claim_shards (resumable, see queue.cpp) filtered by node_for.
Datum claim_node_unordered(FunctionCallInfo fcinfo);

template <typename Build>
PlanEntry *cached_plan(const Queue *q, uint32 kind, const char *key_column, int nargs, Oid *types, Build build) {
    PlanEntry *p = plan_entry(q, kind, key_column);
    if (p->plan == nullptr) {
        p->plan = keep(build(), nargs, types);
        p->built = false;
    }
    return p;
}

}  // namespace queue
}  // namespace sharding
