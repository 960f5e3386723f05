// Maps and routing (docs/maps.md), the C++ side: routing (node_for, logical_shard,
// partition_for, epoch) from a per-backend cache, the shard locks behind
// fence and move_shard, the rebalance planner's SQL entry point and the
// trigger that tells every backend when the config tables change.
//
// The cache. Each backend keeps, per map name, a MapRoutes (route_cache.hpp)
// built lazily from the config tables, in the cache module's memory
// (cache.hpp: the entry kind "routing"). Which entries are still valid
// follows the cache module's one rule (cache.hpp, "changes"): every call
// sees every change committed before it began. Triggers on sharding.maps,
// sharding.shards and sharding.pins note the change (cache::note_change);
// its commit bumps shared counters; every call of routes_for compares the
// routing topic's counter with the one it saw last (one load), and when it
// moved drops the entries whose map slot moved. Without preload, every call
// takes in invalidation messages instead, and the relcache invalidation of
// sharding.maps the same triggers register bumps `log_epoch`: every entry
// is then brought up to date in place (refresh) from its shard rows and
// the pins of the keys sharding.pin_log names since the entry last looked
// (the same triggers write that log where there is no shared memory), so
// one pin changed re-reads one pin, not every pin of the map. A map whose
// log says "every pin" (a statement that changed more than 1,024 of them,
// a TRUNCATE, the map's own row), whose log rows were trimmed past what it
// read, or that had more than 1,024 keys changed is rebuilt.
//
// Why not once per statement, as 1.2 did: 1.2 took in invalidations once
// per call site and query execution, marked in fn_extra. A PL/pgSQL
// assignment such as `n := sharding.node_for(...)` is a "simple expression"
// whose FmgrInfo (and so fn_extra) lives for the whole transaction; after
// the first iteration of a loop nothing took invalidations in any more (the
// loop already holds every lock it needs, and lock acquisition is the other
// place PostgreSQL processes them), so the map of the transaction's first
// call was used until the transaction ended (CHANGELOG 1.3, "Fixed").
//
// Building without losing a change: a build looks up the oid of
// sharding.maps FIRST (for the relcache callback), then reads the counters
// (stamp), then takes its snapshot: a change committed during the build
// moves the counters past the stamp, and the fresh entry is stale at once.
// (Learning the oid only at the end of the first build dropped exactly
// those: specs/maps_first_build.spec.) Entries are
// built into a fresh object and swapped in last, so an ERROR while reading
// leaves the previous state intact; replaced entries are retired, not freed.
#include "pg/cache.hpp"
#include "pg/keys.hpp"
#include "pg/shard_lock.hpp"
#include "core/route_cache.hpp"

#include <iterator>
#include <string_view>
#include <unordered_map>

extern "C" {
#include "access/htup_details.h"
#include "access/parallel.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "port/atomics.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
}

