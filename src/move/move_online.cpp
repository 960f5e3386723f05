// An online move (docs/moves.md), as its named steps: sharding._move_online,
// the engine of move_shard_online and isolate. The steps run on the
// coordinator and drive the source and the destination over the session's
// named connections (sharding_move_src, _dst, _self); what they share with
// the rest of the orchestration is in move_online.hpp, the end of a move
// (finish, undo) and the SQL wrappers in move_orchestrate.cpp.
//
// The steps run in a subtransaction (move_online, at the end): on any
// error, cancel included, it is rolled back, then fail_move thaws the
// source and undoes the move (or, after the switch, finishes it) from
// fresh connections, and raises the original error with its SQLSTATE,
// message, detail and hint.
//
// Boundary (src/pg/boundary.hpp): every PostgreSQL call that may ereport
// while a C++ object is alive goes through glue/pg_call.
#include "datanode/move_controller.hpp"
#include "datanode/move_copy.hpp"
#include "move/move_engine.hpp"
#include "routing/owner_switch.hpp"
#include "move/move_online.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <cctype>
#include <cerrno>
#include <csignal>
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

using namespace online;

namespace {

// One online move as its steps see it. move_online runs the steps in
// order, each named as the journal's phase it runs in (phase.hpp;
// docs/moves.md, "Steps", lists them the same way):
//   queued       find_source      the shard's owner and epoch, under the shard's move lock
//                check_ends       both ends attached and guarded, wal_level
//   copying      fix_plan         the plan in the journal row, entering 'copying': shard count,
//                                 pins, tables; from here on DDL of the map's tables waits
//                                 for the move (55006)
//                compare_schemas  the plan's tables at both ends (after DDL committed before the
//                                 plan): replica identities, the columns copied, their signatures
//                plan_tables      the plan's tables with their conditions and columns
//                                 (a refusal of these two ends the journal row: refuse_after_plan)
//                open_stream      controller lock, storage noted, publication, decoder's row, slot
//                copy_rows        the destination pulls each table under the slot's snapshot
//                subscribe        the destination streams from the slot
//   catching_up  catch_up         rounds until one is short
//   cutover      cut_over         freeze, drain, hold storage and columns, switch (+ journal
//                                 'cleanup', in the same transaction)
//   cleanup      finish           (verify_copies first) thaw, drop replication, delete at the source
// and, when a step fails, fail_move: undo before the switch, finish after.
struct OnlineMove {
    // What and where (move_online, find_source).
    std::string map, name, logical_s, node;
    int32 logical = 0;
    Text key, source, src_dsn;
    std::string shards;  // the map's shard count (the plan's, once fixed)
    std::string live_where;  // the move's live journal row
    MoveResult out;
    // What the ends have (check_ends, then compare_schemas under the plan):
    // per table, what the copy takes (the source's columns) and its column
    // signatures at both ends (compared again at the cutover).
    std::vector<MoveTable> live;
    std::map<std::string, std::pair<std::string, std::vector<std::string>>> copied_columns;
    std::map<std::string, std::pair<std::string, std::string>> signatures;
    // The plan (fix_plan, then plan_tables).
    std::vector<Row> planned;  // the journal row's plan: pins, count, shards, then per table rel and filter
    Text move_id, pins;
    int npins = 0;
    std::vector<MoveTable> described;
    std::vector<CopyTable> tables;
    std::string table_list;
    std::vector<std::string> signature_src, signature_dst;
    // The stream (open_stream).
    std::string storage_src, storage_dst;
    Text plugin_opts, snapshot;
    // How far it got (fail_move reads it): the step it is in, named as the
    // journal's phase (phase.hpp). The journal enters each phase before
    // the step acts; step follows it, except 'cleanup', which the journal
    // commits with the switch and step enters once both ends committed
    // (a failure in between is told by switched_after_all).
    Phase step = Phase::Queued;
    bool verify = true, verify_failed = false;
};

// The move enters a step (m.step), named as the journal's phase, with a
// DEBUG1 line "move <name>: <phase> at <time>" (test/bench/move reads the
// times).
void enter(OnlineMove &m, Phase p) {
    m.step = p;
    debug_at("move " + m.name + ": " + to_text(p));
}

// The shard's source and epoch now. One move per shard at a time (a
// transaction-level lock: a crashed caller's lock goes with it, and its
// journal row tells the next call). False: the rows are at the destination
// already (isolate pins there all the same).
bool find_source(OnlineMove &m) {
    const char *map = m.map.c_str(), *logical = m.logical_s.c_str();
    if (spi_value("SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('sharding.move_shard_online'), "
                  "pg_catalog.hashtext($1))",
                  {m.name.c_str()}) != Text("t"))
        fail(ERRCODE_OBJECT_IN_USE, "logical shard %d of map \"%s\" is already being moved", m.logical, map);
    if (!m.key) {
        std::vector<Row> r = spi_rows(
            "SELECT s.node, s.epoch::text FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer",
            {map, logical});
        if (!r.empty()) {
            m.source = r[0][0];
            m.out.new_epoch = r[0][1];
        }
    } else {
        m.source = spi_value("SELECT coalesce((SELECT p.node FROM sharding.pins p WHERE p.map = $1 AND p.key = $3), "
                             "(SELECT s.node FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer))",
                             {map, logical, c(m.key)});
        m.out.new_epoch = spi_value(
            "SELECT s.epoch::text FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer", {map, logical});
    }
    if (m.source && *m.source == m.node) {
        if (m.key)  // isolate pins even where the rows already are
            spi_value("SELECT sharding.pin($1, $2, $3)", {map, c(m.key), m.node.c_str()});
        return false;
    }
    return true;
}

// Prerequisites, before anything changes anywhere (the connections are
// open). Both ends follow this coordinator: their guards refuse the
// shard's keys wherever the followed map says they are not the owner,
// which makes the cutover hold for every writer.
void check_ends(OnlineMove &m) {
    for (const Text &end : {m.source, Text(m.node)}) {
        const char *conn = end == m.source ? kSrc : kDst;
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
             "wal_level of node \"%s\" is not logical", c(m.source) ? c(m.source) : "<NULL>");
    }
    // Origin states (review RB-9): the delete at the source after the
    // switch needs one per part (up to sharding.move_parallel), the
    // subscription at the destination one. Refused now, nothing done.
    for (const Text &end : {m.source, Text(m.node)}) {
        const char *conn = end == m.source ? kSrc : kDst;
        const int need = end == m.source ? std::max(1, move_parallel) : 1;
        const int free = free_origin_states(conn);
        if (free < need) {
            disconnect();
            fail(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                 Explain{end == m.source ? "The delete at the source after the switch runs under replication origins, "
                                           "one per part (up to sharding.move_parallel)."
                                         : "The move's subscription at the destination applies under a replication "
                                           "origin.",
                         "Raise max_replication_slots (max_active_replication_origins from PostgreSQL 18) there, "
                         "drop unused replication origins, or lower sharding.move_parallel."},
                 "node \"%s\" has %d free replication origin states, the move needs %d", c(end), free, need);
        }
    }
    // The map's tables now: whether there is anything to carry (compare_schemas
    // reads them again under the plan).
    m.live = move_tables(m.map);
}

