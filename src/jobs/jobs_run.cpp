// What rebalance jobs decide, in C++ (docs/rebalance.md; no PL/pgSQL on a
// move's path): the public rebalance_start, drain_node, rebalance_wait,
// rebalance_cancel and the procedure rebalance_run, and what the background
// workers of jobs.cpp call: _job_claim (the next move a runner executes),
// _job_execute, _job_adopt, _job_pickup; _job_lag (move_progress's live
// lag) and _job_key_shard. Each keeps its SQL name, signature, SQLSTATEs
// and messages as a thin LANGUAGE C wrapper; the rest (the checks, a
// job's end, the capacity of a node pair, the one-value question to a
// node) is C++ here.
//
// A job is a row of sharding.move_jobs; each of its moves is a row of the
// move journal (move_journal.cpp), enqueued when the job starts. Who
// executes which move: a runner claims a move by taking the move engine's
// own session advisory lock of the move (hashtext('sharding.move_journal'),
// move % (2^31 - 1)), the one its executor, recovery and a cancel take, and
// holds it until the move's execution returns (the engine takes it again:
// advisory locks are re-entrant within a session). So "in flight" is
// exactly "locked by a live backend", also after a crash (the lock dies
// with its process), and a move that recovery is rolling back meanwhile is
// in flight too: never claimed, never executed twice. _job_claim runs under
// the job row's lock, so two runners never exceed max_parallel nor take two
// moves of one shard.
//
// The capacity checks ask the nodes over the session's named libpq
// connections of remote_exec.cpp (one per node, named after its DSN's
// hash, kept open), with the helper's password rule for non-superusers; a
// node that cannot answer is not waited for (the move then fails and says
// why).
#include "datanode/move_copy.hpp"
#include "jobs/jobs.hpp"
#include "move/move_engine.hpp"
#include "move/journal.hpp"
#include "routing/owner_switch.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>
#include <string>
#include <vector>

extern "C" {
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
}

