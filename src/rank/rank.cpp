// Rank-guarded transitions (docs/rank.md).
//
// A guard is a `BEFORE UPDATE OF col ... FOR EACH ROW` trigger running
// sharding._rank_guard(col, on_regress, rank0, rank1, ...). The trigger's
// arguments carry the whole configuration, so the guard reads no catalog per
// row and travels with the table through pg_dump/restore;
// sharding.rank_guards records the same configuration by name (see
// sql/install/60_rank.sql). Without rank arguments the column is an enum
// ranked by its declared order (pg_enum.enumsortorder).
//
// NULL has no rank and sorts below every rank: NULL may become anything, a
// ranked value may not become NULL. An old value outside the ranks (a row
// written before the guard) is treated like NULL; a new value outside the
// ranks is refused with 22023. A new value byte-equal to the old one always
// passes.
//
// Two per-backend caches, entry kinds of the cache module (src/pg/cache.hpp:
// memory in children of the "sharding cache" context, one relcache and one
// syscache callback, one retirement rule):
//  - guards, by trigger oid: what the trigger needs per row. A trigger's
//    arguments never change under one oid (guard_rank replaces the trigger),
//    so entries go stale only when the table changes (relcache callback) or,
//    for enum columns, when pg_enum changes (syscache callback).
//  - columns, by (table, column): ranks, the prepared UPDATE and the primary
//    key, for rank_of and advance; stale on the same two events.
// Callbacks only mark entries stale; the next lookup rebuilds them. Plans and
// memory of a replaced entry are retired (cache::retire_plan, retire_context)
// and freed only when no call is running, so a nested call (a trigger calling
// advance) never frees what an outer call uses.
//
// Layers (docs/architecture.md): the rank lists are the pure core
// (rank_core.hpp); every call into PostgreSQL is a named C-style glue
// function below (read_column_type, read_enum, read_facts,
// prepare_advance_plan, convert_through_text, run_advance, ...) or a
// PostgreSQL function, called through glue() (boundary.hpp); the C++ caches
// and the entry points sit above them.
#include "pg/boundary.hpp"
#include "pg/cache.hpp"
#include "core/rank_core.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/relation.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/catcache.h"
#include "utils/datum.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"
#include "utils/typcache.h"
}

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sharding {
namespace {

uint64 enum_generation = 1;      // bumped by every pg_enum invalidation
uint64 relcache_generation = 1;  // bumped by every relcache invalidation

// Cached containers live in the cache module's context (cache_alloc.hpp).
struct NameHash {
    size_t operator()(const CacheString &s) const { return std::hash<std::string_view>()({s.data(), s.size()}); }
};
template <class K, class V, class H = std::hash<K>>
using CMap = std::unordered_map<K, V, H, std::equal_to<K>, CacheAllocator<std::pair<const K, V>>>;

enum class Kind { Text, Enum, Other };

// How the guard reads a column's values.
struct ColumnType {
    Oid type = InvalidOid;  // declared type (may be a domain)
    int32 typmod = -1;
    Oid base = InvalidOid;  // base type
    Kind kind = Kind::Other;
    Oid typoutput = InvalidOid, typinput = InvalidOid, typioparam = InvalidOid;
    int16 typlen = -1;
    bool typbyval = false;
    char typalign = 'i';
};

// ---- Glue: C-style functions that call PostgreSQL and may ereport. Their
// parameters and results are plain C values; the C++ code above them calls
// them through glue() (boundary.hpp), which turns an ERROR into PgError, so
// no C++ destructor is ever skipped.

// Fills `out` with how type `type` (a domain, perhaps) is read and written.
void read_column_type(Oid type, int32 typmod, ColumnType *out) {
    bool varlena;
    out->type = type;
    out->typmod = typmod;
    out->base = getBaseType(type);
    getTypeOutputInfo(out->base, &out->typoutput, &varlena);
    getTypeInputInfo(out->base, &out->typinput, &out->typioparam);
    get_typlenbyvalalign(out->base, &out->typlen, &out->typbyval, &out->typalign);
    out->kind = type_is_enum(out->base)                                  ? Kind::Enum
                : (out->base == TEXTOID || out->base == VARCHAROID) ? Kind::Text
                                                                         : Kind::Other;
}

// The members of enum type `enumtype`, from pg_enum. Labels point into
// `*out`'s palloc'd names.
struct EnumList {
    int n;
    Oid *oid;
    float4 *sort;
    NameData *label;
};
void read_enum(Oid enumtype, EnumList *out) {
    CatCList *list = SearchSysCacheList1(ENUMTYPOIDNAME, ObjectIdGetDatum(enumtype));
    out->n = list->n_members;
    out->oid = static_cast<Oid *>(palloc0(sizeof(Oid) * (list->n_members + 1)));
    out->sort = static_cast<float4 *>(palloc0(sizeof(float4) * (list->n_members + 1)));
    out->label = static_cast<NameData *>(palloc0(sizeof(NameData) * (list->n_members + 1)));
    for (int i = 0; i < list->n_members; i++) {
        Form_pg_enum e = reinterpret_cast<Form_pg_enum>(GETSTRUCT(&list->members[i]->tuple));
        out->oid[i] = e->oid;
        out->sort[i] = e->enumsortorder;
        out->label[i] = e->enumlabel;
    }
    ReleaseSysCacheList(list);
}

// Hands a replaced plan and memory context to the cache module's retirement.
void retire_plan_and_context(SPIPlanPtr plan, MemoryContext cxt) {
    cache::retire_plan(plan);
    cache::retire_context(cxt);
}

// The table's facts that a Column needs, gathered from the relcache.
struct Facts {
    bool exists;
    NameData relname, nspname, colname, pk_name;
    Oid atttypid;
    int32 typmod;
    int nargs;  // -1: no guard
    char **args;
    int pk_natts;
    AttrNumber pk_attnum;
    Oid pk_type;
};

// Reads the facts of column `attnum` of table `relid` (already locked):
// its type, the guard trigger on it and the table's primary key. `exists`
// stays false if the table is gone.
void read_facts(Oid relid, AttrNumber attnum, Facts *fp) {
    Relation rel = try_relation_open(relid, NoLock);
    if (rel == nullptr) return;
    fp->exists = true;
    TupleDesc desc = RelationGetDescr(rel);
    Form_pg_attribute att = TupleDescAttr(desc, attnum - 1);
    namestrcpy(&fp->relname, RelationGetRelationName(rel));
    namestrcpy(&fp->nspname, get_namespace_name(RelationGetNamespace(rel)));
    fp->colname = att->attname;
    fp->atttypid = att->atttypid;
    fp->typmod = att->atttypmod;
    fp->nargs = -1;
    Oid guard_fn = LookupFuncName(list_make2(makeString(pstrdup("sharding")), makeString(pstrdup("_rank_guard"))),
                                  0, nullptr, true);
    TriggerDesc *td = rel->trigdesc;
    for (int i = 0; td != nullptr && guard_fn != InvalidOid && i < td->numtriggers; i++) {
        Trigger *t = &td->triggers[i];
        if (t->tgfoid == guard_fn && t->tgnattr == 1 && t->tgattr[0] == attnum &&
            TRIGGER_FOR_ROW(t->tgtype) && TRIGGER_FOR_BEFORE(t->tgtype) && TRIGGER_FOR_UPDATE(t->tgtype)) {
            fp->nargs = t->tgnargs;
            fp->args = static_cast<char **>(palloc0(sizeof(char *) * (t->tgnargs + 1)));
            for (int a = 0; a < t->tgnargs; a++) fp->args[a] = pstrdup(t->tgargs[a]);
            break;
        }
    }
    Oid pk = sharding::compat::primary_key_index(rel);
    if (OidIsValid(pk)) {
        HeapTuple it = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(pk));
        if (HeapTupleIsValid(it)) {
            Form_pg_index ix = reinterpret_cast<Form_pg_index>(GETSTRUCT(it));
            fp->pk_natts = ix->indnkeyatts;
            fp->pk_attnum = ix->indkey.values[0];
            ReleaseSysCache(it);
        }
        if (fp->pk_natts == 1 && fp->pk_attnum > 0) {
            Form_pg_attribute pka = TupleDescAttr(desc, fp->pk_attnum - 1);
            fp->pk_name = pka->attname;
            fp->pk_type = getBaseType(pka->atttypid);
        }
    }
    relation_close(rel, NoLock);
}

// "OPERATOR(schema.=)": the equality operator of `type`, named with its
// schema so that a plan means the same whatever the caller's search_path.
char *equality_operator(Oid type) {
    TypeCacheEntry *tc = lookup_type_cache(type, TYPECACHE_EQ_OPR);
    if (!OidIsValid(tc->eq_opr))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("type %s has no equality operator", format_type_be(type))));
    HeapTuple ot = SearchSysCache1(OPEROID, ObjectIdGetDatum(tc->eq_opr));
    if (!HeapTupleIsValid(ot)) elog(ERROR, "cache lookup failed for operator %u", tc->eq_opr);
    Form_pg_operator o = reinterpret_cast<Form_pg_operator>(GETSTRUCT(ot));
    char *s = psprintf("OPERATOR(%s.%s)", quote_identifier(get_namespace_name(o->oprnamespace)),
                       NameStr(o->oprname));
    ReleaseSysCache(ot);
    return s;
}

