// The claim-SQL builder: the SQL text of every claim kind's statements
// (claim, claim_shards, claim_node, claim_ordered), pure C++, no PostgreSQL
// header (make check-layers), unit-tested by test/unit/claim_sql_test.cpp.
//
// The caller (src/queue/) quotes every identifier (quote_identifier,
// quote_qualified_identifier) before it comes here and passes every value
// as a parameter ($n): the builder only assembles text. The statements
// qualify every function and operator they use (pg_catalog.now(),
// OPERATOR(pg_catalog.=)) where the claim runs under the caller's
// search_path.
//
// The builder and the executor share one description of what a statement
// is: ClaimPlan (claim, claim_shards, claim_node unordered) with its
// parameters ClaimParam, and the ordered pick's variant bits (Ordered ...
// Update) with its parameters PickParam.
#pragma once

#include <cstdint>
#include <string>

namespace sharding {
namespace claim_sql {

// What the SQL text of a queue's claims is built from: the table's quoted,
// schema-qualified name and which optional columns the claim kind orders
// and counts by (queue.hpp, claim_columns).
struct Table {
    const char *qname;
    bool has_attempts, has_run_at, has_priority;
};

// ---------------------------------------------------------------- claim
// claim, claim_shards and claim_node (ordered => false): one statement
// that locks and updates, sweep (from the start of the pending index, with
// expired leases) or resume (past a remembered position).
enum class Filter : uint8_t {
    None,    // claim
    Shards,  // claim_shards: shard_of(key, $6) = ANY ($5)
    Node,    // claim_node: node_for($11, key) = $12 (with the handoff exclusion when `handoff`)
};

struct ClaimPlan {
    Filter filter;
    bool resume;   // past the position $7-$10
    bool handoff;  // Filter::Node only: the handoff exclusion
    bool reap;     // the queue has max_attempts ($4): expired leases past it go to failed
    // Bits of the plan cache key (queue.cpp).
    uint32_t bits() const {
        return static_cast<uint32_t>(filter) | (resume ? 4u : 0u) | (handoff ? 8u : 0u) | (reap ? 16u : 0u);
    }
};

// The parameters of every claim statement, $1 to $12 ($n is index n - 1).
enum ClaimParam : int {
    CWorker = 0,  // $1 text
    CBatch,       // $2 integer
    CLease,       // $3 interval
    CMaxAttempts, // $4 integer, NULL: unlimited
    CShards,      // $5 integer[] (Filter::Shards)
    CShardCount,  // $6 integer (Filter::Shards)
    CPosPriority, // $7 smallint (resume)
    CPosRunAt,    // $8 timestamptz (resume)
    CPosCreated,  // $9 timestamptz (resume)
    CPosId,       // $10 bigint (resume)
    CMap,         // $11 text (Filter::Node)
    CNode,        // $12 text (Filter::Node)
    ClaimParams   // how many
};
static_assert(ClaimParams == 12, "claim numbers its parameters $1 to $12");

// Whether the statement of `plan` reads parameter p (the executor passes
// NULL for the others).
bool claim_param_used(const ClaimPlan &plan, ClaimParam p);

// key: the quoted key column (Filter::Shards and Node; nullptr for None).
std::string claim(const Table &t, const char *key, const ClaimPlan &plan);

// ------------------------------------------------------------ handoff
// The handoff exclusion's SQL, one text for every claim that uses it
// (queue.hpp documents them). qname, key: quoted; map, node: the
// parameters that hold them ("$6").
std::string foreign_jobs(const char *qname, const char *key, const char *map, const char *node, bool live_only);
std::string handoff_ctes(const char *qname, const char *key, const char *map, const char *node);
std::string handoff_exclusion(const char *key_expr, const char *map);

// ------------------------------------------------------------ ordered
// claim_ordered and claim_node (ordered => true): a pick per round
// (queue_ordered.cpp runs the rounds) and the claim's UPDATE.
//
// Variant bits of an ordered claim statement (also the `variant` argument
// of sharding._claim_ordered_sql).
enum : uint32_t {
    Ordered = 1,   // per-key order (claim_ordered, claim_node ordered => true)
    ByShard = 2,   // shards/shard_count filter
    ByNode = 4,    // node_for(map, key) = node
    Reap = 8,      // the queue has max_attempts: expired leases past it go to failed
    Handoff = 16,  // ByNode, and a worker is registered with another node: the handoff exclusion
    Resume = 32,   // the pick's walk starts past a position
    Update = 64,   // not a pick: the claim's UPDATE of the picked ids
    Candidates = 128,  // not a pick: the candidates of a round, tested and locked by the caller
    // Update | Candidates, never a pick or UPDATE: the listed-job check
    ListedJob = Update | Candidates,
};

// What the ordered statements are built from: the table, its quoted key
// column and the key column's type as format_type_be_qualified spells it.
struct OrderedTable {
    Table t;
    const char *key;
    const char *key_type;
};

// The parameters' indexes of the pick ($n is index n - 1; see pick()).
enum PickParam : int {
    PWorker = 0, PNeed, PLease, PShards, PShardCount, PMap, PNode, PMaxAttempts, PWalk,
    PPosPriority, PPosRunAt, PPosCreated, PPosId, PLeftOut, PTaken, PFirstRound, PProbed,
    PickParams  // how many
};
static_assert(PickParams == 17, "pick numbers its parameters $1 to $17");

// The pick of one round of an ordered claim (variant without Update).
std::string pick(const OrderedTable &q, uint32_t variant);
// The candidates of one round (variant without Update and Candidates), for
// a caller that tests and locks them itself: the pick's walk and probes,
// its expired leases (untested, unlocked) and tail, one row
// each: kind ('e' expired, 'w' walked, 'p' probed, 't' tail), the
// claim-order key as pick() returns it, the key as text, the row's ctid
// and whether it passes the claim's filter (a probed job may not: not
// due, another shard or node). The pick's parameters; $1 and $3 are not
// read.
std::string candidates(const OrderedTable &q, uint32_t variant);
// The claim's UPDATE: $1 worker, $2 the picked ids, $3 lease.
std::string update(const OrderedTable &q);
// One pending job of the key $1 (text) at or before the position $2-$5
// (priority int8, run_at, created, id) in claim order, if any: its
// claim-order key as pick() returns it.
std::string listed_job(const OrderedTable &q);
constexpr int ListedJobParams = 5;
constexpr int UpdateParams = 3;

}  // namespace claim_sql
}  // namespace sharding
