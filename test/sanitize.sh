#!/usr/bin/env bash
# The whole test suite against an AddressSanitizer + UndefinedBehaviorSanitizer
# build of the extension (not part of CI: it is slower).
#
#   bash test/sanitize.sh        (or: make sanitize)
#
# The extension is compiled with -fsanitize=undefined and
# -fno-sanitize-recover=all, so any undefined behaviour aborts the backend and
# fails the run; every report is also written to a file, and the run fails if
# there is any.
#
# AddressSanitizer: SANITIZE=address,undefined bash test/sanitize.sh builds
# with ASan too and preloads its runtime into the server. On Debian 12 this
# does not work yet: Debian's postgres binary hangs in glibc's bindtextdomain
# (a corrupted _nl_state_lock) as soon as any ASan runtime (gcc 12 or clang
# 14) is preloaded, before our library is loaded, even for `postgres
# --version`. Leak detection would be off anyway: PostgreSQL frees memory by
# dropping whole memory contexts, which LeakSanitizer reports as leaks.
set -uo pipefail
cd "$(dirname "$0")/.."
reports=$(mktemp -d /tmp/sharding-sanitize.XXXXXX)
chmod 777 "$reports"
asan=$(gcc -print-file-name=libasan.so)
SANITIZE=${SANITIZE:-undefined}
export SHARDING_MAKE_FLAGS="SANITIZE=$SANITIZE"
env="UBSAN_OPTIONS=print_stacktrace=1:log_path=$reports/ubsan"
case $SANITIZE in
    *address*) env="LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$reports/asan $env" ;;
esac
export SHARDING_SERVER_ENV=$env
bash test/run.sh
rc=$?
n=$(find "$reports" -type f | wc -l)
echo "sanitizer reports: $n (in $reports)"
find "$reports" -type f -exec head -30 {} \;
[ "$rc" -eq 0 ] && [ "$n" -eq 0 ]
