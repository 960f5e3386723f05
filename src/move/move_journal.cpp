// The move journal's interface and the public calls of online moves, in
// C++ (docs/moves.md; no PL/pgSQL on the move's path):
//
//   move_shard_online(map, logical, node), isolate(map, key, node): a
//     journaled move carried out in this session, whatever an
//     interrupted move of the shard left cleaned up first;
//   _move_enqueue(job, map, logical, key, destination): a 'queued' journal
//     row, committed at once;
//   _move_execute(move): carries it out (or resumes / rolls back an
//     interrupted one) and returns its final phase;
//   _move_resolve(move, final): rolls back or finishes an interrupted move
//     from its journal row;
//   _move_cancel(move), _move_recover();
//   _refuse_owner_switch(map, fn): 55000 for move_shard, rebalance and
//     rebalance_by_load on a map with distributed tables.
//
// Each keeps its SQL name, signature, SQLSTATEs and messages as a thin
// LANGUAGE C wrapper. The journal is written over sharding_move_self
// (move_support.cpp), committed at once whatever this transaction does.
// A step that may fail runs in a subtransaction
// (subxact): a failed step is rolled back there before anything else runs.
//
// Who executes a move: the backend holding the session-level advisory lock
// (hashtext('sharding.move_journal'), move): it dies with its process, so a
// move whose lock is free and whose phase is not final was interrupted.
#include "move/move_engine.hpp"
#include "move/journal.hpp"
#include "pg/keys.hpp"
#include "pg/launcher.hpp"
#include "routing/owner_switch.hpp"
#include "move/move_online.hpp"

#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
#include "catalog/pg_authid.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/syscache.h"
}

namespace sharding::move {
namespace {

bool is_final(const std::string &phase) {
    const std::optional<Phase> p = from_text(phase);
    return p && is_final(*p);
}

// A journal row, as the functions below read it.
struct JournalRow {
    bool found = false;
    std::string map, phase;
    int32 logical = 0;
    Text key, source, destination, new_epoch, pid, error, error_state, error_detail, error_hint, job;
    Oid runas = InvalidOid;  // the role the move runs as (docs/moves.md, "Rights")
    bool cleanup_deferred = false;  // its executor left the source's delete to the cleaner
};

// Whether the journal records the role of each move (1.4's SQL). A
// database still at 1.3's SQL (the library updated, ALTER EXTENSION not yet
// run) has no such column: its moves act as 1.3's did, with the rights of
// whoever acts on them, until it is updated.
bool journal_has_runas() { return journal_has("runas"); }

JournalRow read_row(int64 id) {
    const std::string ids = std::to_string(id);
    const std::string sql = std::string("SELECT m.map, m.logical::text, m.key, m.source, m.destination, m.phase, "
                                        "m.new_epoch::text, m.pid::text, m.error, m.error_state, m.error_detail, "
                                        "m.error_hint, ") +
                            (journal_has_runas() ? "m.runas::text" : "NULL::text") +
                            ", m.job::text, " +
                            (journal_has("cleanup_deferred") ? "m.cleanup_deferred::text" : "'false'") +
                            " FROM sharding.move_journal m WHERE m.move = $1::bigint";
    std::vector<Row> r = spi_rows(sql.c_str(), {ids.c_str()});
    JournalRow j;
    if (r.empty()) return j;
    j.found = true;
    j.map = must(r[0][0]);
    j.logical = std::atoi(must(r[0][1]).c_str());
    j.key = r[0][2];
    j.source = r[0][3];
    j.destination = r[0][4];
    j.phase = must(r[0][5]);
    j.new_epoch = r[0][6];
    j.pid = r[0][7];
    j.error = r[0][8];
    j.error_state = r[0][9];
    j.error_detail = r[0][10];
    j.error_hint = r[0][11];
    if (r[0][12]) j.runas = static_cast<Oid>(std::strtoul(r[0][12]->c_str(), nullptr, 10));
    j.job = r[0][13];
    j.cleanup_deferred = r[0][14] == Text("true");  // boolean::text
    return j;
}

JournalRow require_row(const Text &id) {
    JournalRow j;
    if (id) j = read_row(std::strtoll(id->c_str(), nullptr, 10));
    if (!j.found) fail(ERRCODE_UNDEFINED_OBJECT, "move %s does not exist", shown(id).c_str());
    return j;
}

// The executor's lock: (hashtext('sharding.move_journal'), move % 2^31-1).
int32 hash_glue(const char *s) {
    return DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID, CStringGetTextDatum(s)));
}
int32 lock_class() {
    static int32 k = 0;
    static bool known = false;
    if (!known) {
        k = glue(hash_glue, "sharding.move_journal");
        known = true;
    }
    return k;
}
int32 lock_obj(int64 id) { return executor_lock_obj(id); }

// A SQLSTATE's five characters, and back.
std::string sqlstate_text(int code) { return unpack_sql_state(code); }
int sqlstate_code(const Text &s) {
    if (!s || s->size() != 5) return ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    for (char ch : *s)
        if (!((ch >= '0' && ch <= '9') || (ch >= 'A' && ch <= 'Z'))) return ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    return MAKE_SQLSTATE((*s)[0], (*s)[1], (*s)[2], (*s)[3], (*s)[4]);
}