// What advance's UPDATE is built from: names, types and the ranks (read
// through Ranks' non-throwing accessors only).
struct AdvanceSpec {
    const char *nsp, *rel, *col, *pkcol;
    Oid pk_type;
    const ColumnType *type;
    const Ranks *ranks;
};

// advance's prepared UPDATE and the values it runs with; `cxt` holds
// rank_datum and higher. Set field by field, so that what a failure
// leaves behind is still retired.
struct AdvanceState {
    SPIPlanPtr plan;
    MemoryContext cxt;
    Datum *rank_datum;  // each rank as a value of the column's type
    Datum *higher;      // for rank r: array of the ranks r and up
};

// Prepares (and keeps) advance's UPDATE for `spec` into `st`.
void prepare_advance_plan(const AdvanceSpec *spec, AdvanceState *st) {
    const ColumnType &ct = *spec->type;
    int n = spec->ranks->size();
    Oid array_type = get_array_type(ct.base);
    if (!OidIsValid(array_type))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("type %s has no array type", format_type_be(ct.base))));
    const char *qcol = quote_identifier(spec->col);
    char *sql = psprintf("UPDATE %s SET %s = $2 WHERE %s %s $1 AND (%s IS NULL OR NOT (%s %s ANY ($3)))",
                         quote_qualified_identifier(spec->nsp, spec->rel), qcol, quote_identifier(spec->pkcol),
                         equality_operator(spec->pk_type), qcol, qcol, equality_operator(ct.base));
    Oid argtypes[3] = {spec->pk_type, ct.type, array_type};
    MemoryContext cxt = cache::entry_context("sharding rank column");
    st->cxt = cxt;
    MemoryContext old = MemoryContextSwitchTo(cxt);
    st->rank_datum = static_cast<Datum *>(palloc0(sizeof(Datum) * (n + 1)));
    st->higher = static_cast<Datum *>(palloc0(sizeof(Datum) * (n + 1)));
    for (int r = 0; r < n; r++) {
        std::string_view l = spec->ranks->label(r);
        if (ct.kind == Kind::Text)
            st->rank_datum[r] = PointerGetDatum(cstring_to_text_with_len(l.data(), static_cast<int>(l.size())));
        else if (ct.kind == Kind::Enum)
            st->rank_datum[r] = ObjectIdGetDatum(spec->ranks->enum_oid(r));
        else
            st->rank_datum[r] =
                OidInputFunctionCall(ct.typinput, pnstrdup(l.data(), l.size()), ct.typioparam, ct.typmod);
    }
    for (int r = 0; r < n; r++)
        st->higher[r] = PointerGetDatum(
            construct_array(st->rank_datum + r, n - r, ct.base, ct.typlen, ct.typbyval, ct.typalign));
    MemoryContextSwitchTo(old);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    // Always the generic plan (an index probe on the key): never planned again per call.
    SPIPlanPtr plan = SPI_prepare_cursor(sql, 3, argtypes, CURSOR_OPT_GENERIC_PLAN);
    if (plan == nullptr) elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
    if (SPI_keepplan(plan) != 0) elog(ERROR, "SPI_keepplan failed");
    SPI_finish();
    st->plan = plan;
}

