#!/usr/bin/env bash
# Speculative decoding through `dsinfer serve` against the same server without it
# (speculative_e2e.py). Usage: tests/server/speculative_e2e.sh BUILD_DIR PRESET [K]
# PRESET demo (V4's MTP block) or demo-v4.1 (V4.1's dSpark stages); the checkpoints are the ones
# tests/server/run.sh writes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:?build dir}" && pwd)"
preset="${2:?preset}"
k="${3:-3}"
dsinfer="$build/apps/dsinfer"
source "$here/server_test_model.sh"
model="$(server_test_model "$dsinfer" "$build" "$preset")"
python3 "$here/speculative_e2e.py" "$dsinfer" "$model" --k "$k" --log "$build/speculative-e2e-$preset.log"
