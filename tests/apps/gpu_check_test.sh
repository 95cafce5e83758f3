#!/usr/bin/env bash
# scripts/gpu-check.sh without a GPU and with stand-in nvidia-smi programs: no GPU gives a clear
# message and exit 0 (no report); compute capabilities map to the right CMAKE_CUDA_ARCHITECTURES;
# a pre-sm_80 GPU is reported unsupported; a spent budget skips every step and still writes a
# report whose JSON piece parses. Nothing is built. Usage: tests/apps/gpu_check_test.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
script="$root/scripts/gpu-check.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

fake_smi() {  # fake_smi NAME LINES...: an nvidia-smi that prints LINES for any query
  local f="$work/$1"
  shift
  { echo '#!/bin/sh'; for l in "$@"; do echo "echo '$l'"; done; } >"$f"
  chmod +x "$f"
  echo "$f"
}

# 1. No nvidia-smi at all, and one that lists no device (it fails as without a driver).
for smi in "$work/missing-nvidia-smi" "$(fake_smi empty-smi)"; do
  out="$(DSINFER_NVIDIA_SMI="$smi" "$script" "$work/r.md")" || { echo "exit $? without a GPU"; exit 1; }
  grep -q "no NVIDIA GPU found" <<<"$out" || { echo "unclear message: $out"; exit 1; }
  [[ ! -e "$work/r.md" ]] || { echo "a report was written without a GPU"; exit 1; }
done

# 2. Architecture selection: distinct capabilities, arch-specific targets for 9.0/10.0/12.0.
out="$(DSINFER_NVIDIA_SMI="$(fake_smi mixed 9.0 8.9 9.0)" DSINFER_GPU_CHECK_PLAN_ONLY=1 "$script")"
grep -q "CMAKE_CUDA_ARCHITECTURES=89;90a$" <<<"$out" || { echo "wrong archs: $out"; exit 1; }
for pair in 8.0:80 8.6:86 10.0:100a 12.0:120a; do
  out="$(DSINFER_NVIDIA_SMI="$(fake_smi "cap${pair%%:*}" "${pair%%:*}")" DSINFER_GPU_CHECK_PLAN_ONLY=1 "$script")"
  grep -q "CMAKE_CUDA_ARCHITECTURES=${pair#*:}$" <<<"$out" || { echo "wrong arch for $pair: $out"; exit 1; }
done

# 3. A Turing GPU: unsupported, said in the report, exit 1.
if DSINFER_NVIDIA_SMI="$(fake_smi turing 7.5)" "$script" "$work/turing.md" >/dev/null; then
  echo "an sm_75-only machine passed"; exit 1
fi
grep -q "Unsupported GPU (compute capability 7.5" "$work/turing.md"

# 4. A spent budget: every step skipped, the report still written with a parseable JSON piece.
if DSINFER_NVIDIA_SMI="$(fake_smi hopper 9.0)" DSINFER_GPU_CHECK_BUDGET_S=0 \
  DSINFER_GPU_CHECK_BUILD="$work/build" "$script" "$work/spent.md" >/dev/null; then
  echo "a run with every step skipped passed"; exit 1
fi
python3 - "$work/spent.md" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
steps = json.loads(re.search(r"## Steps \(JSON\)\n```json\n(.*?)\n```", text, re.S).group(1))
assert steps["archs"] == "90a" and steps["failed"] == 1, steps
names = [s["name"] for s in steps["steps"]]
assert names == ["configure", "build", "test_cuda", "golden", "doctor", "gpu_bench"], names
assert all(s["status"] == "skipped" for s in steps["steps"]), steps
assert "| doctor | skipped |" in text
PY
[[ ! -e "$work/build" ]] || { echo "something was built with the budget spent"; exit 1; }
echo "gpu-check script ok"
