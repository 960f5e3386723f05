#!/usr/bin/env bash
# Oracle test vectors: the extension against `xxhsum -H3` (test/check_vectors.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PGDATABASE=sharding_vectors
dropdb --if-exists sharding_vectors; createdb sharding_vectors || exit 1
psql -XqAtc 'CREATE EXTENSION sharding' || exit 1
python3 test/check_vectors.py
rc=$?
dropdb sharding_vectors
exit $rc