Text nonempty(const std::string &s) { return s.empty() ? Text() : Text(s); }

// raise_recorded: the recorded error of a move that did not end 'done'.
[[noreturn]] void raise_recorded(int64 id) {
    JournalRow j = read_row(id);
    const int code = j.error_state ? sqlstate_code(j.error_state) : ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
    if (j.phase == to_text(Phase::Cleanup))
        // The move itself happened; only its tidying failed.
        throw Error(code,
                    format("logical shard %d of map \"%s\" moved to \"%s\" (epoch %s), but finishing failed: %s",
                           j.logical, j.map.c_str(), shown(j.destination).c_str(), shown(j.new_epoch).c_str(),
                           shown(j.error).c_str()),
                    std::string(), "Call sharding.move_shard_online again to finish.");
    if (j.found && j.phase != to_text(Phase::Failed) && j.phase != to_text(Phase::Cancelled))
        warn(format("could not clean up after the failed move of logical shard %d of map \"%s\"", j.logical,
                    j.map.c_str()),
             "The next sharding.move_shard_online or sharding.isolate of this shard cleans up first.");
    throw Error(code, j.error.value_or("move failed"), j.error_detail.value_or(""), j.error_hint.value_or(""));
}

// The move this session carries out now (0: none). A session that ends
// meanwhile without unwinding (FATAL: pg_terminate_backend, a lost client)
// leaves it interrupted: the jobs launcher is told to recover it.
int64 executing_move = 0;
bool exit_hook_installed = false;

void executor_exit(int, Datum) {
    if (executing_move != 0) jobs_recheck(MyDatabaseId);
}

void install_executor_exit() { before_shmem_exit(executor_exit, 0); }

struct Executing {
    explicit Executing(int64 id) {
        if (!exit_hook_installed) {
            glue(install_executor_exit);
            exit_hook_installed = true;
        }
        executing_move = id;
    }
    ~Executing() { executing_move = 0; }
    Executing(const Executing &) = delete;
    Executing &operator=(const Executing &) = delete;
};

// ------------------------------------------------------------------ rights
// A journal row records the role that started the move (runas: the caller
// of move_shard_online / isolate / _move_enqueue, or the job's role), and
// whatever is done to the move afterwards (carried out, rolled back or
// finished, by its executor, _move_resolve, _move_cancel, _move_recover or
// the launcher's scanner) runs with that role's rights, as a subscription
// runs as its owner: the password rule of the remote connections
// (move_remote.cpp, as postgres_fdw's password_required) applies to it
// exactly as to the role itself, whoever calls. The caller needs the
// privileges of that role (the extension's owner, whose scanner looks after
// every move, has them by office); the role must still exist and still be
// an administrator (sharding_admin, a superuser, or the extension's owner):
// 42501 otherwise, and the move stays as it is.

Oid user_glue() { return GetUserId(); }
bool role_exists_glue(Oid role) { return SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)); }
bool privs_glue(Oid member, Oid role) { return has_privs_of_role(member, role); }
bool superuser_glue(Oid role) { return superuser_arg(role); }
Oid admin_role_glue() { return get_role_oid("sharding_admin", true); }
char *role_name_glue(Oid role) { return GetUserNameFromId(role, true); }

Oid extension_owner() {
    Text o = spi_value("SELECT e.extowner::text FROM pg_catalog.pg_extension e WHERE e.extname = 'sharding'", {});
    return o ? static_cast<Oid>(std::strtoul(o->c_str(), nullptr, 10)) : InvalidOid;
}

std::string role_shown(Oid role) {
    char *n = glue(role_name_glue, role);
    if (n == nullptr) return format("with OID %u", role);
    std::string r = "\"" + std::string(n) + "\"";
    pfree(n);
    return r;
}

// 42501 unless the current role may act on move `id` as `runas`, and
// `runas` may still act (see above).
void require_act_as(int64 id, Oid runas) {
    const Oid me = glue(user_glue);
    // InvalidOid: a journal without roles (1.3's SQL), nothing to check.
    if (runas == me || runas == InvalidOid) return;
    const Oid owner = extension_owner();
    const std::string hint =
        format("The extension's owner (or a role with the privileges of both) gives the move a role that can act: "
               "UPDATE sharding.move_journal SET runas = '<role>'::regrole WHERE move = %lld;",
               (long long)id);
    if (me != owner && !glue(privs_glue, me, runas))
        fail(ERRCODE_INSUFFICIENT_PRIVILEGE,
             Explain{"", "Only a role with the privileges of the move's role (or the extension's owner) carries it "
                         "out, rolls it back or finishes it."},
             "permission denied for move %lld, which runs as role %s", (long long)id, role_shown(runas).c_str());
    if (!glue(role_exists_glue, runas))
        fail(ERRCODE_INSUFFICIENT_PRIVILEGE, Explain{"", hint},
             "move %lld runs as role %s, which no longer exists", (long long)id, role_shown(runas).c_str());
    const Oid admin = glue(admin_role_glue);
    if (runas != owner && !glue(superuser_glue, runas) && (admin == InvalidOid || !glue(privs_glue, runas, admin)))
        fail(ERRCODE_INSUFFICIENT_PRIVILEGE, Explain{"", hint},
             "move %lld runs as role %s, which is no longer a member of sharding_admin", (long long)id,
             role_shown(runas).c_str());
}

