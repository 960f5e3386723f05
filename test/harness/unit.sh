#!/usr/bin/env bash
# Pure C++ unit tests (test/unit/*_test.cpp) of the PostgreSQL-free core:
# hashing, fastmod, jump hash, dealing (src/core/hash_core.hpp), the rebalance
# planner and the pin table. Each test binary prints TAP.
set -uo pipefail
cd "$(dirname "$0")/../.."
# The sources that include no PostgreSQL header.
PURE_SOURCES=$(ls src/core/*.cpp)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rc=0
for t in test/unit/*_test.cpp; do
    bin=$out/$(basename "$t" .cpp)
    # shellcheck disable=SC2086
    if ! g++ -std=c++17 -O2 -Wall -Wextra -Werror -Isrc -o "$bin" "$t" $PURE_SOURCES; then
        echo "not ok - $t does not compile"
        rc=1
        continue
    fi
    "$bin" || rc=1
done
exit $rc
