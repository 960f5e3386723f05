#!/usr/bin/env bash
# Out-of-order storm: 4 concurrent sessions send 20,000 random status
# transitions over 200 orders, as plain UPDATEs (single and in small
# transactions) and as advance(). The same transitions go to three tables:
#   storm_t  text status, guard 'skip'
#   storm_e  enum status, guard 'error' (regressions fail their statement)
#   storm_u  text status, no guard (the control: it must go backwards)
# Afterwards each guarded order holds the highest rank ever sent to it, and an
# AFTER UPDATE audit trigger shows that no committed update lowered a rank.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_rank_storm
SESSIONS=4 TRANSITIONS=20000 ORDERS=200
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

. test/lib/tap.sh
echo "1..12"

dropdb --if-exists $PGDATABASE; createdb $PGDATABASE || exit 1
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || { echo "Bail out! setup failed"; exit 1; }
CREATE EXTENSION sharding;
CREATE TYPE storm_state AS ENUM ('placed', 'paid', 'packed', 'shipped', 'delivered');
CREATE TABLE storm_t (id int PRIMARY KEY, status text NOT NULL, touched int NOT NULL DEFAULT 0);
CREATE TABLE storm_e (id int PRIMARY KEY, status storm_state NOT NULL);
CREATE TABLE storm_u (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO storm_t (id, status) SELECT g, 'placed' FROM generate_series(1, 200) AS g;
INSERT INTO storm_e SELECT g, 'placed' FROM generate_series(1, 200) AS g;
INSERT INTO storm_u SELECT g, 'placed' FROM generate_series(1, 200) AS g;
SELECT sharding.guard_rank('storm_t', 'status', ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], 'skip');
SELECT sharding.guard_rank('storm_e', 'status', on_regress => 'error');

-- The audit ranks independently of the extension.
CREATE TABLE audit (tbl text, id int, old_rank int, new_rank int);
CREATE FUNCTION audit_rank() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit VALUES (TG_TABLE_NAME, NEW.id,
        array_position(ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], OLD.status::text) - 1,
        array_position(ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], NEW.status::text) - 1);
    RETURN NULL;
END $$;
CREATE TRIGGER audit AFTER UPDATE ON storm_t FOR EACH ROW EXECUTE FUNCTION audit_rank();
CREATE TRIGGER audit AFTER UPDATE ON storm_e FOR EACH ROW EXECUTE FUNCTION audit_rank();
CREATE TRIGGER audit AFTER UPDATE ON storm_u FOR EACH ROW EXECUTE FUNCTION audit_rank();
SQL

# The workload: one SQL file per session, and the highest rank sent per order.
python3 - "$WORK" $SESSIONS $TRANSITIONS $ORDERS <<'PY'
import random, sys
work, sessions, transitions, orders = sys.argv[1], *map(int, sys.argv[2:])
ranks = ['placed', 'paid', 'packed', 'shipped', 'delivered']
rng = random.Random(20261129)
best = {i: 0 for i in range(1, orders + 1)}
per = transitions // sessions
for s in range(sessions):
    out = []
    left = per
    while left > 0:
        k = min(left, rng.choice([1, 1, 1, 1, 1, 1, 1, 2, 3]))  # a few small transactions
        moves = sorted((rng.randint(1, orders), rng.randrange(len(ranks))) for _ in range(k))
        left -= k
        for i, r in moves:
            best[i] = max(best[i], r)
        if k > 1:  # rows locked in id order: no deadlocks
            out.append('BEGIN;')
            out += [f"UPDATE storm_t SET status = '{ranks[r]}', touched = touched + 1 WHERE id = {i};" for i, r in moves]
            out.append('COMMIT;')
        else:
            i, r = moves[0]
            if rng.random() < 0.5:
                out.append(f"UPDATE storm_t SET status = '{ranks[r]}', touched = touched + 1 WHERE id = {i};")
            else:
                out.append(f"SELECT sharding.advance('storm_t', {i}, '{ranks[r]}');")
        for i, r in moves:
            if rng.random() < 0.5:
                out.append(f"UPDATE storm_e SET status = '{ranks[r]}' WHERE id = {i};")
            else:
                out.append(f"SELECT sharding.advance('storm_e', {i}, '{ranks[r]}');")
            out.append(f"UPDATE storm_u SET status = '{ranks[r]}' WHERE id = {i};")
    open(f'{work}/session{s}.sql', 'w').write('\n'.join(out) + '\n')
with open(f'{work}/expected.csv', 'w') as f:
    for i in sorted(best):
        f.write(f'{i},{ranks[best[i]]}\n')
PY

start=$(date +%s.%N)
pids=()
for s in $(seq 0 $((SESSIONS - 1))); do
    psql -XqAt -f "$WORK/session$s.sql" >"$WORK/out$s" 2>"$WORK/err$s" &
    pids+=($!)