// `id` (of type id_type) as a value of the primary key's type pk_type,
// through the text form, as CAST does for unrelated types: a value the key
// type cannot read raises that type's error.
Datum convert_through_text(Oid id_type, Oid pk_type, Datum id) {
    Oid out, in, ioparam;
    bool varlena;
    getTypeOutputInfo(id_type, &out, &varlena);
    getTypeInputInfo(pk_type, &in, &ioparam);
    return OidInputFunctionCall(in, OidOutputFunctionCall(out, id), ioparam, -1);
}

// Runs advance's UPDATE with `values` (key, new value, ranks at or above
// it); the number of rows it changed.
uint64 run_advance(SPIPlanPtr plan, Datum *values) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    int rc = SPI_execute_plan(plan, values, nullptr, false, 0);
    if (rc != SPI_OK_UPDATE) elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
    uint64 n = SPI_processed;
    SPI_finish();
    return n;
}

// ---- C++ above the glue: the rankings and columns the caches keep.

ColumnType column_type(Oid type, int32 typmod) {
    ColumnType t;
    glue(read_column_type, type, typmod, &t);
    return t;
}

// Loads an enum's members into `ranks` (rank_core.hpp).
void load_enum(Ranks &ranks, Oid enumtype, bool declared_order, const std::string &what) {
    EnumList list{};
    glue(read_enum, enumtype, &list);
    std::vector<EnumMember> members;
    members.reserve(static_cast<size_t>(list.n));
    for (int i = 0; i < list.n; i++) members.push_back(EnumMember{list.oid[i], list.sort[i], NameStr(list.label[i])});
    ranks.set_enum(std::move(members), declared_order, what);
    pfree(list.oid);
    pfree(list.sort);
    pfree(list.label);
}

