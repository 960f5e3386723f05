// The deletes of an online move's rows (docs/moves.md): at the source after
// the switch (the rows are gone from it when the move returns), at the
// destination after a failed or cancelled move, and of leftovers there
// before a copy.
//
// _move_delete_rows(conn, map, logical, key): on the coordinator; deletes
//   what the move of (map, logical, key) carries from the map's tables over
//   one of the move's named connections, in one remote transaction (all of
//   it or nothing), under a replication origin of the move's own (the
//   decoders of other moves from that node drop changes that carry one, so
//   these deletes never travel; a DELETE's old key is not in the WAL where
//   the key is not in the replica identity, so they could not be filtered).
//   Each table's delete is one call of _move_delete_local there, each a
//   statement of its own: the COMMIT is a statement of its own too, so a
//   session whose caller is gone (kill -9) never commits by itself
//   (test/tap/470_move_cleanup_faults.pl). A table of at least 4 MB there
//   is deleted in parts (move_copy.hpp): up to sharding.move_parallel
//   sessions at once, each on a range of its blocks and under an origin of
//   its own, all committing together once every part has deleted.
//
// _move_delete_local(rel, filter): there; DELETE FROM rel WHERE filter,
//   with the BEFORE ROW DELETE triggers that cannot fire under the move's
//   session_replication_role = replica (the guard's) left out for the
//   statement (move_copy.hpp): otherwise PostgreSQL locks every row before
//   it finds that no trigger fires, one more WAL record per row; about a
//   third of a 1,000,000-row delete.
#include "datanode/move_copy.hpp"
#include "move/move_engine.hpp"
#include "routing/owner_switch.hpp"
#include "remote/move_remote.hpp"
#include "pg/spi_snapshot.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "access/table.h"
#include "catalog/pg_type.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "nodes/parsenodes.h"
#include "parser/parser.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
}

namespace sharding::move {
namespace {

// ------------------------------------------------------------ there

uint64 spi_delete(void *arg) {
    const char *sql = static_cast<const char *>(arg);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    int rc = SPI_execute(sql, false, 0);
    if (rc != SPI_OK_DELETE) elog(ERROR, "a move's delete returned %s", SPI_result_code_string(rc));
    uint64 rows = SPI_processed;
    SPI_finish();
    return rows;
}

// Glue: DELETE FROM rel WHERE filter (one statement, checked), with rel's
// idle BEFORE ROW DELETE triggers left out; the rows deleted.
uint64 delete_local(Oid relid, const char *filter) {
    Relation rel = table_open(relid, RowExclusiveLock);
    const char *name =
        quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)), RelationGetRelationName(rel));
    char *sql = psprintf("DELETE FROM %s WHERE %s", name, filter);
    List *stmts = raw_parser(sql, RAW_PARSE_DEFAULT);
    Node *stmt = list_length(stmts) == 1 ? linitial_node(RawStmt, stmts)->stmt : nullptr;
    if (stmt == nullptr || !IsA(stmt, DeleteStmt) || ((DeleteStmt *)stmt)->returningList != NIL)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("the filter of a move's delete must be one condition")));
    uint64 rows = without_idle_triggers(rel, TRIGGER_TYPE_DELETE, spi_delete, sql);
    table_close(rel, NoLock);
    return rows;
}

// ------------------------------------------------------------ the coordinator

// What a move deletes: its origin's name, and per table the qualified name
// and the condition, as the move's journal row fixed them when it started
// (filter_sql with the pins of then).
struct DeletePlan {
    char *origin;
    int ntables;
    char **rels;
    char **filters;
};