// The engine's named connections: made for one role, never reused by
// another.
void drop_engine_connections() noexcept {
    for (const char *n : {online::kVerify, kSrc, kDst, kSelf}) named_disconnect(n);
}

void get_user_glue(Oid *user, int *sec) { GetUserIdAndSecContext(user, sec); }
void set_user_glue(Oid user, int sec) { SetUserIdAndSecContext(user, sec); }

// With the rights of a move's role for as long as it lives (checked by
// require_act_as first): SetUserIdAndSecContext, restored by the
// destructor on every exit, a C++ exception or an ERROR turned into one
// (every PostgreSQL call of the engine goes through glue / pg_call); an
// ERROR that escaped anyway is a (sub)transaction abort, which restores the
// user id of its start. SECURITY_LOCAL_USERID_CHANGE: nothing run meanwhile
// may SET ROLE. The engine's connections are dropped on both sides of the
// switch, so that none made for one role serves the other.
class ActingAs {
  public:
    ActingAs(int64 id, Oid runas) {
        require_act_as(id, runas);
        glue(get_user_glue, &user_, &sec_);
        if (runas == user_ || runas == InvalidOid) return;
        drop_engine_connections();
        glue(set_user_glue, runas, sec_ | SECURITY_LOCAL_USERID_CHANGE);
        switched_ = true;
    }
    ~ActingAs() {
        if (!switched_) return;
        SetUserIdAndSecContext(user_, sec_);
        drop_engine_connections();
    }
    ActingAs(const ActingAs &) = delete;
    ActingAs &operator=(const ActingAs &) = delete;

  private:
    Oid user_ = InvalidOid;
    int sec_ = 0;
    bool switched_ = false;
};

// move_shard_online and isolate: only under READ COMMITTED. The journal row
// commits over the engine's own connection and is then read back here
// through SPI: a transaction snapshot (REPEATABLE READ, SERIALIZABLE) taken
// before that commit would not show it, the move would fail as if it did
// not exist and its queued row would block the shard. Refused before
// anything is written, as pg_import_snapshot refuses the isolation levels
// it cannot work under (0A000).
void refuse_snapshot_isolation() {
    if (IsolationUsesXactSnapshot())
        fail(ERRCODE_FEATURE_NOT_SUPPORTED,
             Explain{"It commits its journal over a connection of its own and reads it back in this transaction.",
                     "Call it in a READ COMMITTED transaction."},
             "moving a shard online requires isolation level READ COMMITTED");
}

// move_shard_online, isolate and _move_execute: not on a server promoted
// from a standby of the coordinator (or restored from its backup) before
// take_over has made the nodes follow it: they would refuse its steps
// (fenced) or never see its switch (docs/nodes.md, "Failover of the
// coordinator"). A database still at 1.3's SQL has no such state.
void refuse_before_take_over() {
    if (spi_value("SELECT pg_catalog.to_regprocedure('sharding._take_over_needed()') IS NOT NULL", {}) != Text("t")) return;
    if (spi_value("SELECT sharding._take_over_needed()", {}) == Text("t"))
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"This server was promoted from a standby of the coordinator, or restored from its backup, and "
                     "the nodes still follow the coordinator it was a copy of.",
                     "Run SELECT sharding.take_over(); here first."},
             "no move before take_over on this server");
}

// move_shard_online and isolate: the move, journaled and carried out here;
// its id. The source's slot would wait for this transaction if it had
// written: refused before anything happens.
int64 run_move(const std::string &map, int32 logical, const Text &key, const std::string &node) {
    refuse_written();
    int64 id = enqueue(Text(), Text(map), Text(std::to_string(logical)), key, Text(node));
    if (execute(id, !key) != to_text(Phase::Done)) raise_recorded(id);
    return id;
}

// The key as the map's key column type reads and prints it (docs/moves.md,
// "Keys by value"): converted once through that type, so that the journal,
// the decoder's instructions, the pin and routing hold one spelling of one
// value ('007' and ' +7' are 7, a uuid is in lower case, a bytea key in
// \x hex whatever bytea_output says). A spelling the type rejects raises
// that type's own error (22P02). Text keys (and maps without a distributed
// table) stay as they are.
Text canonical_key(const Text &map, const Text &key) {
    if (!key) return key;
    const std::optional<KeyType> type = map_key_type(map);
    if (!type) return key;
    switch (key_type_oid(*type)) {
    case INT2OID:
    case INT4OID:
    case INT8OID:
        return spi_value("SELECT $1::pg_catalog.int8::pg_catalog.text", {c(key)});
    case UUIDOID:
        return spi_value("SELECT $1::pg_catalog.uuid::pg_catalog.text", {c(key)});
    case BYTEAOID:
        return spi_value("SELECT '\\x' OPERATOR(pg_catalog.||) pg_catalog.encode($1::pg_catalog.bytea, 'hex')", {c(key)});
    default:
        return key;
    }
}

}  // namespace

