"""Prefill/decode disaggregation behind the real vllm-router (tests/router/pd_run.sh).

One `--role prefill` and two `--role decode` dsinfer workers of the demo model behind
vllm-router --vllm-pd-disaggregation, and one `--role both` server beside them. Checked, with the
figures printed:
  * 50 greedy chat requests (prompts of 16 to ~4k tokens, exact lengths from the server's render,
    ending at 50 different offsets modulo the 128-token page, 0 and 127 included) through the
    router give the same tokens and bit-identical logprobs as the `--role both` server; both
    decode workers pulled states (UCX, loopback TCP). About 1 minute on a 2-core machine;
  * every held state is released after its pull (/metrics: held blobs back to 0, no failures);
  * a state nobody pulls is released at the prefill worker's --kv-transfer-deadline;
  * a descriptor pulled twice gets a clear retryable error (503), a malformed one a 400, and a
    role mismatch a 400;
  * a corrupted transfer (a decode worker started with --kv-transfer-test-corrupt 1 flips a byte
    of its first pulled state) behind a second vllm-router: the checksum catches it, the client
    gets a 503 naming it, its retry succeeds, == --role both; the decode worker's KV pages and the
    prefill worker's held states are back at their baseline.
Everything binds 127.0.0.1. The last line is "N passed, N failed".
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import time

from router_test import Replica, Results, free_port, http, wait_until

MODEL = "dsinfer-demo"
DEADLINE_S = 3


def post(url, body):
    return http("POST", url, body, timeout=120)


class Worker:
    # port: a restarted worker comes back on its old port; extra: more `dsinfer serve` flags.
    def __init__(self, args, name, role, port=None, extra=()):
        self.args, self.name, self.role = args, name, role
        self.port = port or free_port()
        log = open(os.path.join(args.workdir, f"{name}.log"), "a")
        cmd = [args.dsinfer, "serve", "--model", args.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--threads", "1", "--max-model-len", "4096",
               "--served-model-name", MODEL, "--max-num-seqs", "4",
               "--kv-cache-memory", "1GiB", "--role", role]
        if role == "prefill":
            cmd += ["--kv-transfer-deadline", str(DEADLINE_S)]
        cmd += list(extra)
        env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self):
        wait_until(lambda: self.proc.poll() is not None or
                   http("GET", self.url + "/ready")[0] == 200, 120, f"{self.name} ready")
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited; see its log in {self.args.workdir}")

    # The scale-out test's replica helpers: they use only self.url and self.proc.
    metrics = Replica.metrics
    stop = Replica.stop


def prompts(n):
    # Chat prompts of growing length: the rendered prompt ends at different offsets modulo the
    # 128-token page, some inside the first page (the window ring wrapped or not), some past it.
    words = ["alpha", "beta", "gamma", "delta", "orbit", "river", "stone", "ledger", "vector",
             "signal", "harbor", "quartz", "meadow", "cipher", "lantern", "summit"]
    out = []
    for i in range(n):
        length = 3 + 29 * i
        out.append(f"Request {i}: " + " ".join(words[(i * 7 + k) % len(words)]
                                               for k in range(length)))
    return out


def prompt_lengths(n, longest):
    # n chat prompt lengths (tokens) from 16 to about `longest`: 16 + 81 i, whose residues
    # modulo the 128-token page are all different (81 is odd) and spread over the page; the ones
    # a quarter and half way are replaced by a page's last and first offsets (1023, 2048).
    step = max(1, (longest - 16) // max(1, n - 1))
    step += 1 - step % 2  # odd: distinct residues
    out = [16 + step * i for i in range(n)]
    if n >= 4 and longest >= 2048:
        out[n // 4], out[n // 2] = 1023, 2048
    return out


def sized_prompts(url, lengths):
    # Chat prompts of exactly these rendered lengths: words are added or removed until the
    # server's own render (/v1/chat/completions/render) counts the target.
    words = ["alpha", "beta", "gamma", "delta", "orbit", "river", "stone", "ledger", "vector",
             "signal", "harbor", "quartz", "meadow", "cipher", "lantern", "summit"]
    out = []
    for i, target in enumerate(lengths):
        k = max(1, target - 12)
        for _ in range(6):
            text = f"Load {i}: " + " ".join(words[(i * 5 + j * 7) % len(words)]
                                            for j in range(k))
            body = {"model": MODEL, "messages": [{"role": "user", "content": text}],
                    "chat_template_kwargs": {"thinking": False}}
            s, r = http("POST", url + "/v1/chat/completions/render", body, timeout=60)
            assert s == 200, r
            count = json.loads(r)["count"]
            if count == target:
                break
            k = max(1, k + target - count)
        out.append(text)
    return out


def f32(x):
    # The engine's logprobs are float32. vllm-router re-serializes the decode worker's JSON and
    # its float parser (serde_json without float_roundtrip) is sometimes one float64 ulp off, so
    # answers that went through the router are compared as the float32 they were.
    return struct.pack("<f", x)


def logprob_list(response, exact):
    conv = (lambda x: x) if exact else f32
    return [(e["token"], conv(e["logprob"]),
             [(t["token"], conv(t["logprob"])) for t in e["top_logprobs"]])
            for e in response["choices"][0]["logprobs"]["content"]]


def chat_body(text, max_tokens):
    return {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 2,
            "chat_template_kwargs": {"thinking": False}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--longest", type=int, default=4000,
                    help="the longest prompt of the load section, tokens")
    ap.add_argument("--max-tokens", type=int, default=6)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    tally = Results()
    check = tally.check

    both = Worker(args, "both", "both")
    prefill = Worker(args, "prefill", "prefill")
    decodes = [Worker(args, f"decode{i}", "decode") for i in range(2)]
    workers = [both, prefill, *decodes]
    router = None
    try:
        for w in workers:
            w.wait_ready()
        port = free_port()
        router_log = open(os.path.join(args.workdir, "vllm-router-pd.log"), "w")
        cmd = ["vllm-router", "--host", "127.0.0.1", "--port", str(port),
               "--vllm-pd-disaggregation", "--prefill", prefill.url,
               "--decode", decodes[0].url, "--decode", decodes[1].url,
               "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(free_port())]
        if os.environ.get("ROUTER_DEBUG"):
            cmd += ["--log-level", "debug"]
        router = subprocess.Popen(cmd, stdout=router_log, stderr=subprocess.STDOUT)
        router_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: router.poll() is not None or
                   http("GET", router_url + "/v1/models")[0] == 200, 60, "vllm-router up")
        if router.poll() is not None:
            raise RuntimeError("vllm-router exited; see vllm-router-pd.log")

        # 1. Disaggregated == colocated, bit for bit: through the router (float32 logprobs, see
        # f32), and handed over by this script as the router does (the exact JSON numbers).
        # Prompts from 16 to --longest tokens, ending at many offsets modulo the page.
        loads = sized_prompts(both.url, prompt_lengths(args.requests, args.longest))
        texts = prompts(16)  # the short prompts of the later sections
        mismatches, lengths = [], []
        t0 = time.time()
        for i, text in enumerate(loads):
            body = chat_body(text, args.max_tokens)
            s1, r1 = post(router_url + "/v1/chat/completions", body)
            s2, r2 = post(both.url + "/v1/chat/completions", body)
            prefill_body = chat_body(text, 1)
            prefill_body["kv_transfer_params"] = {"do_remote_decode": True}
            s3, r3 = post(prefill.url + "/v1/chat/completions", prefill_body)
            s4, r4 = 0, ""
            if s3 == 200:
                decode_body = dict(body, kv_transfer_params=json.loads(r3)["kv_transfer_params"])
                s4, r4 = post(decodes[i % 2].url + "/v1/chat/completions", decode_body)
            if (s1, s2, s3, s4) != (200, 200, 200, 200):
                mismatches.append(f"request {i}: router {s1} {r1[:300]} / both {s2} {r2[:200]} "
                                  f"/ prefill {s3} {r3[:200]} / decode {s4} {r4[:200]}")
                continue
            a, b, d = json.loads(r1), json.loads(r2), json.loads(r4)
            lengths.append(b["usage"]["prompt_tokens"])
            if (logprob_list(a, False) != logprob_list(b, False) or
                    a["choices"][0]["message"] != b["choices"][0]["message"]):
                mismatches.append(f"request {i} via the router: {r1[:400]} != {r2[:400]}")
            if (logprob_list(d, True) != logprob_list(b, True) or
                    d["choices"][0]["message"] != b["choices"][0]["message"]):
                mismatches.append(f"request {i} handed over: {r4[:400]} != {r2[:400]}")
        print(f"  {len(loads)} requests in {time.time() - t0:.1f} s; prompt tokens {lengths}; "
              f"mod 128 {[n % 128 for n in lengths]}")
        for m in mismatches[:5]:
            print("  " + m)
        check(not mismatches and len(lengths) == len(loads) and
              len(set(n % 128 for n in lengths)) == len(loads),
              f"{len(loads)} greedy chat requests of {min(lengths or [0])}.."
              f"{max(lengths or [0])} tokens ({len(set(n % 128 for n in lengths))} offsets "
              "modulo 128), P/D via "
              "vllm-router and handed over directly, "
              "== --role both (tokens, logprobs, top logprobs)")
        pm = prefill.metrics()
        dm = [d.metrics() for d in decodes]
        pulls = [m.get("dsinfer:kv_transfer_pulls_total", 0) for m in dm]
        pulled_bytes = sum(m.get("dsinfer:kv_transfer_pulled_bytes_total", 0) for m in dm)
        seconds = sum(m.get("dsinfer:kv_transfer_pull_seconds_total", 0) for m in dm)
        print(f"  prefill holds {pm.get('dsinfer:kv_transfer_holds_total')}, decode pulls "
              f"{pulls}, {pulled_bytes / 1e6:.1f} MB in {seconds:.3f} s")
        check(sum(pulls) == 2 * len(loads) and min(pulls) > 0,
              "every request's state was pulled, by both decode workers")
        wait_until(lambda: prefill.metrics().get("dsinfer:kv_transfer_held_blobs", -1) == 0, 10,
                   "held blobs released")
        pm = prefill.metrics()
        check(pm.get("dsinfer:kv_transfer_released_pulled_total") == 2 * len(loads) and
              sum(m.get("dsinfer:kv_transfer_pull_failures_total", 0) for m in dm) == 0,
              "every held state released after its pull, no failed pulls")

        # 1b. A streamed chat request and a /v1/completions request through the router.
        body = dict(chat_body(texts[3], args.max_tokens), stream=True)
        s1, r1 = post(router_url + "/v1/chat/completions", body)
        s2, r2 = post(both.url + "/v1/chat/completions", body)

        def streamed_text(raw):
            out = ""
            for line in raw.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for c in json.loads(line[6:]).get("choices", []):
                        out += c.get("delta", {}).get("content") or ""
            return out
        check(s1 == 200 and s2 == 200 and streamed_text(r1) == streamed_text(r2) != "",
              f"a streamed chat request via vllm-router P/D == --role both ({s1}, {s2}: "
              f"{streamed_text(r1)!r})")
        body = {"model": MODEL, "prompt": texts[4], "max_tokens": args.max_tokens,
                "temperature": 0, "logprobs": 2}
        s1, r1 = post(router_url + "/v1/completions", body)
        s2, r2 = post(both.url + "/v1/completions", body)
        same = False
        if s1 == 200 and s2 == 200:
            a, b = json.loads(r1)["choices"][0], json.loads(r2)["choices"][0]
            same = (a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
                    and [f32(x) for x in a["logprobs"]["token_logprobs"]] ==
                    [f32(x) for x in b["logprobs"]["token_logprobs"]])
        check(same, f"a /v1/completions request via vllm-router P/D == --role both ({s1}, {s2}: "
              f"{r1[:200]})")
        pulls_now = sum(d.metrics().get("dsinfer:kv_transfer_pulls_total", 0) for d in decodes)
        check(pulls_now == sum(pulls) + 2, "both went through the hand-over (2 more pulls)")

        # 2. A state nobody pulls is released at the deadline.
        wait_until(lambda: prefill.metrics().get("dsinfer:kv_transfer_held_blobs", -1) == 0, 10,
                   "held blobs released")
        body = chat_body(texts[1], 1)
        body["kv_transfer_params"] = {"do_remote_decode": True}
        s, r = post(prefill.url + "/v1/chat/completions", body)
        params = json.loads(r).get("kv_transfer_params") if s == 200 else None
        check(s == 200 and params and params.get("do_remote_prefill") is True and
              params.get("dsinfer_transfer"), f"the prefill worker answers kv_transfer_params ({s})")
        held = prefill.metrics().get("dsinfer:kv_transfer_held_blobs")
        wait_until(lambda: prefill.metrics().get("dsinfer:kv_transfer_held_blobs", -1) == 0,
                   DEADLINE_S + 5, "the unpulled blob released")
        pm = prefill.metrics()
        check(held == 1 and pm.get("dsinfer:kv_transfer_released_deadline_total") == 1,
              f"an unpulled state is released at the {DEADLINE_S} s deadline")

        # 3. Pulled twice, malformed, wrong role: clear errors.
        body = chat_body(texts[2], 1)
        body["kv_transfer_params"] = {"do_remote_decode": True}
        s, r = post(prefill.url + "/v1/chat/completions", body)
        params = json.loads(r)["kv_transfer_params"]
        decode_body = chat_body(texts[2], 3)
        decode_body["kv_transfer_params"] = params
        s1, _ = post(decodes[0].url + "/v1/chat/completions", decode_body)
        s2, r2 = post(decodes[1].url + "/v1/chat/completions", decode_body)
        check(s1 == 200 and s2 == 503 and "no longer holds" in r2,
              f"a descriptor pulled twice: 200 then 503 ({s1}, {s2}: {r2[:160]})")
        bad = json.loads(json.dumps(decode_body))
        bad["kv_transfer_params"]["dsinfer_transfer"]["rkey"] = "not hex"
        s3, r3 = post(decodes[0].url + "/v1/chat/completions", bad)
        check(s3 == 400 and "rkey" in r3, f"a malformed descriptor: 400 ({s3}: {r3[:160]})")
        s4, r4 = post(both.url + "/v1/chat/completions", decode_body)
        check(s4 == 400 and "--role both" in r4, f"a role mismatch: 400 ({s4}: {r4[:160]})")
        s5, r5 = post(decodes[0].url + "/v1/responses",
                      {"model": MODEL, "input": "hi", "max_output_tokens": 2,
                       "kv_transfer_params": params})
        check(s5 == 422 and "kv_transfer_params" in r5,
              f"an API without the hand-over refuses kv_transfer_params: 422 ({s5}: {r5[:160]})")

        # 4. A corrupted transfer through the real router, which retries the 503.
        corrupt = Worker(args, "decode-corrupt", "decode",
                         extra=["--kv-transfer-test-corrupt", "1"])
        workers.append(corrupt)
        corrupt.wait_ready()
        base_pages = corrupt.metrics().get("dsinfer:kv_pages")
        port2 = free_port()
        router2 = subprocess.Popen(
            ["vllm-router", "--host", "127.0.0.1", "--port", str(port2),
             "--vllm-pd-disaggregation", "--prefill", prefill.url, "--decode", corrupt.url,
             "--policy", "round_robin", "--retry-max-retries", "3",
             "--retry-initial-backoff-ms", "100", "--disable-circuit-breaker",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
            stdout=open(os.path.join(args.workdir, "vllm-router-pd-corrupt.log"), "w"),
            stderr=subprocess.STDOUT)
        try:
            router2_url = f"http://127.0.0.1:{port2}"
            wait_until(lambda: router2.poll() is not None or
                       http("GET", router2_url + "/v1/models")[0] == 200, 60, "second router up")
            # vllm-router 0.1.17's P/D path passes a decode-stage 503 on to the client (its
            # retry settings do not cover the second stage), so the client's retry is what
            # recovers: the first answer must be that clear 503, the retry the right answer.
            body = chat_body(texts[5], args.max_tokens)
            s0, r0 = post(router2_url + "/v1/chat/completions", body)
            s1, r1 = post(router2_url + "/v1/chat/completions", body)
            s2, r2 = post(both.url + "/v1/chat/completions", body)
            same = (s1, s2) == (200, 200) and \
                json.loads(r1)["choices"][0]["message"] == json.loads(r2)["choices"][0]["message"]
            cm = corrupt.metrics()
            check(s0 == 503 and "do not match their SHA-256" in r0 and same and
                  cm.get("dsinfer:kv_transfer_checksum_failures_total") == 1 and
                  cm.get("dsinfer:kv_transfer_pulls_total") == 1,
                  f"a corrupted transfer is caught by the checksum and answered 503 through the "
                  f"router ({s0}: {r0[:200]}); the retry succeeds ({s1}), == --role both: {same}; "
                  f"checksum failures {cm.get('dsinfer:kv_transfer_checksum_failures_total')}, "
                  f"pulls {cm.get('dsinfer:kv_transfer_pulls_total')}")
            wait_until(lambda: prefill.metrics().get("dsinfer:kv_transfer_held_blobs", -1) == 0,
                       DEADLINE_S + 5, "held blobs released after the corrupted pull")
            check(corrupt.metrics().get("dsinfer:kv_pages") == base_pages and
                  corrupt.metrics().get("dsinfer:num_requests_running") == 0,
                  "no pages leak: the decode worker's KV pages and running requests are back at "
                  "their baseline, the prefill worker holds nothing")
        finally:
            router2.terminate()
            router2.wait(timeout=20)
    finally:
        if router is not None and router.poll() is None:
            router.terminate()
            router.wait(timeout=20)
        for w in workers:
            w.stop()
    print(f"{tally.passed} passed, {tally.failed} failed")
    return 0 if tally.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
