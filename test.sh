#!/usr/bin/env bash
# The README's second command: builds (warnings are errors) and runs every test, then runs the
# library and server suites and the fuzz corpora again under AddressSanitizer +
# UndefinedBehaviorSanitizer.
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
# Disk: a run from a clean clone writes about 20 GB (measured 2026-12-07: the bench preset's
# checkpoint for logit_hashes_bench 12.5 GB, the release and ASan trees with their test
# checkpoints and the client venvs 7 GB). Checked first, so that a full disk is one clear
# message instead of tests failing here and there with ENOSPC.
bench_model="${DSINFER_BENCH_MODEL:-$root/build/bench-model-seed1}"
need_gb=10
[[ -f "$bench_model/model.safetensors.index.json" ]] || need_gb=$((need_gb + 13))
free_gb="$(df -B1G --output=avail "$root" | tail -1 | tr -d ' ')"
if (( free_gb < need_gb )); then
  echo "test.sh: $free_gb GB free on $root's disk; a test run needs about $need_gb GB" \
    "(13 GB of it the bench checkpoint; DSINFER_BENCH_MODEL can name an existing one)" >&2
  exit 1
fi
"$root/scripts/build.sh" "$root/build"
# Label soak: long runs (a 10-minute churn, 4k-token restarts, 200k-draw distributions) that a
# test run skips; `ctest --test-dir build -L soak` runs them.
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" -LE soak
if [[ "${DSINFER_SKIP_SANITIZERS:-0}" != 1 ]]; then
  "$root/scripts/build.sh" "$root/build-asan" -DDSINFER_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$root/build-asan" --output-on-failure -j "$(nproc)" -L 'core|io|net|text|grammar|model|backend|runtime|transfer|server|measure|fuzz' -LE not_sanitized
fi
