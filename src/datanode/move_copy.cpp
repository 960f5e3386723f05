// The move engine's copy and slot (docs/moves.md).
//
// _move_slot_create(source, slot, plugin): on the coordinator, opens a
//   logical replication connection to the source and creates the move's
//   slot there with an exported snapshot (CREATE_REPLICATION_SLOT ...
//   LOGICAL ... (SNAPSHOT 'export')). The connection stays open, idle, so
//   the snapshot stays importable, until close_held(slot) or the end
//   of the transaction. Every change committed after that snapshot is in the
//   slot's stream, every change before it in the copy: they never overlap.
//
// _move_pull(source, snapshot, rel, columns, query): on the destination,
//   pulls COPY (query) TO STDOUT from the source under the exported
//   snapshot and feeds it into `rel` through BeginCopyFrom with a data
//   source callback (as file_fdw feeds a file). Binary where every column's
//   type is built in and has binary I/O, else text. No program, no shell:
//   the source's connection string is read from this node's sharding.nodes,
//   so it appears in no statement, command line or process title. A move
//   calls it once per part of its copy's queue, in sessions of its own
//   (src/move/move_online.cpp, copy_rows; run_queue below), each with
//   sharding.move_parallel = 1. Called with a larger sharding.move_parallel,
//   a table of at least 4 MB at the source goes in parts itself
//   (sessions of this database at once, each on a range of the source's
//   blocks under the same snapshot; see "parts" below): the copy is bound
//   by the destination's inserts and index maintenance, one core's work
//   per session.
#include "core/cpu_quota.hpp"
#include "datanode/move_copy.hpp"
#include "pg/spi.hpp"
#include "remote/move_remote.hpp"
#include "pg/spi_snapshot.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

extern "C" {
#include "access/table.h"
#include "access/transam.h"
#include "catalog/pg_type.h"
#include "commands/copy.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/fmgroids.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_node.h"
#include "parser/parse_relation.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "storage/latch.h"
#include "utils/wait_event.h"
#include "utils/snapmgr.h"
}