namespace {
using sharding::CacheAllocator;
using sharding::CacheString;
using sharding::KeyType;
using sharding::MapRoutes;

struct NameHash {
    size_t operator()(const CacheString &s) const { return std::hash<std::string_view>()({s.data(), s.size()}); }
};
template <class V>
using ByName = std::unordered_map<CacheString, V, NameHash, std::equal_to<CacheString>,
                                  CacheAllocator<std::pair<const CacheString, V>>>;

uint64_t generation = 1;           // bumped by relcache invalidations of sharding.maps
uint64_t log_epoch = 0;            // ... without shared memory, where sharding.pin_log exists
Oid maps_relid = InvalidOid;       // sharding.maps, looked up before each build
Oid log_relid = InvalidOid;        // sharding.pin_log (InvalidOid: an older version's tables)
int pin_log_keep = 65536;          // sharding.pin_log_keep: rows kept when the log is trimmed
const MapRoutes *last = nullptr;   // the map the previous call used
uint64_t seen = 0;                 // changes() + generation when the entries were last checked
// An entry was built or refreshed by a parallel-mode leader (see bind_to_snapshot).
bool snapshot_bound = false;
ByName<MapRoutes *> *cache = nullptr;  // in the cache module's memory
// How often this backend built a map's routes from all its rows, and
// brought one up to date in place (refresh): sharding._routing_cache_counts.
uint64_t builds = 0;
uint64_t refreshes = 0;

// Node names as ready-made text values, shared by all maps and never freed,
// so that node_for returns one without allocating. Function results may
// point into memory the function does not own (functions return pointers
// into their arguments, which may lie in shared buffers), so no caller frees
// or writes them; and as these are never freed, a result stays valid however
// long it is kept, across cache rebuilds. Bounded by the distinct node names
// the backend has seen. In the cache module's memory context.
ByName<const void *> *node_texts = nullptr;

const void *node_text(const CacheString &name) {
    auto it = node_texts->find(name);
    if (it != node_texts->end()) return it->second;
    // palloc'd chunks are max-aligned, as a varlena needs.
    char *buf = CacheAllocator<char>().allocate(VARHDRSZ + name.size());
    SET_VARSIZE(buf, VARHDRSZ + name.size());
    memcpy(buf + VARHDRSZ, name.data(), name.size());
    node_texts->emplace(name, buf);
    return buf;
}

void free_routes(void *routes) { sharding::cache_delete(static_cast<MapRoutes *>(routes)); }

// The routing kind's relcache callback: only marks the cache stale (it may
// run in the middle of a lookup or build, so it must not free anything).
// With shared counters, an invalidation of sharding.maps only says that
// this backend's own changes are visible to it now (the module knows which
// maps it noted); without them, every entry is stale.
void routing_invalidate(Oid relid) {
    if (relid == InvalidOid)
        generation++;
    else if (relid == maps_relid) {
        if (sharding::cache::shared_changes()) {
            sharding::cache::own_changes_visible(sharding::cache::routing_topic);
        } else if (OidIsValid(log_relid)) {
            // Another backend's change or this one's: the own log names
            // this backend's keys, sharding.pin_log everyone's.
            sharding::cache::own_changes_visible(sharding::cache::routing_topic);
            log_epoch++;
        } else {
            generation++;
        }
    }
}

// What an entry of the map in `slot` is valid for, per kind of change: the
// map's counters, plus the backend's relcache generation in the map kind.
// Monotonic sums: unchanged only if every part is.
inline sharding::cache::MapStamp stamp_of(uint32_t slot) {
    sharding::cache::MapStamp st = sharding::cache::map_stamp(slot);
    st.kind[sharding::cache::change_map] += generation;
    // Without shared memory an invalidation may be any map's change: every
    // entry's shard rows and logged pins are looked at again.
    st.kind[sharding::cache::change_shards] += log_epoch;
    st.kind[sharding::cache::change_pins] += log_epoch;
    return st;
}
inline bool same_kind(const MapRoutes &m, const sharding::cache::MapStamp &st, int kind) {
    return m.stamp[kind] == st.kind[kind];
}
inline void set_stamp(MapRoutes *m, const sharding::cache::MapStamp &st, const sharding::cache::PinCursor &c) {
    for (int k = 0; k < sharding::cache::nchanges; k++) m->stamp[k] = st.kind[k];
    m->cursor_shared = c.shared_pos;
    m->cursor_own = c.own_pos;
}

// In parallel mode load_raw and load_delta cannot take the latest snapshot
// and read with the active one, which may predate the stamp just read (a
// REPEATABLE READ transaction's snapshot, or a statement's taken before a
// change committed). In the leader, whose cache outlives the statement, such
// an entry serves the current call only: its map stamp never matches and
// the next call revalidates (and rebuilds it). A parallel worker reads with
// the same snapshot for its whole life and keeps its entries.
inline void bind_to_snapshot(MapRoutes *m) {
    if (!IsInParallelMode() || IsParallelWorker()) return;
    m->stamp[sharding::cache::change_map] = UINT64_MAX;
    snapshot_bound = true;
}

// The topic-wide value compared on every call.
inline uint64_t changes_now() {
    const uint64_t shared = sharding::cache::changes(sharding::cache::routing_topic);  // may bump generation
    return shared + generation + log_epoch;
}

const sharding::cache::Kind routing_kind = {"routing", routing_invalidate, nullptr, 0, {0, 0, 0, 0}};

Oid lookup_maps_relid() {
    Oid nsp = get_namespace_oid("sharding", false);
    // Without shared memory, the pin log (absent before 1.4's tables).
    log_relid = sharding::cache::shared_changes() ? InvalidOid : get_relname_relid("pin_log", nsp);
    return get_relname_relid("maps", nsp);
}

// Rows of the config tables, read by SPI and copied out of SPI's memory.
// Plain C data, palloc'd in the caller's context.
struct ShardRows {  // logical, node, epoch of sharding.shards
    uint64 n;
    int32 *logical;
    int64 *epoch;
    char **node;
    int *node_len;
};
struct PinRows {  // key, node of sharding.pins
    uint64 n;
    char **key;
    int *key_len;
    char **node;
    int *node_len;
};
// The config of one map.
struct RawMap {
    bool found;
    int32 logical_shards;
    ShardRows shards;
    PinRows pins;
    int64 log_seq;  // sharding.pin_log's cursor (-1: none)
    char *log_snapshot;
};

char *spi_text(HeapTuple tup, TupleDesc desc, int col, int *len) {
    bool isnull;
    Datum d = SPI_getbinval(tup, desc, col, &isnull);
    if (isnull) {
        *len = 0;
        return nullptr;
    }
    text *t = DatumGetTextPP(d);
    *len = static_cast<int>(VARSIZE_ANY_EXHDR(t));
    char *out = static_cast<char *>(SPI_palloc(*len + 1));
    memcpy(out, VARDATA_ANY(t), *len);
    out[*len] = '\0';
    return out;
}

// Runs a read-only query (operators qualified: these run under the caller's
// search_path) with the snapshot `snap`; its rows are SPI_tuptable's, their
// number the result. May ereport.
uint64 run_read(const char *sql, int nargs, Oid *argtypes, Datum *args, Snapshot snap, long limit) {
    SPIPlanPtr plan = SPI_prepare(sql, nargs, argtypes);
    if (plan == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    int rc = SPI_execute_snapshot(plan, args, nullptr, snap, InvalidSnapshot, true, false, limit);
    if (rc != SPI_OK_SELECT) elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
    return SPI_processed;
}

// Copies the n rows (logical, node, epoch) of SPI_tuptable. May ereport.
void copy_shards(uint64 n, ShardRows *out) {
    SPITupleTable *tt = SPI_tuptable;
    out->n = n;
    out->logical = static_cast<int32 *>(SPI_palloc(sizeof(int32) * (n + 1)));
    out->epoch = static_cast<int64 *>(SPI_palloc(sizeof(int64) * (n + 1)));
    out->node = static_cast<char **>(SPI_palloc(sizeof(char *) * (n + 1)));
    out->node_len = static_cast<int *>(SPI_palloc(sizeof(int) * (n + 1)));
    for (uint64 i = 0; i < n; i++) {
        bool isnull;
        out->logical[i] = DatumGetInt32(SPI_getbinval(tt->vals[i], tt->tupdesc, 1, &isnull));
        out->node[i] = spi_text(tt->vals[i], tt->tupdesc, 2, &out->node_len[i]);
        Datum e = SPI_getbinval(tt->vals[i], tt->tupdesc, 3, &isnull);
        out->epoch[i] = isnull ? 0 : DatumGetInt64(e);
    }
    SPI_freetuptable(tt);
}

// Copies the n rows (key, node) of SPI_tuptable. May ereport.
void copy_pins(uint64 n, PinRows *out) {
    SPITupleTable *tt = SPI_tuptable;
    out->n = n;
    out->key = static_cast<char **>(SPI_palloc(sizeof(char *) * (n + 1)));
    out->key_len = static_cast<int *>(SPI_palloc(sizeof(int) * (n + 1)));
    out->node = static_cast<char **>(SPI_palloc(sizeof(char *) * (n + 1)));
    out->node_len = static_cast<int *>(SPI_palloc(sizeof(int) * (n + 1)));
    for (uint64 i = 0; i < n; i++) {
        out->key[i] = spi_text(tt->vals[i], tt->tupdesc, 1, &out->key_len[i]);
        out->node[i] = spi_text(tt->vals[i], tt->tupdesc, 2, &out->node_len[i]);
    }
    SPI_freetuptable(tt);
}

// Where sharding.pin_log stands in `snap`: its highest seq and the
// snapshot as pg_snapshot text (SPI's memory). May ereport.
void read_log_cursor(Snapshot snap, int64 *seq, char **snapshot) {
    if (run_read("SELECT coalesce(pg_catalog.max(seq), 0), pg_catalog.pg_current_snapshot()::text "
                 "FROM sharding.pin_log",
                 0, nullptr, nullptr, snap, 0) != 1)
        elog(ERROR, "sharding.pin_log: no cursor");
    bool isnull;
    *seq = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    int len;
    *snapshot = spi_text(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &len);
    SPI_freetuptable(SPI_tuptable);
}

// The pins that route (of the keys in $2 when `some`): on a map with a
// worker group (sharding.worker_groups, version 1.4), only pins to a node
// that is a member of the group; a key pinned to another node routes as if
// it were not pinned (CONTRACT 15.5). A membership change rewrites the
// map's row (sql/install/55_groups.sql), so every backend rebuilds it.
const char *pins_sql(bool some) {
    Oid ns = get_namespace_oid("sharding", true);
    bool groups = OidIsValid(ns) && OidIsValid(get_relname_relid("worker_members", ns));
    if (!groups)
        return some ? "SELECT key, node FROM sharding.pins WHERE map OPERATOR(pg_catalog.=) $1 "
                      "AND key OPERATOR(pg_catalog.=) ANY ($2)"
                    : "SELECT key, node FROM sharding.pins WHERE map OPERATOR(pg_catalog.=) $1";
    return some ? "SELECT p.key, p.node FROM sharding.pins p WHERE p.map OPERATOR(pg_catalog.=) $1 "
                  "AND p.key OPERATOR(pg_catalog.=) ANY ($2) "
                  "AND (NOT EXISTS (SELECT FROM sharding.worker_groups g WHERE g.map OPERATOR(pg_catalog.=) $1) "
                  "OR EXISTS (SELECT FROM sharding.worker_members m WHERE m.map OPERATOR(pg_catalog.=) $1 "
                  "AND m.worker OPERATOR(pg_catalog.=) p.node))"
                : "SELECT p.key, p.node FROM sharding.pins p WHERE p.map OPERATOR(pg_catalog.=) $1 "
                  "AND (NOT EXISTS (SELECT FROM sharding.worker_groups g WHERE g.map OPERATOR(pg_catalog.=) $1) "
                  "OR EXISTS (SELECT FROM sharding.worker_members m WHERE m.map OPERATOR(pg_catalog.=) $1 "
                  "AND m.worker OPERATOR(pg_catalog.=) p.node))";
}

const char shards_sql[] = "SELECT logical, node, epoch FROM sharding.shards WHERE map OPERATOR(pg_catalog.=) $1";

// Reads one map's config with the latest committed snapshot (not the
// transaction's: a REPEATABLE READ transaction must not cache, as valid, a
// config older than an invalidation it has already received). May ereport:
// call through pg_call.
void load_raw(text *map, RawMap *raw) {
    memset(raw, 0, sizeof *raw);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    // Parallel workers may not take a new snapshot; they use the query's.
    Snapshot snap = RegisterSnapshot(IsInParallelMode() ? GetActiveSnapshot() : GetLatestSnapshot());
    Oid argtypes[1] = {TEXTOID};
    Datum args[1] = {PointerGetDatum(map)};
    if (run_read("SELECT logical_shards FROM sharding.maps WHERE map OPERATOR(pg_catalog.=) $1", 1, argtypes, args,
                 snap, 0) > 0) {
        bool isnull;
        raw->found = true;
        raw->logical_shards = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
        SPI_freetuptable(SPI_tuptable);
        copy_shards(run_read(shards_sql, 1, argtypes, args, snap, 0), &raw->shards);
        copy_pins(run_read(pins_sql(false), 1, argtypes, args, snap, 0), &raw->pins);
    }
    raw->log_seq = -1;
    if (raw->found && OidIsValid(log_relid)) read_log_cursor(snap, &raw->log_seq, &raw->log_snapshot);
    UnregisterSnapshot(snap);
    SPI_finish();
}

// Builds (or rebuilds) the routes of `map`, whose name is name[0..len).
// The oid of sharding.maps is looked up before the stamp is read and
// before load_raw takes its snapshot (see the top of this file).
const MapRoutes &build_routes(text *map, const char *name, size_t len) {
    sharding::cache::MapStamp started;
    sharding::cache::PinCursor cursor;
    const uint32_t map_slot = sharding::cache::map_slot(name, len);
    RawMap raw;
    sharding::pg_call([&] {
        (void)sharding::cache::context();
        maps_relid = lookup_maps_relid();
        pg_read_barrier();
        started = stamp_of(map_slot);
        cursor = sharding::cache::pin_cursor();
        load_raw(map, &raw);
    });
    CacheString key(name, len);
    if (!raw.found) {
        if (last != nullptr && last->name == key) last = nullptr;
        auto it = cache->find(key);
        if (it != cache->end()) {
            MapRoutes *gone = it->second;
            cache->erase(it);
            sharding::pg_call([&] { sharding::cache::retire(free_routes, gone); });
        }
        sharding::fail(ERRCODE_UNDEFINED_OBJECT, "map \"%s\" does not exist", key.c_str());
    }

    struct Owner {  // the fresh entry until it is in the cache
        MapRoutes *p = sharding::cache_new<MapRoutes>();
        ~Owner() { sharding::cache_delete(p); }
    } fresh_owner;
    MapRoutes *fresh = fresh_owner.p;
    fresh->name = key;
    fresh->logical_shards = raw.logical_shards;
    fresh->shard_mod.set(static_cast<uint64_t>(raw.logical_shards));
    // The shard rows bound the allocation: a logical_shards value edited by
    // hand (say 2^31 - 1) must give a clean ERROR, not an 8 GB vector.
    if (raw.shards.n != static_cast<uint64>(raw.logical_shards))
        sharding::fail(ERRCODE_DATA_CORRUPTED, "map \"%s\" has %d logical shards but %llu shard rows", key.c_str(),
                       raw.logical_shards, static_cast<unsigned long long>(raw.shards.n));
    fresh->owner.assign(static_cast<size_t>(raw.logical_shards), -1);
    fresh->epoch.assign(static_cast<size_t>(raw.logical_shards), 0);
    for (uint64 i = 0; i < raw.shards.n; i++) {
        int32 l = raw.shards.logical[i];
        if (l < 0 || l >= raw.logical_shards || raw.shards.node[i] == nullptr)
            sharding::fail(ERRCODE_DATA_CORRUPTED, "map \"%s\" has an invalid shard row for logical shard %d",
                           key.c_str(), l);
        fresh->owner[static_cast<size_t>(l)] = fresh->node_index(raw.shards.node[i], raw.shards.node_len[i]);
        fresh->epoch[static_cast<size_t>(l)] = raw.shards.epoch[i];
    }
    for (int32 l = 0; l < raw.logical_shards; l++)
        if (fresh->owner[static_cast<size_t>(l)] < 0)
            sharding::fail(ERRCODE_DATA_CORRUPTED, "logical shard %d of map \"%s\" has no owner", l,
                           key.c_str());
    {
        // The keys' bytes stay where load_raw copied them (raw outlives the
        // build): no copy of a million keys.
        std::vector<sharding::PinTable::KeyRef> keys;
        std::vector<uint64_t> hashes;
        std::vector<int32_t> nodes;
        keys.reserve(raw.pins.n);
        hashes.reserve(raw.pins.n);
        nodes.reserve(raw.pins.n);
        for (uint64 i = 0; i < raw.pins.n; i++) {
            if (raw.pins.key[i] == nullptr || raw.pins.node[i] == nullptr) continue;
            const size_t key_len = static_cast<size_t>(raw.pins.key_len[i]);
            keys.push_back({raw.pins.key[i], key_len});
            hashes.push_back(sharding::hash_bytes(raw.pins.key[i], key_len));
            nodes.push_back(fresh->node_index(raw.pins.node[i], raw.pins.node_len[i]));
        }
        fresh->pins.build(keys.data(), hashes.data(), nodes.data(), keys.size());
        fresh->node_pins.assign(fresh->nodes.size(), 0);
        for (int32_t n : nodes) fresh->node_pins[static_cast<size_t>(n)]++;
    }
    fresh->finish_build();
    fresh->compute_partitions();
    fresh->node_results.reserve(fresh->nodes.size());
    for (const CacheString &node : fresh->nodes) fresh->node_results.push_back(node_text(node));
    fresh->slot = map_slot;
    set_stamp(fresh, started, cursor);  // stale at once if a change committed meanwhile
    fresh->log_seq = raw.log_seq;
    if (raw.log_snapshot != nullptr) fresh->log_snapshot = CacheString(raw.log_snapshot);
    bind_to_snapshot(fresh);

    MapRoutes *&slot = (*cache)[key];
    MapRoutes *old = slot;
    slot = fresh;
    fresh_owner.p = nullptr;
    builds++;
    last = slot;
    // The old entry may be in use further up the stack: retired, not freed.
    if (old != nullptr) sharding::pg_call([&] { sharding::cache::retire(free_routes, old); });
    return *slot;
}

// ---- incremental changes (docs/directory.md)
// What refresh reads: the shard rows and/or the current pins of some keys.
struct RawDelta {
    bool map_found;
    ShardRows shards;
    PinRows pins;
};

// Reads, with the latest committed snapshot, the shard rows of the map (when
// `shards`) and the pins of keys[0..nkeys) that exist. May ereport.
void load_delta(const char *name, size_t len, bool shards, char **keys, int *key_lens, int nkeys, RawDelta *d) {
    memset(d, 0, sizeof *d);
    text *map = cstring_to_text_with_len(name, static_cast<int>(len));
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Snapshot snap = RegisterSnapshot(IsInParallelMode() ? GetActiveSnapshot() : GetLatestSnapshot());
    Oid argtypes[2] = {TEXTOID, TEXTARRAYOID};
    Datum args[2] = {PointerGetDatum(map), (Datum)0};
    d->map_found = run_read("SELECT 1 FROM sharding.maps WHERE map OPERATOR(pg_catalog.=) $1", 1, argtypes, args, snap,
                            1) > 0;
    if (d->map_found && shards) copy_shards(run_read(shards_sql, 1, argtypes, args, snap, 0), &d->shards);
    if (d->map_found && nkeys > 0) {
        Datum *elems = static_cast<Datum *>(palloc(sizeof(Datum) * nkeys));
        for (int i = 0; i < nkeys; i++) elems[i] = PointerGetDatum(cstring_to_text_with_len(keys[i], key_lens[i]));
        args[1] = PointerGetDatum(construct_array(elems, nkeys, TEXTOID, -1, false, TYPALIGN_INT));
        copy_pins(run_read(pins_sql(true), 2, argtypes, args, snap, 0), &d->pins);
    }
    UnregisterSnapshot(snap);
    SPI_finish();
}

// The changed keys pin_changes reports, collected as plain C into arrays
// palloc'd beforehand (the callback must not ereport): at most `cap`
// distinct keys, else `overflow` (the caller rebuilds).
struct KeyCollect {
    char **keys;
    int *lens;
    int n, cap;
    bool overflow;
};
void collect_key(void *arg, const char *key, size_t len) {
    KeyCollect *c = static_cast<KeyCollect *>(arg);
    for (int i = 0; i < c->n; i++)
        if (static_cast<size_t>(c->lens[i]) == len && memcmp(c->keys[i], key, len) == 0) return;
    if (c->n == c->cap) {
        c->overflow = true;
        return;
    }
    memcpy(c->keys[c->n], key, len);
    c->lens[c->n++] = static_cast<int>(len);
}

// Without shared memory: the keys sharding.pin_log names for the map since
// the cursor (seq, snapshot), through collect_key, and the log's cursor
// now. Rows after seq, and rows at or before it that the snapshot did not
// see (their transactions had not committed then), in one latest snapshot;
// the pins themselves are read after it (load_delta), so none can be older
// than what the log said. False (rebuild) when the log says "every pin"
// of the map or of every map, or was trimmed past the cursor. May ereport.
bool read_log_keys(const char *name, size_t len, int64 seq, const char *snapshot, KeyCollect *keys, int64 *new_seq,
                   char **new_snapshot) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Snapshot snap = RegisterSnapshot(IsInParallelMode() ? GetActiveSnapshot() : GetLatestSnapshot());
    Oid argtypes[3] = {TEXTOID, INT8OID, TEXTOID};
    Datum args[3] = {PointerGetDatum(cstring_to_text_with_len(name, static_cast<int>(len))), Int64GetDatum(seq),
                     PointerGetDatum(cstring_to_text(snapshot))};
    bool complete = true;
    bool isnull;
    // Trimmed past what the entry read: rows it needed may be gone.
    if (run_read("SELECT h.seq OPERATOR(pg_catalog.>) $2 OR h.xid OPERATOR(pg_catalog.>=) "
                 "pg_catalog.pg_snapshot_xmin($3::pg_catalog.pg_snapshot) FROM sharding.pin_log_horizon h",
                 3, argtypes, args, snap, 0) > 0) {
        for (uint64 i = 0; i < SPI_processed && complete; i++)
            if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull))) complete = false;
    }
    SPI_freetuptable(SPI_tuptable);
    if (complete) {
        const uint64 n = run_read(
            "SELECT l.map IS NULL OR l.key IS NULL, l.key FROM sharding.pin_log l "
            "WHERE (l.map OPERATOR(pg_catalog.=) $1 OR l.map IS NULL) AND (l.seq OPERATOR(pg_catalog.>) $2 OR "
            "(l.xid OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin($3::pg_catalog.pg_snapshot) AND "
            "NOT pg_catalog.pg_visible_in_snapshot(l.xid, $3::pg_catalog.pg_snapshot)))",
            3, argtypes, args, snap, keys->cap + 1);
        for (uint64 i = 0; i < n && complete; i++) {
            HeapTuple tup = SPI_tuptable->vals[i];
            if (DatumGetBool(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull))) {
                complete = false;
                break;
            }
            Datum k = SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull);
            text *kt = DatumGetTextPP(k);
            const size_t klen = VARSIZE_ANY_EXHDR(kt);
            if (klen > sharding::cache::logged_key_bytes) {
                // The collector's buffers hold logged_key_bytes each.
                complete = false;
                break;
            }
            collect_key(keys, VARDATA_ANY(kt), klen);
        }
        SPI_freetuptable(SPI_tuptable);
        if (keys->overflow) complete = false;
    }
    if (complete) read_log_cursor(snap, new_seq, new_snapshot);
    UnregisterSnapshot(snap);
    SPI_finish();
    return complete;
}

