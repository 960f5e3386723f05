// Rebalance jobs in background workers (docs/rebalance.md).
//
// A job is a row of sharding.move_jobs; each of its moves is a row of the
// move engine's journal (sharding.move_journal). What a job decides is C++
// behind SQL names (src/jobs/jobs_run.cpp): which move to start next
// (_job_claim), how to run it (_job_execute, over the engine's
// _move_execute), when the job is over. This file only provides the
// processes that call those functions, as SQL in their own transactions
// (so the privileges of the job's role apply):
//
// - a launcher (static background worker, registered here when the library
//   is in shared_preload_libraries): at start, after a crash or a restart, it
//   starts one short-lived scanner per database; the scanner recovers the
//   moves whose executor died (_move_recover) and starts runners for every
//   unfinished job (_job_pickup). Later it rescans when a job could not get
//   a runner because all were busy (Shared::pending), and it scans a
//   database again (Shared::recheck) when a move there was left
//   interrupted while the server ran: its executor's rollback could not
//   complete (a node out of reach), its executor ended without unwinding
//   (FATAL), or a scan could not resolve it; then after 1 s, and every 2,
//   4, 8, then 10 s for as long as a scan leaves moves it could not
//   resolve, so that a move of a direct call is rolled back without a
//   further call once its nodes answer again; the scanner also re-points
//   the nodes a take_over could not reach (_take_over_pending);
// - runners (dynamic background workers, at most sharding.max_move_workers
//   per server, counted in shared memory): each loops claim -> execute ->
//   claim on one job until the job is over, then adopts another job of its
//   database that lacks runners, or exits.
//
// rebalance_start asks for runners through _job_launch, which only records
// the wish: the workers are registered when the transaction commits (an
// xact callback), so they never look for a job row that is not committed,
// and a rolled-back start starts nothing.
//
// The code below is C-style (no owning C++ object): it runs in background
// worker entry points and in an xact callback, where PostgreSQL errors are
// caught with PG_TRY around each transaction.
#include "ddl/ddl.hpp"
#include "pg/extension.hpp"
#include "pg/shmem.hpp"
#include "jobs/jobs.hpp"
#include "move/phase.hpp"
#include "routing/groups.hpp"

#include <algorithm>

extern "C" {
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
}

using sharding::Extension;
using sharding::extension_function;
using sharding::find_extension;

