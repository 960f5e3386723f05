// The move engine's output plugin (docs/moves.md): pgoutput, with its change
// callback wrapped so that only the moving shard's changes leave the source.
//
// A move's slot is created with plugin "sharding" (this library). Its
// _PG_output_plugin_init loads pgoutput's, keeps pgoutput's callbacks and
// puts a filter in front of the change callback: a change whose key is not
// in the moving shard is dropped before pgoutput encodes it. The wire
// format is pgoutput's, so the destination applies with a plain
// subscription (no trigger, no upsert).
//
// The decoder learns what moves from its slot's row in
// sharding.move_decoding, a user_catalog_table (decoding may read it under
// the historic snapshot), written at the source before the slot is made:
// map, shard count, logical shard, isolate's key, the pinned keys a shard
// move leaves behind, the tables and their key columns.
//
// What a change carries: INSERT the new row, UPDATE the new row and (when
// the key is in the replica identity and changed) the old key, DELETE the
// old key's replica identity. An UPDATE whose old key is outside the shard
// and whose new key is inside is sent as an INSERT of the new row; the
// reverse as a DELETE of the old row. Where the old key is not in the
// replica identity, the guard refuses key changes into or out of a moving
// shard at the source for the time of the move (src/datanode/guard.cpp), so
// the new key decides. A move refuses to start unless each table's (and
// each leaf partition's) replica identity carries the key, and fails at
// the cutover if one changed meanwhile: a DELETE's old tuple has the key,
// and one without it (a NULL key, in no shard) is not sent. Sent, the
// destination would delete by its primary key whatever row of its own has
// that key. Changes under the engine's own replication origins are never
// sent (change_travels): its deletes and other moves' applies; other
// origins' changes are.
//
// A partitioned table's changes arrive on its leaf partitions: each is
// mapped to its ancestor among the move's tables (table_of), and the
// publication publishes them as the ancestor's (publish_via_partition_root).
//
// Large transactions streamed before they commit (a subscription with
// streaming on; the engine's is off) go through the same filter.
//
// The stream lives only as long as the move's controller: before a change
// is sent (at most every kControllerCheckMs) the decoder checks that the
// coordinator's connection to this node still holds the controller lock
// (move_controller.hpp), and ends the stream with an error otherwise.
//
// Callbacks are called by PostgreSQL directly (not through guarded()): this
// file is C-style code, no C++ object owns anything, ereport is allowed.
#include "pg/pg.hpp"
#include "core/hash_core.hpp"
#include "datanode/move_controller.hpp"
#include "pg/cache.hpp"
#include "pg/catalog.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_subscription.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "replication/logical.h"
#include "replication/origin.h"
#include "replication/output_plugin.h"
#include "replication/reorderbuffer.h"
#include "replication/slot.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}

#include <cstring>