int32 executor_lock_class() { return lock_class(); }

// A job's move is added only by a role with the privileges of the role
// the job runs as (no role adds a move that runs with rights it does not
// have: CONTRACT 15.2); 42501 otherwise.
void require_job_role(const Text &job) {
    if (!job) return;
    std::vector<Row> r = spi_rows("SELECT t.runas::text, COALESCE(pg_catalog.quote_ident(a.rolname), "
                                  "t.runas::text) FROM sharding.move_jobs t LEFT JOIN pg_catalog.pg_roles a "
                                  "ON a.oid = t.runas WHERE t.job = $1::bigint",
                                  {c(job)});
    if (r.empty())
        fail(ERRCODE_INSUFFICIENT_PRIVILEGE, "permission denied to add a move to rebalance job %s, which does not exist",
             job->c_str());
    const Oid runas = static_cast<Oid>(std::strtoul(must(r[0][0]).c_str(), nullptr, 10));
    if (!glue(privs_glue, glue(user_glue), runas))
        fail(ERRCODE_INSUFFICIENT_PRIVILEGE,
             Explain{"", "Moves of a job run as the role that started it: only that role (or a role with its "
                         "privileges) may add moves to it."},
             "permission denied to add a move to rebalance job %s, which runs as role %s", job->c_str(),
             must(r[0][1]).c_str());
}

int64 enqueue(const Text &job, const Text &map, const Text &logical_arg, const Text &key_arg, const Text &destination) {
    require_node(destination);
    Text shards = require_map(map, false);
    const Text key = canonical_key(map, key_arg);
    Text logical = logical_arg;
    if (key) {
        // By the type of the map's key columns: the text form of a bigint
        // or uuid key hashes elsewhere.
        Text of_key = key_shard(map, key);
        if (!logical)
            logical = of_key;
        else if (logical != of_key)
            fail(ERRCODE_INVALID_PARAMETER_VALUE, "key %s is in logical shard %s, not %s", lit(key).c_str(),
                 shown(of_key).c_str(), logical->c_str());
    }
    check_logical(map, logical, shards);
    Text source = spi_value("SELECT s.node FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer",
                            {c(map), c(logical)});
    if (key) {
        Text pinned = spi_value("SELECT p.node FROM sharding.pins p WHERE p.map = $1 AND p.key = $2", {c(map), c(key)});
        if (pinned) source = pinned;
    }
    if (source != destination) check_dsns(destination, source);
    std::vector<Row> live = spi_rows(
        "SELECT m.move::text, m.phase, m.error FROM sharding.move_journal m "
        "WHERE m.map = $1 AND (m.logical = $2::integer OR m.key = $3) "
        "AND m.phase NOT IN " PHASE_SQL_FINAL " LIMIT 1",
        {c(map), c(logical), c(key)});
    if (!live.empty()) {
        const std::string msg = format("logical shard %s of map \"%s\" is already being moved (move %s, phase %s)",
                                       c(logical), c(map), c(live[0][0]), c(live[0][1]));
        if (live[0][2])
            throw Error(ERRCODE_OBJECT_IN_USE, msg, "It was interrupted and could not be rolled back yet: " + *live[0][2],
                        "The next sharding.move_shard_online or sharding._move_recover tries again.");
        throw Error(ERRCODE_OBJECT_IN_USE, msg, std::string(), "Wait for it, or cancel it with sharding._move_cancel.");
    }
    // The role the move runs as: the job's (_move_enqueue checked that the
    // caller has its privileges), else the caller. Written explicitly: the
    // journal's connection may log in as another role (coordinator_dsn),
    // whose privileges of this one the journal's trigger checks.
    Text runas;
    const bool roles = journal_has_runas();
    if (job) runas = spi_value("SELECT t.runas::text FROM sharding.move_jobs t WHERE t.job = $1::bigint", {c(job)});
    if (!runas) runas = std::to_string(glue(user_glue));
    Text id;
    try {
        // The move's name, unique to this coordinator (docs/moves.md,
        // "Names"), stored: recovery, cancel and clean-up use it.
        const bool named = journal_has_name();
        const std::string name = named ? move_name(*map, std::atoi(logical->c_str()), coordinator_tag()) : "";
        id = journal("INSERT INTO sharding.move_journal (job, map, logical, key, source, destination" +
                     std::string(roles ? ", runas" : "") + std::string(named ? ", name" : "") + ") VALUES (" +
                     job.value_or("NULL") + ", " + lit(map) + ", " + *logical + ", " + lit(key) + ", " +
                     lit(source) + ", " + lit(destination) + (roles ? ", " + *runas : std::string()) +
                     (named ? ", " + lit(name) : std::string()) + ") RETURNING move");
    } catch (const Error &e) {
        if (e.sqlstate() != ERRCODE_UNIQUE_VIOLATION) throw;
        fail(ERRCODE_OBJECT_IN_USE, "logical shard %s of map \"%s\" is already being moved", c(logical), c(map));
    }
    return std::strtoll(must(id).c_str(), nullptr, 10);
}

