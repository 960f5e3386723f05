// The per-backend cache module (see cache.hpp).
#include "pg/cache.hpp"

#include "pg/boundary.hpp"
#include "core/cache_alloc.hpp"

extern "C" {
#include "access/xact.h"
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
