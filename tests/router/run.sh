#!/usr/bin/env bash
# Scale-out tests: three `dsinfer serve` replicas on the demo model behind the real vllm-router
# and sglang-router (pinned in requirements.txt, installed into a venv), driven through the
# official SDKs (router_test.py), and the deploy/ manifests checked against the Kubernetes
# schemas. Everything listens on 127.0.0.1 only. Exit 77 (skipped) when the pinned packages
# cannot be installed, e.g. offline without a prepared venv.
# Usage: tests/router/run.sh [BUILD_DIR] [router_test.py args...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-$root/build}"
[[ $# -gt 0 ]] && shift
build="$(cd "$build" && pwd)"
dsinfer="$build/apps/dsinfer"
[[ -x "$dsinfer" ]] || { echo "run.sh: $dsinfer not built" >&2; exit 1; }

venv="$build/router-venv"
source "$root/tests/lib/pinned_venv.sh"
pinned_venv "$venv" "$here/requirements.txt" vllm-router

"$venv/bin/kubernetes-validate" --strict "$root"/deploy/kubernetes/*.yaml

model="$build/router-test-model"
if [[ ! -f "$model/config.json" ]]; then
  "$dsinfer" create-demo-model "$model" --preset demo --seed 1 >/dev/null
fi
PATH="$venv/bin:$PATH" exec "$venv/bin/python" "$here/router_test.py" --dsinfer "$dsinfer" \
  --model "$model" --workdir "$build/router-test" "$@"
