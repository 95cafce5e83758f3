#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: detects the GPU's architecture, builds dsinfer
# (Release) with the CUDA backend for that architecture only, then runs `dsinfer doctor --json`,
# the CUDA suite (test_cuda: op conformance and the GPU forward's goldens), the CPU golden suite
# and bench/cuda/gpu_model_bench on the bench preset (and its prefill again with the routed experts
# on tensor cores), each under its own timeout and all within an
# 8-minute budget, and writes one report (markdown with JSON pieces) to REPORT.
#
# Usage: scripts/gpu-check.sh [REPORT]        (default: gpu-check-report.md)
# Environment:
#   DSINFER_GPU_CHECK_BUDGET_S  total budget in seconds (default 480)
#   DSINFER_GPU_CHECK_BUILD     build directory (default <repo>/build-gpu-check)
#   DSINFER_GPU_CHECK_MODEL     where the bench-preset model goes (default <build>/bench-model;
#                               ~12 GB; reused when a previous run completed it)
#   DSINFER_NVIDIA_SMI          the nvidia-smi to ask (default: nvidia-smi on PATH)
#   DSINFER_GPU_CHECK_PLAN_ONLY =1: print the detected architectures and the plan, build nothing
#   DSINFER_GPU_CHECK_PREBUILT  a directory holding dsinfer, test_cuda, test_backend and
#                               gpu_model_bench built elsewhere for this GPU (and, optionally, lib/
#                               with shared libraries they need): configure and build are skipped,
#                               for machines without the build dependencies (no package registry)
# Without a GPU (no nvidia-smi, or it lists no device) it says so and exits 0: there is nothing
# to check. It exits 1 when a step fails or runs out of time, 0 when every step passed.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
report="${1:-gpu-check-report.md}"
budget_s="${DSINFER_GPU_CHECK_BUDGET_S:-480}"
smi="${DSINFER_NVIDIA_SMI:-nvidia-smi}"
build="${DSINFER_GPU_CHECK_BUILD:-$root/build-gpu-check}"
model="${DSINFER_GPU_CHECK_MODEL:-$build/bench-model}"
start_s=$(date +%s)

# ---- 1. Is there a GPU, and which architecture? -------------------------------------------
caps=""
if command -v "$smi" >/dev/null 2>&1; then
  caps="$("$smi" --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' \r' |
    grep -E '^[0-9]+\.[0-9]+$' | sort -u)"
fi
if [[ -z "$caps" ]]; then
  echo "gpu-check: no NVIDIA GPU found ('$smi' is missing or lists no device): nothing to check" \
    "on this machine. Run scripts/gpu-check.sh on a machine with a GPU; 'dsinfer doctor' reports" \
    "the CPU."
  exit 0
fi

# Compute capability -> CMAKE_CUDA_ARCHITECTURES entry (the arch-specific 'a' targets where the
# release preset uses them: their wgmma / tcgen05 / FP4 instructions run only on that exact SM).
arch_for() {
  case "$1" in
    8.0) echo 80 ;;
    8.6 | 8.7) echo 86 ;;
    8.9) echo 89 ;;
    9.0) echo 90a ;;
    10.0) echo 100a ;;
    12.0) echo 120a ;;
    *) if [[ "${1%%.*}" -ge 8 ]]; then echo "${1/./}"; else echo ""; fi ;;
  esac
}
archs=""
unsupported=""
for cap in $caps; do
  a="$(arch_for "$cap")"
  if [[ -z "$a" ]]; then unsupported+=" $cap"; else archs+="${archs:+;}$a"; fi
done
echo "gpu-check: compute capabilities: $(echo $caps) -> CMAKE_CUDA_ARCHITECTURES=${archs:-none}"
if [[ -n "$unsupported" ]]; then
  echo "gpu-check: compute capability$unsupported is below sm_80, which dsinfer does not support"
fi
if [[ "${DSINFER_GPU_CHECK_PLAN_ONLY:-0}" == 1 ]]; then
  echo "gpu-check: plan: configure+build $build (Release, DSINFER_CUDA=ON), doctor --json," \
    "test_cuda, golden suite, gpu_model_bench on $model; budget ${budget_s}s; report $report"
  exit 0
fi
if [[ -z "$archs" ]]; then
  printf '# dsinfer GPU check\n\nUnsupported GPU (compute capability%s; dsinfer needs sm_80+).\n' \
    "$unsupported" >"$report"
  echo "gpu-check: wrote $report"
  exit 1
fi

# ---- 2. Steps under per-step timeouts inside the total budget ------------------------------
logs="$(mktemp -d)"
model_pid=""
# On any exit: stop a model writer still running (and its timeout wrapper), drop the logs.
cleanup() {
  if [[ -n "$model_pid" ]] && kill -0 "$model_pid" 2>/dev/null; then
    pkill -TERM -P "$model_pid" 2>/dev/null
    kill "$model_pid" 2>/dev/null
  fi
  rm -rf "$logs"
}
trap cleanup EXIT
steps_json=""
steps_md=""
doctor_status=skipped
failed=0