// One column's ranking, from a guard's arguments or an enum's order.
struct Ranking {
    bool valid = false;
    Oid relid = InvalidOid;
    uint64 enum_gen = 0;
    AttrNumber attnum = InvalidAttrNumber;
    ColumnType type;
    bool guarded = false;  // ranks come from a guard (else: the enum's order)
    bool skip = true;      // on_regress = 'skip'
    Ranks ranks;

    bool fresh() const { return valid && (type.kind != Kind::Enum || enum_gen == enum_generation); }
};

std::string quoted(std::string_view s) {
    std::string out = "\"";
    out += s;
    out += '"';
    return out;
}

// Fills `g` from a guard trigger's arguments (col, on_regress, ranks...) or,
// with nargs = -1, from the enum's declared order.
void build_ranking(Ranking &g, Oid relid, AttrNumber attnum, Oid atttypid, int32 typmod, int nargs,
                   char **args, const char *relname, const char *colname) {
    g.valid = false;
    g.relid = relid;
    g.attnum = attnum;
    g.guarded = nargs >= 0;
    g.enum_gen = enum_generation;  // read before pg_enum: a change while loading forces a rebuild
    g.type = column_type(atttypid, typmod);
    g.ranks.clear();
    std::string what = format("rank guard on column \"%s\" of relation \"%s\"", colname, relname);
    if (g.guarded) {
        if (nargs < 2)
            fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
                 "%s needs the arguments (column, on_regress, ranks...), got %d", what.c_str(), nargs);
        std::string_view mode(args[1]);
        if (mode != "skip" && mode != "error")
            fail(ERRCODE_INVALID_PARAMETER_VALUE, "on_regress must be 'skip' or 'error', got '%s'", args[1]);
        g.skip = mode == "skip";
        if (nargs > 2) {
            std::vector<std::string_view> labels(args + 2, args + nargs);
            g.ranks.assign(labels, what);
        }
    }
    if (g.type.kind == Kind::Enum) {
        load_enum(g.ranks, g.type.base, !g.guarded || nargs == 2, what);
    } else if (g.ranks.size() == 0) {
        fail(ERRCODE_INVALID_PARAMETER_VALUE,
             g.guarded ? "%s lists no ranks, and the column is not an enum"
                       : "column \"%s\" of relation \"%s\" is neither rank-guarded nor an enum",
             g.guarded ? what.c_str() : colname, relname);
    }
    g.valid = true;
}