// One table's columns as the copy takes them: every column the source
// has, found at the destination with the same type (55000 otherwise,
// nothing copied).
void compare_columns(OnlineMove &m, const MoveTable &t) {
    const auto src_cols = columns_of(kSrc, t.rel, false);
    const auto dst_cols = columns_of(kDst, t.rel, false);
    std::string cols;
    std::vector<std::string> names;
    for (const auto &sc : src_cols) {
        auto d = std::find_if(dst_cols.begin(), dst_cols.end(), [&](const auto &dc) { return dc.first == sc.first; });
        if (d == dst_cols.end())
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"A move copies every column the source has; nothing was copied.",
                         "Add the column at the destination (or drop it at the source), then move again."},
                 "column \"%s\" of %s is missing on node \"%s\"", sc.first.c_str(), t.rel.c_str(), m.node.c_str());
        if (d->second != sc.second)
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"A move copies every column the source has, into the same type; nothing was copied.",
                         "Give the column the same type at both ends, then move again."},
                 "column \"%s\" of %s is %s on node \"%s\" but %s on node \"%s\"", sc.first.c_str(), t.rel.c_str(),
                 sc.second.c_str(), c(m.source) ? c(m.source) : "<NULL>", d->second.c_str(), m.node.c_str());
        cols += (cols.empty() ? "" : ", ") + ident(sc.first);
        names.push_back(sc.first);
    }
    m.copied_columns[t.rel] = {cols, names};
    m.signatures[t.rel] = {column_signature(kSrc, t.rel), column_signature(kDst, t.rel)};
}

// A distributed table of the map the coordinator does not have would stay
// behind unmoved at the source: refused (55000).
void refuse_missing_on_coordinator(OnlineMove &m) {
    Text missing = spi_value("SELECT pg_catalog.string_agg(pg_catalog.quote_ident(d.schema_name) || '.' || "
                             "pg_catalog.quote_ident(d.table_name), ', ') FROM sharding.distributed_tables d "
                             "WHERE d.map = $1 AND pg_catalog.to_regclass(pg_catalog.quote_ident(d.schema_name) "
                             "|| '.' || pg_catalog.quote_ident(d.table_name)) IS NULL",
                             {m.map.c_str()});
    if (missing) {
        disconnect();
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"The coordinator describes the map's tables for a move; a table it does not have would "
                     "stay behind at the source.",
                     "Create the table on the coordinator too (it holds no rows), or undistribute it."},
             "distributed table %s of map \"%s\" does not exist on the coordinator", missing->c_str(), m.map.c_str());
    }
}

// What the ends have, before anything is created there (CONTRACT 15.1),
// read after the plan (fix_plan): DDL of the map's tables propagated from
// the coordinator has either committed before the plan lock was granted,
// and is seen here, or waits for the move (55006) and changes nothing it
// carries. Such DDL holds the plan lock until its nodes have committed it
// too (COMMIT PREPARED, from its commit callback), except on a node that
// did not answer in time, left to recovery (docs/ddl.md), whose prepared
// transaction holds the table until then: each end's tables are first
// locked in ACCESS SHARE mode for a moment, which waits for it.
// Then: a table the coordinator does not have is not left behind unmoved;
// the plan's tables exist at both ends; each table's replica identity at
// both ends; its columns read at the source (what is copied) and found at
// the destination with the same types; and each table's column signature
// at both ends, compared again at the cutover.
void compare_schemas(OnlineMove &m) {
    refuse_missing_on_coordinator(m);
    m.live = move_tables(m.map);
    std::string rels;
    for (const MoveTable &t : m.live) {
        if (dbl(kSrc, "SELECT pg_catalog.to_regclass(" + lit(t.rel) + ") IS NOT NULL") != Text("t") ||
            dbl(kDst, "SELECT pg_catalog.to_regclass(" + lit(t.rel) + ") IS NOT NULL") != Text("t"))
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                 Explain{"", "Create the map's distributed tables on every data node."},
                 "table %s of map \"%s\" is missing on node \"%s\" or \"%s\"", t.rel.c_str(), m.map.c_str(),
                 c(m.source) ? c(m.source) : "<NULL>", m.node.c_str());
        rels += (rels.empty() ? "" : ", ") + t.rel;
    }
    if (!rels.empty())
        for (const char *conn : {kSrc, kDst}) dbl(conn, "BEGIN; LOCK TABLE " + rels + " IN ACCESS SHARE MODE; COMMIT");
    for (const MoveTable &t : m.live) {
        check_identity(kSrc, m.source, t, m.map);
        check_identity(kDst, Text(m.node), t, m.map);
        compare_columns(m, t);
    }
}

