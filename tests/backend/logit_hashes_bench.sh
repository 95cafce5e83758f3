#!/usr/bin/env bash
# logit_hashes_bench: the bench preset's logit hashes (tests/backend/logit_hash_test.cc), with this
# machine's kernels and with the FP32 kernels. The checkpoint (12 GB, deterministic from its seed)
# is written into the build tree on the first run and reused after.
set -euo pipefail
build="$1"
# DSINFER_BENCH_MODEL: an existing checkpoint of that command (several build trees share one).
model="${DSINFER_BENCH_MODEL:-$build/bench-model-seed1}"
if [[ ! -f "$model/model.safetensors.index.json" ]]; then
  rm -rf "$model"
  "$build/apps/dsinfer" create-demo-model "$model.tmp" --preset bench --seed 1 >/dev/null
  mv "$model.tmp" "$model"
fi
export DSINFER_BENCH_MODEL="$model"
"$build/tests/test_backend" --gtest_filter='LogitHashesBench.*'
DSINFER_CPU_AMX=0 DSINFER_CPU_BF16DOT=0 "$build/tests/test_backend" --gtest_filter='LogitHashesBench.*'
