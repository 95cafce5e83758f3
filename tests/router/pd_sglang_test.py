"""Prefill/decode disaggregation behind the real sglang-router (tests/router/pd_run.sh --sglang).

sglang-router --pd-disaggregation sends the same request, tagged with bootstrap_host /
bootstrap_port / bootstrap_room, to a prefill and a decode worker at once and answers with the
decode worker's response. One `--role prefill` and two `--role decode` dsinfer workers of the demo
model behind it (the prefill worker's bootstrap port is its HTTP port), and one `--role both`
server beside them. Checked, with the figures printed:
  * 50 greedy chat requests (prompts of 16..4k tokens ending at 50 offsets modulo the 128-token
    page; with and without logprobs, which take different paths in the router) give the same
    tokens and bit-identical logprobs as the `--role both` server (float32 through the router, which
    re-serializes; exact for 6 handed over directly by this script as the router does); both
    decode workers pulled states;
  * every room is published and taken once, every held state released after its pull;
  * a streamed chat request and a /v1/completions request through the router;
  * clear errors: bootstrap_port null or a malformed room (400), a room never published (503 at
    the decode worker's --bootstrap-timeout), an unreachable prefill worker (503), a --role both
    worker (400), an API without the hand-over (422), a refused import (503);
  * fault: the prefill worker SIGKILLed while requests are in flight: each request succeeds (== the
    `--role both` answer) or fails with a 5xx naming the cause, within a bound; states it held
    but no decode worker had pulled (a descriptor, a published room) fail with a 503 at once; the
    decode workers are back at their baseline (no running request, no KV pages); the prefill
    worker restarted on its port serves again.
Everything binds 127.0.0.1. The last line is "N passed, N failed".
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from pd_test import (MODEL, Worker, chat_body, f32, logprob_list, post, prompt_lengths, prompts,
                     sized_prompts)
from router_test import Results, free_port, http, wait_until

BOOTSTRAP_TIMEOUT_S = 5
HTTP_503 = 'dsinfer:http_responses_total{code="503"}'


def content(response):
    return response["choices"][0]["message"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--longest", type=int, default=4000,
                    help="the longest prompt (tokens); the requests span 16..longest")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--fault-requests", type=int, default=8)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    tally = Results()
    check = tally.check

    decode_flags = ["--bootstrap-timeout", str(BOOTSTRAP_TIMEOUT_S)]
    both = Worker(args, "sg-both", "both")
    prefill = Worker(args, "sg-prefill", "prefill")
    decodes = [Worker(args, f"sg-decode{i}", "decode", extra=decode_flags) for i in range(2)]
    workers = [both, prefill, *decodes]
    router = None
    try:
        for w in workers:
            w.wait_ready()
        port = free_port()
        router_log = open(os.path.join(args.workdir, "sglang-router-pd.log"), "w")
        # The bootstrap port after the prefill URL is its HTTP port: dsinfer serves the bootstrap
        # there. No circuit breaker, a 1 s health check: the fault test restarts the prefill
        # worker and wants it back in rotation at once.
        cmd = ["sglang-router", "launch", "--host", "127.0.0.1", "--port", str(port),
               "--pd-disaggregation", "--prefill", prefill.url, str(prefill.port),
               "--decode", decodes[0].url, "--decode", decodes[1].url,
               "--policy", "round_robin", "--retry-max-retries", "3",
               "--retry-initial-backoff-ms", "100", "--disable-circuit-breaker",
               "--health-check-interval-secs", "1", "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(free_port())]
        if os.environ.get("ROUTER_DEBUG"):
            cmd += ["--log-level", "debug"]
        router = subprocess.Popen(cmd, stdout=router_log, stderr=subprocess.STDOUT)
        router_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: router.poll() is not None or
                   http("GET", router_url + "/v1/models")[0] == 200, 60, "sglang-router up")
        if router.poll() is not None:
            raise RuntimeError("sglang-router exited; see sglang-router-pd.log")

        # 1. Disaggregated == colocated, bit for bit. With logprobs the router waits for both
        # answers and re-serializes the decode worker's JSON (float32 comparison, see f32);
        # without, it passes the decode worker's bytes on and drops the prefill worker's.
        # As behind vllm-router (pd_test.py): prompts of 16..4k tokens ending at 50 different
        # offsets modulo the 128-token page.
        texts = sized_prompts(both.url, prompt_lengths(args.requests, args.longest))
        mismatches, lengths = [], []
        t0 = time.time()
        for i, text in enumerate(texts):
            body = chat_body(text, args.max_tokens)
            with_logprobs = i % 2 == 0
            if not with_logprobs:
                del body["logprobs"], body["top_logprobs"]
            s1, r1 = post(router_url + "/v1/chat/completions", body)
            s2, r2 = post(both.url + "/v1/chat/completions", body)
            if (s1, s2) != (200, 200):
                mismatches.append(f"request {i}: router {s1} {r1[:300]} / both {s2} {r2[:200]}")
                continue
            a, b = json.loads(r1), json.loads(r2)
            lengths.append(b["usage"]["prompt_tokens"])
            same = content(a) == content(b)
            if with_logprobs:
                same = same and logprob_list(a, False) == logprob_list(b, False)
            if not same:
                mismatches.append(f"request {i}: {r1[:400]} != {r2[:400]}")
        # Handed over directly the way the router does it (the same body to both workers at
        # once): the decode worker's own JSON, compared exactly.
        for i, text in enumerate(texts[:6]):
            body = dict(chat_body(text, args.max_tokens), bootstrap_host="127.0.0.1",
                        bootstrap_port=prefill.port, bootstrap_room=1000 + i)
            answers = {}
            th = threading.Thread(target=lambda: answers.update(
                p=post(prefill.url + "/v1/chat/completions", body)))
            th.start()
            s3, r3 = post(decodes[i % 2].url + "/v1/chat/completions", body)
            th.join()
            s2, r2 = post(both.url + "/v1/chat/completions", chat_body(text, args.max_tokens))
            if (s3, answers["p"][0], s2) != (200, 200, 200):
                mismatches.append(f"direct {i}: decode {s3} {r3[:200]} / prefill "
                                  f"{answers['p'][0]} / both {s2}")
                continue
            d, b = json.loads(r3), json.loads(r2)
            if content(d) != content(b) or logprob_list(d, True) != logprob_list(b, True):
                mismatches.append(f"direct {i}: {r3[:400]} != {r2[:400]}")
        print(f"  {len(texts)} requests in {time.time() - t0:.1f} s; prompt tokens {lengths}; "
              f"mod 128 {[n % 128 for n in lengths]}")
        for m in mismatches[:5]:
            print("  " + m)
        check(not mismatches and len(lengths) == len(texts),
              f"{len(texts)} greedy chat requests via sglang-router P/D == --role both (tokens; "
              "logprobs and top logprobs on every other one), and 6 handed over directly "
              "(logprobs exact)")
        dm = [d.metrics() for d in decodes]
        pulls = [m.get("dsinfer:kv_transfer_pulls_total", 0) for m in dm]
        pulled_bytes = sum(m.get("dsinfer:kv_transfer_pulled_bytes_total", 0) for m in dm)
        print(f"  decode pulls {pulls}, {pulled_bytes / 1e6:.1f} MB")
        check(sum(pulls) == len(texts) + 6 and min(pulls) > 0,
              "every request's state was pulled, by both decode workers")
        wait_until(lambda: prefill.metrics().get("dsinfer:kv_transfer_held_blobs", -1) == 0, 10,
                   "held blobs released")
        pm = prefill.metrics()
        rooms = (pm.get("dsinfer:kv_transfer_bootstrap_rooms_published_total"),
                 pm.get("dsinfer:kv_transfer_bootstrap_rooms_taken_total"),
                 pm.get("dsinfer:kv_transfer_bootstrap_rooms_waiting"))
        check(rooms == (len(texts) + 6, len(texts) + 6, 0) and
              pm.get("dsinfer:kv_transfer_released_pulled_total") == len(texts) + 6 and
              sum(m.get("dsinfer:kv_transfer_pull_failures_total", 0) for m in dm) == 0,
              f"every room published and taken once (published, taken, waiting: {rooms}), every "
              "held state released after its pull, no failed pulls")

        # 1b. A streamed chat request (with logprobs: the router's merging path) and a
        # /v1/completions request.
        body = dict(chat_body(texts[3], args.max_tokens), stream=True)
        s1, r1 = post(router_url + "/v1/chat/completions", body)
        s2, r2 = post(both.url + "/v1/chat/completions", body)

        def streamed(raw):
            text, lps = "", []
            for line in raw.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for c in json.loads(line[6:]).get("choices", []):
                        text += c.get("delta", {}).get("content") or ""
                        for e in (c.get("logprobs") or {}).get("content") or []:
                            lps.append((e["token"], f32(e["logprob"])))
            return text, lps
        check(s1 == 200 and s2 == 200 and streamed(r1) == streamed(r2) and streamed(r1)[0],
              f"a streamed chat request via sglang-router P/D == --role both ({s1}, {s2}: "
              f"{streamed(r1)[0]!r})")
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
        check(same, f"a /v1/completions request via sglang-router P/D == --role both ({s1}, "
              f"{s2}: {r1[:200]})")
        pulls_now = sum(d.metrics().get("dsinfer:kv_transfer_pulls_total", 0) for d in decodes)
        check(pulls_now == sum(pulls) + 2, "both went through the hand-over (2 more pulls)")

        # 2. Clear errors, sent to the workers directly as the router would.
        def tagged(text, room, port=prefill.port, host="127.0.0.1"):
            return dict(chat_body(text, 3), bootstrap_host=host, bootstrap_port=port,
                        bootstrap_room=room)
        s, r = post(decodes[0].url + "/v1/chat/completions", tagged(texts[1], 11, port=None))
        check(s == 400 and "--prefill URL PORT" in r, f"bootstrap_port null: 400 ({s}: {r[:160]})")
        s, r = post(decodes[0].url + "/v1/chat/completions", tagged(texts[1], "eleven"))
        check(s == 400 and "bootstrap_room" in r, f"a malformed room: 400 ({s}: {r[:160]})")
        s, r = post(decodes[0].url + "/v1/chat/completions", tagged(texts[1], [1, 2]))
        check(s == 400 and "n = 1" in r, f"a list of rooms: 400 ({s}: {r[:160]})")
        t = time.time()
        s, r = post(decodes[0].url + "/v1/chat/completions", tagged(texts[1], 12345))
        waited = time.time() - t
        check(s == 503 and "did not publish" in r and BOOTSTRAP_TIMEOUT_S <= waited <
              BOOTSTRAP_TIMEOUT_S + 3,
              f"a room never published: 503 after --bootstrap-timeout ({s} in {waited:.1f} s: "
              f"{r[:200]})")
        s, r = post(decodes[0].url + "/v1/chat/completions", tagged(texts[1], 12, port=free_port()))
        check(s == 503 and "cannot reach" in r, f"an unreachable prefill worker: 503 ({s}: "
              f"{r[:200]})")
        s, r = post(decodes[0].url + "/v1/chat/completions", tagged(texts[1], 15, port=both.port))
        check(s == 503 and "only a prefill worker" in r,
              f"bootstrap_port naming a worker that is not a prefill worker: 503 ({s}: {r[:200]})")
        s, r = post(both.url + "/v1/chat/completions", tagged(texts[1], 13))
        check(s == 400 and "--role both" in r, f"a --role both worker: 400 ({s}: {r[:160]})")
        s, r = post(decodes[0].url + "/v1/responses",
                    {"model": MODEL, "input": "hi", "max_output_tokens": 2, "bootstrap_room": 14,
                     "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.port})
        check(s == 422 and "bootstrap_room" in r, f"an API without the hand-over: 422 ({s}: "
              f"{r[:160]})")
        s, r = http("GET", decodes[0].url + "/dsinfer/bootstrap?room=1")
        check(s == 400 and "only a prefill worker" in r,
              f"a decode worker has no bootstrap endpoint: 400 ({s}: {r[:160]})")
        # A refused import: the prefill worker publishes the state of one prompt, the decode
        # worker is asked to continue another from it.
        room = 77
        done = {}
        th = threading.Thread(target=lambda: done.update(
            p=post(prefill.url + "/v1/chat/completions", tagged(texts[5], room))))
        th.start()
        s, r = post(decodes[1].url + "/v1/chat/completions", tagged(texts[6], room))
        th.join()
        check(s == 503 and "refused" in r and done["p"][0] == 200,
              f"a refused import: 503 ({s}: {r[:200]})")

        # 3. Fault: SIGKILL the prefill worker while requests are in flight, and after it has
        # answered two requests whose states no decode worker has pulled yet: one handed over
        # vllm-router's way (a descriptor), one sglang-router's (a published room).
        base = [(d.metrics().get("dsinfer:kv_pages"),
                 d.metrics().get("dsinfer:num_requests_running")) for d in decodes]
        base503 = [d.metrics().get(HTTP_503, 0) for d in decodes]
        orphan = chat_body(texts[8], 1)
        orphan["kv_transfer_params"] = {"do_remote_decode": True}
        s, r = post(prefill.url + "/v1/chat/completions", orphan)
        orphan_params = json.loads(r)["kv_transfer_params"] if s == 200 else None
        s_room, _ = post(prefill.url + "/v1/chat/completions", tagged(texts[9], 99))
        # Prompts of about 1.3k tokens: long enough to be in flight when the kill comes.
        long_texts = [f"Fault {i}: " + " ".join(prompts(16)[-1].split()[2:]) * 3
                      for i in range(args.fault_requests)]
        results = [None] * len(long_texts)

        def send(i):
            body = chat_body(long_texts[i], args.max_tokens)
            t = time.time()
            s, r = http("POST", router_url + "/v1/chat/completions", body, timeout=180)
            results[i] = (s, r, time.time() - t)
        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(long_texts))]
        for th in threads:
            th.start()
        # Kill once the first request has been answered: the rest are queued at the prefill
        # worker, being prefilled, held, or pulled.
        wait_until(lambda: any(r is not None for r in results), 120, "a first answer")
        prefill.stop(signal.SIGKILL)
        for th in threads:
            th.join(timeout=200)
        ok, failed_clearly, bad = 0, 0, []
        for i, res in enumerate(results):
            if res is None:
                bad.append(f"request {i}: no answer")
                continue
            s, r, seconds = res
            if s == 200:
                s2, r2 = post(both.url + "/v1/chat/completions",
                              chat_body(long_texts[i], args.max_tokens))
                a, b = json.loads(r), json.loads(r2)
                if s2 == 200 and logprob_list(a, False) == logprob_list(b, False):
                    ok += 1
                else:
                    bad.append(f"request {i}: 200 but != --role both: {r[:200]}")
            elif 500 <= s < 600 and len(r.strip()) > 10 and seconds < 120:
                failed_clearly += 1
                print(f"  request {i}: {s} in {seconds:.1f} s: {r[:200]}")
            else:
                bad.append(f"request {i}: {s} in {seconds:.1f} s: {r[:200]}")
        for b in bad[:5]:
            print("  " + b)
        t = time.time()
        s1, r1 = post(decodes[0].url + "/v1/chat/completions",
                      dict(chat_body(texts[8], 3), kv_transfer_params=orphan_params))
        s2, r2 = post(decodes[1].url + "/v1/chat/completions", tagged(texts[9], 99))
        check(s_room == 200 and s1 == 503 and "KV transfer failed" in r1 and s2 == 503 and
              "cannot reach" in r2 and time.time() - t < 10,
              f"states held by the killed prefill worker: 503 for the descriptor ({s1}: "
              f"{r1[:160]}) and for the room ({s2}: {r2[:120]}) in {time.time() - t:.1f} s")
        check(not bad and failed_clearly > 0,
              f"prefill worker SIGKILLed with {len(long_texts)} requests in flight: {ok} "
              f"answered (== --role both), {failed_clearly} failed with a 5xx naming the cause")
        try:
            wait_until(lambda: [(d.metrics().get("dsinfer:kv_pages"),
                                 d.metrics().get("dsinfer:num_requests_running"))
                                for d in decodes] == base, 30, "decode workers at baseline")
            at_base = True
        except RuntimeError:
            at_base = False
        dm = [d.metrics() for d in decodes]
        print(f"  decode (kv pages, running) before {base}, after "
              f"{[(m.get('dsinfer:kv_pages'), m.get('dsinfer:num_requests_running')) for m in dm]}"
              f"; pull failures {[m.get('dsinfer:kv_transfer_pull_failures_total') for m in dm]}"
              "; 503s answered since the kill "
              f"{[m.get(HTTP_503, 0) - b for m, b in zip(dm, base503)]}")
        check(at_base, "the decode workers leak nothing (KV pages and running requests back to "
              "their baseline)")
        prefill = Worker(args, "sg-prefill", "prefill", port=prefill.port)
        workers[1] = prefill
        prefill.wait_ready()
        body = chat_body(texts[7], args.max_tokens)
        status = [0, ""]

        def served():
            status[:] = post(router_url + "/v1/chat/completions", body)
            return status[0] == 200
        try:
            wait_until(served, 60, "the restarted prefill worker in rotation")
        except RuntimeError:
            pass
        s2, r2 = post(both.url + "/v1/chat/completions", body)
        check(status[0] == 200 and s2 == 200 and
              logprob_list(json.loads(status[1]), False) == logprob_list(json.loads(r2), False),
              f"the prefill worker restarted on its port serves again ({status[0]}: "
              f"{status[1][:160]})")
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
