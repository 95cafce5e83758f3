#!/usr/bin/env bash
# Configures and builds dsinfer. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSINFER_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
