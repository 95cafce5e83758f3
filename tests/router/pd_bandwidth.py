"""The P/D KV transfer's bandwidth against ucx_perftest's, measured in the same run (docs/PERF.md,
"Prefill/decode transfer bandwidth").

One `--role prefill` and one `--role decode` dsinfer worker of the demo model on 127.0.0.1, UCX
over loopback TCP (UCX_TLS=tcp, UCX_NET_DEVICES=lo). For each prompt length, --rounds hand-overs
(vLLM's kv_transfer_params, sent by this script as vllm-router would): the decode worker's
/metrics give the bytes pulled and the seconds its pulls took (acquire message + one ucp_get_nbx
+ SHA-256 + release message). Then ucx_perftest (Debian's ucx-utils) measures ucp_get of the same
message size between two processes over the same transport. Prints one table; exit 77 when
ucx_perftest is missing.
Usage (the routers' venv, tests/router/run.sh):
  python3 tests/router/pd_bandwidth.py --dsinfer BUILD/apps/dsinfer --model DEMO_MODEL
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from router_test import free_port, http  # the routers' venv (tests/router/run.sh)

MODEL = "dsinfer-demo"
WORDS = ["alpha", "beta", "gamma", "delta", "orbit", "river", "stone", "ledger", "vector",
         "signal", "harbor", "quartz", "meadow", "cipher", "lantern", "summit"]


def metrics(url):
    out = {}
    for line in http("GET", url + "/metrics")[1].splitlines():
        if not line.startswith("#") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def perftest_get(size, iters, env):
    # ucx_perftest's server, then its client: ucp_get of `size` bytes, one at a time.
    port = str(free_port())
    server = subprocess.Popen(["ucx_perftest", "-p", port], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", port, "-t", "ucp_get", "-s",
                              str(size), "-n", str(iters), "-w", str(max(1, iters // 10))],
                             env=env, capture_output=True, text=True, timeout=120).stdout
    finally:
        server.wait(timeout=30) if server.poll() is None else None
    final = [line for line in out.splitlines() if line.startswith("Final:")]
    if not final:
        raise RuntimeError("ucx_perftest printed no Final line:\n" + out)
    fields = final[0].split()
    # Final: iters lat50 lat_avg lat_overall bw_avg bw_overall rate_avg rate_overall; MB/s is
    # ucx_perftest's MiB/s.
    return float(fields[6]) * 1024 * 1024, float(fields[3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", default="/tmp/dsinfer-pd-bandwidth")
    ap.add_argument("--lengths", default="256,1024,4000")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    if shutil.which("ucx_perftest") is None:
        print("pd_bandwidth.py: ucx_perftest not found (Debian: ucx-utils); skipping")
        return 77
    os.makedirs(args.workdir, exist_ok=True)
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
    procs, urls = [], {}
    try:
        for role in ("prefill", "decode"):
            port = free_port()
            log = open(os.path.join(args.workdir, f"{role}.log"), "w")
            procs.append(subprocess.Popen(
                [args.dsinfer, "serve", "--model", args.model, "--host", "127.0.0.1", "--port",
                 str(port), "--threads", "1", "--max-model-len", "4096", "--served-model-name",
                 MODEL, "--max-num-seqs", "4", "--kv-cache-memory", "1GiB", "--role", role],
                stdout=log, stderr=subprocess.STDOUT, env=env))
            urls[role] = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while not all(http("GET", u + "/ready")[0] == 200 for u in urls.values()):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"workers not ready; logs in {args.workdir}")
            time.sleep(0.2)
        print("| prompt tokens | state blob | dsinfer pull (acquire + get + SHA-256 + release) "
              "| ucx_perftest ucp_get, same size | ratio |")
        print("|---:|---:|---:|---:|---:|")
        for length in [int(x) for x in args.lengths.split(",")]:
            before = metrics(urls["decode"])
            for r in range(args.rounds):
                # A fresh prompt each round: the prefill worker's prefix cache must not shorten it.
                text = f"Round {r} {length}: " + " ".join(
                    WORDS[(r + k * 7) % len(WORDS)] for k in range(length - 14))
                body = {"model": MODEL, "messages": [{"role": "user", "content": text}],
                        "max_tokens": 1, "temperature": 0,
                        "chat_template_kwargs": {"thinking": False}}
                s, out = http("POST", urls["prefill"] + "/v1/chat/completions",
                              dict(body, kv_transfer_params={"do_remote_decode": True}),
                              timeout=300)
                assert s == 200, out
                params = json.loads(out)["kv_transfer_params"]
                s, out = http("POST", urls["decode"] + "/v1/chat/completions",
                              dict(body, kv_transfer_params=params), timeout=300)
                assert s == 200, out
                tokens = json.loads(out)["usage"]["prompt_tokens"]
            after = metrics(urls["decode"])
            pulls = after["dsinfer:kv_transfer_pulls_total"] - before.get(
                "dsinfer:kv_transfer_pulls_total", 0)
            nbytes = after["dsinfer:kv_transfer_pulled_bytes_total"] - before.get(
                "dsinfer:kv_transfer_pulled_bytes_total", 0)
            seconds = after["dsinfer:kv_transfer_pull_seconds_total"] - before.get(
                "dsinfer:kv_transfer_pull_seconds_total", 0)
            size = int(nbytes / pulls)
            ours = nbytes / seconds
            theirs, lat_us = perftest_get(size, 200, env)
            print(f"| {tokens} | {size / 1e6:.2f} MB | {ours / 1e6:.0f} MB/s "
                  f"({seconds / pulls * 1e3:.2f} ms per pull) | {theirs / 1e6:.0f} MB/s "
                  f"({lat_us / 1e3:.2f} ms per get) | {ours / theirs:.2f} |", flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
