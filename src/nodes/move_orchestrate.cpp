// The orchestration of an online move, in C++ (docs/moves.md; no PL/pgSQL
// on the move's path): sharding._move_online, the engine of
// move_shard_online and isolate, and the small steps only it used to call
// through PL/pgSQL: _move_finish, _move_undo (also called by _move_resolve,
// through their SQL names), _move_drop_replication, _move_drop_triggers,
// _move_stop_backends, _move_sees_switch, _move_journal, _move_phase,
// _move_call, each kept under its SQL name as a thin LANGUAGE C wrapper.
//
// Local steps run through SPI (every value a parameter, the SQL function
// runs with search_path = pg_catalog, pg_temp and every name qualified);
// remote steps over the session's named connections of remote_exec.cpp
// (sharding_move_src, _dst, _self): interruptible, the remote statement
// cancelled (PQcancel) when the caller is cancelled or fails. Identifiers
// and literals in remote SQL are quoted as pg_catalog.format's %I and %L
// quote them (quote_identifier, quote_literal_cstr).
//
// Transactions, exactly as the PL/pgSQL version had them: the journal is
// written over sharding_move_self, a connection of this session to this
// database, so each step is committed there before it acts, whatever this
// transaction does; the owner switch commits over the same connection
// together with the journal's 'cleanup'. The move's main block runs in a
// subtransaction (what a PL/pgSQL EXCEPTION block is): on any error,
// cancel included, it is rolled back, then the source is thawed, the move
// undone (or, after the switch, finished) from fresh connections, and the
// original error raised with its SQLSTATE, message, detail and hint.
//
// Boundary (src/pg/boundary.hpp): every PostgreSQL call that may ereport
// while a C++ object is alive goes through glue/pg_call; the SPI glue is
// C-style code with plain C parameters.
#include "nodes/move_remote.hpp"

#include <cstdlib>
#include <initializer_list>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" {
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "storage/latch.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

