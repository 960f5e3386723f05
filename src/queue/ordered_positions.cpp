// Where an ordered claim resumes (docs/ordered.md): this backend's
// positions and, with the library preloaded, one position per queue in
// shared memory that the claims take in turns; the key sets the claims
// list. The claim itself is queue_ordered.cpp's.
#include "pg/boundary.hpp"
#include "core/claim_sql.hpp"
#include "core/hash_core.hpp"
#include "pg/cache.hpp"
#include "pg/shmem.hpp"
#include "queue/ordered.hpp"
#include "queue/queue.hpp"

extern "C" {
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator_d.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/tstoreReceiver.h"
#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "storage/bufmgr.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/itemptr.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/typcache.h"
#include "utils/wait_event.h"
}

namespace sharding {
namespace queue {
namespace ordered {

using namespace sharding::claim_sql;  // ByShard, ByNode

MemoryContext ordered_cxt = nullptr;

namespace {
void ensure_context() {
    if (ordered_cxt == nullptr) ordered_cxt = sharding::cache::entry_context("sharding ordered claim positions");
}
}  // namespace

HTAB *state_cache = nullptr;

OrderedState *state_for(Oid relid, uint32 variant, const char *key_column) {
    ensure_context();
    if (state_cache == nullptr)
        state_cache = sharding::cache::blob_hash(ordered_cxt, "sharding ordered claim positions", 16, sizeof(StateKey),
                                                 sizeof(OrderedState));
    StateKey k;
    memset(&k, 0, sizeof k);
    k.relid = relid;
    k.variant = variant & (ByShard | ByNode);
    namestrcpy(&k.key_column, key_column);
    bool found;
    OrderedState *st = static_cast<OrderedState *>(hash_search(state_cache, &k, HASH_ENTER, &found));
    if (!found) {
        memset(reinterpret_cast<char *>(st) + sizeof(StateKey), 0, sizeof(OrderedState) - sizeof(StateKey));
    }
    return st;
}


// backlog: the keys seen with a backlog (see OrderedState::backlog).
void set_keys(OrderedState *st, char **keys, int n, const KeySet *backlog) {
    for (int i = 0; i < st->nkeys; i++) pfree(st->keys[i]);
    st->nkeys = 0;
    for (int i = 0; i < n && i < kMaxProbed; i++) {
        st->backlog[st->nkeys] = keyset_has(backlog, keys[i]);
        st->keys[st->nkeys++] = MemoryContextStrdup(ordered_cxt, keys[i]);
    }
}

void forget_positions(Oid relid) {
    if (state_cache == nullptr) return;
    HASH_SEQ_STATUS seq;
    hash_seq_init(&seq, state_cache);
    while (OrderedState *st = static_cast<OrderedState *>(hash_seq_search(&seq)))
        if (relid == InvalidOid || st->key.relid == relid) st->valid = false;
}

// --- one position per queue, shared by the backends (preload only) ---
//
// With shared_preload_libraries = 'sharding', the position and its keys
// live in shared memory, one per queue, filter and key column, and the
// ordered claims on it take turns: a claim holds the position's turn from
// reading the position to publishing the next one, that is for its pick
// rounds, and gives it up before its UPDATE. So a claim starts where the
// previous claim of any backend ended: it does not walk over, test or try
// to lock the heads other claims took a moment ago, and it starts with the
// keys the previous claim left listed. With a position per backend, each
// worker resumed from where its own last claim ended and re-walked what
// the others had taken since (8 workers: 3-5 ms of CPU per claim against
// 1.2 ms with one).
//
// The turn is not a lock manager lock: those are granted in line, to a
// waiter that may not be running yet, and with 8 workers on 2 cores the
// turn then sat idle while the next waiter was being scheduled. A claim
// that finds the turn free takes it; a waiter sleeps on the slot's
// condition variable, woken one at a time. It waits at most kTurnWaitMs
// (and not at all for its own backend's turn: a trigger's claim): then it
// claims from a copy of the position without publishing, as if alone.
// So no wait on a turn can deadlock.
//
// The order stays a single claimer's: every pending job before the
// position belongs to a listed key or was taken by a claim (held by its
// transaction or committed). What breaks that is handled here rather than
// left to the next sweep:
// - a claim that published and then rolls back (its jobs are pending
//   again, behind the position): the (sub)transaction's abort, or its
//   PREPARE, invalidates what it published (xact callbacks below);
// - fail(retry => true) sends a job back behind the position: its commit
//   invalidates the queue's positions;
// - the table was rewritten (TRUNCATE, VACUUM FULL: a new relfilenode), or
//   this backend's queue entry was rebuilt since it last used the
//   position (ALTER TABLE).
// Anything else (a job inserted with an older claim-order key, one that
// became due with a higher priority) waits for a sweep, on the budget of
// the position (SweepClock, one per position now).
//
// Without preload, or when all slots are busy, each backend keeps its own
// position, as before.
constexpr int kSharedSlots = 256;
constexpr long kTurnWaitMs = 1000;

struct SharedSlot {
    // What it is the position of (all zero: free).
    Oid dbid, relid;
    uint32 variant;  // ByShard | ByNode
    uint32 filter_hash;
    NameData key_column;
    uint64 generation;  // bumped by every publication and invalidation
    uint64 last_used;   // SharedOrdered::tick when last taken
    int holder;         // pid of the backend whose turn it is, 0: none
    int waiters;        // backends waiting for the turn
    ConditionVariable turn;
    Oid relfilenode;  // of the table when the position was published
    bool valid;
    OrderPos pos;
    int nkeys;
    bool backlog[kMaxProbed];
    char keys[kMaxProbed][kSharedKeyBytes];
    sharding::queue::SweepClock clock;
    uint32 walk_per_head;  // OrderedState::walk_per_head
};

struct SharedOrdered {
    LWLock *lock;  // every field of every slot (not the condition variables)
    uint64 tick;
    SharedSlot slots[kSharedSlots];
};

SharedOrdered *shared_ordered = nullptr;

void ordered_shmem_attach(void *mem, bool found) {
    SharedOrdered *s = static_cast<SharedOrdered *>(mem);
    if (!found) {
        memset(s, 0, sizeof(SharedOrdered));
        s->lock = &(GetNamedLWLockTranche("sharding ordered claims"))->lock;
        for (SharedSlot &slot : s->slots) ConditionVariableInit(&slot.turn);
    }
    shared_ordered = s;
}

// The turn this backend holds (slot index, -1: none) and the
// subtransaction that took it.
int turn_slot = -1;
SubTransactionId turn_subxact = InvalidSubTransactionId;
// The slot this backend is counted as waiting on (-1: none), so that an
// error while it sleeps (a cancel) uncounts it.
int wait_slot = -1;

void stop_waiting() {
    if (wait_slot < 0) return;
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    shared_ordered->slots[wait_slot].waiters--;
    LWLockRelease(shared_ordered->lock);
    wait_slot = -1;
}

// Gives the turn up and wakes one waiter. Never raises.
void give_turn() {
    if (turn_slot < 0) return;
    SharedSlot &s = shared_ordered->slots[turn_slot];
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    bool wake = false;
    if (s.holder == MyProcPid) {
        s.holder = 0;
        wake = s.waiters > 0;
    }
    LWLockRelease(shared_ordered->lock);
    turn_slot = -1;
    turn_subxact = InvalidSubTransactionId;
    if (wake) ConditionVariableSignal(&s.turn);
}

// What this transaction published, invalidated if it (or the
// subtransaction that published) aborts; the queues whose jobs it sent
// back to pending, invalidated when it commits.
constexpr int kMaxNoted = 16;
struct Published {
    int slot;
    SubTransactionId subxact;
};
struct XactNotes {
    int npublished;
    Published published[kMaxNoted];
    bool overflow;  // more than kMaxNoted: every slot of this database
    int nfailed;
    Oid failed[kMaxNoted];
    bool failed_overflow;
};
XactNotes xact_notes = {};

// Invalidates a slot (under the lock): its next claim sweeps, and a claim
// in flight on it publishes no position.
void invalidate_slot(SharedSlot &s) {
    s.valid = false;
    s.generation++;
}

// Invalidates every slot of this database's table relid (InvalidOid: of
// every table).
void invalidate_relation(Oid relid) {
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    for (SharedSlot &s : shared_ordered->slots)
        if (s.dbid == MyDatabaseId && (relid == InvalidOid || s.relid == relid)) invalidate_slot(s);
    LWLockRelease(shared_ordered->lock);
}

// Invalidates the slots this transaction published to (subxact: only those
// published in that subtransaction or its children, which it aborts).
// Whatever was published there since builds on its position: invalidated
// too.
void invalidate_published(SubTransactionId subxact) {
    XactNotes &n = xact_notes;
    if (n.overflow) {
        invalidate_relation(InvalidOid);
        return;
    }
    if (n.npublished == 0) return;
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    int kept = 0;
    for (int i = 0; i < n.npublished; i++) {
        if (subxact == InvalidSubTransactionId || n.published[i].subxact == subxact)
            invalidate_slot(shared_ordered->slots[n.published[i].slot]);
        else
            n.published[kept++] = n.published[i];
    }
    n.npublished = kept;
    LWLockRelease(shared_ordered->lock);
}

void ordered_xact_callback(XactEvent event, void *) {
    if (shared_ordered == nullptr) return;
    // A prepared transaction is committed or rolled back later, elsewhere:
    // what it published and its fail(retry) are invalidated now (a sweep
    // too many at worst).
    bool prepare = event == XACT_EVENT_PREPARE;
    bool commit = event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT || prepare;
    bool abort = event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT;
    if (!commit && !abort) return;
    stop_waiting();
    give_turn();
    XactNotes &n = xact_notes;
    if (abort || prepare) invalidate_published(InvalidSubTransactionId);
    if (commit && (n.nfailed > 0 || n.failed_overflow)) {
        if (n.failed_overflow) invalidate_relation(InvalidOid);
        for (int i = 0; i < n.nfailed && !n.failed_overflow; i++) invalidate_relation(n.failed[i]);
    }
    xact_notes = XactNotes{};
}

// A subtransaction that published may roll back its claim while the
// transaction goes on; one that commits hands its publications to its
// parent.
void ordered_subxact_callback(SubXactEvent event, SubTransactionId subxact, SubTransactionId parent, void *) {
    if (shared_ordered == nullptr) return;
    if (event == SUBXACT_EVENT_ABORT_SUB) {
        stop_waiting();
        if (turn_slot >= 0 && turn_subxact == subxact) give_turn();
        invalidate_published(subxact);
    } else if (event == SUBXACT_EVENT_COMMIT_SUB) {
        if (turn_slot >= 0 && turn_subxact == subxact) turn_subxact = parent;
        for (int i = 0; i < xact_notes.npublished; i++)
            if (xact_notes.published[i].subxact == subxact) xact_notes.published[i].subxact = parent;
    }
}

// The table's relfilenode: a rewrite (TRUNCATE, VACUUM FULL, a rewriting
// ALTER) changes it. 0 for a partitioned table.
Oid table_filenode(Oid relid) {
    Relation rel = RelationIdGetRelation(relid);
    if (rel == nullptr) return InvalidOid;
    Oid f = rel->rd_rel->relfilenode;
    RelationClose(rel);
    return f;
}

bool shared_positions() { return shared_ordered != nullptr; }


// Takes the turn of a position and copies it into st (its keys palloc'd in
// ordered_cxt). The slot, when it has none: the least recently used one
// that nobody holds or waits for.
Turn take_turn(Oid relid, uint32 variant, const char *key_column, uint32 fh, OrderedState *st) {
    Turn t = {-1, false, 0, InvalidOid};
    SharedOrdered &so = *shared_ordered;
    const int64 deadline = sharding::queue::monotonic_us() + kTurnWaitMs * 1000;
    bool waiting = false;
    OrderedState copy;
    char keys[kMaxProbed][kSharedKeyBytes];
    for (;;) {
        LWLockAcquire(so.lock, LW_EXCLUSIVE);
        int found = -1, victim = -1;
        for (int i = 0; i < kSharedSlots; i++) {
            SharedSlot &s = so.slots[i];
            if (s.dbid == MyDatabaseId && s.relid == relid && s.variant == (variant & (ByShard | ByNode)) &&
                s.filter_hash == fh && strcmp(NameStr(s.key_column), key_column) == 0) {
                found = i;
                break;
            }
            if (s.holder == 0 && s.waiters == 0 && (victim < 0 || s.last_used < so.slots[victim].last_used))
                victim = i;
        }
        if (found < 0 && victim >= 0) {
            // Reused: whoever held its old position finds a new generation
            // and publishes nothing there.
            found = victim;
            SharedSlot &s = so.slots[found];
            s.generation++;
            s.dbid = MyDatabaseId;
            s.relid = relid;
            s.variant = variant & (ByShard | ByNode);
            s.filter_hash = fh;
            namestrcpy(&s.key_column, key_column);
            s.relfilenode = InvalidOid;
            s.valid = false;
            s.nkeys = 0;
            s.clock = sharding::queue::SweepClock{0, 0, 0};
            s.walk_per_head = 0;
        }
        if (found < 0) {  // every slot busy: this backend's own position
            LWLockRelease(so.lock);
            if (waiting) ConditionVariableCancelSleep();
            return t;
        }
        SharedSlot &s = so.slots[found];
        if (waiting) {
            s.waiters--;
            wait_slot = -1;
        }
        bool free = s.holder == 0;
        if (free || s.holder == MyProcPid || sharding::queue::monotonic_us() >= deadline) {
            if (free) s.holder = MyProcPid;
            s.last_used = ++so.tick;
            t = Turn{found, free, s.generation, s.relfilenode};
            copy.valid = s.valid;
            copy.pos = s.pos;
            copy.nkeys = s.nkeys;
            copy.clock = s.clock;
            copy.walk_per_head = s.walk_per_head;
            memcpy(copy.backlog, s.backlog, sizeof copy.backlog);
            memcpy(keys, s.keys, sizeof keys);
            LWLockRelease(so.lock);
            break;
        }
        s.waiters++;
        wait_slot = found;
        if (!waiting) ConditionVariablePrepareToSleep(&s.turn);  // before the lock goes: no lost wake-up
        waiting = true;
        LWLockRelease(so.lock);
        long left = static_cast<long>((deadline - sharding::queue::monotonic_us()) / 1000) + 1;
        (void)ConditionVariableTimedSleep(&s.turn, left, PG_WAIT_EXTENSION);
    }
    if (waiting) ConditionVariableCancelSleep();
    if (t.held) {
        turn_slot = t.slot;
        turn_subxact = GetCurrentSubTransactionId();
    }
    // Into the backend's copy (palloc may raise: not under the lock).
    for (int i = 0; i < st->nkeys; i++) pfree(st->keys[i]);
    st->nkeys = 0;
    st->valid = copy.valid;
    st->pos = copy.pos;
    st->clock = copy.clock;
    st->walk_per_head = copy.walk_per_head;
    for (int i = 0; i < copy.nkeys; i++) {
        st->backlog[i] = copy.backlog[i];
        st->keys[st->nkeys++] = MemoryContextStrdup(ordered_cxt, keys[i]);
    }
    st->xid = InvalidTransactionId;
    st->filter_hash = fh;
    return t;
}

// Publishes st as the position of the turn's slot, unless the slot changed
// since it was read (an invalidation): then it stays no position. Gives
// the turn up. Noted for the transaction's abort.
void publish_and_give_turn(const Turn &t, const OrderedState *st, Oid relfilenode) {
    SharedSlot &s = shared_ordered->slots[t.slot];
    LWLockAcquire(shared_ordered->lock, LW_EXCLUSIVE);
    bool published = false;
    if (s.generation == t.generation) {
        s.valid = st->valid;
        s.pos = st->pos;
        s.relfilenode = relfilenode;
        s.nkeys = 0;
        for (int k = 0; k < st->nkeys; k++) {
            size_t len = strlen(st->keys[k]);
            if (len >= kSharedKeyBytes) {  // (the claim cut its position before such a key)
                s.valid = false;
                break;
            }
            memcpy(s.keys[s.nkeys], st->keys[k], len + 1);
            s.backlog[s.nkeys++] = st->backlog[k];
        }
        s.clock = st->clock;
        s.walk_per_head = st->walk_per_head;
        s.generation++;
        published = true;
    }
    LWLockRelease(shared_ordered->lock);
    give_turn();
    if (!published) return;
    XactNotes &n = xact_notes;
    SubTransactionId sub = GetCurrentSubTransactionId();
    for (int k = 0; k < n.npublished; k++)
        if (n.published[k].slot == t.slot && n.published[k].subxact == sub) return;
    if (n.npublished == kMaxNoted)
        n.overflow = true;
    else
        n.published[n.npublished++] = Published{t.slot, sub};
}

// Claim order of two positions: negative if a comes first.
int compare_pos(bool has_priority, bool has_run_at, const OrderPos &a, const OrderPos &b) {
    if (has_priority && a.priority != b.priority) return a.priority > b.priority ? -1 : 1;
    if (has_run_at && a.run_at != b.run_at) return a.run_at < b.run_at ? -1 : 1;
    if (a.created != b.created) return a.created < b.created ? -1 : 1;
    if (a.id != b.id) return a.id < b.id ? -1 : 1;
    return 0;
}


void keyset_init(KeySet *k) {
    k->n = 0;
    k->cap = 16;
    k->list = static_cast<char **>(palloc(sizeof(char *) * k->cap));
    k->mask = 31;
    k->slots = static_cast<int *>(palloc0(sizeof(int) * (k->mask + 1)));
}

uint32 key_hash(const char *key) {
    return hash_bytes(reinterpret_cast<const unsigned char *>(key), static_cast<int>(strlen(key)));
}

bool keyset_has(const KeySet *k, const char *key) {
    for (uint32 i = key_hash(key) & k->mask;; i = (i + 1) & k->mask) {
        if (k->slots[i] == 0) return false;
        if (strcmp(k->list[k->slots[i] - 1], key) == 0) return true;
    }
}

// Adds key unless it is there.
void keyset_add(KeySet *k, const char *key) {
    if (keyset_has(k, key)) return;
    if (k->n == k->cap) {
        k->cap *= 2;
        k->list = static_cast<char **>(repalloc(k->list, sizeof(char *) * k->cap));
    }
    k->list[k->n++] = pstrdup(key);
    if (static_cast<uint32>(k->n) * 2 > k->mask) {
        k->mask = k->mask * 2 + 1;
        pfree(k->slots);
        k->slots = static_cast<int *>(palloc0(sizeof(int) * (k->mask + 1)));
        for (int j = 0; j < k->n; j++) {
            uint32 i = key_hash(k->list[j]) & k->mask;
            while (k->slots[i] != 0) i = (i + 1) & k->mask;
            k->slots[i] = j + 1;
        }
        return;
    }
    uint32 i = key_hash(key) & k->mask;
    while (k->slots[i] != 0) i = (i + 1) & k->mask;
    k->slots[i] = k->n;
}

ArrayType *text_array(char **keys, int n) {
    Datum *d = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
    for (int i = 0; i < n; i++) d[i] = CStringGetTextDatum(keys[i]);
    return construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT);
}

}  // namespace ordered

using namespace ordered;

void forget_ordered_positions(Oid relid) {
    forget_positions(relid);
    // The shared positions too: now, for this transaction's next claims,
    // and at commit, once the job is pending for everyone (a claim that
    // read the position meanwhile publishes none).
    if (shared_ordered == nullptr) return;
    invalidate_relation(relid);
    XactNotes &n = xact_notes;
    for (int i = 0; i < n.nfailed; i++)
        if (n.failed[i] == relid) return;
    if (n.nfailed == kMaxNoted)
        n.failed_overflow = true;
    else
        n.failed[n.nfailed++] = relid;
}

void ordered_init() {
    // Callbacks once per backend; they do nothing without shared memory.
    RegisterXactCallback(ordered_xact_callback, nullptr);
    RegisterSubXactCallback(ordered_subxact_callback, nullptr);
    shmem::add({"sharding ordered claims", sizeof(SharedOrdered), nullptr, "sharding ordered claims",
                ordered_shmem_attach});
}

}  // namespace queue
}  // namespace sharding