namespace {

constexpr int kMaxWorkersLimit = 64;
int max_move_workers = 2;

struct Slot {
    bool used;
    uint32 generation;
    Oid db;
    int64 job;
    pid_t pid;  // 0 until the worker has started
    TimestampTz reserved;
};

// A database to scan again (jobs_recheck).
struct Recheck {
    Oid db;         // InvalidOid: a free entry
    int tries;      // scans that left moves unresolved so far
    bool scanning;  // its scanner runs now
    bool again;     // asked for again while it ran
    TimestampTz due;
    bool soon;      // in-doubt transactions wait (src/ddl): every second, no back-off
};
constexpr int kMaxRechecks = 16;

// Move workers of a job that ended before running anything, in a row.
struct FailedStarts {
    Oid db;  // InvalidOid: a free entry
    int64 job;
    int count;
};
constexpr int kMaxFailedStarts = 16;

struct Shared {
    slock_t mutex;
    bool pending;             // a job could not get all its runners
    Latch *launcher_latch;    // the launcher's, to wake it
    uint32 generation;
    Slot slots[kMaxWorkersLimit];
    Recheck rechecks[kMaxRechecks];
    FailedStarts failed_starts[kMaxFailedStarts];
};

Shared *shared = nullptr;

// What a runner is told at start (bgw_extra).
struct RunnerArgs {
    Oid db;
    Oid user;
    int64 job;
    int slot;
    uint32 generation;
};
static_assert(sizeof(RunnerArgs) <= BGW_EXTRALEN, "runner arguments fit bgw_extra");

void jobs_shmem_attach(void *mem, bool found) {
    shared = static_cast<Shared *>(mem);
    if (!found) {
        memset(shared, 0, sizeof(Shared));
        SpinLockInit(&shared->mutex);
    }
}

// A slot whose worker never started (registration lost) is free again after
// a minute.
bool slot_free(const Slot &s, TimestampTz now) {
    return !s.used || (s.pid == 0 && TimestampDifferenceExceeds(s.reserved, now, 60000));
}

// Reserves a runner slot for job; -1 when all sharding.max_move_workers are busy.
int reserve_slot(int64 job, uint32 *generation) {
    TimestampTz now = GetCurrentTimestamp();
    int found = -1;
    SpinLockAcquire(&shared->mutex);
    for (int i = 0; i < max_move_workers && i < kMaxWorkersLimit; i++) {
        if (slot_free(shared->slots[i], now)) {
            Slot &s = shared->slots[i];
            s.used = true;
            s.generation = ++shared->generation;
            s.db = MyDatabaseId;
            s.job = job;
            s.pid = 0;
            s.reserved = now;
            *generation = s.generation;
            found = i;
            break;
        }
    }
    if (found < 0) shared->pending = true;
    SpinLockRelease(&shared->mutex);
    return found;
}

void release_slot(int slot, uint32 generation) {
    SpinLockAcquire(&shared->mutex);
    Slot &s = shared->slots[slot];
    bool woke = false;
    if (s.used && s.generation == generation) {
        s.used = false;
        woke = shared->pending;
    }
    Latch *latch = shared->launcher_latch;
    SpinLockRelease(&shared->mutex);
    // A slot became free while some job waits for one: the launcher rescans.
    if (woke && latch) SetLatch(latch);
}

// A worker of job failed to start (count one more), or started (reset).
void note_start(Oid db, int64 job, bool failed) {
    SpinLockAcquire(&shared->mutex);
    FailedStarts *entry = nullptr, *free_entry = nullptr;
    for (FailedStarts &f : shared->failed_starts) {
        if (f.db == db && f.job == job) entry = &f;
        if (!OidIsValid(f.db) && free_entry == nullptr) free_entry = &f;
    }
    if (!failed) {
        if (entry != nullptr) *entry = FailedStarts{};
    } else if (entry != nullptr) {
        entry->count++;
    } else {
        // No free entry: the oldest job's is reused (jobs are few).
        if (free_entry == nullptr) free_entry = &shared->failed_starts[job % kMaxFailedStarts];
        *free_entry = FailedStarts{db, job, 1};
    }
    SpinLockRelease(&shared->mutex);
}

void wake_launcher() {
    SpinLockAcquire(&shared->mutex);
    shared->pending = true;
    Latch *latch = shared->launcher_latch;
    SpinLockRelease(&shared->mutex);
    if (latch) SetLatch(latch);
}

// A background worker of this library, connected to a database: its entry
// point (exported, sharding_jobs_*_main), type (pg_stat_activity's
// backend_type) and restart policy; the caller names it.
void init_worker(BackgroundWorker *w, const char *function, const char *type, int restart_time) {
    memset(w, 0, sizeof(*w));
    w->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    w->bgw_start_time = BgWorkerStart_RecoveryFinished;
    w->bgw_restart_time = restart_time;
    snprintf(w->bgw_library_name, BGW_MAXLEN, "%s", "sharding");
    snprintf(w->bgw_function_name, BGW_MAXLEN, "%s", function);
    snprintf(w->bgw_type, BGW_MAXLEN, "%s", type);
}

// Registers a runner for job (as user) in the current database; false when
// no slot or no background worker slot is free (the job stays queued and
// the launcher will retry).
bool start_runner(int64 job, Oid user) {
    uint32 generation = 0;
    int slot = reserve_slot(job, &generation);
    if (slot < 0) return false;
    BackgroundWorker w;
    init_worker(&w, "sharding_jobs_runner_main", "sharding move worker", BGW_NEVER_RESTART);
    snprintf(w.bgw_name, BGW_MAXLEN, "sharding move worker for job %lld", static_cast<long long>(job));
    w.bgw_main_arg = Int32GetDatum(slot);
    RunnerArgs args{MyDatabaseId, user, job, slot, generation};
    memcpy(w.bgw_extra, &args, sizeof(args));
    w.bgw_notify_pid = 0;
    if (!RegisterDynamicBackgroundWorker(&w, nullptr)) {
        release_slot(slot, generation);
        wake_launcher();
        return false;
    }
    return true;
}

// Runners wished for by this transaction, started at commit.
struct Wish {
    int64 job;
    Oid user;
    int runners;
};
constexpr int kMaxWishes = 64;
Wish wishes[kMaxWishes];
int n_wishes = 0;
bool callback_registered = false;

void jobs_xact_callback(XactEvent event, void *) {
    if (n_wishes == 0) return;
    if (event == XACT_EVENT_COMMIT) {
        int n = n_wishes;
        n_wishes = 0;
        for (int i = 0; i < n; i++)
            for (int r = 0; r < wishes[i].runners; r++)
                if (!start_runner(wishes[i].job, wishes[i].user)) break;
    } else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) {
        n_wishes = 0;
    }
}

int runners_of(Oid db, int64 job) {
    int n = 0;
    TimestampTz now = GetCurrentTimestamp();
    SpinLockAcquire(&shared->mutex);
    for (int i = 0; i < kMaxWorkersLimit; i++) {
        const Slot &s = shared->slots[i];
        if (!slot_free(s, now) && s.db == db && s.job == job) n++;
    }
    SpinLockRelease(&shared->mutex);
    return n;
}

// The message of the last ERROR in_own_transaction swallowed.
char last_error[512];

// Runs body in a transaction of its own, under SPI and an active snapshot
// (with_snapshot; without it, each of body's SPI statements takes its own,
// as in a READ COMMITTED session between statements, and the worker holds
// no xmin while body waits: the move, RB-10). body is C-style (it owns no
// C++ object: an ERROR skips its frames). Any ERROR is reported to the
// server log and swallowed (its message in last_error): false.
template <typename F>
bool in_own_transaction(F &&body, bool with_snapshot = true) {
    volatile bool ok = true;
    MemoryContext cxt = CurrentMemoryContext;
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PG_TRY();
    {
        SPI_connect();
        if (with_snapshot) PushActiveSnapshot(GetTransactionSnapshot());
        body();
        SPI_finish();
        if (with_snapshot) PopActiveSnapshot();
        CommitTransactionCommand();
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(cxt);
        ErrorData *edata = CopyErrorData();
        strlcpy(last_error, edata->message ? edata->message : "unknown error", sizeof(last_error));
        FreeErrorData(edata);
        EmitErrorReport();
        AbortCurrentTransaction();
        FlushErrorState();
        ok = false;
    }
    PG_END_TRY();
    pgstat_report_activity(STATE_IDLE, nullptr);
    return ok;
}

// ------------------------------------------------ what a worker runs (CONTRACT 15.2)
//
// Workers connect as the bootstrap superuser (InitPostgres checks no
// rolcanlogin nor rolconnlimit for that one: a job of a role that cannot log
// in runs) and pin search_path to pg_catalog, pg_temp before anything runs
// (a database's ALTER DATABASE ... SET search_path, applied at connect, is
// overridden). They run no code in a database without the extension, and
// where it is installed only its own functions: found in the catalog
// (pg_extension, the function by name and argument types in the
// extension's schema, a member of the extension per pg_depend's deptype
// 'e'), called by OID, no name resolved through a search_path; a scanner as
// the extension's owner, a runner as its job's role, each through
// SetUserIdAndSecContext(..., SECURITY_LOCAL_USERID_CHANGE), which also
// refuses SET ROLE and SET SESSION AUTHORIZATION to anything they run.