namespace sharding::move {
namespace {

constexpr int32 kStartClass = 1936222818;  // (kStartClass, hashtext(map)): job starts of a map

void claim_lock_release(int64 move) { session_unlock(executor_lock_class(), executor_lock_obj(move)); }

// The lock's key in pg_locks, for journal row `alias`.
std::string lock_key(const char *alias) {
    return std::string("l.locktype = 'advisory' AND l.granted "
                       "AND l.classid = (pg_catalog.hashtext('sharding.move_journal'))::oid AND l.objsubid = 2 "
                       "AND l.objid = ((") + alias + ".move % 2147483647)::integer)::oid";
}

// Whether journal row `alias` is claimed by a live backend now.
std::string claimed(const char *alias) {
    return "EXISTS (SELECT FROM pg_catalog.pg_locks l WHERE " + lock_key(alias) +
           " AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d "
                       "WHERE d.datname = pg_catalog.current_database()))";
}

// The moves of job $1 in flight (claimed by a live executor), as a query.
std::string in_flight() {
    return "SELECT f.move, f.logical, f.source, f.destination, f.phase FROM sharding.move_journal f "
           "WHERE f.job = $1::bigint AND f.phase NOT IN " PHASE_SQL_FINAL " AND " + claimed("f");
}

const char *const kLiveOfJob =
    "SELECT m.move::text FROM sharding.move_journal m WHERE m.job = $1::bigint "
    "AND m.phase NOT IN " PHASE_SQL_FINAL;

int64 to_int64(const Text &t) { return std::strtoll(must(t).c_str(), nullptr, 10); }

// ------------------------------------------------------------------ checks

void check_parallel(const Text &max_parallel) {
    if (!max_parallel || std::atoi(max_parallel->c_str()) < 1)
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "max_parallel must be at least 1, got %s",
             max_parallel.value_or("NULL").c_str());
}

// Serialises job starts of one map and refuses a second live job (55006).
void lock_map(const Text &map) {
    const std::string k1 = std::to_string(kStartClass);
    spi_value("SELECT pg_catalog.pg_advisory_xact_lock($2::integer, pg_catalog.hashtext($1))", {c(map), k1.c_str()});
    Text other = spi_value("SELECT j.job::text FROM sharding.move_jobs j WHERE j.map = $1 AND j.state IN ('queued', 'running')",
                           {c(map)});
    if (other)
        fail(ERRCODE_OBJECT_IN_USE,
             Explain{"", "Wait for it with rebalance_wait(" + *other + ") or stop it with rebalance_cancel(" + *other +
                             ")."},
             "map \"%s\" already has a rebalance job in progress (job %s)", shown(map).c_str(), other->c_str());
}

// Whether a map has distributed tables (then its moves carry rows).
bool has_tables(const Text &map) {
    return spi_value("SELECT EXISTS (SELECT FROM sharding.distributed_tables d WHERE d.map = $1)", {c(map)}) == Text("t");
}

// 42704 unless the job exists; 22023 for NULL.
void require_job(const Text &job) {
    if (!job) fail(ERRCODE_INVALID_PARAMETER_VALUE, "job must not be NULL");
    if (!spi_value("SELECT 1 FROM sharding.move_jobs t WHERE t.job = $1::bigint", {c(job)}))
        fail(ERRCODE_UNDEFINED_OBJECT, "rebalance job %s does not exist", job->c_str());
}

// ------------------------------------------------------------------ a job's end

// Cancels the moves a failed start enqueued (the journal committed them).
void unqueue(const Text &job) {
    for (Row &r : spi_rows("SELECT m.move::text FROM sharding.move_journal m WHERE m.job = $1::bigint "
                           "AND m.phase = " PHASE_SQL(QUEUED) " ORDER BY m.move",
                           {c(job)}))
        cancel(to_int64(r[0]));
}

// Ends a job whose moves are all over: done, failed (the first failed
// move's error; moves rolled back by recovery and retried do not count) or
// cancelled. A job any of whose moves was cancelled is never done (its
// plan was not carried out: a drained node would still own shards), even
// when its cancel_requested was lost (_move_cancel of one of its moves).
std::string finish_job(const Text &job) {
    std::vector<Row> failed = spi_rows(
        "SELECT m.error FROM sharding.move_journal m WHERE m.job = $1::bigint AND m.phase = " PHASE_SQL(FAILED) " "
        "AND m.move <> ALL ((SELECT t.retried FROM sharding.move_jobs t WHERE t.job = $1::bigint)::bigint[]) "
        "ORDER BY m.finished NULLS LAST, m.move LIMIT 1",
        {c(job)});
    std::vector<Row> jr = spi_rows("SELECT j.cancel_requested::text, j.error FROM sharding.move_jobs j "
                                   "WHERE j.job = $1::bigint",
                                   {c(job)});
    const bool cancelled = !jr.empty() && jr[0][0] == Text("true");
    // An error recorded while the job ran: a runner gave up on it (jobs.cpp).
    const Text gave_up = jr.empty() ? Text() : jr[0][1];
    Text cancelled_move;
    if (!cancelled && failed.empty() && !gave_up)
        cancelled_move = spi_value("SELECT m.move::text FROM sharding.move_journal m WHERE m.job = $1::bigint "
                                   "AND m.phase = " PHASE_SQL(CANCELLED) " ORDER BY m.move LIMIT 1",
                                   {c(job)});
    const std::string state = cancelled                    ? "cancelled"
                              : !failed.empty() || gave_up ? "failed"
                              : cancelled_move             ? "cancelled"
                                                           : "done";
    Text error;
    if (!failed.empty())
        error = failed[0][0].value_or("a move failed");
    else if (gave_up)
        error = gave_up;
    else if (cancelled_move)
        error = "move " + *cancelled_move + " was cancelled: the job's plan was not carried out";
    spi_value("UPDATE sharding.move_jobs j SET state = $2, finished = pg_catalog.now(), waiting = NULL, waits = '{}', "
              "error = $3, "
              "started = coalesce(j.started, pg_catalog.now()) WHERE j.job = $1::bigint",
              {c(job), state.c_str(), c(error)});
    return state;
}

// ------------------------------------------------------------------ capacity

// One value read at a node over a connection this session keeps open (named
// by the DSN's hash), so a runner checking capacity before every move does
// not connect each time; nullopt when the node cannot answer.
Text ask(const Text &dsn, const std::string &sql) {
    if (!dsn) return std::nullopt;
    const std::string conn = "sharding_job_" + md5_hex(*dsn).substr(0, 12);
    Text answer;
    Caught err;
    if (subxact(
            [&] {
                if (!named_open(conn.c_str())) named_connect(conn.c_str(), dsn->c_str());
                answer = dbl(conn.c_str(), sql);
            },
            &err))
        return answer;
    if (not_others(err.code)) reraise(err);
    named_disconnect(conn.c_str());
    return std::nullopt;
}

// Glue: whether the current role may run moves (a superuser, or a role
// with the privileges of sharding_admin).
bool may_run_moves_glue() {
    if (superuser()) return true;
    Oid admin = get_role_oid("sharding_admin", true);
    return OidIsValid(admin) && has_privs_of_role(GetUserId(), admin);
}

// The statements a claim runs (a runner claims every half second while
// its job waits) are prepared once per backend and kept.
Text node_dsn_of(const Text &node) {
    static KeptPlan plan;
    return spi_kept_value(&plan, "SELECT n.dsn FROM sharding.nodes n WHERE n.node = $1", {c(node)});
}

// Moves of running jobs claimed but not begun, at a node as its source
// (else as its destination).
int claimed_not_begun(bool as_source, const Text &node) {
    auto sql = [](const char *role) {
        return "SELECT pg_catalog.count(*)::text FROM sharding.move_jobs j JOIN sharding.move_journal m "
               "ON m.job = j.job WHERE j.state = 'running' AND m.phase = " PHASE_SQL(QUEUED) " AND m." +
               std::string(role) + " = $1 AND " + claimed("m");
    };
    static const std::string at_source = sql("source"), at_destination = sql("destination");
    static KeptPlan source_plan, destination_plan;
    Text n = as_source ? spi_kept_value(&source_plan, at_source.c_str(), {c(node)})
                       : spi_kept_value(&destination_plan, at_destination.c_str(), {c(node)});
    return std::atoi(must(n).c_str());
}

// Why `source`/`destination` cannot take one more move now (nullopt: they
// can): each move needs a replication slot and a WAL sender at the source
// and an apply worker at the destination; moves claimed but not begun count
// as using one. A node that cannot answer is not waited for: the move
// itself then fails and says why.
// The first n integers of an answer of integers separated by single spaces
// (atoi's reading of each); 0 for each one missing.
std::vector<int> integers(const std::string &answer, size_t n) {
    std::vector<int> out(n, 0);
    size_t at = 0;
    for (size_t i = 0; i < n && at != std::string::npos; i++) {
        out[i] = std::atoi(answer.c_str() + at);
        at = answer.find(' ', at);
        if (at != std::string::npos) at++;
    }
    return out;
}

Text capacity(const Text &source, const Text &destination) {
    // Origin states (review RB-9): max_replication_slots of them
    // (max_active_replication_origins from PostgreSQL 18); a move's delete
    // at the source takes one per part (up to sharding.move_parallel), its
    // subscription one at the destination.
    static const char *const free_origins =
        "(coalesce(pg_catalog.current_setting('max_active_replication_origins', true), "
        "pg_catalog.current_setting('max_replication_slots'))::integer - (SELECT pg_catalog.count(*) FROM "
        "pg_catalog.pg_replication_origin_status)::integer)";
    Text answer = ask(node_dsn_of(source),
                      std::string("SELECT (pg_catalog.current_setting('max_replication_slots')::integer"
                                  " - (SELECT pg_catalog.count(*) FROM pg_catalog.pg_replication_slots)::integer)"
                                  " || ' ' || (pg_catalog.current_setting('max_wal_senders')::integer"
                                  " - (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication)::integer)"
                                  " || ' ' || ") + free_origins);
    if (answer) {
        const std::vector<int> free = integers(*answer, 3);
        const int free_slots = free[0], free_senders = free[1], free_origin_states = free[2];
        const int pending = claimed_not_begun(true, source);
        const int per_move = std::max(1, move_parallel);
        if (free_origin_states - per_move * pending < per_move)
            return format("source %s has no free replication origin state (max_replication_slots, or "
                          "max_active_replication_origins from PostgreSQL 18; a move's delete needs %d; %d claimed "
                          "moves not yet begun)",
                          c(source), per_move, pending);
        if (free_slots - pending < 1)
            return format("source %s has no free replication slot (max_replication_slots; %d claimed moves not yet "
                          "begun)",
                          c(source), pending);
        // A move takes two WAL senders at its source while it sets up: the
        // replication connection that creates its slot (and exports the
        // copy's snapshot), and then its subscription's stream.
        if (free_senders - 2 * pending < 2)
            return format("source %s has no free WAL sender (max_wal_senders; a move needs 2; %d claimed moves not "
                          "yet begun)",
                          c(source), pending);
    }
    answer = ask(node_dsn_of(destination),
                 std::string("SELECT (pg_catalog.current_setting('max_logical_replication_workers')::integer"
                             " - (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_subscription s WHERE s.pid IS NOT "
                             "NULL)::integer) || ' ' || ") + free_origins);
    if (answer) {
        const std::vector<int> free = integers(*answer, 2);
        const int free_workers = free[0], free_origin_states = free[1];
        const int pending = claimed_not_begun(false, destination);
        if (free_workers - pending < 1)
            return format("destination %s has no free logical replication worker (max_logical_replication_workers; "
                          "%d claimed moves not yet begun)",
                          c(destination), pending);
        if (free_origin_states - pending < 1)
            return format("destination %s has no free replication origin state (max_replication_slots, or "
                          "max_active_replication_origins from PostgreSQL 18; %d claimed moves not yet begun)",
                          c(destination), pending);
    }
    return std::nullopt;
}

// ------------------------------------------------------------------ claims

// The queued moves a claim passed over, each with why it may not start now.
using Waits = std::vector<std::pair<std::string, std::string>>;

// s as a JSON string literal.
std::string json_string(const std::string &s) {
    std::string out = "\"";
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += (char)ch;
        } else if (ch < 0x20) {
            out += format("\\u%04x", ch);
        } else {
            out += (char)ch;
        }
    }
    return out + "\"";
}

