// The per-backend cache module (see cache.hpp).
#include "pg/cache.hpp"

#include "pg/boundary.hpp"
#include "core/cache_alloc.hpp"
#include "core/hash_core.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/catcache.h"
#include "utils/inval.h"
#include "utils/syscache.h"
}

namespace sharding {

namespace detail {
int call_depth = 0;
bool retired_pending = false;
}  // namespace detail

namespace cache {
namespace {

constexpr int max_kinds = 16;
const Kind *kinds[max_kinds];
int nkinds = 0;
bool relcache_registered = false;
bool xact_registered = false;
// Syscache ids the one syscache callback is registered for.
int watched[max_kinds * 4];
int nwatched = 0;

MemoryContext cache_cxt = nullptr;
Stats counters = {0, 0, 0};

// What retirement holds: plain C, in cache_cxt.
struct Retired {
    enum { Context, Plan, Other } what;
    void *ptr;
    void (*free)(void *);
};
Retired *retired = nullptr;
int nretired = 0, retired_cap = 0;

// Subtransactions: the call depth when each started, so that an aborted
// subtransaction (an ERROR that skipped SHARDING_FUNCTION's epilogue, caught
// by PL/pgSQL) gives back the depth it left behind.
constexpr int max_tracked_subxacts = 64;
int subxact_depth[max_tracked_subxacts];

void relcache_dispatch(Datum, Oid relid) {
    counters.relcache_invalidations++;
    for (int i = 0; i < nkinds; i++)
        if (kinds[i]->relation_changed != nullptr) kinds[i]->relation_changed(relid);
}

void syscache_dispatch(Datum, int cacheid, uint32 hashvalue) {
    counters.syscache_invalidations++;
    for (int i = 0; i < nkinds; i++) {
        const Kind *k = kinds[i];
        if (k->syscache_changed == nullptr) continue;
        for (int s = 0; s < k->nsyscaches; s++)
            if (k->syscaches[s] == cacheid) {
                k->syscache_changed(cacheid, hashvalue);
                break;
            }
    }
}

// ---- committed changes (cache.hpp, "changes")
struct SharedChanges {
    pg_atomic_uint64 topic[ntopics];
    pg_atomic_uint64 all[ntopics];
    pg_atomic_uint64 slot[ntopics][map_slots];
};
SharedChanges *shared = nullptr;
shmem_request_hook_type prev_shmem_request = nullptr;
shmem_startup_hook_type prev_shmem_startup = nullptr;

// What this transaction changed, bumped at commit: per topic, up to
// max_pending slots, or every map.
constexpr int max_pending = 64;
struct Pending {
    bool any;
    bool all;
    int n;
    uint32 slots[max_pending];
};
Pending pending[ntopics];
bool pending_any = false;

void shmem_request() {
    if (prev_shmem_request) prev_shmem_request();
    RequestAddinShmemSpace(MAXALIGN(sizeof(SharedChanges)));
}

void shmem_startup() {
    if (prev_shmem_startup) prev_shmem_startup();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found;
    shared = static_cast<SharedChanges *>(ShmemInitStruct("sharding config changes", sizeof(SharedChanges), &found));
    if (!found) {
        for (int t = 0; t < ntopics; t++) {
            // Not 0: a backend's first look must differ from "never looked".
            pg_atomic_init_u64(&shared->topic[t], 1);
            pg_atomic_init_u64(&shared->all[t], 1);
            for (uint32 i = 0; i < map_slots; i++) pg_atomic_init_u64(&shared->slot[t][i], 0);
        }
    }
    LWLockRelease(AddinShmemInitLock);
}

void clear_pending() {
    for (int t = 0; t < ntopics; t++) pending[t].any = pending[t].all = false, pending[t].n = 0;
    pending_any = false;
}

// At commit, after the change became visible and before it is acknowledged
// or its locks are released: slots first, then the whole-topic counter, then
// the topic counter a reader looks at first (each add is a full barrier).
void publish_pending() {
    if (shared != nullptr)
        for (int t = 0; t < ntopics; t++) {
            const Pending &p = pending[t];
            if (!p.any) continue;
            if (p.all)
                pg_atomic_fetch_add_u64(&shared->all[t], 1);
            else
                for (int i = 0; i < p.n; i++) pg_atomic_fetch_add_u64(&shared->slot[t][p.slots[i]], 1);
            pg_atomic_fetch_add_u64(&shared->topic[t], 1);
        }
    clear_pending();
}

void free_one(const Retired &r) {
    switch (r.what) {
        case Retired::Context:
            MemoryContextDelete(static_cast<MemoryContext>(r.ptr));
            break;
        case Retired::Plan:
            SPI_freeplan(static_cast<SPIPlanPtr>(r.ptr));
            break;
        case Retired::Other:
            r.free(r.ptr);
            break;
    }
    counters.retired_freed++;
}

void xact_callback(XactEvent event, void *) {
    if (pending_any) {
        if (event == XACT_EVENT_PRE_PREPARE)
            ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                            errmsg("cannot prepare a transaction that changed the sharding configuration"),
                            errdetail("Other backends' routing caches learn of a configuration change when the "
                                      "backend that made it commits; COMMIT PREPARED runs elsewhere."),
                            errhint("Change maps, shards, pins and frozen shards in ordinary transactions.")));
        if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT)
            publish_pending();
        else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PREPARE)
            clear_pending();
    }
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT && event != XACT_EVENT_PREPARE &&
        event != XACT_EVENT_PARALLEL_COMMIT && event != XACT_EVENT_PARALLEL_ABORT)
        return;
    detail::call_depth = 0;
    if (detail::retired_pending) detail::free_retired();
}

