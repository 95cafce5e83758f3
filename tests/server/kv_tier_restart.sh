#!/usr/bin/env bash
# The disk KV tier across a SIGTERM restart of `dsinfer serve` on the demo model
# (kv_tier_restart.py). Usage: tests/server/kv_tier_restart.sh BUILD_DIR [PREFIX_TOKENS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:?build dir}" && pwd)"
prefix="${2:-1024}"
dsinfer="$build/apps/dsinfer"
model="$build/measure-test-model"  # the demo checkpoint tests/measure/e2e.sh uses too
[[ -f "$model/config.json" ]] || "$dsinfer" create-demo-model "$model" --preset demo --seed 1
cache="$(mktemp -d "${TMPDIR:-/tmp}/dsinfer-kv-tier.XXXXXX")"
trap 'rm -rf "$cache"' EXIT
python3 "$here/kv_tier_restart.py" "$dsinfer" "$model" "$cache" --prefix "$prefix" \
  --log "$build/kv-tier-restart-$prefix.log"
