// DROP DATABASE of a database with a move in flight (issue 35, review
// LK-2): with the library preloaded, a ProcessUtility hook refuses it
// (55006, the hint naming the move to cancel), FORCE or not. A forced drop
// would end the move's executor in the middle and leave its replication
// slot (holding WAL), publication, frozen shard and decoding row at the
// source, its subscription and copied rows at the destination, with the
// journal that records them gone with the database.
//
// A move in flight is one whose executor is alive: the session (a caller of
// move_shard_online/isolate, or a job runner) holds the executor's
// session-level advisory lock (hashtext('sharding.move_journal'), move) in
// its database (src/nodes/move_engine.hpp, executor_lock_obj). Advisory
// locks are in the shared lock table, visible from any database: the hook
// reads them there, whatever database it runs in, without shared memory of
// its own. A move interrupted earlier (no executor) is not seen; its
// journal row is, by _move_recover in that database (docs/moves.md).
//
// Without the library preloaded nothing sees the statement: docs/moves.md
// ("Dropping the coordinator's database") says what to run on the nodes.
//
// Plain C-style code: no C++ object is alive when it ereports.
#include "pg/boundary.hpp"

extern "C" {
#include "catalog/pg_collation.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/lock.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
}

namespace sharding {
namespace {

ProcessUtility_hook_type prev_dropdb_utility = nullptr;

// The executor lock's first key (move_journal.cpp, lock_class()).
uint32 executor_class() {
    return (uint32)DatumGetInt32(
        DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID, CStringGetTextDatum("sharding.move_journal")));
}

// 55006 if a session of database `name` holds a move's executor lock.
void refuse_drop_during_move(const char *name) {
    Oid db = get_database_oid(name, true);
    if (!OidIsValid(db)) return;  // DROP DATABASE IF EXISTS of none: PostgreSQL says so
    const uint32 k1 = executor_class();
    LockData *locks = GetLockStatusData();
    uint32 move = 0;
    int pid = 0;
    for (int i = 0; i < locks->nelements; i++) {
        const LockInstanceData *l = &locks->locks[i];
        if (l->locktag.locktag_type == LOCKTAG_ADVISORY && l->locktag.locktag_field1 == db &&
            l->locktag.locktag_field2 == k1 && l->locktag.locktag_field4 == 2 && l->holdMask != 0) {
            move = l->locktag.locktag_field3;
            pid = l->pid;
            break;
        }
    }
    if (pid == 0) return;
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_IN_USE),
             errmsg("database \"%s\" cannot be dropped: move %u is in flight there (process %d)", name, move, pid),
             errdetail("Dropping it would end the move and leave its replication slot (holding WAL), publication, "
                       "subscription, frozen shard and copied rows at the nodes, with no record of them."),
             errhint("Cancel the move first: in database \"%s\", SELECT sharding._move_cancel(%u); (a rebalance "
                     "job: sharding.rebalance_cancel(job)), then drop the database.",
                     name, move)));
}

void dropdb_utility(PlannedStmt *pstmt, const char *query, bool read_only_tree, ProcessUtilityContext context,
                    ParamListInfo params, QueryEnvironment *env, DestReceiver *dest, QueryCompletion *qc) {
    Node *n = pstmt->utilityStmt;
    if (n != nullptr && IsA(n, DropdbStmt)) refuse_drop_during_move(reinterpret_cast<DropdbStmt *>(n)->dbname);
    if (prev_dropdb_utility)
        prev_dropdb_utility(pstmt, query, read_only_tree, context, params, env, dest, qc);
    else
        standard_ProcessUtility(pstmt, query, read_only_tree, context, params, env, dest, qc);
}

}  // namespace

// From _PG_init: the hook, when preloading.
void dropdb_init() {
    if (!process_shared_preload_libraries_in_progress) return;
    prev_dropdb_utility = ProcessUtility_hook;
    ProcessUtility_hook = dropdb_utility;
}

}  // namespace sharding