namespace sharding::move {
namespace {

using Text = std::optional<std::string>;

// ------------------------------------------------------------------ SPI

struct SpiRows {
    int nrows;
    int ncols;
    char **cells;  // row-major; NULL for SQL NULL
};

// Glue: runs sql with text parameters (NULL pointer: SQL NULL) through SPI,
// read-write (a fresh snapshot, as PL/pgSQL runs a volatile function's
// statements); copies every cell as text into `into`.
SpiRows *spi_glue(const char *sql, int nargs, const char *const *args, MemoryContext into) {
    Oid types[16];
    Datum vals[16];
    char nulls[16];
    if (nargs > 16) elog(ERROR, "too many SPI parameters");
    for (int i = 0; i < nargs; i++) {
        types[i] = TEXTOID;
        vals[i] = args[i] != NULL ? CStringGetTextDatum(args[i]) : (Datum)0;
        nulls[i] = args[i] != NULL ? ' ' : 'n';
    }
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    int rc = SPI_execute_with_args(sql, nargs, types, vals, nulls, false, 0);
    if (rc < 0) elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
    MemoryContext old = MemoryContextSwitchTo(into);
    SpiRows *out = (SpiRows *)palloc0(sizeof(SpiRows));
    if (SPI_tuptable != NULL) {
        out->nrows = (int)SPI_processed;
        out->ncols = SPI_tuptable->tupdesc->natts;
        out->cells = (char **)palloc0(sizeof(char *) * Max(1, out->nrows * out->ncols));
        for (int r = 0; r < out->nrows; r++)
            for (int c = 0; c < out->ncols; c++)
                out->cells[r * out->ncols + c] = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, c + 1);
    }
    MemoryContextSwitchTo(old);
    SPI_finish();
    return out;
}

using Row = std::vector<Text>;

std::vector<Row> spi_rows(const char *sql, std::initializer_list<const char *> args) {
    std::vector<const char *> a(args);
    SpiRows *res = glue(spi_glue, sql, (int)a.size(), (const char *const *)a.data(), CurrentMemoryContext);
    std::vector<Row> rows;
    for (int r = 0; r < res->nrows; r++) {
        Row row;
        for (int c = 0; c < res->ncols; c++) {
            char *v = res->cells[r * res->ncols + c];
            row.push_back(v != nullptr ? Text(v) : std::nullopt);
        }
        rows.push_back(std::move(row));
    }
    return rows;
}

// The first value of the first row (nullopt: NULL or no row).
Text spi_value(const char *sql, std::initializer_list<const char *> args) {
    std::vector<Row> rows = spi_rows(sql, args);
    if (rows.empty() || rows[0].empty()) return std::nullopt;
    return rows[0][0];
}

const char *c(const Text &t) { return t ? t->c_str() : nullptr; }

// ------------------------------------------------------------------ quoting

// As pg_catalog.format's %I.
std::string ident(const std::string &s) {
    const char *q = glue(quote_identifier, s.c_str());
    std::string r(q);
    if (q != s.c_str()) pfree((void *)q);
    return r;
}

// As pg_catalog.format's %L (NULL unquoted).
std::string lit(const Text &s) {
    if (!s) return "NULL";
    char *q = glue(quote_literal_cstr, s->c_str());
    std::string r(q);
    pfree(q);
    return r;
}

// ------------------------------------------------------------------ remote

const char *const kSrc = "sharding_move_src";
const char *const kDst = "sharding_move_dst";
const char *const kSelf = "sharding_move_self";
const char *const kLive = "phase NOT IN ('done', 'failed', 'cancelled')";

Text dbl(const char *conn, const std::string &sql) {
    std::string v;
    if (named_run(conn, sql.c_str(), &v)) return v;
    return std::nullopt;
}

// _move_journal: a statement on the journal over sharding_move_self
// (committed at once); its first value.
Text journal(const std::string &sql) {
    if (!named_open(kSelf)) {
        Text dsn = spi_value("SELECT sharding._coordinator_dsn()", {});
        named_connect(kSelf, c(dsn));
    }
    return dbl(kSelf, sql);
}

void phase(const std::string &map, int32 logical, const char *ph) {
    journal("UPDATE sharding.move_journal SET phase = " + lit(std::string(ph)) +
            ", phase_started = pg_catalog.now() WHERE map = " + lit(map) + " AND logical = " +
            std::to_string(logical) + " AND " + kLive);
}

// _move_call: sharding.<fn>(map, logical) there.
void call_fn(const char *conn, const std::string &fn, const std::string &map, int32 logical) {
    dbl(conn, "SELECT sharding." + ident(fn) + "(" + lit(map) + ", " + std::to_string(logical) + ")");
}

void disconnect() { spi_value("SELECT sharding._move_disconnect()", {}); }

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

// An interruptible sleep (glue), as pg_sleep.
void sleep_glue(long ms) {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
}
void sleep_ms(long ms) { glue(sleep_glue, ms); }

std::string move_name(const std::string &map, int32 logical) {
    const std::string l = std::to_string(logical);
    return spi_value("SELECT sharding._move_name($1, $2::integer)", {map.c_str(), l.c_str()}).value_or(std::string());
}

// _move_drop_replication: the subscription at the destination (without
// contacting the source, which may be down), then the slot (waiting for
// its walsender to let go, ending it after 2 s) and the publication at the
// source.
void drop_replication(const std::string &name) {
    if (dbl(kDst, "SELECT count(*) FROM pg_catalog.pg_subscription WHERE subname = " + lit(name)) != Text("0")) {
        dbl(kDst, "ALTER SUBSCRIPTION " + ident(name) + " DISABLE");
        dbl(kDst, "ALTER SUBSCRIPTION " + ident(name) + " SET (slot_name = NONE)");
        dbl(kDst, "DROP SUBSCRIPTION " + ident(name));
    }
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

// _move_drop_triggers: a 1.2 move's filter trigger on the map's tables at
// the destination.
void drop_triggers(const std::string &map, const std::string &name) {
    for (Row &r : spi_rows("SELECT m.rel FROM sharding._move_tables($1) m", {map.c_str()})) {
        const std::string rel = r[0].value_or(std::string());
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

// _move_finish: the end of a move whose switch has committed (also run
// after a crash): waits until the source and the destination show it,
// thaws, drops the replication objects, deletes the moved rows at the
// source, closes the journal. Connections sharding_move_src/_dst/_self are
// open. Returns the rows deleted at the source.
int64 finish(const std::string &map, int32 logical, const Text &key, const std::string &destination,
             const Text &new_epoch) {
    const std::string name = move_name(map, logical);
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
    Text deleted = spi_value("SELECT sharding._move_delete_rows('sharding_move_src', $1, $2::integer, $3)",
                             {map.c_str(), logical_s.c_str(), c(key)});
    journal("UPDATE sharding.move_journal SET phase = 'done', phase_started = pg_catalog.now(), "
            "finished = pg_catalog.now(), rows_moved = " + deleted.value_or("NULL") +
            ", lag_bytes = 0, pid = NULL WHERE map = " + lit(map) + " AND logical = " + logical_s + " AND " + kLive);
    return deleted ? std::strtoll(deleted->c_str(), nullptr, 10) : 0;
}

// _move_undo: undoes a move whose switch has not committed: drops its
// replication objects and triggers, deletes what it copied to the
// destination, thaws the source, marks the journal row undone.
void undo(const std::string &map, int32 logical, const Text &key) {
    const std::string name = move_name(map, logical);
    const std::string logical_s = std::to_string(logical);
    spi_value("SELECT sharding._move_slot_close($1)", {name.c_str()});
    drop_replication(name);
    drop_triggers(map, name);
    // A copy still running at the destination (its caller was cancelled or
    // died) would commit after the delete below: end it first, and wait.
    stop_backends(kDst, name);
    spi_value("SELECT sharding._move_delete_rows('sharding_move_dst', $1, $2::integer, $3)",
              {map.c_str(), logical_s.c_str(), c(key)});
    call_fn(kSrc, "_thaw_shard", map, logical);
    journal("UPDATE sharding.move_journal SET undone = true WHERE map = " + lit(map) + " AND logical = " + logical_s +
            " AND " + kLive);
}

// ------------------------------------------------------------------ errors

// An error caught by a block, as GET STACKED DIAGNOSTICS reads it.
struct Caught {
    int code = ERRCODE_INTERNAL_ERROR;
    std::string message, detail, hint, context;
};

// Inside a catch block: what is being handled.
void catch_current(Caught *out) {
    try {
        throw;
    } catch (const Error &e) {
        out->code = e.sqlstate();
        out->message = e.what();
        out->detail = e.detail();
        out->hint = e.hint();
    } catch (const PgError &e) {
        ErrorData *d = e.data();
        out->code = d->sqlerrcode;
        out->message = d->message ? d->message : "";
        out->detail = d->detail ? d->detail : "";
        out->hint = d->hint ? d->hint : "";
        out->context = d->context ? d->context : "";
    } catch (const std::bad_alloc &) {
        out->code = ERRCODE_OUT_OF_MEMORY;
        out->message = "out of memory";
    } catch (const std::invalid_argument &e) {
        out->code = ERRCODE_INVALID_PARAMETER_VALUE;
        out->message = e.what();
    } catch (const std::exception &e) {
        out->message = e.what();
    } catch (...) {
        out->message = "unknown C++ exception";
    }
}

// What PL/pgSQL's WHEN OTHERS does not catch.
bool not_others(int code) { return code == ERRCODE_QUERY_CANCELED || code == ERRCODE_ASSERT_FAILURE; }

[[noreturn]] void reraise(const Caught &e) { throw Error(e.code, e.message, e.detail, e.hint); }

// Runs body in a subtransaction (a PL/pgSQL block with an EXCEPTION
// clause): released if it returns, rolled back if it throws, the error in
// *caught. The caller's memory context and resource owner are restored.
template <typename F>
bool subxact(F &&body, Caught *caught) {
    MemoryContext cxt = CurrentMemoryContext;
    ResourceOwner owner = CurrentResourceOwner;
    glue(BeginInternalSubTransaction, (const char *)nullptr);
    MemoryContextSwitchTo(cxt);
    bool ok = true;
    try {
        body();
    } catch (...) {
        ok = false;
        catch_current(caught);
    }
    if (ok)
        glue(ReleaseCurrentSubTransaction);
    else
        glue(RollbackAndReleaseCurrentSubTransaction);
    MemoryContextSwitchTo(cxt);
    CurrentResourceOwner = owner;
    return ok;
}

// ------------------------------------------------------------------ the move

struct Table {
    std::string rel;
    Text filter, cols, attnames;
};

struct MoveResult {
    Text new_epoch;
    int64 moved = 0;
};

MoveResult move_online(const Text &map_arg, int32 logical, const Text &key, const std::string &node) {
    const std::string logical_s = std::to_string(logical);
    Text name_t = spi_value("SELECT sharding._move_name($1, $2::integer)", {c(map_arg), logical_s.c_str()});
    Text shards_t = spi_value("SELECT sharding._require_map($1)::text", {c(map_arg)});
    const std::string map = *map_arg;  // _require_map refused NULL
    const std::string name = name_t.value_or(std::string());
    const std::string shards = shards_t.value_or(std::string());
    MoveResult out;

    // One move per shard at a time (a transaction-level lock: a crashed
    // caller's lock goes with it, and its journal row tells the next call).
    if (spi_value("SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('sharding.move_shard_online'), "
                  "pg_catalog.hashtext($1))",
                  {name.c_str()}) != Text("t"))
        fail(ERRCODE_OBJECT_IN_USE, "logical shard %d of map \"%s\" is already being moved", logical, map.c_str());
    Text source;
    if (!key) {
        std::vector<Row> r = spi_rows(
            "SELECT s.node, s.epoch::text FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer",
            {map.c_str(), logical_s.c_str()});
        if (!r.empty()) {
            source = r[0][0];
            out.new_epoch = r[0][1];
        }
    } else {
        source = spi_value("SELECT coalesce((SELECT p.node FROM sharding.pins p WHERE p.map = $1 AND p.key = $3), "
                           "(SELECT s.node FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer))",
                           {map.c_str(), logical_s.c_str(), c(key)});
        out.new_epoch = spi_value("SELECT s.epoch::text FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer",
                                  {map.c_str(), logical_s.c_str()});
    }
    if (source && *source == node) {
        if (key)  // isolate pins even where the rows already are
            spi_value("SELECT sharding.pin($1, $2, $3)", {map.c_str(), c(key), node.c_str()});
        return out;
    }

    // The source's slot waits for every transaction holding a transaction
    // id to end, this one included when the source shares its instance.
    if (spi_value("SELECT pg_catalog.txid_current_if_assigned() IS NOT NULL", {}) == Text("t"))
        fail(ERRCODE_ACTIVE_SQL_TRANSACTION, Explain{"", "Call it in its own transaction."},
             "moving a shard online must run in a transaction that has not written yet");
    spi_value("SELECT sharding._move_connect($1, $2)", {c(source), node.c_str()});
    // Prerequisites, before anything changes anywhere. Both ends follow this
    // coordinator: their guards refuse the shard's keys wherever the
    // followed map says they are not the owner, which makes the cutover hold
    // for every writer.
    for (const Text &end : {source, Text(node)}) {
        const char *conn = end == source ? kSrc : kDst;
        if (dbl(conn, "SELECT pg_catalog.to_regclass('sharding.local_node') IS NOT NULL") != Text("t") ||
            dbl(conn, "SELECT l.node FROM sharding.local_node AS l WHERE l.following") != end) {
            disconnect();
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"Both ends of an online move must be attached: their guards enforce the cutover.",
                         "Call sharding.attach_node(" + lit(end) + ") first."},
                 "node \"%s\" does not follow this coordinator", end ? end->c_str() : "<NULL>");
        }
    }
    // Guards on every distributed table at both ends, even one created
    // while its distribute() was still on its way (idempotent).
    dbl(kSrc, "SELECT sharding._install_guards()");
    dbl(kDst, "SELECT sharding._install_guards()");
    if (dbl(kSrc, "SHOW wal_level") != Text("logical")) {
        disconnect();
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"Moving a shard online replicates its rows from the source with logical replication.",
                     "Set wal_level = logical on the source (postgresql.conf) and restart it."},
             "wal_level of node \"%s\" is not logical", c(source) ? c(source) : "<NULL>");
    }
    Text pins = spi_value("SELECT coalesce(pg_catalog.array_agg(p.key), '{}')::text FROM sharding.pins p WHERE p.map = $1",
                          {map.c_str()});
    std::vector<Table> tables;
    for (Row &r : spi_rows("SELECT m.rel, sharding._move_filter_sql(m.key_column, m.key_type, $2::integer, $3::integer, "
                           "$4, $5::text[]), m.cols, "
                           "(SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a "
                           "WHERE a.attrelid = m.rel::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped "
                           "AND a.attgenerated = '')::text "
                           "FROM sharding._move_tables($1) m",
                           {map.c_str(), shards.c_str(), logical_s.c_str(), c(key), c(pins)}))
        tables.push_back(Table{r[0].value_or(std::string()), r[1], r[2], r[3]});
    std::string table_list;
    for (const Table &t : tables) {
        if (dbl(kSrc, "SELECT pg_catalog.to_regclass(" + lit(t.rel) + ") IS NOT NULL") != Text("t") ||
            dbl(kDst, "SELECT pg_catalog.to_regclass(" + lit(t.rel) + ") IS NOT NULL") != Text("t")) {
            disconnect();
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"", "Create the map's distributed tables on every data node."},
                 "table %s of map \"%s\" is missing on node \"%s\" or \"%s\"", t.rel.c_str(), map.c_str(),
                 c(source) ? c(source) : "<NULL>", node.c_str());
        }
        table_list += (table_list.empty() ? "" : ", ") + t.rel;
    }
    if (tables.empty()) {
        // No distributed table: nothing to carry, the switch is the move.
        disconnect();
        if (!key)
            out.new_epoch = spi_value("SELECT sharding._switch_owner($1, $2::integer, $3)::text",
                                      {map.c_str(), logical_s.c_str(), node.c_str()});
        else
            spi_value("SELECT sharding.pin($1, $2, $3)", {map.c_str(), c(key), node.c_str()});
        return out;
    }
    Text src_dsn = spi_value("SELECT n.dsn FROM sharding.nodes n WHERE n.node = $1", {c(source)});

    // The journal says 'copying' before the publication and the slot exist.
    phase(map, logical, "copying");
    // The destination's session is known by this name there: an undo ends
    // whatever it may still run ...
    dbl(kDst, "SET application_name = " + lit(name));
    // ... and ends by itself if this session goes away (a crash, kill -9):
    // its copy is then rolled back there, never committed later.
    dbl(kDst, "SET client_connection_check_interval = 1000");

    const char *step = "setup";
    Caught err;
    const std::string live_where = "WHERE map = " + lit(map) + " AND logical = " + logical_s + " AND " + kLive;
    bool ok = subxact(
        [&] {
            debug_at("move " + name + ": publication and slot");
            // 2. Publication, then the slot: changes from here on are kept.
            dbl(kSrc, "CREATE PUBLICATION " + ident(name) + " FOR TABLE " + table_list +
                          " WITH (publish = 'insert, update, delete')");
            // The decoder's instructions first (committed before the slot, so
            // its historic snapshot sees them).
            std::vector<Row> d = spi_rows(
                "SELECT (SELECT pg_catalog.string_agg(pg_catalog.format('%L::pg_catalog.regclass', m.rel), ', ' "
                "ORDER BY m.rel) FROM sharding._move_tables($1) m), "
                "(SELECT pg_catalog.array_agg(m.key_column ORDER BY m.rel) FROM sharding._move_tables($1) m)::text",
                {map.c_str()});
            dbl(kSrc, "DELETE FROM sharding.move_decoding WHERE slot = " + lit(name) +
                          "; INSERT INTO sharding.move_decoding (slot, map, shards, logical, key, pins, tables, "
                          "key_columns) VALUES (" +
                          lit(name) + ", " + lit(map) + ", " + shards + ", " + logical_s + ", " + lit(key) + ", " +
                          lit(key ? Text("{}") : pins) + "::text[], ARRAY[" + d[0][0].value_or(std::string()) +
                          "]::pg_catalog.oid[], " + lit(d[0][1]) + "::text[])");
            // The source lets its sessions name plugin "sharding"
            // (output_plugin_libraries, where the server has the setting).
            Text plugin_opts = dbl(
                kSrc,
                "SELECT CASE WHEN l IS NULL OR 'sharding' = ANY (pg_catalog.string_to_array(l, ',')) THEN '' "
                "ELSE '-c output_plugin_libraries=' || l || ',sharding' END "
                "FROM (SELECT pg_catalog.replace(pg_catalog.current_setting('output_plugin_libraries', true), ' ', '') "
                "AS l) AS s");
            // Over a replication connection, exporting its snapshot: the copy
            // below reads exactly what precedes the slot's stream.
            Text snapshot = spi_value("SELECT s.snapshot FROM sharding._move_slot_create($1, $2, 'sharding', $3) AS s",
                                      {c(source), name.c_str(), c(plugin_opts)});

            // 3. Copy, filtered at the source.
            step = "copying";
            debug_at("move " + name + ": copying");
            // Leftovers of the shard at the destination (it does not own them).
            spi_value("SELECT sharding._move_delete_rows('sharding_move_dst', $1, $2::integer, $3)",
                      {map.c_str(), logical_s.c_str(), c(key)});
            dbl(kDst, "SET session_replication_role = replica");
            for (const Table &t : tables) {
                // The destination pulls COPY (SELECT ... WHERE filter) TO
                // STDOUT from the source under the slot's exported snapshot,
                // straight into the table (move_copy.cpp).
                std::string query = "SELECT " + t.cols.value_or(std::string()) + " FROM " + t.rel + " WHERE " +
                                    t.filter.value_or(std::string());
                Text pulled = dbl(kDst, "SELECT sharding._move_pull(" + lit(source) + ", " + lit(snapshot) + ", " +
                                            lit(t.rel) + ", " + lit(t.attnames) + ", " + lit(query) + ")::text");
                // {rows,bytes}
                std::string p = pulled.value_or(std::string());
                std::string rows, bytes;
                if (p.size() >= 2 && p.front() == '{' && p.back() == '}') {
                    std::string inner = p.substr(1, p.size() - 2);
                    size_t comma = inner.find(',');
                    rows = inner.substr(0, comma);
                    if (comma != std::string::npos) bytes = inner.substr(comma + 1, inner.find(',', comma + 1) - comma - 1);
                }
                journal("UPDATE sharding.move_journal SET rows_copied = rows_copied + " + rows +
                        ", bytes_copied = bytes_copied + " + bytes + " " + live_where);
            }
            dbl(kDst, "SET session_replication_role = origin");
            // The snapshot is no longer needed: let go of the replication connection.
            spi_value("SELECT sharding._move_slot_close($1)", {name.c_str()});

            // 4. No filter at the destination: the slot's decoder (plugin
            // "sharding", pgoutput inside) sends only the shard's changes.

            // 5. Stream from the slot made before the copy. synchronous_commit
            // on: the apply worker confirms a position only once its commit is
            // flushed here, so with 'off' (the default for subscriptions) each
            // confirmation would wait for the WAL writer, inside the cutover.
            Text conninfo;
            if (src_dsn)
                conninfo = *src_dsn + (plugin_opts && !plugin_opts->empty() ? " options='" + *plugin_opts + "'"
                                                                             : std::string());
            dbl(kDst, "CREATE SUBSCRIPTION " + ident(name) + " CONNECTION " + lit(conninfo) + " PUBLICATION " +
                          ident(name) + " WITH (create_slot = false, slot_name = " + lit(name) +
                          ", copy_data = false, synchronous_commit = 'on')");

            // 6. Catch up until a round is short: the backlog left for the
            // frozen phase is then a fraction of a second of writes.
            step = "catchup";
            debug_at("move " + name + ": catchup");
            phase(map, logical, "catching_up");
            for (int i = 1; i <= 100; i++) {
                Text waited = spi_value("SELECT sharding._move_wait_flush($1, 600)", {name.c_str()});
                if (waited && std::strtod(waited->c_str(), nullptr) < 0.2) break;
            }

            // 7. Cutover: freeze the source (waits for its in-flight writers),
            // let the destination apply the source's last change, switch.
            step = "cutover";
            debug_at("move " + name + ": cutover");
            phase(map, logical, "cutover");
            call_fn(kSrc, "_freeze_shard", map, logical);
            debug_at("move " + name + ": frozen");
            spi_value("SELECT sharding._move_wait_flush($1, 60)", {name.c_str()});
            debug_at("move " + name + ": caught up");
            // The switch and the journal's 'cleanup' commit together, over
            // this database's own connection.
            if (!key)
                out.new_epoch =
                    dbl(kSelf, "WITH m AS (SELECT sharding._move_switch(" + lit(map) + ", " + logical_s + ", " +
                                   lit(node) +
                                   ") AS e), j AS (UPDATE sharding.move_journal SET phase = 'cleanup', "
                                   "phase_started = pg_catalog.now(), new_epoch = (SELECT e FROM m) " +
                                   live_where + ") SELECT e FROM m");
            else
                dbl(kSelf, "WITH m AS (SELECT sharding.pin(" + lit(map) + ", " + lit(key) + "::text, " + lit(node) +
                               ")), j AS (UPDATE sharding.move_journal SET phase = 'cleanup', "
                               "phase_started = pg_catalog.now(), new_epoch = " +
                               out.new_epoch.value_or("NULL") + " " + live_where + ") SELECT 1 FROM m");
            step = "switched";
            debug_at("move " + name + ": switched");

            // 8. Clean up after the switch.
            out.moved = finish(map, logical, key, node, out.new_epoch);
        },
        &err);
    if (ok) {
        disconnect();
        return out;
    }

    elog(DEBUG1, "move %s failed at step %s: %s (%s)", name.c_str(), step, err.message.c_str(), err.context.c_str());
    const bool switched = std::string(step) == "switched";
    Caught inner;
    if (!switched) {
        // First of all the source writes again, even if the destination
        // is out of reach for the rest of the undo.
        if (!subxact(
                [&] {
                    named_connect(kSrc, c(src_dsn));
                    call_fn(kSrc, "_thaw_shard", map, logical);
                },
                &inner) &&
            not_others(inner.code))
            reraise(inner);
    }
    // Connections may be in any state: start from fresh ones.
    if (!subxact(
            [&] {
                spi_value("SELECT sharding._move_connect($1, $2)", {c(source), node.c_str()});
                if (switched)
                    finish(map, logical, key, node, out.new_epoch);
                else
                    undo(map, logical, key);
            },
            &inner))
        ereport(WARNING, (errmsg("could not clean up after the failed move of logical shard %d of map \"%s\": %s",
                                 logical, map.c_str(), inner.message.c_str()),
                          errhint("The next sharding.move_shard_online or sharding.isolate of this shard cleans up first.")));
    if (!subxact([&] { disconnect(); }, &inner) && not_others(inner.code)) reraise(inner);
    if (switched)
        // The move itself happened; only its tidying failed.
        throw Error(err.code,
                    format("logical shard %d of map \"%s\" moved to \"%s\" (epoch %s), but finishing failed: %s", logical,
                           map.c_str(), node.c_str(), out.new_epoch.value_or("<NULL>").c_str(), err.message.c_str()),
                    std::string(), "Call sharding.move_shard_online again to finish.");
    reraise(err);
}