// Brings an entry whose shards or pins changed up to date in place, without
// rebuilding its pins: re-reads its shard rows, and the current pins of the
// keys the logs name. False when that is not possible (the map is gone,
// pins were lost from the logs, too many keys changed): rebuild it.
bool refresh(MapRoutes *m, const sharding::cache::MapStamp &st) {
    using namespace sharding::cache;
    const bool shards = !same_kind(*m, st, change_shards);
    const bool pins = !same_kind(*m, st, change_pins);
    constexpr int max_keys = 1024;
    RawDelta d;
    PinCursor now;
    bool complete = true;
    KeyCollect keys{};
    // Without shared memory, other backends' pin changes come from
    // sharding.pin_log (an entry that never read it is rebuilt).
    const bool from_log = !shared_changes() && OidIsValid(log_relid);
    if (pins && !shared_changes() && (!from_log || m->log_seq < 0)) return false;
    int64 log_seq = m->log_seq;
    char *log_snapshot = nullptr;
    sharding::pg_call([&] {
        now = pin_cursor();
        if (pins) {
            keys.cap = max_keys;
            keys.keys = static_cast<char **>(palloc(sizeof(char *) * max_keys));
            keys.lens = static_cast<int *>(palloc(sizeof(int) * max_keys));
            char *buf = static_cast<char *>(palloc(static_cast<size_t>(max_keys) * logged_key_bytes));
            for (int i = 0; i < max_keys; i++) keys.keys[i] = buf + static_cast<size_t>(i) * logged_key_bytes;
            PinCursor from{m->cursor_shared, m->cursor_own};
            complete = pin_changes(m->slot, from, now, collect_key, &keys) && !keys.overflow;
            if (complete && from_log)
                complete = read_log_keys(m->name.data(), m->name.size(), m->log_seq, m->log_snapshot.c_str(), &keys,
                                         &log_seq, &log_snapshot);
        }
        if (complete) load_delta(m->name.data(), m->name.size(), shards, keys.keys, keys.lens, keys.n, &d);
    });
    if (!complete || !d.map_found) return false;
    if (shards) {
        if (d.shards.n != static_cast<uint64>(m->logical_shards)) return false;
        for (uint64 i = 0; i < d.shards.n; i++)
            if (d.shards.logical[i] < 0 || d.shards.logical[i] >= m->logical_shards || d.shards.node[i] == nullptr) return false;
    }
    // From here C++ only (no PostgreSQL call that may ereport); an exception
    // leaves the entry half-changed, so the caller drops it.
    size_t nodes_before = m->nodes.size();
    bool added;
    if (shards)
        for (uint64 i = 0; i < d.shards.n; i++) {
            const size_t l = static_cast<size_t>(d.shards.logical[i]);
            m->owner[l] = m->find_or_add_node(d.shards.node[i], d.shards.node_len[i], &added);
            m->epoch[l] = d.shards.epoch[i];
        }
    m->node_pins.resize(m->nodes.size(), 0);
    for (int k = 0; k < keys.n; k++) {
        const char *key = keys.keys[k];
        const size_t len = static_cast<size_t>(keys.lens[k]);
        const uint64_t h = sharding::hash_bytes(key, len);
        int64 row = -1;
        for (uint64 i = 0; i < d.pins.n && row < 0; i++)
            if (static_cast<size_t>(d.pins.key_len[i]) == len && memcmp(d.pins.key[i], key, len) == 0 &&
                d.pins.node[i] != nullptr)
                row = static_cast<int64>(i);
        int32_t before;
        if (row >= 0) {
            int32_t node = m->find_or_add_node(d.pins.node[row], d.pins.node_len[row], &added);
            m->node_pins.resize(m->nodes.size(), 0);
            before = m->pins.upsert(h, key, len, node);
            m->node_pins[static_cast<size_t>(node)]++;
        } else {
            before = m->pins.erase(h, key, len);
        }
        if (before >= 0) m->node_pins[static_cast<size_t>(before)]--;
    }
    for (size_t n = nodes_before; n < m->nodes.size(); n++) m->node_results.push_back(node_text(m->nodes[n]));
    m->compute_partitions();
    set_stamp(m, st, now);
    if (log_snapshot != nullptr) {
        m->log_seq = log_seq;
        m->log_snapshot = CacheString(log_snapshot);
    }
    bind_to_snapshot(m);
    refreshes++;
    return true;
}

