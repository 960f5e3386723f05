// Guarded writes (docs/nodes.md), the data-node side: the guard and the
// local state a follower keeps (its own node name, whether it follows,
// frozen shards).
//
// The guard is a BEFORE ROW trigger (sharding._guard) that attach_node and
// the trigger on sharding.distributed_tables install on every distributed
// table of an attached data node. Per row it costs two routing-cache lookups
// (logical_shard and node_for, the same C functions SQL calls, through
// fmgr), two lock-table probes and a look at a per-backend copy of the local
// state: no SPI. Its enablement is ORIGIN, so logical-replication apply
// (which runs with session_replication_role = replica) is exempt.
//
// Ordering that makes a cutover safe. A guarded write first takes the
// shard's share lock (the lock fence takes: the map-level RowShareLock, then
// the shard's ShareLock). _freeze_shard takes the same shard lock in
// EXCLUSIVE mode, so it waits for writers in flight, and its row in
// sharding.frozen_shards commits before the lock is released. A writer that
// acquires the share lock afresh therefore takes in invalidations
// (AcceptInvalidationMessages) after the lock is granted, and sees the
// frozen row, the new owner, or both.
//
// Everything here is plain C data: no C++ object that owns memory is alive
// while PostgreSQL functions that may raise an ERROR run (boundary.hpp,
// rule 2). User errors are thrown as sharding::Error and raised by guarded().
#include "pg/boundary.hpp"
#include "pg/cache.hpp"
#include "pg/shard_lock.hpp"
#include "remote/move_remote.hpp"
#include "core/hash_core.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "executor/spi.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

}

namespace {

// ------------------------------------------------------------ local state
// this_node(), whether this database follows a coordinator, and the frozen
// shards: read from sharding.local_node and sharding.frozen_shards, rebuilt
// after any change to either (a statement trigger on both sends a relcache
// invalidation of sharding.frozen_shards).
struct Frozen {
    char *map;
    int len;
    int32 logical;
};

struct LocalState {
    bool valid;
    bool following;
    char *node;  // NULL where never attached
    int node_len;
    int nfrozen;
    Frozen *frozen;
    int nmoving;     // shards an online move carries from here (sharding.move_decoding)
    Frozen *moving;
};

// Validity follows the cache module's rule (cache.hpp, "changes"): the
// trigger on both tables notes a change of the local topic, whose commit
// bumps a shared counter that every guarded row compares (one load); without
// preload every check takes in invalidations, and the relcache invalidation
// of sharding.frozen_shards the same trigger registers bumps
// local_generation. The state lives in an entry context of the cache module
// and a replaced one is retired (a caller up the stack may still read it).
uint64 local_generation = 1;  // bumped by the kind's relcache callback
uint64 local_built = 0;       // changes() + local_generation read before the build's snapshot
Oid frozen_relid = InvalidOid;
MemoryContext local_cxt = nullptr;       // holds *local
MemoryContext local_building = nullptr;  // a build under way (or one that failed)
const LocalState empty_local = {};
const LocalState *local = &empty_local;
char *coordinator_dsn = nullptr;  // sharding.coordinator_dsn (read by SQL through current_setting)

void local_invalidate(Oid relid) {
    if (relid == InvalidOid || relid == frozen_relid) local_generation++;
}

const sharding::cache::Kind local_kind = {"local state", local_invalidate, nullptr, 0, {0, 0, 0, 0}};

inline uint64 local_changes() {
    const uint64 shared = sharding::cache::changes(sharding::cache::local_topic);  // may bump local_generation
    return shared + local_generation;
}

Oid lookup_frozen_relid() {
    return get_relname_relid("frozen_shards", get_namespace_oid("sharding", false));
}

char *copy_text(MemoryContext cxt, HeapTuple tup, TupleDesc desc, int col, int *len) {
    bool isnull;
    Datum d = SPI_getbinval(tup, desc, col, &isnull);
    if (isnull) {
        *len = 0;
        return nullptr;
    }
    text *t = DatumGetTextPP(d);
    *len = static_cast<int>(VARSIZE_ANY_EXHDR(t));
    char *out = static_cast<char *>(MemoryContextAlloc(cxt, *len + 1));
    memcpy(out, VARDATA_ANY(t), *len);
    out[*len] = '\0';
    return out;
}

// Runs a query of the local state under snap, at most limit rows (0: all);
// its rows are in SPI_tuptable. May ereport.
void run_local_query(const char *sql, Snapshot snap, long limit) {
    SPIPlanPtr plan = SPI_prepare(sql, 0, nullptr);
    if (plan == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    int rc = SPI_execute_snapshot(plan, nullptr, nullptr, snap, InvalidSnapshot, true, false, limit);
    if (rc != SPI_OK_SELECT) elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
}

// The (map, logical) rows of a query under snap, copied into cxt (one spare
// element, so never an empty allocation); returns how many. May ereport.
int read_shard_list(MemoryContext cxt, const char *sql, Snapshot snap, Frozen **out) {
    run_local_query(sql, snap, 0);
    int n = static_cast<int>(SPI_processed);
    Frozen *list = static_cast<Frozen *>(MemoryContextAllocZero(cxt, sizeof(Frozen) * (n + 1)));
    for (int i = 0; i < n; i++) {
        bool isnull;
        list[i].map = copy_text(cxt, SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &list[i].len);
        list[i].logical = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull));
    }
    *out = list;
    return n;
}

