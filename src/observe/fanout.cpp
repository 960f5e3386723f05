// Fan-out counting (docs/observe.md, "Counting fan-out queries"): how many statements touch each
// distributed table, and how many of them are fixed to one logical shard.
//
// Loaded with shared_preload_libraries = 'sharding', _PG_init asks for a
// small shared memory area and installs two hooks, each chained to whatever
// hook was there before (pg_stat_statements and others keep working):
//
//  - ExecutorStart: once per execution of every statement (prepared
//    statements each time, statements inside PL/pgSQL and SQL functions
//    too), after the plan is ready, walk the plan tree. Each scan of a
//    distributed table is classified by its conditions on the key column;
//    INSERT by the key values of the rows it inserts. One count per
//    distributed table per statement.
//  - ProcessUtility: COPY to or from a distributed table counts as fan-out
//    (a COPY may carry any keys).
//
// The counters: a shared hash table of at most sharding.fanout_max
// (database, table) entries, each with pg_atomic_uint64 counters; counting
// takes the table's lock in shared mode and adds atomically. When every
// entry is taken, the least-used tables are evicted, as pg_stat_statements
// evicts statements, and counted (fanout_info()). See "Shared memory" below.
//
// Which tables are distributed is read from sharding.distributed_tables into
// a per-backend hash (by relation oid), rebuilt after a relcache invalidation
// of that table, of sharding.maps, or of a cached table (rename, drop). A
// trigger on sharding.distributed_tables (sql/install/80_observe.sql) sends that
// invalidation on every change. Key values are compared by hash; a map's
// logical shard count is read from sharding.maps only when two different
// values must be placed (IN lists, OR), so plain statements never read it.
//
// This file holds no owning C++ object: the hooks run inside PostgreSQL's
// executor, where any catalog access may longjmp.
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "pg/cache.hpp"
#include "pg/catalog.hpp"
#include "pg/keys.hpp"
#include "pg/shmem.hpp"
#include "core/hash_core.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/parallel.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "nodes/nodeFuncs.h"
#include "nodes/pathnodes.h"
#include "nodes/plannodes.h"
#include "parser/parsetree.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/pg_locale.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}

namespace sharding {
void fanout_init();
}