// Calls function fn (its SET clauses apply, as fmgr applies them); the
// result and whether it is NULL.
Datum call_function(Oid fn, int nargs, const Datum *args, bool *isnull) {
    FmgrInfo flinfo;
    fmgr_info(fn, &flinfo);
    LOCAL_FCINFO(fcinfo, 2);
    InitFunctionCallInfoData(*fcinfo, &flinfo, nargs, InvalidOid, nullptr, nullptr);
    for (int i = 0; i < nargs; i++) {
        fcinfo->args[i].value = args[i];
        fcinfo->args[i].isnull = false;
    }
    Datum d = FunctionCallInvoke(fcinfo);
    *isnull = fcinfo->isnull;
    return d;
}

// search_path for the rest of the session, before any SQL runs.
void pin_search_path() { SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_SESSION); }

// A worker's connection to database db, as the bootstrap superuser, with
// search_path pinned, shown as `appname`.
void connect_worker(Oid db, const char *appname) {
    BackgroundWorkerInitializeConnectionByOid(db, InvalidOid, 0);
    pin_search_path();
    pgstat_report_appname(appname);
}

// The extension (in *ext) and its function `name` of no arguments:
// InvalidOid where the extension is not installed (or has no such member).
Oid own_function(Extension *ext, const char *name) {
    Oid fn = InvalidOid;
    (void)in_own_transaction([&] {
        *ext = find_extension();
        if (OidIsValid(ext->oid)) fn = extension_function(*ext, name, 0, nullptr);
    });
    return fn;
}

// Calls fn (of no arguments) in a transaction of its own, shown as
// `activity`; its result is not read (an ERROR is logged).
void call_in_own_transaction(Oid fn, const char *activity) {
    (void)in_own_transaction([&] {
        pgstat_report_activity(STATE_RUNNING, activity);
        bool isnull;
        (void)call_function(fn, 0, nullptr, &isnull);
    });
}

// Whether role may run moves: it exists and is the extension's owner or has
// the privileges of sharding_admin (a superuser has them). In a transaction.
bool role_may_run(Oid role) {
    if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role))) return false;
    Extension e = find_extension();
    if (OidIsValid(e.oid) && role == e.owner) return true;
    Oid admin = get_role_oid("sharding_admin", true);
    return OidIsValid(admin) && has_privs_of_role(role, admin);
}

// A runner gives up on its job (its claims keep failing): the job fails
// with `error` as a failed move makes it fail. Its moves not begun (nor
// claimed) are cancelled; it ends 'failed' at once unless moves of it are
// still live (in flight elsewhere, or interrupted), whose executors' next
// claims see the recorded error and end it once they are over. Run as the
// bootstrap superuser with search_path pinned: the claims may have failed
// for want of the job role's privileges (an ERROR restores both). False if
// that failed too.
bool give_up(int64 job, const char *error) {
    static const char *const kSql[] = {
        "UPDATE sharding.move_journal m SET phase = " PHASE_SQL(CANCELLED) ", finished = now() "
        "WHERE m.job = $1 AND m.phase = " PHASE_SQL(QUEUED) " AND m.pid IS NULL "
        "AND EXISTS (SELECT FROM sharding.move_jobs t WHERE t.job = $1 AND t.state IN ('queued', 'running')) "
        "AND NOT EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.classid = (hashtext('sharding.move_journal'))::oid AND l.objsubid = 2 "
        "AND l.objid = ((m.move % 2147483647)::integer)::oid "
        "AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))",
        "UPDATE sharding.move_jobs t SET error = coalesce(t.error, $2), "
        "state = CASE WHEN l.live THEN t.state ELSE 'failed' END, "
        "finished = CASE WHEN l.live THEN t.finished ELSE now() END, "
        "started = coalesce(t.started, now()), "
        "waiting = CASE WHEN l.live THEN t.waiting END, waits = CASE WHEN l.live THEN t.waits ELSE '{}' END "
        "FROM (SELECT EXISTS (SELECT FROM sharding.move_journal m WHERE m.job = $1 "
        "AND m.phase NOT IN " PHASE_SQL_FINAL ") AS live) l "
        "WHERE t.job = $1 AND t.state IN ('queued', 'running')",
    };
    Oid types[2] = {INT8OID, TEXTOID};
    Datum args[2] = {Int64GetDatum(job), 0};
    return in_own_transaction([&] {
        args[1] = CStringGetTextDatum(error);
        Oid save_user;
        int save_sec;
        GetUserIdAndSecContext(&save_user, &save_sec);
        SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID, save_sec | SECURITY_LOCAL_USERID_CHANGE);
        int nest = NewGUCNestLevel();
        (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true,
                                0, false);
        for (const char *sql : kSql) {
            pgstat_report_activity(STATE_RUNNING, sql);
            int rc = SPI_execute_with_args(sql, 2, types, args, nullptr, false, 0);
            if (rc != SPI_OK_UPDATE) elog(ERROR, "sharding move worker: \"%s\" returned %d", sql, rc);
            CommandCounterIncrement();
        }
        AtEOXact_GUC(true, nest);
        SetUserIdAndSecContext(save_user, save_sec);
    });
}

void sleep_ms(long ms) {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
}

int my_slot = -1;
uint32 my_generation = 0;
bool runner_done = false;     // the runner ends normally (its jobs are over)
bool runner_started = false;  // it connected and found the extension
Oid my_db = InvalidOid;
int64 my_job = 0;