// Records why the job's queued moves wait: per move in `waits` (a JSON
// object, move number -> reason: move_progress.waiting), and in `waiting`
// (rebalance_jobs) the first three reasons and how many more moves wait.
// Written only when it changed: a runner polls every few hundred ms.
void record_waits(const Text &job, const Waits &waits) {
    std::string object = "{";
    std::string summary;
    for (size_t i = 0; i < waits.size(); i++) {
        if (i > 0) object += ", ";
        object += json_string(waits[i].first) + ": " + json_string(waits[i].second);
        if (i < 3) summary += (i > 0 ? "; move " : "move ") + waits[i].first + " waits: " + waits[i].second;
    }
    object += "}";
    if (waits.size() > 3) summary += format("; %d more moves wait", (int)waits.size() - 3);
    const Text waiting = waits.empty() ? std::nullopt : Text(summary);
    static KeptPlan plan;
    spi_kept_value(&plan,
                   "UPDATE sharding.move_jobs t SET waiting = $2, waits = $3::jsonb WHERE t.job = $1::bigint "
                   "AND (t.waiting IS DISTINCT FROM $2 OR t.waits <> $3::jsonb)",
                   {c(job), c(waiting), object.c_str()});
}

// The next move this backend should execute (and now holds the claim of), 0
// when none may start now (max_parallel moves in flight, a node without
// capacity: `waiting` says why), nullopt when the job is over. A failed move
// or a cancel stops the job: moves not begun are cancelled; it ends once no
// move is in flight.
Text claim(const Text &job) {
    static KeptPlan job_plan, held_plan, flying_plan, failed_plan, not_begun_plan, live_of_job_plan, live_plan,
        candidates_plan;
    std::vector<Row> jr = spi_kept_rows(&job_plan,
                                        "SELECT t.state, t.map, t.max_parallel::text, t.cancel_requested::text, "
                                        "t.deferred::text, t.retried::text, t.error FROM sharding.move_jobs t "
                                        "WHERE t.job = $1::bigint FOR UPDATE",
                                        {c(job)});
    if (jr.empty()) return std::nullopt;
    const std::string state = must(jr[0][0]);
    const Text map = jr[0][1];
    const int max_parallel = std::atoi(must(jr[0][2]).c_str());
    const bool cancel_requested = jr[0][3] == Text("true");
    std::string deferred = must(jr[0][4]);
    std::string retried = must(jr[0][5]);
    // An error on a job not over yet: a runner gave up on it (jobs.cpp).
    const bool gave_up = jr[0][6].has_value();
    // Claims this backend still holds on the job's moves (an execution that
    // raised, e.g. cancelled) are over.
    static const std::string held = "SELECT m.move::text FROM sharding.move_journal m WHERE m.job = $1::bigint AND EXISTS ("
                             "SELECT FROM pg_catalog.pg_locks l WHERE l.pid = pg_catalog.pg_backend_pid() AND " +
                             lock_key("m") + ")";
    for (Row &r : spi_kept_rows(&held_plan, held.c_str(), {c(job)})) claim_lock_release(to_int64(r[0]));
    if (state != "queued" && state != "running") return std::nullopt;
    if (state == "queued")
        spi_value("UPDATE sharding.move_jobs t SET state = 'running', started = pg_catalog.now() WHERE t.job = $1::bigint",
                  {c(job)});
    const char *const live_shard = "SELECT 1 FROM sharding.move_journal m WHERE m.map = $1 AND m.logical = $2::integer "
                                   "AND m.phase NOT IN " PHASE_SQL_FINAL;
    // Deferred key moves whose shard has no live move any more: enqueue.
    if (deferred != "[]" && !cancel_requested) {
        for (Row &d : spi_rows("SELECT d.value::text, d.value ->> 'logical', d.value ->> 'key', d.value ->> 'destination' "
                               "FROM pg_catalog.jsonb_array_elements($1::jsonb) d",
                               {deferred.c_str()})) {
            if (spi_value(live_shard, {c(map), c(d[1])})) continue;
            enqueue(job, map, d[1], d[2], d[3]);
            deferred = must(spi_value(
                "UPDATE sharding.move_jobs t SET deferred = (SELECT coalesce(pg_catalog.jsonb_agg(e.value), '[]') "
                "FROM pg_catalog.jsonb_array_elements(t.deferred) e WHERE e.value <> $2::jsonb) "
                "WHERE t.job = $1::bigint RETURNING t.deferred::text",
                {c(job), c(d[0])}));
        }
    }
    // A move interrupted by the death of its executor (crash, restart) and
    // rolled back by recovery is carried out again: a new move of the same
    // shard (at most 3 tries per shard).
    if (!cancel_requested) {
        for (Row &r : spi_rows(
                 "SELECT m.move::text, m.logical::text, m.key, m.destination FROM sharding.move_journal m "
                 "WHERE m.job = $1::bigint AND m.phase = " PHASE_SQL(FAILED) " AND m.move <> ALL ($2::bigint[]) "
                 "AND m.error LIKE 'interrupted in phase %, rolled back' "
                 "AND (SELECT pg_catalog.count(*) FROM sharding.move_journal x WHERE x.job = $1::bigint "
                 "AND x.logical = m.logical AND x.key IS NOT DISTINCT FROM m.key) < 3 ORDER BY m.move",
                 {c(job), retried.c_str()})) {
            if (spi_value(live_shard, {c(map), c(r[1])})) continue;
            enqueue(job, map, r[1], r[2], r[3]);
            retried = must(spi_value("UPDATE sharding.move_jobs t SET retried = t.retried || $2::bigint "
                                     "WHERE t.job = $1::bigint RETURNING t.retried::text",
                                     {c(job), c(r[0])}));
        }
    }
    static const std::string count_in_flight = "SELECT pg_catalog.count(*)::text FROM (" + in_flight() + ") f";
    const int flying = std::atoi(must(spi_kept_value(&flying_plan, count_in_flight.c_str(), {c(job)})).c_str());
    const bool failed = gave_up || spi_kept_value(&failed_plan,
                                                  "SELECT 1 FROM sharding.move_journal m WHERE m.job = $1::bigint "
                                                  "AND m.phase = " PHASE_SQL(FAILED) " AND m.move <> ALL ($2::bigint[])",
                                                  {c(job), retried.c_str()})
                                       .has_value();
    if (cancel_requested || failed) {
        // Stopping: drop what has not begun, let what is in flight end.
        spi_value("UPDATE sharding.move_jobs t SET deferred = '[]' WHERE t.job = $1::bigint AND t.deferred <> '[]'",
                  {c(job)});
        deferred = "[]";
        static const std::string not_begun = "SELECT m.move::text FROM sharding.move_journal m WHERE m.job = $1::bigint "
                                      "AND m.phase = " PHASE_SQL(QUEUED) " AND m.move NOT IN (SELECT f.move FROM (" +
                                      in_flight() + ") f) ORDER BY m.move";
        for (Row &r : spi_kept_rows(&not_begun_plan, not_begun.c_str(), {c(job)})) cancel(to_int64(r[0]));
        if (flying == 0 && !spi_kept_value(&live_of_job_plan, kLiveOfJob, {c(job)})) {
            finish_job(job);
            return std::nullopt;
        }
        if (flying > 0) return Text("0");
        // An interrupted move (no executor): resumed or rolled back below.
    }
    const int live =
        std::atoi(must(spi_kept_value(&live_plan,
                                      "SELECT (pg_catalog.count(*) + pg_catalog.jsonb_array_length($2::jsonb))::text "
                                      "FROM sharding.move_journal m WHERE m.job = $1::bigint "
                                      "AND m.phase NOT IN " PHASE_SQL_FINAL,
                                      {c(job), deferred.c_str()}))
                      .c_str());
    if (live == 0) {
        finish_job(job);
        return std::nullopt;
    }
    if (flying >= max_parallel) {
        // Every queued move waits for the same reason: the job's.
        const std::string why = format("%d moves in flight (max_parallel %d)", flying, max_parallel);
        spi_value("UPDATE sharding.move_jobs t SET waiting = $2, waits = '{}' WHERE t.job = $1::bigint "
                  "AND (t.waiting IS DISTINCT FROM $2 OR t.waits <> '{}')",
                  {c(job), why.c_str()});
        return Text("0");
    }
    // Interrupted moves first (resumed or rolled back from the journal),
    // then queued ones, those with the fewest of the job's moves in flight
    // at either of their nodes first, in plan order among equals; never two
    // of one shard at once. (Moves that share no node share no session
    // at a node; on different instances they share neither a source's
    // slot creation, which waits for the writing transactions there, nor
    // the decoding of each other's copy: of 4 moves n1 -> n3, n1 -> n3,
    // n2 -> n4, n2 -> n4 two at a time, the first pair is n1 -> n3 with
    // n2 -> n4.)
    // (The moves in flight read once, pg_locks with them.)
    static const std::string candidates =
        "WITH flying AS MATERIALIZED (" + in_flight() + ") "
        "SELECT m.move::text, m.logical::text, m.source, m.destination, m.phase FROM sharding.move_journal m "
        "WHERE m.job = $1::bigint AND m.phase NOT IN " PHASE_SQL_FINAL " "
        "AND m.move NOT IN (SELECT y.move FROM flying y) "
        "AND m.logical NOT IN (SELECT y.logical FROM flying y) "
        "AND (NOT $2::boolean OR m.phase <> " PHASE_SQL(QUEUED) ") ORDER BY (m.phase = " PHASE_SQL(QUEUED) "), "
        "(SELECT pg_catalog.count(*) FROM flying y WHERE y.source IN (m.source, m.destination) "
        "OR y.destination IN (m.source, m.destination)), m.move";
    Waits waits;
    // A node pair's capacity, asked once per claim (the nodes answer over
    // the network; nothing this claim does changes it before it returns).
    std::map<std::pair<Text, Text>, Text> capacity_of;
    for (Row &m : spi_kept_rows(&candidates_plan, candidates.c_str(), {c(job), cancel_requested ? "true" : "false"})) {
        if (m[4] == Text(to_text(Phase::Queued))) {
            // Any number of moves into and out of one node at once (each
            // move's decoder sends only its shard, each applies and deletes
            // under names of its own: docs/rebalance.md), as far as the
            // nodes' capacity goes.
            auto pair = std::make_pair(m[2], m[3]);
            auto known = capacity_of.find(pair);
            if (known == capacity_of.end()) known = capacity_of.emplace(pair, capacity(m[2], m[3])).first;
            const Text &reason = known->second;
            if (reason) {
                waits.emplace_back(must(m[0]), *reason);
                continue;
            }
        }
        if (try_session_lock(executor_lock_class(), executor_lock_obj(to_int64(m[0])))) {
            record_waits(job, waits);
            return m[0];
        }
    }
    record_waits(job, waits);
    return Text("0");
}