namespace sharding::move {

namespace {

// Glue: one interruptible wait for sock to be readable, at most 10 ms.
void wait_for_any(pgsocket sock) {
    InvalidateCatalogSnapshotConditionally();  // no xmin held while waiting (RB-10)
    int rc = WaitLatchOrSocket(MyLatch, WL_LATCH_SET | WL_SOCKET_READABLE | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, sock, 10L,
                               PG_WAIT_EXTENSION);
    if (rc & WL_LATCH_SET) ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
}

bool valid_slot_name(const std::string &s) {
    if (s.empty() || s.size() > 63) return false;
    for (char c : s)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
    return true;
}

// ---------------------------------------------------------------- the pull
// The data source callback of BeginCopyFrom has no argument: the copy in
// progress is here. Plain C state; the callback holds no C++ object, so an
// ERROR raised in it (a cancel) jumps to the pg_call around CopyFrom.
struct PullState {
    Remote *remote;
    const char *data;
    int len;
    int off;
    bool done;
    uint64 bytes;
};
PullState pull;

char pull_error[512];
// A PostgreSQL error raised while waiting (a cancel, 57014; a statement
// timeout): raised again unchanged by the caller, with its own SQLSTATE,
// never as a copy failure (XX000).
ErrorData *pull_pg_error = nullptr;

// 1: a chunk, 0: the end, 2: none has arrived yet (only when !may_wait),
// 3: a PostgreSQL error (pull_pg_error), negative: an error.
int read_chunk(Remote *r, const char **data, int *len, bool may_wait) {
    // C++ (Remote::read_copy) inside the callback: exceptions must not
    // cross PostgreSQL's C frames, so they are turned into an ERROR by the
    // caller, once no C++ object is alive.
    char *msg = pull_error;
    int code = 0;
    try {
        int rc = r->next_copy(data, len, may_wait);
        return rc < 0 ? 2 : rc;
    } catch (const PgError &e) {
        pull_pg_error = e.data();
        return 3;
    } catch (const Error &e) {
        code = e.sqlstate();
        strlcpy(msg, e.what(), sizeof pull_error);
    } catch (const std::exception &e) {
        code = ERRCODE_INTERNAL_ERROR;
        strlcpy(msg, e.what(), sizeof pull_error);
    } catch (...) {
        code = ERRCODE_INTERNAL_ERROR;
        strlcpy(msg, "unknown error", sizeof pull_error);
    }
    return -code - 1;  // negative: an error, reported by the caller (no C++ object alive there)
}

// Fills CopyFrom's buffer with every row that has already arrived (the
// source sends one CopyData message per row: one row per call would cost a
// call of the parser's buffer refill per row); waits only while it has
// nothing to give.
int pull_source(void *outbuf, int minread, int maxread) {
    (void)minread;
    int copied = 0;
    while (copied < maxread) {
        if (pull.off >= pull.len) {
            if (pull.done) break;
            const char *d = nullptr;
            int l = 0;
            int rc = read_chunk(pull.remote, &d, &l, copied == 0);
            if (rc == 3) {
                ErrorData *e = pull_pg_error;
                pull_pg_error = nullptr;
                ReThrowError(e);
            }
            if (rc < 0) ereport(ERROR, (errcode(-rc - 1), errmsg("copying from the source failed: %s", pull_error)));
            if (rc == 2) break;  // nothing more yet: give CopyFrom what it has
            CHECK_FOR_INTERRUPTS();
            if (rc == 0) {
                pull.done = true;
                break;
            }
            pull.data = d;
            pull.len = l;
            pull.off = 0;
            pull.bytes += l;
        }
        int n = pull.len - pull.off;
        if (n > maxread - copied) n = maxread - copied;
        memcpy(static_cast<char *>(outbuf) + copied, pull.data + pull.off, n);
        pull.off += n;
        copied += n;
    }
    return copied;
}

// The elements of a text[] of column names as C strings (NULL for a NULL
// element), *n of them.
char **column_names(ArrayType *cols, int *n) {
    Datum *names;
    bool *nulls;
    deconstruct_array(cols, TEXTOID, -1, false, TYPALIGN_INT, &names, &nulls, n);
    char **out = static_cast<char **>(palloc0(sizeof(char *) * (*n + 1)));
    for (int i = 0; i < *n; i++) out[i] = nulls[i] ? nullptr : TextDatumGetCString(names[i]);
    return out;
}

// Whether every column named can travel in binary: built-in types with
// binary input and output (the same at both ends of one major version).
bool binary_ok(Relation rel, ArrayType *cols) {
    int n;
    char **names = column_names(cols, &n);
    for (int i = 0; i < n; i++) {
        if (names[i] == nullptr) return false;
        AttrNumber a = get_attnum(RelationGetRelid(rel), names[i]);
        if (a == InvalidAttrNumber) return false;
        Oid t = TupleDescAttr(RelationGetDescr(rel), a - 1)->atttypid;
        Oid elem = get_element_type(t);
        Oid base = OidIsValid(elem) ? elem : t;
        if (base >= FirstNormalObjectId) return false;
        HeapTuple tp = SearchSysCache1(TYPEOID, ObjectIdGetDatum(base));
        if (!HeapTupleIsValid(tp)) return false;
        Form_pg_type ty = (Form_pg_type)GETSTRUCT(tp);
        bool ok = OidIsValid(ty->typreceive) && OidIsValid(ty->typsend) && ty->typtype == TYPTYPE_BASE;
        ReleaseSysCache(tp);
        if (!ok) return false;
    }
    return true;
}

struct Opened {
    Relation rel;
    bool binary;
};

Opened open_target(Oid relid, ArrayType *cols) {
    Relation rel = table_open(relid, RowExclusiveLock);
    AclResult acl = pg_class_aclcheck(relid, GetUserId(), ACL_INSERT);
    if (acl != ACLCHECK_OK) aclcheck_error(acl, OBJECT_TABLE, RelationGetRelationName(rel));
    return Opened{rel, binary_ok(rel, cols)};
}

uint64 copy_from(Relation rel, ParseState *pstate, List *attnames, List *options) {
    CopyFromState cstate = BeginCopyFrom(pstate, rel, NULL, NULL, false, pull_source, attnames, options);
    uint64 rows = CopyFrom(cstate);
    EndCopyFrom(cstate);
    return rows;
}

struct CopyCall {
    Relation rel;
    ParseState *pstate;
    List *attnames;
    List *options;
};

uint64 copy_call(void *arg) {
    CopyCall *c = static_cast<CopyCall *>(arg);
    return copy_from(c->rel, c->pstate, c->attnames, c->options);
}

uint64 copy_into(Relation rel, ArrayType *cols, bool binary) {
    List *attnames = NIL;
    int n;
    char **names = column_names(cols, &n);
    for (int i = 0; i < n; i++) {
        if (names[i] == nullptr) ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("a column name is NULL")));
        attnames = lappend(attnames, makeString(names[i]));
    }
    List *options = list_make1(makeDefElem(pstrdup("format"), (Node *)makeString(pstrdup(binary ? "binary" : "text")), -1));
    if (!binary)
        options = lappend(options, makeDefElem(pstrdup("encoding"),
                                               (Node *)makeString(pstrdup(GetDatabaseEncodingName())), -1));
    // CopyFrom's executor state inserts through range table entry 1.
    ParseState *pstate = make_parsestate(NULL);
    (void)addRangeTableEntryForRelation(pstate, rel, RowExclusiveLock, NULL, false, false);
    // CopyFrom batches only into a table without BEFORE ROW INSERT triggers
    // (move_copy.hpp).
    CopyCall call{rel, pstate, attnames, options};
    uint64 rows = without_idle_triggers(rel, TRIGGER_TYPE_INSERT, copy_call, &call);
    free_parsestate(pstate);
    return rows;
}

void close_target(Relation rel) { table_close(rel, NoLock); }