// Glue: argument i as a C string (detoasted).
char *arg_cstring(FunctionCallInfo fcinfo, int i) { return text_to_cstring(PG_GETARG_TEXT_PP(i)); }

Text text_arg(FunctionCallInfo fcinfo, int i) {
    if (PG_ARGISNULL(i)) return std::nullopt;
    char *s = glue(arg_cstring, fcinfo, i);
    std::string r(s);
    pfree(s);
    return r;
}

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

// _move_journal(sql): over sharding_move_self, committed at once; its first value.
SHARDING_FUNCTION(sharding__move_journal) {
    Text sql = text_arg(fcinfo, 0);
    Text v = journal(*sql);
    if (!v) PG_RETURN_NULL();
    PG_RETURN_DATUM(PointerGetDatum(glue(cstring_to_text_with_len, v->c_str(), (int)v->size())));
}

// _move_phase(map, logical, phase): committed before the phase acts.
SHARDING_FUNCTION(sharding__move_phase) {
    Text map = text_arg(fcinfo, 0);
    Text ph = text_arg(fcinfo, 2);
    phase(*map, PG_GETARG_INT32(1), ph->c_str());
    PG_RETURN_VOID();
}

// _move_call(conn, fn, map, logical): sharding.<fn>(map, logical) there.
SHARDING_FUNCTION(sharding__move_call) {
    Text conn = text_arg(fcinfo, 0);
    Text fn = text_arg(fcinfo, 1);
    Text map = text_arg(fcinfo, 2);
    call_fn(conn->c_str(), *fn, *map, PG_GETARG_INT32(3));
    PG_RETURN_VOID();
}

