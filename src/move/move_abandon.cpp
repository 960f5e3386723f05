// move_abandon: the end of a live move whose source or destination is gone
// for good (docs/moves.md, "A node gone for good"; review LK-2). Recovery
// and a cancel need both ends (the destination's word before the source
// thaws, DL-7); a node whose server was destroyed never answers again, and
// its move's journal row stayed live for ever, blocking every move of the
// shard, the source frozen if it was, the slot at the source holding WAL.
//
// Here, with the move's executor gone (its session lock taken) and one end
// answering as itself, the shard stays with the owner the coordinator's
// configuration names, once the answering end's own (followed) copy says
// the same (the nodes' word, as recovery asks it: a switch seen at the end
// is never undone). The move's objects at the answering end are dropped;
// no row is deleted anywhere: at the destination they may be the only copy
// left, at the source they are the shard's. What could not be dropped at
// the node gone is named in the journal's error and in a WARNING. When the
// answering end's configuration does not agree with the coordinator's
// within 10 s, who owns the shard cannot be told without the node gone:
// 55000, unless force, which acts on the coordinator's word.
//
// The caller acts as the move's role (move_journal.cpp checks and switches
// to it; this file does the rest).
#include "move/move_engine.hpp"
#include "move/journal.hpp"
#include "move/move_online.hpp"
#include "routing/owner_switch.hpp"

#include <string>