// ------------------------------------------------------------ parts
// A copy in parts: each part is a session of this database (a loopback
// connection, named as this one, so that a move's undo ends it with the
// rest), running _move_pull itself on a range of the source table's blocks
// under the same exported snapshot, and committing on its own (the undo
// deletes whatever a failed move left here, as it does for the tables
// already copied). This session only waits for them and never locks rel,
// so that DDL queued on rel cannot wait on it while a part waits on the DDL.

struct Parts {
    std::vector<std::string> queries;  // empty: one session, this one
    std::string rel;                   // qualified, quoted
};

struct PartsCopied {
    uint64 rows;
    uint64 bytes;
};

// Glue: the caller may insert into rel (42501 otherwise). The parts run as
// the node's DSN user, so the caller's right is checked here, as
// open_target checks it for a copy in this session.
void check_insert(Oid relid) {
    AclResult acl = pg_class_aclcheck(relid, GetUserId(), ACL_INSERT);
    if (acl != ACLCHECK_OK) aclcheck_error(acl, OBJECT_TABLE, get_rel_name(relid));
}

// Glue: "SELECT <cols> FROM <rel> WHERE " as the orchestration writes it
// (format's %I, which is quote_identifier); *qualified: the rel part.
char *query_prefix(Oid relid, ArrayType *cols, char **qualified) {
    StringInfoData buf;
    initStringInfo(&buf);
    appendStringInfoString(&buf, "SELECT ");
    int n;
    char **names = column_names(cols, &n);
    for (int i = 0; i < n; i++) {
        if (names[i] == nullptr) return nullptr;
        appendStringInfo(&buf, "%s%s", i > 0 ? ", " : "", quote_identifier(names[i]));
    }
    char *nsp = get_namespace_name(get_rel_namespace(relid));
    char *relname = get_rel_name(relid);
    if (nsp == nullptr || relname == nullptr) return nullptr;
    *qualified = psprintf("%s.%s", quote_identifier(nsp), quote_identifier(relname));
    appendStringInfo(&buf, " FROM %s WHERE ", *qualified);
    return buf.data;
}

// The parts of a copy: only under a snapshot (every part must read the same
// state), only for the query the orchestration writes (its condition is
// then put in parentheses, ANDed with a block range), only for a table
// large enough at the source (pg_relation_size there).
Parts plan_parts(Remote &remote, Oid relid, ArrayType *cols, const std::string &query, const std::string &snapshot) {
    Parts parts;
    if (move_parallel < 2 || snapshot.empty()) return parts;
    char *qualified = nullptr;
    const char *prefix = glue(query_prefix, relid, cols, &qualified);
    if (prefix == nullptr || query.compare(0, strlen(prefix), prefix) != 0) return parts;
    std::string condition = query.substr(strlen(prefix));
    std::string rel = qualified;
    int64 blocks = std::strtoll(remote.run(blocks_query(rel)).c_str(), nullptr, 10);
    int n = parts_for(blocks);
    if (n < 2) return parts;
    glue(check_insert, relid);
    parts.rel = rel;
    for (int i = 0; i < n; i++) parts.queries.push_back(prefix + part_condition(condition, blocks, i, n));
    return parts;
}

// Glue: this node's name (sharding.this_node()), or NULL.
char *own_node() {
    char *out = nullptr;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    const bool snap = sharding::spi_snapshot_push();
    if (SPI_execute("SELECT sharding.this_node()", true, 1) == SPI_OK_SELECT && SPI_processed == 1) {
        char *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
        if (v != nullptr) out = MemoryContextStrdup(TopTransactionContext, v);
    }
    sharding::spi_snapshot_pop(snap);
    SPI_finish();
    return out;
}

// Glue: the array as text[]'s input reads it.
char *array_text(ArrayType *a) { return OidOutputFunctionCall(F_ARRAY_OUT, PointerGetDatum(a)); }

PartsCopied pull_parts(const std::string &name, const std::string &source, const std::string &snapshot,
                       ArrayType *cols, const Parts &parts) {
    const char *self = glue(own_node);
    if (self == nullptr)
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "a copy in parts needs this node attached (sharding.this_node())");
    std::string dsn = node_dsn(self);
    std::string columns = glue(array_text, cols);
    // Each part as this session copies: the guard's idle trigger left out
    // (replica role), ending by itself when this session is gone, in one
    // session (no parts within parts).
    std::string options = "-c client_connection_check_interval=1000 -c sharding.move_parallel=1 -c sharding.move_nice=" +
                          std::to_string(move_nice);
    if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA) options += " -c session_replication_role=replica";
    std::vector<std::unique_ptr<Remote>> running;
    for (const std::string &q : parts.queries) {
        running.push_back(std::make_unique<Remote>(dsn, false, name, options));
        nice_session(running.back()->conn());
        std::string sql = "SELECT sharding._move_pull(" + lit(source) + ", " + lit(snapshot) +
                          ", " + lit(parts.rel) + "::pg_catalog.regclass, " + lit(columns) +
                          "::text[], " + lit(q) + ")::text";
        if (PQsendQuery(running.back()->conn(), sql.c_str()) == 0)
            fail(ERRCODE_CONNECTION_FAILURE, "could not start a part of the copy: %s",
                 PQerrorMessage(running.back()->conn()));
    }
    std::vector<PGconn *> conns;
    for (auto &r : running) conns.push_back(r->conn());
    PartsCopied got{0, 0};
    for (const std::string &v : collect_all(conns, "copying a part: ")) {
        unsigned long long pr = 0, pb = 0;
        if (std::sscanf(v.c_str(), "{%llu,%llu}", &pr, &pb) != 2)
            fail(ERRCODE_PROTOCOL_VIOLATION, "unexpected answer from a part of the copy: %s", v.c_str());
        got.rows += pr;
        got.bytes += pb;
    }
    return got;
}

