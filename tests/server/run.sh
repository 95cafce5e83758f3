#!/usr/bin/env bash
# End-to-end server tests: the official openai / anthropic SDKs (pinned in requirements.txt)
# against `dsinfer serve` on a demo model, then a graceful-shutdown check (SIGTERM -> exit 0).
# Usage: tests/server/run.sh [BUILD_DIR] [pytest args...]   (BUILD_DIR defaults to ./build)
# Everything listens on 127.0.0.1 only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${1:-$root/build}"
[[ $# -gt 0 ]] && shift
build="$(cd "$build" && pwd)"
dsinfer="$build/apps/dsinfer"
[[ -x "$dsinfer" ]] || { echo "run.sh: $dsinfer not built" >&2; exit 1; }

venv="$build/server-venv"
source "$root/tests/lib/pinned_venv.sh"
pinned_venv "$venv" "$here/requirements.txt" pytest

# DSINFER_SERVER_PRESET picks the demo checkpoint the suites run against (demo: V4-Flash's shape;
# demo-v4.1: V4.1-Flash's, with Engram and its own chat encoding); the suites are the same.
preset="${DSINFER_SERVER_PRESET:-demo}"
suffix=""
[[ "$preset" == demo ]] || suffix="-$preset"
source "$here/server_test_model.sh"
model="$(server_test_model "$dsinfer" "$build" "$preset")"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
key="sk-test-$RANDOM$RANDOM"
log="$build/server-test$suffix.log"
"$dsinfer" serve --model "$model" --host 127.0.0.1 --port "$port" --api-key "$key" \
  --served-model-name dsinfer-test --max-model-len 4096 --max-tokens-limit 1024 --threads 2 \
  --max-connections 64 --shutdown-timeout 5 >"$log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
trap cleanup EXIT

for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then break; fi
  kill -0 "$pid" 2>/dev/null || { echo "server died:"; cat "$log"; exit 1; }
  sleep 0.2
done
curl -sf "http://127.0.0.1:$port/ready" >/dev/null || { echo "server never became ready"; cat "$log"; exit 1; }

status=0
expect_version=v4
[[ "$preset" == *v4.1* ]] && expect_version=v4.1
DSINFER_URL="http://127.0.0.1:$port" DSINFER_KEY="$key" DSINFER_MODEL=dsinfer-test \
  DSINFER_EXPECT_VERSION="$expect_version" \
  DSINFER_BIN="$dsinfer" DSINFER_MODEL_DIR="$model" \
  "$venv/bin/pytest" -q -p no:cacheprovider "$here" "$@" || status=$?

# Graceful shutdown: SIGTERM while a request streams; the stream must end properly (finished or
# aborted, then [DONE]) and the process must exit 0 by the deadline.
stream_out="$build/server-test-stream$suffix.txt"
curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer $key" \
  -H "Content-Type: application/json" \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1000,"ignore_eos":true,"stream":true}' \
  >"$stream_out" 2>/dev/null &
curl_pid=$!
for _ in $(seq 1 100); do grep -q '^data: ' "$stream_out" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$pid"
for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then echo "server did not stop after SIGTERM"; status=1; else
  rc=0; wait "$pid" || rc=$?
  [[ $rc -eq 0 ]] || { echo "server exited $rc after SIGTERM"; status=1; }
fi
wait "$curl_pid" || true
tail -c 200 "$stream_out" | grep -q 'data: \[DONE\]' || { echo "in-flight stream did not end cleanly"; status=1; }
grep -q '"finish_reason":"\(aborted\|length\)"' "$stream_out" || { echo "in-flight stream has no finish"; status=1; }
trap - EXIT
grep -q "$key" "$log" && { echo "the API key appeared in the log"; status=1; }
exit $status
