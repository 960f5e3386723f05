// The orchestration of an online move, in C++ (docs/moves.md; no PL/pgSQL
// on the move's path), around the move itself (its named steps are
// move_online.cpp's, sharding._move_online, the engine of
// move_shard_online and isolate): finish, _move_undo, drop_replication,
// drop_triggers, _move_stop_backends, _move_sees_switch, _move_journal,
// phase, _move_call, _move_connect, _move_disconnect, _move_wait_flush,
// refuse_written, and the helpers that name and describe what a move
// carries: _move_name, _move_tables, _move_filter_sql. Those with an SQL
// name keep it as a thin LANGUAGE C wrapper (the journal interface and the
// public calls are in move_journal.cpp; what both share, in
// move_engine.hpp).
//
// Local steps run through SPI (every value a parameter, the SQL function
// runs with search_path = pg_catalog, pg_temp and every name qualified) or
// read the catalogs directly (_move_tables); remote steps run over the
// session's named connections of remote_exec.cpp (sharding_move_src, _dst,
// _self): interruptible, the remote statement cancelled (PQcancel) when the
// caller is cancelled or fails. Identifiers and literals in remote SQL are
// quoted as pg_catalog.format's %I and %L quote them (quote_identifier,
// quote_literal_cstr).
//
// Transactions: the journal is
// written over sharding_move_self, a connection of this session to this
// database, so each step is committed there before it acts, whatever this
// transaction does; the owner switch commits over the same connection
// together with the journal's 'cleanup'. The move's main block runs in a
// subtransaction (what a PL/pgSQL EXCEPTION block is): on any error,
// cancel included, it is rolled back, then the source is thawed, the move
// undone (or, after the switch, finished) from fresh connections (the
// journal's too: a move keeps it from its start, named_keep), and the
// original error raised with its SQLSTATE, message, detail and hint.
//
// Boundary (src/pg/boundary.hpp): every PostgreSQL call that may ereport
// while a C++ object is alive goes through glue/pg_call; the glue functions
// are C-style code with plain C parameters.
#include "datanode/move_controller.hpp"
#include "datanode/move_copy.hpp"
#include "move/move_engine.hpp"
#include "routing/owner_switch.hpp"
#include "move/move_online.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_attribute.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_subscription.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/pg_list.h"
#include "parser/parse_func.h"
#include "replication/worker_internal.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/float.h"
#include "utils/guc.h"
#include "utils/formatting.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
}