std::string resolve(int64 id, const std::string &final_phase) {
    const std::string ids = std::to_string(id);
    JournalRow j = require_row(Text(ids));
    if (is_final(j.phase)) return j.phase;
    ActingAs as(id, j.runas);
    if (j.phase == to_text(Phase::Queued)) {
        journal("UPDATE sharding.move_journal SET phase = " + lit(final_phase) +
                ", finished = pg_catalog.now(), pid = NULL WHERE move = " + ids);
        return final_phase;
    }
    connect(j.source, j.destination);
    std::string result = final_phase;
    if (j.phase == to_text(Phase::Cleanup)) {
        Text epoch = j.new_epoch;
        if (!epoch) {
            const std::string l = std::to_string(j.logical);
            epoch = spi_value("SELECT s.epoch::text FROM sharding.shards s WHERE s.map = $1 AND s.logical = $2::integer",
                              {j.map.c_str(), l.c_str()});
        }
        // A deferred clean-up (its journal row says so) deletes in
        // batches; a move interrupted in its clean-up as its executor
        // deletes.
        finish(j.map, j.logical, j.key, must(j.destination), epoch, nullptr, false, j.cleanup_deferred);
        result = to_text(Phase::Done);
    } else {
        // The source thaws inside undo, once the destination has said it
        // does not own the shard (a destination out of reach: the source
        // stays frozen and the row live, tried again later).
        if (!undo(j.map, j.logical, j.key)) {
            // The destination owned the shard already: finished, 'done'.
            disconnect();
            return to_text(Phase::Done);
        }
        journal("UPDATE sharding.move_journal SET phase = " + lit(final_phase) +
                ", finished = pg_catalog.now(), pid = NULL, error = coalesce(error, " +
                lit("interrupted in phase " + j.phase + ", rolled back") +
                "), error_state = coalesce(error_state, '55000') WHERE move = " + ids);
    }
    disconnect();
    return result;
}

std::string execute(int64 id, bool may_defer) {
    const std::string ids = std::to_string(id);
    JournalRow j = require_row(Text(ids));
    if (is_final(j.phase)) return j.phase;
    // The executor's session-level lock: it says the move is alive.
    const int32 k1 = lock_class(), k2 = lock_obj(id);
    if (!try_session_lock(k1, k2))
        fail(ERRCODE_OBJECT_IN_USE, "move %lld is being carried out by another session", (long long)id);
    Executing executing(id);
    std::string result;
    bool cancelled_meanwhile = false;
    bool deferred = false;
    Caught err;
    bool ok = subxact(
        [&] {
            if (j.phase != to_text(Phase::Queued)) {
                result = resolve(id, to_text(Phase::Failed));
                return;
            }
            ActingAs as(id, j.runas);
            if (!journal("UPDATE sharding.move_journal SET pid = " + std::to_string(MyProcPid) +
                         ", started = pg_catalog.now(), phase_started = pg_catalog.now() WHERE move = " + ids +
                         " AND phase = " PHASE_SQL(QUEUED) " RETURNING phase")) {
                cancelled_meanwhile = true;
                return;
            }
            // A direct move of a whole shard (move_shard_online) may leave
            // the source's rows to a cleaner (sharding.move_cleanup); a
            // job's runner, _move_execute and isolate (which returns the
            // rows deleted) clean up themselves.
            MoveResult res = move_online(Text(j.map), j.logical, j.key, must(j.destination), may_defer && !j.job && !j.key);
            deferred = res.deferred;
            if (deferred) {
                // Left in phase cleanup for the cleaner (started below, once
                // this session has let go of the move).
                journal("UPDATE sharding.move_journal SET pid = NULL, new_epoch = coalesce(new_epoch, " +
                        res.new_epoch.value_or("NULL") + ") WHERE move = " + ids);
                result = to_text(Phase::Done);
                return;
            }
            // Moves that copy nothing (same owner, no distributed table) end
            // here; the others' finish ended the row already (the same
            // update would change nothing, over a connection opened again).
            if (!res.ended)
                journal("UPDATE sharding.move_journal SET phase = " PHASE_SQL(DONE) ", phase_started = pg_catalog.now(), "
                        "finished = pg_catalog.now(), pid = NULL, new_epoch = coalesce(new_epoch, " +
                        res.new_epoch.value_or("NULL") + "), rows_moved = coalesce(rows_moved, " +
                        std::to_string(res.moved) + ") WHERE move = " + ids + " AND phase NOT IN " PHASE_SQL_FINAL);
            result = to_text(Phase::Done);
        },
        &err);
    if (ok) {
        session_unlock(k1, k2);
        if (deferred && !jobs_clean_up(MyDatabaseId))
            warn(format("the source's rows of move %lld are deleted later: no background worker could be started "
                          "for it now",
                          (long long)id),
                   "sharding._move_recover() deletes them, as do the jobs launcher and, 10 s on, the next "
                   "move_shard_online or isolate.");
        if (cancelled_meanwhile)
            return must(spi_value("SELECT m.phase FROM sharding.move_journal m WHERE m.move = $1::bigint", {ids.c_str()}));
        return result;
    }
    if (err.code == ERRCODE_ASSERT_FAILURE) {
        session_unlock(k1, k2);
        reraise(err);
    }
    const bool cancelled = err.code == ERRCODE_QUERY_CANCELED;
    // Rolled back (or never started): the row ends. Otherwise (the rollback
    // or the finish could not complete) it stays in its phase for
    // _move_recover, with the error.
    const std::string ending = lit(std::string(to_text(cancelled ? Phase::Cancelled : Phase::Failed)));
    Caught inner;
    if (!subxact(
            [&] {
                journal("UPDATE sharding.move_journal SET phase = CASE WHEN undone OR phase = " PHASE_SQL(QUEUED) " THEN " + ending +
                        " ELSE phase END, finished = CASE WHEN undone OR phase = " PHASE_SQL(QUEUED) " THEN pg_catalog.now() END, "
                        "error = " + lit(err.message) + ", error_state = " + lit(sqlstate_text(err.code)) +
                        ", error_detail = " + lit(nonempty(err.detail)) + ", error_hint = " + lit(nonempty(err.hint)) +
                        ", pid = NULL WHERE move = " + ids + " AND phase NOT IN " PHASE_SQL_FINAL);
            },
            &inner)) {
        if (not_others(inner.code)) {
            session_unlock(k1, k2);
            reraise(inner);
        }
        warn(format("could not record the end of move %lld: %s", (long long)id, inner.message.c_str()));
    }
    session_unlock(k1, k2);
    // A rollback that could not complete (a node out of reach) is retried
    // without a call by the jobs launcher, once the nodes answer again.
    if (spi_value("SELECT m.phase FROM sharding.move_journal m WHERE m.move = $1::bigint AND m.phase NOT IN "
                  PHASE_SQL_NOT_IN_FLIGHT,
                  {ids.c_str()}))
        jobs_recheck(MyDatabaseId);
    // A cancel of the caller goes on (with the move rolled back and
    // recorded); a failure is recorded and returned.
    if (cancelled) throw Error(ERRCODE_QUERY_CANCELED, err.message);
    return to_text(Phase::Failed);
}

