// What the steps of an online move (move_online.cpp) share with the rest
// of the orchestration (move_orchestrate.cpp: the connections, the
// journal's helpers, the checks of what both ends have, the verification).
#pragma once

#include "move/move_engine.hpp"
#include "move/phase.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sharding::move {

// How many times a cutover tries to freeze the shard within
// sharding.move_freeze_timeout before the move fails with 55P03.
constexpr int kFreezeAttempts = 3;
// sharding.move_freeze_timeout (ms): how long a cutover waits for the
// shard's writers (docs/moves.md, "Bounded freeze"; move_orchestrate.cpp).
extern int move_freeze_timeout;

namespace online {

// The tables a move copies, with their filter.
struct CopyTable {
    std::string rel, filter, cols;
    std::vector<std::string> attnames;
};
// Rows and bytes copied.
struct Copied {
    int64 rows = 0;
    int64 bytes = 0;
};
// A table whose copies differ: its counts and checksums at both ends.
struct Difference {
    std::string table, source, destination;
};
// The destination's connection that holds the verification's snapshot.
inline constexpr const char *kVerify = "sharding_move_verify";

// A DEBUG1 line with the time; the journal's phase of the live move.
void debug_at(const std::string &what);
void phase(const std::string &map, int32 logical, Phase ph);
// ARRAY['a', 'b']::text[].
std::string text_array(const std::vector<std::string> &items);
// _move_pull's answer; what the pull has sent so far; noted in the journal.
Copied pulled_pair(const Text &pulled);
Copied copy_progress(const std::string &name);
void note_copied(const std::string &live_where, int64 rows, int64 bytes);
void note_expected(const std::string &live_where, const std::vector<CopyTable> &tables, bool shard_move);
// The verification: the destination's snapshot taken at the cutover, the
// copies compared after the switch.
void hold_verify_snapshot(const std::string &destination);
std::optional<Difference> compare_copies(const std::vector<CopyTable> &tables);
// What an end has: a replica identity carrying the key (55000), a table's
// columns and their signature.
void check_identity(const char *conn, const Text &where, const MoveTable &t, const std::string &map);
std::vector<std::pair<std::string, std::string>> columns_of(const char *conn, const std::string &rel, bool all);
std::string column_signature(const char *conn, const std::string &rel);
// The move's replication objects (move_orchestrate.cpp): its subscription
// at the destination (sharding_move_dst, never contacting the source), its
// slot, publication and decoding row at the source (sharding_move_src, a
// dead executor's session there ended first); a 1.2 move's filter triggers
// at the destination; the sessions of a node named after the move, ended
// and waited for.
void drop_subscription(const std::string &name);
void drop_slot_and_publication(const std::string &name);
void drop_triggers(const std::string &map, const std::string &name);
void stop_backends(const char *conn, const std::string &name);

}  // namespace online

// The tables' storage at an end, and the cutover's checks that neither end
// rewrote (storage) or altered (columns) a table since.
std::string storage_of(const char *conn, const std::string &rels, const std::string &others);
std::string other_shards_leaves(const std::vector<MoveTable> &tables, const std::string &shards,
                                const std::string &logical);
void hold_storage(const char *conn, const std::string &table_list, const std::string &noted, const Text &where,
                  const std::string &map, int32 logical);
void hold_columns(const char *conn, const std::vector<online::CopyTable> &tables,
                  const std::vector<std::string> &noted, const Text &where, const std::string &map, int32 logical);

}  // namespace sharding::move