// A runner that exits otherwise (terminated, FATAL) leaves its job without
// it: the launcher rescans and starts another, which resumes or rolls back
// the move it was carrying out.
void runner_exit(int, Datum) {
    // Ended before running anything (a FATAL at connect): counted, so that
    // the launcher's scan fails the job rather than retry it for ever.
    if (!runner_done && !runner_started && OidIsValid(my_db)) note_start(my_db, my_job, true);
    if (my_slot >= 0) release_slot(my_slot, my_generation);
    my_slot = -1;
    if (!runner_done) wake_launcher();
}

}  // namespace

extern "C" {
SHARDING_EXPORT void sharding_jobs_runner_main(Datum arg);
SHARDING_EXPORT void sharding_jobs_scanner_main(Datum arg);
SHARDING_EXPORT void sharding_jobs_launcher_main(Datum arg);
SHARDING_EXPORT void sharding_groups_reaper_main(Datum arg);
SHARDING_EXPORT void sharding_jobs_cleaner_main(Datum arg);
}

// A runner: claims and executes the moves of its job until the job is over,
// then adopts another job of this database that lacks runners.
void sharding_jobs_runner_main(Datum) {
    RunnerArgs args;
    memcpy(&args, MyBgworkerEntry->bgw_extra, sizeof(args));
    my_slot = args.slot;
    my_generation = args.generation;
    before_shmem_exit(runner_exit, 0);
    // SIGTERM (pg_terminate_backend, a fast shutdown) sets a flag acted on
    // at the next CHECK_FOR_INTERRUPTS, never FATAL from inside the handler
    // (libpq, malloc, a spinlock, a critical section).
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    SpinLockAcquire(&shared->mutex);
    bool mine = shared->slots[my_slot].used && shared->slots[my_slot].generation == my_generation;
    if (mine) shared->slots[my_slot].pid = MyProcPid;
    SpinLockRelease(&shared->mutex);
    if (!mine) proc_exit(0);
    my_db = args.db;  // from here an exit before the start is counted
    my_job = args.job;
    // As the bootstrap superuser (no login check), then as the job's role
    // (see "what a worker runs" above).
    connect_worker(args.db, "sharding move worker");
    Oid fn_claim = InvalidOid, fn_execute = InvalidOid, fn_adopt = InvalidOid;
    (void)in_own_transaction([&] {
        Extension ext = find_extension();
        if (!OidIsValid(ext.oid)) return;
        const Oid one[1] = {INT8OID}, two[2] = {INT8OID, INT8OID};
        fn_claim = extension_function(ext, "_job_claim", 1, one);
        fn_execute = extension_function(ext, "_job_execute", 2, two);
        fn_adopt = extension_function(ext, "_job_adopt", 0, nullptr);
    });
    if (!OidIsValid(fn_claim) || !OidIsValid(fn_execute) || !OidIsValid(fn_adopt)) {
        ereport(LOG, (errmsg("sharding move worker: the extension is not installed in this database")));
        runner_done = true;
        proc_exit(0);
    }
    // The job's role from here on: its privileges apply to everything the
    // runner runs, and pg_cancel_backend/pg_terminate_backend treat the
    // runner as that role's backend (as they did when it logged in as it).
    MyProc->roleId = args.user;
    SetUserIdAndSecContext(args.user, SECURITY_LOCAL_USERID_CHANGE);
    runner_started = true;
    note_start(args.db, args.job, false);

    int64 job = args.job;
    int errors = 0;
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        int64 move = 0;
        bool isnull = true, lost = false;
        char role[NAMEDATALEN + 32] = "";
        Datum a[2] = {Int64GetDatum(job), 0};
        // The job's role must still have the rights to run moves, checked
        // before each claim (so before each move it starts).
        bool claimed = in_own_transaction([&] {
            if (!role_may_run(args.user)) {
                lost = true;
                const char *name = GetUserNameFromId(args.user, true);
                if (name != nullptr)
                    snprintf(role, sizeof(role), "role \"%s\"", name);
                else
                    snprintf(role, sizeof(role), "role %u (dropped)", args.user);
                return;
            }
            pgstat_report_activity(STATE_RUNNING, "SELECT sharding._job_claim($1)");
            Datum d = call_function(fn_claim, 1, a, &isnull);
            move = isnull ? 0 : DatumGetInt64(d);
        });
        if (lost) {
            char why[sizeof(role) + 160];
            snprintf(why, sizeof(why),
                     "42501: permission denied: the job's %s may no longer run moves (it is neither a member of "
                     "sharding_admin nor the extension's owner)",
                     role);
            ereport(LOG, (errmsg("sharding move worker: job %lld: %s", static_cast<long long>(job), why)));
            runner_done = give_up(job, why);
            proc_exit(0);
        }
        if (!claimed) {
            // The claim itself failed (catalog missing, extension dropped,
            // ...): retry a little,
            // then give up on the job, which fails saying why (else it
            // would stay 'running' with nobody to run it, and
            // rebalance_wait would wait for ever). If even that fails, the
            // launcher is woken to give the job another runner.
            if (++errors > 30) {
                char why[sizeof(last_error) + 128];
                snprintf(why, sizeof(why), "a move worker gave up on the job after %d failed claims, the last: %s",
                         errors, last_error);
                ereport(LOG, (errmsg("sharding move worker: %s", why)));
                runner_done = give_up(job, why);
                proc_exit(0);
            }
            sleep_ms(1000);
            continue;
        }
        if (isnull) {
            // The job is over: take another that lacks runners, if any.
            SpinLockAcquire(&shared->mutex);
            shared->slots[my_slot].job = 0;
            SpinLockRelease(&shared->mutex);
            int64 next = 0;
            if (!in_own_transaction([&] {
                    pgstat_report_activity(STATE_RUNNING, "SELECT sharding._job_adopt()");
                    Datum d = call_function(fn_adopt, 0, a, &isnull);
                    next = isnull ? 0 : DatumGetInt64(d);
                }) ||
                isnull)
                break;
            job = next;
            SpinLockAcquire(&shared->mutex);
            shared->slots[my_slot].job = job;
            SpinLockRelease(&shared->mutex);
            errors = 0;
            continue;
        }
        if (move == 0) {  // nothing may start now: wait
            sleep_ms(500);
            continue;
        }
        a[1] = Int64GetDatum(move);
        // A cancel (rebalance_cancel signals the executor) arrives here as
        // an ERROR after the engine recorded it: logged, and the loop goes
        // on to the next claim, which sees the job cancelled.
        // Without a snapshot of its own for the whole call: a move lasts
        // minutes to hours, and VACUUM of the coordinator's database must
        // not wait for it (the engine's statements take their own, and its
        // waits let go of the catalog snapshot).
        if (!in_own_transaction(
                [&] {
                    pgstat_report_activity(STATE_RUNNING, "SELECT sharding._job_execute($1, $2)");
                    (void)call_function(fn_execute, 2, a, &isnull);
                },
                false)) {
            QueryCancelPending = false;
            sleep_ms(200);
        }
        errors = 0;
    }
    runner_done = true;
    proc_exit(0);
}