// Executes a claimed move through the engine, then gives up the claim,
// also when the execution raises (a cancel): a session-level lock outlives
// the error, and a session that ran CALL rebalance_run would otherwise keep
// the move "in flight" until it disconnects.
void job_execute(int64 move) {
    try {
        execute(move);
    } catch (...) {
        claim_lock_release(move);
        throw;
    }
    claim_lock_release(move);
}

// ------------------------------------------------------------------ starts

// Enqueues planned moves as the job's (plan: logical, to_node; a failed
// start cancels what it enqueued).
int64 insert_job(const char *sql, const std::vector<Arg> &args) {
    return to_int64(spi_rows_typed(sql, args)[0][0]);
}

// rebalance_start and drain_node: the statements of their start run in a
// subtransaction; on any error (a cancel too) the moves the journal already
// committed are cancelled before the error goes on.
template <typename F>
void enqueue_all(const Text &job, F &&body) {
    Caught err;
    if (subxact(body, &err)) return;
    unqueue(job);
    reraise(err);
}

// The role a job runs as: the one that starts it (current_user; the
// column's default, which no other role can set: CONTRACT 15.2).
Text me() { return std::to_string(GetUserId()); }

// A started job whose moves are enqueued: runners are asked for (started
// when this transaction commits); or, with nothing to carry, it is done now
// (`switched` owner switches made, if given).
void launch(const Text &job, bool done, const Text &switched, const Text &max_parallel, const Text &runas) {
    if (done)
        spi_value("UPDATE sharding.move_jobs t SET state = 'done', switched = coalesce($2::integer, t.switched), "
                  "started = pg_catalog.now(), finished = pg_catalog.now() WHERE t.job = $1::bigint",
                  {c(job), c(switched)});
    else if (job && max_parallel && runas)
        (void)jobs_launch(to_int64(job), std::atoi(max_parallel->c_str()),
                          static_cast<Oid>(std::strtoul(runas->c_str(), nullptr, 10)));
}

