#!/usr/bin/env bash
# Prefill/decode disaggregation e2e: 1 prefill + 2 decode dsinfer workers of the demo model behind
# the real vllm-router (--vllm-pd-disaggregation), checked against a --role both server
# (tests/router/pd_test.py). The routers' venv is tests/router/run.sh's. Everything listens on
# 127.0.0.1; the KV transfer runs over UCX's TCP transport on loopback. Exit 77 (skipped) when the
# pinned packages cannot be installed.
# With --sglang (right after BUILD_DIR): the same behind sglang-router's --pd-disaggregation
# (tests/router/pd_sglang_test.py).
# Usage: tests/router/pd_run.sh [BUILD_DIR] [--sglang] [pd_test.py args...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-$root/build}"
[[ $# -gt 0 ]] && shift
build="$(cd "$build" && pwd)"
test_script="pd_test.py"
workdir="$build/router-pd-test"
if [[ "${1:-}" == "--sglang" ]]; then
  shift
  test_script="pd_sglang_test.py"
  workdir="$build/router-pd-sglang-test"
fi
dsinfer="$build/apps/dsinfer"
[[ -x "$dsinfer" ]] || { echo "pd_run.sh: $dsinfer not built" >&2; exit 1; }

venv="$build/router-venv"
source "$root/tests/lib/pinned_venv.sh"
pinned_venv "$venv" "$here/requirements.txt" vllm-router

model="$build/router-test-model"
if [[ ! -f "$model/config.json" ]]; then
  "$dsinfer" create-demo-model "$model" --preset demo --seed 1 >/dev/null
fi
PATH="$venv/bin:$PATH" exec "$venv/bin/python" "$here/$test_script" --dsinfer "$dsinfer" \
  --model "$model" --workdir "$workdir" "$@"
