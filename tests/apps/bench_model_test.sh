#!/usr/bin/env bash
# `dsinfer bench model` end to end on a tiny checkpoint: every (workload, batch, context) row is
# in the CSV with positive figures, a bandwidth roofline and a compute roof, the peak RSS is
# reported, and a frontier whose state cannot fit the memory budget is skipped with a reason
# rather than run out of memory.
# Usage: tests/apps/bench_model_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
dsinfer="$build/apps/dsinfer"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$dsinfer" create-demo-model "$work/model" --preset tiny-a --seed 3 >/dev/null
"$dsinfer" bench model --model "$work/model" --context 16,48,100000000 --batch 1,3 --decode 2 \
  --repeats 1 --mixed-chunk 8 --verify 2 --threads 2 --memory 200000000 --csv "$work/out.csv" \
  >"$work/out.txt"
cat "$work/out.txt"
# --verify: the (k + 1)-row verify steps against the 1-row step, at every batch and frontier.
for b in "  1" "  3"; do
  for k in 0 1 2; do
    grep -q "^verify  batch $b context     48: k $k ($((k + 1)) rows/seq): step .* the 1-row step, reads .* MB  a=0.5: " "$work/out.txt"
  done
done
# tiny-a has V4's MTP block: each k >= 1 is also timed with its drafting (k MTP calls).
for b in "  1" "  3"; do
  for k in 1 2; do
    grep -q "^verify  batch $b context     48: k $k with drafting ($k MTP calls): .* ms + .* ms = .*x the 1-row step  a=0.5: " "$work/out.txt"
  done
done
grep -q "context 100000000 skipped: batch 3 needs" "$work/out.txt"
# --profile: a per-op table after each workload, the layer program's ops by name, and a total.
"$dsinfer" bench model --model "$work/model" --context 16 --batch 1 --decode 1 --repeats 1 \
  --mixed-chunk 0 --threads 2 --profile >"$work/profile.txt"
grep -q "^| op | calls/step | ms/step | share |" "$work/profile.txt"
grep -q "^| moe experts (routed + shared) | " "$work/profile.txt"
grep -q "^| linear head | " "$work/profile.txt"
[[ "$(grep -c "^| all ops | " "$work/profile.txt")" == 2 ]]  # prefill and decode
grep -q "^peak resident memory: " "$work/out.txt"
grep -q "^sequence state at context 48: .* KB/token" "$work/out.txt"
python3 - "$work/out.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = {("prefill", 1, 16), ("prefill", 1, 48)}
want |= {(w, b, c) for w in ("decode", "mixed") for b in (1, 3) for c in (16, 48)}
got = {(r["workload"], int(r["batch"]), int(r["context"])) for r in rows}
assert got == want, (sorted(got ^ want))
for r in rows:
    for key in ("tok_s", "step_bytes", "roofline_tok_s", "ratio", "peak_rss_bytes", "bandwidth_gbps",
                "step_macs", "peak_gmacs", "compute_roof_tok_s"):
        assert float(r[key]) > 0, (r, key)
    # The roofline is tokens of the step over (its bytes / bandwidth).
    tokens = {"prefill": 16 if r["context"] == "16" else 32, "decode": int(r["batch"]),
              "mixed": int(r["batch"]) + 8}[r["workload"]]
    roof = tokens / (float(r["step_bytes"]) / (float(r["bandwidth_gbps"]) * 1e9))
    assert abs(roof / float(r["roofline_tok_s"]) - 1) < 1e-3, (r, roof)
    # The compute roof is the same tokens over (the step's multiply-adds / the measured peak).
    croof = tokens / (float(r["step_macs"]) / (float(r["peak_gmacs"]) * 1e9))
    assert abs(croof / float(r["compute_roof_tok_s"]) - 1) < 1e-3, (r, croof)
print("bench model CSV ok:", len(rows), "rows")
PY