namespace sharding::move {

// sharding.move_freeze_timeout (ms): how long a cutover waits for the
// shard's writers (docs/moves.md, "Bounded freeze").
int move_freeze_timeout = 5000;

namespace online {

// clock_timestamp() as text (glue).
char *clock_text() {
    return DatumGetCString(DirectFunctionCall1(timestamptz_out, TimestampTzGetDatum(GetCurrentTimestamp())));
}

void debug_at(const std::string &what) {
    if (!message_level_is_interesting(DEBUG1)) return;
    char *ts = glue(clock_text);
    elog(DEBUG1, "%s at %s", what.c_str(), ts);
    pfree(ts);
}

// The live move of the shard enters a phase (committed before it acts).
void phase(const std::string &map, int32 logical, Phase ph) {
    journal("UPDATE sharding.move_journal SET phase = " + lit(std::string(to_text(ph))) +
            ", phase_started = pg_catalog.now() WHERE map = " + lit(map) + " AND logical = " +
            std::to_string(logical) + " AND " + kLive);
}

// ------------------------------------------------------------------ names

// Glue: a map name that is not a plain slot name, folded: lower(map) with
// every character outside [a-z0-9_] made '_', its first 16 characters (as
// the SQL of 1.2 did; md5 is appended by move_name).
char *fold_glue(const char *map, size_t len) {
    char *lower = str_tolower(map, len, DEFAULT_COLLATION_OID);
    StringInfoData out;
    initStringInfo(&out);
    int chars = 0;
    for (const char *p = lower; *p != '\0' && chars < 16; chars++) {
        int l = pg_mblen(p);
        char ch = *p;
        bool plain = l == 1 && ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_');
        appendStringInfoChar(&out, plain ? ch : '_');
        p += l;
    }
    pfree(lower);
    return out.data;
}

// A map name usable as it is in slot names: ^[a-z0-9_]{1,24}$.
bool plain_name(const std::string &map) {
    if (map.empty() || map.size() > 24) return false;
    return std::all_of(map.begin(), map.end(),
                       [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'; });
}

// ------------------------------------------------------------------ tables

// What a move needs of one distributed table (palloc'd; NULL strings for
// SQL NULL).
struct RawTable {
    char *rel;
    char *key_column;
    Oid key_type;
    char *cols, *coldefs, *vals, *pk_match;
    int natts;
    char **attnames;
};

void append_sep(StringInfo s, const char *sep) {
    if (s->len > 0) appendStringInfoString(s, sep);
}

// The table schema.table as this database has it, or NULL when it does
// not exist here. Read from the catalogs without locking the table, as a
// query of pg_attribute would.
RawTable *describe_in(const char *schema, const char *table, const char *key_column) {
    if (schema == NULL || table == NULL) return NULL;
    Oid nsp = get_namespace_oid(schema, true);
    if (!OidIsValid(nsp)) return NULL;
    Oid relid = get_relname_relid(table, nsp);
    if (!OidIsValid(relid)) return NULL;
    RawTable *t = (RawTable *)palloc0(sizeof(RawTable));
    t->rel = psprintf("%s.%s", quote_identifier(schema), quote_identifier(table));
    t->key_column = key_column != NULL ? pstrdup(key_column) : NULL;
    t->key_type = InvalidOid;
    AttrNumber key = key_column != NULL ? get_attnum(relid, key_column) : InvalidAttrNumber;
    if (key != InvalidAttrNumber) {
        // The column's type, or a domain's base type (one level).
        Oid typ = get_atttype(relid, key);
        HeapTuple tt = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typ));
        if (HeapTupleIsValid(tt)) {
            Form_pg_type f = (Form_pg_type)GETSTRUCT(tt);
            t->key_type = f->typtype == TYPTYPE_DOMAIN ? f->typbasetype : typ;
            ReleaseSysCache(tt);
        }
    }
    StringInfoData cols, coldefs, vals;
    initStringInfo(&cols);
    initStringInfo(&coldefs);
    initStringInfo(&vals);
    HeapTuple ct = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
    int natts = 0;
    if (HeapTupleIsValid(ct)) {
        natts = ((Form_pg_class)GETSTRUCT(ct))->relnatts;
        ReleaseSysCache(ct);
    }
    t->attnames = (char **)palloc0(sizeof(char *) * Max(natts, 1));
    for (AttrNumber a = 1; a <= natts; a++) {
        HeapTuple at = SearchSysCache2(ATTNUM, ObjectIdGetDatum(relid), Int16GetDatum(a));
        if (!HeapTupleIsValid(at)) continue;
        Form_pg_attribute f = (Form_pg_attribute)GETSTRUCT(at);
        if (!f->attisdropped && f->attgenerated == '\0') {
            const char *n = quote_identifier(NameStr(f->attname));
            append_sep(&cols, ", ");
            appendStringInfoString(&cols, n);
            append_sep(&coldefs, ", ");
            appendStringInfo(&coldefs, "%s %s", n,
                             format_type_extended(f->atttypid, f->atttypmod,
                                                  FORMAT_TYPE_TYPEMOD_GIVEN | FORMAT_TYPE_ALLOW_INVALID));
            append_sep(&vals, ", ");
            appendStringInfo(&vals, "($1).%s", n);
            t->attnames[t->natts++] = pstrdup(NameStr(f->attname));
        }
        ReleaseSysCache(at);
    }
    t->cols = cols.len > 0 ? cols.data : NULL;
    t->coldefs = coldefs.len > 0 ? coldefs.data : NULL;
    t->vals = vals.len > 0 ? vals.data : NULL;
    // The primary key's columns, in column order.
    StringInfoData pk;
    initStringInfo(&pk);
    Relation ir = table_open(IndexRelationId, AccessShareLock);
    ScanKeyData k;
    ScanKeyInit(&k, Anum_pg_index_indrelid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
    SysScanDesc scan = systable_beginscan(ir, IndexIndrelidIndexId, true, NULL, 1, &k);
    HeapTuple tup;
    while (HeapTupleIsValid(tup = systable_getnext(scan))) {
        Form_pg_index ix = (Form_pg_index)GETSTRUCT(tup);
        if (!ix->indisprimary) continue;
        for (AttrNumber a = 1; a <= natts; a++) {
            bool in_key = false;
            for (int i = 0; i < ix->indnatts; i++) in_key = in_key || ix->indkey.values[i] == a;
            char *n = in_key ? get_attname(relid, a, true) : NULL;
            if (n == NULL) continue;
            append_sep(&pk, " AND ");
            appendStringInfo(&pk, "t.%s OPERATOR(pg_catalog.=) ($1).%s", quote_identifier(n), quote_identifier(n));
        }
    }
    systable_endscan(scan);
    table_close(ir, AccessShareLock);
    t->pk_match = pk.len > 0 ? pk.data : NULL;
    return t;
}
// Glue: describe_in, allocated in `into` (which the caller resets).
RawTable *describe_glue(const char *schema, const char *table, const char *key_column, MemoryContext into) {
    MemoryContext old = MemoryContextSwitchTo(into);
    RawTable *t = describe_in(schema, table, key_column);
    MemoryContextSwitchTo(old);
    return t;
}

// Glue: a context for what describe_glue allocates, a child of the current one.
MemoryContext scratch_context_glue() {
    return AllocSetContextCreate(CurrentMemoryContext, "sharding move tables", ALLOCSET_SMALL_SIZES);
}

// Glue: a regtype as regtypeout writes it ("" for NULL, as format's %s).
char *type_text_glue(Oid type) { return OidIsValid(type) ? format_type_be(type) : pstrdup(""); }

std::string from_palloc(char *s) {
    std::string r(s);
    pfree(s);
    return r;
}

// What a node answered, as a number: the values it gives are parsed, never
// spliced into this database's SQL. An answer that is not what was asked
// (not an LSN, not an integer) is 08P01, naming what and who answered.
[[noreturn]] void bad_answer(const char *who, const char *what, const Text &answer) {
    fail(ERRCODE_PROTOCOL_VIOLATION, "the %s answered %s for %s", who, literal_or_null(answer).c_str(), what);
}
// A pg_lsn's text (X/Y, each 1 to 8 hex digits).
uint64 lsn_value(const Text &t, const char *who, const char *what) {
    const std::string s = t.value_or(std::string());
    const size_t slash = s.find('/');
    const size_t lo_len = slash == std::string::npos ? 0 : s.size() - slash - 1;
    if (!t || slash < 1 || slash > 8 || lo_len < 1 || lo_len > 8 ||
        s.find_first_not_of("0123456789ABCDEFabcdef/") != std::string::npos || s.find('/', slash + 1) != std::string::npos)
        bad_answer(who, what, t);
    return (std::strtoull(s.substr(0, slash).c_str(), nullptr, 16) << 32) | std::strtoull(s.c_str() + slash + 1, nullptr, 16);
}
// A bigint's text.
int64 int64_value(const std::string &s, const char *who, const char *what) {
    char *end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !(std::isdigit((unsigned char)s[0]) || s[0] == '-'))
        bad_answer(who, what, Text(s));
    return v;
}

// The source's sessions that hold the move's controller lock, other than
// this session's connection there: the source connection of an executor
// that died (terminated, crashed). Until it notices (a statement it runs
// ends within a second: client_connection_check_interval), it may still
// finish the statement it was running, a CREATE PUBLICATION waiting for a
// lock on the tables, and commit it after the publication was dropped
// here; the move's next try then failed ("publication ... already
// exists", TAP 530). Ended and waited for (10 s, then 55006).
void stop_controller(const std::string &name) {
    Text left;
    for (int i = 1; i <= 500; i++) {
        left = dbl(kSrc, "SELECT pg_catalog.count(pg_catalog.pg_terminate_backend(l.pid)) FROM pg_catalog.pg_locks l "
                         "WHERE l.locktype = 'advisory' AND l.classid = " + std::to_string(kControllerLockClass) +
                         "::pg_catalog.oid AND l.objid = pg_catalog.hashtext(" + lit(name) + ")::pg_catalog.oid "
                         "AND l.objsubid = 2 AND l.pid <> pg_catalog.pg_backend_pid() AND l.database = "
                         "(SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())");
        if (left == Text("0")) break;
        sleep_ms(20);
    }
    if (left && *left != "0") fail(ERRCODE_OBJECT_IN_USE, "sessions of move %s do not end", name.c_str());
}

// drop_subscription: the move's subscription at the destination, without
// contacting the source (which may be down or gone: its slot is left to
// drop_slot_and_publication). A subscription at a node is local to it.
void drop_subscription(const std::string &name) {
    if (dbl(kDst, "SELECT count(*) FROM pg_catalog.pg_subscription WHERE subname = " + lit(name)) != Text("0")) {
        dbl(kDst, "SELECT sharding._move_watch(NULL)");
        dbl(kDst, "ALTER SUBSCRIPTION " + ident(name) + " DISABLE");
        dbl(kDst, "ALTER SUBSCRIPTION " + ident(name) + " SET (slot_name = NONE)");
        dbl(kDst, "DROP SUBSCRIPTION " + ident(name));
    }
}

// drop_slot_and_publication: at the source, once the source sessions of a
// dead executor are gone, the slot (waiting for its walsender to let go,
// ending it after 2 s), the publication and the decoding row.
void drop_slot_and_publication(const std::string &name) {
    stop_controller(name);
    for (int i = 1; i <= 200; i++) {
        Text active_pid = dbl(kSrc, "SELECT coalesce(active_pid::text, '-') FROM pg_catalog.pg_replication_slots "
                                    "WHERE slot_name = " + lit(name));
        if (!active_pid) break;
        if (*active_pid == "-") {
            dbl(kSrc, "SELECT pg_catalog.pg_drop_replication_slot(" + lit(name) + ")");
            break;
        }
        if (i > 100) dbl(kSrc, "SELECT pg_catalog.pg_terminate_backend(" + *active_pid + ")");
        sleep_ms(20);
    }
    dbl(kSrc, "DROP PUBLICATION IF EXISTS " + ident(name));
    if (dbl(kSrc, "SELECT pg_catalog.to_regclass('sharding.move_decoding') IS NOT NULL") == Text("t"))
        dbl(kSrc, "DELETE FROM sharding.move_decoding WHERE slot = " + lit(name));
}

// drop_replication: the subscription at the destination, then the slot and
// the publication at the source.
void drop_replication(const std::string &name) {
    drop_subscription(name);
    drop_slot_and_publication(name);
}

// drop_triggers: a 1.2 move's filter trigger on the map's tables at
// the destination.
void drop_triggers(const std::string &map, const std::string &name) {
    for (const MoveTable &t : move_tables(map)) {
        const std::string &rel = t.rel;
        if (dbl(kDst, "SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgname = " + lit(name) +
                          " AND tgrelid = pg_catalog.to_regclass(" + lit(rel) + ")") != Text("0"))
            dbl(kDst, "DROP TRIGGER " + ident(name) + " ON " + rel);
    }
}

// _move_stop_backends: ends every other session of that node's database
// named after the move (a copy left running by a cancelled or dead
// caller) and waits until they are gone (10 s, then 55006).
void stop_backends(const char *conn, const std::string &name) {
    Text left;
    for (int i = 1; i <= 500; i++) {
        left = dbl(conn, "SELECT pg_catalog.count(pg_catalog.pg_terminate_backend(a.pid)) FROM pg_catalog.pg_stat_activity a "
                         "WHERE a.application_name = " + lit(name) + " AND a.pid <> pg_catalog.pg_backend_pid() "
                         "AND a.datname = pg_catalog.current_database()");
        if (left == Text("0")) break;
        sleep_ms(20);
    }
    if (left && *left != "0") fail(ERRCODE_OBJECT_IN_USE, "sessions of move %s do not end", name.c_str());
}

// _move_sees_switch: whether that node's followed configuration shows the
// switch; a node that does not follow this coordinator counts as seeing it.
bool sees_switch(const char *conn, const std::string &map, int32 logical, const Text &key, const std::string &node,
                 const Text &new_epoch) {
    if (dbl(conn, "SELECT sharding.this_node() IS NOT NULL") != Text("t")) return true;
    if (key)
        return dbl(conn, "SELECT node FROM sharding.pins WHERE map = " + lit(map) + " AND key = " + lit(key)) ==
               Text(node);
    Text v = dbl(conn, "SELECT node || '/' || epoch FROM sharding.shards WHERE map = " + lit(map) +
                           " AND logical = " + std::to_string(logical));
    if (!new_epoch) return !v;  // IS NOT DISTINCT FROM NULL
    return v == Text(node + "/" + *new_epoch);
}

// ARRAY['a', 'b']::text[] (an empty array for none).
std::string text_array(const std::vector<std::string> &items) {
    std::string out = "ARRAY[";
    for (size_t i = 0; i < items.size(); i++) out += (i ? ", " : "") + lit(items[i]);
    return out + "]::text[]";
}

// _move_pull's {rows,bytes}, parsed strictly (08P01 otherwise).
Copied pulled_pair(const Text &pulled) {
    const std::string p = pulled.value_or(std::string());
    const size_t comma = p.find(',');
    if (p.size() < 5 || p.front() != '{' || p.back() != '}' || comma == std::string::npos)
        bad_answer("destination", "the rows and bytes it copied", pulled);
    Copied c;
    c.rows = int64_value(p.substr(1, comma - 1), "destination", "the rows it copied");
    c.bytes = int64_value(p.substr(comma + 1, p.size() - comma - 2), "destination", "the bytes it copied");
    return c;
}

// What the pull of move `name` has sent so far, read at the source over
// sharding_move_src: its COPY ... TO STDOUT runs in sessions named
// <name>_copy there (move_copy.cpp), each in pg_stat_progress_copy.
Copied copy_progress(const std::string &name) {
    Text v = dbl(kSrc, "SELECT coalesce(pg_catalog.sum(p.tuples_processed), 0) || ' ' || "
                       "coalesce(pg_catalog.sum(p.bytes_processed), 0) "
                       "FROM pg_catalog.pg_stat_progress_copy p JOIN pg_catalog.pg_stat_activity a ON a.pid = p.pid "
                       "WHERE a.application_name = " + lit(name + "_copy") +
                       " AND p.datname = pg_catalog.current_database()");
    Copied c;
    if (v) {
        char *end = nullptr;
        c.rows = std::strtoll(v->c_str(), &end, 10);
        if (end != nullptr && *end == ' ') c.bytes = std::strtoll(end + 1, nullptr, 10);
    }
    return c;
}

// The journal's rows_copied and bytes_copied of the live move.
void note_copied(const std::string &live_where, int64 rows, int64 bytes) {
    journal("UPDATE sharding.move_journal SET rows_copied = " + std::to_string(rows) +
            ", bytes_copied = " + std::to_string(bytes) + " " + live_where);
}

// The rows the copy of a move is expected to send, for move_progress's
// time_left (docs/rebalance.md): per table, at the source over
// sharding_move_src, the rows of its condition (or of the shard's leaf, for
// a shard-partitioned table): counted where the table (all its
// partitions) has at most kSampleBlocks blocks, else counted in a sample of
// about kSampleBlocks of its blocks (TABLESAMPLE SYSTEM) and scaled up, so
// that the estimate reads at most some 2 MB whatever the table's size.
// Noted in the journal (rows_expected) with the copy's start
// (copy_started), from which move_progress takes the rate measured so
// far. Only informs: what it fails with is logged (DEBUG1) and leaves
// rows_expected NULL (time_left then falls back on the history).
constexpr int64 kSampleBlocks = 256;

void note_expected(const std::string &live_where, const std::vector<CopyTable> &tables, bool shard_move) {
    try {
        int64 total = 0;
        for (const CopyTable &t : tables) {
            std::string from = t.rel, where = t.filter;
            if (shard_move) {
                Text leaf = dbl(kSrc, "SELECT s.leaf FROM (" + shard_leaves_sql(lit(t.rel) + "::pg_catalog.regclass") +
                                          ") s WHERE s.shard = " + lit(t.filter));
                if (leaf) {
                    from = *leaf;
                    where = "true";
                }
            }
            // The table's blocks, with its partitions' (pg_partition_tree
            // has no row for a table that is neither partitioned nor a
            // partition).
            Text blocks_t = dbl(kSrc, "SELECT (pg_catalog.sum(pg_catalog.pg_relation_size(s.r)) / "
                                      "pg_catalog.current_setting('block_size')::pg_catalog.int8)::pg_catalog.int8 "
                                      "FROM (SELECT " + lit(from) + "::pg_catalog.regclass AS r UNION "
                                      "SELECT p.relid FROM pg_catalog.pg_partition_tree(" + lit(from) +
                                      "::pg_catalog.regclass) p) s");
            const int64 blocks = blocks_t ? std::strtoll(blocks_t->c_str(), nullptr, 10) : 0;
            int64 rows;
            if (blocks <= kSampleBlocks) {
                rows = std::strtoll(must(dbl(kSrc, "SELECT pg_catalog.count(*) FROM " + from + " WHERE " + where)).c_str(),
                                    nullptr, 10);
                debug_at("rows expected from " + from + ": " + std::to_string(rows) + " (counted, " +
                         std::to_string(blocks) + " blocks)");
            } else {
                const double pct = 100.0 * double(kSampleBlocks) / double(blocks);
                char pct_s[32];
                std::snprintf(pct_s, sizeof pct_s, "%.6f", pct);
                const int64 seen = std::strtoll(
                    must(dbl(kSrc, "SELECT pg_catalog.count(*) FROM " + from + " TABLESAMPLE SYSTEM (" + pct_s +
                                       ") WHERE " + where)).c_str(), nullptr, 10);
                rows = int64(double(seen) * 100.0 / pct + 0.5);
                debug_at("rows expected from " + from + ": " + std::to_string(rows) + " (a sample of about " +
                         std::to_string(kSampleBlocks) + " of " + std::to_string(blocks) + " blocks)");
            }
            total += rows;
        }
        journal("UPDATE sharding.move_journal SET rows_expected = " + std::to_string(total) +
                ", copy_started = pg_catalog.clock_timestamp() " + live_where);
    } catch (const Error &e) {
        debug_at(std::string("could not estimate the rows of a move's copy: ") + e.what());
        try {
            journal("UPDATE sharding.move_journal SET rows_expected = NULL, "
                    "copy_started = pg_catalog.clock_timestamp() " + live_where);
        } catch (const Error &) {
            // The journal refused: time_left stays on the history.
        }
    }
}

// ------------------------------------------------------------------ verification
// Before the source's copy of the shard is deleted, the rows at both ends
// are compared (sharding.move_verify, docs/moves.md "Verified before
// anything is deleted"): per table, the count and an order-independent
// checksum (the exact sum of sharding.hash64 of each row's text form, XXH3
// of the row as the type output functions spell it under fixed output
// settings, the same on every PostgreSQL major; summed as sum(bigint) sums:
// numeric, accumulated in 128 bits, the same value as a sum of each hash
// cast to numeric, about a seventh faster) of the shard's rows, with the
// move's own filter and column list.
//
// The source's rows are frozen since the cutover (then refused by its
// guard, which follows the new owner), so they are read after the switch,
// outside the refusal window. The destination accepts writes of the shard
// as soon as it follows the switch, so its rows are read in a snapshot
// taken there before the switch and after its last apply (the cutover has
// waited for the slot to confirm the source's last change): a connection
// of its own, sharding_move_verify, holds a REPEATABLE READ transaction
// from the cutover until the comparison. Both ends scan at once.

// Opens sharding_move_verify to the destination and takes its snapshot.
void hold_verify_snapshot(const std::string &destination) {
    Text dsn = spi_value("SELECT x.dsn FROM sharding.nodes x WHERE x.node = $1", {destination.c_str()});
    named_connect(kVerify, c(dsn));
    dbl(kVerify, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    dbl(kVerify, "SELECT 1");  // the transaction's snapshot is taken here
}

// "count checksum" of a table's rows of the shard, as the statement sent
// on conn answered it (08P01 for anything else).
std::string digest_answer(PGconn *conn, const char *who) {
    PGresult *res = collect_statement(conn, "", true);
    std::string v;
    bool shaped = res != nullptr && PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
                  PQnfields(res) == 1 && !PQgetisnull(res, 0, 0);
    if (shaped) v = PQgetvalue(res, 0, 0);
    PQclear(res);
    const size_t sp = v.find(' ');
    if (!shaped || sp == std::string::npos || sp == 0 ||
        v.find_first_not_of("0123456789- ") != std::string::npos)
        bad_answer(who, "a count and a checksum", shaped ? Text(v) : Text());
    return v;
}

// Compares every table; the first difference is returned as the error's
// message (empty: the same everywhere).
std::optional<Difference> compare_copies(const std::vector<CopyTable> &tables) {
    // The rows' text must not depend on either session's settings (a node's
    // database may print bytea in escape form, or timestamps in its own
    // time zone): the same output settings at both ends.
    const std::string fixed = "SET bytea_output = 'hex'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; "
                              "SET TimeZone = 'UTC'; SET extra_float_digits = 1";
    dbl(kSrc, fixed);
    dbl(kVerify, fixed);
    PGconn *src = named_connection(kSrc);
    PGconn *dst = named_connection(kVerify);
    for (const CopyTable &t : tables) {
        // Of a shard-partitioned table, the shard's leaf alone at each end
        // where it has one (the same rows: no other leaf holds any of the
        // shard's); the filter is applied all the same.
        const std::string leaf_of = "SELECT s.leaf FROM (" + shard_leaves_sql(lit(t.rel) + "::pg_catalog.regclass") +
                                    ") s WHERE s.shard = " + lit(t.filter);
        auto sql_from = [&](const char *conn) {
            Text leaf = dbl(conn, leaf_of);
            return "SELECT pg_catalog.count(*)::text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) "
                   "coalesce(pg_catalog.sum(sharding.hash64((ROW(" + t.cols +
                   "))::text)), 0)::text FROM " + leaf.value_or(t.rel) + " WHERE " + t.filter;
        };
        const std::string src_sql = sql_from(kSrc), dst_sql = sql_from(kVerify);
        if (PQsendQuery(src, src_sql.c_str()) == 0)
            fail(ERRCODE_CONNECTION_FAILURE, "could not send a statement to the source: %s", PQerrorMessage(src));
        if (PQsendQuery(dst, dst_sql.c_str()) == 0) {
            cancel_and_drain(src);
            fail(ERRCODE_CONNECTION_FAILURE, "could not send a statement to the destination: %s", PQerrorMessage(dst));
        }
        std::string at_src, at_dst;
        try {
            at_src = digest_answer(src, "source");
        } catch (...) {
            cancel_and_drain(dst);
            throw;
        }
        at_dst = digest_answer(dst, "destination");
        if (at_src != at_dst) return Difference{t.rel, at_src, at_dst};
    }
    return std::nullopt;
}

// ------------------------------------------------------------------ what the ends have
// (CONTRACT 15.1: every kind of distributed table, schemas compared.)

// The replica identity of each table at one end, and of each of its leaf
// partitions (a partitioned table's changes are logged by its leaves,
// each with its own replica identity): a table without one (none, NOTHING,
// an identity index dropped) makes PostgreSQL refuse every UPDATE and
// DELETE of it at the source once the move publishes it; one that does
// not carry the key column leaves a DELETE's old row without the key, which
// the decoder could not place in a shard. 55000 naming the table, before
// anything is created.
void check_identity(const char *conn, const Text &where, const MoveTable &t, const std::string &map) {
    const std::string rel = lit(t.rel) + "::pg_catalog.regclass";
    const std::string identity_index =
        "i.indrelid = c.oid AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident "
        "ELSE false END";
    Text bad = dbl(conn,
                   "SELECT x.problem || ' ' || x.relid::pg_catalog.regclass::text FROM (SELECT r.relid, CASE "
                   "WHEN c.relreplident = 'f' THEN NULL "
                   "WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE " + identity_index + ") THEN 'none' "
                   "WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid "
                   "AND a.attname OPERATOR(pg_catalog.=) " + lit(t.key_column) + " AND a.attnum OPERATOR(pg_catalog.=) "
                   "ANY (i.indkey::pg_catalog.int2[]) WHERE " + identity_index + ") THEN 'key' END AS problem "
                   "FROM (SELECT " + rel + "::pg_catalog.oid AS relid UNION SELECT p.relid::pg_catalog.oid "
                   "FROM pg_catalog.pg_partition_tree(" + rel + ") AS p WHERE p.isleaf) AS r "
                   "JOIN pg_catalog.pg_class c ON c.oid = r.relid) AS x WHERE x.problem IS NOT NULL "
                   "ORDER BY x.problem DESC, x.relid LIMIT 1");
    if (!bad) return;
    const std::string what = bad->substr(bad->find(' ') + 1);
    const std::string of = what == t.rel ? std::string() : " (a partition of " + t.rel + ")";
    const char *node = c(where) ? c(where) : "<NULL>";
    if (bad->compare(0, 5, "none ") == 0)
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"An online move publishes the updates and deletes of the map's tables: PostgreSQL refuses them "
                     "for a table without a replica identity, and the destination could not apply them.",
                     "Give " + what + " a primary key, or ALTER TABLE " + what +
                         " REPLICA IDENTITY FULL (or USING INDEX on a unique index that includes column \"" +
                         t.key_column + "\"), then move again."},
             "table %s%s of map \"%s\" has no replica identity on node \"%s\"", what.c_str(), of.c_str(), map.c_str(),
             node);
    fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
         Explain{"A delete's old row carries only the replica identity: without key column \"" + t.key_column +
                     "\" the move could not tell which shard it deletes from.",
                 "ALTER TABLE " + what + " REPLICA IDENTITY FULL, or USING INDEX on a unique index that includes "
                     "column \"" + t.key_column + "\", then move again."},
         "the replica identity of %s%s on node \"%s\" does not include key column \"%s\" of map \"%s\"", what.c_str(),
         of.c_str(), node, t.key_column.c_str(), map.c_str());
}