// The plan, fixed once (docs/moves.md, "A move's plan is fixed when it
// starts"): under the map's plan lock, which pin, unpin, pin_many,
// distribute, undistribute and drop_map take in share mode until they
// commit (_move_refuse), the journal row enters 'copying' with the shard
// count, the pins, the tables and the condition of each as they are now.
// Whatever commits later sees the move and is refused (55006); the copy,
// the stream, the deletes, an undo and a recovery act on this plan only.
// The journal says 'copying' before the publication and the slot exist.
void fix_plan(OnlineMove &m) {
    const std::string &map = m.map, &logical_s = m.logical_s;
    // The lock is taken over kSelf, in a transaction of its own that the
    // journal row commits in; the plan is read here once it is held (what
    // pin and the rest committed before is seen, nothing commits after).
    dbl(kSelf, "BEGIN; SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('sharding.move_plan'), "
               "pg_catalog.hashtext(" + lit(map) + "))");
    try {
        const Text shards = require_map(Text(map), false);
        const std::vector<Row> p = spi_rows("SELECT coalesce(pg_catalog.array_agg(x.key ORDER BY x.key), '{}')::text, "
                                            "pg_catalog.count(*)::text FROM sharding.pins x WHERE x.map = $1",
                                            {map.c_str()});
        const std::vector<TableFilter> now =
            table_filters(move_tables(map), shards, m.logical, m.key, p[0][0], std::atoi(must(p[0][1]).c_str()));
        // In the order of their names as the database sorts text.
        std::vector<std::string> names;
        for (const TableFilter &t : now) names.push_back(t.rel);
        std::vector<std::string> rels, filters;
        const std::string order = "SELECT (u.i - 1)::text FROM pg_catalog.unnest(" + text_array(names) +
                                  ") WITH ORDINALITY AS u(rel, i) ORDER BY u.rel";
        for (const Row &r : spi_rows(order.c_str(), {})) {
            const TableFilter &t = now[std::strtoul(must(r[0]).c_str(), nullptr, 10)];
            rels.push_back(t.rel);
            filters.push_back(t.filter);
        }
        m.move_id = dbl(kSelf, "UPDATE sharding.move_journal AS j SET phase = " + lit(std::string(to_text(Phase::Copying))) +
                               ", phase_started = pg_catalog.now(), plan_shards = " + (shards ? lit(shards) : std::string("NULL")) + "::integer, plan_pins = " +
                               lit(p[0][0]) + "::text[], plan_tables = " + text_array(rels) + ", plan_filters = " +
                               text_array(filters) + " WHERE j.map = " + lit(map) + " AND j.logical = " + logical_s +
                               " AND j." + kLive + " RETURNING j.move");
        dbl(kSelf, "COMMIT");
    } catch (...) {
        dbl(kSelf, "ROLLBACK");
        throw;
    }
    m.step = Phase::Copying;  // as the journal row since the commit above
    std::vector<Row> &planned = m.planned;
    if (m.move_id) {
        planned = spi_rows("SELECT j.plan_pins::text, pg_catalog.cardinality(j.plan_pins)::text, j.plan_shards::text, "
                           "r.rel, r.filter FROM sharding.move_journal j LEFT JOIN LATERAL "
                           "ROWS FROM (pg_catalog.unnest(j.plan_tables), pg_catalog.unnest(j.plan_filters)) WITH ORDINALITY AS r(rel, filter, i) ON true "
                           "WHERE j.move = $1::bigint ORDER BY r.i",
                           {c(m.move_id)});
        if (planned.empty()) fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "move %s has no plan", c(m.move_id));
        m.pins = planned[0][0];
        m.npins = std::atoi(planned[0][1].value_or("0").c_str());
        m.shards = must(planned[0][2]);
    } else {
        // A move without a journal row (sharding._move_online called by
        // itself): the configuration as it is now.
        std::vector<Row> p = spi_rows("SELECT coalesce(pg_catalog.array_agg(p.key), '{}')::text, pg_catalog.count(*)::text "
                                      "FROM sharding.pins p WHERE p.map = $1",
                                      {map.c_str()});
        m.pins = p[0][0];
        m.npins = std::atoi(must(p[0][1]).c_str());
    }
}

// The tables the plan carries, each with its condition and the columns
// compare_schemas read at the source (the same at the destination).
void plan_tables(OnlineMove &m) {
    const std::string &map = m.map, &logical_s = m.logical_s;
    for (const MoveTable &t : m.live) {
        std::string filter;
        if (m.move_id) {
            // Only the tables of the plan, with its conditions.
            bool found = false;
            for (const Row &r : m.planned)
                if (r[3] && *r[3] == t.rel) {
                    filter = must(r[4]);
                    found = true;
                }
            if (!found) continue;
        } else
            filter = filter_sql(t.key_column, t.key_type, Text(m.shards), Text(logical_s), m.key, m.pins, m.npins);
        // The columns read at the source (the same at the destination).
        const auto &copied = m.copied_columns[t.rel];
        m.tables.push_back(CopyTable{t.rel, filter, copied.first, copied.second});
        m.described.push_back(t);
        m.table_list += (m.table_list.empty() ? "" : ", ") + t.rel;
    }
    // Every table of the plan is carried: one the plan has and the look at
    // the map's tables has not would be deleted at the source by the plan
    // and never copied.
    for (const Row &r : m.planned) {
        if (!r[3]) continue;
        bool described = false;
        for (const CopyTable &t : m.tables) described = described || t.rel == *r[3];
        if (!described)
            fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, Explain{"", "Move the shard again."},
                 "table %s of map \"%s\" changed while the move of logical shard %d started", r[3]->c_str(),
                 map.c_str(), m.logical);
    }
    if (m.tables.empty())
        // Undistributed between the look at the map's tables and the plan
        // (refuse_after_plan ends its journal row: nothing was made anywhere).
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, Explain{"", "Move the shard again."},
             "the distributed tables of map \"%s\" changed while the move of logical shard %d started", map.c_str(),
             m.logical);
    for (const CopyTable &t : m.tables) {
        m.signature_src.push_back(m.signatures[t.rel].first);
        m.signature_dst.push_back(m.signatures[t.rel].second);
    }
}

// "the move of logical shard L of map "M"", as messages name it.
std::string the_move(const OnlineMove &m) {
    return format("the move of logical shard %d of map \"%s\"", m.logical, m.map.c_str());
}

// A step of the move failed with `inner`, and the move goes on without it:
// a cancel (or an assertion: not_others) is raised again, any other error
// becomes the WARNING "could not <what>: <its message>" with `hint`.
void survive(const Caught &inner, const std::string &what, const char *hint) {
    if (not_others(inner.code)) reraise(inner);
    warn("could not " + what + ": " + inner.message, hint);
}

// compare_schemas and plan_tables, after the plan: when they refuse the
// move, nothing has been made at either end yet (no publication, slot,
// decoder's row, subscription or frozen shard, no row copied). The journal
// row, in 'copying' since fix_plan committed it, is marked undone, so that
// its executor (move_journal.cpp) ends it 'failed' (or 'cancelled') with
// the refusal's SQLSTATE, message, detail and hint; then the refusal is
// raised as it was.
void refuse_after_plan(OnlineMove &m, const std::function<void()> &steps) {
    Caught why;
    if (subxact(steps, &why)) return;
    if (m.move_id) {
        Caught inner;
        if (!subxact([&] { journal("UPDATE sharding.move_journal SET undone = true " + m.live_where); }, &inner))
            survive(inner, "record the refusal of " + the_move(m),
                    "The next sharding.move_shard_online or sharding._move_recover of this shard ends it.");
    }
    disconnect();
    reraise(why);
}

// The hosts of the move's ends and their CPUs in its journal row (each
// node's sharding._move_host, where its SQL has it and the engine's role
// there may call it; otherwise unknown, and the move shares sessions only
// with moves at its nodes): move_share reads them.
void note_hosts(const OnlineMove &m) {
    if (!m.move_id || !journal_has("source_host")) return;
    std::string set;
    for (const char *end : {kSrc, kDst}) {
        const std::string column = end == kSrc ? "source" : "destination";
        Text host;
        try {
            if (dbl(end, "SELECT pg_catalog.to_regprocedure('sharding._move_host()') IS NOT NULL AND "
                         "pg_catalog.has_function_privilege('sharding._move_host()', 'EXECUTE')") == Text("t"))
                host = dbl(end, "SELECT h.cpus::text || ' ' || h.host FROM sharding._move_host() h");
        } catch (const Error &e) {
            debug_at("move " + m.name + ": the " + column + "'s host is unknown: " + e.what());
        }
        const size_t space = host ? host->find(' ') : std::string::npos;
        if (space == std::string::npos) continue;
        set += std::string(set.empty() ? "" : ", ") + column + "_host = " + lit(host->substr(space + 1)) + ", " +
               column + "_cpus = " + std::to_string(std::atoi(host->c_str()));
    }
    if (!set.empty()) journal("UPDATE sharding.move_journal SET " + set + " WHERE move = " + *m.move_id);
}