// The rank of a non-NULL value, or -1 if it is not a rank.
int value_rank(const Ranking &g, Datum v) {
    switch (g.type.kind) {
        case Kind::Text: {
            struct varlena *p = reinterpret_cast<struct varlena *>(DatumGetPointer(v));
            if (VARATT_IS_EXTERNAL(p) || VARATT_IS_COMPRESSED(p))
                p = glue(pg_detoast_datum_packed, p);
            return g.ranks.find(std::string_view(VARDATA_ANY(p), VARSIZE_ANY_EXHDR(p)));
        }
        case Kind::Enum:
            return g.ranks.find_enum(DatumGetObjectId(v));
        case Kind::Other:
        default: {
            const char *s = glue(OidOutputFunctionCall, g.type.typoutput, v);
            return g.ranks.find(s);
        }
    }
}

// A value's text form, for messages.
std::string value_text(const Ranking &g, Datum v) {
    const char *s = glue(OidOutputFunctionCall, g.type.typoutput, v);
    return s;
}

using GuardMap = CMap<Oid, Ranking>;
GuardMap *guards = nullptr;

// The ranking of the guard trigger now firing, rebuilt if stale.
const Ranking &guard_for(TriggerData *td) {
    Trigger *t = td->tg_trigger;
    if (guards == nullptr) guards = cache_new<GuardMap>();
    auto it = guards->find(t->tgoid);
    if (it != guards->end() && it->second.fresh()) return it->second;
    if (it == guards->end()) {
        // Replaced guards leave entries behind; nothing refers to them
        // between rows, so an occasional purge is safe here.
        if (guards->size() >= 1024 && detail::call_depth <= 1) guards->clear();
        it = guards->try_emplace(t->tgoid).first;
    }
    Ranking &g = it->second;
    Relation rel = td->tg_relation;
    TupleDesc desc = RelationGetDescr(rel);
    const char *relname = RelationGetRelationName(rel);
    AttrNumber attnum = InvalidAttrNumber;
    if (t->tgnattr == 1) {
        attnum = t->tgattr[0];
    } else if (t->tgnargs >= 1) {
        attnum = static_cast<AttrNumber>(glue(SPI_fnumber, desc, static_cast<const char *>(t->tgargs[0])));
    }
    if (attnum <= 0 || attnum > desc->natts || TupleDescAttr(desc, attnum - 1)->attisdropped)
        fail(ERRCODE_UNDEFINED_COLUMN, "rank guard \"%s\" on relation \"%s\" names no column of it", t->tgname,
             relname);
    Form_pg_attribute att = TupleDescAttr(desc, attnum - 1);
    uint64 start = relcache_generation;
    build_ranking(g, RelationGetRelid(rel), attnum, att->atttypid, att->atttypmod, t->tgnargs, t->tgargs,
                  relname, NameStr(att->attname));
    // An invalidation processed while building may have come too late for
    // what was read: use the entry for this row, rebuild it for the next.
    if (start != relcache_generation) g.valid = false;
    return g;
}

// What advance and rank_of know about one column of one table.
struct Column {
    Ranking g;
    bool has_ranks = false;
    CacheString relname, colname, nspname;
    int pk_natts = 0;
    AttrNumber pk_attnum = InvalidAttrNumber;
    Oid pk_type = InvalidOid;  // base type of the primary key column
    CacheString pk_name;
    AdvanceState adv{};  // built by the first advance call
};

// Hands a column's plan and memory to the cache module's retirement: a
// call further up the stack (advance running the UPDATE that fired a
// trigger that calls advance) may still be executing them.
void bury(Column &c) {
    if (c.adv.plan == nullptr && c.adv.cxt == nullptr) return;
    AdvanceState gone = c.adv;
    c.adv = AdvanceState{};
    glue(retire_plan_and_context, gone.plan, gone.cxt);
}

// Keyed by table oid and column *name*: a hit needs no catalog lookup. A
// rename invalidates the table's entries; the next call resolves the name again.
using ColumnMap = CMap<CacheString, Column, NameHash>;
ColumnMap *columns = nullptr;

