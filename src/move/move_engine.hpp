// What the coordinator's orchestration of an online move shares
// (docs/moves.md): the session's named connections of the move
// (sharding_move_src, _dst, _self) and the journal written over _self; the
// move's tables, its filter, its connections and waits; the move itself
// and its end (finish, undo), the deletes of its rows.
//
// move_online.cpp: the move as its named steps (_move_online);
// move_orchestrate.cpp: its end, undo and the SQL wrappers;
// move_journal.cpp: the journal interface (journal.hpp) and the public
// move_shard_online and isolate; move_delete.cpp: the deletes of a
// shard's rows; move_support.cpp: the named connections and the journal's
// statements. SPI, quoting and subtransactions are src/pg/spi.hpp's; the
// libpq connections src/remote/'s.
#pragma once

#include "move/phase.hpp"
#include "pg/spi.hpp"
#include "remote/move_remote.hpp"

#include <functional>
#include <string>
#include <vector>

namespace sharding::move {

extern const char *const kSrc;   // sharding_move_src: the move's source
extern const char *const kDst;   // sharding_move_dst: its destination
extern const char *const kSelf;  // sharding_move_self: this database (the journal)
extern const char *const kLive;  // a journal row's phase is not final

// A statement over a named connection: a query's first value, a command's
// tag (nullopt: NULL).
Text dbl(const char *conn, const std::string &sql);
// A statement on the journal over sharding_move_self
// (committed at once, whatever this transaction does); its first value.
Text journal(const std::string &sql);

// ------------------------------------------------------------------ the move

// _move_name: the publication, slot, subscription and origin of a move
// (with tag: sharding_move_<tag>_<map>_<logical>; without: 1.3's name).
std::string move_name(const std::string &map, int32 logical, const std::string &tag = std::string());
// This coordinator's tag (md5 of the system identifier and database OID).
std::string coordinator_tag();
// Whether move_journal has a column (a database whose SQL is older than
// the library: the columns 1.4 added are missing until ALTER EXTENSION).
bool journal_has(const char *column);
// Whether move_journal has its column name.
bool journal_has_name();
// The name of the live move of a shard, as its journal row stores it (a
// 1.3 row: 1.3's name; no live row: a new, tagged name).
std::string journal_move_name(const std::string &map, int32 logical);
// A name stored in the journal, checked to be a move name of that shard
// (any tag); XX001 otherwise.
const std::string &checked_name(const std::string &map, int32 logical, const std::string &stored);
// Origin states free at a node over a named connection (review RB-9).
int free_origin_states(const char *conn);
// Before the switch: the origin states of the delete at the source after it
// (name, name_1 .. up to sharding.move_parallel), created and advanced so
// that each holds one; 53400 naming `node` when there are none.
void reserve_origins(const char *conn, const std::string &name, const std::string &node);
// After a finish or an undo: every origin this coordinator's moves left at
// that node (the move's own, reserved or of parts not used, and those an
// earlier drop found in use), dropped unless in use or a live move's.
void drop_left_origins(const char *conn, const std::string &name);

// A distributed table of a map, as _move_tables returns it.
struct MoveTable {
    std::string rel;             // schema-qualified, quoted
    std::string key_column;
    Oid key_type = InvalidOid;   // a domain's base type; InvalidOid: no such column
    std::string cols, coldefs, vals, pk_match;
    std::vector<std::string> attnames;  // the copied columns (not generated), in order
};
std::vector<MoveTable> move_tables(const std::string &map);
// _move_filter_sql: the condition selecting what a move carries.
// pins: a text[]'s text form, npins its elements.
std::string filter_sql(const Text &key_column, Oid key_type, const Text &shards, const Text &logical, const Text &key,
                       const Text &pins, int npins);
// The condition of each table of move_tables(map) (filter_sql with the
// map's shard count and pins as they are now), in its order; none for a
// map without tables.
struct TableFilter {
    std::string rel, filter;
};
std::vector<TableFilter> current_filters(const std::string &map, int32 logical, const Text &key);
// The condition of each of tables, with the shard count and the pins (a
// text[]'s text form, npins its elements) given.
std::vector<TableFilter> table_filters(const std::vector<MoveTable> &tables, const Text &shards, int32 logical,
                                       const Text &key, const Text &pins, int npins);

// _move_connect / _move_disconnect: sharding_move_src, _dst and _self.
void check_dsns(const Text &destination, const Text &source);
void connect(const Text &source, const Text &destination);
void disconnect();
// refuse_written: 25001 in a transaction that has written.
void refuse_written();
// _move_wait_flush: until the move's slot has confirmed the source's
// flushed WAL position (55000 after `seconds`); the seconds waited. The
// lag is noted on the journal rows `journal_where` selects (a WHERE
// clause naming the move's row, read through its index).
double wait_flush(const std::string &name, double seconds, const std::string &journal_where);

struct MoveResult {
    Text new_epoch;
    int64 moved = 0;
    bool deferred = false;  // the source's rows are still to be deleted (finish, defer)
    bool ended = false;     // finish ended the journal row (phase done, its figures)
};
// _move_online: the move itself; finish and _move_undo. may_defer: the
// source's rows may be left to a cleaner (sharding.move_cleanup =
// deferred; a direct move of a whole shard).
MoveResult move_online(const Text &map, int32 logical, const Text &key, const std::string &node,
                       bool may_defer = false);
// before_delete, when given, runs once the replication is dropped and
// before the source's rows are deleted (the verification). defer: returns
// -1 right after it, the journal row left in phase cleanup without an
// executor; the next finish of the move (_move_recover, the cleaner
// started by execute) deletes the rows.
// batched: the source's rows deleted a range of blocks per transaction
// (delete_shard_rows; the deferred clean-up's).
int64 finish(const std::string &map, int32 logical, const Text &key, const std::string &destination,
             const Text &new_epoch, const std::function<void()> &before_delete = nullptr, bool defer = false,
             bool batched = false);
bool undo(const std::string &map, int32 logical, const Text &key);  // false: finished instead
// A move's share of `parallel` sessions (sharding.move_parallel) for its
// copy or its delete, from the moves in flight (a live executor, copying to
// cleanup) as this coordinator's journal says, read over sharding_move_self
// (all of `parallel` when that connection is not open or cannot answer):
// - at its nodes: the moves into or out of a node of the live move of
//   (map, logical), itself included, divide `parallel` between them, so
//   that moves at once do not run more sessions at a node than one move
//   would (docs/performance.md: two moves of 2 sessions each on 2 cores
//   waited on each other's relation extension locks and CPUs);
// - on its hosts: the moves with an end on the host of one of its ends
//   (the journal's source_host and destination_host, as the nodes said,
//   sharding._move_host) divide that host's CPUs between them, so that
//   moves between different nodes of one machine (databases of one
//   instance, instances of one host) do not run more sessions than it has
//   CPUs for each. Nodes on machines of their own are not limited by it.
// At least 1 session.
struct Share {
    int sessions = 1;
    int at_nodes = 1;  // moves in flight at its nodes, itself included
    int on_host = 0;   // the most moves in flight on one of its hosts (0: unknown)
};
Share move_share(const std::string &map, int32 logical, int parallel);
// The rows of a move's shard deleted at one end over the named connection
// conn (kSrc after the switch, kDst when undone), by the plan its journal
// row fixed (move_delete.cpp); how many. batched: in one session, a
// transaction per range of blocks (a deferred clean-up: nobody waits for
// it, and no long transaction at the source holds up another move's slot
// or VACUUM there); otherwise all in one transaction per session,
// committed together.
int64 delete_shard_rows(const char *conn, const std::string &map, int32 logical, const Text &key,
                        bool batched = false);
void call_fn(const char *conn, const std::string &fn, const std::string &map, int32 logical);

// A live move as move_abandon reads its journal row.
struct LiveMove {
    int64 id = 0;
    std::string map, phase, source, destination;
    int32 logical = 0;
    Text key;
};
// move_abandon (move_abandon.cpp; docs/moves.md, "A node gone for good"):
// ends a live move whose source or destination is gone for good, the
// caller acting as the move's role; the node that owns the shard
// afterwards. 55000 while both ends answer, or while who owns the shard
// cannot be told without the node gone (unless force); 55006 while its
// executor is alive.
std::string abandon_move(const LiveMove &m, bool force);

}  // namespace sharding::move
