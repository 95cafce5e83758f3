#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, creates the embedded demo model
# (random weights in the official DeepSeek-V4 layout) and runs it.
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
"$root/scripts/build.sh" "$root/build"
model="$root/demo-model"
if [[ ! -f "$model/config.json" ]]; then
  "$root/build/apps/dsinfer" create-demo-model "$model" --preset demo --seed 1
fi
exec "$root/build/apps/dsinfer" generate --model "$model" --prompt-ids 0,128803,1000,2000,3000,128804 \
  --max-tokens 16 "$@"