namespace {

struct MoveTable {
    Oid relid;
    char *key_column;
    AttrNumber key_att;  // resolved on first use (0: not yet)
    Oid key_type;        // base type
};

struct MoveConfig {
    bool loaded;
    int32 shards;
    int32 logical;
    char *key;  // isolate: the one key; NULL for a shard move
    int npins;
    char **pins;  // sorted (strcmp), no NULL
    int ntables;
    MoveTable *tables;
    int32 controller_key;  // hashtext(slot name): the controller lock's key
};

MoveConfig config;
TimestampTz controller_seen = 0;  // when the controller was last seen
LogicalDecodeChangeCB pgoutput_change = nullptr;
LogicalDecodeStreamChangeCB pgoutput_stream_change = nullptr;
LogicalDecodeShutdownCB pgoutput_shutdown = nullptr;
MemoryContext config_cxt = nullptr;

char *text_copy(Datum d) {
    text *t = DatumGetTextPP(d);
    int len = VARSIZE_ANY_EXHDR(t);
    char *out = static_cast<char *>(MemoryContextAlloc(config_cxt, len + 1));
    memcpy(out, VARDATA_ANY(t), len);
    out[len] = '\0';
    return out;
}

int compare_pins(const void *a, const void *b) {
    return strcmp(*static_cast<char *const *>(a), *static_cast<char *const *>(b));
}

char **text_array(Datum d, int *n) {
    ArrayType *a = DatumGetArrayTypeP(d);
    Datum *elems;
    bool *nulls;
    deconstruct_array(a, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, n);
    char **out = static_cast<char **>(MemoryContextAllocZero(config_cxt, sizeof(char *) * (*n + 1)));
    for (int i = 0; i < *n; i++) out[i] = nulls[i] ? nullptr : text_copy(elems[i]);
    return out;
}

// Reads the slot's row of sharding.move_decoding under the historic
// (catalog) snapshot; its columns are numbered in src/pg/catalog.hpp.
void load_config(LogicalDecodingContext *ctx) {
    using namespace sharding::catalog;
    if (config.loaded) return;
    if (config_cxt == nullptr) config_cxt = AllocSetContextCreate(ctx->context, "sharding move decoder", ALLOCSET_SMALL_SIZES);
    const char *slot = NameStr(ctx->slot->data.name);
    Oid nsp = get_namespace_oid("sharding", false);
    Oid relid = get_relname_relid("move_decoding", nsp);
    if (!OidIsValid(relid)) ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE), errmsg("sharding.move_decoding does not exist")));
    Relation rel = table_open(relid, AccessShareLock);
    SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
    TupleDesc desc = RelationGetDescr(rel);
    bool found = false;
    for (HeapTuple tup; (tup = systable_getnext(scan)) != NULL;) {
        bool isnull;
        Datum s = heap_getattr(tup, Anum_move_decoding_slot, desc, &isnull);
        if (isnull) continue;
        char *name = TextDatumGetCString(s);
        bool match = strcmp(name, slot) == 0;
        pfree(name);
        if (!match) continue;
        config.shards = DatumGetInt32(heap_getattr(tup, Anum_move_decoding_shards, desc, &isnull));
        config.logical = DatumGetInt32(heap_getattr(tup, Anum_move_decoding_logical, desc, &isnull));
        Datum k = heap_getattr(tup, Anum_move_decoding_key, desc, &isnull);
        config.key = isnull ? nullptr : text_copy(k);
        Datum p = heap_getattr(tup, Anum_move_decoding_pins, desc, &isnull);
        config.pins = isnull ? nullptr : text_array(p, &config.npins);
        if (isnull) config.npins = 0;
        // Sorted, without NULLs, for a binary search per change.
        int kept = 0;
        for (int i = 0; i < config.npins; i++)
            if (config.pins[i] != nullptr) config.pins[kept++] = config.pins[i];
        config.npins = kept;
        if (kept > 1) qsort(config.pins, kept, sizeof(char *), compare_pins);
        Datum t = heap_getattr(tup, Anum_move_decoding_tables, desc, &isnull);
        Datum c = heap_getattr(tup, Anum_move_decoding_key_columns, desc, &isnull);
        ArrayType *ta = DatumGetArrayTypeP(t);
        Datum *oids;
        bool *onulls;
        int n;
        deconstruct_array(ta, OIDOID, sizeof(Oid), true, TYPALIGN_INT, &oids, &onulls, &n);
        int nc = 0;
        char **cols = text_array(c, &nc);
        if (nc != n) ereport(ERROR, (errmsg("sharding.move_decoding of slot \"%s\": tables and key_columns differ in length", slot)));
        config.ntables = n;
        config.tables = static_cast<MoveTable *>(MemoryContextAllocZero(config_cxt, sizeof(MoveTable) * (n + 1)));
        for (int i = 0; i < n; i++) {
            config.tables[i].relid = DatumGetObjectId(oids[i]);
            config.tables[i].key_column = cols[i];
        }
        found = true;
        break;
    }
    systable_endscan(scan);
    table_close(rel, AccessShareLock);
    config.controller_key =
        DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID, CStringGetTextDatum(slot)));
    if (!found)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("slot \"%s\" has no row in sharding.move_decoding", slot),
                        errdetail("Plugin \"sharding\" decodes for an online move only.")));
    config.loaded = true;
}