// Column `colname` of table `relid`, locked in `mode` and rebuilt if stale.
Column &column_for(Oid relid, const char *colname, LOCKMODE mode) {
    // The lock also processes pending invalidations: a guard committed by
    // another session is seen from here on.
    glue(LockRelationOid, relid, mode);
    if (columns == nullptr) columns = cache_new<ColumnMap>();
    if (columns->size() >= 4096 && detail::call_depth <= 1) {
        // Many names seen (dropped tables, misspelt columns): start afresh.
        // No call is running, so nothing refers to an entry.
        for (auto &kv : *columns) bury(kv.second);
        columns->clear();
    }
    CacheString key(reinterpret_cast<const char *>(&relid), sizeof relid);
    key += colname;
    Column &c = (*columns)[key];
    if (c.g.fresh()) return c;
    c.g.valid = false;
    uint64 start = relcache_generation;
    AttrNumber attnum = glue(get_attnum, relid, colname);
    if (attnum <= 0) {
        const char *relname = glue(get_rel_name, relid);
        if (relname == nullptr) fail(ERRCODE_UNDEFINED_TABLE, "relation with OID %u does not exist", relid);
        fail(ERRCODE_UNDEFINED_COLUMN, "column \"%s\" of relation \"%s\" does not exist", colname, relname);
    }

    bury(c);
    c.g.valid = false;
    c.has_ranks = false;
    Facts f{};
    glue(read_facts, relid, attnum, &f);
    if (!f.exists) fail(ERRCODE_UNDEFINED_TABLE, "relation with OID %u does not exist", relid);
    c.relname = NameStr(f.relname);
    c.nspname = NameStr(f.nspname);
    c.colname = NameStr(f.colname);
    c.pk_natts = f.pk_natts;
    c.pk_attnum = f.pk_attnum;
    c.pk_type = f.pk_type;
    c.pk_name = NameStr(f.pk_name);
    ColumnType t = column_type(f.atttypid, f.typmod);
    c.has_ranks = f.nargs >= 0 || t.kind == Kind::Enum;
    if (c.has_ranks) {
        build_ranking(c.g, relid, attnum, f.atttypid, f.typmod, f.nargs, f.args, c.relname.c_str(),
                      c.colname.c_str());
    } else {
        // Unranked: remember that, so the next call fails fast.
        c.g.relid = relid;
        c.g.attnum = attnum;
        c.g.type = t;
        c.g.ranks.clear();
        c.g.valid = true;
    }
    if (start != relcache_generation) c.g.valid = false;  // see guard_for
    return c;
}

// Raises 22023 unless the column has ranks; returns the rank of `value`.
int rank_in(const Column &c, std::string_view value) {
    if (!c.has_ranks)
        throw Error(ERRCODE_INVALID_PARAMETER_VALUE,
                    format("column \"%s\" of relation \"%s\" is neither rank-guarded nor an enum", c.colname.c_str(),
                           c.relname.c_str()),
                    "Its ranks are unknown.", "Guard it with sharding.guard_rank(tbl, col, ranks).");
    int r = c.g.ranks.find(value);
    if (r < 0)
        throw Error(ERRCODE_INVALID_PARAMETER_VALUE,
                    format("value \"%.*s\" is not a rank of column \"%s\" of relation \"%s\"",
                           static_cast<int>(value.size()), value.data(), c.colname.c_str(), c.relname.c_str()),
                    format("Ranks, lowest first: %s.", c.g.ranks.list().c_str()));
    return r;
}

