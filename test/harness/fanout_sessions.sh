#!/usr/bin/env bash
# Fan-out counters live in shared memory: what one session counts, every
# session sees; concurrent sessions lose no count; a reset in one session is
# seen by the others. Runs on the test cluster, which preloads sharding.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/session.sh
export PGDATABASE=sharding_fanout_sessions
dropdb --if-exists "$PGDATABASE" 2>/dev/null; createdb "$PGDATABASE" || exit 1
trap 'sess_stop A; sess_stop B; dropdb --if-exists "$PGDATABASE"; rm -rf "$SESS_DIR"' EXIT
psql -XqAt -v ON_ERROR_STOP=1 <<'SQL' >/dev/null || exit 1
CREATE EXTENSION sharding;
SELECT sharding.create_map('m', 16, ARRAY['n1', 'n2']);
CREATE TABLE accounts (id bigint PRIMARY KEY, tenant text NOT NULL, balance integer NOT NULL DEFAULT 0);
SELECT sharding.distribute('accounts', 'tenant', 'm');
INSERT INTO accounts SELECT i, 'tenant-' || (i % 100), 0 FROM generate_series(1, 1000) AS i;
SELECT sharding.fanout_reset();
SQL
counts() { psql -XAtc "SELECT queries || '|' || single_shard || '|' || fan_out FROM sharding.fanout_stats WHERE table_name = 'accounts'"; }

echo "1..7"
sess_start A
sess_start B
tap_is "$(counts)" "0|0|0" "after a reset, the table is listed with zeros"

sess_run A "SELECT count(*) FROM accounts WHERE tenant = 'tenant-7'" >/dev/null
sess_run A "SELECT count(*) FROM accounts" >/dev/null
tap_is "$(sess_run B "SELECT queries || '|' || single_shard || '|' || fan_out FROM sharding.fanout_stats WHERE table_name = 'accounts'")" \
    "2|1|1" "session B sees the statements session A ran"

# An open transaction does not hide counts: they are not transactional.
sess_run A "BEGIN" >/dev/null
sess_run A "UPDATE accounts SET balance = balance + 1 WHERE tenant = 'tenant-8'" >/dev/null
tap_is "$(counts)" "3|2|1" "a statement of an uncommitted transaction is counted at once"
sess_run A "ROLLBACK" >/dev/null

# Concurrency: 6 clients, 300 single-key statements and 20 scans each, at
# once. Every one is counted.
pids=()
for c in 1 2 3 4 5 6; do
    psql -XqAt -v ON_ERROR_STOP=1 -c "DO \$\$
        BEGIN
            FOR i IN 1..300 LOOP
                PERFORM balance FROM accounts WHERE tenant = 'tenant-' || ((i * $c) % 100);
            END LOOP;
            FOR i IN 1..20 LOOP
                PERFORM count(*) FROM accounts WHERE balance >= 0;
            END LOOP;
        END \$\$" >/dev/null &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
tap_ok $rc "6 concurrent clients ran"
tap_is "$(counts)" "$((3 + 6 * 320))|$((2 + 6 * 300))|$((1 + 6 * 20))" \
    "every one of 1,920 concurrent statements counted exactly once (1,800 single-shard, 120 fan-out)"

# A reset in B: A sees zeros and a new since.
before=$(sess_run A "SELECT since FROM sharding.fanout_stats WHERE table_name = 'accounts'")
sess_run B "SELECT sharding.fanout_reset()" >/dev/null
tap_is "$(sess_run A "SELECT queries || '|' || single_shard || '|' || fan_out FROM sharding.fanout_stats WHERE table_name = 'accounts'")" \
    "0|0|0" "a reset in session B zeroes what session A sees"
tap_is "$(sess_run A "SELECT since > '$before'::timestamptz AND since <= now() FROM sharding.fanout_stats WHERE table_name = 'accounts'")" \
    "t" "since moves to the reset"
sess_stop A
sess_stop B
exit $((TAP_FAILED > 0))
