#!/usr/bin/env bash
# The README's demo command, `bash demo/run.sh`, run as written (it builds,
# installs, starts its own throwaway cluster and removes it): it must exit 0,
# tell its nine stories in order, end with its closing line, and the
# numbers its stories show must be the ones the README promises (the
# whale's node, the rebalance moves, the writers' counts after scenes 8 and
# 9, the take_over of scene 9).
# Until 1.3 no test ran it, and a 1.3 refusal broke scene 7 unnoticed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/tap.sh

echo "1..20"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
bash demo/run.sh >"$out" 2>&1
rc=$?
ok_rc "$rc" "bash demo/run.sh exits 0"
[ "$rc" -ne 0 ] && sed 's/^/#   /' "$out" | tail -n 30

# The eight scene headers, each once, in order.
prev=0
for s in 1 2 3 4 5 6 7 8 9; do
    line=$(grep -nE "^ $s\. " "$out" | cut -d: -f1)
    if [ "$(grep -cE "^ $s\. " "$out")" = 1 ] && [ "${line:-0}" -gt "$prev" ]; then
        ok t "scene $s is told once, after scene $((s - 1))"
        prev=$line
    else
        ok f "scene $s is told once, after scene $((s - 1)) (lines: ${line:-none})"
    fi
done
is "$(grep -v '^\s*$' "$out" | tail -n 1)" \
    "Done. Everything above ran inside PostgreSQL; see README.md and docs/ for the reference." \
    "the closing line comes last, after scene 9"
ok "$( ! grep -qE '^(psql:.*)?ERROR' "$out" && echo t || echo f)" "no ERROR anywhere in the output"
# Scene 7: the load-aware rebalance moves three of the whale's neighbours
# off db2 and leaves the whale alone there (load 200).
ok "$(grep -A12 '^sharding.rebalance_by_load moves' "$out" | grep -cE '^ +[0-9]+ \| db2 +\| db[134]' | grep -qx 3 && echo t || echo f)" \
    "scene 7: rebalance_by_load moves three shards off db2"
ok "$(grep -A20 '^sharding.rebalance_by_load moves' "$out" | grep -qE '^ db2 +\| +1 \| +200 \|' && echo t || echo f)" \
    "scene 7: the whale stays alone on db2"
# Scene 8: the table is created on the coordinator only; distribute makes
# it on the three attached nodes (docs/ddl.md).
ok "$(grep -qx 'orders was created here only; distribute made it on n1, n2, n3 in one two-phase transaction.' "$out" && echo t || echo f)" \
    "scene 8: distribute creates orders on n1, n2 and n3"
# Scene 8: the job ended done, and every order the writers committed is on
# exactly one node (counts and amounts match).
ok "$(grep -A3 '^rebalance_wait returns' "$out" | grep -qE '^ done$' && echo t || echo f)" "scene 8: the rebalance job ends done"
ok "$(awk -F'|' '/orders_on_nodes/ { getline; getline; gsub(/ /, ""); print ($2 == $3 && $4 == "t") ? "t" : "f"; exit }' "$out")" \
    "scene 8: orders on the nodes equal orders written, amounts match"
# Scene 9: the promoted standby's take_over makes both nodes follow it, a
# pin made then reaches both, and the writers on the nodes never had a write
# refused nor a row on the wrong node.
ok "$(grep -A3 'SELECT sharding.take_over();' "$out" | grep -qE '^ +2$' && echo t || echo f)" "scene 9: take_over() returns 2"
ok "$([ "$(grep -cE "^node_for\('fo', 'whale'\) on f[12]: f2$" "$out")" = 2 ] && echo t || echo f)" \
    "scene 9: the pin made after take_over is on both nodes"
ok "$([ "$(grep -cE '^f[12]: [1-9][0-9]* orders written, 0 refused, 0 on the wrong node$' "$out")" = 2 ] && echo t || echo f)" \
    "scene 9: both writers wrote on, none refused, none on the wrong node"
exit $failures