// A table's columns there (not dropped; generated ones only when `all`,
// their type marked with a '*'), in column order, as
// "<bytes>:<name><bytes>:<type>..." (parsed by columns_of, never spliced).
std::string columns_query(const std::string &rel, bool all) {
    return "SELECT coalesce(pg_catalog.string_agg(pg_catalog.octet_length(a.attname::text)::text || ':' || "
           "a.attname::text || pg_catalog.octet_length(t.t)::text || ':' || t.t, '' ORDER BY a.attnum), '') "
           "FROM pg_catalog.pg_attribute a, LATERAL (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) || "
           "CASE WHEN a.attgenerated OPERATOR(pg_catalog.<>) '' THEN '*' ELSE '' END AS t) AS t "
           "WHERE a.attrelid = " + lit(rel) + "::pg_catalog.regclass AND a.attnum OPERATOR(pg_catalog.>) 0 "
           "AND NOT a.attisdropped" + (all ? "" : " AND a.attgenerated OPERATOR(pg_catalog.=) ''");
}

// (name, type) pairs of columns_query's answer; 08P01 when it is not one.
std::vector<std::pair<std::string, std::string>> columns_of(const char *conn, const std::string &rel, bool all) {
    const Text answer = dbl(conn, columns_query(rel, all));
    const std::string s = answer.value_or(std::string());
    std::vector<std::string> items;
    for (size_t at = 0; at < s.size();) {
        const size_t colon = s.find(':', at);
        if (colon == std::string::npos || colon == at || colon - at > 9 ||
            s.find_first_not_of("0123456789", at) < colon)
            bad_answer(conn == kSrc ? "source" : "destination", "the columns of a table", answer);
        const size_t len = std::strtoul(s.substr(at, colon - at).c_str(), nullptr, 10);
        if (colon + 1 + len > s.size()) bad_answer(conn == kSrc ? "source" : "destination", "the columns of a table", answer);
        items.push_back(s.substr(colon + 1, len));
        at = colon + 1 + len;
    }
    if (!answer || items.size() % 2 != 0)
        bad_answer(conn == kSrc ? "source" : "destination", "the columns of a table", answer);
    std::vector<std::pair<std::string, std::string>> out;
    for (size_t i = 0; i < items.size(); i += 2) out.emplace_back(items[i], items[i + 1]);
    return out;
}