// The sessions at both ends, named and bounded; the ends' hosts noted.
void prepare_sessions(OnlineMove &m) {
    // The destination's session is known by this name there: an undo ends
    // whatever it may still run ...
    dbl(kDst, "SET application_name = " + lit(m.name));
    // ... and ends by itself if this session goes away (a crash, kill -9):
    // its copy is then rolled back there, never committed later.
    dbl(kDst, "SET client_connection_check_interval = 1000");
    // The same for this session's connection to the source, which holds
    // the controller lock there (below): a statement it runs when this
    // session is gone ends within a second, and the lock with it.
    dbl(kSrc, "SET client_connection_check_interval = 1000");
    note_hosts(m);
}

// open_stream (copying): the controller lock, the tables' storage at both ends, the
// publication, the decoder's instructions and the slot, whose snapshot the
// copy reads; the plan's leaf partitions noted.
void open_stream(OnlineMove &m) {
    const std::string &name = m.name;
    debug_at("move " + name + ": publication and slot");
    // The controller lock, held over this connection until the move ends:
    // the slot's decoder sends nothing once it is free
    // (move_controller.hpp).
    if (dbl(kSrc, "SELECT pg_catalog.pg_try_advisory_lock(" + std::to_string(kControllerLockClass) +
                      ", pg_catalog.hashtext(" + lit(name) + "))") != Text("t"))
        fail(ERRCODE_OBJECT_IN_USE,
             Explain{"Another session at the source holds the controller lock of move " + name + ".", ""},
             "logical shard %d of map \"%s\" is already being moved", m.logical, m.map.c_str());
    // The tables' storage at both ends, before the slot and the copy.
    std::string rels;
    for (const MoveTable &t : m.described) rels += (rels.empty() ? "" : ", ") + lit(t.rel);
    rels = "ARRAY[" + rels + "]::pg_catalog.regclass[]";
    const std::string others = other_shards_leaves(m.described, m.shards, m.logical_s);
    m.storage_src = storage_of(kSrc, rels, others);
    m.storage_dst = storage_of(kDst, rels, others);
    // Publication, then the slot: changes from here on are kept. A
    // partitioned table's changes are published as its own (the decoder
    // maps each leaf to it), so the destination applies them into its
    // table, however its partitions are named or bounded.
    dbl(kSrc, "CREATE PUBLICATION " + ident(name) + " FOR TABLE " + m.table_list +
                  " WITH (publish = 'insert, update, delete', publish_via_partition_root = true)");
    // The decoder's instructions first (committed before the slot, so its
    // historic snapshot sees them).
    std::string oids, key_columns;
    for (const MoveTable &t : m.described) {
        oids += (oids.empty() ? "" : ", ") + lit(t.rel) + "::pg_catalog.regclass";
        key_columns += (key_columns.empty() ? "" : ", ") + lit(t.key_column);
    }
    dbl(kSrc, "DELETE FROM sharding.move_decoding WHERE slot = " + lit(name) +
                  "; INSERT INTO sharding.move_decoding (slot, map, shards, logical, key, pins, tables, "
                  "key_columns) VALUES (" +
                  lit(name) + ", " + lit(m.map) + ", " + m.shards + ", " + m.logical_s + ", " + lit(m.key) + ", " +
                  lit(m.key ? Text("{}") : m.pins) + "::text[], ARRAY[" + oids + "]::pg_catalog.oid[], ARRAY[" +
                  key_columns + "]::text[])");
    // The source lets its sessions name plugin "sharding"
    // (output_plugin_libraries, where the server has the setting).
    m.plugin_opts = dbl(
        kSrc,
        "SELECT CASE WHEN l IS NULL OR 'sharding' = ANY (pg_catalog.string_to_array(l, ',')) THEN '' "
        "ELSE '-c output_plugin_libraries=' || l || ',sharding' END "
        "FROM (SELECT pg_catalog.replace(pg_catalog.current_setting('output_plugin_libraries', true), ' ', '') "
        "AS l) AS s");
    // Over a replication connection, exporting its snapshot: the copy reads
    // exactly what precedes the slot's stream.
    m.snapshot = create_slot(must(m.source), name, "sharding", m.plugin_opts.value_or(std::string())).snapshot;
    // The plan's leaf partitions at the source (a table that is not
    // partitioned is its own leaf).
    if (m.move_id)
        journal("UPDATE sharding.move_journal SET plan_leaves = " +
                lit(must(dbl(kSrc, "SELECT coalesce(pg_catalog.array_agg(p.relid::pg_catalog.regclass::text "
                                   "ORDER BY p.relid::pg_catalog.regclass::text), '{}')::text FROM "
                                   "pg_catalog.unnest(" + rels + ") AS r(rel), pg_catalog.pg_partition_tree(r.rel) "
                                   "AS p WHERE p.isleaf"))) +
                "::text[] WHERE move = " + *m.move_id);
}

// The copy's work: what one session of the destination pulls at a time
// (a whole table, a leaf partition, or a range of the blocks of either).
struct CopyPart {
    std::string target;    // the destination's table (or leaf) it writes into
    std::string attnames;  // text[] of the columns
    std::string query;     // SELECT ... at the source
    int64 blocks = 0;      // its size at the source, for the order
};

// What the copy reads of table t at the source, and where it writes it. A
// shard-partitioned table: the shard's leaf at the source, read whole (no
// filter, no other leaf scanned), written straight into the shard's leaf at
// the destination too where it has one: no routing, and CopyFrom batches
// (the guard's idle trigger is left out on the table it writes to, not on
// the leaves it would route to). condition: "" for the whole relation.
struct CopyRead {
    std::string from, condition, target;
};
CopyRead copy_read(const OnlineMove &m, const CopyTable &t) {
    CopyRead r{t.rel, t.filter, t.rel};
    if (!m.key) {
        const std::string leaf_of = "SELECT s.leaf FROM (" + shard_leaves_sql(lit(t.rel) + "::pg_catalog.regclass") +
                                    ") s WHERE s.shard = " + lit(t.filter);
        Text leaf = dbl(kSrc, leaf_of);
        if (leaf) {
            r.from = *leaf;
            r.condition.clear();
            Text there = dbl(kDst, leaf_of);
            if (there) r.target = *there;
        }
    }
    return r;
}