// Glue: SPI for a procedure that commits (nonatomic when CALLed outside a
// transaction block, as PL/pgSQL's COMMIT needs).
void run_connect_glue(bool atomic) {
    if (SPI_connect_ext(atomic ? 0 : SPI_OPT_NONATOMIC) != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
}
void run_commit_glue() {
    MemoryContext cxt = CurrentMemoryContext;
    // The end of a transaction sets the cache module's count of running
    // calls to 0 (and frees the retired entries, none of which this
    // procedure holds between its steps): at top level nothing of the
    // extension runs any more then. This call does, in the next
    // transaction: its count is given back. (Without, it went to -1 when
    // rebalance_run returned, and a call nested in another returned to 0
    // and freed what the outer one still used.)
    const int depth = detail::call_depth;
    SPI_commit();
    detail::call_depth = depth;
    MemoryContextSwitchTo(cxt);
}
void run_finish_glue() { SPI_finish(); }

// Glue: search_path = pg_catalog, pg_temp until unpin (a procedure that
// commits cannot have a SET clause; fmgr's SET clause works the same way:
// a GUC nest level, restored by AtEOXact_GUC, or by the abort on error),
// and a snapshot, as a PL/pgSQL statement of the step would have had
// (after a commit there is none).
int pin_glue() {
    int nest = NewGUCNestLevel();
    (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                            false);
    PushActiveSnapshot(GetTransactionSnapshot());
    return nest;
}
void unpin_glue(int nest) {
    PopActiveSnapshot();
    AtEOXact_GUC(true, nest);
}

// Glue: the memory of one step of rebalance_run, a child of the
// procedure's SPI context ("SPI Proc", which lives until the procedure
// returns, across its commits).
MemoryContext step_context_glue() {
    return AllocSetContextCreate(CurrentMemoryContext, "rebalance_run step", ALLOCSET_DEFAULT_SIZES);
}

// Runs one step of rebalance_run with the search_path pinned, allocating in
// `step_cxt`, which is reset afterwards: a job of any number of moves runs
// in the memory of one. A step that throws leaves it as it is (the error
// being raised may have been copied there); the procedure ends then.
template <typename F>
void pinned(MemoryContext step_cxt, F &&step) {
    MemoryContext outer = MemoryContextSwitchTo(step_cxt);
    try {
        int nest = glue(pin_glue);
        step();
        glue(unpin_glue, nest);
    } catch (...) {
        MemoryContextSwitchTo(outer);
        throw;
    }
    MemoryContextSwitchTo(outer);
    glue(MemoryContextReset, step_cxt);
}

}  // namespace


}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

namespace {
Datum text_or_null(FunctionCallInfo fcinfo, const Text &t) {
    if (!t) PG_RETURN_NULL();
    PG_RETURN_DATUM(text_datum(*t));
}
Datum bigint_or_null(FunctionCallInfo fcinfo, const Text &t) {
    if (!t) PG_RETURN_NULL();
    PG_RETURN_INT64(std::strtoll(t->c_str(), nullptr, 10));
}
}  // namespace