// Ends the stream (ERROR) unless the move's controller still holds its
// lock here: (kControllerLockClass, hashtext(slot)), taken over the
// coordinator's connection before the slot was made. Taken and let go at
// once if free: nobody holds it (or only this session, which then goes on).
void check_controller(LogicalDecodingContext *ctx) {
    TimestampTz now = GetCurrentTimestamp();
    if (controller_seen != 0 && !TimestampDifferenceExceeds(controller_seen, now, sharding::move::kControllerCheckMs))
        return;
    const char *slot = NameStr(ctx->slot->data.name);
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32)sharding::move::kControllerLockClass, (uint32)config.controller_key, 2);
    LockAcquireResult held = LockAcquire(&tag, ExclusiveLock, true, true);
    if (held == LOCKACQUIRE_NOT_AVAIL) {
        controller_seen = now;
        return;
    }
    LockRelease(&tag, ExclusiveLock, true);
    // Held already by this very session (one that decodes with SQL, as a
    // test does): the controller is here.
    if (held != LOCKACQUIRE_OK) {
        controller_seen = now;
        return;
    }
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("the online move of slot \"%s\" has lost its coordinator", slot),
                    errdetail("The coordinator's session that carries the move out is gone; nothing more is sent."),
                    errhint("The coordinator rolls the move back, or finishes it, when it is up again.")));
}

// The move's entry for a relation whose changes the decoder sees: one of
// the move's tables, or a partition (at any depth) of one. Changes of a
// partitioned table arrive on its leaf partitions, whose column numbers
// may differ from the parent's: each relation's key column is resolved on
// that relation itself. Cached per relation (none: a table of no move),
// forgotten when the relation's catalog entry changes (ATTACH or DETACH
// PARTITION, a column dropped or added), as the decoder replays it.
struct RelEntry {
    Oid relid;  // the hash key
    bool moved;
    MoveTable table;  // the relation's own key column (when moved)
};

HTAB *rel_cache = nullptr;
bool rel_callback_registered = false;

// Any relation's change may be a partition's ATTACH or DETACH, or a
// change of the key column's number: everything is resolved again.
void forget_relations(Datum, Oid) {
    if (rel_cache == nullptr) return;
    HASH_SEQ_STATUS seq;
    hash_seq_init(&seq, rel_cache);
    for (RelEntry *e; (e = static_cast<RelEntry *>(hash_seq_search(&seq))) != nullptr;)
        hash_search(rel_cache, &e->relid, HASH_REMOVE, nullptr);
}

// The cache lives in config_cxt: gone with it (also when a decoding
// through SQL ends in an ERROR and never reaches the shutdown callback),
// so the relcache callback never sees a freed table.
void cache_gone(void *) { rel_cache = nullptr; }

// The index in config.tables of relid, or of its nearest ancestor there; -1.
int move_table_index(Oid relid) {
    for (int i = 0; i < config.ntables; i++)
        if (config.tables[i].relid == relid) return i;
    if (!get_rel_relispartition(relid)) return -1;
    List *ancestors = get_partition_ancestors(relid);
    int found = -1;
    ListCell *lc;
    foreach (lc, ancestors) {
        Oid a = lfirst_oid(lc);
        for (int i = 0; i < config.ntables && found < 0; i++)
            if (config.tables[i].relid == a) found = i;
        if (found >= 0) break;
    }
    list_free(ancestors);
    return found;
}

