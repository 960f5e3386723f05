// The per-backend cache module (see cache.hpp).
#include "pg/cache.hpp"

#include "pg/boundary.hpp"
#include "pg/shmem.hpp"
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
constexpr uint16 every_pin = 0xFFFF;  // a log entry meaning "every pin of the slot"
struct LoggedPin {
    uint32 slot;
    uint16 len;  // every_pin: all pins of the slot
    char key[logged_key_bytes];
};
constexpr uint64 ring_size = 16384;  // shared ring of committed pin changes
constexpr uint64 own_size = 1024;    // this backend's log of its own pin changes

struct SharedChanges {
    pg_atomic_uint64 topic[ntopics];
    pg_atomic_uint64 all[ntopics];
    pg_atomic_uint64 slot[nchanges][map_slots];  // routing topic
    pg_atomic_uint64 ring_head;                  // written under the lock
    LoggedPin ring[ring_size];
};
SharedChanges *shared = nullptr;
LWLock *ring_lock = nullptr;

// What this transaction noted, published at commit: per topic whether
// anything (and everything) changed; for routing, per slot the kinds and
// whether every pin changed (or too many keys to log).
constexpr int max_noted_slots = 64;
constexpr uint32 max_logged_keys = 256;  // per slot and transaction
struct SlotNote {
    uint32 slot;
    uint8 kinds;  // bit per Change
    bool every_pin;
    uint32 nkeys;
};
struct Notes {
    bool any[ntopics];
    bool all[ntopics];
    int n;
    SlotNote slots[max_noted_slots];
    uint64 own_start;  // own log position of the transaction's first pin key
};
Notes notes = {};
bool notes_any = false;

// This backend's own changes: counters bumped when they become visible to
// its own snapshots (own_changes_visible) or when they are rolled back,
// and the log of its pin keys.
uint64 own_total[ntopics];
uint64 own_all = 0;
uint64 own_slot[nchanges][map_slots];
LoggedPin own_log[own_size];
uint64 own_head = 0;     // next position to write
uint64 own_visible = 0;  // entries before it are visible to own snapshots

void shmem_attach(void *mem, bool found) {
    SharedChanges *s = static_cast<SharedChanges *>(mem);
    if (!found) {
        for (int t = 0; t < ntopics; t++) {
            // Not 0: a backend's first look must differ from "never looked".
            pg_atomic_init_u64(&s->topic[t], 1);
            pg_atomic_init_u64(&s->all[t], 1);
        }
        for (int k = 0; k < nchanges; k++)
            for (uint32 i = 0; i < map_slots; i++) pg_atomic_init_u64(&s->slot[k][i], 0);
        pg_atomic_init_u64(&s->ring_head, 0);
    }
    ring_lock = &(GetNamedLWLockTranche("sharding config changes"))->lock;
    shared = s;
}

void clear_notes() {
    notes = Notes{};
    notes_any = false;
}

SlotNote *note_slot(uint32 slot) {
    for (int i = 0; i < notes.n; i++)
        if (notes.slots[i].slot == slot) return &notes.slots[i];
    if (notes.n == max_noted_slots) return nullptr;
    SlotNote *n = &notes.slots[notes.n++];
    *n = SlotNote{slot, 0, false, 0};
    return n;
}

void ring_append(uint32 slot, uint16 len, const char *key) {
    uint64 head = pg_atomic_read_u64(&shared->ring_head);
    LoggedPin &e = shared->ring[head % ring_size];
    e.slot = slot;
    e.len = len;
    if (len != every_pin) memcpy(e.key, key, len);
    pg_atomic_write_u64(&shared->ring_head, head + 1);
}