std::string pull_sql(const OnlineMove &m, const std::string &target, const std::string &attnames,
                     const std::string &query) {
    return "SELECT sharding._move_pull(" + lit(m.source) + ", " + lit(m.snapshot) + ", " + lit(target) +
           "::pg_catalog.regclass, " + attnames + ", " + lit(query) + ")::text";
}

// The work list of a copy over `sessions` sessions: every table of the
// plan; a partitioned table read with a filter, leaf by leaf (plain tables
// only; else as a whole, through its root); each of these of at least
// 2 * kPartPages blocks at the source in block ranges (parts_for), all under
// the one snapshot of the slot. The largest first: the small ones fill the
// sessions' idle ends.
std::vector<CopyPart> plan_copy(const OnlineMove &m, int sessions) {
    std::vector<CopyPart> parts;
    for (const CopyTable &t : m.tables) {
        const CopyRead r = copy_read(m, t);
        const std::string attnames = text_array(t.attnames);
        // (relation read, its blocks)
        std::vector<std::pair<std::string, int64>> reads;
        if (r.from == t.rel) {
            // Its leaves, when every one is a plain table (their oids, read
            // at once; a leaf attached, detached or rewritten during the
            // move fails it at the cutover: hold_storage).
            const std::string oids = must(dbl(
                kSrc, "SELECT CASE WHEN pg_catalog.bool_and(c.relkind = 'r') THEN pg_catalog.string_agg(c.oid::text, "
                      "' ' ORDER BY c.oid) END FROM pg_catalog.pg_partition_tree(" + lit(t.rel) +
                      "::pg_catalog.regclass) p JOIN pg_catalog.pg_class c ON c.oid = p.relid WHERE p.isleaf AND "
                      "p.relid OPERATOR(pg_catalog.<>) " + lit(t.rel) + "::pg_catalog.regclass"));
            size_t at = 0;
            while (at < oids.size()) {
                size_t end = oids.find(' ', at);
                if (end == std::string::npos) end = oids.size();
                const std::string oid = oids.substr(at, end - at);
                at = end + 1;
                Text leaf = dbl(kSrc, "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_class c "
                                      "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = " +
                                      lit(oid) + "::pg_catalog.oid");
                if (!leaf)
                    fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "a leaf partition of %s at the source is gone",
                         t.rel.c_str());
                reads.emplace_back(*leaf, 0);
            }
        }
        if (reads.empty()) reads.emplace_back(r.from, 0);
        for (auto &read : reads) {
            read.second = std::strtoll(must(dbl(kSrc, blocks_query(read.first))).c_str(), nullptr, 10);
            const int n = parts_for(read.second, sessions);
            for (int i = 0; i < n; i++) {
                std::string where = n == 1 ? r.condition : part_condition(r.condition.empty() ? "true" : r.condition,
                                                                         read.second, i, n);
                parts.push_back(CopyPart{r.target, attnames,
                                         "SELECT " + t.cols + " FROM " + read.first + (where.empty() ? "" : " WHERE " + where),
                                         read.second / n});
            }
        }
    }
    std::stable_sort(parts.begin(), parts.end(), [](const CopyPart &a, const CopyPart &b) { return a.blocks > b.blocks; });
    return parts;
}