MoveTable *table_of(Relation rel) {
    Oid relid = RelationGetRelid(rel);
    if (rel_cache == nullptr) {
        rel_cache = sharding::cache::blob_hash(config_cxt, "sharding move decoder relations", 64, sizeof(Oid),
                                               sizeof(RelEntry));
        auto *gone = static_cast<MemoryContextCallback *>(MemoryContextAllocZero(config_cxt, sizeof(MemoryContextCallback)));
        gone->func = cache_gone;
        MemoryContextRegisterResetCallback(config_cxt, gone);
        if (!rel_callback_registered) {
            CacheRegisterRelcacheCallback(forget_relations, (Datum)0);
            rel_callback_registered = true;
        }
    }
    RelEntry *e = static_cast<RelEntry *>(hash_search(rel_cache, &relid, HASH_FIND, nullptr));
    if (e != nullptr) return e->moved ? &e->table : nullptr;
    // Resolved before the entry is made: the catalog lookups may process
    // invalidations, which empty the cache (forget_relations).
    MoveTable t{};
    int i = move_table_index(relid);
    if (i >= 0) {
        t.relid = relid;
        t.key_column = config.tables[i].key_column;
        t.key_att = get_attnum(relid, t.key_column);
        if (t.key_att == InvalidAttrNumber)
            ereport(ERROR, (errmsg("key column \"%s\" of table %u is missing", t.key_column, relid)));
        t.key_type = getBaseType(TupleDescAttr(RelationGetDescr(rel), t.key_att - 1)->atttypid);
    }
    e = static_cast<RelEntry *>(hash_search(rel_cache, &relid, HASH_ENTER, nullptr));
    e->moved = i >= 0;
    e->table = t;
    return e->moved ? &e->table : nullptr;
}

// Keys by value (docs/moves.md, "Keys by value"): isolate's key and the
// pinned keys are text in sharding.move_decoding; they are read once, per
// kind of key type, with that type's input function into the bytes a key
// of the type is compared by: integers (smallint, integer and bigint alike)
// as an int64, a uuid as its 16 bytes, bytea as its bytes (whatever
// bytea_output says, and a spelling in escape form too), text as it is. A
// change's key is compared by the same bytes, never by its output text.
struct KeyBytes {
    Size len;
    const char *data;
};

struct ParsedKeys {
    Oid kind;  // InvalidOid: not parsed yet
    bool has_key;
    KeyBytes key;
    int npins;
    KeyBytes *pins;  // sorted (compare_keys)
};
ParsedKeys parsed;

Oid key_kind(Oid type) {
    switch (type) {
    case INT2OID:
    case INT4OID:
    case INT8OID:
        return INT8OID;
    case UUIDOID:
    case BYTEAOID:
        return type;
    default:
        return TEXTOID;
    }
}

int compare_keys(const void *a, const void *b) {
    const KeyBytes *x = static_cast<const KeyBytes *>(a), *y = static_cast<const KeyBytes *>(b);
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return memcmp(x->data, y->data, x->len);
}

// Text through the input function of the kind (int8in, uuid_in, byteain)
// into config_cxt; false when the type rejects it (such a pin matches no
// key of the type).
bool parse_key(Oid kind, const char *text, KeyBytes *out) {
    if (kind == TEXTOID) {
        out->len = strlen(text);
        out->data = text;
        return true;
    }
    MemoryContext old = MemoryContextSwitchTo(config_cxt);
    volatile bool ok = true;
    PG_TRY();
    {
        if (kind == INT8OID) {
            int64 *v = static_cast<int64 *>(palloc(sizeof(int64)));
            *v = DatumGetInt64(DirectFunctionCall1(int8in, CStringGetDatum(text)));
            out->len = sizeof(int64);
            out->data = reinterpret_cast<const char *>(v);
        } else if (kind == UUIDOID) {
            pg_uuid_t *u = DatumGetUUIDP(DirectFunctionCall1(uuid_in, CStringGetDatum(text)));
            out->len = UUID_LEN;
            out->data = reinterpret_cast<const char *>(u->data);
        } else {
            bytea *b = DatumGetByteaPP(DirectFunctionCall1(byteain, CStringGetDatum(text)));
            out->len = VARSIZE_ANY_EXHDR(b);
            out->data = VARDATA_ANY(b);
        }
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(config_cxt);
        FlushErrorState();
        ok = false;
    }
    PG_END_TRY();
    MemoryContextSwitchTo(old);
    return ok;
}

