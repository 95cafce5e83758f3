#!/usr/bin/env bash
# Acceptance runs with the clients people point at OpenAI-compatible servers (issue 31): AIPerf
# (chat and completions, streaming, server metrics collected) and lm-evaluation-harness
# (generate_until through local-completions; loglikelihood through echo + logprobs) against
# `dsinfer serve` on a demo model. Pinned in requirements.txt, installed into BUILD_DIR/clients-venv.
# A few requests each, 127.0.0.1 only, about a minute once the venv exists.
# Usage: tests/server/clients/run.sh [BUILD_DIR]   (exit 77: the clients cannot be installed)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
dsinfer="$build/apps/dsinfer"
[[ -x "$dsinfer" ]] || { echo "clients/run.sh: $dsinfer not built" >&2; exit 1; }

venv="$build/clients-venv"
source "$root/tests/lib/pinned_venv.sh"
pinned_venv "$venv" "$here/requirements.txt" aiperf

work="$build/clients-run"
rm -rf "$work" && mkdir -p "$work/tokenizer" "$work/tasks"
model="$build/server-test-model"
[[ -f "$model/config.json" ]] || "$dsinfer" create-demo-model "$model" --preset demo --seed 1
# The clients count tokens with a Hugging Face tokenizer: the served one, as a fast tokenizer.
cp "$root/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json" "$work/tokenizer/"
cat >"$work/tokenizer/tokenizer_config.json" <<'JSON'
{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<｜begin▁of▁sentence｜>",
 "eos_token": "<｜end▁of▁sentence｜>", "model_max_length": 4096}
JSON
# lm-eval tasks over a local three-question set (no download).
for kind in gen mc; do
  {
    echo "task: dsinfer_$kind"
    echo "dataset_path: json"
    echo "dataset_kwargs: {data_files: {test: $here/tasks/data.jsonl}}"
    echo "test_split: test"
    echo 'doc_to_text: "{{question}}"'
    if [[ $kind == gen ]]; then
      echo 'doc_to_target: " {{answer}}"'
      echo "output_type: generate_until"
      echo 'generation_kwargs: {until: ["\n"], max_gen_toks: 6, do_sample: false}'
      echo "metric_list: [{metric: exact_match}]"
    else
      echo 'doc_to_choice: "{{choices}}"'
      echo 'doc_to_target: "{{gold}}"'
      echo "output_type: multiple_choice"
      echo "metric_list: [{metric: acc}]"
    fi
  } >"$work/tasks/dsinfer_$kind.yaml"
done

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port"
"$dsinfer" serve --model "$model" --host 127.0.0.1 --port "$port" --served-model-name dsinfer-test \
  --max-model-len 4096 --max-tokens-limit 256 --threads 2 >"$work/serve.log" 2>&1 &
pid=$!
# AIPerf leaves aiperf_mmap_* directories in TMPDIR and binds ZeroMQ ipc sockets there (whose
# paths must fit sockaddr_un's 108 bytes, so not under the build tree): a short directory of
# this run's own, removed at exit.
aiperf_tmp="$(mktemp -d /tmp/aiperf.XXXXXX)"
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$aiperf_tmp"' EXIT
for _ in $(seq 1 600); do
  curl -sf "$url/ready" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { echo "server died:"; cat "$work/serve.log"; exit 1; }
  sleep 0.2
done

status=0
fail() { echo "FAIL: $*"; status=1; }
# lm-eval reads its local task files offline (AIPerf loads the local tokenizer by path; its hub
# client rejects a path while offline).
offline=(env HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1)

# AIPerf: each endpoint streamed, 6 requests at concurrency 2; no request errors, the server's
# /metrics collected, and no warning beyond what a CPU machine and client-side retokenisation
# cause (GPU telemetry unreachable, output/usage token counts that differ after retokenising,
# transformers noting that torch is absent: AIPerf uses it only for the tokenizer, and AIPerf's
# monitor of its own event loop, which lags when the 2-core machine is busy: client-side only).
for endpoint in chat completions; do
  out="$work/aiperf-$endpoint"
  if ! TMPDIR="$aiperf_tmp" timeout 300 "$venv/bin/aiperf" profile --model dsinfer-test --url "$url" \
      --endpoint-type "$endpoint" --streaming --request-count 6 --concurrency 2 \
      --synthetic-input-tokens-mean 32 --output-tokens-mean 8 --extra-inputs ignore_eos:true \
      --tokenizer "$work/tokenizer" --random-seed 1 --output-artifact-dir "$out" --ui-type none \
      >"$out.log" 2>&1; then
    fail "aiperf $endpoint exited non-zero (log: $out.log)"; continue
  fi
  python3 - "$out" "$out.log" <<'PY' || fail "aiperf $endpoint: see above"
import json, re, sys
out, log = sys.argv[1], sys.argv[2]
summary = json.load(open(out + "/profile_export_aiperf.json"))
text = json.dumps(summary)
errors = re.search(r'"request_count".*?"avg": ([0-9.]+)', text)
server = open(out + "/server_metrics_export.json").read()
ok = True
if "dsinfer:time_to_first_token_seconds" not in server:
    print("server metrics were not collected"); ok = False
allowed = ("GPU Telemetry", "OSL mismatch", "Token Count Discrepancy", "PyTorch was not found",
           "is taking too long to run")