namespace {
// The start of a worker that runs the extension's own function `fn` (of
// no arguments) in database arg, as the extension's owner, shown as
// appname: fn's OID (the worker now runs as the owner), or InvalidOid
// where the extension is not installed (nothing runs there).
Oid start_owner_worker(Datum arg, const char *appname, const char *fn, Extension *ext) {
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    connect_worker(DatumGetObjectId(arg), appname);
    const Oid f = own_function(ext, fn);
    if (OidIsValid(f)) SetUserIdAndSecContext(ext->owner, SECURITY_LOCAL_USERID_CHANGE);
    return f;
}
}  // namespace

// A scanner: in one database, recovers the moves whose executor died and
// starts runners for every unfinished job (at its commit).
void sharding_jobs_scanner_main(Datum arg) {
    Extension ext{InvalidOid, InvalidOid, InvalidOid};
    const Oid pickup = start_owner_worker(arg, "sharding move scanner", "_job_pickup", &ext);
    if (!OidIsValid(pickup)) proc_exit(0);
    // A server promoted from a standby of the coordinator (or restored from
    // its backup) leaves moves and jobs alone until take_over has made the
    // nodes follow it (take_over.cpp; it asks for a scan when it is done).
    Oid needed = InvalidOid;
    bool wait_takeover = false;
    (void)in_own_transaction([&] { needed = extension_function(ext, "_take_over_needed", 0, nullptr); });
    if (OidIsValid(needed))
        (void)in_own_transaction([&] {
            bool isnull;
            Datum d = call_function(needed, 0, nullptr, &isnull);
            wait_takeover = !isnull && DatumGetBool(d);
        });
    if (wait_takeover) {
        ereport(LOG, (errmsg("sharding move scanner: this server was promoted or restored; moves and jobs wait for "
                             "sharding.take_over()")));
        proc_exit(0);
    }
    // (Moves it cannot roll back or finish yet, a node still out of reach,
    // have this database scanned again a little later: _move_recover asks
    // for it.)
    call_in_own_transaction(pickup, "SELECT sharding._job_pickup()");
    // Two-phase transactions this database (a coordinator) left prepared
    // on nodes (src/ddl): resolved as it decided; what is left (a node out
    // of reach, a transaction still deciding) has it scanned again soon.
    bool left = true;
    bool *left_p = &left;
    (void)in_own_transaction([left_p] {
        pgstat_report_activity(STATE_RUNNING, "SELECT sharding.recover_transactions()");
        sharding::ddl_recover_in_worker(left_p);
    });
    if (left) sharding::jobs_recheck(MyDatabaseId, true);
    // Nodes this coordinator's take_over could not reach (take_over.cpp):
    // re-pointed now, or another scan is asked for.
    Oid pending = InvalidOid;
    (void)in_own_transaction([&] { pending = extension_function(ext, "_take_over_pending", 0, nullptr); });
    if (OidIsValid(pending)) call_in_own_transaction(pending, "SELECT sharding._take_over_pending()");
    proc_exit(0);
}