// A table's column signature there: a digest of every column (name, type,
// generated or not) and of the replica identity of the table and of each
// of its partitions (its kind and index), compared again at the cutover.
std::string column_signature(const char *conn, const std::string &rel) {
    const std::string r = lit(rel) + "::pg_catalog.regclass";
    return must(dbl(conn, "SELECT pg_catalog.md5(c.v || '/' || (SELECT pg_catalog.string_agg(k.relreplident::text || "
                          "coalesce((SELECT i.indkey::text FROM pg_catalog.pg_index i WHERE i.indrelid = k.oid AND "
                          "i.indisreplident), ''), ',' ORDER BY k.oid) FROM (SELECT " + r + " AS relid UNION SELECT "
                          "p.relid FROM pg_catalog.pg_partition_tree(" + r + ") AS p) AS t JOIN pg_catalog.pg_class k "
                          "ON k.oid = t.relid)) FROM (" + columns_query(rel, true) + ") AS c(v)"));
}
}  // namespace online
using namespace online;

// ------------------------------------------------------------------ names and tables

std::string move_name(const std::string &map, int32 logical, const std::string &tag) {
    std::string base = plain_name(map) ? map
                                       : from_palloc(glue(fold_glue, map.c_str(), map.size())) + "_" +
                                             md5_hex(map).substr(0, 8);
    return "sharding_move_" + (tag.empty() ? std::string() : tag + "_") + base + "_" + std::to_string(logical);
}

// The coordinator's tag in the names of its moves (docs/moves.md, "Names"):
// six hex digits of the md5 of this instance's system identifier and this
// database's OID. Replication slots and origins belong to an instance, not
// to a database: two coordinators whose nodes are databases of one
// instance, moving the same map name and shard, must not name them alike.
std::string coordinator_tag() {
    return md5_hex(std::to_string(GetSystemIdentifier()) + "/" + std::to_string(MyDatabaseId)).substr(0, 6);
}

// Whether the journal has its column name (not while the library is newer
// than the extension's SQL, before ALTER EXTENSION UPDATE).
bool journal_has(const char *column) {
    return spi_value("SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute a WHERE a.attrelid = "
                     "pg_catalog.to_regclass('sharding.move_journal') AND a.attname = $1 AND NOT a.attisdropped)",
                     {column}) == Text("t");
}

bool journal_has_name() { return journal_has("name"); }

// The name of the live move of a shard: the one its journal row stores
// (written when the row is, move_name with this coordinator's tag); a row
// journaled by 1.3 (name NULL) keeps the name 1.3 gave it (no tag); without
// a live row, a new name. Read over the journal's own connection (the row
// is committed there, maybe after this transaction's snapshot).
std::string journal_move_name(const std::string &map, int32 logical) {
    if (!journal_has_name()) return move_name(map, logical);
    Text stored = journal("SELECT coalesce(m.name, '') FROM sharding.move_journal m WHERE m.map = " + lit(map) +
                          " AND m.logical = " + std::to_string(logical) + " AND m." + kLive);
    if (!stored) return move_name(map, logical, coordinator_tag());
    return stored->empty() ? move_name(map, logical) : checked_name(map, logical, *stored);
}

// A stored name, checked: a move's name of that shard, with a tag of six
// hex digits (any coordinator's: a coordinator taken over keeps its
// moves' names). The journal is writable by sharding_admin, and the name
// says which slot, publication, subscription and origins the engine drops.
const std::string &checked_name(const std::string &map, int32 logical, const std::string &stored) {
    const size_t at = strlen("sharding_move_");
    const bool hex = stored.size() > at + 6 && std::all_of(stored.begin() + at, stored.begin() + at + 6, [](char ch) {
        return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
    });
    if (!hex || stored != move_name(map, logical, stored.substr(at, 6)))
        fail(ERRCODE_DATA_CORRUPTED,
             Explain{"A move's name is sharding_move_<tag>_<map>_<logical> (docs/moves.md, \"Names\").",
                     "Correct or clear sharding.move_journal.name of the move."},
             "the journal names the move of logical shard %d of map \"%s\" \"%s\", not a name of such a move",
             logical, map.c_str(), stored.c_str());
    return stored;
}