for line in open(log):
    if (" WARNING " in line or " ERROR " in line) and not any(a in line for a in allowed):
        print("unexpected:", line.strip()); ok = False
records = [json.loads(l) for l in open(out + "/profile_export.jsonl")]
failed = [r for r in records if r.get("error")]
if len(records) != 6 or failed:
    print(f"{len(records)} records, {len(failed)} failed"); ok = False
sys.exit(0 if ok else 1)
PY
done

# lm-eval generate_until through /v1/completions: every question gets a generated answer.
lm_args="model=dsinfer-test,base_url=$url/v1/completions,num_concurrent=1,max_retries=1"
if timeout 300 "${offline[@]}" "$venv/bin/lm_eval" run --tasks dsinfer_gen --include_path "$work/tasks" \
    --model local-completions \
    --model_args "$lm_args,tokenized_requests=False,tokenizer_backend=None,eos_string=<｜end▁of▁sentence｜>" \
    --output_path "$work/lm-gen" --log_samples >"$work/lm-gen.log" 2>&1; then
  python3 - "$work/lm-gen" <<'PY' || fail "lm-eval generate_until: see above"
import glob, json, sys
rows = [json.loads(l) for f in glob.glob(sys.argv[1] + "/**/samples_dsinfer_gen_*.jsonl", recursive=True)
        for l in open(f)]
ok = len(rows) == 3 and all(isinstance(r["resps"][0][0], str) for r in rows)
print("generate_until samples:", len(rows), "ok" if ok else rows)
sys.exit(0 if ok else 1)
PY
else
  fail "lm-eval generate_until exited non-zero (log: $work/lm-gen.log)"
fi

# lm-eval loglikelihood (multiple choice) sends token ids with echo + logprobs + max_tokens 1 and
# sums the continuation's prompt logprobs. Each choice's sum must equal the log-softmax of
# `dsinfer logits` (one forward over the same ids) summed the same way: the engine's prompt rows
# are bit-identical to that forward, so the sums differ only by the float rounding of each
# returned logprob (|lp| * 2^-24 per token), far below 1e-4; a wrong row is off by O(1).
if timeout 300 "${offline[@]}" "$venv/bin/lm_eval" run --tasks dsinfer_mc --include_path "$work/tasks" \
    --model local-completions \
    --model_args "$lm_args,tokenizer_backend=huggingface,tokenizer=$work/tokenizer" \
    --output_path "$work/lm-mc" --log_samples >"$work/lm-mc.log" 2>&1; then
  "${offline[@]}" "$venv/bin/python" - "$work" "$dsinfer" "$model" <<'PY' || fail "lm-eval loglikelihood: see above"
import glob, json, math, struct, subprocess, sys
import numpy as np
from transformers import PreTrainedTokenizerFast
work, dsinfer, model = sys.argv[1:4]
tok = PreTrainedTokenizerFast.from_pretrained(work + "/tokenizer")
rows = [json.loads(l) for f in glob.glob(work + "/lm-mc/**/samples_dsinfer_mc_*.jsonl", recursive=True)
        for l in open(f)]

def pairs(row):  # the (context, continuation) of each choice, in lm-eval's logged forms
    args = row["arguments"]
    if isinstance(args, dict):
        return [(a["arg_0"], a["arg_1"]) for a in args.values()]
    return [tuple(a) for a in args]

def encode(context, continuation):  # lm-eval's causal _encode_pair, without special tokens
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    return whole, len(tok(context, add_special_tokens=False).input_ids)

def reference(ids, ctxlen):
    out = work + "/ref.safetensors"
    subprocess.run([dsinfer, "logits", "--model", model, "--ids", ",".join(map(str, ids)),
                    "--out", out], check=True, capture_output=True)
    blob = open(out, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    meta = json.loads(blob[8:8 + n])["logits"]
    start, end = meta["data_offsets"]
    logits = np.frombuffer(blob[8 + n + start:8 + n + end], dtype="<f4").reshape(meta["shape"])
    total = 0.0
    for i in range(ctxlen, len(ids)):
        row = logits[i - 1].astype(np.float64)
        total += row[ids[i]] - (row.max() + math.log(np.exp(row - row.max()).sum()))
    return total

ok, worst, checked = len(rows) == 3, 0.0, 0
for row in rows:
    for (context, continuation), resp in zip(pairs(row), row["resps"]):
        got = float(resp[0][0])  # logged as text
        ids, ctxlen = encode(context, continuation)
        want = reference(ids, ctxlen)
        worst = max(worst, abs(got - want))
        checked += 1
        if not (math.isfinite(got) and abs(got - want) <= 1e-4):
            print(f"choice {continuation!r} after {context!r}: lm-eval {got}, dsinfer logits {want}")
            ok = False
print(f"loglikelihood: {checked} choices of {len(rows)} questions, worst |lm-eval - dsinfer logits| {worst:.2e}")
sys.exit(0 if ok and checked == 9 else 1)
PY
else
  fail "lm-eval loglikelihood exited non-zero (log: $work/lm-mc.log)"
fi

kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
rm -rf "$aiperf_tmp"
trap - EXIT
grep -q "access POST /v1/completions 200" "$work/serve.log" || fail "no access log lines in serve.log"
[[ $status -eq 0 ]] && echo "clients acceptance: aiperf chat + completions, lm-eval generate_until and loglikelihood: ok"
exit $status