// A cleaner: in one database, right after a move returned with its
// clean-up deferred (sharding.move_cleanup, docs/moves.md), finishes the
// moves whose executor let go of them (_move_recover, as the extension's
// owner, as a scanner does): the deferred delete at the source first. One
// it cannot finish (a node out of reach) stays in the journal for the
// launcher's scans (preloaded) or the next call; it asks for a scan.
void sharding_jobs_cleaner_main(Datum arg) {
    // However it ends (terminated too), the launcher scans the database
    // again if a clean-up is left (with the library preloaded).
    before_shmem_exit([](int, Datum) { sharding::jobs_recheck(MyDatabaseId); }, 0);
    Extension ext{InvalidOid, InvalidOid, InvalidOid};
    const Oid recover = start_owner_worker(arg, "sharding move cleaner", "_move_recover", &ext);
    if (!OidIsValid(recover)) proc_exit(0);
    // Deferred clean-ups nobody carries out now (no executor holds their
    // lock): tried again after 1, 2, 4, 8 and 10 s while any is left (a
    // cancelled delete, a source out of reach), then left to the launcher
    // and the next call.
    static const char *const kLeft =
        "SELECT pg_catalog.count(*) FROM sharding.move_journal m WHERE m.phase = " PHASE_SQL(CLEANUP) " AND m.cleanup_deferred "
        "AND NOT EXISTS (SELECT FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.classid = (pg_catalog.hashtext('sharding.move_journal'))::oid AND l.objsubid = 2 "
        "AND l.objid = ((m.move OPERATOR(pg_catalog.%) 2147483647)::integer)::oid "
        "AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d "
        "WHERE d.datname = pg_catalog.current_database()))";
    long wait = 1000;
    for (int attempt = 0; attempt < 6; attempt++) {
        if (attempt > 0) {
            sleep_ms(wait);
            wait = std::min(wait * 2, 10000L);
        }
        call_in_own_transaction(recover, "SELECT sharding._move_recover()");
        int64 left = 0;
        if (!in_own_transaction([&] {
                if (SPI_execute(kLeft, true, 1) == SPI_OK_SELECT && SPI_processed == 1) {
                    bool isnull;
                    Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
                    if (!isnull) left = DatumGetInt64(d);
                }
            }))
            break;
        if (left == 0) break;
    }
    proc_exit(0);
}

// A group reaper: in one database, the worker groups whose members' leases
// expired are dealt again (sharding._group_reap, as the extension's owner,
// as a scanner runs _job_pickup).
void sharding_groups_reaper_main(Datum arg) {
    // However it ends (an error too), the launcher may start the next one.
    static bool no_extension = false;
    before_shmem_exit([](int, Datum db) { sharding::groups_reaper_done(DatumGetObjectId(db), no_extension); }, arg);
    Extension ext{InvalidOid, InvalidOid, InvalidOid};
    const Oid reap = start_owner_worker(arg, "sharding group reaper", "_group_reap", &ext);
    if (!OidIsValid(reap)) {
        no_extension = true;  // its entry in the shared table goes
        proc_exit(0);
    }
    call_in_own_transaction(reap, "SELECT sharding._group_reap()");
    proc_exit(0);
}

namespace {

// Scanners still running after kScanWaitMs (a recovery waiting for a node
// that does not answer, a lock): the launcher goes on without them (RB-3 of
// the 1.3 review: one slow database held up every other database's scans
// and runner starts) and starts no second scanner in their database until
// they have ended (reap_scanners, each round). A recheck (or a scan asked
// for) of a database whose scanner still runs is done once it has ended.
constexpr int kMaxSlowScanners = 8;
constexpr long kScanWaitMs = 1000;
struct SlowScanner {
    Oid db;
    BackgroundWorkerHandle *handle;
    bool recheck;  // the scan was a recheck: end_recheck when it ends
    bool again;    // another scan was asked for meanwhile
};
SlowScanner slow_scanners[kMaxSlowScanners];

SlowScanner *slow_scanner_of(Oid db) {
    for (SlowScanner &s : slow_scanners)
        if (s.handle != nullptr && s.db == db) return &s;
    return nullptr;
}

// Waits (at most kScanWaitMs, interruptibly) for a scanner to end; whether it did.
bool wait_scanner(BackgroundWorkerHandle *handle) {
    TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kScanWaitMs);
    for (;;) {
        pid_t pid;
        if (GetBackgroundWorkerPid(handle, &pid) == BGWH_STOPPED) return true;
        long left = (long)((until - GetCurrentTimestamp()) / 1000);
        if (left <= 0) return false;
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, left < 50 ? left : 50,
                        PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
    }
}

void end_recheck(Oid db, bool scanned);

// The slow scanners that have ended since: their rechecks end, and a
// database asked for meanwhile is rechecked at once.
void reap_scanners() {
    for (SlowScanner &s : slow_scanners) {
        if (s.handle == nullptr) continue;
        pid_t pid;
        if (GetBackgroundWorkerPid(s.handle, &pid) != BGWH_STOPPED) continue;
        pfree(s.handle);
        s.handle = nullptr;
        if (s.recheck) end_recheck(s.db, true);
        if (s.again) sharding::jobs_recheck(s.db);
    }
}

enum class Scan { Done, Running, NoSlot };

// Starts a scanner in each of the databases, waiting for each at most
// kScanWaitMs (a scan is short); NoSlot if no background worker slot was
// free (then the launcher tries again at its next round). A database whose
// scanner still runs gets no second one now (it is scanned again once that
// one ends). Group reapers (groups): started, not waited for (a reaper must
// never hold up the launcher; it clears its database's reaping mark when it
// ends, groups_reaper_done).
Scan scan_list(const Oid *dbs, int n, bool groups = false, bool recheck = false) {
    Scan result = Scan::Done;
    for (int i = 0; i < n; i++) {
        if (!groups) {
            if (SlowScanner *running = slow_scanner_of(dbs[i])) {
                running->again = true;
                if (recheck) running->recheck = true;  // its end ends this recheck
                result = Scan::Running;
                continue;
            }
        }
        BackgroundWorker w;
        if (groups) {  // worker groups' leases (src/routing/groups.cpp)
            init_worker(&w, "sharding_groups_reaper_main", "sharding group reaper", BGW_NEVER_RESTART);
            snprintf(w.bgw_name, BGW_MAXLEN, "sharding group reaper for database %u", dbs[i]);
        } else {
            init_worker(&w, "sharding_jobs_scanner_main", "sharding move scanner", BGW_NEVER_RESTART);
            snprintf(w.bgw_name, BGW_MAXLEN, "sharding move scanner for database %u", dbs[i]);
        }
        w.bgw_main_arg = ObjectIdGetDatum(dbs[i]);
        w.bgw_notify_pid = MyProcPid;
        SlowScanner *free_slot = nullptr;
        for (SlowScanner &s : slow_scanners)
            if (s.handle == nullptr) {
                free_slot = &s;
                break;
            }
        BackgroundWorkerHandle *handle = nullptr;
        if ((!groups && free_slot == nullptr) || !RegisterDynamicBackgroundWorker(&w, &handle)) {
            if (groups)
                for (int j = i; j < n; j++) sharding::groups_reaper_done(dbs[j], false);
            return Scan::NoSlot;
        }
        if (groups || wait_scanner(handle)) {
            pfree(handle);
            continue;
        }
        *free_slot = SlowScanner{dbs[i], handle, recheck, false};
        result = Scan::Running;
    }
    return result;
}