// Rebuilds the local state with the latest committed snapshot. May
// ereport; no C++ object is alive in any caller.
void local_build() {
    frozen_relid = lookup_frozen_relid();  // before the stamp: the callback must know it
    pg_read_barrier();
    const uint64 started = local_changes();
    // A build that failed (ERROR) left its context here; nobody points into it.
    if (local_building != nullptr) MemoryContextDelete(local_building);
    local_building = nullptr;
    MemoryContext cxt = sharding::cache::entry_context("sharding local state");
    local_building = cxt;
    LocalState *fresh = static_cast<LocalState *>(MemoryContextAllocZero(cxt, sizeof(LocalState)));
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Snapshot snap = RegisterSnapshot(IsInParallelMode() ? GetActiveSnapshot() : GetLatestSnapshot());
    run_local_query("SELECT node, following FROM sharding.local_node", snap, 1);
    if (SPI_processed > 0) {
        bool isnull;
        fresh->node = copy_text(cxt, SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &fresh->node_len);
        Datum f = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
        fresh->following = !isnull && DatumGetBool(f) && fresh->node != nullptr;
    }
    fresh->nfrozen = read_shard_list(cxt, "SELECT map, logical FROM sharding.frozen_shards", snap, &fresh->frozen);
    // Shards being moved from this node (1.3; the table may not exist yet
    // in a database not updated).
    if (OidIsValid(get_relname_relid("move_decoding", get_namespace_oid("sharding", false))))
        fresh->nmoving = read_shard_list(cxt, "SELECT map, logical FROM sharding.move_decoding", snap, &fresh->moving);
    UnregisterSnapshot(snap);
    SPI_finish();
    fresh->valid = true;
    // Swapped in last: an ERROR above leaves the previous state in place.
    local_building = nullptr;
    if (local_cxt != nullptr) sharding::cache::retire_context(local_cxt);
    local_cxt = cxt;
    local = fresh;
    local_built = started;  // stale at once if a change committed meanwhile
}

inline const LocalState &local_state() {
    if (!local->valid || local_built != local_changes()) local_build();
    return *local;
}

bool in_shard_list(const Frozen *list, int n, const char *map, size_t len, int32 logical) {
    for (int i = 0; i < n; i++)
        if (list[i].logical == logical && static_cast<size_t>(list[i].len) == len && memcmp(list[i].map, map, len) == 0)
            return true;
    return false;
}

bool is_moving(const LocalState &s, const char *map, size_t len, int32 logical) {
    return in_shard_list(s.moving, s.nmoving, map, len, logical);
}

bool is_frozen(const LocalState &s, const char *map, size_t len, int32 logical) {
    return in_shard_list(s.frozen, s.nfrozen, map, len, logical);
}

// ------------------------------------------------------------ shard locks
// Takes fence's locks (pg/shard_lock.hpp); true if either was not yet held
// by this transaction.
bool lock_shard_shared(const char *map, size_t len, int32 logical) {
    bool fresh = sharding::lock_shard(map, len, sharding::map_level, RowShareLock);
    fresh |= sharding::lock_shard(map, len, static_cast<uint32>(logical), ShareLock);
    return fresh;
}

// ------------------------------------------------------------ the guard
// Per trigger and query execution (fn_extra of the trigger's FmgrInfo, which
// starts NULL in every execution): the map, the key column and the routing
// functions of its type, each with its own FmgrInfo, so that the routing
// cache takes in invalidations once per statement, as it does for SQL calls.
struct GuardQuery {
    Oid relid;
    MemoryContext cxt;  // the trigger's fn_mcxt: lives for the query
    text *map;
    const char *map_name;
    size_t map_len;
    const char *key_column;
    AttrNumber key_att;
    Oid key_type;  // the column's type (for error messages)
    FmgrInfo node_for;
    FmgrInfo logical_shard;
    // Shards whose locks this (sub)transaction is known to hold, so that a
    // statement writing many rows asks the lock manager once per shard.
    // Valid for one (transaction, subtransaction): a lock taken in a
    // subtransaction that aborts is released, and the ids change.
    LocalTransactionId locked_lxid;
    SubTransactionId locked_subxid;
    uint64 *locked;  // bit per logical shard
    int32 locked_words;
};