bool cancel(int64 id) {
    const std::string ids = std::to_string(id);
    JournalRow j = require_row(Text(ids));
    if (is_final(j.phase)) return false;
    if (j.phase == to_text(Phase::Queued) &&
        journal("UPDATE sharding.move_journal SET phase = " PHASE_SQL(CANCELLED) ", finished = pg_catalog.now() WHERE move = " + ids +
                " AND phase = " PHASE_SQL(QUEUED) " AND pid IS NULL RETURNING phase"))
        return true;
    const int32 k1 = lock_class(), k2 = lock_obj(id);
    if (try_session_lock(k1, k2)) {
        // Nobody runs it (its executor died): roll it back here.
        Caught err;
        bool ok = subxact([&] { resolve(id, to_text(Phase::Cancelled)); }, &err);
        session_unlock(k1, k2);
        if (!ok) reraise(err);
        return true;
    }
    // Signal whoever holds the executor's lock now: the journal's pid may
    // not be written yet, or be a dead executor's (a resumed move), which
    // the server may have given to an unrelated backend since.
    const std::string k1s = std::to_string(k1), k2s = std::to_string(k2);
    spi_rows("SELECT pg_catalog.pg_cancel_backend(l.pid) FROM pg_catalog.pg_locks l "
             "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
             "AND l.classid = $1::integer::oid AND l.objid = $2::integer::oid AND l.pid <> pg_catalog.pg_backend_pid() "
             "AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())",
             {k1s.c_str(), k2s.c_str()});
    return true;
}

std::string abandon(const Text &map, const Text &logical, bool force) {
    refuse_before_take_over();
    Text shards = require_map(map, false);
    check_logical(map, logical, shards);
    Text id = spi_value("SELECT m.move::text FROM sharding.move_journal m WHERE m.map = $1 AND m.logical = $2::integer "
                        "AND m.phase NOT IN " PHASE_SQL_FINAL,
                        {c(map), c(logical)});
    if (!id)
        fail(ERRCODE_UNDEFINED_OBJECT, Explain{"", "sharding.moves lists the moves in flight."},
             "no move of logical shard %s of map \"%s\" is in flight", c(logical), c(map));
    const int64 mv = std::strtoll(id->c_str(), nullptr, 10);
    JournalRow j = read_row(mv);
    if (j.phase == "queued")
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"A queued move has made nothing at its nodes.",
                     format("Cancel it: SELECT sharding._move_cancel(%lld);", (long long)mv)},
             "move %lld of logical shard %s of map \"%s\" is queued: nothing to abandon", (long long)mv, c(logical),
             c(map));
    ActingAs as(mv, j.runas);
    LiveMove m;
    m.id = mv;
    m.map = j.map;
    m.logical = j.logical;
    m.key = j.key;
    m.phase = j.phase;
    m.source = must(j.source);
    m.destination = must(j.destination);
    return abandon_move(m, force);
}