// Glue: reads the plan through SPI into the caller's memory context (the
// map known to exist; origin: the move's name); nullptr for a move without
// a plan in its journal row.
DeletePlan *read_plan(const char *map, int32 logical, const char *key, const char *origin) {
    MemoryContext caller = CurrentMemoryContext;
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    const bool snap = sharding::spi_snapshot_push();
    Oid types[3] = {TEXTOID, INT4OID, TEXTOID};
    Datum vals[3] = {CStringGetTextDatum(map), Int32GetDatum(logical), key ? CStringGetTextDatum(key) : (Datum)0};
    char nulls[3] = {' ', ' ', key ? ' ' : 'n'};
    DeletePlan *plan = static_cast<DeletePlan *>(MemoryContextAllocZero(caller, sizeof(DeletePlan)));
    plan->origin = MemoryContextStrdup(caller, origin);
    // The plan the live move of the shard fixed when it started (its
    // journal row): the tables and conditions of then, whatever pins,
    // distributed tables or shard count say now. Only a move journaled
    // without one (by 1.3, before the update) is read from the
    // configuration as it is.
    if (SPI_execute_with_args("SELECT j.plan_tables IS NOT NULL FROM sharding.move_journal j WHERE j.map = $1 "
                              "AND j.logical = $2 AND j.key IS NOT DISTINCT FROM $3 "
                              "AND j.phase NOT IN " PHASE_SQL_FINAL,
                              3, types, vals, nulls, false, 0) != SPI_OK_SELECT)
        elog(ERROR, "could not read the journal of a move");
    bool planned = false;
    if (SPI_processed == 1) {
        bool isnull;
        Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        planned = !isnull && DatumGetBool(d);
    }
    if (planned) {
        if (SPI_execute_with_args(
                "SELECT r.rel, r.filter FROM sharding.move_journal j, "
                "ROWS FROM (pg_catalog.unnest(j.plan_tables), pg_catalog.unnest(j.plan_filters)) WITH ORDINALITY AS r(rel, filter, i) "
                "WHERE j.map = $1 AND j.logical = $2 AND j.key IS NOT DISTINCT FROM $3 "
                "AND j.phase NOT IN " PHASE_SQL_FINAL " ORDER BY r.i",
                3, types, vals, nulls, false, 0) != SPI_OK_SELECT)
            elog(ERROR, "could not read the plan of a move");
    } else {
        SPI_finish();
        return nullptr;
    }
    plan->ntables = (int)SPI_processed;
    plan->rels = static_cast<char **>(MemoryContextAllocZero(caller, sizeof(char *) * (plan->ntables + 1)));
    plan->filters = static_cast<char **>(MemoryContextAllocZero(caller, sizeof(char *) * (plan->ntables + 1)));
    for (int i = 0; i < plan->ntables; i++) {
        char *rel = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
        char *filter = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
        if (rel == nullptr || filter == nullptr) elog(ERROR, "a table of a move has no name or filter");
        plan->rels[i] = MemoryContextStrdup(caller, rel);
        plan->filters[i] = MemoryContextStrdup(caller, filter);
    }
    sharding::spi_snapshot_pop(snap);
    SPI_finish();
    return plan;
}

// Glue: a plan of n tables, copied into the current memory context.
DeletePlan *make_plan(const char *origin, int n, const char *const *rels, const char *const *filters) {
    DeletePlan *plan = static_cast<DeletePlan *>(palloc0(sizeof(DeletePlan)));
    plan->origin = pstrdup(origin);
    plan->ntables = n;
    plan->rels = static_cast<char **>(palloc0(sizeof(char *) * (n + 1)));
    plan->filters = static_cast<char **>(palloc0(sizeof(char *) * (n + 1)));
    for (int i = 0; i < n; i++) {
        plan->rels[i] = pstrdup(rels[i]);
        plan->filters[i] = pstrdup(filters[i]);
    }
    return plan;
}

// One statement on a connection: its first value or tag ("" if none).
std::string run_on(PGconn *conn, const std::string &sql) { return answer(run_statement(conn, sql.c_str(), "", true)); }

// A session deleting: the named connection (part 0) or one of its own,
// opened with the same connection options; each under an origin of its
// own (an origin is active in one session at a time).
struct Part {
    PGconn *conn;
    std::unique_ptr<Remote> own;
    std::string origin;  // quoted
    bool begun = false;
};

// Sends sql[i] on part i (none where empty), then waits for them all: they
// run at once. The answers, in order.
std::vector<std::string> on_parts(std::vector<Part> &parts, const std::vector<std::string> &sql) {
    std::vector<PGconn *> sent(parts.size(), nullptr);
    for (size_t i = 0; i < parts.size(); i++) {
        if (sql[i].empty()) continue;
        if (PQsendQuery(parts[i].conn, sql[i].c_str()) == 0)
            fail(ERRCODE_CONNECTION_FAILURE, "could not send a statement: %s", PQerrorMessage(parts[i].conn));
        sent[i] = parts[i].conn;
    }
    return collect_all(sent, "");
}

