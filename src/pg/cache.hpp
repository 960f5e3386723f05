// The per-backend cache module: one memory context, one relcache callback,
// one syscache callback, one retirement rule, for every topic that caches
// something per backend (routing, queues, rank guards, ...). Modelled on
// Citus' metadata_cache.c.
//
// The memory. cache::context() is the memory context "sharding cache", a
// child of CacheMemoryContext, created on first use (never in _PG_init,
// which may run in the postmaster under shared_preload_libraries). Every
// cached object lives in it or in a child of it, so
// pg_backend_memory_contexts shows what the caches hold. C++ containers use
// CacheAllocator (cache_alloc.hpp), which allocates there.
//
// Entry kinds. A topic plugs its cache in by registering one Kind, once,
// from its init function (called by _PG_init):
//
//     namespace {
//     uint64 generation = 1;                         // the topic's own state
//     void my_relation_changed(Oid relid) { if (relid == InvalidOid || relid == my_relid) generation++; }
//     void my_syscache_changed(int, uint32) { generation++; }
//     const sharding::cache::Kind my_kind = {
//         "my topic", my_relation_changed, my_syscache_changed, 2, {NAMESPACEOID, ENUMOID}};
//     }
//     void my_init() { sharding::cache::register_kind(&my_kind); }
//
// The module registers ONE relcache callback (the first time a kind is
// registered) and ONE syscache callback function (once per syscache id that
// some kind lists, up to 4 ids per kind). Both dispatch every invalidation to
// every kind interested in it: relation_changed(relid) for every relcache
// invalidation (relid InvalidOid means "every relation": a cache reset), and
// syscache_changed(cacheid, hashvalue) for the listed syscaches (hashvalue 0
// means "every entry"). These callbacks run inside PostgreSQL's
// invalidation processing, possibly in the middle of a lookup or a build of
// the same cache: they must ONLY mark entries stale (bump a generation,
// clear a valid flag). No catalog access, no allocation, no ereport, no
// throw, no freeing.
//
// Building without losing an invalidation. A build must know which
// relation oids its entry depends on BEFORE it takes the snapshot it reads
// with (look them up first), and record the generation after that lookup and
// before the snapshot: an invalidation processed during the build (SPI
// takes locks, and lock acquisition processes invalidations) then bumps the
// generation past the recorded one, and the fresh entry is stale at once. A
// callback that compares against an oid learned only at the END of the build
// drops exactly the invalidations that matter (the first-build race,
// specs/maps_first_build.spec).
//
// Retirement. An entry that is replaced or dropped may still be in use by a
// call further up the stack (a trigger on a queue table that calls claim, an
// RLS policy that routes). So nothing is freed when it is replaced: hand it
// to retire_context / retire_plan / retire, and the module frees it when
// the outermost call of this extension returns (SHARDING_FUNCTION counts the
// depth), or at the latest at the end of the transaction (commit or abort),
// or of the subtransaction that aborted the calls. Pointers into cache
// entries are valid for the current call only: anything kept across calls
// (fn_extra, SRF state) must be revalidated by generation.
//
// Everything below is C-level: functions may ereport (call them where no C++
// object that owns memory is alive, or through pg_call), except the
// callbacks' contract above.
#pragma once

#include "pg/pg.hpp"

extern "C" {
#include "executor/spi.h"
#include "utils/hsearch.h"
}

