#!/usr/bin/env bash
# End-to-end: `dsinfer bench serve` against `dsinfer serve` on the demo model; each level of the
# JSON report must agree with the server's own /metrics delta over that level, and the synthetic
# prompts must not hit the prefix cache (check_metrics.py). 127.0.0.1 only.
# Usage: tests/measure/e2e.sh BUILD_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:?build dir}" && pwd)"
dsinfer="$build/apps/dsinfer"
model="$build/measure-test-model"
[[ -f "$model/config.json" ]] || "$dsinfer" create-demo-model "$model" --preset demo --seed 1
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$build/measure-e2e-server.log"
"$dsinfer" serve --model "$model" --host 127.0.0.1 --port "$port" --threads 2 \
  --max-model-len 4096 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { echo "server died:"; cat "$log"; exit 1; }
  sleep 0.2
done
report="$build/measure-e2e-report.json"
"$dsinfer" bench serve --url "http://127.0.0.1:$port" --num-prompts 12 --input-len 32 \
  --output-len 8 --concurrency 1,4 --seed 1 --output-json "$report" --csv "$build/measure-e2e.csv"
curl -sf "http://127.0.0.1:$port/metrics" >"$build/measure-e2e-metrics.txt"
python3 "$here/check_metrics.py" "$report" "$build/measure-e2e-metrics.txt" --no-cache-hits