// ------------------------------------------------------------ idle triggers
// (move_copy.hpp)
bool fires_in_replica(const Trigger *t) {
    return t->tgenabled == TRIGGER_FIRES_ALWAYS || t->tgenabled == TRIGGER_FIRES_ON_REPLICA;
}

bool before_row(const Trigger *t, int16 event) {
    return TRIGGER_FOR_ROW(t->tgtype) && TRIGGER_FOR_BEFORE(t->tgtype) && (t->tgtype & event) != 0;
}

void free_trigger_fields(Trigger *t) {
    pfree(t->tgname);
    if (t->tgnattr > 0) pfree(t->tgattr);
    if (t->tgnargs > 0) {
        for (int i = 0; i < t->tgnargs; i++) pfree(t->tgargs[i]);
        pfree(t->tgargs);
    }
    if (t->tgqual) pfree(t->tgqual);
    if (t->tgoldtable) pfree(t->tgoldtable);
    if (t->tgnewtable) pfree(t->tgnewtable);
}

// The triggers of rel without its BEFORE ROW triggers for `event` that
// cannot fire here (in CacheMemoryContext, as relcache owns it while it
// is installed), or NULL when none is left out (nothing to gain). *none:
// no trigger is left at all.
TriggerDesc *idle_left_out(Relation rel, int16 event, bool *none) {
    *none = false;
    TriggerDesc *orig = rel->trigdesc;
    if (SessionReplicationRole != SESSION_REPLICATION_ROLE_REPLICA || orig == nullptr ||
        rel->rd_rel->relkind != RELKIND_RELATION)
        return nullptr;
    if (!(event == TRIGGER_TYPE_INSERT ? orig->trig_insert_before_row : orig->trig_delete_before_row))
        return nullptr;
    bool drop_any = false;
    for (int i = 0; i < orig->numtriggers; i++) {
        const Trigger *t = &orig->triggers[i];
        if (before_row(t, event)) {
            // One runs: the statement pays for BEFORE ROW triggers anyway.
            if (fires_in_replica(t)) return nullptr;
            drop_any = true;
        }
    }
    if (!drop_any) return nullptr;
    MemoryContext old = MemoryContextSwitchTo(CacheMemoryContext);
    TriggerDesc *td = CopyTriggerDesc(orig);
    MemoryContextSwitchTo(old);
    int kept = 0;
    for (int i = 0; i < td->numtriggers; i++) {
        Trigger *t = &td->triggers[i];
        if (before_row(t, event)) {
            free_trigger_fields(t);
            continue;
        }
        if (kept != i) td->triggers[kept] = *t;
        kept++;
    }
    td->numtriggers = kept;
    // Every one left out; the other flags only say where to look.
    if (event == TRIGGER_TYPE_INSERT)
        td->trig_insert_before_row = false;
    else
        td->trig_delete_before_row = false;
    if (kept == 0) {
        pfree(td->triggers);
        pfree(td);
        *none = true;
        return nullptr;
    }
    return td;
}

// A relcache rebuild of rel meanwhile (an invalidation) replaces and frees
// the installed copy: then the entry holds the catalog's triggers again and
// the saved original is this function's to free.
void put_back(Relation rel, TriggerDesc *orig, TriggerDesc *installed) {
    if (rel->trigdesc == installed) {
        rel->trigdesc = orig;
        if (installed != nullptr) FreeTriggerDesc(installed);
    } else {
        FreeTriggerDesc(orig);
    }
}

}  // namespace

uint64 without_idle_triggers(Relation rel, int16 event, uint64 (*fn)(void *), void *arg) {
    bool none = false;
    TriggerDesc *quiet = idle_left_out(rel, event, &none);
    if (quiet == nullptr && !none) return fn(arg);
    TriggerDesc *orig = rel->trigdesc;
    uint64 rows = 0;
    rel->trigdesc = quiet;
    PG_TRY();
    {
        rows = fn(arg);
    }
    PG_CATCH();
    {
        put_back(rel, orig, quiet);
        PG_RE_THROW();
    }
    PG_END_TRY();
    put_back(rel, orig, quiet);
    return rows;
}

int move_parallel = 2;
int move_nice = 0;
bool move_verify = true;
int move_cleanup = static_cast<int>(Cleanup::Immediate);

