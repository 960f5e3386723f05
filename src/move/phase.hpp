// A move's phases (docs/moves.md, "Steps"): the values of the journal's
// phase column (sharding.move_journal's check constraint,
// sql/install/90_move.sql), the phases move_progress shows, and the step
// the engine is in (move_online.cpp: OnlineMove::step). Each is spelt here
// and nowhere else in src/: C++ uses Phase and to_text, SQL built in C++
// the PHASE_SQL literals below (test/unit/phase_test.cpp checks both
// against the journal's check constraint, and that no other file of src/
// spells a phase in its SQL).
#pragma once

#include <optional>
#include <string>

// The texts, in the order a move goes through them.
#define PHASE_TEXT_QUEUED "queued"
#define PHASE_TEXT_COPYING "copying"
#define PHASE_TEXT_CATCHING_UP "catching_up"
#define PHASE_TEXT_CUTOVER "cutover"
#define PHASE_TEXT_CLEANUP "cleanup"
#define PHASE_TEXT_DONE "done"
#define PHASE_TEXT_FAILED "failed"
#define PHASE_TEXT_CANCELLED "cancelled"

// A phase as a SQL literal, for SQL built in C++ from adjacent string
// literals: "... WHERE m.phase = " PHASE_SQL(QUEUED) " ..." is
// ... WHERE m.phase = 'queued' ...
#define PHASE_SQL(P) "'" PHASE_TEXT_##P "'"
// The final phases, a SQL list (phase IN / NOT IN it): the move has ended.
#define PHASE_SQL_FINAL "(" PHASE_SQL(DONE) ", " PHASE_SQL(FAILED) ", " PHASE_SQL(CANCELLED) ")"
// Not in flight, a SQL list: not started yet, or ended (phase NOT IN it:
// the move is copying, catching up, in its cutover or cleaning up).
#define PHASE_SQL_NOT_IN_FLIGHT "(" PHASE_SQL(QUEUED) ", " PHASE_SQL(DONE) ", " PHASE_SQL(FAILED) ", " PHASE_SQL(CANCELLED) ")"
// Streaming, a SQL list: the destination applies the slot's changes and
// the owner has not switched (the catch-up and the cutover).
#define PHASE_SQL_STREAMING "(" PHASE_SQL(CATCHING_UP) ", " PHASE_SQL(CUTOVER) ")"

namespace sharding::move {

enum class Phase { Queued, Copying, CatchingUp, Cutover, Cleanup, Done, Failed, Cancelled };

namespace phase_detail {
struct PhaseText {
    Phase phase;
    const char *text;
};
inline constexpr PhaseText kPhaseTexts[] = {
    {Phase::Queued, PHASE_TEXT_QUEUED},   {Phase::Copying, PHASE_TEXT_COPYING},
    {Phase::CatchingUp, PHASE_TEXT_CATCHING_UP}, {Phase::Cutover, PHASE_TEXT_CUTOVER},
    {Phase::Cleanup, PHASE_TEXT_CLEANUP}, {Phase::Done, PHASE_TEXT_DONE},
    {Phase::Failed, PHASE_TEXT_FAILED},   {Phase::Cancelled, PHASE_TEXT_CANCELLED}};
}  // namespace phase_detail

// The text the journal stores.
inline const char *to_text(Phase p) {
    for (const phase_detail::PhaseText &t : phase_detail::kPhaseTexts)
        if (t.phase == p) return t.text;
    return "";
}

// The phase the journal's text names; none for any other text.
inline std::optional<Phase> from_text(const std::string &s) {
    for (const phase_detail::PhaseText &t : phase_detail::kPhaseTexts)
        if (s == t.text) return t.phase;
    return std::nullopt;
}

// A move in one of these has ended.
inline bool is_final(Phase p) { return p == Phase::Done || p == Phase::Failed || p == Phase::Cancelled; }

}  // namespace sharding::move