int64 count_of(const std::string &n, const char *conn) {
    char *end = nullptr;
    long long v = std::strtoll(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 0)
        fail(ERRCODE_PROTOCOL_VIOLATION, "unexpected answer to a delete on connection %s: %s", conn, n.c_str());
    return v;
}

// The statements that make a session's changes carry the move's origin
// (origin: a quoted literal), made if missing; scope "LOCAL " for a
// transaction, "" for the session.
std::string origin_setup_sql(const std::string &origin, const char *scope) {
    return std::string("SET ") + scope + "session_replication_role = replica; "
           "SELECT pg_catalog.pg_replication_origin_session_reset() "
           "WHERE pg_catalog.pg_replication_origin_session_is_setup(); "
           "SELECT pg_catalog.pg_replication_origin_create(" + origin + ") "
           "WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_replication_origin WHERE roname = " + origin + "); "
           "SELECT pg_catalog.pg_replication_origin_session_setup(" + origin + ")";
}

std::string begin_sql(const std::string &origin) { return "BEGIN; " + origin_setup_sql(origin, "LOCAL "); }

// The deletes, in one transaction per session: all in the named
// connection's for small tables; for large ones also in sessions of their
// own, each on a range of blocks (move_copy.hpp). The sessions commit
// together: the COMMITs are sent to all before any answer is read, once
// every delete has succeeded, so a failure or cancel before them rolls
// every session back (the next call deletes everything again, and its
// count is the move's), and none commits by itself when the caller is gone.
// A shard-partitioned table's leaf that holds exactly the rows a delete at
// the source removes (shard_leaves_sql): truncated instead, under the
// move's origin, in the delete's transaction. Its lock is asked for
// briefly, again and again for up to about three seconds (a query of the
// whole partitioned table holds every leaf; a TRUNCATE waiting for it
// would hold up every later one); then, or if the TRUNCATE fails (a
// foreign key referencing the table, no right to truncate), the rows are
// deleted as for any table. The rows truncated, or -1 when it did not.
int64 truncate_leaf(PGconn *conn, const std::string &leaf) {
    for (int attempt = 0; attempt < 20; attempt++) {
        try {
            run_on(conn, "SAVEPOINT sharding_truncate; SET LOCAL lock_timeout = '100ms'; LOCK TABLE " + leaf +
                             " IN ACCESS EXCLUSIVE MODE");
        } catch (const Error &) {
            run_on(conn, "ROLLBACK TO SAVEPOINT sharding_truncate; RELEASE SAVEPOINT sharding_truncate");
            sleep_ms(50);
            continue;
        }
        try {
            run_on(conn, "SET LOCAL lock_timeout = DEFAULT");
            std::string n = run_on(conn, "SELECT pg_catalog.count(*) FROM " + leaf);
            run_on(conn, "TRUNCATE " + leaf);
            run_on(conn, "RELEASE SAVEPOINT sharding_truncate");
            return std::strtoll(n.c_str(), nullptr, 10);
        } catch (const Error &) {
            break;
        }
    }
    run_on(conn, "ROLLBACK TO SAVEPOINT sharding_truncate; RELEASE SAVEPOINT sharding_truncate; "
                 "SET LOCAL lock_timeout = DEFAULT");
    return -1;
}