void subxact_callback(SubXactEvent event, SubTransactionId, SubTransactionId, void *) {
    int level = GetCurrentTransactionNestLevel();
    if (level < 0 || level >= max_tracked_subxacts) return;
    if (event == SUBXACT_EVENT_START_SUB)
        subxact_depth[level] = detail::call_depth;
    else if (event == SUBXACT_EVENT_ABORT_SUB && detail::call_depth > subxact_depth[level])
        detail::call_depth = subxact_depth[level];
}

void add_retired(Retired r) {
    if (nretired == retired_cap) {
        int cap = retired_cap ? retired_cap * 2 : 16;
        Retired *grown = static_cast<Retired *>(MemoryContextAlloc(context(), sizeof(Retired) * cap));
        if (nretired > 0) memcpy(grown, retired, sizeof(Retired) * nretired);
        if (retired != nullptr) pfree(retired);
        retired = grown;
        retired_cap = cap;
    }
    retired[nretired++] = r;
    detail::retired_pending = true;
}

// CacheAllocator's hooks: palloc in the cache context, never ereport.
void *hook_allocate(std::size_t bytes) {
    if (bytes > MaxAllocHugeSize) return nullptr;
    if (cache_cxt == nullptr) {
        // First use from C++: create the context without letting an ERROR
        // escape into C++ frames.
        volatile bool ok = true;
        PG_TRY();
        { (void)context(); }
        PG_CATCH();
        {
            FlushErrorState();
            ok = false;
        }
        PG_END_TRY();
        if (!ok) return nullptr;
    }
    return MemoryContextAllocExtended(cache_cxt, bytes == 0 ? 1 : bytes, MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
}
void hook_deallocate(void *p) { pfree(p); }

// Installed when the library is loaded, before any cached container exists.
const bool hooks_installed = [] {
    cache_alloc_hooks.allocate = hook_allocate;
    cache_alloc_hooks.deallocate = hook_deallocate;
    return true;
}();

}  // namespace