namespace {

// ---------------------------------------------------------------------------
// Shared memory: the counters.
//
// A shared hash table (dynahash), as pg_stat_statements keeps, of at most
// sharding.fanout_max (database, table) entries, plus one marker per
// database (rel 0) holding its last reset time and how many of its tables
// were evicted since. One LWLock: counting holds it shared (an atomic add on
// an entry that exists), creating or removing entries holds it exclusive.
// When a new table finds every entry taken, the least-used 5% of the tables
// (at least one) are evicted first, pg_stat_statements' rule: usage is the
// number of statements counted, decayed by 0.99 at every eviction, so a
// table that was busy long ago eventually gives way.
//
// Each backend remembers the entry of each table it counts, with the
// generation it found it in; removing entries raises the generation, so a
// remembered entry is used only while no entry can have been removed since.

int fanout_max = 4096;                 // GUC sharding.fanout_max (PGC_POSTMASTER)
constexpr int kMarkerReserve = 64;     // room for database markers besides the tables
constexpr double kUsageDecay = 0.99;   // as pg_stat_statements' USAGE_DECREASE_FACTOR
constexpr int kEvictPercent = 5;       // as its USAGE_DEALLOC_PERCENT

struct EntryKey {
    Oid db;
    Oid rel;  // InvalidOid: the database's marker
};

struct Entry {
    EntryKey key;  // hash key
    pg_atomic_uint64 single_shard;
    pg_atomic_uint64 fan_out;
    // The rest is written under the exclusive lock only.
    TimestampTz since;  // tables: counted since; markers: the last reset (0: never)
    double usage;       // tables: decayed statement count, as of the last eviction
    uint64 seen;        // tables: single_shard + fan_out at the last eviction
    uint64 evicted;     // markers: tables of this database evicted since its last reset
};

struct Shared {
    LWLock *lock;
    TimestampTz started;
    uint64 generation;   // raised whenever entries are removed
    int32 tables;        // table entries (markers not included)
    uint64 evicted_all;  // table entries evicted since the server started
};

Shared *shared = nullptr;
HTAB *entries = nullptr;
ExecutorStart_hook_type prev_executor_start = nullptr;
ProcessUtility_hook_type prev_process_utility = nullptr;

constexpr const char *kTranche = "sharding fan-out";

Size fanout_shmem_size() {
    return add_size(MAXALIGN(sizeof(Shared)), hash_estimate_size(fanout_max + kMarkerReserve, sizeof(Entry)));
}

void fanout_shmem_attach(void *mem, bool found) {
    shared = static_cast<Shared *>(mem);
    if (!found) {
        shared->lock = &(GetNamedLWLockTranche(kTranche))->lock;
        shared->started = GetCurrentTimestamp();
        shared->generation = 0;
        shared->tables = 0;
        shared->evicted_all = 0;
    }
    HASHCTL info;
    memset(&info, 0, sizeof(info));
    info.keysize = sizeof(EntryKey);
    info.entrysize = sizeof(Entry);
    entries = ShmemInitHash("sharding fan-out entries", fanout_max + kMarkerReserve, fanout_max + kMarkerReserve,
                            &info, HASH_ELEM | HASH_BLOBS);
}

Entry *lookup(Oid db, Oid rel) {
    EntryKey key = {db, rel};
    return static_cast<Entry *>(hash_search(entries, &key, HASH_FIND, nullptr));
}

// The marker of a database, made if missing; nullptr when shared memory is
// out (more databases than the reserve, and no spare memory). Exclusive lock.
Entry *marker_of(Oid db) {
    EntryKey key = {db, InvalidOid};
    bool found;
    auto *m = static_cast<Entry *>(hash_search(entries, &key, HASH_ENTER_NULL, &found));
    if (m && !found) {
        pg_atomic_init_u64(&m->single_shard, 0);
        pg_atomic_init_u64(&m->fan_out, 0);
        m->since = 0;
        m->usage = 0;
        m->seen = 0;
        m->evicted = 0;
    }
    return m;
}

int by_usage(const void *a, const void *b) {
    double ua = (*static_cast<Entry *const *>(a))->usage;
    double ub = (*static_cast<Entry *const *>(b))->usage;
    return ua < ub ? -1 : ua > ub ? 1 : 0;
}

// Evicts the least-used 5% of the table entries (at least one). Exclusive
// lock.
void evict() {
    Entry **all = static_cast<Entry **>(palloc(sizeof(Entry *) * (shared->tables + 1)));
    int n = 0;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    Entry *e;
    while ((e = static_cast<Entry *>(hash_seq_search(&scan))) != nullptr) {
        if (e->key.rel == InvalidOid) continue;
        uint64 total = pg_atomic_read_u64(&e->single_shard) + pg_atomic_read_u64(&e->fan_out);
        e->usage = (e->usage + static_cast<double>(total - e->seen)) * kUsageDecay;
        e->seen = total;
        if (n <= shared->tables) all[n++] = e;
    }
    qsort(all, n, sizeof(Entry *), by_usage);
    int victims = Max(1, n * kEvictPercent / 100);
    for (int i = 0; i < victims && i < n; i++) {
        Oid db = all[i]->key.db;
        hash_search(entries, &all[i]->key, HASH_REMOVE, nullptr);
        shared->tables--;
        shared->evicted_all++;
        Entry *m = marker_of(db);
        if (m) m->evicted++;
    }
    shared->generation++;
    pfree(all);
}

// The entry of (db, rel), made (evicting others first when all are taken)
// if missing; nullptr only when shared memory is out. Exclusive lock.
Entry *entry_for(Oid db, Oid rel) {
    Entry *e = lookup(db, rel);
    if (e) return e;
    if (shared->tables >= fanout_max) evict();
    EntryKey key = {db, rel};
    bool found;
    e = static_cast<Entry *>(hash_search(entries, &key, HASH_ENTER_NULL, &found));
    if (e == nullptr) return nullptr;
    pg_atomic_init_u64(&e->single_shard, 0);
    pg_atomic_init_u64(&e->fan_out, 0);
    e->usage = 0;
    e->seen = 0;
    // A new table counts from its database's last reset, unless tables of
    // that database were evicted since: this one may have been, so it counts
    // from now.
    Entry *m = lookup(db, InvalidOid);
    e->since = m == nullptr ? 0 : m->evicted > 0 ? GetCurrentTimestamp() : m->since;
    shared->tables++;
    return e;
}

// ---------------------------------------------------------------------------
// The per-backend directory of distributed tables.

struct TableEntry {
    Oid relid;       // hash key
    Oid table;       // the distributed table counted (relid itself)
    AttrNumber key;  // attribute number of the key column
    char *map;       // the table's map (in the directory's memory)
    int32 logical;   // its logical shards: -1 not read yet, 0 unknown map
    Entry *slot;     // its counters, found on first use
    uint64 slot_gen;  // the generation slot was found in
};

HTAB *tables = nullptr;
MemoryContext tables_cxt = nullptr;
bool tables_valid = false;
uint64 inval_count = 0;
Oid dt_relid = InvalidOid;    // sharding.distributed_tables
Oid maps_relid = InvalidOid;  // sharding.maps

// Relcache invalidations, dispatched by the cache module (cache.hpp): only
// marks the directory stale.
void fanout_relation_changed(Oid relid) {
    if (relid == InvalidOid || dt_relid == InvalidOid || relid == dt_relid || relid == maps_relid ||
        (tables && hash_search(tables, &relid, HASH_FIND, nullptr))) {
        tables_valid = false;
        inval_count++;
    }
}

const sharding::cache::Kind fanout_kind = {"fan-out tables", fanout_relation_changed, nullptr, 0, {0, 0, 0, 0}};

// Rebuilds the directory from sharding.distributed_tables and sharding.maps
// (read with the catalog snapshot: committed rows, as routing sees them).
void rebuild_tables() {
    uint64 started_at = inval_count;
    if (tables_cxt == nullptr)
        tables_cxt = AllocSetContextCreate(sharding::cache::context(), "sharding fan-out tables", ALLOCSET_SMALL_SIZES);
    if (tables) hash_destroy(tables);
    tables = nullptr;
    MemoryContextReset(tables_cxt);
    tables = sharding::cache::blob_hash(tables_cxt, "sharding fan-out tables", 16, sizeof(Oid), sizeof(TableEntry));

    Oid dt = InvalidOid, maps_rel = InvalidOid;
    Oid nsp = get_namespace_oid("sharding", true);
    if (OidIsValid(nsp)) {
        dt = get_relname_relid("distributed_tables", nsp);
        maps_rel = get_relname_relid("maps", nsp);
    }
    dt_relid = dt;
    maps_relid = maps_rel;
    if (OidIsValid(dt_relid) && OidIsValid(maps_relid)) {
        MemoryContext old = MemoryContextSwitchTo(tables_cxt);
        HeapTuple tup;
        Relation dt = table_open(dt_relid, AccessShareLock);
        SysScanDesc scan = systable_beginscan(dt, InvalidOid, false, nullptr, 0, nullptr);
        while ((tup = systable_getnext(scan)) != nullptr) {
            TupleDesc desc = RelationGetDescr(dt);
            namespace c = sharding::catalog;
            bool n_schema, n_table, n_key, n_map;
            Datum schema_name = heap_getattr(tup, c::Anum_distributed_tables_schema_name, desc, &n_schema);
            Datum table_name = heap_getattr(tup, c::Anum_distributed_tables_table_name, desc, &n_table);
            Datum key_column = heap_getattr(tup, c::Anum_distributed_tables_key_column, desc, &n_key);
            Datum map_name = heap_getattr(tup, c::Anum_distributed_tables_map, desc, &n_map);
            if (n_schema || n_table || n_key || n_map) continue;
            Oid schema = get_namespace_oid(TextDatumGetCString(schema_name), true);
            if (!OidIsValid(schema)) continue;
            Oid rel = get_relname_relid(TextDatumGetCString(table_name), schema);
            if (!OidIsValid(rel)) continue;
            AttrNumber att = get_attnum(rel, TextDatumGetCString(key_column));
            if (att == InvalidAttrNumber) continue;
            char *map = TextDatumGetCString(map_name);
            bool found;
            auto *e = static_cast<TableEntry *>(hash_search(tables, &rel, HASH_ENTER, &found));
            e->table = rel;
            e->key = att;
            e->map = map;
            e->logical = -1;
            e->slot = nullptr;
            e->slot_gen = 0;
        }
        systable_endscan(scan);
        table_close(dt, AccessShareLock);
        MemoryContextSwitchTo(old);
    }
    // An invalidation that arrived while reading leaves the directory stale:
    // it is used for this statement and rebuilt for the next.
    tables_valid = (inval_count == started_at);
}

// The logical shard count of an entry's map, read from sharding.maps the
// first time a statement needs it (to tell whether two key values share a
// shard); most statements never do, and so never read the table.
int32 logical_of(TableEntry *e) {
    if (e->logical >= 0) return e->logical;
    e->logical = 0;
    if (!OidIsValid(maps_relid)) return 0;
    Relation maps = table_open(maps_relid, AccessShareLock);
    SysScanDesc scan = systable_beginscan(maps, InvalidOid, false, nullptr, 0, nullptr);
    HeapTuple tup;
    while ((tup = systable_getnext(scan)) != nullptr) {
        bool n1, n2;
        Datum name = heap_getattr(tup, sharding::catalog::Anum_maps_map, RelationGetDescr(maps), &n1);
        Datum size = heap_getattr(tup, sharding::catalog::Anum_maps_logical_shards, RelationGetDescr(maps), &n2);
        if (n1 || n2) continue;
        char *str = TextDatumGetCString(name);
        if (strcmp(str, e->map) == 0) e->logical = DatumGetInt32(size);
        pfree(str);
    }
    systable_endscan(scan);
    table_close(maps, AccessShareLock);
    return e->logical;
}

// ---------------------------------------------------------------------------
// Classifying conditions: the set of logical shards a condition lets a scan
// reach, kept only as "none", "one (which)", "several" or "any".

enum class Reach { None, One, Many, Any };
struct Shards {
    Reach reach;
    int32 shard;    // for One: the logical shard, or -1 when not computed
    bool hashed;    // for One: the value's hash is known
    uint64_t hash;  // its hash64 (equal values, equal hashes)
};

constexpr Shards kAny = {Reach::Any, -1, false, 0};
constexpr Shards kNone = {Reach::None, -1, false, 0};
constexpr Shards kMany = {Reach::Many, -1, false, 0};
constexpr Shards kOneUnknown = {Reach::One, -1, false, 0};  // one value, not known here

Shards one_value(uint64_t h) { return {Reach::One, -1, true, h}; }

// Whether two single values lie in the same logical shard of the table's
// map: equal hashes do; otherwise the shards are computed (which reads the
// map's shard count once). -1: not known (a value not seen here).
int same_shard(TableEntry *e, Shards &a, Shards &b) {
    if (!a.hashed || !b.hashed) return -1;
    if (a.hash == b.hash) return 1;
    int32 logical = logical_of(e);
    if (logical < 1) return -1;
    if (a.shard < 0) a.shard = sharding::shard_from_hash(a.hash, logical);
    if (b.shard < 0) b.shard = sharding::shard_from_hash(b.hash, logical);
    return a.shard == b.shard ? 1 : 0;
}

Shards both(TableEntry *e, Shards a, Shards b) {  // AND
    if (a.reach == Reach::Any) return b;
    if (b.reach == Reach::Any) return a;
    if (a.reach == Reach::None || b.reach == Reach::None) return kNone;
    if (a.reach == Reach::One && b.reach == Reach::One) {
        int same = same_shard(e, a, b);
        if (same == 0) return kNone;  // two different shards: no row matches
        return a.hashed ? a : b;
    }
    return a.reach == Reach::One ? a : b;  // One and Many: at most one
}

Shards either(TableEntry *e, Shards a, Shards b) {  // OR
    if (a.reach == Reach::Any || b.reach == Reach::Any) return kAny;
    if (a.reach == Reach::None) return b;
    if (b.reach == Reach::None) return a;
    if (a.reach == Reach::One && b.reach == Reach::One && same_shard(e, a, b) == 1) return a;
    return kMany;
}

// Equality of a shard key with a value of the same key type (or another
// integer width: equal integers widen to the same int64, hence hash alike).
bool is_key_equality(Oid func) {
    switch (func) {
    case F_TEXTEQ:
    case F_BYTEAEQ:
    case F_INT2EQ:
    case F_INT4EQ:
    case F_INT8EQ:
    case F_INT24EQ:
    case F_INT42EQ:
    case F_INT28EQ:
    case F_INT82EQ:
    case F_INT48EQ:
    case F_INT84EQ:
    case F_UUID_EQ:
        return true;
    default:
        return false;
    }
}

// A nondeterministic collation makes '=' match strings with other bytes.
bool collation_ok(Oid coll) {
    if (!OidIsValid(coll) || coll == DEFAULT_COLLATION_OID || coll == C_COLLATION_OID) return true;
    return get_collation_isdeterministic(coll);
}

// One value's shard, as far as known: its hash64 for the key types (the
// logical shard follows from it, as shard_of computes it), else unknown.
Shards value_of(Datum v, Oid type) {
    std::optional<sharding::KeyType> k = sharding::key_type_of(type);
    if (!k) return kOneUnknown;
    uint64_t h;
    switch (*k) {
    case sharding::KeyType::Text:
    case sharding::KeyType::Bytea: {
        struct varlena *p = PG_DETOAST_DATUM_PACKED(v);
        h = sharding::hash_bytes(VARDATA_ANY(p), VARSIZE_ANY_EXHDR(p));
        break;
    }
    case sharding::KeyType::Int2:
        h = sharding::hash_int64(DatumGetInt16(v));
        break;
    case sharding::KeyType::Int4:
        h = sharding::hash_int64(DatumGetInt32(v));
        break;
    case sharding::KeyType::Int8:
        h = sharding::hash_int64(DatumGetInt64(v));
        break;
    case sharding::KeyType::Uuid:
        h = sharding::hash_bytes(DatumGetUUIDP(v)->data, UUID_LEN);
        break;
    default:
        return kOneUnknown;
    }
    return one_value(h);
}

struct Walk {
    QueryDesc *qd;
    PlannedStmt *stmt;
    ParamListInfo params;
    // Distributed tables this statement touches and what it reaches of each.
    static constexpr int kMax = 32;
    int n;
    Oid rel[kMax];
    TableEntry *entry[kMax];
    Shards reach[kMax];
    // The scan being classified.
    Index scanrelid;
    AttrNumber key;
    TableEntry *cur;   // the table being classified
    List *indextlist;  // index-only scan: INDEX_VAR attnos map through it
};

// The value of an external parameter ($1, or a PL/pgSQL variable).
bool param_value(Walk &w, Param *p, Datum *value, bool *isnull, Oid *type) {
    if (p->paramkind != PARAM_EXTERN || w.params == nullptr) return false;
    ParamListInfo params = w.params;
    if (p->paramid <= 0 || p->paramid > params->numParams) return false;
    ParamExternData workspace, *prm;
    if (params->paramFetch != nullptr)
        prm = params->paramFetch(params, p->paramid, false, &workspace);
    else
        prm = &params->params[p->paramid - 1];
    if (prm == nullptr || !OidIsValid(prm->ptype)) return false;
    *value = prm->value;
    *isnull = prm->isnull;
    *type = prm->ptype;
    return true;
}

Node *strip(Node *n) {
    while (n && IsA(n, RelabelType)) n = reinterpret_cast<Node *>(reinterpret_cast<RelabelType *>(n)->arg);
    return n;
}

bool is_key_var(Walk &w, Node *n) {
    n = strip(n);
    if (n == nullptr || !IsA(n, Var)) return false;
    Var *v = reinterpret_cast<Var *>(n);
    if (v->varlevelsup != 0) return false;
    if (v->varno == INDEX_VAR && w.indextlist != NIL) {
        if (v->varattno < 1 || v->varattno > list_length(w.indextlist)) return false;
        auto *tle = static_cast<TargetEntry *>(list_nth(w.indextlist, v->varattno - 1));
        Node *e = strip(reinterpret_cast<Node *>(tle->expr));
        if (e == nullptr || !IsA(e, Var)) return false;
        v = reinterpret_cast<Var *>(e);
    }
    return static_cast<Index>(v->varno) == w.scanrelid && v->varattno == w.key;
}

// The shard a single value expression (a constant or a parameter) lies in.
Shards value_shard(Walk &w, Node *n) {
    n = strip(n);
    if (n == nullptr) return kAny;
    if (IsA(n, Const)) {
        Const *c = reinterpret_cast<Const *>(n);
        if (c->constisnull) return kNone;  // key = NULL matches nothing
        return value_of(c->constvalue, c->consttype);
    }
    if (IsA(n, Param)) {
        Datum v;
        bool isnull;
        Oid type;
        if (!param_value(w, reinterpret_cast<Param *>(n), &v, &isnull, &type))
            return kOneUnknown;
        if (isnull) return kNone;
        return value_of(v, type);
    }
    return kAny;
}

// key = ANY(array): the union of the shards of the array's elements.
Shards array_shards(Walk &w, Datum arr, Oid elemtype) {
    sharding::ArrayElements e = sharding::array_elements(DatumGetArrayTypeP(arr));
    Shards out = kNone;
    for (int i = 0; i < e.count && out.reach != Reach::Many; i++)
        if (!e.nulls[i]) out = either(w.cur, out, value_of(e.values[i], elemtype));
    return out;
}

Shards clause_shards(Walk &w, Node *n);

Shards list_shards(Walk &w, List *quals) {  // an implicit AND
    Shards out = kAny;
    ListCell *lc;
    foreach (lc, quals) out = both(w.cur, out, clause_shards(w, static_cast<Node *>(lfirst(lc))));
    return out;
}

Shards clause_shards(Walk &w, Node *n) {
    if (n == nullptr) return kAny;
    if (IsA(n, List)) return list_shards(w, reinterpret_cast<List *>(n));
    if (IsA(n, BoolExpr)) {
        BoolExpr *b = reinterpret_cast<BoolExpr *>(n);
        if (b->boolop == AND_EXPR) return list_shards(w, b->args);
        if (b->boolop == OR_EXPR) {
            Shards out = kNone;
            ListCell *lc;
            foreach (lc, b->args) out = either(w.cur, out, clause_shards(w, static_cast<Node *>(lfirst(lc))));
            return out;
        }
        return kAny;
    }
    if (IsA(n, OpExpr)) {
        OpExpr *op = reinterpret_cast<OpExpr *>(n);
        if (list_length(op->args) != 2) return kAny;
        Oid func = OidIsValid(op->opfuncid) ? op->opfuncid : get_opcode(op->opno);
        if (!is_key_equality(func) || !collation_ok(op->inputcollid)) return kAny;
        Node *l = static_cast<Node *>(linitial(op->args)), *r = static_cast<Node *>(lsecond(op->args));
        if (is_key_var(w, l)) return value_shard(w, r);
        if (is_key_var(w, r)) return value_shard(w, l);
        return kAny;
    }
    if (IsA(n, ScalarArrayOpExpr)) {
        ScalarArrayOpExpr *op = reinterpret_cast<ScalarArrayOpExpr *>(n);
        if (!op->useOr || list_length(op->args) != 2) return kAny;
        Oid func = OidIsValid(op->opfuncid) ? op->opfuncid : get_opcode(op->opno);
        if (!is_key_equality(func) || !collation_ok(op->inputcollid)) return kAny;
        if (!is_key_var(w, static_cast<Node *>(linitial(op->args)))) return kAny;
        Node *arr = strip(static_cast<Node *>(lsecond(op->args)));
        if (IsA(arr, Const)) {
            Const *c = reinterpret_cast<Const *>(arr);
            if (c->constisnull) return kNone;
            Oid elem = get_element_type(c->consttype);
            if (!OidIsValid(elem)) return kAny;
            return array_shards(w, c->constvalue, elem);
        }
        if (IsA(arr, ArrayExpr)) {
            Shards out = kNone;
            ListCell *lc;
            foreach (lc, reinterpret_cast<ArrayExpr *>(arr)->elements)
                out = either(w.cur, out, value_shard(w, static_cast<Node *>(lfirst(lc))));
            return out;
        }
        if (IsA(arr, Param)) {
            Datum v;
            bool isnull;
            Oid type;
            if (!param_value(w, reinterpret_cast<Param *>(arr), &v, &isnull, &type)) return kAny;
            if (isnull) return kNone;
            Oid elem = get_element_type(type);
            if (!OidIsValid(elem)) return kAny;
            return array_shards(w, v, elem);
        }
        return kAny;
    }
    return kAny;
}

// Records that the statement reaches `s` of table `e`.
void touch(Walk &w, TableEntry *e, Shards s) {
    for (int i = 0; i < w.n; i++) {
        if (w.rel[i] != e->table) continue;
        // A second scan of the same table (a self-join, a subquery): one
        // shard only if both reach the same one.
        Shards a = w.reach[i];
        if (a.reach == Reach::None)
            w.reach[i] = s;
        else if (s.reach == Reach::None) {
        } else if (a.reach == Reach::One && s.reach == Reach::One && same_shard(e, a, s) != 0) {
            w.reach[i] = a.hashed ? a : s;  // same shard, or values not seen here (a parameter)
        } else
            w.reach[i] = kMany;
        return;
    }
    if (w.n == Walk::kMax) return;
    w.rel[w.n] = e->table;
    w.entry[w.n] = e;
    w.reach[w.n] = s;
    w.n++;
}

TableEntry *table_of_rti(Walk &w, Index rti) {
    if (rti == 0 || rti > static_cast<Index>(list_length(w.stmt->rtable))) return nullptr;
    RangeTblEntry *rte = rt_fetch(rti, w.stmt->rtable);
    if (rte->rtekind != RTE_RELATION) return nullptr;
    // A partition is counted as its distributed parent when the parent is
    // the distributed table.
    Oid relid = rte->relid;
    auto *e = static_cast<TableEntry *>(hash_search(tables, &relid, HASH_FIND, nullptr));
    if (e) return e;
    ListCell *lc;
    foreach (lc, w.stmt->appendRelations) {
        AppendRelInfo *ari = static_cast<AppendRelInfo *>(lfirst(lc));
        if (ari->child_relid == rti && ari->parent_relid != rti) return table_of_rti(w, ari->parent_relid);
    }
    return nullptr;
}

void scan_node(Walk &w, Scan *scan, List *quals1, List *quals2, List *indextlist) {
    TableEntry *e = table_of_rti(w, scan->scanrelid);
    if (e == nullptr) return;
    RangeTblEntry *rte = rt_fetch(scan->scanrelid, w.stmt->rtable);
    w.scanrelid = scan->scanrelid;
    w.key = e->key;
    if (rte->relid != e->table) {  // a partition: its own attribute number
        char *name = get_attname(e->table, e->key, true);
        w.key = name ? get_attnum(rte->relid, name) : InvalidAttrNumber;
    }
    w.cur = e;
    w.indextlist = indextlist;
    touch(w, e, both(e, list_shards(w, quals1), list_shards(w, quals2)));
    w.indextlist = NIL;
}

// INSERT: the rows' key values (a single row always lies in one shard).
void insert_node(Walk &w, ModifyTable *mt) {
    ListCell *lc;
    foreach (lc, mt->resultRelations) {
        Index rti = static_cast<Index>(lfirst_int(lc));
        TableEntry *e = table_of_rti(w, rti);
        if (e == nullptr) continue;
        Plan *sub = mt->plan.lefttree;
        Shards s = kAny;
        w.cur = e;
        TargetEntry *keytle = nullptr;
        if (sub) {
            ListCell *t;
            foreach (t, sub->targetlist) {
                auto *tle = static_cast<TargetEntry *>(lfirst(t));
                if (tle->resno == e->key && !tle->resjunk) keytle = tle;
            }
        }
        if (sub && IsA(sub, Result) && sub->lefttree == nullptr) {
            s = keytle ? value_shard(w, reinterpret_cast<Node *>(keytle->expr)) : kAny;
            if (s.reach == Reach::Any || s.reach == Reach::Many) s = kOneUnknown;
        } else if (sub && IsA(sub, ValuesScan) && keytle) {
            Node *e2 = strip(reinterpret_cast<Node *>(keytle->expr));
            List *rows = reinterpret_cast<ValuesScan *>(sub)->values_lists;
            if (e2 && IsA(e2, Var) && reinterpret_cast<Var *>(e2)->varattno >= 1) {
                int col = reinterpret_cast<Var *>(e2)->varattno - 1;
                s = kNone;
                ListCell *r;
                foreach (r, rows) {
                    List *row = static_cast<List *>(lfirst(r));
                    if (col >= list_length(row)) {
                        s = kAny;
                        break;
                    }
                    Shards v = value_shard(w, static_cast<Node *>(list_nth(row, col)));
                    if (v.reach == Reach::Any) v = kMany;
                    s = either(e, s, v);
                }
                // Several rows of unknown shard (defaults, expressions).
                if (s.reach == Reach::One && !s.hashed && list_length(rows) > 1) s = kMany;
            } else
                s = list_length(rows) == 1 ? kOneUnknown : kAny;
        }
        touch(w, e, s);
    }
}

void walk_plan(Walk &w, Plan *plan);

void walk_list(Walk &w, List *plans) {
    ListCell *lc;
    foreach (lc, plans) walk_plan(w, static_cast<Plan *>(lfirst(lc)));
}

// The children a plan node keeps in a list rather than in lefttree and
// righttree (the nodes of this kind that can run under a counted statement).
List *child_plans(Plan *plan) {
    switch (nodeTag(plan)) {
    case T_Append: return reinterpret_cast<Append *>(plan)->appendplans;
    case T_MergeAppend: return reinterpret_cast<MergeAppend *>(plan)->mergeplans;
    case T_BitmapAnd: return reinterpret_cast<BitmapAnd *>(plan)->bitmapplans;
    case T_BitmapOr: return reinterpret_cast<BitmapOr *>(plan)->bitmapplans;
    case T_CustomScan: return reinterpret_cast<CustomScan *>(plan)->custom_plans;
    default: return NIL;
    }
}

void walk_plan(Walk &w, Plan *plan) {
    if (plan == nullptr) return;
    check_stack_depth();
    switch (nodeTag(plan)) {
    case T_SeqScan:
    case T_SampleScan:
    case T_TidScan:
    case T_TidRangeScan:
        scan_node(w, reinterpret_cast<Scan *>(plan), plan->qual, NIL, NIL);
        break;
    case T_IndexScan:
        scan_node(w, reinterpret_cast<Scan *>(plan), reinterpret_cast<IndexScan *>(plan)->indexqualorig,
                  plan->qual, NIL);
        break;
    case T_IndexOnlyScan: {
        IndexOnlyScan *ios = reinterpret_cast<IndexOnlyScan *>(plan);
        scan_node(w, reinterpret_cast<Scan *>(plan), ios->indexqual, plan->qual, ios->indextlist);
        break;
    }
    case T_BitmapHeapScan:
        scan_node(w, reinterpret_cast<Scan *>(plan), reinterpret_cast<BitmapHeapScan *>(plan)->bitmapqualorig,
                  plan->qual, NIL);
        break;
    case T_ForeignScan:
    case T_CustomScan:
        if (reinterpret_cast<Scan *>(plan)->scanrelid > 0)
            scan_node(w, reinterpret_cast<Scan *>(plan), plan->qual, NIL, NIL);
        break;
    case T_ModifyTable: {
        ModifyTable *mt = reinterpret_cast<ModifyTable *>(plan);
        if (mt->operation == CMD_INSERT) insert_node(w, mt);
        break;
    }
    case T_SubqueryScan:
        walk_plan(w, reinterpret_cast<SubqueryScan *>(plan)->subplan);
        break;
    default:
        break;
    }
    walk_list(w, child_plans(plan));
    walk_plan(w, plan->lefttree);
    walk_plan(w, plan->righttree);
}

// Counts one statement for each of n tables: under the shared lock where
// their entries exist, then under the exclusive lock for those that need
// one made.
void count(TableEntry **es, const bool *single, int n) {
    bool missing[Walk::kMax + 1];
    int nmissing = 0;
    LWLockAcquire(shared->lock, LW_SHARED);
    for (int i = 0; i < n; i++) {
        TableEntry *e = es[i];
        if (e->slot == nullptr || e->slot_gen != shared->generation) {
            e->slot = lookup(MyDatabaseId, e->table);
            e->slot_gen = shared->generation;
        }
        missing[i] = e->slot == nullptr;
        if (missing[i])
            nmissing++;
        else
            pg_atomic_fetch_add_u64(single[i] ? &e->slot->single_shard : &e->slot->fan_out, 1);
    }
    LWLockRelease(shared->lock);
    if (nmissing == 0) return;
    LWLockAcquire(shared->lock, LW_EXCLUSIVE);
    for (int i = 0; i < n; i++) {
        if (!missing[i]) continue;
        TableEntry *e = es[i];
        e->slot = entry_for(MyDatabaseId, e->table);
        // A later eviction in this loop raises the generation: this entry is
        // then looked up again before its next use.
        e->slot_gen = shared->generation;
        if (e->slot) pg_atomic_fetch_add_u64(single[i] ? &e->slot->single_shard : &e->slot->fan_out, 1);
    }
    LWLockRelease(shared->lock);
}

bool tables_ready() {
    if (!tables_valid) rebuild_tables();
    return tables != nullptr && hash_get_num_entries(tables) > 0;
}

void count_statement(QueryDesc *qd) {
    PlannedStmt *stmt = qd->plannedstmt;
    if (stmt == nullptr || stmt->commandType == CMD_UTILITY) return;
    if (!tables_ready()) return;
    Walk w;
    memset(&w, 0, sizeof(w));
    w.qd = qd;
    w.stmt = stmt;
    w.params = qd->params;
    walk_plan(w, stmt->planTree);
    walk_list(w, stmt->subplans);
    bool single[Walk::kMax];
    for (int i = 0; i < w.n; i++) single[i] = w.reach[i].reach == Reach::One || w.reach[i].reach == Reach::None;
    if (w.n > 0) count(w.entry, single, w.n);
}

void fanout_executor_start(QueryDesc *qd, int eflags) {
    if (prev_executor_start)
        prev_executor_start(qd, eflags);
    else
        standard_ExecutorStart(qd, eflags);
    // Not for EXPLAIN without ANALYZE (nothing runs) nor for the workers of
    // a parallel query (the leader counts it once).
    if ((eflags & EXEC_FLAG_EXPLAIN_ONLY) || IsParallelWorker() || shared == nullptr) return;
    count_statement(qd);
}

void fanout_process_utility(PlannedStmt *pstmt, const char *query, bool read_only_tree,
                            ProcessUtilityContext context, ParamListInfo params, QueryEnvironment *env,
                            DestReceiver *dest, QueryCompletion *qc) {
    if (prev_process_utility)
        prev_process_utility(pstmt, query, read_only_tree, context, params, env, dest, qc);
    else
        standard_ProcessUtility(pstmt, query, read_only_tree, context, params, env, dest, qc);
    Node *n = pstmt->utilityStmt;
    if (n == nullptr || !IsA(n, CopyStmt) || shared == nullptr) return;
    CopyStmt *copy = reinterpret_cast<CopyStmt *>(n);
    if (copy->relation == nullptr) return;  // COPY (query) TO: counted by the executor
    Oid relid = RangeVarGetRelid(copy->relation, NoLock, true);
    if (!OidIsValid(relid) || !tables_ready()) return;
    auto *e = static_cast<TableEntry *>(hash_search(tables, &relid, HASH_FIND, nullptr));
    if (e) {
        bool single = false;
        count(&e, &single, 1);
    }
}

}  // namespace