std::vector<MoveTable> move_tables(const std::string &map) {
    std::vector<MoveTable> out;
    std::vector<Row> rows = spi_rows("SELECT d.schema_name, d.table_name, d.key_column FROM sharding.distributed_tables d "
                                     "WHERE d.map = $1 ORDER BY d.schema_name, d.table_name",
                                     {map.c_str()});
    // What describe_glue allocates lives in a context of its own, reset
    // after each table and deleted at the end (a procedure that loops,
    // rebalance_run, would otherwise keep it until it returns). On an
    // error it stays in the caller's context, freed with it.
    MemoryContext scratch = glue(scratch_context_glue);
    for (Row &r : rows) {
        RawTable *t = glue(describe_glue, c(r[0]), c(r[1]), c(r[2]), scratch);
        if (t == nullptr) continue;
        MoveTable m;
        m.rel = t->rel;
        m.key_column = t->key_column ? t->key_column : "";
        m.key_type = t->key_type;
        m.cols = t->cols ? t->cols : "";
        m.coldefs = t->coldefs ? t->coldefs : "";
        m.vals = t->vals ? t->vals : "";
        m.pk_match = t->pk_match ? t->pk_match : "";
        for (int i = 0; i < t->natts; i++) m.attnames.emplace_back(t->attnames[i]);
        glue(MemoryContextReset, scratch);
        out.push_back(std::move(m));
    }
    glue(MemoryContextDelete, scratch);
    return out;
}

std::string filter_sql(const Text &key_column, Oid key_type, const Text &shards, const Text &logical, const Text &key,
                       const Text &pins, int npins) {
    if (!key_column) fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "null values cannot be formatted as an SQL identifier");
    const std::string column = ident(*key_column);
    if (key) return column + " OPERATOR(pg_catalog.=) " + lit(key) + "::" + from_palloc(glue(type_text_glue, key_type));
    std::string sql = "sharding.shard_of(" + column + ", " + shards.value_or("") + ") OPERATOR(pg_catalog.=) " +
                      logical.value_or("");
    if (npins > 0) {
        // The key's text form (sharding._key_text_sql, 80_observe), asked
        // through SPI: the SQL function's memory (its SET clause keeps a
        // context per call site) goes with SPI_finish, not with the caller.
        const std::string type_oid = std::to_string(key_type);
        std::string text_form = OidIsValid(key_type)
                                    ? must(spi_value("SELECT sharding._key_text_sql($1, $2::pg_catalog.oid::pg_catalog.regtype)",
                                                     {column.c_str(), type_oid.c_str()}))
                                    : std::string();
        sql += " AND NOT (" + text_form + " OPERATOR(pg_catalog.=) ANY (" + lit(pins) + "::text[]))";
    }
    return sql;
}

std::vector<TableFilter> table_filters(const std::vector<MoveTable> &tables, const Text &shards, int32 logical,
                                       const Text &key, const Text &pins, int npins) {
    std::vector<TableFilter> out;
    const Text logical_s = std::to_string(logical);
    for (const MoveTable &t : tables)
        out.push_back({t.rel, filter_sql(t.key_column.empty() ? Text() : Text(t.key_column), t.key_type, shards, logical_s,
                                         key, pins, npins)});
    return out;
}

std::vector<TableFilter> current_filters(const std::string &map, int32 logical, const Text &key) {
    const std::vector<MoveTable> tables = move_tables(map);
    if (tables.empty()) return {};
    const Text shards = require_map(Text(map), false);
    const std::vector<Row> p = spi_rows("SELECT coalesce(pg_catalog.array_agg(p.key), '{}')::text, pg_catalog.count(*)::text "
                                        "FROM sharding.pins p WHERE p.map = $1",
                                        {map.c_str()});
    return table_filters(tables, shards, logical, key, p[0][0], std::atoi(must(p[0][1]).c_str()));
}

// ------------------------------------------------------------------ connections

void check_dsns(const Text &destination, const Text &source) {
    for (const Text &n : {destination, source}) {  // the argument first
        Text dsn = n ? spi_value("SELECT x.dsn FROM sharding.nodes x WHERE x.node = $1", {c(n)}) : std::nullopt;
        if (!dsn)
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"Moving a shard online connects to its source and its destination.",
                         "Call sharding.add_node(" + literal_or_null(n) + ", '<dsn>') first."},
                 "node \"%s\" has no connection string", shown(n).c_str());
    }
}

void connect(const Text &source, const Text &destination) {
    check_dsns(destination, source);
    // The journal's connection to this database: the one the move's
    // journal() opened already, when it is idle, the engine's own and was
    // opened as this role with the same DSN (named_keep); else a fresh one.
    Text self = coordinator_dsn();
    if (!named_keep(kSelf, c(self), true)) named_connect(kSelf, c(self));
    // The source's and the destination's sessions are established at once.
    Text src = spi_value("SELECT x.dsn FROM sharding.nodes x WHERE x.node = $1", {c(source)});
    Text dst = spi_value("SELECT x.dsn FROM sharding.nodes x WHERE x.node = $1", {c(destination)});
    named_connect_both(kSrc, c(src), kDst, c(dst));
}

void disconnect() {
    named_disconnect(kVerify);
    named_disconnect(kSrc);
    named_disconnect(kDst);
    named_disconnect(kSelf);
}

void refuse_written() {
    // The source's slot waits for every transaction holding a transaction
    // id to end, this one included when the source shares its instance.
    if (FullTransactionIdIsValid(GetTopFullTransactionIdIfAny()))
        fail(ERRCODE_ACTIVE_SQL_TRANSACTION, Explain{"", "Call it in its own transaction."},
             "moving a shard online must run in a transaction that has not written yet");
}

// TRUNCATE and rewrites of a moved table (VACUUM FULL, CLUSTER, an ALTER
// TABLE that rewrites it or moves it to another tablespace) are not carried
// by the stream: one at the source during a move would bring the rows it
// removed back at the destination, one at the destination would lose rows
// copied there. Each gives the table (each leaf partition) new storage, so
// the move notes the storage of its tables at both ends before the slot
// exists, and the cutover, holding them in ACCESS SHARE mode (which only
// those take conflict with) until the switch, compares: a change refuses
// the switch and the move is rolled back.
//
// storage_of: "oid:filenode" of every leaf of `rels` (a regclass[] literal
// expression) there, as a text[] literal. `others`: an SQL list of oids
// left out (the leaves of shard-partitioned tables that hold other shards:
// another move's clean-up truncates them).
std::string storage_of(const char *conn, const std::string &rels, const std::string &others) {
    // (pg_partition_tree lists nothing for a table that is not partitioned.)
    return must(dbl(conn, "SELECT coalesce(pg_catalog.array_agg(x.relid::pg_catalog.oid::text || ':' || "
                          "pg_catalog.pg_relation_filenode(x.relid)::text ORDER BY x.relid::pg_catalog.oid), '{}')::text "
                          "FROM (SELECT r.rel AS relid FROM pg_catalog.unnest(" + rels + ") AS r(rel) UNION "
                          "SELECT p.relid FROM pg_catalog.unnest(" + rels + ") AS r(rel), "
                          "pg_catalog.pg_partition_tree(r.rel) AS p WHERE p.isleaf) AS x "
                          "WHERE pg_catalog.pg_relation_filenode(x.relid) IS NOT NULL "
                          "AND x.relid::pg_catalog.oid NOT IN (" + others + ")"));
}

// The leaves of the move's shard-partitioned tables that hold another
// logical shard than the move's, as an SQL subquery of their oids: a
// TRUNCATE or rewrite of one of them changes nothing the move carries
// (and a clean-up of another move truncates them: shard_leaves_sql).
std::string other_shards_leaves(const std::vector<MoveTable> &tables, const std::string &shards,
                                const std::string &logical) {
    std::string out = "SELECT 0::pg_catalog.oid";
    for (const MoveTable &m : tables) {
        const std::string prefix = "sharding.shard_of(" + ident(m.key_column) + ", " + shards + ") OPERATOR(pg_catalog.=) ";
        out += " UNION ALL SELECT s.oid FROM (" + shard_leaves_sql(lit(m.rel) + "::pg_catalog.regclass") +
               ") s WHERE pg_catalog.left(s.shard, " + std::to_string(prefix.size()) + ") = " + lit(prefix) +
               " AND s.shard <> " + lit(prefix + logical);
    }
    return out;
}

