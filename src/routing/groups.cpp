// Worker groups (docs/workers.md, CONTRACT 15.5), the C++ side:
//
// - sharding._group_call(op, map, worker, lease): join, heartbeat, leave and
//   the reap of a map, run by sharding._group_apply (sql/install/55_groups.sql)
//   as the extension's owner, told the calling role (GetUserId()), which it
//   checks. The switch is SetUserIdAndSecContext(owner, ... |
//   SECURITY_LOCAL_USERID_CHANGE) around one call of a function found in the
//   catalog as a member of the extension (no name resolved through a
//   search_path), restored by PG_FINALLY (and by transaction abort);
// - sharding._group_watch(expires, reaped): with the library preloaded, a
//   small table in shared memory of the databases that have members, with
//   when their next lease expires; the launcher of the rebalance jobs
//   (src/jobs/jobs.cpp) asks groups_take_due() at each round, starts a
//   short reaper in each database that is due (sharding._group_reap(), as
//   the extension's owner, search_path pinned), and sleeps no longer than
//   groups_take_due says. A database whose table entry cannot be had (more
//   than kMaxWatched) is noticed at the next call on its maps.
// - groups_notice(map): what claim_node calls before it claims: the reap of
//   the map when one of its members' leases has expired.
//
// Boundary (boundary.hpp, rule 2): C-style, no owning C++ object.
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "pg/launcher.hpp"
#include "pg/shmem.hpp"
#include "routing/groups.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
}

namespace {

constexpr int kMaxWatched = 64;

struct Watch {
    Oid db;            // InvalidOid: a free entry
    bool touched;      // a lease was taken or renewed since the reaper started
    TimestampTz due;   // the next expiry (or the reaper's retry)
    TimestampTz reaping;  // 0, or when a reaper was started (the launcher does not wait for it)
};

struct GroupsShared {
    slock_t mutex;
    Watch watches[kMaxWatched];
};

GroupsShared *gshared = nullptr;

void groups_shmem_attach(void *mem, bool found) {
    gshared = static_cast<GroupsShared *>(mem);
    if (!found) {
        memset(gshared, 0, sizeof(GroupsShared));
        SpinLockInit(&gshared->mutex);
    }
}

// The owner of the extension and sharding._group_apply(text, text, text,
// interval, oid), a member of it; InvalidOid where the extension is not
// installed or the function is missing (a database not updated to 1.4).
void find_group_apply(Oid *owner, Oid *fn) {
    const sharding::Extension e = sharding::find_extension();
    *owner = e.owner;
    *fn = InvalidOid;
    if (!OidIsValid(e.oid)) return;
    Oid argtypes[5] = {TEXTOID, TEXTOID, TEXTOID, INTERVALOID, OIDOID};
    *fn = sharding::extension_function(e, "_group_apply", 5, argtypes);
}

// _group_apply(op, map, worker, lease, caller) as the extension's owner.
// NULL arguments pass as NULL. `owner_only`: an operation of the reapers
// ('reap', 'reap_all'), refused (42501) unless the caller is the
// extension's owner or a superuser. C-style: may ereport.
int64 group_apply(Datum op, Datum map, bool map_null, Datum worker, bool worker_null, Datum lease, bool lease_null,
                  bool owner_only, bool *result_null) {
    Oid caller = GetUserId();
    Oid owner, fn;
    find_group_apply(&owner, &fn);
    if (!OidIsValid(fn))
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("worker groups need version 1.4 of the extension sharding"),
                        errhint("ALTER EXTENSION sharding UPDATE")));
    if (owner_only && caller != owner && !superuser())
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("permission denied for worker group operation %s", TextDatumGetCString(op)),
                        errdetail("Only join, heartbeat and leave may be called by a role other than the "
                                  "extension's owner.")));
    FmgrInfo flinfo;
    fmgr_info(fn, &flinfo);
    LOCAL_FCINFO(fcinfo, 5);
    InitFunctionCallInfoData(*fcinfo, &flinfo, 5, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = op;
    fcinfo->args[0].isnull = false;
    fcinfo->args[1].value = map;
    fcinfo->args[1].isnull = map_null;
    fcinfo->args[2].value = worker;
    fcinfo->args[2].isnull = worker_null;
    fcinfo->args[3].value = lease;
    fcinfo->args[3].isnull = lease_null;
    fcinfo->args[4].value = ObjectIdGetDatum(caller);
    fcinfo->args[4].isnull = false;
    Oid save_user;
    int save_sec;
    GetUserIdAndSecContext(&save_user, &save_sec);
    volatile Datum d = 0;
    SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
    PG_TRY();
    { d = FunctionCallInvoke(fcinfo); }
    PG_FINALLY();
    { SetUserIdAndSecContext(save_user, save_sec); }
    PG_END_TRY();
    *result_null = fcinfo->isnull;
    return fcinfo->isnull ? 0 : DatumGetInt64(d);
}