// Takes the shard's share lock unless this (sub)transaction is known to
// hold it; true if it was acquired afresh (see lock_shard_shared).
bool lock_shard_cached(GuardQuery *g, int32 logical) {
    const LocalTransactionId lxid = sharding::compat::my_local_xid();
    const SubTransactionId subxid = GetCurrentSubTransactionId();
    if (g->locked_lxid != lxid || g->locked_subxid != subxid) {
        if (g->locked != nullptr) memset(g->locked, 0, sizeof(uint64) * g->locked_words);
        g->locked_lxid = lxid;
        g->locked_subxid = subxid;
    }
    const int32 word = logical / 64;
    const uint64 bit = uint64{1} << (logical % 64);
    if (word < g->locked_words && (g->locked[word] & bit) != 0) return false;
    bool fresh = lock_shard_shared(g->map_name, g->map_len, logical);
    if (word >= g->locked_words) {
        int32 words = word + 1;
        uint64 *grown = static_cast<uint64 *>(MemoryContextAllocZero(g->cxt, sizeof(uint64) * words));
        if (g->locked != nullptr) {
            memcpy(grown, g->locked, sizeof(uint64) * g->locked_words);
            pfree(g->locked);
        }
        g->locked = grown;
        g->locked_words = words;
    }
    g->locked[word] |= bit;
    return fresh;
}

GuardQuery *guard_query(FunctionCallInfo fcinfo, TriggerData *td) {
    auto *g = static_cast<GuardQuery *>(fcinfo->flinfo->fn_extra);
    Relation rel = td->tg_relation;
    if (g != nullptr && g->relid == RelationGetRelid(rel)) return g;

    Trigger *trig = td->tg_trigger;
    if (trig->tgnargs != 2)
        sharding::fail(ERRCODE_TRIGGERED_ACTION_EXCEPTION,
                       "sharding._guard needs two arguments (map, key column), got %d", trig->tgnargs);
    MemoryContext cxt = fcinfo->flinfo->fn_mcxt;
    g = static_cast<GuardQuery *>(MemoryContextAllocZero(cxt, sizeof(GuardQuery)));
    g->relid = RelationGetRelid(rel);
    g->cxt = cxt;
    g->map_name = MemoryContextStrdup(cxt, trig->tgargs[0]);
    g->map_len = strlen(g->map_name);
    g->key_column = MemoryContextStrdup(cxt, trig->tgargs[1]);
    {
        MemoryContext old = MemoryContextSwitchTo(cxt);
        g->map = cstring_to_text(g->map_name);
        MemoryContextSwitchTo(old);
    }
    TupleDesc desc = RelationGetDescr(rel);
    g->key_att = InvalidAttrNumber;
    for (int i = 0; i < desc->natts; i++) {
        Form_pg_attribute a = TupleDescAttr(desc, i);
        if (!a->attisdropped && strcmp(NameStr(a->attname), g->key_column) == 0) {
            g->key_att = a->attnum;
            g->key_type = a->atttypid;
            break;
        }
    }
    if (g->key_att == InvalidAttrNumber)
        sharding::fail(ERRCODE_UNDEFINED_COLUMN, "key column \"%s\" of distributed table \"%s\" does not exist",
                       g->key_column, RelationGetRelationName(rel));
    // The SQL routing functions sharding.node_for(text, <key type>) and
    // sharding.logical_shard(...), looked up by signature, so that the
    // guard routes exactly as SQL does, whatever their C symbols.
    Oid base = getBaseType(g->key_type);
    Oid argtypes[2] = {TEXTOID, InvalidOid};
    switch (base) {
        case TEXTOID:
        case VARCHAROID:
            argtypes[1] = TEXTOID;
            break;
        case BYTEAOID:
        case INT2OID:
        case INT4OID:
        case INT8OID:
        case UUIDOID:
            argtypes[1] = base;
            break;
        default:
            sharding::fail(ERRCODE_DATATYPE_MISMATCH,
                           "key column \"%s\" of distributed table \"%s\" is of type %s, not a shard key type",
                           g->key_column, RelationGetRelationName(rel), format_type_be(g->key_type));
    }
    List *nf = list_make2(makeString(pstrdup("sharding")), makeString(pstrdup("node_for")));
    List *ls = list_make2(makeString(pstrdup("sharding")), makeString(pstrdup("logical_shard")));
    fmgr_info_cxt(LookupFuncName(nf, 2, argtypes, false), &g->node_for, cxt);
    fmgr_info_cxt(LookupFuncName(ls, 2, argtypes, false), &g->logical_shard, cxt);
    fcinfo->flinfo->fn_extra = g;
    return g;
}

