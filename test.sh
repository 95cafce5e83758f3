#!/usr/bin/env bash
# The README's second command: builds (warnings are errors) and runs every test, then runs the
# library and server suites and the fuzz corpora again under AddressSanitizer +
# UndefinedBehaviorSanitizer.
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
"$root/scripts/build.sh" "$root/build"
# Label soak: long runs (a 10-minute churn, 4k-token restarts, 200k-draw distributions) that a
# test run skips; `ctest --test-dir build -L soak` runs them.
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" -LE soak
if [[ "${DSINFER_SKIP_SANITIZERS:-0}" != 1 ]]; then
  "$root/scripts/build.sh" "$root/build-asan" -DDSINFER_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$root/build-asan" --output-on-failure -j "$(nproc)" -L 'core|io|net|text|grammar|model|backend|runtime|transfer|server|measure|fuzz' -LE not_sanitized
fi
