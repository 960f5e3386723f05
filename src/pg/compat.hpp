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

#include "access/transam.h"
#include "catalog/pg_collation_d.h"
#include "catalog/pg_namespace_d.h"
#include "catalog/pg_proc_d.h"
#include "executor/executor.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#if PG_VERSION_NUM >= 170000
#include "storage/procnumber.h"
#else
#include "storage/backendid.h"
#endif
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

namespace sharding::compat {

// 18: RelationGetPrimaryKeyIndex(rel, deferrable_ok). Earlier versions never
// returned a deferrable primary key, so false keeps their meaning.
inline Oid primary_key_index(Relation rel) {
#if PG_VERSION_NUM >= 180000
    return RelationGetPrimaryKeyIndex(rel, false);
#else
    return RelationGetPrimaryKeyIndex(rel);
#endif
}

// 16: pg_namespace_aclcheck, pg_proc_aclcheck, pg_database_aclcheck ... were
// folded into object_aclcheck(classid, objectid, roleid, mode).
// (pg_class_aclcheck and pg_attribute_aclcheck_all are unchanged.)
inline AclResult namespace_aclcheck(Oid nspid, Oid roleid, AclMode mode) {
#if PG_VERSION_NUM >= 160000
    return object_aclcheck(NamespaceRelationId, nspid, roleid, mode);
#else
    return pg_namespace_aclcheck(nspid, roleid, mode);
#endif
}
inline AclResult proc_aclcheck(Oid procid, Oid roleid, AclMode mode) {
#if PG_VERSION_NUM >= 160000
    return object_aclcheck(ProcedureRelationId, procid, roleid, mode);
#else
    return pg_proc_aclcheck(procid, roleid, mode);
#endif
}

// 17: BackendId/MyBackendId (1-based) became ProcNumber/MyProcNumber
// (0-based). This backend's slot in a per-backend shared array of
// MaxBackends entries, 0-based on every version.
inline int my_backend_slot() {
#if PG_VERSION_NUM >= 170000
    return MyProcNumber;
#else
    return MyBackendId - 1;
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