Datum call2(FmgrInfo *f, Datum a, Datum b) {
    LOCAL_FCINFO(call, 2);
    InitFunctionCallInfoData(*call, f, 2, InvalidOid, nullptr, nullptr);
    call->args[0].value = a;
    call->args[0].isnull = false;
    call->args[1].value = b;
    call->args[1].isnull = false;
    Datum r = FunctionCallInvoke(call);
    if (call->isnull) elog(ERROR, "routing function returned NULL");
    return r;
}

const char *key_out(GuardQuery *g, Datum key) {
    Oid out;
    bool varlena;
    getTypeOutputInfo(g->key_type, &out, &varlena);
    return OidOutputFunctionCall(out, key);
}

// Refuses (55000) the write of one row unless this node owns its key now and
// its shard is not frozen; takes the shard's share lock for an owned key.
void check_row(GuardQuery *g, TriggerData *td, HeapTuple tuple) {
    bool isnull;
    Datum key = heap_getattr(tuple, g->key_att, RelationGetDescr(td->tg_relation), &isnull);
    const char *table = RelationGetRelationName(td->tg_relation);
    if (isnull)
        throw sharding::Error(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                              sharding::format("key \"%s\" of distributed table \"%s\" is NULL: no node owns it",
                                               g->key_column, table),
                              sharding::format("Table \"%s\" is placed by map \"%s\".", table, g->map_name));
    int32 logical = DatumGetInt32(call2(&g->logical_shard, PointerGetDatum(g->map), key));
    if (lock_shard_cached(g, logical)) {
        // Granted afresh: a freeze or a move may have committed while we
        // waited; take in their invalidations before deciding.
        AcceptInvalidationMessages();
    }
    const LocalState &s = local_state();
    if (!s.following) return;  // detached meanwhile
    text *owner = DatumGetTextPP(call2(&g->node_for, PointerGetDatum(g->map), key));
    const size_t owner_len = VARSIZE_ANY_EXHDR(owner);
    if (owner_len != static_cast<size_t>(s.node_len) || memcmp(VARDATA_ANY(owner), s.node, owner_len) != 0) {
        const char *k = key_out(g, key);
        char *o = text_to_cstring(owner);
        throw sharding::Error(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            sharding::format("key \"%s\" of map \"%s\" belongs to node \"%s\", not to this node \"%s\"", k,
                             g->map_name, o, s.node),
            sharding::format("Table \"%s\" is distributed by map \"%s\" (logical shard %d); this node writes only "
                             "the keys it owns.",
                             table, g->map_name, logical),
            sharding::format("Write it on node \"%s\" (route with sharding.node_for or PL/Proxy).", o));
    }
    if (is_frozen(s, g->map_name, g->map_len, logical)) {
        const char *k = key_out(g, key);
        throw sharding::Error(
            ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            sharding::format("key \"%s\" of map \"%s\" is in logical shard %d, which is frozen on node \"%s\"", k,
                             g->map_name, logical, s.node),
            "The shard is being cut over to another node (sharding.frozen_shards).",
            "Retry shortly: after the cutover, route the key again with sharding.node_for.");
    }
}

// A key change from or to a logical shard that an online move is carrying
// from here: refused for the time of the move (the move's decoder may not
// see the old key; see src/datanode/move_decoder.cpp). Also within one shard:
// isolate carries a single key, and a row whose key changes from it to
// another key of the same shard would stay behind, stale, at the
// destination.
void check_key_change(GuardQuery *g, TriggerData *td, Datum old_key, Datum new_key) {
    const LocalState &s = local_state();
    if (s.nmoving == 0) return;
    int32 from = DatumGetInt32(call2(&g->logical_shard, PointerGetDatum(g->map), old_key));
    int32 to = DatumGetInt32(call2(&g->logical_shard, PointerGetDatum(g->map), new_key));
    if (!is_moving(s, g->map_name, g->map_len, from) && !is_moving(s, g->map_name, g->map_len, to)) return;
    const char *k = key_out(g, new_key);  // may ereport: before any C++ object exists
    throw sharding::Error(
        ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        sharding::format("an update of table \"%s\" moves key \"%s\" from logical shard %d to %d of map \"%s\", "
                         "one of which is being moved online",
                         RelationGetRelationName(td->tg_relation), k, from, to, g->map_name),
        "Key changes from or to a shard are refused while the shard moves (sharding.move_decoding).",
        "Retry after the move.");
}

}  // namespace