// The wait before a database's next recheck, after `tries` scans that left
// moves unresolved: 1, 2, 4, 8, then 10 s.
long recheck_delay_ms(int tries) { return tries >= 4 ? 10000L : 1000L << tries; }

// Takes the rechecks that are due (marked scanning) into dbs (when given);
// returns how many, and in *next_ms the milliseconds until the next one not
// due yet is (-1: none).
int take_due_rechecks(Oid *dbs, long *next_ms) {
    TimestampTz now = GetCurrentTimestamp();
    int n = 0;
    *next_ms = -1;
    SpinLockAcquire(&shared->mutex);
    for (Recheck &r : shared->rechecks) {
        if (!OidIsValid(r.db) || r.scanning) continue;
        long ms = r.due <= now ? 0 : (long)((r.due - now) / 1000) + 1;
        if (ms == 0 && dbs != nullptr) {
            r.scanning = true;
            r.again = false;
            dbs[n++] = r.db;
        } else if (*next_ms < 0 || ms < *next_ms) {
            *next_ms = ms;
        }
    }
    SpinLockRelease(&shared->mutex);
    return n;
}

// After a recheck's scan: asked for again meanwhile (moves left) -> due
// after the next delay; else done.
void end_recheck(Oid db, bool scanned) {
    TimestampTz now = GetCurrentTimestamp();
    SpinLockAcquire(&shared->mutex);
    for (Recheck &r : shared->rechecks) {
        if (r.db != db || !r.scanning) continue;
        r.scanning = false;
        if (r.again || !scanned) {
            if (scanned && !r.soon) r.tries++;
            r.again = false;
            r.due = TimestampTzPlusMilliseconds(now, recheck_delay_ms(r.tries));
        } else {
            r = Recheck{};
        }
    }
    SpinLockRelease(&shared->mutex);
}

// Starts a scanner in every database that accepts connections, one at a
// time (each is short).
void scan_databases() {
    MemoryContext keep = CurrentMemoryContext;
    Oid *dbs = nullptr;
    int n = 0, cap = 0;
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    (void)GetTransactionSnapshot();
    Relation rel = table_open(DatabaseRelationId, AccessShareLock);
    TableScanDesc scan = table_beginscan_catalog(rel, 0, nullptr);
    HeapTuple tup;
    while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection))) {
        Form_pg_database d = reinterpret_cast<Form_pg_database>(GETSTRUCT(tup));
        if (!d->datallowconn || d->datistemplate) continue;
        MemoryContext old = MemoryContextSwitchTo(keep);
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            dbs = static_cast<Oid *>(dbs ? repalloc(dbs, cap * sizeof(Oid)) : palloc(cap * sizeof(Oid)));
        }
        dbs[n++] = d->oid;
        MemoryContextSwitchTo(old);
    }
    table_endscan(scan);
    table_close(rel, AccessShareLock);
    CommitTransactionCommand();

    // No background worker slot now: try again at the next round.
    if (scan_list(dbs, n) == Scan::NoSlot) wake_launcher();
    if (dbs) pfree(dbs);
}

// Scans the databases whose recheck is due; the milliseconds until the
// next one is (-1: none).
long scan_rechecks() {
    Oid dbs[kMaxRechecks];
    long next_ms = -1;
    int n = take_due_rechecks(dbs, &next_ms);
    for (int i = 0; i < n; i++) {
        // A scanner still running ends its recheck itself (reap_scanners).
        Scan r = scan_list(&dbs[i], 1, false, true);
        if (r != Scan::Running) end_recheck(dbs[i], r == Scan::Done);
    }
    if (n > 0) (void)take_due_rechecks(nullptr, &next_ms);
    return next_ms;
}

}  // namespace

void sharding_jobs_launcher_main(Datum) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    SpinLockAcquire(&shared->mutex);
    shared->launcher_latch = MyLatch;
    shared->pending = true;  // at start: every database, every unfinished job
    SpinLockRelease(&shared->mutex);
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        reap_scanners();
        SpinLockAcquire(&shared->mutex);
        bool scan = shared->pending;
        shared->pending = false;
        SpinLockRelease(&shared->mutex);
        if (scan) scan_databases();
        long timeout = scan ? 5000 : 30000;
        long next = scan_rechecks();
        if (next >= 0 && next < timeout) timeout = next;
        // Worker groups whose next lease expiry has come: a short reaper
        // in each such database (src/routing/groups.cpp).
        Oid due[8];
        int ndue = sharding::groups_take_due(due, lengthof(due), &next);
        if (ndue > 0) (void)scan_list(due, ndue, true);
        if (ndue > 0) (void)sharding::groups_take_due(due, 0, &next);
        if (next >= 0 && next < timeout) timeout = next;
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout, PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
    }
}