int64 delete_rows(const char *conn, const DeletePlan *plan, const std::string &map, int32 logical) {
    PGconn *named = named_connection(conn);
    std::vector<int64> blocks(plan->ntables);
    // At the source after the switch only (an undo or a copy's leftovers at
    // the destination delete row by row: a TRUNCATE there would give the
    // leaf new storage, which the move's own cutover refuses).
    std::vector<std::string> leaves(plan->ntables);
    if (std::strcmp(conn, kSrc) == 0)
        for (int t = 0; t < plan->ntables; t++)
            leaves[t] = run_on(named, "SELECT s.leaf FROM (" +
                                          shard_leaves_sql(lit(std::string(plan->rels[t])) + "::pg_catalog.regclass") +
                                          ") s WHERE s.shard = " + lit(std::string(plan->filters[t])));
    int nparts = 1;
    // A move's share of sharding.move_parallel when others are in flight
    // at its nodes or on its hosts (move_share).
    const int sessions = move_share(map, logical, move_parallel).sessions;
    for (int t = 0; t < plan->ntables; t++) {
        blocks[t] = sessions < 2 ? 0 : std::strtoll(run_on(named, blocks_query(plan->rels[t])).c_str(), nullptr, 10);
        nparts = std::max(nparts, parts_for(blocks[t], sessions));
    }
    std::vector<Part> parts(nparts);
    int64 total = 0;
    try {
        std::string info = nparts > 1 ? conninfo_of(named) : std::string();
        for (int i = 0; i < nparts; i++) {
            std::string origin = i == 0 ? plan->origin : std::string(plan->origin) + "_" + std::to_string(i);
            parts[i].origin = lit(origin);
            if (i == 0) {
                parts[i].conn = named;
            } else {
                // A node at max_connections: the sessions it gave delete,
                // each a larger range.
                try {
                    parts[i].own = std::make_unique<Remote>(info, false, plan->origin);
                } catch (const Error &e) {
                    if (!out_of_connections(e)) throw;
                    warn(format("the delete of move %s runs in %d sessions, not %d: %s", plan->origin, i, nparts,
                                e.what()),
                         "Raise max_connections there, or lower sharding.move_parallel.");
                    nparts = i;
                    parts.resize(i);
                    break;
                }
                parts[i].conn = parts[i].own->conn();
                run_on(parts[i].conn, "SET search_path = pg_catalog, pg_temp");
            }
        }
        std::vector<std::string> sql(nparts);
        for (int i = 0; i < nparts; i++) {
            sql[i] = begin_sql(parts[i].origin);
            parts[i].begun = true;
        }
        on_parts(parts, sql);
        for (int t = 0; t < plan->ntables; t++) {
            if (!leaves[t].empty()) {
                int64 truncated = truncate_leaf(parts[0].conn, leaves[t]);
                if (truncated >= 0) {
                    total += truncated;
                    continue;
                }
            }
            const int n = std::min(parts_for(blocks[t], sessions), nparts);
            for (int i = 0; i < nparts; i++)
                sql[i] = i >= n ? std::string()
                                : "SELECT sharding._move_delete_local(" + lit(std::string(plan->rels[t])) +
                                      "::pg_catalog.regclass, " +
                                      lit(n == 1 ? std::string(plan->filters[t])
                                                 : part_condition(plan->filters[t], blocks[t], i, n)) +
                                      ")";
            for (const std::string &v : on_parts(parts, sql))
                if (!v.empty()) total += count_of(v, conn);
        }
        for (int i = 0; i < nparts; i++) sql[i] = "COMMIT";
        on_parts(parts, sql);
        for (Part &p : parts) p.begun = false;
    } catch (...) {
        for (Part &p : parts) {
            if (p.conn == nullptr || !p.begun) continue;
            try {
                cancel_and_drain(p.conn);
                run_on(p.conn, "ROLLBACK; SELECT pg_catalog.pg_replication_origin_session_reset() "
                               "WHERE pg_catalog.pg_replication_origin_session_is_setup()");
            } catch (...) {
                // The connection is gone or unusable: the caller starts from a fresh one.
            }
        }
        throw;
    }
    for (Part &p : parts) {
        run_on(p.conn, "SELECT pg_catalog.pg_replication_origin_session_reset()");
        try {
            run_on(p.conn, "SELECT pg_catalog.pg_replication_origin_drop(" + p.origin + ")");
        } catch (const Error &) {
            // In use by a session not yet gone: dropped by the next move of the shard.
        }
    }
    return total;
}

