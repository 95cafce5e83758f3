#!/usr/bin/env bash
# The disk KV tier on a real 1 MiB tmpfs that fills up and is then remounted read-only under the
# running server (kv_tier_real_fs.py): ENOSPC and EROFS from the kernel, not from a test hook.
# The mount lives in a private mount namespace (as root: unshare -m; otherwise a user namespace
# maps the caller to root in it), so nothing leaks into the host; without either the test skips
# (exit 77) and the hook-driven tests (tests/runtime kv_store_test.cc) still cover the faults.
# Usage: tests/server/kv_tier_real_fs.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ "${1:-}" != --inside ]]; then
  build="$(cd "${1:?build dir}" && pwd)"
  if unshare -m --propagation private true 2>/dev/null; then
    exec unshare -m --propagation private "$0" --inside "$build"
  fi
  if unshare -Urm true 2>/dev/null; then
    exec unshare -Urm "$0" --inside "$build"
  fi
  echo "SKIP: no private mount namespace here (unshare -m and -Urm refused)"
  exit 77
fi
build="$2"
dsinfer="$build/apps/dsinfer"
model="$build/measure-test-model"  # the demo checkpoint tests/measure/e2e.sh uses too
[[ -f "$model/config.json" ]] || "$dsinfer" create-demo-model "$model" --preset demo --seed 1
cache="$(mktemp -d "${TMPDIR:-/tmp}/dsinfer-kv-real-fs.XXXXXX")"
if ! mount -t tmpfs -o size=1m,mode=0755 dsinfer-kv-test "$cache"; then
  rmdir "$cache"
  echo "SKIP: cannot mount a tmpfs in the mount namespace"
  exit 77
fi
trap 'umount "$cache" 2>/dev/null; rmdir "$cache" 2>/dev/null || true' EXIT
python3 "$here/kv_tier_real_fs.py" "$dsinfer" "$model" "$cache" --log "$build/kv-tier-real-fs.log"