// Brings every entry up to date after a change: a map whose own row changed
// (created again, dropped) is dropped and rebuilt on its next use; one whose
// shards or pins changed is refreshed in place; the others are untouched.
void revalidate(uint64_t now) {
    last = nullptr;
    snapshot_bound = false;
    // DROP EXTENSION (and CREATE EXTENSION) fire no trigger of the config
    // tables: only the relcache invalidation of the old sharding.maps tells
    // of it, which with shared counters reads as "own changes visible" and
    // leaves every map stamp as it was. A different sharding.maps: every
    // entry was built from tables that are gone.
    Oid relid = InvalidOid;
    sharding::pg_call([&] { relid = lookup_maps_relid(); });
    if (relid != maps_relid) {
        maps_relid = relid;
        generation++;
    }
    for (auto it = cache->begin(); it != cache->end();) {
        MapRoutes *m = it->second;
        const sharding::cache::MapStamp st = stamp_of(m->slot);
        bool keep = same_kind(*m, st, sharding::cache::change_map);
        if (keep && !(same_kind(*m, st, sharding::cache::change_shards) &&
                      same_kind(*m, st, sharding::cache::change_pins))) {
            try {
                keep = refresh(m, st);
            } catch (...) {
                it = cache->erase(it);
                sharding::pg_call([&] { sharding::cache::retire(free_routes, m); });
                throw;
            }
        }
        if (keep) {
            ++it;
            continue;
        }
        it = cache->erase(it);
        sharding::pg_call([&] { sharding::cache::retire(free_routes, m); });
    }
    seen = now;
}