namespace sharding {

// Called from _PG_init: hooks only when preloaded (shared memory can only be
// had then); loaded later in a backend, the counters are simply absent.
void fanout_init() {
    // A PGC_POSTMASTER setting can only be defined while preloading (as
    // pg_stat_statements.max): loaded later, the counters are absent anyway.
    if (!process_shared_preload_libraries_in_progress) return;
    DefineCustomIntVariable("sharding.fanout_max", "Tables whose fan-out statements are counted at most.",
                            "Each (database, distributed table) counted takes one entry of shared memory; when "
                            "all are taken, the least-used tables are evicted (sharding.fanout_info() counts "
                            "them).",
                            &fanout_max, 4096, 16, INT_MAX / 2, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
    shmem::add({"sharding fan-out counters", sizeof(Shared), fanout_shmem_size, kTranche, fanout_shmem_attach});
    prev_executor_start = ExecutorStart_hook;
    ExecutorStart_hook = fanout_executor_start;
    prev_process_utility = ProcessUtility_hook;
    ProcessUtility_hook = fanout_process_utility;
    sharding::cache::register_kind(&fanout_kind);
}

}  // namespace sharding

namespace {
void notice_off() {
    ereport(NOTICE, (errmsg("fan-out counting is off: sharding is not in shared_preload_libraries"),
                     errdetail("The counters live in shared memory, which is only available to a library "
                               "loaded at server start."),
                     errhint("Add 'sharding' to shared_preload_libraries in postgresql.conf and restart "
                             "the server.")));
}

// The result set of _fanout_counts and fanout_info, or nullptr (after the
// NOTICE) when the counters are off.
ReturnSetInfo *counters_result(FunctionCallInfo fcinfo) {
    InitMaterializedSRF(fcinfo, 0);
    if (shared == nullptr) {
        notice_off();
        return nullptr;
    }
    return reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
}

// One row of four non-NULL columns.
void put_row(ReturnSetInfo *rsinfo, Datum (&values)[4]) {
    bool nulls[4] = {false, false, false, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}
}  // namespace

/*
 * _fanout_counts() RETURNS TABLE(relid oid, single_shard bigint, fan_out bigint, since timestamptz)
 *
 * Internal, for the view fanout_stats: the counters of this database, plus a
 * row with relid 0 whose since is the database's last reset (or the server's
 * start). Without preload: a NOTICE and no row.
 */
SHARDING_FUNCTION(sharding__fanout_counts) {
    ReturnSetInfo *rsinfo = counters_result(fcinfo);
    if (rsinfo == nullptr) return (Datum)0;
    LWLockAcquire(shared->lock, LW_SHARED);
    Entry *marker = lookup(MyDatabaseId, InvalidOid);
    TimestampTz db_since = marker && marker->since != 0 ? marker->since : shared->started;
    {
        Datum values[4] = {ObjectIdGetDatum(InvalidOid), Int64GetDatum(0), Int64GetDatum(0),
                           TimestampTzGetDatum(db_since)};
        put_row(rsinfo, values);
    }
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    Entry *e;
    while ((e = static_cast<Entry *>(hash_seq_search(&scan))) != nullptr) {
        if (e->key.db != MyDatabaseId || e->key.rel == InvalidOid) continue;
        Datum values[4] = {ObjectIdGetDatum(e->key.rel),
                           Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&e->single_shard))),
                           Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&e->fan_out))),
                           TimestampTzGetDatum(e->since != 0 ? e->since : shared->started)};
        put_row(rsinfo, values);
    }
    LWLockRelease(shared->lock);
    return (Datum)0;
}

