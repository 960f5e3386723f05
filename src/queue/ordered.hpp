// The ordered claims' moving parts, shared by the files of the ordered
// claim (docs/ordered.md): queue_ordered.cpp runs a claim (its rounds, its
// UPDATE) and claim_node's first steps; ordered_positions.cpp keeps where a
// claim resumes (per backend, and with the library preloaded one position
// per queue in shared memory, taken in turns); ordered_fast.cpp tests and
// locks a round's candidates in C ("the fast pick").
//
// Glue, under boundary.hpp's rule 2: no owning C++ object; everything
// here is palloc'd or plain data.
#pragma once

#include "queue/queue.hpp"

extern "C" {
#include "access/genam.h"
#include "access/skey.h"
#include "executor/tuptable.h"
#include "utils/palloc.h"
#include "utils/rel.h"
#include "utils/snapshot.h"
#include "utils/timestamp.h"
}

namespace sharding {
namespace queue {
namespace ordered {


// --- where an ordered claim resumes ---
//
// A sweep walks the line from its start: exact. Each backend also
// remembers, per queue, filter and key column, where its last claim's walk
// ended (the position P, a claim-order key) and the keys that still held
// pending jobs before P when it ran (at most kMaxProbed; they were blocked,
// or had their head taken, or another worker held it). Every pending job
// before P then belonged to one of those keys or was taken. The next claim
// walks only past P and probes those keys' heads: with a whale's backlog at
// the front, one probe instead of a walk over the backlog. A key leaves the
// list once none of its pending jobs lies before P (its oldest lies past P,
// and listed_job finds no other before it).
//
// What can appear before P afterwards, of a key not in the list: a job
// inserted with an older claim-order key, a job that became due with a
// higher priority than P's, a job sent back to pending by another backend's
// fail (this backend's fail forgets the positions of the queue), a claim
// rolled back (noticed by its xid). As for claim (queue.cpp), a sweep finds
// them: a claim sweeps when its backend has no position, when the last
// sweep was cheap (then every claim is exact), and otherwise by the budget
// of queue.hpp (SweepClock). A shared position is dropped at once for the
// last two (below).
constexpr int kMaxProbed = 32;
// A longer key is not listed in a shared position: the position stops
// before it (ordered_positions.cpp).
constexpr int kSharedKeyBytes = 128;

struct OrderPos {
    bool valid;
    int64 priority;
    TimestampTz run_at;
    TimestampTz created;
    int64 id;
};

struct StateKey {
    Oid relid;
    uint32 variant;  // ByShard | ByNode
    NameData key_column;
};

// The head index of a queue and key column (see "the fast pick").
struct HeadIndex {
    uint64 stamp;  // of the queue entry it was found under; 0: not looked for
    Oid index;     // InvalidOid: none usable
    AttrNumber key_att, status_att, created_att, id_att, expires_att;
    RegProcedure key_eq, status_eq;
    Oid key_collation, status_collation;
};

struct OrderedState {
    StateKey key;  // hash key
    bool valid;
    OrderPos pos;
    int nkeys;
    char *keys[kMaxProbed];  // in ordered_cxt
    // Per key: whether a walk saw it with a backlog (two or more pending
    // jobs walked and not taken). Only those are left out of the walks at
    // the scan; the others are only probed.
    bool backlog[kMaxProbed];
    uint32 filter_hash;
    TransactionId xid;  // of the claim that set it
    uint64 stamp;       // of the queue entry it was set under (queue.hpp)
    sharding::queue::SweepClock clock;
    bool shared_copy;   // pos and keys are a copy of the shared position
    // Rows the last claims walked per head they took, in 16ths (0: none
    // yet): the length of the next first walk (claim_common).
    uint32 walk_per_head;
    HeadIndex head;  // (this backend's, never shared)
};


// One row of a pick's result (see pick_sql).
struct PickRow {
    char kind;
    OrderPos pos;
    char *key;  // palloc'd
    int64 n;
};

// A set of keys in insertion order (palloc'd, open addressing on their
// hashes): the keys a claim leaves out of its walks can be many.
struct KeySet {
    char **list;
    int n, cap;
    int *slots;  // index into list + 1; 0: empty
    uint32 mask;
};

// The turn of a position, taken.
struct Turn {
    int slot;            // -1: no slot free, the backend's own position is used
    bool held;           // false: waited too long (or the turn is this backend's): a copy, not published
    uint64 generation;   // of the slot when it was read
    Oid relfilenode;     // of the slot's position (InvalidOid: none)
};

// What the fast pick of one claim holds open across its rounds.
struct FastPick {
    Relation rel, index;
    HeadIndex head;
    IndexScanDesc pending, processing;  // the head check's two probes
    ScanKeyData pending_keys[2], processing_keys[2];
    TupleTableSlot *row, *probe;
    Snapshot snapshot;
    TimestampTz now;
    CommandId cid;
};

// --- ordered_positions.cpp ---

// The memory the positions live in (the cache module's).
extern MemoryContext ordered_cxt;
// This backend's position of a queue, variant (ByShard | ByNode) and key
// column, created empty.
OrderedState *state_for(Oid relid, uint32 variant, const char *key_column);
// Sets st's listed keys (backlog: the keys seen with a backlog).
void set_keys(OrderedState *st, char **keys, int n, const KeySet *backlog);
// Whether the positions are shared (the library preloaded).
bool shared_positions();
// The table's relfilenode (0 for a partitioned table).
Oid table_filenode(Oid relid);
// Takes the turn of a shared position and copies it into st.
Turn take_turn(Oid relid, uint32 variant, const char *key_column, uint32 fh, OrderedState *st);
// Publishes st as the turn's position and gives the turn up.
void publish_and_give_turn(const Turn &t, const OrderedState *st, Oid relfilenode);
// Claim order of two positions: negative if a comes first.
int compare_pos(bool has_priority, bool has_run_at, const OrderPos &a, const OrderPos &b);
void keyset_init(KeySet *k);
bool keyset_has(const KeySet *k, const char *key);
void keyset_add(KeySet *k, const char *key);  // unless it is there
ArrayType *text_array(char **keys, int n);

// --- ordered_fast.cpp ---

// Whether this claim can test and lock in C; opens what it needs in f.
bool begin_fast(FastPick *f, const Queue *q, const char *key_column, OrderedState *st);
// The snapshot a round's candidates statement runs under.
Snapshot fast_round_snapshot(FastPick *f);
void end_fast(FastPick *f);
// Tests and locks one round's candidates (the statement's result):
// the pick's rows into *out, their count returned.
int fast_round(FastPick *f, int32 need, int32 walk, const int64 *taken, int ntaken, bool has_priority,
               bool has_run_at, PickRow **out);
// The pick statement's rows (the round ran the pick itself).
int read_pick_rows(bool has_priority, bool has_run_at, PickRow **out);

}  // namespace ordered
}  // namespace queue
}  // namespace sharding