// The routes of the map named by `map`: the previous call's map when nothing
// changed since (one load of the shared counter, no allocation), else the
// cache, else a build. Checked on every call, not once per statement (see
// the top of the file): routing within one statement follows a move
// committed meanwhile, as a guard on the new owner does.
inline const MapRoutes &routes_for(FunctionCallInfo, text *map) {
    const uint64_t now = changes_now();
    if ((now != seen || snapshot_bound) && cache != nullptr) revalidate(now);
    seen = now;
    const char *name = VARDATA_ANY(map);
    const size_t len = VARSIZE_ANY_EXHDR(map);
    const MapRoutes *m = last;
    if (m != nullptr && m->name.size() == len && memcmp(m->name.data(), name, len) == 0) return *m;
    if (cache == nullptr) {  // node_texts first: cache set implies both are
        if (node_texts == nullptr) node_texts = sharding::cache_new<ByName<const void *>>();
        cache = sharding::cache_new<ByName<MapRoutes *>>();
    }
    {
        auto it = cache->find(CacheString(name, len));
        if (it != cache->end()) {
            last = it->second;
            return *last;
        }
    }
    return build_routes(map, name, len);
}

const char hex_digits[] = "0123456789abcdef";

// Writes the text form of a non-text key (the form pins match on) into buf,
// which holds `cap` bytes, returning its length; larger bytea keys get a
// palloc'd buffer through *out.
template <KeyType K>
size_t key_text(FunctionCallInfo fcinfo, int argno, char *buf, size_t cap, char **out) {
    *out = buf;
    if constexpr (K == KeyType::Bytea) {
        // bytea's text output in hex format, whatever bytea_output says.
        struct varlena *v = PG_GETARG_VARLENA_PP(argno);
        const unsigned char *p = reinterpret_cast<const unsigned char *>(VARDATA_ANY(v));
        size_t n = VARSIZE_ANY_EXHDR(v), len = 2 + 2 * n;
        if (len > cap) *out = static_cast<char *>(palloc(len));
        char *o = *out;
        *o++ = '\\';
        *o++ = 'x';
        for (size_t i = 0; i < n; i++) {
            *o++ = hex_digits[p[i] >> 4];
            *o++ = hex_digits[p[i] & 15];
        }
        return len;
    } else if constexpr (K == KeyType::Uuid) {
        // Canonical lower-case 8-4-4-4-12, as uuid_out prints it.
        pg_uuid_t *u = PG_GETARG_UUID_P(argno);
        char *o = buf;
        for (int i = 0; i < UUID_LEN; i++) {
            if (i == 4 || i == 6 || i == 8 || i == 10) *o++ = '-';
            *o++ = hex_digits[u->data[i] >> 4];
            *o++ = hex_digits[u->data[i] & 15];
        }
        return static_cast<size_t>(o - buf);
    } else {
        int64 v = K == KeyType::Int2 ? PG_GETARG_INT16(argno)
                  : K == KeyType::Int4 ? PG_GETARG_INT32(argno)
                                       : PG_GETARG_INT64(argno);
        return static_cast<size_t>(pg_lltoa(v, buf));
    }
}

