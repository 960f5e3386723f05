#!/usr/bin/env bash
# The pure C++ rebalance planner and pin table, compiled and tested on their
# own (test/unit/rebalance_test.cpp): no PostgreSQL involved.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
g++ -std=c++17 -O2 -Wall -Wextra -Werror -Isrc test/unit/rebalance_test.cpp src/rebalance.cpp \
    src/route_cache.cpp -o "$out/rebalance_test" || { echo "1..1"; echo "not ok 1 - compile"; exit 1; }
"$out/rebalance_test"
