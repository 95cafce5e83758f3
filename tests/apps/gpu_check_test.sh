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
assert names == ["configure", "build", "test_cuda", "golden", "doctor", "gpu_bench",
                 "gpu_bench_experts_tc"], names
assert all(s["status"] == "skipped" for s in steps["steps"]), steps
assert "| doctor | skipped |" in text
PY
[[ ! -e "$work/build" ]] || { echo "something was built with the budget spent"; exit 1; }

# 5. Prebuilt binaries (DSINFER_GPU_CHECK_PREBUILT): nothing is configured or built; every step
# runs the given binaries with their lib/ on the library path and this tree as the fixtures'
# source. Stand-ins record what they were run with.
pre="$work/prebuilt"
mkdir -p "$pre/lib"
for b in test_cuda test_backend gpu_model_bench; do
  printf '#!/bin/sh\necho "%s $* src=$DSINFER_SOURCE_DIR lib=$LD_LIBRARY_PATH" >>"%s/calls"\n' \
    "$b" "$work" >"$pre/$b"
done
{
  echo '#!/bin/sh'
  echo "echo \"dsinfer \$*\" >>\"$work/calls\""
  echo 'if [ "$1" = create-demo-model ]; then mkdir -p "$2"; fi'
  echo 'if [ "$1" = doctor ]; then echo "{\"gpu\": {}}"; fi'
  echo 'exit 0'
} >"$pre/dsinfer"
chmod +x "$pre"/*
DSINFER_NVIDIA_SMI="$(fake_smi hopper2 9.0)" DSINFER_GPU_CHECK_PREBUILT="$pre" \
  DSINFER_GPU_CHECK_BUILD="$work/build-pre" "$script" "$work/pre.md" >/dev/null ||
  { echo "prebuilt run failed"; cat "$work/pre.md"; exit 1; }
python3 - "$work/pre.md" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
steps = json.loads(re.search(r"## Steps \(JSON\)\n```json\n(.*?)\n```", text, re.S).group(1))
names = [s["name"] for s in steps["steps"]]
assert names == ["configure", "build", "test_cuda", "golden", "create_model", "doctor",
                 "gpu_bench", "gpu_bench_experts_tc"], names
assert all(s["status"] == "pass" for s in steps["steps"]), steps
PY
grep -q "^test_cuda --gtest_color=no src=$root lib=$pre/lib" "$work/calls"
grep -q "^gpu_model_bench --model $work/build-pre/bench-model" "$work/calls"
grep -q "^gpu_model_bench .*--expert-gemm tensor" "$work/calls"
grep -q "^dsinfer doctor --json" "$work/calls"
[[ ! -e "$work/build-pre/CMakeCache.txt" ]] || { echo "a prebuilt run configured"; exit 1; }
echo "gpu-check script ok"