// Prepares advance's UPDATE for `c` (once per cache entry).
void prepare_advance(Column &c) {
    if (c.adv.plan != nullptr) return;
    bury(c);  // what a failed earlier attempt left
    if (c.pk_natts == 0)
        throw Error(ERRCODE_INVALID_PARAMETER_VALUE,
                    format("relation \"%s\" has no primary key", c.relname.c_str()),
                    "advance() finds the row by its single-column primary key.");
    if (c.pk_natts != 1 || c.pk_attnum <= 0)
        throw Error(ERRCODE_INVALID_PARAMETER_VALUE,
                    format("relation \"%s\" has a primary key of %d columns", c.relname.c_str(), c.pk_natts),
                    "advance() finds the row by its single-column primary key.");
    if (c.g.type.kind == Kind::Enum) {
        for (int r = 0; r < c.g.ranks.size(); r++)
            if (c.g.ranks.enum_oid(r) == InvalidOid)
                fail(ERRCODE_INVALID_PARAMETER_VALUE, "rank \"%.*s\" of column \"%s\" is not a value of its enum type",
                     static_cast<int>(c.g.ranks.label(r).size()), c.g.ranks.label(r).data(), c.colname.c_str());
    }
    AdvanceSpec spec{c.nspname.c_str(), c.relname.c_str(), c.colname.c_str(), c.pk_name.c_str(),
                     c.pk_type, &c.g.type, &c.g.ranks};
    glue(prepare_advance_plan, static_cast<const AdvanceSpec *>(&spec), &c.adv);
}

bool int_type(Oid t) { return t == INT2OID || t == INT4OID || t == INT8OID; }


// The rank kind's invalidation callbacks: they only mark entries stale.
void rank_relation_changed(Oid relid) {
    relcache_generation++;
    if (guards != nullptr)
        for (auto &kv : *guards)
            if (relid == InvalidOid || kv.second.relid == relid) kv.second.valid = false;
    if (columns != nullptr)
        for (auto &kv : *columns)
            if (relid == InvalidOid || kv.second.g.relid == relid) kv.second.g.valid = false;
}
void rank_syscache_changed(int cacheid, uint32) {
    if (cacheid == ENUMOID)
        enum_generation++;
    else  // NAMESPACEOID: advance's prepared UPDATE spells the schema's name
        rank_relation_changed(InvalidOid);
}
const cache::Kind rank_kind = {"rank", rank_relation_changed, rank_syscache_changed, 2, {ENUMOID, NAMESPACEOID}};

}  // namespace

void rank_init() { cache::register_kind(&rank_kind); }

}  // namespace sharding

using sharding::Column;
using sharding::fail;

/*
 * _rank_guard() RETURNS trigger
 *
 * The guard: BEFORE UPDATE OF col FOR EACH ROW, arguments (col, on_regress,
 * ranks...). Lets the row through unless it lowers col's rank; then skips it
 * (returns NULL) or raises 23514, as on_regress says.
 */
SHARDING_FUNCTION(sharding__rank_guard) {
    if (!CALLED_AS_TRIGGER(fcinfo))
        fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, "sharding._rank_guard() must be called as a trigger");
    TriggerData *td = reinterpret_cast<TriggerData *>(fcinfo->context);
    if (!TRIGGER_FIRED_BEFORE(td->tg_event) || !TRIGGER_FIRED_FOR_ROW(td->tg_event) ||
        !TRIGGER_FIRED_BY_UPDATE(td->tg_event))
        fail(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
             "sharding._rank_guard() must fire BEFORE UPDATE FOR EACH ROW");
    const sharding::Ranking &g = sharding::guard_for(td);
    TupleDesc desc = RelationGetDescr(td->tg_relation);
    bool old_null, new_null;
    Datum old_v = heap_getattr(td->tg_trigtuple, g.attnum, desc, &old_null);
    Datum new_v = heap_getattr(td->tg_newtuple, g.attnum, desc, &new_null);
    Datum pass = PointerGetDatum(td->tg_newtuple);
    if (old_null && new_null) return pass;
    if (!old_null && !new_null && datumIsEqual(old_v, new_v, g.type.typbyval, g.type.typlen)) return pass;
    const char *relname = RelationGetRelationName(td->tg_relation);
    const char *colname = NameStr(TupleDescAttr(desc, g.attnum - 1)->attname);
    int new_rank = new_null ? -1 : sharding::value_rank(g, new_v);
    if (!new_null && new_rank < 0)
        throw sharding::Error(ERRCODE_INVALID_PARAMETER_VALUE,
                              sharding::format("value \"%s\" is not a rank of column \"%s\" of relation \"%s\"",
                                               sharding::value_text(g, new_v).c_str(), colname, relname),
                              sharding::format("Ranks, lowest first: %s.", g.ranks.list().c_str()));
    int old_rank = old_null ? -1 : sharding::value_rank(g, old_v);
    if (new_rank >= old_rank) return pass;
    if (g.skip) return PointerGetDatum(nullptr);
    std::string new_text = new_null ? std::string("NULL") : sharding::quoted(g.ranks.label(new_rank));
    Oid nsp = RelationGetNamespace(td->tg_relation);
    const char *nspname = sharding::glue(get_namespace_name, nsp);
    throw sharding::Error(
        ERRCODE_CHECK_VIOLATION,
        sharding::format("rank guard refuses to lower column \"%s\" of relation \"%s\" from \"%.*s\" to %s", colname,
                         relname, static_cast<int>(g.ranks.label(old_rank).size()), g.ranks.label(old_rank).data(),
                         new_text.c_str()),
        sharding::format("Rank %d may not become rank %d; ranks, lowest first: %s.", old_rank, new_rank,
                         g.ranks.list().c_str()),
        "A guard with on_regress => 'skip' drops such updates instead.")
        .on_column(nspname ? nspname : "", relname, colname);
}