// hold_storage: in a transaction there (ended by the caller), the tables
// locked in ACCESS SHARE mode (waiting at most a second), then 55000 if
// the storage of any leaf noted by storage_of has changed since.
void hold_storage(const char *conn, const std::string &table_list, const std::string &noted, const Text &where,
                  const std::string &map, int32 logical) {
    dbl(conn, "BEGIN");
    dbl(conn, "SET LOCAL lock_timeout = '1s'");
    dbl(conn, "LOCK TABLE " + table_list + " IN ACCESS SHARE MODE");
    Text changed = dbl(conn, "SELECT pg_catalog.string_agg(pg_catalog.split_part(s.v, ':', 1)::pg_catalog.oid"
                             "::pg_catalog.regclass::text, ', ') FROM pg_catalog.unnest(" + lit(noted) +
                                 "::text[]) AS s(v) WHERE pg_catalog.pg_relation_filenode(pg_catalog.split_part(s.v, "
                                 "':', 1)::pg_catalog.oid) IS DISTINCT FROM pg_catalog.split_part(s.v, ':', 2)::pg_catalog.oid");
    if (changed)
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"An online move carries rows and their changes, not TRUNCATE nor a rewrite of the table (VACUUM "
                     "FULL, CLUSTER, ALTER TABLE that rewrites it or sets its tablespace): the move is rolled back and "
                     "the old owner keeps the shard.",
                     "Run them before or after a move, then move the shard again."},
             "%s was truncated or rewritten on node \"%s\" while logical shard %d of map \"%s\" was being moved",
             changed->c_str(), c(where) ? c(where) : "<NULL>", logical, map.c_str());
}

// hold_columns: in hold_storage's transaction there (the tables held in
// ACCESS SHARE mode, which ALTER TABLE conflicts with), 55000 if a table's
// column signature is not what it was when the move started: the stream
// carries rows of the columns it had, the destination may not have a new
// one, and the copy did not carry it; a replica identity changed may have
// left a delete without its key.
void hold_columns(const char *conn, const std::vector<CopyTable> &tables, const std::vector<std::string> &noted,
                  const Text &where, const std::string &map, int32 logical) {
    for (size_t i = 0; i < tables.size() && i < noted.size(); i++)
        if (column_signature(conn, tables[i].rel) != noted[i])
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"An online move carries rows of the columns its tables had when it started: the move is "
                         "rolled back and the old owner keeps the shard.",
                         "Change a distributed table's columns before or after a move (at every node), then move "
                         "the shard again."},
                 "the columns or the replica identity of %s changed on node \"%s\" while logical shard %d of map \"%s\" was being moved",
                 tables[i].rel.c_str(), c(where) ? c(where) : "<NULL>", logical, map.c_str());
}

// _move_wait_flush: waits until the move's slot at the source has
// confirmed the source's flushed WAL position (walsenders send no further,
// and everything the move must carry is there once the freeze has
// committed, synchronously); the seconds waited. 55000 after `seconds`.
// While it waits, the live move's lag_bytes (as move_progress reads it:
// the source's WAL now, less what the destination confirmed; 0 once caught
// up) is committed at least every quarter of a second.
double wait_flush(const std::string &name, double seconds, const std::string &journal_where) {
    // No position (or not one) is an error: as 0/0 it would be reached at once.
    const Text target_a = dbl(kSrc, "SELECT pg_catalog.pg_current_wal_flush_lsn()");
    const uint64 target = lsn_value(target_a, "source", "its WAL flush position");
    const std::string target_t = *target_a;
    const double started = clock_seconds();
    double noted = -1;
    long sleep = 1;
    for (;;) {
        Text flushed = dbl(kSrc, "SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = " +
                                     lit(name));
        const bool reached = flushed && lsn_value(flushed, "source", "the slot's confirmed position") >= target;
        if (noted < 0 || reached || clock_seconds() - noted >= 0.25) {
            int64 lag = 0;
            if (!reached) {
                Text l = dbl(kSrc, "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), "
                                   "s.confirmed_flush_lsn)::bigint FROM pg_catalog.pg_replication_slots s "
                                   "WHERE s.slot_name = " + lit(name));
                if (l) lag = std::max<int64>(0, int64_value(*l, "source", "the slot's lag"));
            }
            journal("UPDATE sharding.move_journal SET lag_bytes = " + std::to_string(lag) + " " + journal_where +
                    " AND phase IN " PHASE_SQL_STREAMING);
            noted = clock_seconds();
            // RB-6: an apply worker at the destination that keeps failing
            // (a constraint or a column there that the source's rows break)
            // fails the move now, not after `seconds`: the move's
            // subscription's third apply error ends the wait (one or two
            // may pass: a deadlock, a lock timeout, the source restarting;
            // the worker retries every wal_retrieve_retry_interval, 5 s by
            // default); the move is rolled back.
            if (!reached) {
                Text errors = dbl(kDst, "SELECT COALESCE(pg_catalog.sum(s.apply_error_count), 0)::text "
                                        "FROM pg_catalog.pg_stat_subscription_stats s WHERE s.subname = " + lit(name));
                if (errors && int64_value(*errors, "destination", "its apply errors") >= 3)
                    fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                         Explain{"Its subscription " + name + " failed to apply the source's changes " + *errors +
                                     " times (pg_stat_subscription_stats.apply_error_count).",
                                 "The destination's log names each error (logical replication apply worker); "
                                 "fix it there and move again."},
                         "the destination of move %s cannot apply the source's changes", name.c_str());
            }
        }
        if (reached) break;
        if (clock_seconds() - started > seconds)
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"Slot " + name + " confirmed " + flushed.value_or("") + ", the source is at " + target_t + ".",
                         "Look for logical replication apply errors in the destination's log."},
                 "the destination of move %s did not catch up with the source within %s s", name.c_str(),
                 float_text(seconds).c_str());
        sleep_ms(sleep);
        sleep = std::min(sleep * 2, 10L);
    }
    return clock_seconds() - started;
}

// _move_call: sharding.<fn>(map, logical) there.
void call_fn(const char *conn, const std::string &fn, const std::string &map, int32 logical) {
    dbl(conn, "SELECT sharding." + ident(fn) + "(" + lit(map) + ", " + std::to_string(logical) + ")");
}

// ------------------------------------------------------------------ the move

// finish: the end of a move whose switch has committed (also run
// after a crash): waits until the source and the destination show it,
// thaws, drops the replication objects, deletes the moved rows at the
// source, closes the journal. Connections sharding_move_src/_dst/_self are
// open. Returns the rows deleted at the source.
int64 finish(const std::string &map, int32 logical, const Text &key, const std::string &destination,
             const Text &new_epoch, const std::function<void()> &before_delete, bool defer, bool batched) {
    const std::string name = journal_move_name(map, logical);
    const std::string logical_s = std::to_string(logical);
    // The source's guard must see the new owner before its shard thaws
    // (then it refuses by ownership); the destination accepts writes once it
    // sees it, so the call returns only then.
    for (const char *conn : {kSrc, kDst}) {
        bool seen = false;
        for (int i = 1; i <= 3000 && !seen; i++) {  // 60 s
            seen = sees_switch(conn, map, logical, key, destination, new_epoch);
            if (!seen) sleep_ms(5);
        }
        if (!seen)
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"The coordinator has switched; the source stays frozen until it follows.",
                         "Check the node's subscription sharding_config_<node>, then call sharding.move_shard_online "
                         "again to finish."},
                 "node %s of the move of logical shard %d of map \"%s\" does not show the switch after 60 s",
                 conn == kSrc ? "source" : "destination", logical, map.c_str());
        if (conn == kSrc) {
            call_fn(kSrc, "_thaw_shard", map, logical);
            debug_at("move " + name + ": thawed");
        }
    }
    debug_at("move " + name + ": destination follows");
    drop_replication(name);
    drop_triggers(map, name);
    debug_at("move " + name + ": replication dropped");
    // The source's own view once more, right before its rows go: it must
    // not be the owner (a journal older than the world, a later move back).
    if (!sees_switch(kSrc, map, logical, key, destination, new_epoch))
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"Nothing was deleted at the source.", "Check sharding.shards and sharding.pins at both ends."},
             "the source of the move of logical shard %d of map \"%s\" no longer shows the switch", logical,
             map.c_str());
    if (before_delete) before_delete();
    if (defer) {
        // The clean-up deferred: the row stays in phase cleanup, marked
        // cleanup_deferred, with no pid once the executor lets go (its
        // executor lock), for the cleaner; the source's rows are refused
        // to writers (the guard) and routed nowhere meanwhile.
        journal("UPDATE sharding.move_journal SET phase_started = pg_catalog.now(), lag_bytes = 0, pid = NULL, "
                "cleanup_deferred = true WHERE map = " + lit(map) + " AND logical = " + logical_s + " AND " + kLive);
        debug_at("move " + name + ": clean-up deferred");
        return -1;
    }
    const int64 deleted = delete_shard_rows(kSrc, map, logical, key, batched);
    drop_left_origins(kSrc, name);
    drop_left_origins(kDst, name);
    journal("UPDATE sharding.move_journal SET phase = " PHASE_SQL(DONE) ", phase_started = pg_catalog.now(), "
            "finished = pg_catalog.now(), rows_moved = " + std::to_string(deleted) +
            ", lag_bytes = 0, pid = NULL WHERE map = " + lit(map) + " AND logical = " + logical_s + " AND " + kLive);
    return deleted;
}