# step NAME CAP_S CMD...: runs CMD with timeout min(CAP_S, what is left of the budget); records
# status (pass / fail / timeout / skipped), exit code and wall time; output in $logs/NAME.log.
step() {
  local name="$1" cap="$2"
  shift 2
  local now left limit t0 rc status
  now=$(date +%s)
  left=$((budget_s - (now - start_s)))
  limit=$((cap < left ? cap : left))
  if ((limit < 5)); then
    echo "time budget of ${budget_s}s spent before this step" >"$logs/$name.log"
    status=skipped rc=-1
    steps_json+="${steps_json:+,}{\"name\":\"$name\",\"status\":\"$status\",\"rc\":$rc,\"wall_s\":0,\"timeout_s\":0}"
    steps_md+="| $name | $status | - | 0 | 0 |"$'\n'
    echo "gpu-check: $name: skipped (budget spent)"
    failed=1
    return 1
  fi
  echo "gpu-check: $name (timeout ${limit}s)..."
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local wall
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  if ((rc == 0)); then
    status=pass
  elif ((rc == 124 || rc == 137)); then
    status=timeout
  else
    status=fail
  fi
  ((rc == 0)) || failed=1
  steps_json+="${steps_json:+,}{\"name\":\"$name\",\"status\":\"$status\",\"rc\":$rc,\"wall_s\":$wall,\"timeout_s\":$limit}"
  steps_md+="| $name | $status | $rc | $wall | $limit |"$'\n'
  [[ "$name" != doctor ]] || doctor_status=$status
  echo "gpu-check: $name: $status (${wall}s)"
  return $rc
}

dsinfer="$build/apps/dsinfer"
test_cuda="$build/tests/test_cuda"
test_backend="$build/tests/test_backend"
gpu_bench="$build/bench/gpu_model_bench"
# The test binaries read their fixtures from this tree, wherever they were built.
export DSINFER_SOURCE_DIR="$root"
prebuilt="${DSINFER_GPU_CHECK_PREBUILT:-}"
# Each cap is an upper bound; the total budget bounds the whole run (a late step gets what is
# left, or is skipped). The model is written in the background while the test suites run.
if [[ -n "$prebuilt" ]]; then
  prebuilt="$(cd "$prebuilt" 2>/dev/null && pwd)" || prebuilt="${DSINFER_GPU_CHECK_PREBUILT}"
  dsinfer="$prebuilt/dsinfer" test_cuda="$prebuilt/test_cuda"
  test_backend="$prebuilt/test_backend" gpu_bench="$prebuilt/gpu_model_bench"
  export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # configure / build: nothing to run, only the binaries to find.
  step configure 5 bash -c "for b in '$dsinfer' '$test_cuda' '$test_backend' '$gpu_bench'; do
    [[ -x \"\$b\" ]] || { echo \"prebuilt binary missing: \$b\"; exit 1; }; done
    echo 'prebuilt binaries from $prebuilt (not configured or built here)'"
  step build 5 "$dsinfer" --help
else
  step configure 40 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDSINFER_WERROR=ON -DDSINFER_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs"
  step build 200 cmake --build "$build" --target dsinfer test_cuda test_backend gpu_model_bench \
    -j "$(nproc)"
fi
if [[ -x "$dsinfer" ]]; then
  mkdir -p "$(dirname "$model")"
  # The marker is written only after a complete write, so a killed writer is never reused.
  if [[ ! -f "$model/.gpu-check-complete" ]]; then
    rm -rf "$model"
    (timeout 120 "$dsinfer" create-demo-model "$model" --preset bench &&
      touch "$model/.gpu-check-complete") >"$logs/model_writer.log" 2>&1 &
    model_pid=$!
  fi
fi
step test_cuda 90 "$test_cuda" --gtest_color=no
step golden 60 "$test_backend" --gtest_filter='TinyPresets/Golden.*' --gtest_color=no
if [[ -n "$model_pid" ]]; then
  # Waits for the background writer (its own timeout is 120 s), then checks it finished.
  step create_model 60 bash -c "while kill -0 $model_pid 2>/dev/null; do sleep 1; done
    cat '$logs/model_writer.log'; test -f '$model/.gpu-check-complete'"
fi
step doctor 70 "$dsinfer" doctor --json --time-budget 55
step gpu_bench 90 "$gpu_bench" --model "$model" --context 128,4096 --decode 12 --repeats 3
# The routed FP4 experts on tensor cores (not the default until measured): the same prefill of
# 4096 tokens as above, to compare.
step gpu_bench_experts_tc 45 "$gpu_bench" --model "$model" --context 4096 --decode 2 --repeats 2 \
  --expert-gemm tensor

# ---- 3. The report -----------------------------------------------------------------------
{
  echo "# dsinfer GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "- GPUs: $("$smi" --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd';')"
  echo "- CMAKE_CUDA_ARCHITECTURES: $archs"
  echo "- host: $(nproc) CPUs; total wall time $(($(date +%s) - start_s)) s of a ${budget_s} s budget"
  echo "- note: test_cuda holds the op conformance grid and the GPU forward's golden, official-"
  echo "  numerics and chunking tests; golden is the CPU forward's suite; gpu_bench is the GPU"
  echo "  forward at batch 1 on the bench preset beside the device's measured bandwidth roofline."
  echo
  echo "| step | status | exit | wall s | timeout s |"
  echo "|---|---|---|---|---|"
  printf "%s" "$steps_md"
  echo
  echo "## Steps (JSON)"
  echo '```json'
  echo "{\"budget_s\":$budget_s,\"archs\":\"$archs\",\"failed\":$failed,\"steps\":[$steps_json]}"
  echo '```'
  echo
  echo "## dsinfer doctor --json ($doctor_status)"
  [[ "$doctor_status" == pass ]] && echo '```json' || echo '```'
  cat "$logs/doctor.log" 2>/dev/null
  echo '```'
  for name in test_cuda golden create_model gpu_bench gpu_bench_experts_tc configure build; do
    [[ -f "$logs/$name.log" ]] || continue
    echo
    echo "## $name (last 80 lines)"
    echo '```'
    tail -n 80 "$logs/$name.log"
    echo '```'
  done
} >"$report"
echo "gpu-check: wrote $report ($([[ $failed == 0 ]] && echo 'every step passed' || echo 'some steps failed'))"
exit $failed
