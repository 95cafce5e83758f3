#!/usr/bin/env bash
# Speculative decoding through `dsinfer serve` against the same server without it
# (speculative_e2e.py). Usage: tests/server/speculative_e2e.sh BUILD_DIR PRESET [K]
# PRESET demo (V4's MTP block) or demo-v4.1 (V4.1's dSpark stages); the checkpoints are the ones
# tests/server/run.sh writes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:?build dir}" && pwd)"
preset="${2:?preset}"
k="${3:-3}"
dsinfer="$build/apps/dsinfer"
suffix=""
[[ "$preset" == demo ]] || suffix="-$preset"
model="$build/server-test-model$suffix"
tokenizer_args=()
if [[ "$preset" == *v4.1* ]]; then  # Engram's token map is built from V4.1's own tokenizer
  tokenizer_args=(--tokenizer "$root/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json"
    --tokenizer-overlay "$root/tests/fixtures/v41/tokenizer_overlay.json")
fi
[[ -f "$model/config.json" ]] ||
  "$dsinfer" create-demo-model "$model" --preset "$preset" --seed 1 "${tokenizer_args[@]}"
python3 "$here/speculative_e2e.py" "$dsinfer" "$model" --k "$k" --log "$build/speculative-e2e$suffix.log"