// Routes argument 1 of fcinfo through map argument 0: the logical shard,
// and (when want_node) the pinned or owning node's index, and (when
// `pinned` is given) whether a pin decided it.
template <KeyType K>
inline int32 route(FunctionCallInfo fcinfo, const MapRoutes &m, bool want_node, int32 *node,
                   bool *pinned_out = nullptr) {
    if constexpr (K == KeyType::Text) {
        struct varlena *v = PG_GETARG_VARLENA_PP(1);
        const char *p = VARDATA_ANY(v);
        size_t n = VARSIZE_ANY_EXHDR(v);
        uint64_t h = sharding::hash_bytes(p, n);
        int32 shard = m.shard_of_hash(h);
        if (want_node) {
            int32 pinned = m.pins.size() ? m.pins.find(h, p, n) : -1;
            *node = pinned >= 0 ? pinned : m.owner[static_cast<size_t>(shard)];
            if (pinned_out != nullptr) *pinned_out = pinned >= 0;
        }
        return shard;
    } else {
        int32 shard = m.shard_of_hash(sharding::key_hash<K>(fcinfo, 1));
        if (want_node) {
            int32 pinned = -1;
            if (m.pins.size()) {
                char buf[128], *text;
                size_t n = key_text<K>(fcinfo, 1, buf, sizeof buf, &text);
                pinned = m.pins.find(sharding::hash_bytes(text, n), text, n);
            }
            *node = pinned >= 0 ? pinned : m.owner[static_cast<size_t>(shard)];
            if (pinned_out != nullptr) *pinned_out = pinned >= 0;
        }
        return shard;
    }
}

// node_for(map text, key) -> text. Runs once per row and allocates nothing:
// the result is the node's interned text (see node_text).
template <KeyType K>
Datum node_for_body(FunctionCallInfo fcinfo) {
    const MapRoutes &m = routes_for(fcinfo, PG_GETARG_TEXT_PP(0));
    int32 node = -1;
    route<K>(fcinfo, m, true, &node);
    return PointerGetDatum(m.node_results[static_cast<size_t>(node)]);
}

// partition_for(map text, key) -> integer: the PL/Proxy partition of a key,
// its logical shard unless a pin sends it to a node (docs/partitions.md).
template <KeyType K>
Datum partition_for_body(FunctionCallInfo fcinfo) {
    const MapRoutes &m = routes_for(fcinfo, PG_GETARG_TEXT_PP(0));
    int32 node = -1;
    bool pinned = false;
    int32 shard = route<K>(fcinfo, m, true, &node, &pinned);
    PG_RETURN_INT32(pinned ? m.node_partition[static_cast<size_t>(node)] : shard);
}

// logical_shard(map text, key) -> integer.
template <KeyType K>
Datum logical_shard_body(FunctionCallInfo fcinfo) {
    const MapRoutes &m = routes_for(fcinfo, PG_GETARG_TEXT_PP(0));
    PG_RETURN_INT32(route<K>(fcinfo, m, false, nullptr));
}

// Shard locks: the tags of pg/shard_lock.hpp; field3 is the logical shard,
// or map_level for the whole map.
void lock_shard_tag(text *map, uint32 field3, LOCKMODE mode) {
    (void)sharding::lock_shard(map, field3, mode);
}

}  // namespace

namespace sharding {
void maps_init() {
    cache::register_kind(&routing_kind);
    DefineCustomIntVariable("sharding.pin_log_keep",
                            "Rows of sharding.pin_log kept when it is trimmed (without shared_preload_libraries).",
                            "A backend whose routing cache read the log more than this many pin changes ago "
                            "rebuilds its maps instead of re-reading the changed pins.",
                            &pin_log_keep, 65536, 16, INT_MAX, PGC_SUSET, GUC_NOT_IN_SAMPLE, nullptr, nullptr,
                            nullptr);
}
// Bumped by every change to the routing tables this backend has taken in
// from now on: the callback recognises sharding.maps only once its oid is
// known, so it is looked up first (a backend that never routed has not).
// Glue: may raise a PostgreSQL ERROR.
uint64_t routing_generation() {
    if (maps_relid == InvalidOid) maps_relid = lookup_maps_relid();
    return changes_now();
}
}  // namespace sharding

SHARDING_KEY_FUNCTIONS(sharding_node_for, node_for_body)
SHARDING_KEY_FUNCTIONS(sharding_partition_for, partition_for_body)
SHARDING_KEY_FUNCTIONS(sharding_logical_shard, logical_shard_body)

/*
 * epoch(map text, logical integer) RETURNS bigint
 *
 * From the routing cache, so that it follows the same rule as node_for (a
 * move committed before the call is seen, also inside a REPEATABLE READ
 * transaction or a PL/pgSQL loop) and agrees with node_for's owner.
 */
SHARDING_FUNCTION(sharding_epoch) {
    const MapRoutes &m = routes_for(fcinfo, PG_GETARG_TEXT_PP(0));
    int32 logical = PG_GETARG_INT32(1);
    if (logical < 0 || logical >= m.logical_shards)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "logical shard must be between 0 and %d for map \"%s\", got %d",
                       m.logical_shards - 1, m.name.c_str(), logical);
    PG_RETURN_INT64(m.epoch[static_cast<size_t>(logical)]);
}

/*
 * fence(map text, logical integer, epoch bigint) RETURNS void
 *
 * A writer's guard: refuses (55000) once the shard has moved past `epoch`,
 * else holds a share lock on the shard until the transaction ends, so that
 * move_shard and rebalance (which take it exclusively) wait for the writer.
 * The epoch is read after the lock is granted, with the latest snapshot,
 * because a move may have committed while we waited. A heavyweight lock
 * rather than SELECT ... FOR SHARE: writers need no UPDATE privilege.
 */