// isolate's key and the pins, parsed for this kind of key (once; again
// only if a table of another kind comes along).
void parse_keys(Oid kind) {
    if (parsed.kind == kind) return;
    parsed = ParsedKeys{};
    parsed.kind = kind;
    if (config.key != nullptr) parsed.has_key = parse_key(kind, config.key, &parsed.key);
    parsed.pins = static_cast<KeyBytes *>(MemoryContextAllocZero(config_cxt, sizeof(KeyBytes) * (config.npins + 1)));
    for (int i = 0; i < config.npins; i++)
        if (parse_key(kind, config.pins[i], &parsed.pins[parsed.npins])) parsed.npins++;
    if (parsed.npins > 1) qsort(parsed.pins, parsed.npins, sizeof(KeyBytes), compare_keys);
}

// A change's key as the bytes it is compared by; `buf` holds an integer's.
KeyBytes key_bytes(MoveTable *t, Datum key, int64 *buf) {
    KeyBytes k;
    switch (t->key_type) {
    case INT2OID:
        *buf = DatumGetInt16(key);
        break;
    case INT4OID:
        *buf = DatumGetInt32(key);
        break;
    case INT8OID:
        *buf = DatumGetInt64(key);
        break;
    case UUIDOID:
        k.len = UUID_LEN;
        k.data = reinterpret_cast<const char *>(DatumGetUUIDP(key)->data);
        return k;
    default: {  // text and bytea: their bytes
        struct varlena *v = PG_DETOAST_DATUM_PACKED(key);
        k.len = VARSIZE_ANY_EXHDR(v);
        k.data = VARDATA_ANY(v);
        return k;
    }
    }
    k.len = sizeof(int64);
    k.data = reinterpret_cast<const char *>(buf);
    return k;
}

// Whether a key belongs to what the move carries (docs/hashing.md:
// XXH3-64 of the canonical bytes, then modulo the shard count).
bool key_moves(MoveTable *t, Datum key) {
    parse_keys(key_kind(t->key_type));
    int64 buf = 0;
    if (config.key != nullptr) {
        if (!parsed.has_key) return false;
        KeyBytes k = key_bytes(t, key, &buf);
        return compare_keys(&k, &parsed.key) == 0;
    }
    uint64_t h;
    switch (t->key_type) {
    case INT2OID:
        h = sharding::hash_int64(DatumGetInt16(key));
        break;
    case INT4OID:
        h = sharding::hash_int64(DatumGetInt32(key));
        break;
    case INT8OID:
        h = sharding::hash_int64(DatumGetInt64(key));
        break;
    case UUIDOID:
        h = sharding::hash_bytes(DatumGetUUIDP(key)->data, UUID_LEN);
        break;
    default: {  // text and bytea: their bytes
        struct varlena *v = PG_DETOAST_DATUM_PACKED(key);
        h = sharding::hash_bytes(VARDATA_ANY(v), VARSIZE_ANY_EXHDR(v));
        break;
    }
    }
    if (sharding::shard_from_hash(h, config.shards) != config.logical) return false;
    if (parsed.npins == 0) return true;
    KeyBytes k = key_bytes(t, key, &buf);
    return bsearch(&k, parsed.pins, parsed.npins, sizeof(KeyBytes), compare_keys) == nullptr;
}