/*
 * fanout_info() RETURNS TABLE(slots integer, used integer, evicted bigint, evicted_all bigint)
 *
 * The counters' capacity (sharding.fanout_max), the tables counted now in
 * all databases, the tables of this database evicted since its last
 * fanout_reset() (or the server's start), and evictions in all databases
 * since the server started. Without preload: a NOTICE and no row.
 */
SHARDING_FUNCTION(sharding_fanout_info) {
    ReturnSetInfo *rsinfo = counters_result(fcinfo);
    if (rsinfo == nullptr) return (Datum)0;
    LWLockAcquire(shared->lock, LW_SHARED);
    Entry *marker = lookup(MyDatabaseId, InvalidOid);
    Datum values[4] = {Int32GetDatum(fanout_max), Int32GetDatum(shared->tables),
                       Int64GetDatum(static_cast<int64>(marker ? marker->evicted : 0)),
                       Int64GetDatum(static_cast<int64>(shared->evicted_all))};
    LWLockRelease(shared->lock);
    put_row(rsinfo, values);
    return (Datum)0;
}

/*
 * fanout_reset() RETURNS void
 *
 * Forgets this database's counters (their entries are freed for any
 * database); since becomes now and the database's eviction count zero.
 * Without preload: a NOTICE, nothing to reset.
 */