Watch *watch_of(Oid db, bool add) {
    Watch *free_one = nullptr;
    for (Watch &w : gshared->watches) {
        if (w.db == db) return &w;
        if (!OidIsValid(w.db) && free_one == nullptr) free_one = &w;
    }
    if (!add || free_one == nullptr) return nullptr;
    free_one->db = db;
    free_one->touched = false;
    free_one->due = DT_NOEND;
    free_one->reaping = 0;
    return free_one;
}

Oid members_relid() {
    Oid ns = get_namespace_oid("sharding", true);
    return OidIsValid(ns) ? get_relname_relid("worker_members", ns) : InvalidOid;
}

SPIPlanPtr expired_plan = nullptr;
Oid expired_relid = InvalidOid;

}  // namespace

// _group_call(op text, map text, worker text, lease interval): bigint.
SHARDING_FUNCTION(sharding__group_call) {
    if (PG_ARGISNULL(0)) sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "operation must not be NULL");
    bool isnull = false;
    int64 r = sharding::pg_call([&] {
        // Any role may call join, heartbeat and leave (_group_apply checks
        // its rights); anything else only the extension's owner (the
        // reaper's sharding._group_reap) or a superuser.
        text *op = PG_GETARG_TEXT_PP(0);
        const char *o = VARDATA_ANY(op);
        size_t len = VARSIZE_ANY_EXHDR(op);
        auto is = [&](const char *w) { return len == strlen(w) && memcmp(o, w, len) == 0; };
        bool worker_op = is("join") || is("heartbeat") || is("leave");
        return group_apply(PointerGetDatum(op), PG_ARGISNULL(1) ? 0 : PG_GETARG_DATUM(1), PG_ARGISNULL(1),
                           PG_ARGISNULL(2) ? 0 : PG_GETARG_DATUM(2), PG_ARGISNULL(2),
                           PG_ARGISNULL(3) ? 0 : PG_GETARG_DATUM(3), PG_ARGISNULL(3), !worker_op, &isnull);
    });
    if (isnull) PG_RETURN_NULL();
    PG_RETURN_INT64(r);
}

// _group_watch(expires timestamptz, reaped boolean): void. A lease taken or
// renewed (reaped false): the database's next due time is at most
// `expires`. The reaper's report (reaped true): the next expiry it saw
// (NULL: no member left), unless a lease was taken meanwhile.
SHARDING_FUNCTION(sharding__group_watch) {
    if (gshared == nullptr || PG_ARGISNULL(1)) PG_RETURN_VOID();
    bool reaped = PG_GETARG_BOOL(1);
    bool has = !PG_ARGISNULL(0);
    TimestampTz expires = has ? PG_GETARG_TIMESTAMPTZ(0) : DT_NOEND;
    bool sooner = false;
    SpinLockAcquire(&gshared->mutex);
    Watch *w = watch_of(MyDatabaseId, has);
    if (w != nullptr) {
        if (!reaped) {
            w->touched = true;
            sooner = expires < w->due;
            if (sooner) w->due = expires;
        } else if (!w->touched) {
            if (has)
                w->due = expires;
            else
                *w = Watch{InvalidOid, false, 0, 0};
        } else if (has && expires < w->due) {
            w->due = expires;
        }
    }
    SpinLockRelease(&gshared->mutex);
    // The launcher sleeps until the next due time it knew of.
    if (sooner) sharding::jobs_poke_launcher();
    PG_RETURN_VOID();
}

