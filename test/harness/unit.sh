#!/usr/bin/env bash
# Pure C++ unit tests of src/*_core.hpp and other PostgreSQL-free code (TAP).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for t in test/unit/*_test.cpp; do
    bin=$out/$(basename "$t" .cpp)
    extra=$(ls src/*_core.cpp 2>/dev/null || true)
    # shellcheck disable=SC2086
    g++ -std=c++17 -O2 -Wall -Wextra -Werror -Isrc -o "$bin" "$t" $extra || { echo "not ok - $t does not compile"; exit 1; }
    "$bin" || exit 1
done