SHARDING_FUNCTION(sharding_fence) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "fence needs a map, a logical shard and an epoch, got NULL");
    text *map = PG_GETARG_TEXT_PP(0);
    int32 logical = PG_GETARG_INT32(1);
    int64 epoch = PG_GETARG_INT64(2);
    if (logical < 0)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "logical shard must not be negative, got %d", logical);

    // Plain C from here to SPI_finish: nothing owns C++ memory.
    char *map_name = text_to_cstring(map);
    lock_shard_tag(map, sharding::map_level, RowShareLock);
    lock_shard_tag(map, static_cast<uint32>(logical), ShareLock);

    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid argtypes[2] = {TEXTOID, INT4OID};
    Datum args[2] = {PointerGetDatum(map), Int32GetDatum(logical)};
    SPIPlanPtr plan = SPI_prepare(
        "SELECT m.logical_shards, s.epoch FROM sharding.maps m "
        "LEFT JOIN sharding.shards s ON s.map OPERATOR(pg_catalog.=) m.map "
        "AND s.logical OPERATOR(pg_catalog.=) $2 WHERE m.map OPERATOR(pg_catalog.=) $1",
        2, argtypes);
    if (plan == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    Snapshot snap = IsInParallelMode() ? GetActiveSnapshot() : GetLatestSnapshot();
    int rc = SPI_execute_snapshot(plan, args, nullptr, snap, InvalidSnapshot, true, false, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
    bool found = SPI_processed > 0, shards_null = true, epoch_null = true;
    int32 logical_shards = 0;
    int64 current = 0;
    if (found) {
        logical_shards = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &shards_null));
        Datum e = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &epoch_null);
        if (!epoch_null) current = DatumGetInt64(e);
    }
    SPI_finish();

    if (!found) sharding::fail(ERRCODE_UNDEFINED_OBJECT, "map \"%s\" does not exist", map_name);
    if (logical >= logical_shards)
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE,
                       "logical shard must be between 0 and %d for map \"%s\", got %d", logical_shards - 1,
                       map_name, logical);
    if (epoch_null)
        sharding::fail(ERRCODE_DATA_CORRUPTED, "logical shard %d of map \"%s\" has no owner", logical, map_name);
    if (current != epoch)
        throw sharding::Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                              sharding::format("logical shard %d of map \"%s\" is at epoch %lld, not %lld",
                                               logical, map_name, static_cast<long long>(current),
                                               static_cast<long long>(epoch)),
                              "The shard moved since the epoch was read.",
                              "Re-read the owner with sharding.node_for and sharding.epoch, then retry.");
    PG_RETURN_VOID();
}

/*
 * _routing_cache_counts() RETURNS bigint[]
 *
 * Internal, for tests: {builds, refreshes} of this backend's routing cache
 * (a build reads every shard and pin of a map; a refresh re-reads only the
 * shards, or the pin keys, that changed).
 */