// At commit, after the change became visible and before it is acknowledged
// or its locks are released: the ring and the slot counters under the lock,
// then the whole-topic counters, then the topic counter a reader looks at
// first (each add is a full barrier).
void publish_notes() {
    if (shared != nullptr) {
        if (notes.any[routing_topic] && !notes.all[routing_topic]) {
            const bool own_lost = own_head - notes.own_start > own_size;
            LWLockAcquire(ring_lock, LW_EXCLUSIVE);
            for (int i = 0; i < notes.n; i++) {
                SlotNote &n = notes.slots[i];
                if ((n.kinds & (1 << change_pins)) && (n.every_pin || own_lost)) {
                    n.every_pin = true;
                    ring_append(n.slot, every_pin, nullptr);
                }
            }
            if (!own_lost)
                for (uint64 p = notes.own_start; p < own_head; p++) {
                    const LoggedPin &e = own_log[p % own_size];
                    bool skip = false;
                    for (int i = 0; i < notes.n; i++)
                        if (notes.slots[i].slot == e.slot) skip = notes.slots[i].every_pin;
                    if (!skip) ring_append(e.slot, e.len, e.key);
                }
            for (int i = 0; i < notes.n; i++)
                for (int k = 0; k < nchanges; k++)
                    if (notes.slots[i].kinds & (1 << k)) pg_atomic_fetch_add_u64(&shared->slot[k][notes.slots[i].slot], 1);
            LWLockRelease(ring_lock);
        }
        for (int t = 0; t < ntopics; t++) {
            if (!notes.any[t]) continue;
            if (notes.all[t]) pg_atomic_fetch_add_u64(&shared->all[t], 1);
            pg_atomic_fetch_add_u64(&shared->topic[t], 1);
        }
    }
    clear_notes();
}

// A (sub)transaction that noted changes aborted: rebuild what it touched
// (its own cached entries may hold rows that are gone now).
void own_rolled_back() {
    for (int t = 0; t < ntopics; t++)
        if (notes.any[t]) own_total[t]++;
    if (notes.all[routing_topic]) own_all++;
    for (int i = 0; i < notes.n; i++) own_slot[change_map][notes.slots[i].slot]++;
    own_visible = own_head;
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
    if (notes_any) {
        if (event == XACT_EVENT_PRE_PREPARE)
            ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                            errmsg("cannot prepare a transaction that changed the sharding configuration"),
                            errdetail("Other backends' routing caches learn of a configuration change when the "
                                      "backend that made it commits; COMMIT PREPARED runs elsewhere."),
                            errhint("Change maps, shards, pins and frozen shards in ordinary transactions.")));
        if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) {
            publish_notes();
        } else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) {
            own_rolled_back();
            clear_notes();
        } else if (event == XACT_EVENT_PREPARE) {
            clear_notes();
        }
    }
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT && event != XACT_EVENT_PREPARE &&
        event != XACT_EVENT_PARALLEL_COMMIT && event != XACT_EVENT_PARALLEL_ABORT)
        return;
    detail::call_depth = 0;
    if (detail::retired_pending) detail::free_retired();
}