SHARDING_FUNCTION(sharding_fanout_reset) {
    (void)fcinfo;
    if (shared == nullptr) {
        notice_off();
        PG_RETURN_VOID();
    }
    TimestampTz now = GetCurrentTimestamp();
    LWLockAcquire(shared->lock, LW_EXCLUSIVE);
    Entry *marker = marker_of(MyDatabaseId);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    Entry *e;
    // dynahash allows removing the entry just returned by a sequential scan.
    while ((e = static_cast<Entry *>(hash_seq_search(&scan))) != nullptr) {
        if (e->key.db != MyDatabaseId || e->key.rel == InvalidOid) continue;
        hash_search(entries, &e->key, HASH_REMOVE, nullptr);
        shared->tables--;
    }
    shared->generation++;
    if (marker) {
        marker->since = now;
        marker->evicted = 0;
    }
    LWLockRelease(shared->lock);
    if (marker == nullptr)
        ereport(WARNING, (errmsg("fan-out counters of this database were reset, but their new start was not kept"),
                          errdetail("Shared memory for per-database records is exhausted."),
                          errhint("Raise sharding.fanout_max.")));
    PG_RETURN_VOID();
}

/*
 * _fanout_changed() RETURNS trigger
 *
 * Trigger on sharding.distributed_tables (row and TRUNCATE): every backend
 * rebuilds its directory of distributed tables after the change commits.
 */
SHARDING_FUNCTION(sharding__fanout_changed) {
    if (!CALLED_AS_TRIGGER(fcinfo))
        sharding::fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "_fanout_changed must be called as a trigger");
    TriggerData *td = reinterpret_cast<TriggerData *>(fcinfo->context);
    CacheInvalidateRelcacheByRelid(RelationGetRelid(td->tg_relation));
    if (TRIGGER_FIRED_FOR_ROW(td->tg_event))
        return PointerGetDatum(TRIGGER_FIRED_BY_DELETE(td->tg_event) ? td->tg_trigtuple : td->tg_newtuple ? td->tg_newtuple : td->tg_trigtuple);
    return PointerGetDatum(nullptr);
}