// rebalance_start(map, nodes, strategy, loads, max_imbalance, max_parallel):
// the job id, at once. Plans as rebalance / rebalance_by_load (their dry
// runs) and enqueues every planned move; a map without distributed tables
// is rebalanced in place (owner switches) and its job is done at once.
SHARDING_FUNCTION(sharding_rebalance_start) {
    Text map = text_arg(fcinfo, 0);
    Text nodes = arg_out(fcinfo, 1, TEXTARRAYOID);
    Text strategy = text_arg(fcinfo, 2);
    // loads and max_imbalance go to the planner and the job row as they
    // are (their text form would round them under extra_float_digits).
    const bool has_loads = !PG_ARGISNULL(3);
    const Arg loads(FLOAT8ARRAYOID, PG_GETARG_DATUM(3), !has_loads);
    const Arg max_imbalance(FLOAT8OID, PG_GETARG_DATUM(4), PG_ARGISNULL(4));
    Text max_parallel = int_arg(fcinfo, 5);
    if (strategy != Text("count") && strategy != Text("load"))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "strategy must be 'count' or 'load', got %s",
             literal_or_null(strategy).c_str());
    check_parallel(max_parallel);
    if (*strategy == "load" && !has_loads)
        fail(ERRCODE_INVALID_PARAMETER_VALUE,
             "strategy 'load' needs loads, one per logical shard of map \"%s\", got NULL", shown(map).c_str());
    if (*strategy == "count" && has_loads)
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "loads are used by strategy 'load' only, got strategy 'count'");
    require_map(map, false);
    lock_map(map);
    const Text runas = me();
    const bool count = *strategy == "count";
    // The planners' own checks and messages, as their dry runs give them.
    const char *const planned =
        count ? "SELECT r.logical::text, r.to_node FROM sharding.rebalance($1, $2::text[], dry_run => true) r "
                "ORDER BY r.logical"
              : "SELECT r.logical::text, r.to_node FROM sharding.rebalance_by_load($1, $2::text[], $3, $4, "
                "dry_run => true) r ORDER BY r.logical";
    if (!has_tables(map)) {
        // No rows to carry: the moves are owner switches, done now.
        Text n = count ? spi_value("SELECT pg_catalog.count(*)::text FROM sharding.rebalance($1, $2::text[])",
                                   {c(map), c(nodes)})
                       : spi_rows_typed("SELECT pg_catalog.count(*)::text FROM sharding.rebalance_by_load($1, "
                                        "$2::text[], $3, $4)",
                                        {c(map), c(nodes), loads, max_imbalance})[0][0];
        int64 job = insert_job(
            "INSERT INTO sharding.move_jobs AS t (map, strategy, state, nodes, loads, max_imbalance, max_parallel, "
            "switched, started, finished) VALUES ($1, $2, 'done', $3::text[], $4, $5, "
            "$6::integer, $7::integer, pg_catalog.now(), pg_catalog.now()) RETURNING t.job::text",
            {c(map), c(strategy), c(nodes), loads, max_imbalance, c(max_parallel), c(n)});
        PG_RETURN_INT64(job);
    }
    const Text job = std::to_string(insert_job(
        "INSERT INTO sharding.move_jobs AS t (map, strategy, nodes, loads, max_imbalance, max_parallel) "
        "VALUES ($1, $2, $3::text[], $4, $5, $6::integer) RETURNING t.job::text",
        {c(map), c(strategy), c(nodes), loads, max_imbalance, c(max_parallel)}));
    // The journal commits each enqueued move at once (its own connection):
    // if a later step fails, the moves already enqueued are cancelled, so a
    // failed start leaves no live move behind.
    int n = 0;
    enqueue_all(job, [&] {
        for (Row &mv : spi_rows_typed(planned, {c(map), c(nodes), loads, max_imbalance})) {
            enqueue(job, map, mv[0], std::nullopt, mv[1]);
            n++;
        }
    });
    launch(job, n == 0, std::nullopt, max_parallel, runas);
    return bigint_or_null(fcinfo, job);
}