/*
 * rank_of(tbl regclass, col name, value text) RETURNS integer
 *
 * The 0-based rank of `value` in col's guard, or in its enum's declared order.
 */
SHARDING_FUNCTION(sharding_rank_of) {
    Oid relid = PG_GETARG_OID(0);
    Name col = PG_GETARG_NAME(1);
    text *value = PG_GETARG_TEXT_PP(2);
    std::string_view v(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
    Column &c = sharding::column_for(relid, NameStr(*col), AccessShareLock);
    PG_RETURN_INT32(sharding::rank_in(c, v));
}

/*
 * advance(tbl regclass, id anyelement, new_value text, col name DEFAULT 'status') RETURNS boolean
 *
 * UPDATE tbl SET col = new_value WHERE <primary key> = id AND
 * rank(col) < rank(new_value), through a plan prepared once per backend and
 * column. True if the row moved forward.
 */
SHARDING_FUNCTION(sharding_advance) {
    Oid relid = PG_GETARG_OID(0);
    Datum id = PG_GETARG_DATUM(1);
    text *value = PG_GETARG_TEXT_PP(2);
    Name col = PG_GETARG_NAME(3);
    Oid id_type = get_fn_expr_argtype(fcinfo->flinfo, 1);
    if (!OidIsValid(id_type)) fail(ERRCODE_INVALID_PARAMETER_VALUE, "could not determine the type of id");
    std::string_view v(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
    Column &c = sharding::column_for(relid, NameStr(*col), RowExclusiveLock);
    int r = sharding::rank_in(c, v);
    sharding::prepare_advance(c);
    // Taken now: converting the id below may run user code (a domain check)
    // that rebuilds this entry; retired plans stay alive while we run.
    SPIPlanPtr plan = c.adv.plan;
    Datum rank_value = c.adv.rank_datum[r], higher = c.adv.higher[r];

    // The id as a value of the primary key's type.
    Oid pk_type = c.pk_type;
    Datum key = id;
    if (id_type != pk_type) {
        if (sharding::int_type(id_type) && sharding::int_type(pk_type)) {
            int64 i = id_type == INT2OID ? DatumGetInt16(id) : id_type == INT4OID ? DatumGetInt32(id) : DatumGetInt64(id);
            if (pk_type == INT2OID) {
                if (i < PG_INT16_MIN || i > PG_INT16_MAX) PG_RETURN_BOOL(false);  // no such row
                key = Int16GetDatum(static_cast<int16>(i));
            } else if (pk_type == INT4OID) {
                if (i < PG_INT32_MIN || i > PG_INT32_MAX) PG_RETURN_BOOL(false);
                key = Int32GetDatum(static_cast<int32>(i));
            } else {
                key = Int64GetDatum(i);
            }
        } else {
            // Through the text form, as CAST does for unrelated types.
            key = sharding::glue(sharding::convert_through_text, id_type, pk_type, id);
        }
    }
    Datum values[3] = {key, rank_value, higher};
    uint64 processed = sharding::glue(sharding::run_advance, plan, values);
    PG_RETURN_BOOL(processed > 0);
}
