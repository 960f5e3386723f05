// A move's phases (docs/moves.md): the values of the journal's phase column
// (sharding.move_journal's check constraint, sql/install/90_move.sql), each
// mapped to its stored text here and nowhere else.
#pragma once

#include <optional>
#include <string>

namespace sharding::move {

enum class Phase { Queued, Copying, CatchingUp, Cutover, Cleanup, Done, Failed, Cancelled };

namespace detail {
struct PhaseText {
    Phase phase;
    const char *text;
};
inline constexpr PhaseText kPhaseTexts[] = {
    {Phase::Queued, "queued"},   {Phase::Copying, "copying"}, {Phase::CatchingUp, "catching_up"},
    {Phase::Cutover, "cutover"}, {Phase::Cleanup, "cleanup"}, {Phase::Done, "done"},
    {Phase::Failed, "failed"},   {Phase::Cancelled, "cancelled"}};
}  // namespace detail

// The text the journal stores.
inline const char *to_text(Phase p) {
    for (const detail::PhaseText &t : detail::kPhaseTexts)
        if (t.phase == p) return t.text;
    return "";
}

// The phase the journal's text names; none for any other text.
inline std::optional<Phase> from_text(const std::string &s) {
    for (const detail::PhaseText &t : detail::kPhaseTexts)
        if (s == t.text) return t.phase;
    return std::nullopt;
}

// A move in one of these has ended.
inline bool is_final(Phase p) { return p == Phase::Done || p == Phase::Failed || p == Phase::Cancelled; }

}  // namespace sharding::move
