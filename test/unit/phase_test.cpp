// One vocabulary for a move's phases (issue 37; src/move/phase.hpp): the
// enum's texts are the journal's (the check constraint of
// sharding.move_journal.phase, sql/install/90_move.sql), in the order a move
// goes through them; docs/moves.md lists the steps by the same names in
// that order; and no file of src/ but phase.hpp spells a phase in the SQL
// it builds (its string literals), so a renamed phase cannot leave a stale
// copy behind; the SQL of sql/install/ compares phase with phases only. Run from the repository's root (test/harness/unit.sh).
#include "move/phase.hpp"
#include "tap.hpp"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using sharding::move::Phase;

namespace {

const Phase kAll[] = {Phase::Queued,  Phase::Copying, Phase::CatchingUp, Phase::Cutover,
                      Phase::Cleanup, Phase::Done,    Phase::Failed,     Phase::Cancelled};

std::string slurp(const std::string &path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string joined(const std::vector<std::string> &v) {
    std::string s;
    for (const std::string &x : v) s += (s.empty() ? "" : " ") + x;
    return s;
}

// The contents of a C++ file's string literals, comments skipped.
std::vector<std::string> literals(const std::string &src) {
    std::vector<std::string> out;
    for (size_t i = 0; i < src.size(); i++) {
        if (src.compare(i, 2, "//") == 0) {
            i = src.find('\n', i);
            if (i == std::string::npos) break;
        } else if (src.compare(i, 2, "/*") == 0) {
            i = src.find("*/", i + 2);
            if (i == std::string::npos) break;
            i++;
        } else if (src[i] == '\'') {
            // a character literal ('"', '\'')
            i++;
            if (i < src.size() && src[i] == '\\') i++;
            i++;
        } else if (src[i] == '"') {
            std::string lit;
            for (i++; i < src.size() && src[i] != '"'; i++) {
                if (src[i] == '\\' && i + 1 < src.size()) lit += src[i++];
                lit += src[i];
            }
            out.push_back(lit);
        }
    }
    return out;
}

}  // namespace

int main() {
    std::vector<std::string> texts;
    for (Phase p : kAll) texts.push_back(sharding::move::to_text(p));

    // 1. The journal's check constraint lists the same texts, in this order.
    const std::string install = slurp("sql/install/90_move.sql");
    std::smatch m;
    std::vector<std::string> checked;
    if (std::regex_search(install, m, std::regex(R"(CHECK \(phase IN \(([^)]*)\)\))"))) {
        const std::string list = m[1];
        const std::regex word("'([a-z_]+)'");
        for (std::sregex_iterator w(list.begin(), list.end(), word), end; w != end; ++w) checked.push_back((*w)[1]);
    }
    tap::check(joined(checked) == joined(texts), "phase.hpp's texts are the journal's check constraint's, in order");
    if (joined(checked) != joined(texts))
        std::printf("# phase.hpp: %s\n# 90_move.sql: %s\n", joined(texts).c_str(), joined(checked).c_str());

    // 2. Each text names its phase and nothing else does.
    bool round_trip = true;
    for (Phase p : kAll) round_trip = round_trip && sharding::move::from_text(sharding::move::to_text(p)) == p;
    tap::check(round_trip, "from_text(to_text(p)) is p for every phase");
    tap::check(!sharding::move::from_text("catchup") && !sharding::move::from_text("switched") &&
                   !sharding::move::from_text("setup"),
               "the 1.2 step names (setup, catchup, switched) name no phase");

    // 3. docs/moves.md's "Steps" lists the move's phases from copying to
    // cleanup, each once, in the code's order.
    const std::string docs = slurp("docs/moves.md");
    const size_t at = docs.find("\n## Steps");
    std::vector<std::string> listed;
    if (at != std::string::npos) {
        const size_t end = docs.find("\n## ", at + 1);
        const std::string section = docs.substr(at, end == std::string::npos ? std::string::npos : end - at);
        const std::regex item(R"(\n\d+\. \*\*`([a-z_]+)`\*\*)");
        for (std::sregex_iterator w(section.begin(), section.end(), item), e; w != e; ++w) listed.push_back((*w)[1]);
    }
    tap::check(joined(listed) == "queued copying catching_up cutover cleanup",
               "docs/moves.md's Steps are queued, copying, catching_up, cutover, cleanup");
    if (joined(listed) != "queued copying catching_up cutover cleanup")
        std::printf("# docs/moves.md lists: %s\n", joined(listed).c_str());

    // 4. No other file of src/ spells a phase in a string literal: the
    // phases only a move has anywhere (or as a whole literal, as C++
    // compares them, and the 1.2 step names too), the others (shared with
    // a job's states) next to "phase" or as the list of final phases.
    const std::regex own("'(copying|catching_up|cutover|cleanup)'");
    const std::regex shared("'(queued|done|failed|cancelled)'");
    const std::regex finals("'done', 'failed', 'cancelled'");
    const std::regex word("(copying|catching_up|cutover|cleanup|catchup|switched)");
    std::vector<std::string> spelt;
    for (const auto &e : std::filesystem::recursive_directory_iterator("src")) {
        const std::string path = e.path().generic_string();
        if (!e.is_regular_file() || path == "src/move/phase.hpp") continue;
        if (e.path().extension() != ".cpp" && e.path().extension() != ".hpp") continue;
        for (const std::string &lit : literals(slurp(path)))
            if (std::regex_search(lit, own) || std::regex_search(lit, finals) || std::regex_match(lit, word) ||
                (lit.find("phase") != std::string::npos && std::regex_search(lit, shared)))
                spelt.push_back(path + ": \"" + lit + "\"");
    }
    tap::check(spelt.empty(), "no file of src/ but phase.hpp spells a phase in its SQL");
    for (const std::string &s : spelt) std::printf("# %s\n", s.c_str());
    // 5. The SQL of sql/install/ compares phase only with phases (a phase
    // renamed in the check constraint and phase.hpp but not in a view or a
    // function there would compare with a word no row holds).
    const std::regex compared(R"(phase\s*(?:=|<>)\s*'([a-z_]+)'|phase\s+(?:NOT\s+)?IN\s*\(([^)]*)\))");
    const std::regex quoted("'([a-z_]+)'");
    std::vector<std::string> strange;
    for (const auto &e : std::filesystem::directory_iterator("sql/install")) {
        if (e.path().extension() != ".sql") continue;
        const std::string sql = slurp(e.path().string());
        for (std::sregex_iterator c(sql.begin(), sql.end(), compared), end; c != end; ++c) {
            const std::string words = (*c)[1].matched ? "'" + (*c)[1].str() + "'" : (*c)[2].str();
            for (std::sregex_iterator w(words.begin(), words.end(), quoted); w != end; ++w)
                if (!sharding::move::from_text((*w)[1])) strange.push_back(e.path().string() + ": " + (*c)[0].str());
        }
    }
    tap::check(strange.empty(), "sql/install/ compares phase with phases only");
    for (const std::string &s : strange) std::printf("# %s\n", s.c_str());
    return tap::status();
}
