#!/usr/bin/env bash
# Benchmark (not a test): what shard_checksum costs per row.
#
#   SHARDING_PGROOT=/tmp/pgroot-mine bash test/bench/checksum/run.sh [rows] [runs]
#
# One instance, database `coord` with map m of one logical shard on node n1,
# table docs (rows rows, default 1,000,000, a text key and two text columns)
# distributed on it. Timed, alternating, `runs` times each (default 5):
#   ours:   SELECT * FROM sharding.shard_checksum('m', 0, 'docs')
#   sql13:  the same sum as 1.3 wrote it, hash64 of each row cast to numeric
#           (hand-written: count(*), sum(hash64(t::text)::numeric) over the
#           rows whose logical_shard is 0)
#   bigint: the same hand-written query summing hash64 as bigint (what
#           shard_checksum does since 1.4)
# and checked to agree (rows and the sum modulo 2^64). The report is the
# median ms of each and the ratio ours / sql13.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. test/bench/lib.sh
ROWS=${1:-1000000}
RUNS=${2:-5}

bench_setup
psql -XqAt -v ON_ERROR_STOP=1 -c 'CREATE DATABASE coord' >/dev/null
export PGDATABASE=coord
psql -XqAt -v ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE EXTENSION sharding;
CREATE TABLE docs (k text PRIMARY KEY, a text NOT NULL, b bigint NOT NULL);
SELECT sharding.add_node('n1', 'host=$PGHOST port=$PGPORT dbname=coord');
SELECT sharding.create_map('m', 1, ARRAY['n1']);
SELECT sharding.distribute('docs', 'k', 'm');
INSERT INTO docs SELECT 'Tenant-' || i, md5(i::text), i * 7 FROM generate_series(1, $ROWS) i;
VACUUM ANALYZE docs;
SQL

ours="SELECT * FROM sharding.shard_checksum('m', 0, 'docs')"
hand() {
    echo "SELECT count(*), (coalesce(sum(sharding.hash64(t::text)$1), 0) % 18446744073709551616 + 18446744073709551616) % 18446744073709551616
            FROM docs t WHERE sharding.logical_shard('m', t.k) = 0"
}
sql13=$(hand '::numeric')
big=$(hand '')
# The three agree (the function's bigint is the sum modulo 2^64, signed).
a=$(psql -XAt -F ' ' -c "SELECT r, (c::numeric + 18446744073709551616) % 18446744073709551616 FROM ($ours) s(r, c)")
b=$(psql -XAt -F ' ' -c "$sql13")
c=$(psql -XAt -F ' ' -c "$big")
[ "$a" = "$b" ] && [ "$b" = "$c" ] || { echo "the checksums disagree: ours '$a', 1.3's '$b', bigint '$c'" >&2; exit 1; }
[ "${a%% *}" = "$ROWS" ] || { echo "expected $ROWS rows, got '$a'" >&2; exit 1; }

t_ours=() t_13=() t_big=()
for _ in $(seq "$RUNS"); do
    t_ours+=("$(time_ms "$ours")")
    t_13+=("$(time_ms "$sql13")")
    t_big+=("$(time_ms "$big")")
done
m_ours=$(printf '%s\n' "${t_ours[@]}" | median)
m_13=$(printf '%s\n' "${t_13[@]}" | median)
m_big=$(printf '%s\n' "${t_big[@]}" | median)
echo "rows $ROWS, median of $RUNS (ms): shard_checksum $m_ours, 1.3's numeric sum $m_13, bigint sum $m_big"
echo "runs: ours ${t_ours[*]}; 1.3 ${t_13[*]}; bigint ${t_big[*]}"
python3 -c "import sys; print('ratio shard_checksum / 1.3 sum: %.2f; bigint / numeric: %.2f' % (float(sys.argv[1]) / float(sys.argv[2]), float(sys.argv[3]) / float(sys.argv[2])))" "$m_ours" "$m_13" "$m_big"
