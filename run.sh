#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, creates the embedded demo model
# (random weights in the official DeepSeek-V4 layout) and runs it.
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
"$root/scripts/build.sh" "$root/build"
model="$root/demo-model"
if [[ ! -f "$model/config.json" ]]; then
  "$root/build/apps/dsinfer" create-demo-model "$model" --preset demo --seed 1 \
    --tokenizer "$root/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json"
fi
exec "$root/build/apps/dsinfer" serve --model "$model" "$@"
