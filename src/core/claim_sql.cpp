// The claim-SQL builder (claim_sql.hpp). The text of each statement is
// the one src/queue/ built with StringInfo before it moved here; s.add and
// s.addf are appendStringInfoString and appendStringInfo.
#include "core/claim_sql.hpp"
#include "core/sql_ops.hpp"

#include <cstdarg>
#include <cstdio>

namespace sharding {
namespace claim_sql {

namespace {

// printf-style formatting into a std::string.
__attribute__((format(printf, 1, 0))) std::string vformat(const char *fmt, va_list ap) {
    va_list copy;
    va_copy(copy, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
    if (n > 0) std::vsnprintf(&out[0], static_cast<size_t>(n) + 1, fmt, ap);
    return out;
}

__attribute__((format(printf, 1, 2))) std::string format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string out = vformat(fmt, ap);
    va_end(ap);
    return out;
}

// A statement's text as it is appended to.
struct Sql {
    std::string text;
    void add(const char *s) { text += s; }
    void add(const std::string &s) { text += s; }
    __attribute__((format(printf, 2, 3))) void addf(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        text += vformat(fmt, ap);
        va_end(ap);
    }
};

// The qualified operators of the generated SQL: core/sql_ops.hpp.

// ------------------------------------------------------------ claim

// The claim order for the present columns, unprefixed:
// "priority DESC, run_at, created, id".
std::string claim_order(const Table &t) {
    return format("%s%screated, id", t.has_priority ? "priority DESC, " : "", t.has_run_at ? "run_at, " : "");
}

// The columns a claim's pending and expired scans return: id and the
// claim-order key.
std::string key_columns(const Table &t) {
    return format("id%s%s, created", t.has_priority ? ", priority" : "", t.has_run_at ? ", run_at" : "");
}

// One scan of the pending index in claim order, locking what it returns.
// `extra` narrows it ("" or "AND ...").
void pending_arm(Sql &s, const Table &t, const char *f, const char *extra) {
    s.addf("SELECT %s FROM %s WHERE status" EQ "'pending' %s %s %s "
           "ORDER BY %s LIMIT $2 FOR UPDATE SKIP LOCKED",
           key_columns(t).c_str(), t.qname, t.has_run_at ? "AND run_at" LE NOW : "", extra, f,
           claim_order(t).c_str());
}

// The filter of a claim's scans ("" or "AND <condition>"), and the common
// table expressions it reads ("" or "name AS (...), ").
std::string claim_filter(const char *key, const ClaimPlan &plan) {
    switch (plan.filter) {
        case Filter::None:
            return "";
        case Filter::Shards:
            return format("AND sharding.shard_of(%s, $6)" EQ "ANY ($5)", key);
        case Filter::Node:
            return format("AND %s IS NOT NULL AND sharding.node_for($11, %s)" EQ "$12%s", key, key,
                          plan.handoff ? handoff_exclusion(key, "$11").c_str() : "");
    }
    return "";
}

}  // namespace

bool claim_param_used(const ClaimPlan &plan, ClaimParam p) {
    switch (p) {
        case CMaxAttempts:
            return plan.reap;
        case CShards:
        case CShardCount:
            return plan.filter == Filter::Shards;
        case CPosPriority:
        case CPosRunAt:
        case CPosCreated:
        case CPosId:
            return plan.resume;
        case CMap:
        case CNode:
            return plan.filter == Filter::Node;
        default:
            return true;
    }
}

// The claim statement.
//
// Sweep: pending rows (the partial index create_queue makes, in claim
// order), due (run_at <= now()), and expired leases (the index of live
// leases), each locked with SKIP LOCKED and limited to batch; the first
// batch of both in claim order is then updated.
//
// Resume: pending rows past the remembered position only, scanned as up to
// three ranges of the index in claim order (higher priorities than the
// position's, the position's priority past the position, lower
// priorities), concatenated lazily, so only as many rows are locked as the
// claim takes. Expired leases are left to the next sweep: their index too
// fills with dead entries while the horizon is pinned.
//
// The CTEs are MATERIALIZED and the final pick is an InitPlan, so every
// LIMIT is evaluated once: a claim never takes more than batch rows. The
// claimed rows come back in claim order.
std::string claim(const Table &t, const char *key, const ClaimPlan &plan) {
    const std::string filter = claim_filter(key, plan);
    const char *f = filter.c_str();
    const bool resume = plan.resume;
    const std::string keys_text = key_columns(t), order_text = claim_order(t);
    const char *keys = keys_text.c_str(), *order = order_text.c_str();
    Sql s;
    s.add("WITH ");
    if (plan.filter == Filter::Node && plan.handoff) s.add(handoff_ctes(t.qname, key, "$11", "$12"));
    if (plan.reap && !resume) {
        // Expired leases that used up max_attempts go to failed, not to a
        // worker. Only in queues with max_attempts set: an idle
        // data-modifying CTE still costs its executor setup on every call.
        s.addf("reaped AS (UPDATE %s AS sharding_reaped SET status = 'failed' "
               "WHERE sharding_reaped.id" EQ "ANY (ARRAY(SELECT id FROM %s "
               "WHERE status" EQ "'processing' AND claim_expires" LT NOW " AND attempts" GE "$4 %s "
               "FOR UPDATE SKIP LOCKED))), ",
               t.qname, t.qname, f);
    }
    if (!resume)
        s.addf("expired AS MATERIALIZED (SELECT %s FROM %s "
               "WHERE status" EQ "'processing' AND claim_expires" LT NOW " %s %s "
               "ORDER BY %s LIMIT $2 FOR UPDATE SKIP LOCKED), ",
               keys, t.qname, plan.reap ? "AND (attempts IS NULL OR attempts" LT "$4)" : "", f, order);
    s.add("fresh AS MATERIALIZED (");
    if (!resume) {
        pending_arm(s, t, f, "");
    } else {
        const char *past = t.has_run_at ? "AND ROW(run_at, created, id)" GT "ROW($8, $9, $10)"
                                        : "AND ROW(created, id)" GT "ROW($9, $10)";
        if (!t.has_priority) {
            pending_arm(s, t, f, past);
        } else {
            s.addf("SELECT * FROM (SELECT * FROM (");
            pending_arm(s, t, f, "AND priority" GT "$7");
            s.add(") AS higher UNION ALL SELECT * FROM (");
            pending_arm(s, t, f, format("AND priority" EQ "$7 %s", past).c_str());
            s.add(") AS same UNION ALL SELECT * FROM (");
            pending_arm(s, t, f, "AND priority" LT "$7");
            s.add(") AS lower) AS arms LIMIT $2");
        }
    }
    s.add("), ");
    // The picked ids go to the UPDATE as one array (an InitPlan, computed
    // once): a primary key lookup per id whatever the generic plan
    // estimates, where a join on a CTE may become a merge join over the
    // whole primary key.
    s.addf("claimed AS (UPDATE %s AS sharding_claimed SET owner = $1, claim_expires = " NOW PLUS "$3, "
           "status = 'processing'%s "
           "WHERE sharding_claimed.id" EQ "ANY ((SELECT pg_catalog.array_agg(c.id) FROM ("
           "%s%s ORDER BY %s LIMIT $2) AS c)::bigint[]) "
           "RETURNING sharding_claimed.*) "
           "SELECT * FROM claimed ORDER BY %s",
           t.qname, t.has_attempts ? ", attempts = coalesce(sharding_claimed.attempts, 0)" PLUS "1" : "",
           resume ? "" : format("SELECT %s FROM expired UNION ALL ", keys).c_str(),
           format("SELECT %s FROM fresh", keys).c_str(), order, order);
    return s.text;
}

// ------------------------------------------------------------ handoff

std::string foreign_jobs(const char *qname, const char *key, const char *map, const char *node, bool live_only) {
    return format("%s f WHERE f.status OPERATOR(pg_catalog.=) 'processing'%s AND f.%s IS NOT NULL "
                  "AND sharding.node_for(%s, f.%s) OPERATOR(pg_catalog.=) %s "
                  "AND EXISTS (SELECT FROM sharding.claim_node_workers w WHERE w.map OPERATOR(pg_catalog.=) %s "
                  "AND w.worker OPERATOR(pg_catalog.=) f.owner AND w.node OPERATOR(pg_catalog.<>) %s)",
                  qname, live_only ? " AND f.claim_expires OPERATOR(pg_catalog.>=) pg_catalog.now()" : "", key,
                  map, key, node, map, node);
}

std::string handoff_ctes(const char *qname, const char *key, const char *map, const char *node) {
    return format("foreign_leases AS MATERIALIZED (SELECT f.%s AS k FROM %s), "
                  "blocked AS MATERIALIZED (SELECT coalesce(pg_catalog.array_agg(l.k::pg_catalog.text), '{}') AS keys, "
                  "coalesce(pg_catalog.array_agg(sharding.logical_shard(%s, l.k)) FILTER (WHERE NOT EXISTS "
                  "(SELECT FROM sharding.pins p WHERE p.map OPERATOR(pg_catalog.=) %s "
                  "AND p.key OPERATOR(pg_catalog.=) l.k::pg_catalog.text COLLATE \"C\")), '{}') AS shards "
                  "FROM foreign_leases l), ",
                  key, foreign_jobs(qname, key, map, node, true).c_str(), map, map);
}

std::string handoff_exclusion(const char *key_expr, const char *map) {
    return format(" AND NOT (%s::pg_catalog.text COLLATE \"C\" OPERATOR(pg_catalog.=) "
                  "ANY ((SELECT b.keys FROM blocked b)::pg_catalog.text[]) "
                  "OR sharding.logical_shard(%s, %s) OPERATOR(pg_catalog.=) "
                  "ANY ((SELECT b.shards FROM blocked b)::pg_catalog.int4[]))",
                  key_expr, map, key_expr);
}

// ------------------------------------------------------------ ordered
//
// Moved from queue_ordered.cpp (append_order ... update_sql, the same text); the
// comments on the pick's algorithm stay with its executor there.

namespace {

// Claim order of rows aliased `a` (docs/queue.md): priority, run_at, created, id.
std::string order(const OrderedTable &q, const char *a) {
    return format("%s%s%s.created, %s.id", q.t.has_priority ? format("%s.priority DESC, ", a).c_str() : "",
                  q.t.has_run_at ? format("%s.run_at, ", a).c_str() : "", a, a);
}

// The claim-order key of rows aliased `a` as columns that compare
// ascending in claim order: -priority, run_at, created, id.
std::string order_key(const OrderedTable &q, const char *a) {
    return format("%s%s%s.created, %s.id",
                  q.t.has_priority ? format("0 - %s.priority::pg_catalog.int8, ", a).c_str() : "",
                  q.t.has_run_at ? format("%s.run_at, ", a).c_str() : "", a, a);
}

// Claim order reversed, of rows aliased `a`.
std::string reverse_order(const OrderedTable &q, const char *a) {
    return format("%s%s%s.created DESC, %s.id DESC", q.t.has_priority ? format("%s.priority, ", a).c_str() : "",
                  q.t.has_run_at ? format("%s.run_at DESC, ", a).c_str() : "", a, a);
}

// Rows aliased `a` up to the last row of `from` (a relation aliased `b`)
// in claim order: ROW(a's key) <= (SELECT b's key ... LIMIT 1).
std::string up_to_last_of(const OrderedTable &q, const char *a, const char *from, const char *b) {
    return format("ROW(%s) <= (SELECT %s FROM %s %s ORDER BY %s LIMIT 1)", order_key(q, a).c_str(),
                  order_key(q, b).c_str(), from, b, reverse_order(q, b).c_str());
}

// The last row of `from` (rows aliased z, with their condition) in claim
// order, as a subquery.
std::string last_row(const OrderedTable &q, const char *from) {
    return format("(SELECT * FROM %s ORDER BY %s LIMIT 1)", from, reverse_order(q, "z").c_str());
}

// The filter every candidate row `c` passes: key not NULL, due, shard or
// node filter with the handoff exclusions.
void append_filter(Sql &s, const OrderedTable &q, uint32_t variant) {
    s.addf(" AND c.%s IS NOT NULL", q.key);
    if (q.t.has_run_at) s.add(" AND NOT (c.run_at > pg_catalog.now())");
    if (variant & ByShard) s.addf(" AND sharding.shard_of(c.%s, $5) = ANY ($4)", q.key);
    if (variant & ByNode) s.addf(" AND sharding.node_for($6, c.%s) = $7", q.key);
    if (variant & Handoff) s.add(handoff_exclusion(format("c.%s", q.key).c_str(), "$6"));
}

// Head of its key (see queue_ordered.cpp, "head check"). `oldest_pending`:
// c is known to be its key's oldest pending job under the statement's
// snapshot, and the first probe is left out.
void append_head_check(Sql &s, const OrderedTable &q, bool oldest_pending = false) {
    s.addf(" AND CASE WHEN EXISTS (SELECT FROM %s o WHERE o.%s = c.%s"
           " AND o.status = ANY ('{pending,processing}'::text[]) AND o.status > 'pending'"
           " AND o.id <> c.id AND ((o.created, o.id) < (c.created, c.id)"
           " OR o.claim_expires >= pg_catalog.now()) ORDER BY o.status DESC, o.created DESC, o.id DESC OFFSET 0)"
           " THEN false",
           q.t.qname, q.key, q.key);
    if (!oldest_pending)
        s.addf(" ELSE NOT EXISTS (SELECT FROM %s o WHERE o.%s = c.%s AND o.status = 'pending'"
               " AND (o.created, o.id) < (c.created, c.id))",
               q.t.qname, q.key, q.key);
    else
        s.add(" ELSE true");
    s.add(" END");
}

// The claim-order key of rows aliased `a` as the pick returns it: id,
// priority (int8, 0 without the column), run_at (NULL without it), created.
std::string position(const OrderedTable &q, const char *a) {
    return format("%s.id, %s, %s, %s.created", a,
                  q.t.has_priority ? format("%s.priority::pg_catalog.int8", a).c_str() : "0::pg_catalog.int8",
                  q.t.has_run_at ? format("%s.run_at", a).c_str() : "NULL::pg_catalog.timestamptz", a);
}

// One arm of the walk: pending rows in claim order, filtered, past `past`.
void append_walk_arm(Sql &s, const OrderedTable &q, uint32_t variant, const char *cols, const char *past) {
    s.addf("SELECT %s, c.%s::pg_catalog.text AS k, c.tableoid AS r, c.ctid AS t "
           "FROM %s c WHERE c.status = 'pending'",
           cols, q.key, q.t.qname);
    append_filter(s, q, variant);
    s.addf(" AND NOT (c.%s::pg_catalog.text COLLATE \"C\" = ANY ($14))%s ORDER BY %s LIMIT $9", q.key, past,
           order(q, "c").c_str());
}

}  // namespace

namespace {

// The columns the ordered statements read of a candidate row `c`.
const char *candidate_columns(const OrderedTable &q) {
    return q.t.has_priority && q.t.has_run_at ? "c.id, c.created, c.priority, c.run_at"
           : q.t.has_priority                  ? "c.id, c.created, c.priority"
           : q.t.has_run_at                    ? "c.id, c.created, c.run_at"
                                               : "c.id, c.created";
}

// The common table expressions every ordered statement starts with: the
// reaper (Reap), the handoff exclusion (Handoff).
void append_prelude(Sql &s, const OrderedTable &q, uint32_t variant) {
    s.add("WITH ");
    if (variant & Reap)
        s.addf("reaped AS (UPDATE %s AS sharding_reaped SET status = 'failed' "
               "WHERE $16 AND sharding_reaped.id IN (SELECT id FROM %s "
               "WHERE status = 'processing' AND claim_expires < pg_catalog.now() AND attempts >= $8 "
               "FOR UPDATE SKIP LOCKED)), ",
               q.t.qname, q.t.qname);
    if (variant & Handoff) s.add(handoff_ctes(q.t.qname, q.key, "$6", "$7"));
}

// The expired leases a round may take, in claim order, at most $2, none
// this claim holds already ($15): their columns, key `k`, table `r` and
// tid `t`, as the walk's and the probes' rows.
void append_expired(Sql &s, const OrderedTable &q, uint32_t variant) {
    s.addf("expired AS MATERIALIZED (SELECT %s, c.%s::pg_catalog.text AS k, c.tableoid AS r, c.ctid AS t FROM %s c "
           "WHERE c.status = 'processing' AND c.claim_expires < pg_catalog.now()",
           candidate_columns(q), q.key, q.t.qname);
    if (variant & Reap) s.add(" AND (c.attempts IS NULL OR c.attempts < $8)");
    append_filter(s, q, variant);
    s.addf(" AND c.id <> ALL ($15) ORDER BY %s LIMIT $2)", order(q, "c").c_str());
}

// The walk (from the start of the line or past the position: as ranges of
// the pending index, the higher priorities being behind the position) and
// the probes (each remembered key's oldest pending job), as the CTEs walk
// and probes, each row with its key `k`, table `r` and tid `t`.
void append_walk_and_probes(Sql &s, const OrderedTable &q, uint32_t variant) {
    const char *cols = candidate_columns(q);
    s.add("walk AS MATERIALIZED (");
    if (!(variant & Resume)) {
        append_walk_arm(s, q, variant, cols, "");
    } else {
        const char *past = q.t.has_run_at ? " AND ROW(c.run_at, c.created, c.id) > ROW($11, $12, $13)"
                                          : " AND ROW(c.created, c.id) > ROW($12, $13)";
        if (!q.t.has_priority) {
            append_walk_arm(s, q, variant, cols, past);
        } else {
            s.add("SELECT * FROM ((");
            append_walk_arm(s, q, variant, cols, format(" AND c.priority = $10%s", past).c_str());
            s.add(") UNION ALL (");
            append_walk_arm(s, q, variant, cols, " AND c.priority < $10");
            s.add(")) AS arms LIMIT $9");
        }
    }
    s.add("), ");
    s.addf("probes AS MATERIALIZED (SELECT %s, p.k, c.r, c.t "
           "FROM pg_catalog.unnest($17) AS p(k) CROSS JOIN LATERAL (SELECT o.*, o.tableoid AS r, o.ctid AS t FROM %s o "
           "WHERE o.%s = p.k::%s AND o.status = 'pending' ORDER BY o.%s, o.status, o.created, o.id LIMIT 1) c)",
           cols, q.t.qname, q.key, q.key_type, q.key);
}

// The 't' row: the tail of the line, the last pending row in claim order
// (a backward descent of the pending index), when the walk reached it and
// it is due (a job scheduled later sits behind the jobs inserted
// meanwhile). `extra`: the NULL columns after the position.
void append_tail(Sql &s, const OrderedTable &q, const char *extra) {
    const std::string pending = format("%s z WHERE z.status = 'pending'", q.t.qname);
    s.addf(" UNION ALL SELECT 't', %s%s FROM %s l WHERE (SELECT pg_catalog.count(*) FROM walk) < $9",
           position(q, "l").c_str(), extra, last_row(q, pending.c_str()).c_str());
    if (q.t.has_run_at) s.add(" AND NOT (l.run_at > pg_catalog.now())");
}

// What a round's candidates come from, every ordered statement's CTEs:
// the prelude, walk, probes and expired.
void append_sources(Sql &s, const OrderedTable &q, uint32_t variant) {
    append_prelude(s, q, variant);
    append_walk_and_probes(s, q, variant);
    s.add(", ");
    append_expired(s, q, variant);
}

}  // namespace

std::string pick(const OrderedTable &q, uint32_t variant) {
    const char *cols = candidate_columns(q);
    Sql s;
    append_sources(s, q, variant);
    // Per key, its oldest candidate (an expired lease is its key's oldest
    // job); of those, the ones up to where the walk got (or all, if it
    // reached the end of the line: a candidate past it may be preceded by
    // a head not walked yet); then, in claim order, each is tested and
    // locked until $2 are taken.
    s.addf(", fresh AS MATERIALIZED (SELECT %s, c.status, w.k FROM (SELECT * FROM (SELECT DISTINCT ON (x.k) x.* FROM "
           "(SELECT * FROM walk UNION ALL SELECT * FROM probes UNION ALL SELECT * FROM expired) x "
           "ORDER BY x.k, x.created, x.id) d WHERE (SELECT pg_catalog.count(*) FROM walk) < $9 OR %s ORDER BY %s",
           cols, up_to_last_of(q, "d", "walk", "z").c_str(), order(q, "d").c_str());
    // The head check, then the lock: only heads are locked, and no more
    // than are taken, so a claim never holds a row it did not take (a
    // blocked key's head, locked by a claim that found it blocked, was
    // passed over by the next claims until that claim's transaction ended,
    // after the key was free).
    s.addf(" OFFSET 0) AS w CROSS JOIN LATERAL (SELECT c.* FROM %s c "
           "WHERE c.tableoid = w.r AND c.ctid = w.t AND (c.status = 'pending' OR (c.status = 'processing' "
           "AND c.claim_expires < pg_catalog.now()%s))",
           q.t.qname, (variant & Reap) ? " AND (c.attempts IS NULL OR c.attempts < $8)" : "");
    append_filter(s, q, variant);
    s.add(" AND c.id <> ALL ($15) AND sharding._current_version(c.tableoid, c.ctid)");
    append_head_check(s, q);
    s.addf(" FOR UPDATE OF c SKIP LOCKED) AS c LIMIT $2) SELECT 'e'::\"char\" AS kind, %s, e.k, "
           "NULL::pg_catalog.int8 AS n FROM fresh e WHERE e.status = 'processing' "
           "UNION ALL SELECT 'f', %s, f.k, NULL FROM fresh f WHERE f.status = 'pending' ",
           position(q, "e").c_str(), position(q, "f").c_str());
    // Per key walked and not taken. When the round took all it asked for,
    // the next position is its last row taken, and only the rows before it
    // can be listed: the others are left out here (most of a walk, with
    // few heads blocked).
    s.addf("UNION ALL SELECT 'w', %s, w.k, w.n FROM (SELECT DISTINCT ON (v.k) v.*, "
           "pg_catalog.count(*) OVER (PARTITION BY v.k) AS n FROM walk v "
           "WHERE v.id <> ALL ((SELECT coalesce(pg_catalog.array_agg(f.id), '{}') FROM fresh f)::pg_catalog.int8[]) "
           "AND ((SELECT pg_catalog.count(*) FROM fresh f) < $2 OR %s) ORDER BY v.k, %s) w",
           position(q, "w").c_str(), up_to_last_of(q, "v", "fresh", "f").c_str(), order(q, "v").c_str());
    // The probes, then the walk's last row.
    s.addf(" UNION ALL SELECT 'p', %s, p.k, NULL FROM probes p "
           "UNION ALL SELECT 'l', %s, l.k, (SELECT pg_catalog.count(*) FROM walk) FROM %s l",
           position(q, "p").c_str(), position(q, "l").c_str(), last_row(q, "walk z").c_str());
    append_tail(s, q, ", NULL, NULL");
    return s.text;
}

std::string candidates(const OrderedTable &q, uint32_t variant) {
    Sql s;
    append_sources(s, q, variant);
    // A probed key's oldest pending job may not pass the filter (not due,
    // another shard or node): still a 'p' row (its key stays listed), but
    // no candidate (ok false).
    s.addf(" SELECT 'e'::\"char\" AS kind, %s, e.k, e.t, true AS ok FROM expired e "
           "UNION ALL SELECT 'w', %s, w.k, w.t, true FROM walk w "
           "UNION ALL SELECT 'p', %s, p.k, p.t, EXISTS (SELECT FROM %s c WHERE c.tableoid = p.r AND c.ctid = p.t",
           position(q, "e").c_str(), position(q, "w").c_str(), position(q, "p").c_str(), q.t.qname);
    append_filter(s, q, variant);
    s.add(") FROM probes p");
    append_tail(s, q, ", NULL, NULL::pg_catalog.tid, false");
    return s.text;
}

std::string listed_job(const OrderedTable &q) {
    Sql s;
    s.addf("SELECT %s FROM %s o WHERE o.%s = $1::%s AND o.status = 'pending' AND ROW(%s) <= ROW(",
           position(q, "o").c_str(), q.t.qname, q.key, q.key_type, order_key(q, "o").c_str());
    if (q.t.has_priority) s.add("0 - $2, ");
    if (q.t.has_run_at) s.add("$3, ");
    s.addf("$4, $5) ORDER BY o.%s, o.status, o.created, o.id LIMIT 1", q.key);
    return s.text;
}

std::string update(const OrderedTable &q) {
    Sql s;
    s.addf("WITH claimed AS (UPDATE %s AS u SET owner = $1, claim_expires = pg_catalog.now() + $3, "
           "status = 'processing'%s WHERE u.id = ANY ($2) RETURNING u.*) SELECT * FROM claimed c ORDER BY %s",
           q.t.qname, q.t.has_attempts ? ", attempts = coalesce(u.attempts, 0) + 1" : "", order(q, "c").c_str());
    return s.text;
}

}  // namespace claim_sql
}  // namespace sharding
