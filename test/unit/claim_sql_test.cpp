// Unit tests of the claim-SQL builder (src/core/claim_sql.hpp): every
// statement reads only the parameters its executor passes (a parameter the
// description leaves NULL never appears in the text), the identifiers
// arrive as the caller quoted them, and each variant has its parts.
#include "core/claim_sql.hpp"

#include "tap.hpp"

#include <cctype>
#include <cstdio>
#include <string>

using namespace sharding::claim_sql;

namespace {

// Whether text reads parameter $n (not as the prefix of a longer number).
bool has_param(const std::string &text, int n) {
    const std::string p = "$" + std::to_string(n);
    for (size_t at = text.find(p); at != std::string::npos; at = text.find(p, at + 1)) {
        size_t end = at + p.size();
        if (end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
    }
    return false;
}

bool has(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

// The largest $n in text.
int max_param(const std::string &text) {
    int m = 0;
    for (size_t at = text.find('$'); at != std::string::npos; at = text.find('$', at + 1)) {
        size_t end = at + 1;
        int n = 0;
        while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) n = n * 10 + (text[end++] - '0');
        if (n > m) m = n;
    }
    return m;
}

}  // namespace

int main() {
    std::printf("1..19\n");
    const char *qname = "\"S 1\".\"Jobs\"";
    const char *key = "\"Key\"";
    bool unused_absent = true, used_present = true, quoted = true, bounded = true, no_unquoted = true;
    int shapes = 0;
    for (int cols = 0; cols < 8; cols++) {
        Table t{qname, (cols & 1) != 0, (cols & 2) != 0, (cols & 4) != 0};
        for (Filter f : {Filter::None, Filter::Shards, Filter::Node})
            for (int bits = 0; bits < 8; bits++) {
                ClaimPlan plan{f, (bits & 1) != 0, f == Filter::Node && (bits & 2) != 0, (bits & 4) != 0};
                std::string text = claim(t, f == Filter::None ? nullptr : key, plan);
                shapes++;
                for (int p = 0; p < ClaimParams; p++) {
                    bool used = claim_param_used(plan, static_cast<ClaimParam>(p));
                    if (!used && has_param(text, p + 1)) unused_absent = false;
                }
                // What every claim reads: worker, batch, lease; the filter's.
                if (!has_param(text, 1) || !has_param(text, 2) || !has_param(text, 3)) used_present = false;
                if (f == Filter::Shards && !(has_param(text, 5) && has_param(text, 6))) used_present = false;
                if (f == Filter::Node && !(has_param(text, 11) && has_param(text, 12))) used_present = false;
                if (plan.resume && !has_param(text, 10)) used_present = false;
                if (plan.reap && !plan.resume && !has_param(text, 4)) used_present = false;
                if (!has(text, "FROM \"S 1\".\"Jobs\"") || (f != Filter::None && !has(text, "\"Key\""))) quoted = false;
                if (has(text, "S 1.") || has(text, " Jobs ")) no_unquoted = false;
                if (max_param(text) > ClaimParams) bounded = false;
            }
    }
    tap::check(shapes == 192, "claim: 192 statements built (8 column sets x 3 filters x 8 flag sets)");
    tap::check(unused_absent, "claim: a parameter claim_param_used leaves NULL is never read by the statement");
    tap::check(used_present, "claim: worker, batch, lease, the filter's and the position's parameters are read");
    tap::check(quoted && no_unquoted, "claim: table and key column appear exactly as the caller quoted them");
    tap::check(bounded, "claim: no parameter past $12");

    Table full{"q", true, true, true};
    std::string sweep = claim(full, nullptr, {Filter::None, false, false, true});
    std::string resume = claim(full, nullptr, {Filter::None, true, false, true});
    tap::check(has(sweep, "expired AS MATERIALIZED") && has(sweep, "reaped AS"),
               "claim sweep: expired leases and the reaper");
    tap::check(!has(resume, "expired AS") && !has(resume, "reaped AS") && has(resume, "AS higher") &&
                   has(resume, "AS same") && has(resume, "AS lower"),
               "claim resume: no expired leases, three ranges of the pending index past the position");
    tap::check(!has(claim(full, nullptr, {Filter::None, false, false, false}), "reaped AS"),
               "claim without max_attempts: no reaper");
    std::string node = claim(full, "k", {Filter::Node, false, false, false});
    std::string handoff = claim(full, "k", {Filter::Node, false, true, false});
    tap::check(!has(node, "blocked") && has(handoff, "foreign_leases AS MATERIALIZED") && has(handoff, "FROM blocked b"),
               "claim_node: the handoff exclusion only with handoff");
    tap::check(has(sweep, "SET owner = $1, claim_expires = pg_catalog.now() OPERATOR(pg_catalog.+) $3") &&
                   has(sweep, "attempts = coalesce(sharding_claimed.attempts, 0) OPERATOR(pg_catalog.+) 1"),
               "claim: the UPDATE leases to $1 for $3 and counts attempts");
    tap::check(ClaimPlan{Filter::Node, true, true, true}.bits() != ClaimPlan{Filter::Node, true, false, true}.bits() &&
                   ClaimPlan{Filter::Shards, false, false, false}.bits() != ClaimPlan{Filter::None, false, false, false}.bits() &&
                   ClaimPlan{Filter::None, true, false, false}.bits() != ClaimPlan{Filter::None, false, false, true}.bits(),
               "ClaimPlan::bits tells the plans apart (the plan cache's key)");

    // The ordered pick and UPDATE.
    bool pick_bounded = true, shard_params = true, node_params = true, resume_params = true, reap_params = true,
         handoff_parts = true, pick_quoted = true, candidates_same = true, candidates_unlocked = true;
    for (int cols = 0; cols < 8; cols++) {
        OrderedTable q{{qname, (cols & 1) != 0, (cols & 2) != 0, (cols & 4) != 0}, key, "pg_catalog.text"};
        for (uint32_t v = 0; v < Update; v++) {
            uint32_t variant = v | Ordered;
            std::string text = pick(q, variant);
            if (max_param(text) > PickParams) pick_bounded = false;
            if (has_param(text, 4) != ((variant & ByShard) != 0) || has_param(text, 5) != ((variant & ByShard) != 0))
                shard_params = false;
            if (has_param(text, 7) != ((variant & ByNode) != 0 || (variant & Handoff) != 0)) node_params = false;
            if (has_param(text, 13) != ((variant & Resume) != 0) || has_param(text, 12) != ((variant & Resume) != 0))
                resume_params = false;
            if (has_param(text, 8) != ((variant & Reap) != 0)) reap_params = false;
            if (has(text, "foreign_leases") != ((variant & Handoff) != 0)) handoff_parts = false;
            if (!has(text, "\"Key\"::pg_catalog.text") || !has(text, "FROM \"S 1\".\"Jobs\" c")) pick_quoted = false;
            // The candidates statement: the pick's filter parameters and
            // walk, no lock and no head check (the caller's), no
            // parameter the caller leaves out.
            std::string cand = candidates(q, variant);
            for (int n = 2; n <= PickParams; n++)
                if (n != 3 && has_param(cand, n) != has_param(text, n)) candidates_same = false;
            if (has_param(cand, 1) || has_param(cand, 3) || max_param(cand) > PickParams) candidates_same = false;
            if (has(cand, "FOR UPDATE OF c") || has(cand, "CASE WHEN EXISTS")) candidates_unlocked = false;
        }
        std::string up = update(q);
        if (max_param(up) != UpdateParams) pick_bounded = false;
    }
    tap::check(pick_bounded, "ordered: the pick reads no parameter past $17, the UPDATE $1 to $3");
    tap::check(shard_params, "ordered: $4 and $5 (shards) exactly in the ByShard variants");
    tap::check(node_params, "ordered: $7 (node) exactly in the ByNode (and Handoff) variants");
    tap::check(resume_params, "ordered: the position $12, $13 exactly in the Resume variants");
    tap::check(reap_params, "ordered: $8 (max_attempts) exactly in the Reap variants");
    tap::check(handoff_parts, "ordered: the handoff CTEs exactly in the Handoff variants");
    tap::check(pick_quoted, "ordered: table and key column as the caller quoted them");
    tap::check(candidates_same, "ordered: the candidates statement reads the pick's parameters but $1 and $3");
    tap::check(candidates_unlocked, "ordered: the candidates statement neither locks nor tests heads");
    {
        bool listed_ok = true;
        for (int cols = 0; cols < 8; cols++) {
            OrderedTable q{{qname, (cols & 1) != 0, (cols & 2) != 0, (cols & 4) != 0}, key, "pg_catalog.text"};
            std::string l = listed_job(q);
            if (max_param(l) != ListedJobParams || !has_param(l, 1) || !has_param(l, 4) ||
                has_param(l, 2) != q.t.has_priority || has_param(l, 3) != q.t.has_run_at ||
                !has(l, "\"Key\" = $1::pg_catalog.text"))
                listed_ok = false;
        }
        tap::check(listed_ok, "ordered: the listed-job check reads the key $1 and the position's columns the table has");
    }
    tap::check(has(foreign_jobs("q", "k", "$1", "$2", true), "f.claim_expires OPERATOR(pg_catalog.>=) pg_catalog.now()") &&
                   !has(foreign_jobs("q", "k", "$1", "$2", false), "claim_expires"),
               "foreign_jobs: live_only adds the live-lease test");
    return tap::status();
}