void register_kind(const Kind *kind) {
    (void)hooks_installed;
    for (int i = 0; i < nkinds; i++)
        if (kinds[i] == kind) return;
    if (nkinds == max_kinds) elog(ERROR, "too many sharding cache kinds (at most %d)", max_kinds);
    if (kind->nsyscaches < 0 || kind->nsyscaches > 4)
        elog(ERROR, "sharding cache kind \"%s\" lists %d syscaches (at most 4)", kind->name, kind->nsyscaches);
    if (!relcache_registered) {
        CacheRegisterRelcacheCallback(relcache_dispatch, (Datum)0);
        relcache_registered = true;
    }
    if (!xact_registered) {
        RegisterXactCallback(xact_callback, nullptr);
        RegisterSubXactCallback(subxact_callback, nullptr);
        xact_registered = true;
    }
    for (int s = 0; s < kind->nsyscaches; s++) {
        bool seen = false;
        for (int w = 0; w < nwatched; w++) seen = seen || watched[w] == kind->syscaches[s];
        if (seen) continue;
        CacheRegisterSyscacheCallback(kind->syscaches[s], syscache_dispatch, (Datum)0);
        watched[nwatched++] = kind->syscaches[s];
    }
    kinds[nkinds++] = kind;
}

MemoryContext context() {
    if (cache_cxt == nullptr) {
        if (CacheMemoryContext == nullptr) CreateCacheMemoryContext();
        cache_cxt = AllocSetContextCreate(CacheMemoryContext, "sharding cache", ALLOCSET_DEFAULT_SIZES);
    }
    return cache_cxt;
}

MemoryContext entry_context(const char *name) {
    return AllocSetContextCreateInternal(context(), name, ALLOCSET_SMALL_SIZES);  // name: a literal
}

void retire_context(MemoryContext cxt) {
    if (cxt != nullptr) add_retired(Retired{Retired::Context, cxt, nullptr});
}
void retire_plan(SPIPlanPtr plan) {
    if (plan != nullptr) add_retired(Retired{Retired::Plan, plan, nullptr});
}
void retire(void (*free)(void *arg), void *arg) { add_retired(Retired{Retired::Other, arg, free}); }

Stats stats() { return counters; }

bool shared_changes() { return shared != nullptr; }

uint64 changes(int topic) {
    if (shared != nullptr) {
        uint64 v = pg_atomic_read_u64(&shared->topic[topic]);
        pg_read_barrier();  // the slots and the snapshot are read after it
        return v;
    }
    AcceptInvalidationMessages();
    return 0;
}

uint64 map_changes(int topic, uint32 slot) {
    if (shared == nullptr) return 0;
    return pg_atomic_read_u64(&shared->all[topic]) + pg_atomic_read_u64(&shared->slot[topic][slot % map_slots]);
}

uint32 map_slot(const char *name, size_t len) {
    return static_cast<uint32>(hash_bytes(name, len) % map_slots);
}

void note_change(int topic, const char *name, size_t len) {
    if (!xact_registered) {
        RegisterXactCallback(xact_callback, nullptr);
        RegisterSubXactCallback(subxact_callback, nullptr);
        xact_registered = true;
    }
    Pending &p = pending[topic];
    p.any = true;
    pending_any = true;
    if (p.all) return;
    if (name == nullptr) {
        p.all = true;
        return;
    }
    uint32 s = map_slot(name, len);
    for (int i = 0; i < p.n; i++)
        if (p.slots[i] == s) return;
    if (p.n == max_pending)
        p.all = true;
    else
        p.slots[p.n++] = s;
}

void shmem_init() {
    if (!process_shared_preload_libraries_in_progress) return;
    prev_shmem_request = shmem_request_hook;
    shmem_request_hook = shmem_request;
    prev_shmem_startup = shmem_startup_hook;
    shmem_startup_hook = shmem_startup;
}

}  // namespace cache

namespace detail {
void free_retired() noexcept {
    // Taken off the list first: a free function that errors must not see
    // (or free) the same object twice.
    while (cache::nretired > 0) {
        cache::Retired r = cache::retired[--cache::nretired];
        cache::free_one(r);
    }
    retired_pending = false;
}
}  // namespace detail

}  // namespace sharding