int32 recover(bool skip_fresh_deferred) {
    int32 n = 0;
    int32 left = 0;  // moves it could not resolve
    const int32 k1 = lock_class();
    // The moves the caller may act on (require_act_as): its own, those of
    // roles it has the privileges of, every one for the extension's owner
    // (the scanner). The others are left to them.
    const std::string me = std::to_string(glue(user_glue));
    const std::string sql =
        std::string("SELECT m.move::text FROM sharding.move_journal m "
                    "WHERE m.phase NOT IN " PHASE_SQL_NOT_IN_FLIGHT " "
                    "AND m.pid IS DISTINCT FROM pg_catalog.pg_backend_pid() ") +
        (journal_has_runas() ? "AND (m.runas = $1::oid OR pg_catalog.pg_has_role($1::oid, m.runas, 'USAGE') "
                               "OR EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname = 'sharding' "
                               "AND e.extowner = $1::oid)) "
                             : "AND $1::oid IS NOT NULL ") +
        (skip_fresh_deferred && journal_has("cleanup_deferred")
             ? "AND NOT (m.phase = " PHASE_SQL(CLEANUP) " AND m.cleanup_deferred AND m.error IS NULL "
               "AND m.phase_started > pg_catalog.clock_timestamp() - interval '10 s') "
             : "") +
        "ORDER BY m.move";
    for (Row &r : spi_rows(sql.c_str(), {me.c_str()})) {
        const int64 id = std::strtoll(must(r[0]).c_str(), nullptr, 10);
        if (!try_session_lock(k1, lock_obj(id))) continue;
        Caught err;
        // Its role gone or without its rights any more: a WARNING, and
        // nothing to retry until the owner gives the move another role (the
        // hint says how).
        if (!subxact([&] { require_act_as(id, read_row(id).runas); }, &err)) {
            session_unlock(k1, lock_obj(id));
            if (not_others(err.code)) reraise(err);
            warn(format("could not recover move %lld: %s", (long long)id, err.message.c_str()), err.hint);
            continue;
        }
        if (subxact([&] { resolve(id, to_text(Phase::Failed)); }, &err))
            n++;
        else if (not_others(err.code)) {
            session_unlock(k1, lock_obj(id));
            reraise(err);
        } else {
            left++;
            warn(format("could not recover move %lld: %s", (long long)id, err.message.c_str()),
                 "Its journal row stays; the next call tries again.");
        }
        session_unlock(k1, lock_obj(id));
    }
    // Tried again without a call (where the library is preloaded).
    if (left > 0) jobs_recheck(MyDatabaseId);
    return n;
}

}  // namespace sharding::move

using namespace sharding;
using namespace sharding::move;

namespace {
// A move's id argument; NULL names no move (42704).
int64 move_id(FunctionCallInfo fcinfo) {
    if (PG_ARGISNULL(0)) fail(ERRCODE_UNDEFINED_OBJECT, "move <NULL> does not exist");
    return PG_GETARG_INT64(0);
}

// The arguments (map, shard or key, node) of move_shard_online and isolate,
// checked as both check them before they move anything.
struct MoveCall {
    Text map, what, node;
    Text shards;  // the map's logical shard count
};

// The prologue of move_shard_online and isolate: refused under snapshot
// isolation or before take_over; argument 1 read as an integer or as
// text and, where `required` names it, refused when NULL (22023); then the
// node and the map checked.
MoveCall begin_move_call(FunctionCallInfo fcinfo, bool integer, const char *required) {
    refuse_snapshot_isolation();
    refuse_before_take_over();
    MoveCall m{text_arg(fcinfo, 0), integer ? int_arg(fcinfo, 1) : text_arg(fcinfo, 1), text_arg(fcinfo, 2), {}};
    if (required && !m.what) fail(ERRCODE_INVALID_PARAMETER_VALUE, "%s must not be NULL", required);
    require_node(m.node);
    m.shards = require_map(m.map, false);
    return m;
}
}  // namespace

// move_shard_online(map text, logical integer, node text): bigint, the
// shard's epoch afterwards. Not STRICT: NULL arguments raise 22023.
SHARDING_FUNCTION(sharding_move_shard_online) {
    const MoveCall m = begin_move_call(fcinfo, true, nullptr);
    const Text &map = m.map, &logical = m.what, &node = m.node;
    check_logical(map, logical, m.shards);
    // What an interrupted move left is cleaned up first (a deferred
    // clean-up of the last seconds is its cleaner's).
    recover(true);
    std::vector<Row> cur = spi_rows("SELECT s.node, s.epoch::text FROM sharding.shards s "
                                    "WHERE s.map = $1 AND s.logical = $2::integer",
                                    {c(map), c(logical)});
    Text epoch;
    if (!cur.empty() && cur[0][0] == node)
        epoch = cur[0][1];
    else {
        const std::string id = std::to_string(run_move(*map, PG_GETARG_INT32(1), std::nullopt, *node));
        epoch = spi_value("SELECT m.new_epoch::text FROM sharding.move_journal m WHERE m.move = $1::bigint", {id.c_str()});
    }
    if (!epoch) PG_RETURN_NULL();
    PG_RETURN_INT64(std::strtoll(epoch->c_str(), nullptr, 10));
}