namespace {

// SHOW sharding.coordinator_dsn and current_setting() (pg_settings does not list it): the
// value as set for a superuser, its password masked for every other role.
// (The engine reads the value itself, not through this.)
const char *show_coordinator_dsn() {
    static std::string shown;
    const char *v = coordinator_dsn != nullptr ? coordinator_dsn : "";
    if (IsTransactionState() && superuser()) return v;
    try {
        shown = sharding::move::mask_password(v);
        return shown.c_str();
    } catch (...) {
        return "********";
    }
}

}  // namespace

namespace sharding {

// Registers the local state's relcache callback and the coordinator_dsn
// setting (shown with its password masked to every role but a superuser);
// called once, from _PG_init.
void guard_init() {
    cache::register_kind(&local_kind);
    DefineCustomStringVariable(
        "sharding.coordinator_dsn", "Connection string data nodes use to reach this coordinator.",
        "attach_node gives it to the node's subscription; when empty, attach_node derives one from this "
        "connection (host, port, database, user).",
        &coordinator_dsn, "", PGC_SUSET,
        // Not in pg_settings: its reset_val and boot_val columns are copied
        // raw, past the show hook, and would hand any role the password of
        // a value set in postgresql.conf, ALTER SYSTEM or ALTER DATABASE.
        GUC_NO_SHOW_ALL, nullptr, nullptr, show_coordinator_dsn);
}
}  // namespace sharding

/*
 * _guard() RETURNS trigger
 *
 * BEFORE INSERT OR UPDATE OR DELETE FOR EACH ROW on a distributed table of an
 * attached data node, with arguments (map, key column). See the top of the
 * file.
 */
SHARDING_FUNCTION(sharding_guard) {
    if (!CALLED_AS_TRIGGER(fcinfo))
        sharding::fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "sharding._guard must be called as a trigger");
    TriggerData *td = reinterpret_cast<TriggerData *>(fcinfo->context);
    if (!TRIGGER_FIRED_BEFORE(td->tg_event) || !TRIGGER_FIRED_FOR_ROW(td->tg_event))
        sharding::fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                       "sharding._guard must be a BEFORE ... FOR EACH ROW trigger");
    HeapTuple result = TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? td->tg_newtuple : td->tg_trigtuple;
    if (!local_state().following) return PointerGetDatum(result);
    GuardQuery *g = guard_query(fcinfo, td);
    if (TRIGGER_FIRED_BY_UPDATE(td->tg_event)) {
        check_row(g, td, td->tg_trigtuple);
        bool old_null, new_null;
        TupleDesc desc = RelationGetDescr(td->tg_relation);
        Datum o = heap_getattr(td->tg_trigtuple, g->key_att, desc, &old_null);
        Datum n = heap_getattr(td->tg_newtuple, g->key_att, desc, &new_null);
        Form_pg_attribute a = TupleDescAttr(desc, g->key_att - 1);
        if (old_null != new_null || (!new_null && !datumIsEqual(o, n, a->attbyval, a->attlen))) {
            check_row(g, td, td->tg_newtuple);
            if (!old_null && !new_null) check_key_change(g, td, o, n);
        }
    } else {
        check_row(g, td, td->tg_trigtuple);
    }
    return PointerGetDatum(result);
}

/*
 * _local_changed() RETURNS trigger
 *
 * Statement trigger on sharding.local_node and sharding.frozen_shards: every
 * backend rebuilds its copy of the local state at its next guarded write
 * after the change commits (cache.hpp, "changes").
 */
SHARDING_FUNCTION(sharding_local_changed) {
    if (!CALLED_AS_TRIGGER(fcinfo))
        sharding::fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "_local_changed must be called as a trigger");
    sharding::cache::note_change(sharding::cache::local_topic, nullptr, 0);
    CacheInvalidateRelcacheByRelid(lookup_frozen_relid());
    return PointerGetDatum(nullptr);
}

// _mask_password(dsn text): text, the connection string with its password
// shown as ******** (what local_node keeps of the coordinator's DSN).
SHARDING_FUNCTION(sharding__mask_password) {
    text *t = PG_GETARG_TEXT_PP(0);
    std::string masked = sharding::move::mask_password(std::string(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t)));
    PG_RETURN_TEXT_P(sharding::pg_call([&] { return cstring_to_text_with_len(masked.data(), (int)masked.size()); }));
}