Share move_share(const std::string &map, int32 logical, int parallel) {
    Share share;
    share.sessions = std::max(1, parallel);
    if (parallel < 2 || !named_open(kSelf)) return share;
    // The journal row of a move in flight has phase copying to cleanup
    // and its executor's session lock (hashtext('sharding.move_journal'),
    // move): a row left by a dead executor does not count. The move's own
    // row counts at its nodes and on its hosts (o = m).
    const std::string in_flight =
        "FROM sharding.move_journal o, sharding.move_journal m "
        "WHERE m.map = " + lit(map) + " AND m.logical = " + std::to_string(logical) + " AND m." + kLive +
        " AND o.phase NOT IN " PHASE_SQL_NOT_IN_FLIGHT " "
        "AND EXISTS (SELECT FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.classid = (pg_catalog.hashtext('sharding.move_journal'))::oid AND l.objsubid = 2 "
        "AND l.objid = ((o.move % 2147483647)::integer)::oid AND l.database = (SELECT d.oid FROM "
        "pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()))";
    const std::string at_nodes = "pg_catalog.count(*) FILTER (WHERE o.source IN (m.source, m.destination) OR "
                                 "o.destination IN (m.source, m.destination))";
    // On a host: the moves with an end there, and the host's CPUs as the
    // move's end said (the fewer of the two when both ends are on it).
    const std::string hosts =
        journal_has("source_host")
            ? " || ' ' || pg_catalog.count(*) FILTER (WHERE m.source_host IN (o.source_host, o.destination_host)) "
              "|| ' ' || coalesce(pg_catalog.min(m.source_cpus), 0) "
              "|| ' ' || pg_catalog.count(*) FILTER (WHERE m.destination_host IN (o.source_host, o.destination_host)) "
              "|| ' ' || coalesce(pg_catalog.min(m.destination_cpus), 0)"
            : std::string();
    Text answer;
    try {
        answer = dbl(kSelf, "SELECT " + at_nodes + "::text" + hosts + " " + in_flight);
    } catch (const Error &) {
        return share;  // only a share of the sessions is at stake
    }
    if (!answer) return share;
    int n[5] = {1, 0, 0, 0, 0};
    std::sscanf(answer->c_str(), "%d %d %d %d %d", &n[0], &n[1], &n[2], &n[3], &n[4]);
    share.at_nodes = std::max(1, n[0]);
    share.sessions = std::max(1, parallel / share.at_nodes);
    // Each end's host: its CPUs divided among the moves with an end there.
    for (int end = 0; end < 2; end++) {
        const int moves = n[1 + 2 * end], cpus = n[2 + 2 * end];
        if (moves < 1 || cpus < 1) continue;  // the host unknown
        share.on_host = std::max(share.on_host, moves);
        share.sessions = std::min(share.sessions, std::max(1, cpus / moves));
    }
    return share;
}

// _move_undo: undoes a move whose switch has not committed: drops its
// replication objects and triggers, deletes what it copied to the
// destination, marks the journal row undone. The source thaws once the
// destination has said that it does not own the shard, never before.
bool undo(const std::string &map, int32 logical, const Text &key) {
    const std::string name = journal_move_name(map, logical);
    const std::string logical_s = std::to_string(logical);
    // A move whose switch has committed is the destination's now: undoing
    // it would delete the rows of their only owner. Read over the journal's
    // own connection, not this transaction's snapshot, which may predate
    // the switch.
    if (journal("SELECT m.phase FROM sharding.move_journal m WHERE m.map = " + lit(map) + " AND m.logical = " +
                logical_s + " AND m." + kLive) == Text(to_text(Phase::Cleanup)))
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"Its owner switch has committed: the destination owns the shard.",
                     "Call sharding.move_shard_online or sharding._move_recover to finish it."},
             "the move of logical shard %d of map \"%s\" cannot be undone", logical, map.c_str());
    // The nodes' word before the journal's: a destination whose followed
    // configuration makes it the owner has had the switch (a coordinator
    // restored from a backup or cloned, whose journal is older than the
    // world): its rows are the only copy; the move is finished instead,
    // never undone.
    Text destination = journal("SELECT m.destination FROM sharding.move_journal m WHERE m.map = " + lit(map) +
                               " AND m.logical = " + logical_s + " AND m." + kLive);
    if (destination && dbl(kDst, "SELECT sharding.this_node()") == destination) {
        Text owner = key ? dbl(kDst, "SELECT node FROM sharding.pins WHERE map = " + lit(map) + " AND key = " + lit(key))
                         : dbl(kDst, "SELECT node FROM sharding.shards WHERE map = " + lit(map) +
                                         " AND logical = " + logical_s);
        if (owner == destination) {
            Text epoch = dbl(kDst, "SELECT epoch::text FROM sharding.shards WHERE map = " + lit(map) +
                                       " AND logical = " + logical_s);
            warn(format("the destination \"%s\" of the move of logical shard %d of map \"%s\" owns it already: the "
                        "move is finished, not undone",
                        destination->c_str(), logical, map.c_str()),
                 "This coordinator's journal is older than the nodes' configuration (a restored or cloned "
                 "coordinator?).");
            finish(map, logical, key, *destination, epoch);
            return false;
        }
    }
    // Only now, the destination having answered that it does not own the
    // shard, may the source write again: thawed before, it would be a
    // second owner wherever the switch happened after all. An undo that
    // cannot reach the destination fails above (connect or this check),
    // the source stays frozen and the journal row live for _move_recover.
    call_fn(kSrc, "_thaw_shard", map, logical);
    close_held(name);
    drop_replication(name);
    drop_triggers(map, name);
    // A copy still running at the destination (its caller was cancelled or
    // died) would commit after the delete below: end it first, and wait.
    stop_backends(kDst, name);
    delete_shard_rows(kDst, map, logical, key);
    drop_left_origins(kSrc, name);
    drop_left_origins(kDst, name);
    journal("UPDATE sharding.move_journal SET undone = true WHERE map = " + lit(map) + " AND logical = " + logical_s +
            " AND " + kLive);
    return true;
}

namespace {

// The result row (glue).
Datum move_result(FunctionCallInfo fcinfo, const char *epoch, int64 moved) {
    TupleDesc desc;
    if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE) elog(ERROR, "return type must be a row type");
    desc = BlessTupleDesc(desc);
    Datum values[2];
    bool nulls[2] = {epoch == NULL, false};
    values[0] = epoch != NULL ? Int64GetDatum(pg_strtoint64(epoch)) : (Datum)0;
    values[1] = Int64GetDatum(moved);
    return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

// Glue: the text form of a text[] and how many elements it has.
char *array_text_glue(ArrayType *a, int *n) {
    *n = ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
    return OidOutputFunctionCall(F_ARRAY_OUT, PointerGetDatum(a));
}

ArrayType *array_arg_glue(FunctionCallInfo fcinfo, int i) { return PG_GETARG_ARRAYTYPE_P(i); }

// Glue: one row of _move_tables into the call's tuplestore.
void put_table_glue(FunctionCallInfo fcinfo, const char *rel, const char *key_column, Oid key_type, const char *cols,
                    const char *coldefs, const char *vals, const char *pk_match) {
    ReturnSetInfo *rsinfo = (ReturnSetInfo *)fcinfo->resultinfo;
    const char *texts[7] = {rel, key_column, NULL, cols, coldefs, vals, pk_match};
    Datum values[7];
    bool nulls[7];
    for (int i = 0; i < 7; i++) {
        nulls[i] = i == 2 ? !OidIsValid(key_type) : (texts[i] == NULL || texts[i][0] == '\0');
        values[i] = i == 2 ? ObjectIdGetDatum(key_type) : (nulls[i] ? (Datum)0 : CStringGetTextDatum(texts[i]));
    }
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

void init_srf_glue(FunctionCallInfo fcinfo) { InitMaterializedSRF(fcinfo, 0); }

// The subscription this session watches as a move's controller at its
// destination (_move_watch; move_controller.hpp), InvalidOid for none.
Oid watched = InvalidOid;
bool watch_installed = false;

// At the end of the session: the watched subscription's apply worker, if
// it has one, is stopped (SIGTERM; what it had received but not applied
// goes with it, and the subscription's next worker gets nothing from the
// source's decoder once the controller is gone there too).
void stop_watched(int, Datum) {
    if (!OidIsValid(watched)) return;
    Oid sub = watched;
    watched = InvalidOid;
    LWLockAcquire(LogicalRepWorkerLock, LW_SHARED);
    LogicalRepWorker *w = logicalrep_worker_find(sub, InvalidOid, true);
    pid_t pid = (w != NULL && w->proc != NULL) ? w->proc->pid : 0;
    LWLockRelease(LogicalRepWorkerLock);
    if (pid != 0) (void)kill(pid, SIGTERM);
}

// Glue: watch the subscription so named (NULL: none), which the caller's
// role must own (or be a member of its owner).
void watch_glue(const char *subscription) {
    if (subscription == NULL) {
        watched = InvalidOid;
        return;
    }
    Oid sub = get_subscription_oid(subscription, false);
    Subscription *s = GetSubscription(sub, false);
    if (!has_privs_of_role(GetUserId(), s->owner))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("must be the owner of subscription \"%s\" to watch it", subscription)));
    if (!watch_installed) {
        before_shmem_exit(stop_watched, 0);
        watch_installed = true;
    }
    watched = sub;
}

}  // namespace
}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