void nice_session(PGconn *conn, int nice) {
    if (nice <= 0) return;
    auto ask = [conn](const std::string &sql) { return answer(run_statement(conn, sql.c_str(), "", true)); };
    if (ask("SELECT coalesce(pg_catalog.has_function_privilege(p, 'EXECUTE'), false) "
            "FROM pg_catalog.to_regprocedure('sharding._move_nice(integer)') p") != "t")
        return;
    ask("SELECT sharding._move_nice(" + std::to_string(nice) + ")");
}

int parts_for(int64 blocks, int sessions) {
    int64 n = std::min<int64>(sessions, blocks / kPartPages);
    return n < 1 ? 1 : (int)n;
}

std::string part_condition(const std::string &condition, int64 blocks, int i, int n) {
    auto tid = [](int64 block) { return "'(" + std::to_string(block) + ",0)'::pg_catalog.tid"; };
    std::string q = "(" + condition + ")";
    // Rows written after a snapshot may lie beyond the size read: the last
    // part has no end.
    if (i > 0) q += " AND ctid OPERATOR(pg_catalog.>=) " + tid(blocks * i / n);
    if (i < n - 1) q += " AND ctid OPERATOR(pg_catalog.<) " + tid(blocks * (i + 1) / n);
    return q;
}

std::string blocks_query(const std::string &rel) {
    return "SELECT pg_catalog.pg_relation_size(" + lit(rel) +
           "::pg_catalog.regclass) / pg_catalog.current_setting('block_size')::pg_catalog.int8";
}

std::string shard_leaves_sql(const std::string &rel) {
    return "SELECT c.oid, pg_catalog.format('%I.%I', n.nspname, c.relname) AS leaf, "
           "pg_catalog.format('sharding.shard_of(%s, %s) OPERATOR(pg_catalog.=) %s', pg_catalog.quote_ident(a.attname), "
           "b.m[1], b.m[2]) AS shard FROM pg_catalog.pg_partitioned_table pt "
           "JOIN pg_catalog.pg_opclass oc ON oc.oid = pt.partclass[0] "
           "JOIN pg_catalog.pg_namespace ocn ON ocn.oid = oc.opcnamespace AND ocn.nspname = 'sharding' "
           "JOIN pg_catalog.pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0] AND a.attnotnull "
           "JOIN pg_catalog.pg_inherits i ON i.inhparent = pt.partrelid "
           "JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid AND c.relkind = 'r' "
           "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
           "CROSS JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), "
           "'^FOR VALUES WITH \\(modulus ([0-9]+), remainder ([0-9]+)\\)$') AS b(m) "
           "WHERE pt.partrelid = " + rel + " AND pt.partstrat = 'h' AND pt.partnatts = 1 "
           "AND oc.opcname LIKE '%\\_shard\\_ops'";
}

std::string answer(PGresult *res) {
    std::string out;
    if (res == nullptr) return out;
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        out = PQcmdStatus(res);
    else if (PQntuples(res) > 0 && PQnfields(res) > 0 && !PQgetisnull(res, 0, 0))
        out = PQgetvalue(res, 0, 0);
    PQclear(res);
    return out;
}

std::vector<std::string> collect_all(const std::vector<PGconn *> &conns, const char *prefix) {
    std::vector<std::string> out(conns.size());
    std::vector<PGconn *> left(conns);
    for (;;) {
        PGconn *busy = nullptr;
        bool any = false;
        for (size_t i = 0; i < left.size(); i++) {
            PGconn *c = left[i];
            if (c == nullptr) continue;
            if (PQflush(c) < 0 || PQconsumeInput(c) == 0)
                fail(ERRCODE_CONNECTION_FAILURE, "lost a connection: %s", PQerrorMessage(c));
            if (PQisBusy(c)) {
                busy = busy ? busy : c;
                any = true;
                continue;
            }
            // Its answer has arrived: read it (a remote error is thrown here).
            out[i] = answer(collect_statement(c, prefix, true));
            left[i] = nullptr;
        }
        if (!any) return out;
        // Wakes as soon as the first busy one has data, or after 10 ms to
        // look at the others (or at once on a cancel).
        glue(wait_for_any, PQsocket(busy));
    }
}

std::string conninfo_of(PGconn *conn) {
    std::string out;
    PQconninfoOption *opts = PQconninfo(conn);
    if (opts == nullptr) fail(ERRCODE_OUT_OF_MEMORY, "out of memory");
    for (PQconninfoOption *o = opts; o->keyword != nullptr; o++) {
        if (o->val == nullptr || *o->val == '\0' || std::strcmp(o->keyword, "replication") == 0) continue;
        out += std::string(o->keyword) + "='";
        for (const char *c = o->val; *c; c++) {
            if (*c == '\'' || *c == '\\') out += '\\';
            out += *c;
        }
        out += "' ";
    }
    PQconninfoFree(opts);
    return out;
}