// _move_finish(map, logical, key, destination, new_epoch): rows deleted at the source.
SHARDING_FUNCTION(sharding__move_finish) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(3))
        fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the map, the shard and the destination of a move must not be NULL");
    Text map = text_arg(fcinfo, 0);
    Text key = text_arg(fcinfo, 2);
    Text dest = text_arg(fcinfo, 3);
    Text epoch;
    if (!PG_ARGISNULL(4)) epoch = std::to_string(PG_GETARG_INT64(4));
    int64 deleted = finish(*map, PG_GETARG_INT32(1), key, *dest, epoch);
    PG_RETURN_INT64(deleted);
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

// _move_drop_replication(name).
SHARDING_FUNCTION(sharding__move_drop_replication) {
    Text name = text_arg(fcinfo, 0);
    drop_replication(*name);
    PG_RETURN_VOID();
}

// _move_drop_triggers(map, name).
SHARDING_FUNCTION(sharding__move_drop_triggers) {
    Text map = text_arg(fcinfo, 0);
    Text name = text_arg(fcinfo, 1);
    drop_triggers(*map, *name);
    PG_RETURN_VOID();
}

// _move_stop_backends(conn, name).
SHARDING_FUNCTION(sharding__move_stop_backends) {
    Text conn = text_arg(fcinfo, 0);
    Text name = text_arg(fcinfo, 1);
    stop_backends(conn->c_str(), *name);
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
    Text epoch;
    if (!PG_ARGISNULL(5)) epoch = std::to_string(PG_GETARG_INT64(5));
    bool seen = sees_switch(conn->c_str(), *map, PG_GETARG_INT32(2), key, *node, epoch);
    PG_RETURN_BOOL(seen);
}