// copy_rows (copying), filtered at the source: the destination pulls each table under
// the slot's snapshot. move_progress is kept current meanwhile.
void copy_rows(OnlineMove &m) {
    const std::string &name = m.name;
    enter(m, Phase::Copying);
    // Leftovers of the shard at the destination (it does not own them).
    delete_shard_rows(kDst, m.map, m.logical, m.key);
    dbl(kDst, "SET session_replication_role = replica");
    // The destination's sharding.move_parallel sessions copy (its setting);
    // with other moves in flight at its nodes or on its hosts, the copy
    // takes its share of them (move_share).
    const int parallel = std::atoi(
        must(dbl(kDst, "SELECT coalesce(pg_catalog.current_setting('sharding.move_parallel', true), '2')")).c_str());
    const Share share = move_share(m.map, m.logical, parallel);
    const int sessions = share.sessions;
    if (share.at_nodes > 1)
        debug_at("move " + name + ": " + std::to_string(share.at_nodes) + " moves in flight share the copy's sessions");
    if (share.on_host > 1)
        debug_at("move " + name + ": " + std::to_string(share.on_host) + " moves in flight on one host: the copy in " +
                 std::to_string(sessions) + " of " + std::to_string(parallel) + " sessions");
    // move_progress is kept current while the destination copies: every
    // quarter of a second, the rows and bytes the source's side of the
    // pull has sent so far (copy_progress) on top of the parts already
    // copied, committed in the journal. The tick only reports: what it
    // fails with (a journal update refused, the source's progress view
    // unreadable) is logged, a WARNING the first time, and the copy goes
    // on. A cancel (a PostgreSQL error, not a sharding::Error) ends the
    // wait.
    int64 copied_rows = 0, copied_bytes = 0;
    Copied noted;  // what move_progress shows: never less than before
    bool tick_warned = false;
    auto tick = [&] {
        try {
            Copied now = copy_progress(name);
            noted.rows = std::max(noted.rows, copied_rows + now.rows);
            noted.bytes = std::max(noted.bytes, copied_bytes + now.bytes);
            note_copied(m.live_where, noted.rows, noted.bytes);
        } catch (const Error &e) {
            const std::string what = "could not note the progress of the copy of move " + name + ": " + e.what();
            if (!tick_warned)
                warn(what);
            else
                debug_at(what);
            tick_warned = true;
        }
    };
    // What the copy is expected to send, and when it starts (time_left).
    note_expected(m.live_where, m.tables, !m.key);
    // Pulls in this move's own session at the destination, one pull after
    // the other, each in one part there (sharding.move_parallel 1 for the
    // while, when it is more).
    auto pull_here = [&](const std::vector<CopyPart> &reads) {
        Text parallel_was;
        if (parallel > 1) {
            parallel_was = dbl(kDst, "SELECT pg_catalog.current_setting('sharding.move_parallel', true)");
            dbl(kDst, "SELECT pg_catalog.set_config('sharding.move_parallel', '1', false)");
        }
        for (const CopyPart &p : reads) {
            Text pulled;
            {
                WaitTick progress(tick, 250);
                pulled = dbl(kDst, pull_sql(m, p.target, p.attnames, p.query));
            }
            Copied done = pulled_pair(pulled);
            copied_rows += done.rows;
            copied_bytes += done.bytes;
            note_copied(m.live_where, copied_rows, copied_bytes);
        }
        if (parallel_was)
            dbl(kDst, "SELECT pg_catalog.set_config('sharding.move_parallel', " + lit(*parallel_was) + ", false)");
    };
    if (sessions < 2) {
        // One session, this one's at the destination: table after table.
        // The destination pulls COPY (SELECT ... WHERE filter) TO STDOUT
        // from the source under the slot's exported snapshot, straight
        // into the table (move_copy.cpp).
        std::vector<CopyPart> reads;
        for (const CopyTable &t : m.tables) {
            const CopyRead r = copy_read(m, t);
            reads.push_back(CopyPart{r.target, text_array(t.attnames),
                                     "SELECT " + t.cols + " FROM " + r.from +
                                         (r.condition.empty() ? "" : " WHERE " + r.condition)});
        }
        pull_here(reads);
    } else {
        // Sessions of their own at the destination (named as the move, so
        // that an undo ends them with the rest; each ending by itself if
        // this session goes away; each one part at a time, no parts within
        // parts) work on one queue of every table's parts: a session that
        // is done takes the next part, whatever its table. Each part reads
        // the slot's exported snapshot (held until close_held below) and
        // commits on its own; a failed move's undo deletes what they left,
        // as it deletes the rows of any table already copied.
        const std::vector<CopyPart> parts = plan_copy(m, sessions);
        const int nsessions = std::min<int>(sessions, (int)parts.size());
        const std::string nice =
            must(dbl(kDst, "SELECT coalesce(pg_catalog.current_setting('sharding.move_nice', true), '0')"));
        // One part (one table or leaf too small at the source to be cut, or
        // a table read through its root): this move's own session at the
        // destination pulls it, as with one session; a session of its own
        // would cost a connection there (and its first checks, ~20 ms) for
        // nothing. Not when the copy is to run niced: that would renice
        // this session for the rest of the move.
        const bool here = parts.size() == 1 && std::atoi(nice.c_str()) == 0;
        debug_at("move " + name + ": copying " + std::to_string(parts.size()) + " parts of " +
                 std::to_string(m.tables.size()) + " tables in " +
                 (here ? std::string("the move's own session at the destination")
                       : std::to_string(nsessions) + " sessions"));
        if (here) {
            pull_here(parts);
        } else {
            const std::string info = conninfo_of(named_connection(kDst));
            const std::string options = "-c client_connection_check_interval=1000 -c sharding.move_parallel=1 "
                                        "-c sharding.move_nice=" + std::to_string(std::atoi(nice.c_str())) +
                                        " -c session_replication_role=replica";
            std::vector<std::unique_ptr<Remote>> own;
            std::vector<PGconn *> conns;
            for (int i = 0; i < nsessions; i++) {
                // A destination at max_connections: the sessions it gave copy.
                try {
                    own.push_back(std::make_unique<Remote>(info, false, name, options));
                } catch (const Error &e) {
                    if (i == 0 || !out_of_connections(e)) throw;
                    warn(format("move %s copies in %d sessions, not %d: %s", name.c_str(), i, nsessions, e.what()),
                         "Raise max_connections at the destination, or lower sharding.move_parallel.");
                    break;
                }
                conns.push_back(own.back()->conn());
                own.back()->run("SET search_path = pg_catalog, pg_temp");
                nice_session(conns.back(), std::atoi(nice.c_str()));
            }
            std::vector<std::string> work;
            for (const CopyPart &p : parts) work.push_back(pull_sql(m, p.target, p.attnames, p.query));
            run_queue(
                conns, work, "copying a part: ",
                [&](size_t, const std::string &v) {
                    Copied done = pulled_pair(Text(v));
                    copied_rows += done.rows;
                    copied_bytes += done.bytes;
                },
                tick, 250);
            note_copied(m.live_where, copied_rows, copied_bytes);
        }
    }
    dbl(kDst, "SET session_replication_role = origin");
    // The snapshot is no longer needed: let go of the replication connection.
    close_held(name);
}

// subscribe (copying): stream from the slot made before the copy. No filter at the
// destination: the slot's decoder (plugin "sharding", pgoutput inside)
// sends only the shard's changes. synchronous_commit on: the apply worker
// confirms a position only once its commit is flushed here, so with 'off'
// (the default for subscriptions) each confirmation would wait for the
// WAL writer, inside the cutover.
void subscribe(OnlineMove &m) {
    const std::string &name = m.name;
    Text conninfo;
    if (m.src_dsn)
        conninfo = real_dsn(*m.src_dsn) + (m.plugin_opts && !m.plugin_opts->empty() ? " options='" + *m.plugin_opts + "'"
                                                                           : std::string());
    // It connects to the source over a replication connection. Right after
    // another move's stream from there ended, that stream's WAL sender may
    // not have exited yet, and a source at its max_wal_senders refuses the
    // connection for that moment (a job waits for a free sender before it
    // starts a move, not for one that is ending): retried for up to 10 s.
    const std::string subscribe = "CREATE SUBSCRIPTION " + ident(name) + " CONNECTION " + lit(conninfo) +
                                  " PUBLICATION " + ident(name) + " WITH (create_slot = false, slot_name = " +
                                  lit(name) + ", copy_data = false, synchronous_commit = 'on', streaming = off)";
    for (long waited = 0, nap = 50;; waited += nap, nap = std::min(nap * 2, 1000L)) {
        try {
            dbl(kDst, subscribe);
            break;
        } catch (const Error &e) {
            if (e.sqlstate() != ERRCODE_CONNECTION_FAILURE || std::strstr(e.what(), "max_wal_senders") == nullptr ||
                waited >= 10000)
                throw;
        }
        debug_at("move " + name + ": the source has no free WAL sender yet");
        sleep_ms(nap);
    }
    // The destination stops the subscription's worker by itself if this
    // session goes away (move_controller.hpp).
    dbl(kDst, "SELECT sharding._move_watch(" + lit(name) + ")");
}

// catch_up (catching_up) until a round is short: the backlog left for the frozen
// phase is then a fraction of a second of writes.
void catch_up(OnlineMove &m) {
    enter(m, Phase::CatchingUp);
    phase(m.map, m.logical, Phase::CatchingUp);
    for (int i = 1; i <= 100; i++)
        if (wait_flush(m.name, 600, m.live_where) < 0.2) break;
}