bool out_of_connections(const Error &e) {
    if (e.sqlstate() != ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION &&
        e.sqlstate() != ERRCODE_TOO_MANY_CONNECTIONS)
        return false;
    const char *m = e.what();
    return std::strstr(m, "too many clients already") != nullptr ||
           std::strstr(m, "remaining connection slots are reserved") != nullptr ||
           std::strstr(m, "too many connections for") != nullptr;
}

void run_queue(const std::vector<PGconn *> &conns, const std::vector<std::string> &work, const char *prefix,
               const std::function<void(size_t, const std::string &)> &done, const std::function<void()> &tick,
               long tick_ms) {
    constexpr long kRetired = -2;
    std::vector<long> running(conns.size(), -1);  // the item each connection runs, -1: none
    size_t next = 0, left = work.size(), active = conns.size();
    std::vector<size_t> again;  // items given back by a retired connection
    auto send = [&](size_t c) {
        size_t item;
        if (!again.empty()) {
            item = again.back();
            again.pop_back();
        } else if (next < work.size()) {
            item = next++;
        } else {
            return;
        }
        if (PQsendQuery(conns[c], work[item].c_str()) == 0)
            fail(ERRCODE_CONNECTION_FAILURE, "%scould not send a statement: %s", prefix, PQerrorMessage(conns[c]));
        running[c] = (long)item;
    };
    for (size_t c = 0; c < conns.size(); c++) send(c);
    auto last_tick = std::chrono::steady_clock::now();
    while (left > 0) {
        PGconn *busy = nullptr;
        for (size_t c = 0; c < conns.size(); c++) {
            if (running[c] < 0) continue;
            PGconn *conn = conns[c];
            if (PQflush(conn) < 0 || PQconsumeInput(conn) == 0)
                fail(ERRCODE_CONNECTION_FAILURE, "lost a connection: %s", PQerrorMessage(conn));
            if (PQisBusy(conn)) {
                busy = busy ? busy : conn;
                continue;
            }
            // Its answer has arrived: read it (a remote error is thrown
            // here), then this connection takes the next item.
            const size_t item = (size_t)running[c];
            std::string v;
            try {
                v = answer(collect_statement(conn, prefix, true));
            } catch (const Error &e) {
                // The item could not get a connection of its own (a node at
                // max_connections): nothing of it ran; it goes back to the
                // queue and this connection stops taking items, while
                // another still works.
                if (active < 2 || !out_of_connections(e)) throw;
                warn(format("%sone of %zu sessions stops, the others go on: %s", prefix, active, e.what()),
                     "Raise max_connections there, or lower sharding.move_parallel.");
                running[c] = kRetired;
                active--;
                again.push_back(item);
                for (size_t o = 0; o < conns.size() && !again.empty(); o++)
                    if (running[o] == -1) send(o);
                continue;
            }
            running[c] = -1;
            left--;
            done(item, v);
            send(c);
            if (running[c] >= 0) busy = busy ? busy : conn;
        }
        if (left == 0) break;
        const auto now = std::chrono::steady_clock::now();
        if (tick && now - last_tick >= std::chrono::milliseconds(tick_ms)) {
            tick();
            last_tick = now;
        }
        // Wakes as soon as the first busy one has data, or after 10 ms to
        // look at the others (or at once on a cancel).
        if (busy != nullptr) glue(wait_for_any, PQsocket(busy));
    }
}

}  // namespace sharding::move