// -1: the tuple carries no key (not in the replica identity); -2: its key
// is an on-disk TOAST pointer (review RB-8: an UPDATE that left a key
// stored out of line unchanged logs the pointer, not the value, in the new
// tuple; the chunks may be gone by the time the stream decodes it, and
// reading the TOAST table here would not be as of the change anyway), never
// read; else 0/1.
int tuple_moves(MoveTable *t, Relation rel, HeapTuple tup) {
    if (tup == nullptr) return -1;
    bool isnull;
    Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), t->key_att - 1);
    Datum key = heap_getattr(tup, t->key_att, RelationGetDescr(rel), &isnull);
    if (isnull) return -1;
    if (att->attlen == -1 && VARATT_IS_EXTERNAL_ONDISK(DatumGetPointer(key))) return -2;
    return key_moves(t, key) ? 1 : 0;
}

// Whether a replication origin is one of the engine's: a move's deletes
// run under origins named sharding_move_<map>_<logical>[_<part>]
// (move_delete.cpp), and a move's subscription into this node (of another
// shard) applies under pg_<its oid>[_<relid>]. Looked up by the origin's
// id every time (a syscache lookup, only for changes with an origin): an
// origin created after the stream began is known at once, and an id that
// a dropped origin leaves behind is never mistaken for it. Catalog lookups
// need a transaction: this runs in the change callback, never in
// filter_by_origin (called outside one, while the WAL is read).
bool engine_origin(RepOriginId origin_id) {
    char *name = nullptr;
    if (!replorigin_by_oid(origin_id, true, &name) || name == nullptr) return false;
    const bool moves = strncmp(name, "sharding_move_", strlen("sharding_move_")) == 0;
    char *end = nullptr;
    unsigned long sub = !moves && strncmp(name, "pg_", 3) == 0 ? strtoul(name + 3, &end, 10) : 0;
    const bool numbered = sub != 0 && end != name + 3 && (*end == '\0' || *end == '_') && sub <= PG_UINT32_MAX;
    pfree(name);
    if (moves) return true;
    if (!numbered) return false;
    HeapTuple tup = SearchSysCache1(SUBSCRIPTIONOID, ObjectIdGetDatum((Oid)sub));
    if (!HeapTupleIsValid(tup)) return false;
    bool ours = strncmp(NameStr(((Form_pg_subscription)GETSTRUCT(tup))->subname), "sharding_move_",
                        strlen("sharding_move_")) == 0;
    ReleaseSysCache(tup);
    return ours;
}

// The change carries the key only as a TOAST pointer (tuple_moves: -2):
// an error, never a guess. `change` names it ("an insert into"), `detail`
// and `hint` are nullptr where its error has none.
[[noreturn]] void toast_key_error(Relation rel, const MoveTable *t, const char *change, const char *detail,
                                  const char *hint) {
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("%s table \"%s\" carries its key column \"%s\" only as a TOAST pointer", change,
                           RelationGetRelationName(rel), t->key_column),
                    detail ? errdetail("%s", detail) : 0, hint ? errhint("%s", hint) : 0));
    pg_unreachable();
}

const char *const kReplicaIdentityHint = "Make the table's replica identity include the key column.";