// One try of the cutover, within the freeze timeout: freeze the source
// (waits for its in-flight writers), let the destination apply the
// source's last change, hold both ends' storage and columns, switch. The
// switch and the journal's 'cleanup' commit together, over this
// database's own connection. Throws 55P03 (the timeout) with *frozen and
// *held saying what to let go.
void try_cutover(OnlineMove &m, const std::string &timeout_ms, bool *frozen, bool *held) {
    const std::string &map = m.map, &name = m.name;
    dbl(kSrc, "SET lock_timeout = " + timeout_ms);
    call_fn(kSrc, "_freeze_shard", map, m.logical);
    *frozen = true;
    dbl(kSrc, "SET lock_timeout = 0");
    debug_at("move " + name + ": frozen");
    wait_flush(name, 60, m.live_where);
    debug_at("move " + name + ": caught up");
    // Neither end truncated nor rewrote a table meanwhile, and neither does
    // until the switch has committed.
    *held = true;
    hold_storage(kSrc, m.table_list, m.storage_src, m.source, map, m.logical);
    hold_storage(kDst, m.table_list, m.storage_dst, Text(m.node), map, m.logical);
    // Nor changed a table's columns (under the same locks).
    hold_columns(kSrc, m.tables, m.signature_src, m.source, map, m.logical);
    hold_columns(kDst, m.tables, m.signature_dst, Text(m.node), map, m.logical);
    // The destination's rows as of the switch, for the verification.
    if (m.verify) hold_verify_snapshot(m.node);
    // Waiting at most the timeout for the coordinator's shard lock; the
    // move's own pin passes _move_refuse.
    const std::string bounded = "SELECT pg_catalog.set_config('lock_timeout', " + lit(timeout_ms) +
                                ", true), pg_catalog.set_config('sharding_move.own', " +
                                lit(m.move_id.value_or("")) + ", true); ";
    if (!m.key)
        m.out.new_epoch = dbl(kSelf, bounded + "WITH m AS (SELECT sharding._switch_owner(" + lit(map) + ", " +
                                         m.logical_s + ", " + lit(m.node) +
                                         ") AS e), j AS (UPDATE sharding.move_journal SET phase = " PHASE_SQL(CLEANUP) ", "
                                         "phase_started = pg_catalog.now(), new_epoch = (SELECT e FROM m) " +
                                         m.live_where + ") SELECT e FROM m");
    else
        dbl(kSelf, bounded + "WITH m AS (SELECT sharding.pin(" + lit(map) + ", " + lit(m.key) + "::text, " +
                       lit(m.node) +
                       ")), j AS (UPDATE sharding.move_journal SET phase = " PHASE_SQL(CLEANUP) ", "
                       "phase_started = pg_catalog.now(), new_epoch = " +
                       m.out.new_epoch.value_or("NULL") + " " + m.live_where + ") SELECT 1 FROM m");
}

// cut_over (cutover). Bounded (sharding.move_freeze_timeout): the freeze waits at
// most that long for the shard's writers at the source (a fence, an idle
// transaction that wrote a row of the shard), and so does the switch for
// the coordinator's shard lock; new writers queued behind the freeze wait
// no longer. Past it the source thaws, the move goes on streaming and
// tries again a second later, three times in all, then fails with 55P03
// (rolled back by fail_move, nothing lost).
void cut_over(OnlineMove &m) {
    enter(m, Phase::Cutover);
    // The delete's origin states at the source, taken before the switch
    // (review RB-9): without them the move fails here, rolled back.
    reserve_origins(kSrc, m.name, m.source.value_or(""));
    phase(m.map, m.logical, Phase::Cutover);
    const std::string timeout_ms = std::to_string(move_freeze_timeout);
    for (int attempt = 1;; attempt++) {
        bool frozen = false, held = false;
        try {
            try_cutover(m, timeout_ms, &frozen, &held);
            break;
        } catch (const Error &e) {
            if (e.sqlstate() != ERRCODE_LOCK_NOT_AVAILABLE) throw;
            if (held) {
                dbl(kSrc, "ROLLBACK");
                dbl(kDst, "ROLLBACK");
            }
            named_disconnect(kVerify);
            dbl(kSrc, "SET lock_timeout = 0");
            if (frozen) call_fn(kSrc, "_thaw_shard", m.map, m.logical);
            debug_at("move " + m.name + ": cutover attempt " + std::to_string(attempt) + " timed out: " + e.what());
            if (attempt >= kFreezeAttempts)
                throw Error(ERRCODE_LOCK_NOT_AVAILABLE,
                            format("the cutover of logical shard %d of map \"%s\" waited longer than "
                                   "sharding.move_freeze_timeout (%s ms) for the shard's writers %d times",
                                   m.logical, m.map.c_str(), timeout_ms.c_str(), attempt),
                            std::string("Last: ") + e.what(),
                            "A session holds the shard at the source or at the coordinator (a fence, an "
                            "idle transaction that wrote to it): end it and move again, or raise "
                            "sharding.move_freeze_timeout.");
            sleep_ms(1000);
        }
    }
    dbl(kSrc, "COMMIT");
    dbl(kDst, "COMMIT");
    enter(m, Phase::Cleanup);
}

// verify_copies (cleanup): before the source's rows go (finish calls it), the copies compared.
// A difference cannot undo the switch: the journal row ends 'failed' with
// XX001 and the source keeps its copy for an operator.
void verify_copies(OnlineMove &m) {
    if (!m.verify) return;
    const double started = clock_seconds();
    std::optional<Difference> d = compare_copies(m.tables);
    named_disconnect(kVerify);
    debug_at("move " + m.name + ": verified in " + float_text(clock_seconds() - started) + " s");
    if (!d) return;
    auto counted = [](const std::string &v) {
        const size_t sp = v.find(' ');
        return v.substr(0, sp) + " rows (checksum " + v.substr(sp + 1) + ")";
    };
    const std::string message =
        format("the rows of table %s moved with logical shard %d of map \"%s\" differ: the source has %s, the "
               "destination %s",
               d->table.c_str(), m.logical, m.map.c_str(), counted(d->source).c_str(), counted(d->destination).c_str());
    const std::string detail = "The destination owns the shard; the source keeps its copy of the "
                               "shard's rows (refused by its guard, invisible to routing).";
    const std::string hint = "Compare the rows of the shard at both ends, repair the destination's, "
                             "then delete the source's copy.";
    journal("UPDATE sharding.move_journal SET phase = " PHASE_SQL(FAILED) ", phase_started = pg_catalog.now(), "
            "finished = pg_catalog.now(), pid = NULL, lag_bytes = 0, error = " + lit(message) +
            ", error_state = 'XX001', error_detail = " + lit(detail) + ", error_hint = " + lit(hint) + " " +
            m.live_where);
    m.verify_failed = true;
    fail(ERRCODE_DATA_CORRUPTED, Explain{detail, hint}, "%s", message.c_str());
}

