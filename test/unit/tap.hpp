// Minimal TAP output for the C++ unit tests (test/unit/*_test.cpp).
#pragma once

#include <cstdio>

namespace tap {
inline int test_no = 0, failures = 0;

// One TAP line: "ok N - what" or "not ok N - what".
inline void check(bool ok, const char *what) {
    ++test_no;
    if (!ok) ++failures;
    std::printf("%s %d - %s\n", ok ? "ok" : "not ok", test_no, what);
}

// The test binary's exit status.
inline int status() { return failures ? 1 : 0; }
}  // namespace tap