// _job_launch(job bigint, runners integer, runas oid): boolean. Asks for
// `runners` background runners of `job`, started when this transaction
// commits, running as `runas` (which must be the caller unless the caller
// is a superuser). False when the library is not preloaded (then
// rebalance_run carries the job out).
namespace sharding {
bool jobs_launch(int64 job, int32 runners, Oid runas) {
    if (shared == nullptr) return false;
    // Another role's runners: a superuser, or the extension's owner (the
    // launcher's scanner, which starts the runners of every live job; each
    // runner checks its job's role's rights again).
    bool owner = false;
    if (runas != GetUserId() && !superuser())
        sharding::pg_call([&] {
            Extension e = find_extension();
            owner = OidIsValid(e.oid) && e.owner == GetUserId();
        });
    if (runas != GetUserId() && !superuser() && !owner)
        sharding::fail(ERRCODE_INSUFFICIENT_PRIVILEGE, "only a superuser may start move workers as another role");
    if (runners <= 0) return true;
    if (!callback_registered) {
        sharding::pg_call([] { RegisterXactCallback(jobs_xact_callback, nullptr); });
        callback_registered = true;
    }
    if (n_wishes == kMaxWishes) {
        wake_launcher();  // the launcher's next scan starts them
        return true;
    }
    wishes[n_wishes++] = Wish{job, runas, runners};
    return true;
}

int jobs_runners(int64 job) {
    if (shared == nullptr) return 0;
    return runners_of(MyDatabaseId, job);
}
}  // namespace sharding

SHARDING_FUNCTION(sharding__job_launch) {
    PG_RETURN_BOOL(sharding::jobs_launch(PG_GETARG_INT64(0), PG_GETARG_INT32(1), PG_GETARG_OID(2)));
}

// _job_runners(job bigint): integer, runners of job in this database now.
SHARDING_FUNCTION(sharding__job_runners) {
    PG_RETURN_INT32(sharding::jobs_runners(PG_GETARG_INT64(0)));
}

namespace sharding {
int jobs_failed_starts(int64 job) noexcept {
    if (shared == nullptr) return 0;
    int n = 0;
    SpinLockAcquire(&shared->mutex);
    for (const FailedStarts &f : shared->failed_starts)
        if (f.db == MyDatabaseId && f.job == job) n = f.count;
    SpinLockRelease(&shared->mutex);
    return n;
}

namespace {

// Installed as jobs_poke_launcher (src/pg/launcher.hpp): wakes the launcher
// for its next round without a scan of the databases.
void poke_launcher() noexcept {
    if (shared == nullptr) return;
    SpinLockAcquire(&shared->mutex);
    Latch *latch = shared->launcher_latch;
    SpinLockRelease(&shared->mutex);
    if (latch) SetLatch(latch);
}

// Installed as jobs_recheck (src/pg/launcher.hpp). soon: the database's
// two-phase transactions left in doubt (src/ddl) are retried every second
// until resolved, without the moves' back-off, so that they resolve within
// seconds of a node coming back.
void recheck(Oid db, bool soon) noexcept {
    if (shared == nullptr || !OidIsValid(db)) return;
    TimestampTz now = GetCurrentTimestamp();
    bool placed = false;
    SpinLockAcquire(&shared->mutex);
    for (Recheck &r : shared->rechecks)
        if (r.db == db) {
            if (r.scanning) r.again = true;  // else it is due already
            if (soon) {
                r.soon = true;
                r.tries = 0;
            }
            placed = true;
            break;
        }
    if (!placed)
        for (Recheck &r : shared->rechecks)
            if (!OidIsValid(r.db)) {
                r = Recheck{db, 0, false, false, TimestampTzPlusMilliseconds(now, recheck_delay_ms(0)), soon};
                placed = true;
                break;
            }
    // No free entry: every database is scanned at the next round.
    if (!placed) shared->pending = true;
    Latch *latch = shared->launcher_latch;
    SpinLockRelease(&shared->mutex);
    if (latch) SetLatch(latch);
}

// Installed as jobs_clean_up (src/pg/launcher.hpp): a cleaner for db, a
// dynamic background worker (no shared memory of ours needed).
bool clean_up(Oid db) noexcept {
    if (!OidIsValid(db)) return false;
    BackgroundWorker w;
    init_worker(&w, "sharding_jobs_cleaner_main", "sharding move cleaner", BGW_NEVER_RESTART);
    snprintf(w.bgw_name, BGW_MAXLEN, "sharding move cleaner for database %u", db);
    w.bgw_main_arg = ObjectIdGetDatum(db);
    w.bgw_notify_pid = 0;
    if (RegisterDynamicBackgroundWorker(&w, nullptr)) return true;
    recheck(db, false);
    return false;
}

// Called from _PG_init: the setting, shared memory and the launcher, only
// when preloaded (without, rebalance_run carries jobs out).
}  // namespace

void jobs_init() {
    LauncherCalls calls;
    calls.recheck = recheck;
    calls.poke = poke_launcher;
    calls.clean_up = clean_up;
    set_launcher_calls(calls);
    // A PGC_POSTMASTER setting can only be defined while preloading.
    if (!process_shared_preload_libraries_in_progress) return;
    DefineCustomIntVariable("sharding.max_move_workers",
                            "Background workers running rebalance jobs' moves at once, per server.",
                            "Takes effect at server start; needs shared_preload_libraries = 'sharding'.",
                            &max_move_workers, 2, 1, kMaxWorkersLimit, PGC_POSTMASTER, 0, nullptr, nullptr,
                            nullptr);
    shmem::add({"sharding move workers", sizeof(Shared), nullptr, nullptr, jobs_shmem_attach});

    BackgroundWorker w;
    init_worker(&w, "sharding_jobs_launcher_main", "sharding move launcher", 10);
    snprintf(w.bgw_name, BGW_MAXLEN, "%s", "sharding move launcher");
    RegisterBackgroundWorker(&w);
}
}  // namespace sharding
