#!/usr/bin/env bash
# End-to-end: `dsinfer bench serve` against `dsinfer serve` on the demo model; each level of the
# JSON report must agree with the server's own /metrics delta over that level, and the synthetic
# prompts must not hit the prefix cache (check_metrics.py). Then a --prompts file run whose lines
# repeat must show cache hits (so the no-hits check can fail), and a run with length distributions
# must report realized mean lengths inside their ranges; --plot-dir PNGs must decode. 127.0.0.1 only.
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
  --output-len 8 --concurrency 1,4 --seed 1 --output-json "$report" --csv "$build/measure-e2e.csv" \
  --plot-dir "$build/measure-e2e-plots"
curl -sf "http://127.0.0.1:$port/metrics" >"$build/measure-e2e-metrics.txt"
python3 "$here/check_metrics.py" "$report" "$build/measure-e2e-metrics.txt" --no-cache-hits

# The plots must decode with Python's zlib (an independent inflate) to full-size indexed images.
python3 - "$build/measure-e2e-plots" <<'PY'
import os, struct, sys, zlib
for name in ("ttft", "tpot", "itl", "e2e", "throughput"):
    data = open(os.path.join(sys.argv[1], name + ".png"), "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", name
    at, idat, size = 8, b"", None
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[at + 8 + n:at + 12 + n])[0]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        if kind == b"IDAT":
            idat += body
        at += 12 + n
    width, height = size
    assert len(zlib.decompress(idat)) == height * (width + 1), name
print("plots ok")
PY
# A prompts file: 2 lines (completions text with max_tokens, chat) for 4 requests per level, so
# prompts repeat and the prefix cache must hit; the no-hits check has to reject that run.
prompts="$build/measure-e2e-prompts.jsonl"
printf '%s\n' '{"prompt": "the quick brown fox jumps over the lazy dog again and again", "max_tokens": 5}' \
  '{"messages": [{"role": "user", "content": "name three rivers"}], "max_tokens": 4}' >"$prompts"
file_report="$build/measure-e2e-file-report.json"
"$dsinfer" bench serve --url "http://127.0.0.1:$port" --prompts "$prompts" --num-prompts 4 \
  --concurrency 1,2 --seed 3 --output-json "$file_report" >/dev/null
python3 "$here/check_metrics.py" "$file_report"
if python3 "$here/check_metrics.py" "$file_report" --no-cache-hits >/dev/null; then
  echo "FAIL: repeated prompts showed no prefix-cache hits"; exit 1
fi
python3 - "$file_report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["config"]["endpoint"] == "per-line" and r["config"]["prompts_in_file"] == 2, r["config"]
for level in r["results"]:
    # Two of each line per level: output lengths 5 and 4 (ignore_eos) -> mean 4.5.
    assert level["completed"] == 4 and level["mean_output_tokens"] == 4.5, level
    assert level["total_cached_prompt_tokens"] > 0, level
PY
# Length distributions: realized means must lie inside [LO, HI].
dist_report="$build/measure-e2e-dist-report.json"
"$dsinfer" bench serve --url "http://127.0.0.1:$port" --num-prompts 8 --input-len uniform:8:40 \
  --output-len normal:6:2 --concurrency 2 --seed 5 --output-json "$dist_report" >/dev/null
python3 "$here/check_metrics.py" "$dist_report" --no-cache-hits
python3 - "$dist_report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["config"]["input_len"] == "uniform:8:40" and r["config"]["output_len"] == "normal:6:2"
level = r["results"][0]
assert level["completed"] == 8, level
assert 8 <= level["mean_input_tokens"] <= 40 and 1 <= level["mean_output_tokens"] <= 14, level
print("distribution run: mean input", level["mean_input_tokens"], "mean output",
      level["mean_output_tokens"])
PY
