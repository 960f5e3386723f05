#!/usr/bin/env bash
# Every single-node SQL example of README.md and of every page of docs/
# (docs/*.md, whoever wrote it), run and checked as written: one fresh
# database per section, `-- → VALUE` results and `-- ERROR SQLSTATE` errors
# compared with what PostgreSQL answers (test/lib/readme_examples.py
# describes the convention). A page without runnable examples adds nothing.
# `sql node=NAME` blocks run in the multi-node harness
# (test/tap/630_readme_multinode.pl) instead; Go/Java and `sql norun` blocks are
# counted as skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
exec /usr/bin/python3 test/lib/readme_examples.py single README.md docs/*.md
