#!/usr/bin/env bash
# The README harness can fail: test/lib/readme_examples.py runs over
# test/lib/readme_fixture.md, where every check of a "Right" section must
# pass and every check of a "Wrong" section must fail; `sql norun` and Go
# blocks are skipped; the nodes mode runs blocks in document order across
# two sessions. TAP.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/lib/tap.sh
echo "1..9"
out=$(/usr/bin/python3 test/lib/readme_examples.py single test/lib/readme_fixture.md 2>&1)
rc=$?
right_ok=$(grep -E '^ok [0-9]+ - Right' <<<"$out" | grep -vc '# SKIP')
right_bad=$(grep -cE '^not ok [0-9]+ - Right' <<<"$out")
wrong_ok=$(grep -E '^ok [0-9]+ - Wrong' <<<"$out" | grep -vc 'every other statement')
wrong_bad=$(grep -cE '^not ok [0-9]+ - Wrong' <<<"$out")
skips=$(grep -cE '^ok [0-9]+ - .*# SKIP' <<<"$out")
ok "$([ "$right_bad" = 0 ] && [ "$right_ok" = 21 ] && echo t || echo "$right_ok ok, $right_bad not ok")" \
   "every check of the Right sections passes (21 lines)"
ok "$([ "$wrong_ok" = 0 ] && [ "$wrong_bad" = 7 ] && echo t || echo "$wrong_ok ok, $wrong_bad not ok")" \
   "every check of the Wrong section fails (7 lines)"
ok "$([ "$skips" = 2 ] && echo t || echo "$skips")" "the sql norun and the go block are skipped"
ok "$([ "$rc" -ne 0 ] && echo t || echo "rc $rc")" "a failing check makes the exit status non-zero"
ok "$(grep -q '^1\.\.31$' <<<"$out" && echo t || echo "$(grep '^1\.\.' <<<"$out")")" "the plan counts every line (31)"
ok "$(psql -XAtqd postgres -c "SELECT count(*) = 0 FROM pg_database WHERE datname LIKE 'readme\_%'")" \
   "no readme_<n> database is left behind"

# nodes mode: two sessions, in document order, on two databases.
for db in readme_na readme_nb; do dropdb --if-exists "$db" 2>/dev/null; createdb "$db" || exit 1; done
cat >"${TMPDIR:-/tmp}/readme_nodes.$$.md" <<'MD'
## Two nodes
```sql node=a
CREATE TABLE x (v int);
BEGIN;
INSERT INTO x VALUES (1);
```
```sql node=b
SELECT count(*) FROM pg_class WHERE relname = 'x';  -- → 0
```
```sql node=a
SELECT count(*) FROM x;  -- → 1
COMMIT;
```
```sql node=b
SELECT 7;  -- → 8
```
MD
nout=$(/usr/bin/python3 test/lib/readme_examples.py nodes "${TMPDIR:-/tmp}/readme_nodes.$$.md" a="dbname=readme_na" b="dbname=readme_nb" 2>&1)
nrc=$?
rm -f "${TMPDIR:-/tmp}/readme_nodes.$$.md"
ok "$(grep -cE '^ok [0-9]+ - Two nodes: line [0-9]+: .*\[(a|b)\]' <<<"$nout" | grep -qx 2 && echo t || echo "$nout")" \
   "nodes mode: each block runs on its node, in order, one session per node"
ok "$(grep -qE '^not ok [0-9]+ - Two nodes: line [0-9]+: SELECT 7; \[b\]' <<<"$nout" && echo t || echo "$nout")" \
   "nodes mode: a wrong value fails"
ok "$([ "$nrc" -ne 0 ] && echo t || echo "rc $nrc")" "nodes mode: a failure makes the exit status non-zero"
for db in readme_na readme_nb; do dropdb --if-exists "$db"; done
exit $failures