done
# Meanwhile, replace the text guard (same ranks) a few times: every session
# must pick up the new trigger and keep the promise.
for k in 1 2 3; do
    sleep 0.3
    psql -XqAt -c "SELECT sharding.guard_rank('storm_t', 'status', ARRAY['placed', 'paid', 'packed', 'shipped', 'delivered'], 'skip')" \
        >/dev/null 2>>"$WORK/err_guard"
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
echo "# storm of $TRANSITIONS transitions x 3 tables in ${elapsed}s"
ok_rc $rc "all $SESSIONS sessions ran to the end"
ok_rc "$([ ! -s "$WORK/err_guard" ] && echo 0 || echo 1)" "guard replaced three times during the storm"

errors=$(cat "$WORK"/err? | grep -c '^psql.*ERROR' || true)
guard_errors=$(cat "$WORK"/err? | grep -c 'ERROR:  rank guard refuses to lower column "status" of relation "storm_e"' || true)
ok_rc "$([ "$errors" -gt 0 ] && [ "$errors" -eq "$guard_errors" ] && echo 0 || echo 1)" \
    "the error guard refused $guard_errors plain UPDATEs with 23514, and nothing else failed ($errors errors)"
cat "$WORK"/err? | grep ERROR | grep -v 'rank guard refuses' | head -5 | sed 's/^/# /'

psql -XqAt -v ON_ERROR_STOP=1 -c "CREATE TABLE expected (id int, status text)" \
    -c "\\copy expected FROM '$WORK/expected.csv' CSV" >/dev/null || exit 1
q() { psql -XqAt -c "$1"; }
wrong_t=$(q "SELECT count(*) FROM storm_t JOIN expected USING (id) WHERE storm_t.status <> expected.status")
wrong_e=$(q "SELECT count(*) FROM storm_e JOIN expected USING (id) WHERE storm_e.status::text <> expected.status")
rows=$(q "SELECT count(*) FROM expected")
ok_rc "$([ "$wrong_t" = 0 ] && [ "$rows" = "$ORDERS" ] && echo 0 || echo 1)" \
    "text/skip: every order holds the highest rank sent to it ($wrong_t of $rows differ)"
ok_rc "$([ "$wrong_e" = 0 ] && echo 0 || echo 1)" \
    "enum/error: every order holds the highest rank sent to it ($wrong_e of $rows differ)"
lowered_t=$(q "SELECT count(*) FROM audit WHERE tbl = 'storm_t' AND new_rank < old_rank")
lowered_e=$(q "SELECT count(*) FROM audit WHERE tbl = 'storm_e' AND new_rank < old_rank")
audited_t=$(q "SELECT count(*) FROM audit WHERE tbl = 'storm_t'")
audited_e=$(q "SELECT count(*) FROM audit WHERE tbl = 'storm_e'")
ok_rc "$([ "$lowered_t" = 0 ] && [ "$audited_t" -gt 0 ] && echo 0 || echo 1)" \
    "text/skip: no committed update lowered a rank ($audited_t audited)"
ok_rc "$([ "$lowered_e" = 0 ] && [ "$audited_e" -gt 0 ] && echo 0 || echo 1)" \
    "enum/error: no committed update lowered a rank ($audited_e audited)"
unranked=$(q "SELECT count(*) FROM audit WHERE old_rank IS NULL OR new_rank IS NULL")
ok_rc "$([ "$unranked" = 0 ] && echo 0 || echo 1)" "every audited value is a rank"
# The control proves the storm really is out of order.
lowered_u=$(q "SELECT count(*) FROM audit WHERE tbl = 'storm_u' AND new_rank < old_rank")
wrong_u=$(q "SELECT count(*) FROM storm_u JOIN expected USING (id) WHERE storm_u.status <> expected.status")
ok_rc "$([ "$lowered_u" -gt 1000 ] && [ "$wrong_u" -gt 0 ] && echo 0 || echo 1)" \
    "control: the unguarded table was lowered $lowered_u times and ends wrong for $wrong_u orders"
# Skipped rows still count as sent: the other column moved only with status.
touched=$(q "SELECT sum(touched) FROM storm_t")
plain_t=$(cat "$WORK"/session?.sql | grep -c '^UPDATE storm_t' || true)
ok_rc "$([ "$touched" -gt 0 ] && [ "$touched" -lt "$plain_t" ] && echo 0 || echo 1)" \
    "skip: $touched of $plain_t plain UPDATEs of storm_t applied, the rest were skipped"
# Every advance() that returned true raised the rank by one audited update.
adv_true=$(cat "$WORK"/out? | grep -c '^t$' || true)
adv_false=$(cat "$WORK"/out? | grep -c '^f$' || true)
adv_sent=$(cat "$WORK"/session?.sql | grep -c '^SELECT sharding.advance' || true)
ok_rc "$([ $((adv_true + adv_false)) = "$adv_sent" ] && [ "$adv_true" -gt 0 ] && [ "$adv_false" -gt 0 ] && echo 0 || echo 1)" \
    "advance answered all $adv_sent calls: $adv_true moved a row forward, $adv_false did not"
raised=$(q "SELECT count(*) FROM audit WHERE new_rank > old_rank")
ok_rc "$([ "$raised" -ge "$adv_true" ] && echo 0 || echo 1)" \
    "audited forward moves ($raised) cover every advance that reported true"

dropdb $PGDATABASE
exit $((failures > 0))
