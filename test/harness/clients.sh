#!/usr/bin/env bash
# The client snippets of docs/hashing.md (Python, Node) against the extension
# (test/check_clients.py). Debian's python3-xxhash serves /usr/bin/python3,
# which need not be the python3 first on PATH.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_clients
dropdb --if-exists sharding_clients; createdb sharding_clients || exit 1
psql -XqAtc 'CREATE EXTENSION sharding' || exit 1
/usr/bin/python3 test/check_clients.py
rc=$?
dropdb sharding_clients
exit $rc
