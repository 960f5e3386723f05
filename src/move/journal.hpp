// The move journal's interface (move_journal.cpp, docs/moves.md): what
// rebalance jobs (src/jobs/) and the public move calls ask of it. The
// journal is the table sharding.move_journal, a row per move.
#pragma once

#include "pg/spi.hpp"

#include <string>

namespace sharding::move {

int64 enqueue(const Text &job, const Text &map, const Text &logical, const Text &key, const Text &destination);
// may_defer: a direct move_shard_online (run_move), which may leave the
// source's rows to the move cleaner (sharding.move_cleanup = deferred).
std::string execute(int64 id, bool may_defer = false);
std::string resolve(int64 id, const std::string &final_phase);
bool cancel(int64 id);
// skip_fresh_deferred: leaves alone the deferred clean-ups of the last 10 s
// whose cleaner has not taken them yet (the calls of move_shard_online and
// isolate, which would otherwise do the previous call's delete themselves).
int32 recover(bool skip_fresh_deferred = false);
// move_abandon (docs/moves.md, "A node gone for good"): the live move of
// (map, logical) ended, its source or destination gone for good; the node
// that owns the shard.
std::string abandon(const Text &map, const Text &logical, bool force);
// The executor's session-level advisory lock of a move,
// (executor_lock_class(), executor_lock_obj(move)) =
// (hashtext('sharding.move_journal'), move % (2^31 - 1)): held by whoever
// carries the move out, resolves it (recovery, a cancel) or has claimed it
// for a rebalance job; a move whose lock is free and whose phase is not
// final was interrupted.
int32 executor_lock_class();
inline int32 executor_lock_obj(int64 id) { return (int32)(id % 2147483647); }

// _move_enqueue of a job's move: 42501 unless the current role has the
// privileges of the role the job runs as (no role adds a move that runs
// with rights it does not have: CONTRACT 15.2).
void require_job_role(const Text &job);

}  // namespace sharding::move