// isolate(map text, key text, node text): bigint, the rows moved. Not STRICT.
SHARDING_FUNCTION(sharding_isolate) {
    const MoveCall m = begin_move_call(fcinfo, false, "key");
    const Text &map = m.map, &node = m.node;
    // One value, whatever its spelling (22P02 for one the type rejects).
    Text key = canonical_key(map, m.what);
    Text logical = key_shard(map, key);
    recover(true);
    Text source = spi_value("SELECT coalesce((SELECT p.node FROM sharding.pins p WHERE p.map = $1 AND p.key = $2), "
                            "(SELECT s.node FROM sharding.shards s WHERE s.map = $1 AND s.logical = $3::integer))",
                            {c(map), c(key), c(logical)});
    if (source == node) {
        // isolate pins even where the rows already are
        spi_value("SELECT sharding.pin($1, $2, $3)", {c(map), c(key), c(node)});
        PG_RETURN_INT64(0);
    }
    const std::string id = std::to_string(run_move(*map, std::atoi(must(logical).c_str()), key, *node));
    Text rows = spi_value("SELECT coalesce(m.rows_moved, 0)::text FROM sharding.move_journal m WHERE m.move = $1::bigint",
                          {id.c_str()});
    PG_RETURN_INT64(std::strtoll(must(rows).c_str(), nullptr, 10));
}

// _move_enqueue(job, map, logical, key, destination): the queued move's id.
SHARDING_FUNCTION(sharding__move_enqueue) {
    Text job = bigint_arg(fcinfo, 0);
    Text map = text_arg(fcinfo, 1);
    Text logical = int_arg(fcinfo, 2);
    Text key = text_arg(fcinfo, 3);
    Text destination = text_arg(fcinfo, 4);
    require_job_role(job);
    int64 id = enqueue(job, map, logical, key, destination);
    PG_RETURN_INT64(id);
}

// _move_execute(move): 'done', 'failed' or 'cancelled'. Only under READ
// COMMITTED, as move_shard_online.
SHARDING_FUNCTION(sharding__move_execute) {
    refuse_snapshot_isolation();
    refuse_before_take_over();
    int64 id = move_id(fcinfo);
    std::string result = execute(id);
    PG_RETURN_DATUM(text_datum(result));
}

// _move_resolve(move, final DEFAULT 'failed'): the final phase.
SHARDING_FUNCTION(sharding__move_resolve) {
    int64 id = move_id(fcinfo);
    Text final_phase = text_arg(fcinfo, 1);
    std::string result = resolve(id, final_phase.value_or(to_text(Phase::Failed)));
    PG_RETURN_DATUM(text_datum(result));
}

// _move_cancel(move): false if it had ended.
SHARDING_FUNCTION(sharding__move_cancel) {
    int64 id = move_id(fcinfo);
    PG_RETURN_BOOL(cancel(id));
}

// _move_recover(): how many moves were rolled back or finished.
SHARDING_FUNCTION(sharding__move_recover) {
    (void)fcinfo;
    PG_RETURN_INT32(recover());
}

// move_abandon(map, logical, force DEFAULT false): the node that owns the
// shard afterwards. Not STRICT: NULL map or logical as the other calls of a
// map (22023), NULL force 22004.
SHARDING_FUNCTION(sharding_move_abandon) {
    Text map = text_arg(fcinfo, 0);
    Text logical = int_arg(fcinfo, 1);
    if (PG_ARGISNULL(2)) fail(ERRCODE_NULL_VALUE_NOT_ALLOWED, "force must not be NULL");
    const bool force = PG_GETARG_BOOL(2);
    PG_RETURN_DATUM(text_datum(abandon(map, logical, force)));
}

// _refuse_owner_switch(map, fn): 55000 naming a distributed table of the
// map: switching owners alone (move_shard, rebalance, rebalance_by_load)
// would leave its rows on the old owner, where nothing routes any more.
SHARDING_FUNCTION(sharding__refuse_owner_switch) {
    Text map = text_arg(fcinfo, 0);
    Text fn = text_arg(fcinfo, 1);
    // A follower refuses configuration changes by itself (its own message).
    if (spi_value("SELECT EXISTS (SELECT FROM sharding.local_node l WHERE l.following)", {}) == Text("t"))
        PG_RETURN_VOID();
    Text table = spi_value("SELECT pg_catalog.format('%I.%I', d.schema_name, d.table_name) "
                           "FROM sharding.distributed_tables d WHERE d.map = $1 "
                           "ORDER BY d.schema_name, d.table_name LIMIT 1",
                           {c(map)});
    if (table)
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"The rows would stay on the old owner, where nothing routes any more.",
                     "Use sharding.rebalance_start or sharding.move_shard_online, which move the rows too."},
             "%s would switch owners of map \"%s\" without moving the rows of its distributed table %s",
             shown(fn).c_str(), shown(map).c_str(), table->c_str());
    PG_RETURN_VOID();
}
