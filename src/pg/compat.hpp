// The differences between the PostgreSQL major versions sharding builds
// against (15, 17 and 18; 16 in between is expected to work, untested).
//
// The one place with `#if PG_VERSION_NUM`: the rest of the source calls the
// names below and stays version-free. Each entry says which version changed
// what. Included (after the PostgreSQL headers) by pg.hpp, so every
// translation unit has it.
#pragma once

extern "C" {
#include "postgres.h"

#include "access/genam.h"
#include "access/transam.h"
#include "catalog/pg_collation_d.h"
#include "executor/executor.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/rel.h"
#include "utils/relcache.h"
}

#if PG_VERSION_NUM < 150000
#error "sharding needs PostgreSQL 15 or later"
#endif

// Version string for PG_MODULE_MAGIC_EXT (the Makefile passes
// -DSHARDING_VERSION from sharding.control).
#ifndef SHARDING_VERSION
#define SHARDING_VERSION "unknown"
#endif

// 18: the module magic block may carry the module's name and version (shown by
// pg_get_loaded_modules()). Use SHARDING_MODULE_MAGIC instead of
// PG_MODULE_MAGIC, inside extern "C".
#if PG_VERSION_NUM >= 180000
#define SHARDING_MODULE_MAGIC PG_MODULE_MAGIC_EXT(.name = "sharding", .version = SHARDING_VERSION)
#else
#define SHARDING_MODULE_MAGIC PG_MODULE_MAGIC
#endif

// 18: pg_collation_d.h no longer names POSIX_COLLATION_OID; the collation is
// still there with the same pinned OID (951, postgres.bki of 15, 17 and 18).
#ifndef POSIX_COLLATION_OID
#define POSIX_COLLATION_OID 951
#endif

// 18: ExecutorRun lost its execute_once argument. Write an ExecutorRun hook as
//   static void my_run(SHARDING_EXECUTOR_RUN_PARAMS) {
//       ... prev ? prev(SHARDING_EXECUTOR_RUN_ARGS)
//                : standard_ExecutorRun(SHARDING_EXECUTOR_RUN_ARGS); ...
//   }
// (parameters named queryDesc, direction, count[, execute_once]).
#if PG_VERSION_NUM >= 180000
#define SHARDING_EXECUTOR_RUN_PARAMS QueryDesc *queryDesc, ScanDirection direction, uint64 count
#define SHARDING_EXECUTOR_RUN_ARGS queryDesc, direction, count
#else
#define SHARDING_EXECUTOR_RUN_PARAMS \
    QueryDesc *queryDesc, ScanDirection direction, uint64 count, bool execute_once
#define SHARDING_EXECUTOR_RUN_ARGS queryDesc, direction, count, execute_once
#endif

// 17: a decoded change's tuples (ReorderBufferChange.data.tp.newtuple,
// oldtuple) are HeapTuples; before, ReorderBufferTupleBuf * holding one.
#if PG_VERSION_NUM >= 170000
#define SHARDING_CHANGE_TUPLE(t) (t)
#else
#define SHARDING_CHANGE_TUPLE(t) ((t) != nullptr ? &(t)->tuple : nullptr)
#endif

namespace sharding::compat {

// 18: index_beginscan takes the scan's instrumentation (NULL: none).
inline IndexScanDesc index_beginscan(Relation heap, Relation index, Snapshot snapshot, int nkeys, int norderbys) {
#if PG_VERSION_NUM >= 180000
    return ::index_beginscan(heap, index, snapshot, nullptr, nkeys, norderbys);
#else
    return ::index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}

// 18: RelationGetPrimaryKeyIndex(rel, deferrable_ok). Earlier versions never
// returned a deferrable primary key, so false keeps their meaning.
inline Oid primary_key_index(Relation rel) {
#if PG_VERSION_NUM >= 180000
    return RelationGetPrimaryKeyIndex(rel, false);
#else
    return RelationGetPrimaryKeyIndex(rel);
#endif
}

// 17: PGPROC's lxid and backendId moved into PGPROC.vxid (vxid.lxid,
// vxid.procNumber). This backend's current local transaction id.
inline LocalTransactionId my_local_xid() {
#if PG_VERSION_NUM >= 170000
    return MyProc->vxid.lxid;
#else
    return MyProc->lxid;
#endif
}

// 17: the shared transaction counters ShmemVariableCache were renamed
// TransamVariables. The oldest xid whose commit status clog still knows.
inline TransactionId oldest_clog_xid() {
#if PG_VERSION_NUM >= 170000
    return TransamVariables->oldestClogXid;
#else
    return ShmemVariableCache->oldestClogXid;
#endif
}

}  // namespace sharding::compat