// Whether the change travels (possibly turned into an INSERT or a DELETE).
bool change_travels(LogicalDecodingContext *ctx, Relation rel, ReorderBufferChange *change) {
    load_config(ctx);
    // Changes the engine made under its own origins are not the shard's
    // writers': its deletes, or another move's apply into this node (of
    // another shard). Changes of any other origin (a subscription of the
    // user's, a session under pg_replication_origin_session_setup) are rows
    // of the shard like any. (Looked up before table_of: its entry must
    // not meet a catalog lookup's invalidations while it is used.)
    if (change->origin_id != InvalidRepOriginId && engine_origin(change->origin_id)) return false;
    MoveTable *t = table_of(rel);
    if (t == nullptr) return false;  // not a table of the map
    HeapTuple newtup = SHARDING_CHANGE_TUPLE(change->data.tp.newtuple);
    HeapTuple oldtup = SHARDING_CHANGE_TUPLE(change->data.tp.oldtuple);
    switch (change->action) {
    case REORDER_BUFFER_CHANGE_INSERT: {
        int now = tuple_moves(t, rel, newtup);
        if (now == -2)  // (an insert's new chunks are in its transaction, put back by the reorder buffer)
            toast_key_error(rel, t, "an insert into", nullptr, nullptr);
        if (now != 1) return false;
        break;
    }
    case REORDER_BUFFER_CHANGE_UPDATE: {
        int now = tuple_moves(t, rel, newtup);
        int before = tuple_moves(t, rel, oldtup);
        // A key stored out of line and left unchanged: the new tuple has
        // its pointer only; the old tuple (the replica identity, which
        // carries the key: a move refuses a table whose does not) has the
        // value, WAL-logged inline because it is stored externally. The
        // same key, so the same answer. Without it, never a guess.
        if (now == -2 && before >= 0) now = before;
        if (now == -2 || before == -2)
            toast_key_error(rel, t, "an update of",
                            "The move cannot tell which shard the row belongs to; nothing of it was applied.",
                            kReplicaIdentityHint);
        if (now == 1 && before == 0) {
            // The key came into the shard: the destination has no old row.
            change->action = REORDER_BUFFER_CHANGE_INSERT;
        } else if (now != 1 && before == 1) {
            // The key left the shard: the destination's row goes.
            change->action = REORDER_BUFFER_CHANGE_DELETE;
        } else if (now != 1) {
            return false;
        }
        break;
    }
    case REORDER_BUFFER_CHANGE_DELETE: {
        int before = tuple_moves(t, rel, oldtup);
        if (before == -2) toast_key_error(rel, t, "a delete of", nullptr, kReplicaIdentityHint);
        if (before != 1) return false;
        break;
    }
    default:
        break;
    }
    check_controller(ctx);
    return true;
}

void filtered_change(LogicalDecodingContext *ctx, ReorderBufferTXN *txn, Relation rel, ReorderBufferChange *change) {
    if (change_travels(ctx, rel, change)) pgoutput_change(ctx, txn, rel, change);
}

// A large transaction streamed before it commits (a subscription with
// streaming on) goes through the same filter.
void filtered_stream_change(LogicalDecodingContext *ctx, ReorderBufferTXN *txn, Relation rel,
                            ReorderBufferChange *change) {
    if (change_travels(ctx, rel, change)) pgoutput_stream_change(ctx, txn, rel, change);
}

void filtered_shutdown(LogicalDecodingContext *ctx) {
    if (pgoutput_shutdown) pgoutput_shutdown(ctx);
    config = MoveConfig{};
    parsed = ParsedKeys{};
    config_cxt = nullptr;  // a child of ctx->context, freed with it
    rel_cache = nullptr;   // allocated in config_cxt
    controller_seen = 0;
}

}  // namespace

extern "C" {
__attribute__((visibility("default"))) void _PG_output_plugin_init(OutputPluginCallbacks *cb);

void _PG_output_plugin_init(OutputPluginCallbacks *cb) {
    auto init = reinterpret_cast<LogicalOutputPluginInit>(
        load_external_function("pgoutput", "_PG_output_plugin_init", true, NULL));
    init(cb);
    pgoutput_change = cb->change_cb;
    pgoutput_stream_change = cb->stream_change_cb;
    pgoutput_shutdown = cb->shutdown_cb;
    cb->change_cb = filtered_change;
    if (cb->stream_change_cb != nullptr) cb->stream_change_cb = filtered_stream_change;
    cb->shutdown_cb = filtered_shutdown;
    // A decoding that ended in an ERROR (through SQL) never reached the
    // shutdown callback: its context, and config_cxt with it, are gone.
    config = MoveConfig{};
    parsed = ParsedKeys{};
    config_cxt = nullptr;
    rel_cache = nullptr;
    controller_seen = 0;
}
}
