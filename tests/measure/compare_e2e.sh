#!/usr/bin/env bash
# End-to-end tests of `dsinfer compare` (docs/TESTING.md "dsinfer compare"). 127.0.0.1 only.
# Usage: tests/measure/compare_e2e.sh BUILD_DIR logits|endpoints
#   logits     two `dsinfer logits` runs of the same ids pass; a copy with one value rewritten
#              fails; the engine against the committed tiny-a golden passes; bad input exits 2
#   endpoints  two `dsinfer serve` instances on the demo model agree (completions and chat); a
#              proxy in front of B that adds logprob noise at one position of one prompt, or swaps
#              the chosen token there, makes the comparison fail naming that prompt and position
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:?build dir}" && pwd)"
mode="${2:?logits or endpoints}"
dsinfer="$build/apps/dsinfer"
work="$build/compare-e2e-$mode"
rm -rf "$work"
mkdir -p "$work"

# expect_rc WANT CMD...: runs CMD, fails the test unless it exits WANT.
expect_rc() {
  local want="$1"
  shift
  local rc=0
  "$@" >"$work/last.out" 2>&1 || rc=$?
  if [[ "$rc" != "$want" ]]; then
    echo "FAIL: expected exit $want, got $rc from: $*"
    cat "$work/last.out"
    exit 1
  fi
  cat "$work/last.out"
}

# check_json FILE PYTHON-EXPR: the expression (over `r`, the parsed report) must be true.
check_json() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if not eval("(" + sys.argv[2] + ")"):
    print("FAIL: report check failed:", sys.argv[2])
    print(json.dumps(r, indent=1)[:4000])
    sys.exit(1)
EOF
}

if [[ "$mode" == logits ]]; then
  model="$build/compare-test-tiny-a"
  [[ -f "$model/config.json" ]] || "$dsinfer" create-demo-model "$model" --preset tiny-a --seed 1
  ids=0,17,5,99,3,250,7,7,42
  "$dsinfer" logits --model "$model" --ids "$ids" --out "$work/a.safetensors" --threads 2
  "$dsinfer" logits --model "$model" --ids "$ids" --out "$work/b.safetensors" --threads 2 --chunk 4
  echo "== same ids, two runs (whole prompt vs chunks of 4): must pass"
  expect_rc 0 "$dsinfer" compare logits --a "$work/a.safetensors" --b "$work/b.safetensors" \
    --output-json "$work/same.json"
  check_json "$work/same.json" 'r["verdict"] == "pass" and r["overall"]["rows"] == 9'
  # One logit of row 6 rewritten in place (+20): far past the default NMSE budget.
  python3 - "$work/a.safetensors" "$work/corrupt.safetensors" <<'EOF'
import json, struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", data[:8])[0]
info = json.loads(data[8:8 + n])["logits"]
rows, vocab = info["shape"]
at = 8 + n + info["data_offsets"][0] + 4 * (6 * vocab + 123)
(v,) = struct.unpack("<f", data[at:at + 4])
data[at:at + 4] = struct.pack("<f", v + 20.0)
open(sys.argv[2], "wb").write(data)
EOF
  echo "== one value rewritten: must fail"
  expect_rc 1 "$dsinfer" compare logits --a "$work/corrupt.safetensors" --b "$work/b.safetensors" \
    --output-json "$work/corrupt.json"
  check_json "$work/corrupt.json" \
    'r["verdict"] == "fail" and "NMSE" in r["reason"] and r["overall"]["max_kl_row"] == "row 6"'
  echo "== engine (fp32-reference) vs the committed transformers golden: must pass"
  expect_rc 0 "$dsinfer" compare logits --model "$model" \
    --golden "$here/../fixtures/golden/tiny-a/golden.safetensors" --threads 2 \
    --output-json "$work/golden.json"
  check_json "$work/golden.json" 'r["verdict"] == "pass" and len(r["blocks"]) >= 2'
  echo "== bad input: exit 2"
  # --device: a bad name is a usage error; cuda without a usable GPU (or without the CUDA
  # backend) fails with the reason and writes nothing; with a GPU it must match the CPU.
  expect_rc 2 "$dsinfer" logits --model "$model" --ids "$ids" --out "$work/g.safetensors" \
    --device gpu
  if "$dsinfer" logits --model "$model" --ids "$ids" --out "$work/g.safetensors" \
    --numerics fp32-reference --device cuda 2>"$work/g.err"; then
    "$dsinfer" logits --model "$model" --ids "$ids" --out "$work/f.safetensors" \
      --numerics fp32-reference --threads 2
    expect_rc 0 "$dsinfer" compare logits --a "$work/g.safetensors" --b "$work/f.safetensors" \
      --max-nmse 1e-9
  else
    grep -q "CUDA\|cuda" "$work/g.err" || { cat "$work/g.err"; exit 1; }
    [[ ! -e "$work/g.safetensors" ]] || { echo "a failed GPU run wrote its output"; exit 1; }
  fi
  expect_rc 2 "$dsinfer" compare logits --a "$work/a.safetensors" --b "$work/missing.safetensors"
  expect_rc 2 "$dsinfer" compare logits --a "$work/a.safetensors"
  echo "compare logits e2e: OK"
  exit 0