void subxact_callback(SubXactEvent event, SubTransactionId, SubTransactionId, void *) {
    if (event == SUBXACT_EVENT_ABORT_SUB && notes_any) own_rolled_back();
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

HTAB *blob_hash(MemoryContext cxt, const char *name, long nelem, Size keysize, Size entrysize) {
    HASHCTL ctl;
    memset(&ctl, 0, sizeof ctl);
    ctl.keysize = keysize;
    ctl.entrysize = entrysize;
    ctl.hcxt = cxt;
    return hash_create(name, nelem, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
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
        pg_read_barrier();  // the slots, the ring and the snapshot are read after it
        return v + own_total[topic];
    }
    AcceptInvalidationMessages();
    return own_total[topic];
}

MapStamp map_stamp(uint32 slot) {
    slot %= map_slots;
    MapStamp st;
    st.kind[change_map] = own_all + own_slot[change_map][slot];
    st.kind[change_shards] = own_slot[change_shards][slot];
    st.kind[change_pins] = own_slot[change_pins][slot];
    if (shared != nullptr) {
        st.kind[change_map] += pg_atomic_read_u64(&shared->all[routing_topic]) +
                               pg_atomic_read_u64(&shared->slot[change_map][slot]);
        st.kind[change_shards] += pg_atomic_read_u64(&shared->slot[change_shards][slot]);
        st.kind[change_pins] += pg_atomic_read_u64(&shared->slot[change_pins][slot]);
        pg_read_barrier();
    }
    return st;
}

PinCursor pin_cursor() {
    PinCursor c;
    c.shared_pos = shared != nullptr ? pg_atomic_read_u64(&shared->ring_head) : 0;
    c.own_pos = own_visible;
    pg_read_barrier();
    return c;
}

bool pin_changes(uint32 slot, const PinCursor &from, const PinCursor &to,
                 void (*fn)(void *arg, const char *key, size_t len), void *arg) {
    slot %= map_slots;
    if (from.own_pos + own_size < own_head || from.own_pos > to.own_pos) return false;
    for (uint64 p = from.own_pos; p < to.own_pos; p++) {
        const LoggedPin &e = own_log[p % own_size];
        if (e.slot != slot) continue;
        if (e.len == every_pin) return false;
        fn(arg, e.key, e.len);
    }
    if (shared == nullptr || from.shared_pos == to.shared_pos) return true;
    bool complete = true;
    LWLockAcquire(ring_lock, LW_SHARED);
    const uint64 head = pg_atomic_read_u64(&shared->ring_head);
    if (from.shared_pos > to.shared_pos || from.shared_pos + ring_size < head) {
        complete = false;
    } else {
        for (uint64 p = from.shared_pos; p < to.shared_pos && complete; p++) {
            const LoggedPin &e = shared->ring[p % ring_size];
            if (e.slot != slot) continue;
            if (e.len == every_pin)
                complete = false;
            else
                fn(arg, e.key, e.len);
        }
    }
    LWLockRelease(ring_lock);
    return complete;
}

uint32 map_slot(const char *name, size_t len) {
    return static_cast<uint32>(hash_bytes(name, len) % map_slots);
}

namespace {
void ensure_xact_callbacks() {
    if (!xact_registered) {
        RegisterXactCallback(xact_callback, nullptr);
        RegisterSubXactCallback(subxact_callback, nullptr);
        xact_registered = true;
    }
}
}  // namespace

void note_change(int topic, const char *name, size_t len) {
    ensure_xact_callbacks();
    if (topic == routing_topic && name != nullptr) {
        // note_routing marks the topic itself: marking it here first would
        // keep own_start at 0, so that publish_notes saw every pin logged
        // since the backend started as this transaction's (and, past
        // own_size of them, "lost": every pin of the map changed).
        note_routing(change_map, name, len, nullptr, 0);
        return;
    }
    if (topic == routing_topic && !notes.any[routing_topic]) notes.own_start = own_head;
    notes.any[topic] = true;
    notes_any = true;
    notes.all[topic] = true;
}

void note_routing(Change kind, const char *name, size_t len, const char *key, size_t keylen) {
    ensure_xact_callbacks();
    if (!notes.any[routing_topic]) notes.own_start = own_head;
    notes.any[routing_topic] = true;
    notes_any = true;
    if (notes.all[routing_topic]) return;
    const uint32 slot = map_slot(name, len);
    SlotNote *n = note_slot(slot);
    if (n == nullptr) {  // too many maps in one transaction: every map
        notes.all[routing_topic] = true;
        return;
    }
    n->kinds |= static_cast<uint8>(1 << kind);
    if (kind != change_pins || n->every_pin) return;
    if (key == nullptr || keylen > logged_key_bytes || n->nkeys >= max_logged_keys) {
        n->every_pin = true;
        LoggedPin &e = own_log[own_head++ % own_size];
        e.slot = slot;
        e.len = every_pin;
        return;
    }
    n->nkeys++;
    LoggedPin &e = own_log[own_head++ % own_size];
    e.slot = slot;
    e.len = static_cast<uint16>(keylen);
    memcpy(e.key, key, keylen);
}

void own_changes_visible(int topic) {
    own_total[topic]++;
    if (topic != routing_topic) return;
    if (notes.all[routing_topic]) own_all++;
    for (int i = 0; i < notes.n; i++)
        for (int k = 0; k < nchanges; k++)
            if (notes.slots[i].kinds & (1 << k)) own_slot[k][notes.slots[i].slot]++;
    own_visible = own_head;
}

void shmem_init() {
    shmem::add({"sharding config changes", sizeof(SharedChanges), nullptr, "sharding config changes", shmem_attach});
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