namespace sharding::move {
namespace {

using online::drop_slot_and_publication;
using online::drop_subscription;
using online::drop_triggers;
using online::stop_backends;

// One end of the move: whether it answers as itself, and if not why.
struct End {
    std::string node;
    const char *conn = nullptr;
    bool present = false;
    std::string why;
};

// The first line of a message (libpq's connection errors run on).
std::string first_line(const std::string &s) {
    const size_t nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
}

// Connects conn to the end's node and asks it who it is: present only when
// it answers as that node (a server rebuilt empty at the same address, or
// another node, is not the move's end).
void probe(End &e) {
    Caught err;
    const bool ok = subxact(
        [&] {
            Text dsn = spi_value("SELECT x.dsn FROM sharding.nodes x WHERE x.node = $1", {e.node.c_str()});
            if (!dsn) {
                e.why = "it has no connection string";
                return;
            }
            named_connect(e.conn, dsn->c_str());
            Text me = dbl(e.conn, "SELECT sharding.this_node()");
            if (me == Text(e.node))
                e.present = true;
            else
                e.why = "it answers as " + (me ? "node \"" + *me + "\"" : std::string("no attached node"));
        },
        &err);
    if (!ok) {
        if (not_others(err.code)) reraise(err);
        e.why = first_line(err.message);
    }
    if (!e.present) named_disconnect(e.conn);
}

// "owner/epoch" of the move's shard (its key's node for isolate), as the
// configuration there says (the coordinator's own, or a node's followed
// copy).
std::string owner_sql(const LiveMove &m) {
    return "SELECT coalesce((SELECT p.node FROM sharding.pins p WHERE p.map = " + lit(m.map) + " AND p.key = " +
           lit(m.key) + "), s.node) || '/' || s.epoch FROM sharding.shards s WHERE s.map = " + lit(m.map) +
           " AND s.logical = " + std::to_string(m.logical);
}

std::string node_of(const Text &view) {
    if (!view) return std::string();
    return view->substr(0, view->rfind('/'));
}

// The executor's lock, waited for a little: recovery (the launcher's scan,
// another session's _move_recover) takes it for a moment while it tries.
void take_executor_lock(int64 id) {
    for (int i = 0; i < 50; i++) {
        if (try_session_lock(executor_lock_class(), executor_lock_obj(id))) return;
        sleep_ms(100);
    }
    fail(ERRCODE_OBJECT_IN_USE,
         Explain{"Its executor is alive: it rolls the move back (or finishes it) itself, or leaves it interrupted "
                 "when it cannot reach a node.",
                 format("Cancel it first: SELECT sharding._move_cancel(%lld); (a rebalance job's move: "
                        "sharding.rebalance_cancel(job)), then call sharding.move_abandon again.",
                        (long long)id)},
         "move %lld is being carried out by another session", (long long)id);
}

// What the node gone keeps of the move, for the operator to drop there.
std::string left_at_destination(const std::string &name, bool switched) {
    return "subscription " + name + " (with its replication origin), replication origins " + name + "*, and " +
           (switched ? "the shard's rows (it owns the shard)" : "the rows of the shard it copied");
}
std::string left_at_source(const LiveMove &m, const std::string &name, bool switched) {
    return "slot " + name + " (holding WAL until dropped), publication " + name + ", its row of " +
           "sharding.move_decoding, replication origins " + name + "*" +
           (m.phase == to_text(Phase::Cutover) ? ", the shard frozen" : "") + ", and " +
           (switched ? "its copy of the shard's rows as of the switch" : "the shard's rows (it owns the shard)");
}

}  // namespace

std::string abandon_move(const LiveMove &m, bool force) {
    const std::string ids = std::to_string(m.id);
    End src{m.source, kSrc}, dst{m.destination, kDst};
    named_connect(kSelf, c(coordinator_dsn()));
    probe(src);
    probe(dst);
    if (src.present && dst.present) {
        disconnect();
        fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
             Explain{"Both its source \"" + m.source + "\" and its destination \"" + m.destination +
                         "\" answer: the move can be rolled back (or finished) with nothing left behind.",
                     format("Cancel it: SELECT sharding._move_cancel(%lld); or, if it was interrupted, "
                            "SELECT sharding._move_recover();",
                            (long long)m.id)},
             "move %lld of logical shard %d of map \"%s\" is not abandoned: both its nodes answer", (long long)m.id,
             m.logical, m.map.c_str());
    }
    try {
        take_executor_lock(m.id);
    } catch (...) {
        disconnect();
        throw;
    }
    std::string owner;
    Caught err;
    const bool ok = subxact(
        [&] {
            const Text phase = journal("SELECT m.phase FROM sharding.move_journal m WHERE m.move = " + ids +
                                       " AND m." + kLive);
            if (!phase)
                fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "move %lld ended meanwhile: nothing abandoned",
                     (long long)m.id);
            LiveMove now = m;
            now.phase = *phase;
            const bool switched = now.phase == to_text(Phase::Cleanup);
            const std::string name = journal_move_name(m.map, m.logical);
            End &here = src.present ? src : dst;
            End &gone = src.present ? dst : src;
            const char *gone_role = src.present ? "destination" : "source";
            if (!here.present) {
                // Neither answers: nothing can be dropped anywhere, and who
                // owns the shard is the coordinator's word only.
                if (!force)
                    fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                         Explain{"Its source \"" + m.source + "\" (" + src.why + ") and its destination \"" +
                                     m.destination + "\" (" + dst.why + ") are both out of reach.",
                                 "Wait for one of them; if both are gone for good, SELECT sharding.move_abandon(" +
                                     lit(Text(m.map)) + ", " + std::to_string(m.logical) +
                                     ", force => true); ends the move on the coordinator's word."},
                         "move %lld of logical shard %d of map \"%s\" cannot be abandoned: neither of its nodes "
                         "answers",
                         (long long)m.id, m.logical, m.map.c_str());
            }
            // Who owns the shard: the coordinator's configuration, once the
            // answering end's copy says the same (it may lag for a moment).
            const std::string expected = switched ? m.destination : m.source;
            Text coord_view, end_view;
            bool agree = false;
            for (int i = 0; i < 100 && !agree; i++) {
                if (i > 0) sleep_ms(100);
                coord_view = journal(owner_sql(m));
                end_view = here.present ? dbl(here.conn, owner_sql(m)) : Text();
                agree = here.present && coord_view && end_view == coord_view && node_of(coord_view) == expected;
            }
            if (!agree && !force)
                fail(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                     Explain{format("The journal says phase %s (the switch %s); the coordinator's configuration "
                                    "names %s, node \"%s\"'s names %s (owner/epoch). The %s \"%s\" is out of reach (%s).",
                                    now.phase.c_str(), switched ? "committed" : "not committed",
                                    shown(coord_view).c_str(), here.node.c_str(), shown(end_view).c_str(), gone_role,
                                    gone.node.c_str(), gone.why.c_str()),
                             "If the coordinator was restored from a backup, run SELECT sharding.take_over(); first. "
                             "If the node is gone for good, SELECT sharding.move_abandon(" + lit(Text(m.map)) +
                                 ", " + std::to_string(m.logical) +
                                 ", force => true); ends the move on the coordinator's word (docs/moves.md)."},
                     "who owns logical shard %d of map \"%s\" cannot be told without node \"%s\"", m.logical,
                     m.map.c_str(), gone.node.c_str());
            owner = node_of(coord_view);
            std::string left;
            if (src.present) {
                drop_slot_and_publication(name);
                // The source thaws when it owns the shard, or when it follows
                // the switch (its guard then refuses by ownership).
                const bool thaw = owner == m.source || agree;
                if (thaw) call_fn(kSrc, "_thaw_shard", m.map, m.logical);
                drop_left_origins(kSrc, name);
                left = "Left at \"" + m.destination + "\": " + left_at_destination(name, switched);
                if (!thaw) left += "; the source \"" + m.source + "\" stays frozen (sharding._thaw_shard there)";
            } else if (dst.present) {
                // A copy still running there would commit later: ended first.
                stop_backends(kDst, name);
                drop_subscription(name);
                drop_triggers(m.map, name);
                drop_left_origins(kDst, name);
                left = "Left at \"" + m.source + "\": " + left_at_source(now, name, switched);
                left += "; the destination \"" + m.destination + "\" keeps " +
                        (owner == m.destination ? "the shard's rows" : "the rows it copied, which nothing routes to");
            } else
                left = "Left at \"" + m.source + "\": " + left_at_source(now, name, switched) + ". Left at \"" +
                       m.destination + "\": " + left_at_destination(name, switched);
            const std::string gone_text =
                here.present ? format("node \"%s\", its %s, is out of reach (%s)", gone.node.c_str(), gone_role,
                                      gone.why.c_str())
                             : std::string("neither of its nodes answers");
            const std::string error =
                format("abandoned in phase %s%s: %s; \"%s\" owns the shard. %s", now.phase.c_str(),
                       agree ? "" : " (forced)", gone_text.c_str(), owner.c_str(), left.c_str());
            journal("UPDATE sharding.move_journal SET phase = " PHASE_SQL(FAILED) ", phase_started = pg_catalog.now(), "
                    "finished = pg_catalog.now(), pid = NULL, lag_bytes = NULL, error = " + lit(Text(error)) +
                    ", error_state = '55000', error_detail = NULL, error_hint = " +
                    lit(Text("Drop what is left at a node that comes back (docs/moves.md, \"A node gone for good\"); "
                             "max_slot_wal_keep_size bounds the WAL a slot left there holds.")) +
                    " WHERE move = " + ids + " AND " + kLive);
            warn(format("move %lld abandoned: %s", (long long)m.id, error.c_str()),
                 "Drop what is left at a node that comes back by hand (docs/moves.md, \"A node gone for good\"); "
                 "max_slot_wal_keep_size bounds the WAL a slot left there holds.");
        },
        &err);
    session_unlock(executor_lock_class(), executor_lock_obj(m.id));
    disconnect();
    if (!ok) reraise(err);
    return owner;
}

}  // namespace sharding::move