namespace sharding {
// Called from _PG_init: sharding.move_parallel, sharding.move_nice,
// sharding.move_verify and sharding.move_cleanup.
void copy_init() {
    DefineCustomIntVariable("sharding.move_parallel",
                            "Sessions that copy an online move's tables, or delete one of them, at once.",
                            "Read where the copy runs (the destination) and where the move runs (the coordinator, "
                            "for the deletes). The copy's sessions take the next part of any table (a table, a "
                            "leaf partition, or a range of the blocks of one of 4 MB or more) as each is done; "
                            "a delete's session takes a range of the table's blocks.",
                            &move::move_parallel, 2, 1, 16, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("sharding.move_nice",
                            "How much lower than other sessions' an online move's copy runs (nice value added).",
                            "Read where the copy runs (the destination): the source's COPY session and each part's "
                            "session at the destination raise their nice value by this much, so that the nodes' "
                            "own work comes first where CPUs are short. 0 (the default) leaves them alone.",
                            &move::move_nice, 0, 0, 19, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomBoolVariable("sharding.move_verify",
                             "Whether an online move compares the shard's rows at both ends before it deletes the "
                             "source's copy.",
                             "Read where the move runs (the coordinator). After the switch, outside the refusal "
                             "window, each table's count and order-independent checksum of the shard's rows at the "
                             "source (frozen since the cutover) are compared with the destination's as of the "
                             "switch; a difference keeps the source's copy and fails the move. off skips it.",
                             &move::move_verify, true, PGC_USERSET, 0, nullptr, nullptr, nullptr);
    static const config_enum_entry cleanups[] = {
        {"immediate", static_cast<int>(move::Cleanup::Immediate), false},
        {"deferred", static_cast<int>(move::Cleanup::Deferred), false},
        {nullptr, 0, false}};
    DefineCustomEnumVariable("sharding.move_cleanup",
                             "When move_shard_online deletes the moved shard's rows at the source: before it returns "
                             "(immediate) or right after, in a background worker (deferred).",
                             "Read where the move runs (the coordinator), for direct move_shard_online calls (isolate "
                             "and rebalance jobs clean up in the move). deferred: the call returns once the switch "
                             "is done, the followers see it and the copies are verified; the source's rows, refused "
                             "to writers and routed nowhere, are deleted by a background worker, the journal row in "
                             "phase cleanup until then; a crash resumes it. A later move of the same shard waits "
                             "for it (55006).",
                             &move::move_cleanup, static_cast<int>(move::Cleanup::Immediate), cleanups,
                             PGC_USERSET, 0, nullptr, nullptr, nullptr);
}
}  // namespace sharding

using namespace sharding;
using namespace sharding::move;

// _move_pull(source text, snapshot text, rel regclass, columns text[], query text) RETURNS bigint[]
// {rows, bytes}
SHARDING_FUNCTION(sharding__move_pull) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(2) || PG_ARGISNULL(3) || PG_ARGISNULL(4))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "source, rel, columns and query must not be NULL");
    std::string source = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(0)); });
    std::string snapshot =
        PG_ARGISNULL(1) ? std::string() : pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(1)); });
    Oid relid = PG_GETARG_OID(2);
    ArrayType *cols = pg_call([&]() -> ArrayType * { return PG_GETARG_ARRAYTYPE_P(3); });
    std::string query = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(4)); });

    // SEC-4: the source's whole DSN (its kept password) only for the
    // engine's own copy (a caller who may use the owner's credentials: the
    // engine's session at the destination logs in as the node DSN's role).
    std::string dsn = caller_dsn(node_dsn(source));
    const char *appname = pg_call([]() -> const char * { return GetConfigOption("application_name", true, false); });
    std::string name = appname ? appname : "sharding";
    Remote remote(dsn, false, name + "_copy");
    uint64 rows = 0;
    uint64 bytes = 0;
    try {
        remote.run("SET search_path = pg_catalog, pg_temp");
        nice_session(remote.conn());
        remote.run(std::string("SET client_encoding = ") +
                   lit(pg_call([]() -> const char * { return GetDatabaseEncodingName(); })));
        remote.run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
        if (!snapshot.empty()) remote.run("SET TRANSACTION SNAPSHOT " + lit(snapshot));
        // A large table under a snapshot goes in parts, each in a session
        // of its own (this one only waits for them: it holds no lock on rel).
        Parts parts = plan_parts(remote, relid, cols, query, snapshot);
        if (!parts.queries.empty()) {
            remote.run("COMMIT");
            PartsCopied got = pull_parts(name, source, snapshot, cols, parts);
            rows = got.rows;
            bytes = got.bytes;
        } else {
            Opened target = pg_call([&]() -> Opened { return open_target(relid, cols); });
            remote.start_copy_out("COPY (" + query + ") TO STDOUT" + (target.binary ? " (FORMAT binary)" : ""));
            pull = PullState{&remote, nullptr, 0, 0, false, 0};
            rows = pg_call([&]() -> uint64 { return copy_into(target.rel, cols, target.binary); });
            pull.remote = nullptr;
            remote.run("COMMIT");
            bytes = pull.bytes;
            glue(close_target, target.rel);
        }
    } catch (...) {
        pull.remote = nullptr;
        remote.cancel();
        throw;  // the relation is closed by the abort
    }
    Datum out[2] = {Int64GetDatum((int64)rows), Int64GetDatum((int64)bytes)};
    ArrayType *arr = pg_call([&]() -> ArrayType * { return construct_array(out, 2, INT8OID, 8, true, TYPALIGN_DOUBLE); });
    PG_RETURN_ARRAYTYPE_P(arr);
}

// _move_slot_create(source text, slot text, plugin text, options text, OUT lsn pg_lsn, OUT snapshot text)
// options: server settings for the replication session (e.g. the
// source's output_plugin_libraries plus "sharding"), or NULL.
namespace sharding::move {

// Creates move slot `slot` at node `source` over a replication connection
// with plugin `plugin`, exporting its snapshot; the connection is held
// (hold_connection) until close_held(slot). Its LSN and the snapshot.
SlotMade create_slot(const std::string &source, const std::string &slot, const std::string &plugin,
                     const std::string &options) {
    if (!valid_slot_name(slot) || !valid_slot_name(plugin))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "slot and plugin names must be [a-z0-9_]{1,63}");
    std::string dsn = node_dsn(source);
    auto remote = std::make_unique<Remote>(dsn, true, slot + "_slot", options);
    PGresult *res = nullptr;
    remote->run("CREATE_REPLICATION_SLOT " + slot + " LOGICAL " + plugin + " (SNAPSHOT 'export')", &res);
    if (res == nullptr || PQntuples(res) != 1 || PQnfields(res) < 3) {
        if (res) PQclear(res);
        fail(ERRCODE_PROTOCOL_VIOLATION, "unexpected answer to CREATE_REPLICATION_SLOT");
    }
    SlotMade made{PQgetvalue(res, 0, 1), PQgetisnull(res, 0, 2) ? std::string() : PQgetvalue(res, 0, 2)};
    PQclear(res);
    hold_connection(slot, remote->release());
    return made;
}

}  // namespace sharding::move

