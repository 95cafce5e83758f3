#!/usr/bin/env bash
# --numa end to end (core/cpu_topology.h): every policy gives the same tokens as none; the plan
# is said on stderr; mapped weights say that --numa cannot place them; a restricted affinity mask
# (taskset) sets the thread count; bad values and --numa with a GPU device are refused. Then a
# server with --numa distribute: its compute threads (the pool's workers and the engine thread
# that drives the pool) are each pinned to one CPU, distinct ones, which /proc shows, and without
# --numa none is. 127.0.0.1 only.
# Usage: tests/apps/numa_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
dsinfer="$build/apps/dsinfer"
work="$(mktemp -d)"
pid=""
trap '[[ -n "$pid" ]] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
ncpu="$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')"
"$dsinfer" create-demo-model "$work/model" --preset tiny-a --seed 5 >/dev/null
gen() { "$dsinfer" generate --model "$work/model" --prompt-ids 5,17,300,9 --max-tokens 10 "$@"; }
plain="$(gen --weights copy 2>"$work/off.txt" | head -1)"
# A one-node machine says nothing with the policy off.
if [[ "$(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)" -le 1 ]]; then
  ! grep -q "^numa " "$work/off.txt" || { cat "$work/off.txt"; exit 1; }
fi
for policy in off distribute isolate numactl; do
  got="$(gen --weights copy --numa "$policy" 2>"$work/$policy.txt" | head -1)"
  [[ "$got" == "$plain" ]] || { echo "--numa $policy: $got, not $plain"; exit 1; }
done
grep -q "^numa distribute: $ncpu threads pinned to CPUs .*; weights: interleaved over node" "$work/distribute.txt"
grep -q "^numa isolate: .* threads pinned to CPUs .*; weights: on node " "$work/isolate.txt"
grep -q "^numa numactl: $ncpu threads pinned to CPUs .*; weights: the process's memory policy" "$work/numactl.txt"
# Speculative decoding runs in the engine: the same tokens there too.
got="$(gen --weights copy --numa distribute --speculative-tokens 2 2>/dev/null | head -1)"
[[ "$got" == "$plain" ]] || { echo "--numa distribute with speculation: $got, not $plain"; exit 1; }
# Mapped weights stay in the page cache: said, not silently ignored.
gen --weights map --numa distribute >/dev/null 2>"$work/map.txt"
grep -q "the weights are mapped, so their pages stay where the page cache put them" "$work/map.txt"
# The affinity mask sets the default thread count (it used to be every CPU of the machine).
if command -v taskset >/dev/null && [[ "$ncpu" -ge 2 ]]; then
  first="$(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')"
  got="$(taskset -c "$first" "$dsinfer" generate --model "$work/model" --prompt-ids 5,17,300,9 \
    --max-tokens 10 --numa numactl 2>"$work/taskset.txt" | head -1)"
  [[ "$got" == "$plain" ]] || { echo "under taskset: $got, not $plain"; exit 1; }
  grep -q "^numa numactl: 1 threads pinned to CPUs $first on node" "$work/taskset.txt"
fi
# Refusals, with the reason.
set +e
gen --numa interleave >/dev/null 2>"$work/bad.txt"; rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q "numa takes off, distribute, isolate or numactl, not \"interleave\"" "$work/bad.txt"
set +e
gen --numa distribute --device cuda >/dev/null 2>"$work/cuda.txt"; rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q "it needs --device cpu" "$work/cuda.txt"
! "$dsinfer" bench model --model "$work/model" --numa sideways --context 16 --batch 1 2>/dev/null

# serve: which of its threads are pinned to a single CPU, after one request (the engine thread
# pins itself on its first step).
single_cpu_threads() {
  local p="$1"
  for status in /proc/"$p"/task/*/status; do
    awk '/^Cpus_allowed_list:/ { print $2 }' "$status"
  done | grep -E '^[0-9]+$' | sort -n | tr '\n' ' ' || true
}
serve_and_count() {
  local port
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$dsinfer" serve --model "$work/model" --host 127.0.0.1 --port "$port" --weights copy "$@" \
    >"$work/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "server died:"; cat "$work/serve.log"; exit 1; }
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "deepseek-v4-flash", "prompt": [5, 17, 300, 9], "max_tokens": 4}' >/dev/null
  single_cpu_threads "$pid" >"$work/pinned.txt"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}
serve_and_count --numa distribute
pinned="$(cat "$work/pinned.txt")"
grep -q "numa distribute: $ncpu threads pinned" "$work/serve.log"
expected="$(python3 -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))) + " ")')"
[[ "$pinned" == "$expected" ]] || { echo "pinned threads' CPUs: '$pinned', expected '$expected'"; exit 1; }
if [[ "$ncpu" -ge 2 ]]; then
  serve_and_count
  [[ -z "$(cat "$work/pinned.txt")" ]] || { echo "threads pinned without --numa: $(cat "$work/pinned.txt")"; exit 1; }
fi
echo "numa CLI ok ($ncpu CPUs; pinned: $pinned)"