// The deferred clean-up's delete (delete_shard_rows, batched): over the
// named connection alone, under the move's origin set up for the session,
// each range of kBatchPages blocks of a table its own statement and so its
// own transaction (a shard's leaf truncated in one), then the filter once
// more over the whole table, for rows a concurrent VACUUM FULL moved into
// a range already done. A crash or cancel leaves what is not yet deleted
// to the next attempt; the count is what this one deleted.
constexpr int64 kBatchPages = 1024;  // 8 MB of heap
int64 delete_batched(const char *conn, const DeletePlan *plan) {
    PGconn *named = named_connection(conn);
    const std::string origin = lit(std::string(plan->origin));
    int64 total = 0;
    run_on(named, origin_setup_sql(origin, ""));
    try {
        for (int t = 0; t < plan->ntables; t++) {
            const std::string rel = plan->rels[t], filter = plan->filters[t];
            const std::string leaf =
                run_on(named, "SELECT s.leaf FROM (" + shard_leaves_sql(lit(rel) + "::pg_catalog.regclass") +
                                  ") s WHERE s.shard = " + lit(filter));
            if (!leaf.empty()) {
                run_on(named, "BEGIN");
                const int64 truncated = truncate_leaf(named, leaf);
                run_on(named, "COMMIT");
                if (truncated >= 0) {
                    total += truncated;
                    continue;
                }
            }
            const std::string del = "SELECT sharding._move_delete_local(" + lit(rel) + "::pg_catalog.regclass, ";
            const int64 blocks = std::strtoll(run_on(named, blocks_query(rel)).c_str(), nullptr, 10);
            const int n = (int)std::max<int64>(1, (blocks + kBatchPages - 1) / kBatchPages);
            for (int i = 0; i < n; i++) total += count_of(run_on(named, del + lit(part_condition(filter, blocks, i, n)) + ")"), conn);
            if (n > 1) total += count_of(run_on(named, del + lit(filter) + ")"), conn);
        }
    } catch (...) {
        try {
            cancel_and_drain(named);
            run_on(named, "ROLLBACK; RESET session_replication_role; SELECT pg_catalog.pg_replication_origin_session_reset() "
                          "WHERE pg_catalog.pg_replication_origin_session_is_setup()");
        } catch (...) {
            // The connection is gone or unusable: the caller starts from a fresh one.
        }
        throw;
    }
    run_on(named, "RESET session_replication_role; SELECT pg_catalog.pg_replication_origin_session_reset()");
    try {
        run_on(named, "SELECT pg_catalog.pg_replication_origin_drop(" + origin + ")");
    } catch (const Error &) {
        // In use by a session not yet gone: dropped by the next move of the shard.
    }
    return total;
}

}  // namespace

// Origin states free at a node (review RB-9): an origin set up or
// advanced takes one until it is dropped; there are max_replication_slots
// of them (max_active_replication_origins from PostgreSQL 18).
int free_origin_states(const char *conn) {
    return std::atoi(must(dbl(conn, "SELECT (coalesce(pg_catalog.current_setting('max_active_replication_origins', true), "
                                    "pg_catalog.current_setting('max_replication_slots'))::integer - (SELECT "
                                    "pg_catalog.count(*) FROM pg_catalog.pg_replication_origin_status)::integer)::text"))
                         .c_str());
}

void reserve_origins(const char *conn, const std::string &name, const std::string &node) {
    for (int i = 0; i < std::max(1, move_parallel); i++) {
        const std::string origin = lit(i == 0 ? name : name + "_" + std::to_string(i));
        try {
            dbl(conn, "SELECT pg_catalog.pg_replication_origin_create(" + origin + ") WHERE NOT EXISTS (SELECT FROM "
                      "pg_catalog.pg_replication_origin WHERE roname = " + origin + ")");
            dbl(conn, "SELECT pg_catalog.pg_replication_origin_advance(" + origin + ", '0/0')");
        } catch (const Error &e) {
            if (e.sqlstate() != ERRCODE_CONFIGURATION_LIMIT_EXCEEDED) throw;
            fail(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                 Explain{"The delete at the source after the switch runs under replication origins (one per part, "
                         "up to sharding.move_parallel); taken before the switch, or the move is rolled back. " +
                             std::string(e.what()),
                         "Raise max_replication_slots (max_active_replication_origins from PostgreSQL 18) at node \"" +
                             node + "\", drop unused replication origins there, or lower sharding.move_parallel."},
                 "node \"%s\" has no free replication origin state for move %s", node.c_str(), name.c_str());
        }
    }
}