SHARDING_FUNCTION(sharding__move_slot_create) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "source, slot and plugin must not be NULL");
    std::string source = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(0)); });
    std::string slot = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(1)); });
    std::string plugin = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(2)); });
    std::string options =
        PG_ARGISNULL(3) ? std::string() : pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(3)); });
    // SEC-4: a slot (and a replication session with the caller's options)
    // at a node logged in with its kept password only for the engine (which
    // calls create_slot itself), the owner and superusers.
    (void)caller_dsn(node_dsn(source));
    const SlotMade made = create_slot(source, slot, plugin, options);
    const std::string &lsn = made.lsn, &snap = made.snapshot;

    TupleDesc desc;
    if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
        fail(ERRCODE_FEATURE_NOT_SUPPORTED, "_move_slot_create must return a record");
    const char *l = lsn.c_str();
    const char *s = snap.c_str();
    HeapTuple t = pg_call([&]() -> HeapTuple {
        Datum vals[2] = {DirectFunctionCall1(pg_lsn_in, CStringGetDatum(l)), CStringGetTextDatum(s)};
        bool nulls[2] = {false, false};
        return heap_form_tuple(BlessTupleDesc(desc), vals, nulls);
    });
    return HeapTupleGetDatum(t);
}

// _move_nice(step integer) RETURNS integer: raises this backend's nice
// value by step (0-19; at most to 19) and returns it. A session of a move's
// copy asks for it (sharding.move_nice); there is no way back down for the
// session (an unprivileged process cannot lower its nice value).
SHARDING_FUNCTION(sharding__move_nice) {
    if (PG_ARGISNULL(0)) fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "step must not be NULL");
    int32 step = PG_GETARG_INT32(0);
    if (step < 0 || step > 19) fail(ERRCODE_INVALID_PARAMETER_VALUE, "step must be between 0 and 19, not %d", step);
    errno = 0;
    int now = getpriority(PRIO_PROCESS, 0);
    if (now == -1 && errno != 0)
        fail(ERRCODE_SYSTEM_ERROR, "could not read this backend's nice value: %s", std::strerror(errno));
    int want = std::min(19, now + step);
    if (want != now && setpriority(PRIO_PROCESS, 0, want) != 0)
        fail(ERRCODE_SYSTEM_ERROR, "could not set this backend's nice value to %d: %s", want, std::strerror(errno));
    PG_RETURN_INT32(want);
}

// _move_host(OUT host text, OUT cpus integer): the machine this node runs
// on and the CPUs its backends may run on. The host is the kernel's boot
// id (/proc/sys/kernel/random/boot_id), the same for every instance,
// database and container of one machine, different after a reboot (a move
// in flight does not outlive one); where it cannot be read, the host's
// name. The CPUs are this backend's affinity mask (a cpuset limits it),
// else the CPUs online, or fewer where its cgroups' CPU quota allows less
// (src/core/cpu_quota.hpp: docker --cpus, a Kubernetes CPU limit). A move asks both of its ends when it starts: moves
// in flight on one host share its CPUs' worth of sessions (move_engine.hpp,
// move_share).
SHARDING_FUNCTION(sharding__move_host) {
    std::string host;
    if (FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
        char buf[64] = {0};
        if (std::fgets(buf, sizeof buf, f) != nullptr) host = buf;
        std::fclose(f);
        while (!host.empty() && (host.back() == '\n' || host.back() == ' ')) host.pop_back();
    }
    if (host.empty()) {
        char name[256] = {0};
        if (gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') host = std::string("name:") + name;
    }
    int cpus = 0;
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
#endif
    if (cpus < 1) cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    if (cpus < 1) cpus = 1;
    // A container's CPU quota (cgroup v2's cpu.max, v1's cfs quota) allows
    // fewer CPUs' worth of time than its affinity mask shows.
    const int quota = cgroup_cpu_limit();
    if (quota > 0 && quota < cpus) cpus = quota;

    TupleDesc desc;
    if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
        fail(ERRCODE_FEATURE_NOT_SUPPORTED, "_move_host must return a record");
    const char *h = host.c_str();
    const bool no_host = host.empty();
    HeapTuple t = pg_call([&]() -> HeapTuple {
        Datum vals[2] = {no_host ? Datum(0) : CStringGetTextDatum(h), Int32GetDatum(cpus)};
        bool nulls[2] = {no_host, false};
        return heap_form_tuple(BlessTupleDesc(desc), vals, nulls);
    });
    return HeapTupleGetDatum(t);
}