// _move_online(map, logical, key, node, OUT new_epoch, OUT moved).
SHARDING_FUNCTION(sharding__move_online) {
    if (PG_ARGISNULL(1) || PG_ARGISNULL(3))
        fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the shard and the destination of a move must not be NULL");
    Text map = text_arg(fcinfo, 0);
    Text key = text_arg(fcinfo, 2);
    Text node = text_arg(fcinfo, 3);
    MoveResult r = move_online(map, PG_GETARG_INT32(1), key, *node);
    const char *epoch = c(r.new_epoch);
    return glue(move_result, fcinfo, epoch, r.moved);
}

// _move_journal(sql): over sharding_move_self, committed at once; its first
// value. Only 1.3's SQL has it (gone in 1.4: SEC-2, it ran any statement as
// whichever role coordinator_dsn names); with this library it is for the
// extension's owner and superusers only, whatever that SQL granted.
SHARDING_FUNCTION(sharding__move_journal) {
    const std::string me = std::to_string(GetUserId());
    if (spi_value("SELECT e.extowner OPERATOR(pg_catalog.=) $1::pg_catalog.oid OR EXISTS (SELECT FROM "
                  "pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid AND a.rolsuper) "
                  "FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'sharding'",
                  {me.c_str()}) != Text("t"))
        fail(ERRCODE_INSUFFICIENT_PRIVILEGE, "permission denied for function _move_journal");
    Text sql = text_arg(fcinfo, 0);
    // The caller's statement may change the session or fail in it: the
    // connection is no longer the engine's alone (named_keep), whatever
    // happens next.
    struct Taint {
        ~Taint() { named_taint(kSelf); }
    } taint;
    Text v = journal(*sql);
    if (!v) PG_RETURN_NULL();
    PG_RETURN_DATUM(PointerGetDatum(glue(cstring_to_text_with_len, v->c_str(), (int)v->size())));
}

// _move_call(conn, fn, map, logical): sharding.<fn>(map, logical) there.
SHARDING_FUNCTION(sharding__move_call) {
    Text conn = text_arg(fcinfo, 0);
    check_named_for_caller(conn->c_str());
    Text fn = text_arg(fcinfo, 1);
    Text map = text_arg(fcinfo, 2);
    call_fn(conn->c_str(), *fn, *map, PG_GETARG_INT32(3));
    PG_RETURN_VOID();
}

// _move_undo(map, logical, key).
SHARDING_FUNCTION(sharding__move_undo) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
        fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the map and the shard of a move must not be NULL");
    Text map = text_arg(fcinfo, 0);
    Text key = text_arg(fcinfo, 2);
    undo(*map, PG_GETARG_INT32(1), key);
    PG_RETURN_VOID();
}

// _move_stop_backends(conn, name).
SHARDING_FUNCTION(sharding__move_stop_backends) {
    Text conn = text_arg(fcinfo, 0);
    check_named_for_caller(conn->c_str());
    Text name = text_arg(fcinfo, 1);
    stop_backends(conn->c_str(), *name);
    PG_RETURN_VOID();
}

// _move_watch(subscription): at a move's destination, this session (the
// coordinator's connection) watches the move's subscription until it ends
// or calls _move_watch(NULL): if it ends first, the subscription's apply
// worker is stopped (move_controller.hpp). Not STRICT: NULL stops watching.
SHARDING_FUNCTION(sharding__move_watch) {
    Text sub = text_arg(fcinfo, 0);
    glue(watch_glue, c(sub));
    PG_RETURN_VOID();
}

// _move_sees_switch(conn, map, logical, key, node, new_epoch).
SHARDING_FUNCTION(sharding__move_sees_switch) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(4))
        fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the connection, map, shard and node must not be NULL");
    Text conn = text_arg(fcinfo, 0);
    Text map = text_arg(fcinfo, 1);
    Text key = text_arg(fcinfo, 3);
    Text node = text_arg(fcinfo, 4);
    check_named_for_caller(conn->c_str());
    Text epoch;
    if (!PG_ARGISNULL(5)) epoch = std::to_string(PG_GETARG_INT64(5));
    bool seen = sees_switch(conn->c_str(), *map, PG_GETARG_INT32(2), key, *node, epoch);
    PG_RETURN_BOOL(seen);
}

// _move_name(map, logical): STRICT. The live move's name as its journal
// row stores it (a 1.3 row: 1.3's name), else the name a move of that
// shard gets here (this coordinator's tag).
SHARDING_FUNCTION(sharding__move_name) {
    Text map = text_arg(fcinfo, 0);
    const int32 logical = PG_GETARG_INT32(1);
    const std::string logical_s = std::to_string(logical);
    std::string name;
    if (!journal_has_name()) {
        name = move_name(*map, logical);
    } else {
        Text stored = spi_value("SELECT coalesce(m.name, '') FROM sharding.move_journal m WHERE m.map = $1 AND "
                                "m.logical = $2::integer AND m.phase NOT IN " PHASE_SQL_FINAL,
                                {c(map), logical_s.c_str()});
        name = !stored            ? move_name(*map, logical, coordinator_tag())
               : stored->empty()  ? move_name(*map, logical)
                                  : checked_name(*map, logical, *stored);
    }
    PG_RETURN_DATUM(text_datum(name));
}

// _coordinator_tag(): this coordinator's tag (coordinator_tag), which the
// names of its moves and of its nodes' configuration slots carry
// (sharding._config_slot).
SHARDING_FUNCTION(sharding__coordinator_tag) {
    (void)fcinfo;
    PG_RETURN_DATUM(text_datum(coordinator_tag()));
}

// _move_tables(map): rel, key_column, key_type, cols, coldefs, vals, pk_match.
SHARDING_FUNCTION(sharding__move_tables) {
    Text map = text_arg(fcinfo, 0);
    glue(init_srf_glue, fcinfo);
    if (map)
        for (const MoveTable &t : move_tables(*map))
            glue(put_table_glue, fcinfo, t.rel.c_str(), t.key_column.c_str(), t.key_type, t.cols.c_str(),
                 t.coldefs.c_str(), t.vals.c_str(), t.pk_match.c_str());
    return (Datum)0;
}

// _move_filter_sql(key_column, key_type, shards, logical, key, pins): not
// STRICT (a NULL key selects the shard, NULL pins none).
SHARDING_FUNCTION(sharding__move_filter_sql) {
    Text column = text_arg(fcinfo, 0);
    Oid type = PG_ARGISNULL(1) ? InvalidOid : PG_GETARG_OID(1);
    Text shards, logical, pins;
    if (!PG_ARGISNULL(2)) shards = std::to_string(PG_GETARG_INT32(2));
    if (!PG_ARGISNULL(3)) logical = std::to_string(PG_GETARG_INT32(3));
    Text key = text_arg(fcinfo, 4);
    int npins = 0;
    if (!PG_ARGISNULL(5)) pins = from_palloc(glue(array_text_glue, glue(array_arg_glue, fcinfo, 5), &npins));
    std::string sql = filter_sql(column, type, shards, logical, key, pins, npins);
    PG_RETURN_DATUM(text_datum(sql));
}

// _move_connect(source, destination): sharding_move_src, _dst and _self;
// 55000 for a node without a connection string (the destination first).
SHARDING_FUNCTION(sharding__move_connect) {
    Text source = text_arg(fcinfo, 0);
    Text destination = text_arg(fcinfo, 1);
    connect(source, destination);
    PG_RETURN_VOID();
}

// _move_disconnect(): closes them.
SHARDING_FUNCTION(sharding__move_disconnect) {
    (void)fcinfo;
    disconnect();
    PG_RETURN_VOID();
}

// _move_wait_flush(name, seconds): the seconds waited (seconds NULL: no limit).
SHARDING_FUNCTION(sharding__move_wait_flush) {
    if (PG_ARGISNULL(0)) fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the move's name must not be NULL");
    Text name = text_arg(fcinfo, 0);
    double seconds = PG_ARGISNULL(1) ? get_float8_infinity() : PG_GETARG_FLOAT8(1);
    // The journal row of the move so named, found once (its name is made
    // here, not by calling _move_name on every row at every poll).
    std::string where = "WHERE false";
    const std::string named = std::string("SELECT m.move::text, m.map, m.logical::text, ") +
                              (journal_has_name() ? "m.name" : "NULL::text") +
                              " FROM sharding.move_journal m WHERE m.phase IN " PHASE_SQL_STREAMING;
    for (const Row &r : spi_rows(named.c_str(), {}))
        if ((r[3] ? *r[3] : move_name(must(r[1]), std::atoi(must(r[2]).c_str()))) == *name) {
            where = "WHERE move = " + must(r[0]);
            break;
        }
    double waited = wait_flush(*name, seconds, where);
    PG_RETURN_FLOAT8(waited);
}

namespace sharding {
// Called from _PG_init: sharding.move_freeze_timeout.
void freeze_init() {
    DefineCustomIntVariable("sharding.move_freeze_timeout",
                            "How long an online move's cutover waits for the writers holding the shard.",
                            "Read where the move runs (the coordinator): the freeze at the source and the owner "
                            "switch at the coordinator each wait at most this long; past it the source thaws and "
                            "the cutover is tried again a second later, three times in all, then the move fails "
                            "with 55P03 and is rolled back.",
                            &move::move_freeze_timeout, 5000, 1, INT_MAX, PGC_USERSET, GUC_UNIT_MS, nullptr, nullptr,
                            nullptr);
}
}  // namespace sharding