namespace sharding {
namespace cache {

// One topic's cache. Defined with static storage duration (the module keeps
// the pointer). Either callback may be nullptr.
struct Kind {
    const char *name;
    void (*relation_changed)(Oid relid);
    void (*syscache_changed)(int cacheid, uint32 hashvalue);
    int nsyscaches;    // how many ids of syscaches[] syscache_changed wants
    int syscaches[4];  // syscache ids (NAMESPACEOID, ENUMOID, ...)
};

// Registers a kind: once per backend, from its topic's init function. At
// most 16 kinds.
void register_kind(const Kind *kind);

// "sharding cache": created on first use (may ereport).
MemoryContext context();

// A new child context of context() for one entry (name: a string literal,
// kept by pointer): delete it (or retire it)
// as a whole when the entry is replaced.
MemoryContext entry_context(const char *name);

// A backend-local hash table in cxt whose keys (keysize bytes, compared as
// bytes: zero a struct key's padding) start its entries of entrysize
// bytes; name: a string literal, nelem: its expected size.
HTAB *blob_hash(MemoryContext cxt, const char *name, long nelem, Size keysize, Size entrysize);

// Retirement (see above): what is handed over is freed when no call of this
// extension is running any more. retire_plan calls SPI_freeplan, retire_context
// MemoryContextDelete, retire free(arg).
void retire_context(MemoryContext cxt);
void retire_plan(SPIPlanPtr plan);
void retire(void (*free)(void *arg), void *arg);

// Counters for tests and pg_backend_memory_contexts users: how many
// invalidations were dispatched, how many retired objects were freed.
struct Stats {
    uint64 relcache_invalidations;
    uint64 syscache_invalidations;
    uint64 retired_freed;
};
Stats stats();


// ---------------------------------------------------------------- changes
// The one rule for caches of configuration (routing, the guard's local
// state): every call sees every configuration change whose transaction had
// committed (been acknowledged to its client) before the call began, on a
// coordinator and on a follower. Invalidation messages alone cannot promise
// that: a backend takes them in only at transaction start and when it
// acquires a lock it does not hold yet, so a PL/pgSQL loop inside one
// transaction (which holds all its locks after the first iteration) never
// sees them (CHANGELOG 1.3, "Fixed").
//
// So the config tables' triggers note what changed (note_change,
// note_routing), and at commit (XACT_EVENT_COMMIT: after the change is
// visible to new snapshots, before the commit is acknowledged and before
// its locks are released) the module bumps counters in shared memory: per
// map slot (a hash of the map name) and kind of change (the map itself, its
// shards, its pins), and one per topic; the keys of changed pins go into a
// shared ring. A reader compares the topic counter with the value it saw
// last, per call (one load from a cache line that only commits of config
// changes write), and only when it moved looks at the slots of the entries
// it holds: a map whose pins changed re-reads just those keys (pin_changes),
// one whose shards changed just its shard rows. A build reads the counters
// (and the ring's head) BEFORE it takes its snapshot, so an entry built from
// old rows is stale as soon as a counter moves.
//
// The backend's own changes, not committed yet, are seen at its next
// command as before: the triggers also register a relcache invalidation,
// processed at command end, whose callback calls own_changes_visible(); the
// module then bumps backend-local counters (and a local log of pin keys) for
// what was noted since. A (sub)transaction that aborts after noting changes
// bumps the local map counters of what it noted: those maps are rebuilt.
//
// Without shared_preload_libraries there is no shared memory: then
// changes() takes in invalidation messages on every call
// (AcceptInvalidationMessages, a few nanoseconds when the queue is empty),
// map_stamp() carries no per-map information, and the topic's relcache
// callback marks every entry of the topic stale, as before.
//
// A configuration change inside PREPARE TRANSACTION is refused (55000): its
// commit would run in another backend, which would not bump the counters.
enum Topic : int {
    routing_topic = 0,  // sharding.maps, shards, pins
    local_topic = 1,    // sharding.local_node, frozen_shards (the guard)
    ntopics = 2,
};
// What changed of a map (routing topic).
enum Change : int { change_map = 0, change_shards = 1, change_pins = 2, nchanges = 3 };
constexpr uint32 map_slots = 4096;
// Pin keys longer than this are not logged one by one: their change makes
// readers re-read every pin of the map.
constexpr uint32 logged_key_bytes = 94;

// Whether the counters live in shared memory (the library was preloaded).
bool shared_changes();
// The topic's counter of committed changes (see above), plus the local
// counter of this backend's own visible changes. Never ereports unless
// invalidation processing does (without preload).
uint64 changes(int topic);
// Per kind of change, the counters of the maps hashing to `slot` (shared
// and own, and the topic's whole-topic counter in change_map): an entry
// built when they read S is valid while they still read S. Without shared
// memory every kind reads the same (the own counter only).
struct MapStamp {
    uint64 kind[nchanges];
    bool operator==(const MapStamp &o) const {
        return kind[0] == o.kind[0] && kind[1] == o.kind[1] && kind[2] == o.kind[2];
    }
};
MapStamp map_stamp(uint32 slot);
// Positions in the shared ring and in the backend's own log of pin changes.
struct PinCursor {
    uint64 shared_pos;
    uint64 own_pos;
};
// Where both logs end now (read after map_stamp, before the snapshot).
PinCursor pin_cursor();
// Calls fn(arg, key, len) for every pin key of the maps in `slot` logged in
// [from, to); false when some are no longer in the logs or a change of
// every pin of the map was logged (then re-read all pins). May call fn for
// a key more than once, or for keys of another map sharing the slot. Takes
// a shared LWLock; may ereport (fn must not).
bool pin_changes(uint32 slot, const PinCursor &from, const PinCursor &to,
                 void (*fn)(void *arg, const char *key, size_t len), void *arg);
// The slot of a map name.
uint32 map_slot(const char *name, size_t len);
// Called by the config tables' triggers: this transaction changed `topic`
// for the map name[0..len) (name nullptr: every map of the topic); for the
// routing topic, the map itself (its row: rebuilt).
void note_change(int topic, const char *name, size_t len);
// The routing topic, by kind: change_shards (the map's shard rows),
// change_pins (key[0..keylen), or key nullptr: every pin of the map).
void note_routing(Change kind, const char *name, size_t len, const char *key, size_t keylen);
// From the topic's relcache callback (only marks; never ereports): what
// this backend noted so far is visible to its own snapshots now.
void own_changes_visible(int topic);
// From _PG_init, when preloading: asks for the shared memory.
void shmem_init();

}  // namespace cache
}  // namespace sharding