SHARDING_FUNCTION(sharding__routing_cache_counts) {
    (void)fcinfo;
    Datum elems[2] = {Int64GetDatum(static_cast<int64>(builds)), Int64GetDatum(static_cast<int64>(refreshes))};
    PG_RETURN_ARRAYTYPE_P(construct_array(elems, 2, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/*
 * _lock_shard(map text, logical integer) RETURNS void
 *
 * Internal, for move_shard: waits for every writer fenced on the shard and
 * for any rebalance of the map, and keeps new ones out until commit.
 */
SHARDING_FUNCTION(sharding__lock_shard) {
    text *map = PG_GETARG_TEXT_PP(0);
    int32 logical = PG_GETARG_INT32(1);
    if (logical < 0)  // -1 would be the map-level lock tag
        sharding::fail(ERRCODE_INVALID_PARAMETER_VALUE, "logical shard must not be negative, got %d", logical);
    lock_shard_tag(map, sharding::map_level, RowExclusiveLock);
    lock_shard_tag(map, static_cast<uint32>(logical), ExclusiveLock);
    PG_RETURN_VOID();
}

/*
 * _lock_map(map text) RETURNS void
 *
 * Internal, for rebalance and drop_map: one lock that conflicts with every
 * fence and move_shard on the map, however many shards move (a lock per
 * shard could exhaust the shared lock table on large maps).
 */
SHARDING_FUNCTION(sharding__lock_map) {
    lock_shard_tag(PG_GETARG_TEXT_PP(0), sharding::map_level, ExclusiveLock);
    PG_RETURN_VOID();
}

/*
 * _routing_changed() RETURNS trigger
 *
 * On sharding.maps, shards and pins: any committed change, through the
 * functions or by a direct write, is seen by every backend's next routing
 * call (see the top of this file). Notes the maps that changed: per row
 * (the row triggers logical-replication apply fires on a follower), from the
 * statement's transition tables when it has them, else every map (TRUNCATE,
 * a statement trigger without them). Also registers the relcache
 * invalidation of sharding.maps the per-backend fallback relies on.
 */
namespace {
// What a row of sharding.maps, shards or pins changed.
struct TableKind {
    sharding::cache::Change kind;
    int map_att;
    int key_att;  // pins: the key column
};

// Without shared memory, what one statement changed, for sharding.pin_log
// (see the top of the file): per map, up to log_max_keys keys, else "every
// pin"; past log_max_maps maps, "every map". Plain C, palloc'd in the
// trigger's context.
constexpr int log_max_keys = 1024;
constexpr int log_max_maps = 64;
struct LogMap {
    text *map;
    int nkeys;
    bool every;
    Datum keys[log_max_keys];
};
struct LogCollect {
    bool active;
    bool every_map;
    int nmaps;
    LogMap *maps[log_max_maps];
};
LogCollect log_collect;

void log_note(text *map, text *key) {
    if (!log_collect.active || log_collect.every_map) return;
    LogMap *m = nullptr;
    const size_t len = VARSIZE_ANY_EXHDR(map);
    for (int i = 0; i < log_collect.nmaps && m == nullptr; i++) {
        text *o = log_collect.maps[i]->map;
        if (VARSIZE_ANY_EXHDR(o) == len && memcmp(VARDATA_ANY(o), VARDATA_ANY(map), len) == 0) m = log_collect.maps[i];
    }
    if (m == nullptr) {
        if (log_collect.nmaps == log_max_maps) {
            log_collect.every_map = true;
            return;
        }
        m = static_cast<LogMap *>(palloc0(sizeof(LogMap)));
        m->map = cstring_to_text_with_len(VARDATA_ANY(map), static_cast<int>(len));
        log_collect.maps[log_collect.nmaps++] = m;
    }
    if (m->every) return;
    if (key == nullptr || m->nkeys == log_max_keys) {
        m->every = true;
        return;
    }
    m->keys[m->nkeys++] = PointerGetDatum(cstring_to_text_with_len(VARDATA_ANY(key), static_cast<int>(VARSIZE_ANY_EXHDR(key))));
}

// Writes what log_collect holds into sharding.pin_log, and now and then
// trims its oldest rows: those more than pin_log_keep rows back whose
// transactions every snapshot sees (sharding.pin_log_horizon records up to
// where). Runs as the caller (who changed the config tables). May ereport.
void log_write() {
    if (!log_collect.active) return;
    log_collect.active = false;
    if (!log_collect.every_map && log_collect.nmaps == 0) return;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    int64 last = 0, written = 0;
    bool isnull;
    auto insert = [&](int n, Datum *maps, bool *map_nulls, Datum *keys, bool *key_nulls) {
        int dims[1] = {n};
        int lbs[1] = {1};
        Oid argtypes[2] = {TEXTARRAYOID, TEXTARRAYOID};
        Datum args[2] = {PointerGetDatum(construct_md_array(maps, map_nulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT)),
                         PointerGetDatum(construct_md_array(keys, key_nulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT))};
        if (SPI_execute_with_args("WITH i AS (INSERT INTO sharding.pin_log (map, key) "
                                  "SELECT ($1::text[])[i], ($2::text[])[i] FROM pg_catalog.generate_series(1, "
                                  "pg_catalog.array_length($1::text[], 1)) AS i RETURNING seq) "
                                  "SELECT pg_catalog.max(seq) FROM i",
                                  2, argtypes, args, nullptr, false, 1) != SPI_OK_SELECT)
            elog(ERROR, "could not write sharding.pin_log");
        last = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
        written += n;
    };
    if (log_collect.every_map) {
        Datum none = (Datum)0;
        bool yes = true;
        insert(1, &none, &yes, &none, &yes);
    } else {
        int n = 0;
        for (int i = 0; i < log_collect.nmaps; i++) n += log_collect.maps[i]->every ? 1 : log_collect.maps[i]->nkeys;
        Datum *maps = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
        Datum *keys = static_cast<Datum *>(palloc(sizeof(Datum) * (n + 1)));
        bool *map_nulls = static_cast<bool *>(palloc0(sizeof(bool) * (n + 1)));
        bool *key_nulls = static_cast<bool *>(palloc0(sizeof(bool) * (n + 1)));
        int k = 0;
        for (int i = 0; i < log_collect.nmaps; i++) {
            LogMap *m = log_collect.maps[i];
            if (m->every) {
                maps[k] = PointerGetDatum(m->map);
                key_nulls[k++] = true;
                continue;
            }
            for (int j = 0; j < m->nkeys; j++) {
                maps[k] = PointerGetDatum(m->map);
                keys[k++] = m->keys[j];
            }
        }
        if (k > 0) insert(k, maps, map_nulls, keys, key_nulls);
    }
    // Trimmed about every 4,096 rows written.
    if (written > 0 && last / 4096 != (last - written) / 4096 && last > pin_log_keep) {
        Oid argtypes[1] = {INT8OID};
        Datum args[1] = {Int64GetDatum(last - pin_log_keep)};
        SPI_execute_with_args(
            "WITH d AS (DELETE FROM sharding.pin_log l WHERE l.seq OPERATOR(pg_catalog.<=) $1 AND l.xid "
            "OPERATOR(pg_catalog.<) pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) RETURNING l.seq, l.xid), "
            "m AS (SELECT pg_catalog.max(d.seq) AS seq, (SELECT x.xid FROM d x ORDER BY x.xid DESC LIMIT 1) AS xid FROM d) "
            "UPDATE sharding.pin_log_horizon h SET "
            "seq = CASE WHEN m.seq OPERATOR(pg_catalog.>) h.seq THEN m.seq ELSE h.seq END, "
            "xid = CASE WHEN m.xid OPERATOR(pg_catalog.>) h.xid THEN m.xid ELSE h.xid END "
            "FROM m WHERE m.seq IS NOT NULL",
            1, argtypes, args, nullptr, false, 0);
    }
    SPI_finish();
}

void note_row(const TableKind &t, TupleTableSlot *slot) {
    bool isnull;
    Datum d = slot_getattr(slot, t.map_att, &isnull);
    if (isnull) return;
    text *map = DatumGetTextPP(d);
    const char *key = nullptr;
    size_t keylen = 0;
    if (t.key_att > 0) {
        Datum k = slot_getattr(slot, t.key_att, &isnull);
        if (!isnull) {
            text *kt = DatumGetTextPP(k);
            key = VARDATA_ANY(kt);
            keylen = VARSIZE_ANY_EXHDR(kt);
        }
    }
    if (t.kind == sharding::cache::change_map)
        sharding::cache::note_change(sharding::cache::routing_topic, VARDATA_ANY(map), VARSIZE_ANY_EXHDR(map));
    else
        sharding::cache::note_routing(t.kind, VARDATA_ANY(map), VARSIZE_ANY_EXHDR(map), key, keylen);
    // The log: a pin's key; a map's own row, every pin of it (rebuilt).
    if (t.kind == sharding::cache::change_pins)
        log_note(map, key != nullptr ? DatumGetTextPP(slot_getattr(slot, t.key_att, &isnull)) : nullptr);
    else if (t.kind == sharding::cache::change_map)
        log_note(map, nullptr);
}

// Notes every row of a transition table. Plain C.
void note_tuplestore(const TableKind &t, Tuplestorestate *ts, TupleDesc desc) {
    TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
    int ptr = tuplestore_alloc_read_pointer(ts, EXEC_FLAG_REWIND);
    tuplestore_select_read_pointer(ts, ptr);
    tuplestore_rescan(ts);
    while (tuplestore_gettupleslot(ts, true, false, slot)) note_row(t, slot);
    tuplestore_select_read_pointer(ts, 0);
    ExecDropSingleTupleTableSlot(slot);
}

void note_tuple(const TableKind &t, HeapTuple tup, TupleDesc desc) {
    TupleTableSlot *slot = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
    ExecStoreHeapTuple(tup, slot, false);
    note_row(t, slot);
    ExecDropSingleTupleTableSlot(slot);
}
}  // namespace

SHARDING_FUNCTION(sharding__routing_changed) {
    if (!CALLED_AS_TRIGGER(fcinfo))
        sharding::fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "_routing_changed must be called as a trigger");
    TriggerData *td = reinterpret_cast<TriggerData *>(fcinfo->context);
    // Plain C from here: nothing owns C++ memory.
    TupleDesc desc = RelationGetDescr(td->tg_relation);
    const char *rel = RelationGetRelationName(td->tg_relation);
    TableKind t = {sharding::cache::change_map, SPI_fnumber(desc, "map"), 0};
    if (strcmp(rel, "shards") == 0) t.kind = sharding::cache::change_shards;
    if (strcmp(rel, "pins") == 0) {
        t.kind = sharding::cache::change_pins;
        t.key_att = SPI_fnumber(desc, "key");
    }
    const bool known = t.map_att > 0 && (t.kind != sharding::cache::change_pins || t.key_att > 0);
    // Without shared memory, the other backends learn which pins changed
    // from sharding.pin_log (where this database has it).
    log_collect = LogCollect{};
    log_collect.active = !sharding::cache::shared_changes() &&
                         OidIsValid(get_relname_relid("pin_log", RelationGetNamespace(td->tg_relation)));
    if (!known || TRIGGER_FIRED_BY_TRUNCATE(td->tg_event)) {
        sharding::cache::note_change(sharding::cache::routing_topic, nullptr, 0);
        log_collect.every_map = true;
    } else if (TRIGGER_FIRED_FOR_ROW(td->tg_event)) {
        note_tuple(t, td->tg_trigtuple, desc);
        if (TRIGGER_FIRED_BY_UPDATE(td->tg_event)) note_tuple(t, td->tg_newtuple, desc);
    } else if (td->tg_oldtable != nullptr || td->tg_newtable != nullptr) {
        if (td->tg_oldtable != nullptr) note_tuplestore(t, td->tg_oldtable, desc);
        if (td->tg_newtable != nullptr) note_tuplestore(t, td->tg_newtable, desc);
    } else {
        sharding::cache::note_change(sharding::cache::routing_topic, nullptr, 0);
        log_collect.every_map = true;
    }
    log_write();
    CacheInvalidateRelcacheByRelid(lookup_maps_relid());
    return PointerGetDatum(nullptr);
}