// Whether a move that failed in its cutover switched all the same. The
// switch may have committed even though its statement failed here: a
// cancel (statement_timeout, rebalance_cancel) that lands while the remote
// commit is under way is ignored there, yet this side raises it. The
// statement has ended by now (a failed wait drains it), so the journal
// tells: 'cleanup' is committed with the switch, never without it. Read
// over a fresh connection, not this transaction's snapshot. Raises err
// when it cannot tell (the journal row stays for _move_recover).
bool switched_after_all(OnlineMove &m, const Caught &err) {
    Text committed;
    Caught inner;
    if (!subxact(
            [&] {
                named_disconnect(kSelf);
                const std::string self = coordinator_dsn();
                named_connect(kSelf, self.c_str());
                committed = dbl(kSelf, "SELECT COALESCE(new_epoch::text, '') FROM sharding.move_journal " +
                                           m.live_where + " AND phase = " PHASE_SQL(CLEANUP));
            },
            &inner)) {
        // Unknown: neither thaw nor undo; _move_recover finishes or rolls
        // back by the journal's phase.
        survive(inner, "tell whether " + the_move(m) + " switched",
                "The next sharding.move_shard_online or sharding._move_recover of this shard finishes or rolls it back.");
        disconnect();
        reraise(err);
    }
    if (!committed) return false;
    if (!m.key && !committed->empty()) m.out.new_epoch = committed;
    debug_at("move " + m.name + ": switched, though its statement failed");
    return true;
}

// A step failed (the subtransaction of the steps is rolled back): before
// the switch the source thaws first and the move is undone; after it, the
// move is finished. Then the error is raised again, saying what happened
// to the shard.
[[noreturn]] void fail_move(OnlineMove &m, const Caught &err) {
    elog(DEBUG1, "move %s failed at step %s: %s (%s)", m.name.c_str(), to_text(m.step), err.message.c_str(),
         err.context.c_str());
    if (m.verify_failed) {
        // The copies differ: the journal row has ended 'failed', and the
        // source's copy stays for an operator. Nothing to tidy.
        disconnect();
        reraise(err);
    }
    bool switched = m.step == Phase::Cleanup;
    if (m.step == Phase::Cutover) switched = switched_after_all(m, err);
    Caught inner;
    // Not switched: the source stays frozen until undo has heard from the
    // destination that it does not own the shard (a coordinator restored
    // from a backup, or one that crashed, may have missed a switch the
    // nodes saw); a destination out of reach leaves it frozen and the
    // journal row live for _move_recover.
    // Connections may be in any state: start from fresh ones (the
    // journal's too, which connect() would keep when idle).
    const bool tidied = subxact(
        [&] {
            named_disconnect(kSelf);
            connect(m.source, Text(m.node));
            if (switched)
                finish(m.map, m.logical, m.key, m.node, m.out.new_epoch);
            else if (!undo(m.map, m.logical, m.key))
                switched = true;  // the destination owned it: finished
        },
        &inner);
    if (!tidied)
        warn(format("could not clean up after the failed move of logical shard %d of map \"%s\": %s", m.logical,
                    m.map.c_str(), inner.message.c_str()),
             "The next sharding.move_shard_online or sharding.isolate of this shard cleans up first.");
    disconnect();
    if (switched && tidied)
        // The move happened and is finished; only the call was interrupted
        // (a cancel that landed while the switch committed).
        throw Error(err.code,
                    format("logical shard %d of map \"%s\" moved to \"%s\" (epoch %s) and was finished, but the call "
                           "failed: %s",
                           m.logical, m.map.c_str(), m.node.c_str(), m.out.new_epoch.value_or("<NULL>").c_str(),
                           err.message.c_str()),
                    std::string(), "Nothing is left to do: the destination owns the shard.");
    if (switched)
        // The move itself happened; only its tidying failed.
        throw Error(err.code,
                    format("logical shard %d of map \"%s\" moved to \"%s\" (epoch %s), but finishing failed: %s",
                           m.logical, m.map.c_str(), m.node.c_str(), m.out.new_epoch.value_or("<NULL>").c_str(),
                           err.message.c_str()),
                    std::string(), "Call sharding.move_shard_online again to finish.");
    reraise(err);
}

}  // namespace

// The move, as its steps (OnlineMove above).
MoveResult move_online(const Text &map_arg, int32 logical, const Text &key, const std::string &node,
                       bool may_defer) {
    OnlineMove m;
    m.logical = logical;
    m.logical_s = std::to_string(logical);
    m.key = key;
    m.node = node;
    Text shards_t = require_map(map_arg, false);
    m.map = *map_arg;  // _require_map refused NULL
    m.name = journal_move_name(m.map, logical);
    m.shards = shards_t.value_or(std::string());
    m.live_where = "WHERE map = " + lit(m.map) + " AND logical = " + m.logical_s + " AND " + kLive;
    // A deferred clean-up needs the journal's column cleanup_deferred
    // (1.4's SQL): without it a deferred row would not say so, and the
    // move cleans up before it returns, as it says.
    const bool want_defer = may_defer && !key && move_cleanup == static_cast<int>(Cleanup::Deferred);
    const bool defer = want_defer && journal_has("cleanup_deferred");
    if (!find_source(m)) return m.out;  // nothing to clean up
    if (want_defer && !defer)
        ereport(NOTICE, (errmsg("the move of logical shard %d of map \"%s\" cleans up before it returns: a deferred "
                                "clean-up needs version 1.4 of the extension's SQL",
                                logical, m.map.c_str()),
                         errhint("Run ALTER EXTENSION sharding UPDATE in this database.")));

    refuse_written();
    connect(m.source, Text(node));
    check_ends(m);
    if (m.live.empty()) {
        // No distributed table: nothing to carry, the switch is the move.
        refuse_missing_on_coordinator(m);
        disconnect();
        if (!key)
            m.out.new_epoch = switch_owner(Text(m.map), Text(m.logical_s), Text(node));
        else
            spi_value("SELECT sharding.pin($1, $2, $3)", {m.map.c_str(), c(key), node.c_str()});
        return m.out;
    }
    m.src_dsn = spi_value("SELECT n.dsn FROM sharding.nodes n WHERE n.node = $1", {c(m.source)});
    // The plan first, then what the ends have: DDL of the map's tables
    // (src/ddl) that committed before the plan lock is seen by
    // compare_schemas; DDL after it sees the move in flight and waits for
    // it or is refused (55006). Read the other way round, an ALTER TABLE
    // between the two failed the move at its cutover.
    fix_plan(m);
    refuse_after_plan(m, [&] {
        compare_schemas(m);
        plan_tables(m);
    });
    prepare_sessions(m);

    m.verify = move_verify;
    Caught err;
    const bool ok = subxact(
        [&] {
            open_stream(m);
            copy_rows(m);
            subscribe(m);
            catch_up(m);
            cut_over(m);
            // cleanup: after the switch, the copies compared first.
            m.out.moved = finish(m.map, m.logical, m.key, m.node, m.out.new_epoch, [&] { verify_copies(m); }, defer);
            if (m.out.moved < 0) {
                m.out.deferred = true;
                m.out.moved = 0;
            } else
                m.out.ended = true;
        },
        &err);
    if (!ok) fail_move(m, err);
    disconnect();
    return m.out;
}

}  // namespace sharding::move
