// The data path of an online move (docs/moves.md): what the copy
// (move_copy.cpp) and the deletes of the moved rows (move_delete.cpp)
// share.
//
// Triggers that cannot fire still cost: PostgreSQL's COPY FROM does not
// batch inserts into a table with any BEFORE ROW INSERT trigger, and a
// DELETE locks every row (heap_lock_tuple, one more WAL record per row)
// before it looks at the BEFORE ROW DELETE triggers it would call. The
// move's sessions run under session_replication_role = replica, where
// triggers enabled 'O' (the default, the guard's) or 'D' never fire. For
// the time of one statement, this backend's relcache entry of the table
// carries a copy of its triggers without those (TriggerEnabled in
// trigger.c decides the same way per row): only this backend, only this
// statement, only triggers that would not have run. The guard still
// refuses every other session's writes, and a trigger that fires in
// replica mode (ENABLE REPLICA / ALWAYS) is kept and runs.
//
// C-style code (it may ereport): call it through glue/pg_call from C++.
#pragma once

#include "remote/move_remote.hpp"

#include <functional>
#include <string>
#include <vector>

extern "C" {
#include "utils/rel.h"
}

namespace sharding::move {

// Runs fn(arg) with rel's BEFORE ROW triggers for `event`
// (TRIGGER_TYPE_INSERT or TRIGGER_TYPE_DELETE) that cannot fire in this
// session left out of rel's relcache entry, put back on every exit; as
// fn(arg) where none can be left out. rel is open (and locked) by the
// caller for the whole call; fn's executor copies the triggers when it
// starts.
uint64 without_idle_triggers(Relation rel, int16 event, uint64 (*fn)(void *), void *arg);

// Parts. A large table is copied (at the destination) and deleted (from the
// coordinator, at the node) by up to sharding.move_parallel sessions at
// once, each on a range of the table's blocks: the source's idle cores
// work too. Tables under 2 * kPartPages blocks go in one session.
extern int move_parallel;
// sharding.move_verify: compare the shard's rows at both ends before the
// source's copy is deleted (move_orchestrate.cpp, verify_copy).
extern bool move_verify;
// sharding.move_cleanup: when a direct move_shard_online deletes the
// shard's rows at the source: before it returns (immediate, the default)
// or right after, in a background worker (deferred; move_journal.cpp).
enum class Cleanup { Immediate = 0, Deferred = 1 };
extern int move_cleanup;
// sharding.move_nice: how much lower than other sessions' the copy's
// sessions run (0-19, added to the session's nice value). A copy session
// at the source (the COPY TO of _move_pull) and each part's session at
// the destination ask for it with _move_nice; 0 leaves them alone.
extern int move_nice;
// On a session of the copy: raises its backend's nice value by
// nice (move_nice unless given), if any, through sharding._move_nice there (a session where
// there is no such function, or whose role may not call it, is left
// alone: a priority is not worth failing a move for).
void nice_session(PGconn *conn, int nice = move_nice);
constexpr int64 kPartPages = 256;  // 2 MB of heap per part at least
// How many parts for a table of `blocks` blocks (at least 1), of at most
// `sessions` (sharding.move_parallel, or a move's share of it).
int parts_for(int64 blocks, int sessions = move_parallel);
// The condition of part i of n of such a table: "(condition)" and its
// block range (the first from block 0, the last to the end of the table).
std::string part_condition(const std::string &condition, int64 blocks, int i, int n);
// SELECT of a table's size in blocks, for a session with search_path
// pg_catalog; rel qualified and quoted.
std::string blocks_query(const std::string &rel);

// Shard-partitioned tables (docs/partitions.md): a SELECT, for a session
// with search_path pg_catalog, of the leaf partitions of `rel` (a regclass
// expression) that hold exactly one logical shard: plain tables directly
// under it, bounded FOR VALUES WITH (MODULUS n, REMAINDER r), rel hash-
// partitioned on one column with one of sharding's *_shard_ops classes.
// The column must be NOT NULL (PostgreSQL puts NULL keys in remainder 0,
// which shard_of(NULL, n) = 0 does not select); the primary key a
// distributed table needs includes it in practice (a partitioned table's
// primary key includes its partition key).
// Columns: the leaf's oid, its qualified quoted name, and `shard`, the
// condition that selects exactly its rows, written as filter_sql writes a
// shard move's (sharding.shard_of(<column>, n) OPERATOR(pg_catalog.=) r).
// A move whose condition for rel is exactly one leaf's reads that leaf
// alone and, once switched, truncates it at the source.
std::string shard_leaves_sql(const std::string &rel);
// A result's answer: a query's first value ("" if none or NULL), a
// command's tag; the result is cleared.
std::string answer(PGresult *res);
// Waits for the statement sent (PQsendQuery) on each connection given
// (nullptr: none sent there), whichever answers first, interruptibly;
// throws the first remote error as collect_statement does (the caller
// cancels the others). The answers, in order.
std::vector<std::string> collect_all(const std::vector<PGconn *> &conns, const char *prefix);

// The connection options of a live connection, as a conninfo string
// (another session like it: the same node, the same login).
std::string conninfo_of(PGconn *conn);
// Whether e says that a node refused a connection for want of a free one
// (max_connections, a role's or a database's connection limit).
bool out_of_connections(const Error &e);
// A queue of statements over several connections: each connection runs
// the next statement of `work` as soon as its own has answered, until all
// have; done(i, answer) for each as it answers (answer as answer() reads
// it); tick() at least every tick_ms while waiting (none if empty). Every
// wait interruptible; a remote error is thrown as collect_statement throws
// it (with prefix; the caller cancels the others, e.g. by closing them).
// A statement of the queue whose own connection could not be made (a node
// at max_connections, 53300 there: its message) is given back to the queue
// and its session stops taking items, with a WARNING, while another
// session still works; the last one's failure is thrown.
void run_queue(const std::vector<PGconn *> &conns, const std::vector<std::string> &work, const char *prefix,
               const std::function<void(size_t, const std::string &)> &done, const std::function<void()> &tick,
               long tick_ms);

// The move's slot at node `source`, made over a replication connection
// that exports its snapshot and is held until close_held(slot)
// (move_copy.cpp).
struct SlotMade {
    std::string lsn, snapshot;
};
SlotMade create_slot(const std::string &source, const std::string &slot, const std::string &plugin,
                     const std::string &options);

}  // namespace sharding::move