// drain_node(map, node, max_parallel): every shard of `node` onto the map's
// other shard owners (count-balanced, rebalance's plan over them), every key
// pinned to it onto the owner of the key's shard after that plan.
SHARDING_FUNCTION(sharding_drain_node) {
    Text map = text_arg(fcinfo, 0);
    Text node = text_arg(fcinfo, 1);
    Text max_parallel = int_arg(fcinfo, 2);
    require_node(node);
    check_parallel(max_parallel);
    require_map(map, false);
    lock_map(map);
    const Text runas = me();
    std::vector<Row> o = spi_rows(
        "SELECT (SELECT pg_catalog.count(*) FROM sharding.shards s WHERE s.map = $1 AND s.node = $2)::text, "
        "(SELECT pg_catalog.count(*) FROM sharding.pins p WHERE p.map = $1 AND p.node = $2)::text, "
        "(SELECT pg_catalog.array_agg(DISTINCT s.node ORDER BY s.node) FROM sharding.shards s "
        "WHERE s.map = $1 AND s.node <> $2)::text",
        {c(map), c(node)});
    const int owns = std::atoi(must(o[0][0]).c_str()), pinned = std::atoi(must(o[0][1]).c_str());
    const Text others = o[0][2];
    if (owns + pinned == 0) {
        int64 job = insert_job(
            "INSERT INTO sharding.move_jobs AS t (map, strategy, state, drained, max_parallel, started, finished) "
            "VALUES ($1, 'drain', 'done', $2, $3::integer, pg_catalog.now(), pg_catalog.now()) "
            "RETURNING t.job::text",
            {c(map), c(node), c(max_parallel)});
        PG_RETURN_INT64(job);
    }
    if (!others)
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, Explain{"", "Add a node with rebalance_start first."},
             "node \"%s\" is the only node of map \"%s\": there is no node to drain it onto", node->c_str(),
             shown(map).c_str());
    const bool tables = has_tables(map);
    const Text job = std::to_string(insert_job(
        "INSERT INTO sharding.move_jobs AS t (map, strategy, nodes, drained, max_parallel) "
        "VALUES ($1, 'drain', $2::text[], $3, $4::integer) RETURNING t.job::text",
        {c(map), c(others), c(node), c(max_parallel)}));
    int n = 0;
    enqueue_all(job, [&] {
        // Shards: rebalance's plan over the other owners.
        std::map<std::string, std::string> plan;
        for (Row &mv : spi_rows("SELECT r.logical::text, r.to_node FROM sharding.rebalance($1, $2::text[], "
                                "dry_run => true) r ORDER BY r.logical",
                                {c(map), c(others)})) {
            plan[must(mv[0])] = must(mv[1]);
            if (tables)
                enqueue(job, map, mv[0], std::nullopt, mv[1]);
            else
                spi_value("SELECT sharding.move_shard($1, $2::integer, $3)", {c(map), c(mv[0]), c(mv[1])});
            n++;
        }
        // Pins: to the owner of the key's shard once the plan is carried
        // out; a key whose shard moves too waits for that move (deferred).
        for (Row &p : spi_rows("SELECT pp.key FROM sharding.pins pp WHERE pp.map = $1 AND pp.node = $2 ORDER BY pp.key",
                               {c(map), c(node)})) {
            const Text key = p[0];
            const Text l = key_shard(map, key);
            auto planned = l ? plan.find(*l) : plan.end();
            const Text dest = planned != plan.end()
                                  ? Text(planned->second)
                                  : spi_value("SELECT s.node FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer",
                                              {c(map), c(l)});
            if (!tables)
                spi_value("SELECT sharding.pin($1, $2, $3)", {c(map), c(key), c(dest)});
            else if (planned != plan.end())
                spi_value("UPDATE sharding.move_jobs t SET deferred = t.deferred || pg_catalog.jsonb_build_array("
                          "pg_catalog.jsonb_build_object('logical', $2::integer, 'key', $3, 'destination', $4)) "
                          "WHERE t.job = $1::bigint",
                          {c(job), c(l), c(key), c(dest)});
            else
                enqueue(job, map, l, key, dest);
            n++;
        }
    });
    launch(job, !tables, tables ? Text() : Text(std::to_string(n)), max_parallel, runas);
    return bigint_or_null(fcinfo, job);
}

// _job_key_shard(map, key): the logical shard of a pinned key, by the type
// of the map's key columns.
SHARDING_FUNCTION(sharding__job_key_shard) {
    Text map = text_arg(fcinfo, 0);
    Text key = text_arg(fcinfo, 1);
    Text l = key_shard(map, key);
    if (!l) PG_RETURN_NULL();
    PG_RETURN_INT32(std::atoi(l->c_str()));
}

// _job_claim(job): the claimed move, 0 if none may start now, NULL once the
// job is over.
SHARDING_FUNCTION(sharding__job_claim) {
    Text job = bigint_arg(fcinfo, 0);
    Text move = claim(job);
    return bigint_or_null(fcinfo, move);
}

// _job_execute(job, move): carries out a claimed move and gives up the claim.
SHARDING_FUNCTION(sharding__job_execute) {
    if (PG_ARGISNULL(1)) fail(ERRCODE_UNDEFINED_OBJECT, "move <NULL> does not exist");
    int64 move = PG_GETARG_INT64(1);
    job_execute(move);
    PG_RETURN_INT64(move);
}

// _job_adopt(): the oldest live job of this role that lacks runners.
SHARDING_FUNCTION(sharding__job_adopt) {
    (void)fcinfo;
    Text job;
    for (const Row &j : spi_rows("SELECT j.job::text, j.max_parallel::text FROM sharding.move_jobs j "
                                 "WHERE j.state IN ('queued', 'running') AND j.runas = $1::oid ORDER BY j.job",
                                 {c(me())}))
        if (j[1] && jobs_runners(to_int64(j[0])) < std::atoi(j[1]->c_str())) {
            job = j[0];
            break;
        }
    return bigint_or_null(fcinfo, job);
}

// _job_pickup(): the launcher's scan of this database: recovers the moves
// whose executor died, then asks for runners for every live job.
SHARDING_FUNCTION(sharding__job_pickup) {
    (void)fcinfo;
    if (spi_value("SELECT 1 FROM sharding.move_journal m WHERE m.phase NOT IN " PHASE_SQL_NOT_IN_FLIGHT " "
                  "LIMIT 1",
                  {}))
        recover();
    int32 n = 0;
    for (Row &j : spi_rows("SELECT t.job::text, t.max_parallel::text, t.runas::text FROM sharding.move_jobs t "
                           "WHERE t.state IN ('queued', 'running') ORDER BY t.job",
                           {})) {
        // Its workers keep failing to start (each ended with a FATAL before
        // running anything): the job fails as when a runner gives up on it.
        const int failed = jobs_failed_starts(to_int64(j[0]));
        if (failed >= jobs_max_failed_starts) {
            unqueue(j[0]);
            const std::string why = format("%d move workers of the job in a row failed to start (see the server log)",
                                           failed);
            spi_value("UPDATE sharding.move_jobs t SET error = COALESCE(t.error, $2) WHERE t.job = $1::bigint",
                      {c(j[0]), why.c_str()});
            if (!spi_value(kLiveOfJob, {c(j[0])})) finish_job(j[0]);
            continue;
        }
        if (j[1] && j[2])
            (void)jobs_launch(to_int64(j[0]), std::atoi(j[1]->c_str()) - jobs_runners(to_int64(j[0])),
                              static_cast<Oid>(std::strtoul(j[2]->c_str(), nullptr, 10)));
        n++;
    }
    PG_RETURN_INT32(n);
}

