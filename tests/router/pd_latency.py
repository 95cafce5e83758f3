"""Short requests' TPOT while long prompts arrive: one colocated dsinfer server against
prefill/decode disaggregation behind vllm-router, on the same cores (docs/PERF.md, "Prefill/decode
disaggregation: short requests' TPOT while long prompts arrive").

Colocated: one `--role both` server with --threads 2 on cores 0-1. Disaggregated: a `--role
prefill` worker pinned to core 0 and a `--role decode` worker pinned to core 1 (one thread each),
vllm-router --vllm-pd-disaggregation in front. The same load on each: `dsinfer bench serve`
streams --short-requests chat requests (64-token prompts, 64 tokens out, concurrency 4) while a
second client sends long chat prompts (--long-tokens, max_tokens 1) back to back. Reported: the
short requests' TPOT and ITL percentiles and TTFT, and how many long prompts were served meanwhile.
A measurement, not a test (not in CTest). Loopback only; UCX over TCP.
Usage (the routers' venv, tests/router/run.sh): python3 tests/router/pd_latency.py
  --dsinfer BUILD/apps/dsinfer --model DEMO_MODEL [--long-tokens 2000] [--short-requests 32]
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from pd_bandwidth import MODEL, WORDS, free_port, http


def serve(args, name, role, cores, threads):
    port = free_port()
    log = open(os.path.join(args.workdir, f"{name}.log"), "w")
    cmd = ["taskset", "-c", cores, args.dsinfer, "serve", "--model", args.model, "--host",
           "127.0.0.1", "--port", str(port), "--threads", str(threads), "--max-model-len",
           "4096", "--served-model-name", MODEL, "--kv-cache-memory", "2GiB", "--role", role]
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(procs, urls, path="/ready", timeout=120):
    deadline = time.time() + timeout
    while not all(http("GET", u + path)[0] == 200 for u in urls):
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("not ready; logs in the workdir")
        time.sleep(0.2)


def run_load(args, url, label):
    """The short requests through `dsinfer bench serve`, long prompts beside them."""
    stop = threading.Event()
    long_served = [0]

    def long_prompts():
        i = 0
        while not stop.is_set():
            text = f"Long {label} {i}: " + " ".join(
                WORDS[(i + k * 5) % len(WORDS)] for k in range(args.long_tokens - 16))
            body = {"model": MODEL, "messages": [{"role": "user", "content": text}],
                    "max_tokens": 1, "temperature": 0,
                    "chat_template_kwargs": {"thinking": False}}
            s, out = http("POST", url + "/v1/chat/completions", body, timeout=600)
            if s == 200:
                long_served[0] += 1
            else:
                print(f"  long prompt {i}: {s} {out[:200]}", flush=True)
            i += 1

    thread = threading.Thread(target=long_prompts)
    thread.start()
    out_csv = os.path.join(args.workdir, f"{label}.csv")
    try:
        subprocess.run([args.dsinfer, "bench", "serve", "--url", url, "--model", MODEL,
                        "--endpoint", "chat", "--input-len", "64", "--output-len", "64",
                        "--num-prompts", str(args.short_requests), "--concurrency", "4",
                        "--seed", "1", "--csv", out_csv], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    finally:
        stop.set()
        thread.join()
    with open(out_csv) as f:
        row = list(csv.DictReader(f))[-1]
    return row, long_served[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", default="/tmp/dsinfer-pd-latency")
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--short-requests", type=int, default=32)
    args = ap.parse_args()
    if shutil.which("vllm-router") is None or shutil.which("taskset") is None:
        print("pd_latency.py: vllm-router or taskset not found; skipping")
        return 77
    os.makedirs(args.workdir, exist_ok=True)
    results = []
    # Colocated: one server on both cores.
    proc, url = serve(args, "both", "both", "0-1", 2)
    try:
        wait_ready([proc], [url])
        results.append(("colocated (`--role both`, 2 threads, cores 0-1)",
                        *run_load(args, url, "colocated")))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # Disaggregated: prefill on core 0, decode on core 1, vllm-router in front.
    prefill, prefill_url = serve(args, "prefill", "prefill", "0", 1)
    decode, decode_url = serve(args, "decode", "decode", "1", 1)
    router_port = free_port()
    router = subprocess.Popen(
        ["vllm-router", "--host", "127.0.0.1", "--port", str(router_port),
         "--vllm-pd-disaggregation", "--prefill", prefill_url, "--decode", decode_url,
         "--policy", "round_robin"],
        stdout=open(os.path.join(args.workdir, "router.log"), "w"), stderr=subprocess.STDOUT)
    router_url = f"http://127.0.0.1:{router_port}"
    try:
        wait_ready([prefill, decode], [prefill_url, decode_url])
        wait_ready([router], [router_url], path="/v1/models", timeout=60)
        results.append(("disaggregated (prefill core 0, decode core 1, vllm-router)",
                        *run_load(args, router_url, "disaggregated")))
    finally:
        for p in (router, prefill, decode):
            p.terminate()
            p.wait(timeout=60)
    print(f"Short chat requests (64 in, 64 out, concurrency 4, {args.short_requests} requests) "
          f"while {args.long_tokens}-token prompts arrive back to back:")
    print("| deployment | TPOT median | TPOT p99 | ITL p99 | TTFT median | long prompts served |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, row, served in results:
        print(f"| {label} | {float(row['tpot_median_ms']):.1f} ms | "
              f"{float(row['tpot_p99_ms']):.1f} ms | {float(row['itl_p99_ms']):.1f} ms | "
              f"{float(row['ttft_median_ms']):.0f} ms | {served} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