void drop_left_origins(const char *conn, const std::string &name) {
    PGconn *named = named_connection(conn);
    if (named == nullptr || PQtransactionStatus(named) != PQTRANS_IDLE) return;
    const std::string mine = journal_has_name() ? "sharding_move_" + coordinator_tag() + "_" : name;
    Text listed = dbl(conn, "SELECT pg_catalog.string_agg(o.roname, ' ') FROM pg_catalog.pg_replication_origin o "
                            "WHERE pg_catalog.left(o.roname, " + std::to_string(mine.size()) + ") = " + lit(mine) +
                            " OR o.roname = " + lit(name) + " OR (pg_catalog.left(o.roname, " +
                            std::to_string(name.size() + 1) + ") = " + lit(name + "_") +
                            " AND pg_catalog.substr(o.roname, " + std::to_string(name.size() + 2) + ") ~ '^[0-9]+$')");
    if (!listed) return;
    // The other live moves' names (their origins are theirs).
    std::vector<std::string> others;
    if (journal_has_name()) {
        Text live = journal("SELECT pg_catalog.string_agg(m.name, ' ') FROM sharding.move_journal m WHERE m." +
                            std::string(kLive) + " AND m.name IS NOT NULL AND m.name <> " + lit(name));
        std::istringstream in(live.value_or(""));
        for (std::string n; in >> n;) others.push_back(n);
    }
    std::istringstream in(*listed);
    for (std::string origin; in >> origin;) {
        const bool theirs = std::any_of(others.begin(), others.end(), [&](const std::string &n) {
            return origin == n || origin.compare(0, n.size() + 1, n + "_") == 0;
        });
        if (theirs) continue;
        try {
            dbl(conn, "SELECT pg_catalog.pg_replication_origin_drop(" + lit(origin) + ")");
        } catch (const Error &) {
            // In use by a session not yet gone: the next finish or undo there.
        }
    }
}

int64 delete_shard_rows(const char *conn, const std::string &map, int32 logical, const Text &key, bool batched) {
    // An unknown map is 42704, even without tables.
    (void)require_map(Text(map), false);
    const std::string origin = journal_move_name(map, logical);
    const char *k = key ? key->c_str() : nullptr;
    DeletePlan *plan = glue(read_plan, map.c_str(), logical, k, origin.c_str());
    if (plan == nullptr) {
        // Without a plan: the configuration as it is now.
        const std::vector<TableFilter> now = current_filters(map, logical, key);
        std::vector<const char *> rels, filters;
        for (const TableFilter &t : now) {
            rels.push_back(t.rel.c_str());
            filters.push_back(t.filter.c_str());
        }
        plan = glue(make_plan, origin.c_str(), (int)now.size(), rels.data(), filters.data());
    }
    if (plan->ntables == 0) return 0;
    return batched ? delete_batched(conn, plan) : delete_rows(conn, plan, map, logical);
}

}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

// _move_delete_local(rel regclass, filter text) RETURNS bigint: the rows
// deleted (DELETE FROM rel WHERE filter, idle BEFORE ROW DELETE triggers
// left out).
SHARDING_FUNCTION(sharding__move_delete_local) {
    Oid relid = PG_GETARG_OID(0);
    char *filter = text_to_cstring(PG_GETARG_TEXT_PP(1));
    uint64 rows = glue(delete_local, relid, (const char *)filter);
    PG_RETURN_INT64((int64)rows);
}

// _move_delete_rows(conn text, map text, logical integer, key text) RETURNS
// bigint: the rows deleted there (NULL key: a shard move's, unpinned keys
// of the shard; else isolate's one key).
SHARDING_FUNCTION(sharding__move_delete_rows) {
    if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
        fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "the connection, the map and the shard of a delete must not be NULL");
    std::string conn = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(0)); });
    std::string map = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(1)); });
    int32 logical = PG_GETARG_INT32(2);
    Text key;
    if (!PG_ARGISNULL(3)) key = pg_call([&]() -> char * { return text_to_cstring(PG_GETARG_TEXT_PP(3)); });
    check_named_for_caller(conn.c_str());
    PG_RETURN_INT64(delete_shard_rows(conn.c_str(), map, logical, key));
}