// rebalance_wait(job, timeout): the job's state once it has ended, or when
// timeout runs out. Polls (each check a new snapshot).
SHARDING_FUNCTION(sharding_rebalance_wait) {
    Text job = bigint_arg(fcinfo, 0);
    Text timeout = arg_out(fcinfo, 1, INTERVALOID);
    require_job(job);
    if (timeout && spi_value("SELECT $1::interval < interval '0'", {c(timeout)}) == Text("t"))
        fail(ERRCODE_INVALID_PARAMETER_VALUE, "timeout must not be negative, got %s", timeout->c_str());
    Text deadline = spi_value("SELECT (pg_catalog.clock_timestamp() + $1::interval)::text", {c(timeout)});
    for (;;) {
        std::vector<Row> r = spi_rows("SELECT t.state, (pg_catalog.clock_timestamp() >= $2::timestamptz)::text "
                                      "FROM sharding.move_jobs t WHERE t.job = $1::bigint",
                                      {c(job), c(deadline)});
        Text state = r.empty() ? std::nullopt : r[0][0];
        if (state == Text("done") || state == Text("failed") || state == Text("cancelled") ||
            (!r.empty() && r[0][1] == Text("true")))
            return text_or_null(fcinfo, state);
        sleep_ms(50);
    }
}

// rebalance_cancel(job): moves not begun are dropped, the ones in flight are
// told to roll back (_move_cancel); done ones stay done. The job ends
// 'cancelled' as soon as no move is in flight. False if it had ended.
SHARDING_FUNCTION(sharding_rebalance_cancel) {
    Text job = bigint_arg(fcinfo, 0);
    require_job(job);
    Text state = spi_value("SELECT t.state FROM sharding.move_jobs t WHERE t.job = $1::bigint FOR UPDATE", {c(job)});
    if (state != Text("queued") && state != Text("running")) PG_RETURN_BOOL(false);
    spi_value("UPDATE sharding.move_jobs t SET cancel_requested = true, deferred = '[]' WHERE t.job = $1::bigint",
              {c(job)});
    // Each move on its own: the queued ones are cancelled in the journal at
    // once (committed over the engine's connection), so an error of a later
    // one must not roll back cancel_requested, or the job would go on with
    // moves cancelled. A move that cannot be rolled back now (an
    // interrupted one whose node is down) stays for recovery, which the
    // launcher retries and the job's next claim carries out; the cancel
    // stands. Only a cancel of this call itself (or a failed assertion)
    // stops it, and a permission error of the executor's signal (cancelling
    // another role's moves): moves with an executor come first, before any
    // queued one is cancelled.
    const std::string live = std::string(kLiveOfJob) + " ORDER BY (m.pid IS NULL), m.move";
    bool left = false;
    for (Row &r : spi_rows(live.c_str(), {c(job)})) {
        const int64 move = to_int64(r[0]);
        Caught err;
        if (subxact([&] { cancel(move); }, &err)) continue;
        if (not_others(err.code) || err.code == ERRCODE_INSUFFICIENT_PRIVILEGE) reraise(err);
        warn(format("could not cancel move %lld now: %s", (long long)move, err.message.c_str()),
             "It stays interrupted until its nodes answer; recovery then rolls it back and the job ends cancelled.");
        left = true;
    }
    if (left) jobs_recheck(MyDatabaseId);
    const std::string any_in_flight = "SELECT 1 FROM (" + in_flight() + ") f LIMIT 1";
    if (!spi_value(any_in_flight.c_str(), {c(job)}) && !spi_value(kLiveOfJob, {c(job)})) finish_job(job);
    PG_RETURN_BOOL(true);
}

// CALL rebalance_run(job): carries a job out in this session, one move at a
// time, committing between steps (so it must be CALLed outside a
// transaction block: 2D000 otherwise, as PL/pgSQL's COMMIT gives).
SHARDING_FUNCTION(sharding_rebalance_run) {
    Text job = bigint_arg(fcinfo, 0);
    const bool atomic = !(fcinfo->context != nullptr && IsA(fcinfo->context, CallContext) &&
                          !castNode(CallContext, fcinfo->context)->atomic);
    glue(run_connect_glue, atomic);
    MemoryContext step_cxt = glue(step_context_glue);
    pinned(step_cxt, [&] { require_job(job); });
    glue(run_commit_glue);
    for (;;) {
        Text move;
        pinned(step_cxt, [&] { move = claim(job); });
        glue(run_commit_glue);
        if (!move) break;
        if (*move == "0")
            sleep_ms(500);
        else
            pinned(step_cxt, [&] {
                Caught err;
                if (!subxact([&] { job_execute(to_int64(move)); }, &err)) {
                    // 55006: another session carries the move out (the
                    // claim holds the engine's lock, so this does not
                    // happen, but were it to, the move is theirs): the next
                    // claim skips it while it is in flight.
                    if (err.code == ERRCODE_OBJECT_IN_USE) return;
                    // rebalance_cancel stopped the move in flight (the engine
                    // rolled it back): the next claim ends the job. Any other
                    // cancel, or an error, stops this procedure. The cancel
                    // signals before its transaction commits cancel_requested,
                    // and holds the job row locked until then: FOR SHARE
                    // waits for that commit (or rollback) and reads the
                    // outcome.
                    if (err.code != ERRCODE_QUERY_CANCELED ||
                        spi_value("SELECT t.cancel_requested FROM sharding.move_jobs t WHERE t.job = $1::bigint "
                                  "FOR SHARE",
                                  {c(job)}) != Text("t"))
                        reraise(err);
                }
            });
        glue(run_commit_glue);
    }
    glue(run_finish_glue);
    PG_RETURN_VOID();
}

// _job_lag(source, slot): the WAL a move's destination still has to
// confirm, read live at the source; NULL when it cannot be read, and for a
// role that may not run moves (neither a superuser nor sharding_admin's):
// move_progress, readable by every role, calls it for each move that
// catches up (so it stays executable by PUBLIC: a view's function calls are
// checked for the reader), and then shows the journal's figure without
// making this backend connect to the source on a reader's behalf.
SHARDING_FUNCTION(sharding__job_lag) {
    if (!glue(may_run_moves_glue)) PG_RETURN_NULL();
    Text source = text_arg(fcinfo, 0);
    Text slot = text_arg(fcinfo, 1);
    Text lag = ask(node_dsn_of(source),
                   "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint "
                   "FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = " + lit(slot));
    if (!lag) PG_RETURN_NULL();
    int64 v = std::strtoll(lag->c_str(), nullptr, 10);
    PG_RETURN_INT64(v > 0 ? v : 0);
}
