// Queue tables (sections 3, 9, 10 of the contract): the checks and column
// discovery every claim needs, shared by queue.cpp and queue_ordered.cpp.
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

// The claim order for the present columns, each column prefixed by
// `prefix` ("" or "t."): "priority DESC, run_at, created, id".
const char *claim_order(const QueueColumns &cols, const char *prefix);

// Runs a claim-SQL builder (core/claim_sql.hpp: a callable returning a
// std::string) and returns its text palloc'd in the current memory
// context. The copy is made through glue (boundary.hpp, rule 2): the
// std::string is alive while pnstrdup may ereport.
template <typename F>
char *sql_text(F &&build) {
    std::string text = build();
    return sharding::glue(pnstrdup, text.c_str(), static_cast<Size>(text.size()));
}

// claim_node (contract section 9), first steps, in queue_ordered.cpp: takes
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
// The queue's max_attempts (sharding.queue_settings, as cached per backend
// with the queue's other settings and invalidated when they change), or -1.
// Checks the queue table as claim does. Needs an SPI connection.
int32 max_attempts_of(Oid relid);

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

// queue_ordered.cpp: forgets the ordered claims' remembered positions of a
// queue (fail with retry sent a job back to pending, behind them).
void forget_ordered_positions(Oid relid);
// queue_ordered.cpp: registers the ordered claims' cache kind (from
// queue_init).
void ordered_init();

// claim_node with ordered => false, in queue.cpp: the claim of
// claim_shards (resumable, see queue.cpp) filtered by node_for.
Datum claim_node_unordered(FunctionCallInfo fcinfo);

}  // namespace queue
}  // namespace sharding