fi

[[ "$mode" == endpoints ]] || { echo "unknown mode $mode"; exit 2; }
model="$build/compare-test-model"
[[ -f "$model/config.json" ]] || "$dsinfer" create-demo-model "$model" --preset demo --seed 1
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
# await URL PID LOG: until URL answers, or the process dies.
await() {
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { echo "process died:"; cat "$3"; exit 1; }
    sleep 0.2
  done
  echo "timed out waiting for $1"
  exit 1
}
declare -A url
for side in a b; do
  port="$(free_port)"
  "$dsinfer" serve --model "$model" --host 127.0.0.1 --port "$port" --threads 1 \
    --max-model-len 1024 >"$work/server-$side.log" 2>&1 &
  pids+=($!)
  url[$side]="http://127.0.0.1:$port"
done
await "${url[a]}/ready" "${pids[0]}" "$work/server-a.log"
await "${url[b]}/ready" "${pids[1]}" "$work/server-b.log"
# start_proxy NAME ARGS...: a perturb_proxy.py in front of B; sets proxy_url.
start_proxy() {
  local name="$1"
  shift
  python3 "$here/perturb_proxy.py" --upstream "${url[b]}" --port-file "$work/$name.port" "$@" \
    >"$work/$name.log" 2>&1 &
  pids+=($!)
  local pid=$!
  for _ in $(seq 1 100); do
    [[ -f "$work/$name.port" ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/$name.log"; exit 1; }
    sleep 0.1
  done
  proxy_url="http://127.0.0.1:$(cat "$work/$name.port")"
  await "$proxy_url/ready" "$pid" "$work/$name.log"
}
common=(--num-prompts 3 --input-len 12 --seed 3 --max-tokens 6 --top-logprobs 5 --ignore-eos)

echo "== A vs B, same checkpoint (completions): must pass"
expect_rc 0 "$dsinfer" compare endpoints --a "${url[a]}" --b "${url[b]}" "${common[@]}" \
  --output-json "$work/same.json"
check_json "$work/same.json" \
  'r["verdict"] == "pass" and r["summary"]["compared_positions"] == 18 and r["summary"]["max_abs_logprob_delta"] == 0'

echo "== A vs B (chat, prompts file): must pass"
printf '%s\n' '{"prompt": "river stone light"}' \
  '{"messages": [{"role": "user", "content": "paper cloud"}]}' >"$work/prompts.jsonl"
expect_rc 0 "$dsinfer" compare endpoints --a "${url[a]}" --b "${url[b]}" --endpoint chat \
  --prompts "$work/prompts.jsonl" --max-tokens 4 --top-logprobs 3 --ignore-eos \
  --output-json "$work/chat.json"
check_json "$work/chat.json" 'r["verdict"] == "pass" and r["summary"]["compared_positions"] == 8'

echo "== B behind a proxy that adds logprob noise at prompt 1, position 3: must fail there"
start_proxy noise --mode noise --request 1 --position 3 --amplitude 0.5
expect_rc 1 "$dsinfer" compare endpoints --a "${url[a]}" --b "$proxy_url" "${common[@]}" \
  --output-json "$work/noise.json"
check_json "$work/noise.json" '
r["verdict"] == "fail" and r["reason"].startswith("prompt 1:") and "position 3" in r["reason"]
and [p["verdict"] for p in r["prompts"]] == ["pass", "fail", "pass"]
and r["prompts"][1]["max_abs_logprob_delta_position"] == 3
and r["prompts"][1]["max_abs_logprob_delta"] >= 0.25 and r["prompts"][1]["first_divergence"] == -1'

echo "== B behind a proxy that swaps the chosen token at prompt 2, position 2: must fail there"
start_proxy swap --mode swap --request 2 --position 2
expect_rc 1 "$dsinfer" compare endpoints --a "${url[a]}" --b "$proxy_url" "${common[@]}" \
  --output-json "$work/swap.json"
check_json "$work/swap.json" '
r["verdict"] == "fail" and r["reason"].startswith("prompt 2: greedy divergence at position 2")
and [p["verdict"] for p in r["prompts"]] == ["pass", "pass", "fail"]
and r["prompts"][2]["first_divergence"] == 2 and r["prompts"][2]["compared_positions"] == 2
and r["prompts"][2]["b_token_in_a_top"] and not r["prompts"][2]["near_tie"]
and r["prompts"][2]["divergence_margin_a"] >= 0.01'

echo "== B unreachable: exit 2"
expect_rc 2 "$dsinfer" compare endpoints --a "${url[a]}" --b "http://127.0.0.1:$(free_port)" \
  --num-prompts 1 --max-tokens 2 --timeout 10
echo "compare endpoints e2e: OK"