namespace sharding {

// From _PG_init: the shared table, when preloading.
void groups_init() {
    shmem::add({"sharding worker groups", sizeof(GroupsShared), nullptr, nullptr, groups_shmem_attach});
}

// For the launcher: the databases whose next lease expiry has come (at
// most max, into dbs), each marked reaping (no second reaper while one
// runs: the launcher does not wait for them) and given a retry 5 s later
// in case its reaper fails; in *next_ms the milliseconds until the next
// one not due (-1: none). A reaper that has not ended after 60 s (never
// started) no longer counts.
int groups_take_due(Oid *dbs, int max, long *next_ms) noexcept {
    *next_ms = -1;
    if (gshared == nullptr) return 0;
    TimestampTz now = GetCurrentTimestamp();
    int n = 0;
    SpinLockAcquire(&gshared->mutex);
    for (Watch &w : gshared->watches) {
        if (!OidIsValid(w.db)) continue;
        if (w.reaping != 0 && w.reaping > TimestampTzPlusMilliseconds(now, -60000)) continue;
        if (w.due <= now && n < max) {
            dbs[n++] = w.db;
            w.touched = false;
            w.reaping = now;
            w.due = TimestampTzPlusMilliseconds(now, 5000);
        }
        long ms = w.due <= now ? 0 : (long)((w.due - now + 999) / 1000);
        if (*next_ms < 0 || ms < *next_ms) *next_ms = ms;
    }
    SpinLockRelease(&gshared->mutex);
    return n;
}

// A reaper of db ended, or could not be started: the next one may start
// (at once if its report made the database due again). `forget`: it found
// no extension (dropped, or not updated to 1.4) in db: the entry goes (a
// later join adds it again).
void groups_reaper_done(Oid db, bool forget) noexcept {
    if (gshared == nullptr) return;
    bool due = false;
    TimestampTz now = GetCurrentTimestamp();
    SpinLockAcquire(&gshared->mutex);
    for (Watch &w : gshared->watches)
        if (w.db == db) {
            if (forget && !w.touched) {
                w = Watch{InvalidOid, false, 0, 0};
                continue;
            }
            w.reaping = 0;
            due = w.due <= now;
        }
    SpinLockRelease(&gshared->mutex);
    if (due) jobs_poke_launcher();
}

// claim_node's first step (queue_ordered.cpp): if a member of the map's
// worker group has an expired lease, the map is reaped now (as the
// extension's owner). One cheap query where the map has a group; nothing
// on a database not updated to 1.4. C-style: may ereport (under SPI).
void groups_notice(Datum map) {
    Oid relid = members_relid();
    if (!OidIsValid(relid)) return;
    if (expired_plan == nullptr || expired_relid != relid) {
        if (expired_plan != nullptr) SPI_freeplan(expired_plan);
        expired_plan = nullptr;
        Oid types[1] = {TEXTOID};
        SPIPlanPtr p = SPI_prepare("SELECT FROM sharding.worker_members w WHERE w.map OPERATOR(pg_catalog.=) $1 "
                                   "AND w.lease_expires OPERATOR(pg_catalog.<) pg_catalog.clock_timestamp() LIMIT 1",
                                   1, types);
        if (p == nullptr) elog(ERROR, "worker groups: preparing the lease check failed");
        if (SPI_keepplan(p) != 0) elog(ERROR, "worker groups: keeping the lease check failed");
        expired_plan = p;
        expired_relid = relid;
    }
    Datum values[1] = {map};
    int rc = SPI_execute_plan(expired_plan, values, nullptr, true, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "worker groups: the lease check failed");
    if (SPI_processed == 0) return;
    bool isnull;
    (void)group_apply(CStringGetTextDatum("reap"), map, false, 0, true, 0, true, false, &isnull);
}

}  // namespace sharding
