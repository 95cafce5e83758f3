#!/usr/bin/env python3
"""Speculative decoding through `dsinfer serve`, against the same server without it.

Three servers on one checkpoint: plain; --speculative-tokens K --draft-min-confidence 0 (every
draft proposed: V4's MTP block, V4.1's dSpark stages); and the same drafting from a draft
vocabulary (--speculative-token-map, every third id). Greedy requests through the OpenAI routes
must come back identical from all three, text and logprobs: non-streamed and streamed chat, a
completion of token ids, a chat cut by a stop string taken from the plain output, and a burst of
concurrent requests (drafts and verify rows batched with other sequences). The speculating
servers' /metrics must show drafts proposed, verified and accepted counts that add up. A map
with an id outside the vocabulary stops startup with the entry named.
Usage: speculative_e2e.py DSINFER MODEL_DIR [--k K] [--log FILE]. Loopback only; stdlib only."""
import argparse, atexit, json, os, shutil, subprocess, tempfile, threading

from serve_util import Server, metric


def chat_body(i, **extra):
    topics = ["rivers", "prime numbers", "the moon", "bread", "trains", "chess", "rain", "glass"]
    body = {"model": "m", "messages": [{"role": "user", "content": "Say something about %s." % topics[i % 8]}],
            "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    body.update(extra)
    return body


def chat_result(r):
    c = r["choices"][0]
    return c["message"].get("content"), c["message"].get("reasoning_content"), c["finish_reason"], \
        [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
         for t in (c.get("logprobs") or {}).get("content") or []]


def stream_result(events):
    text, reasoning, finish, lps = "", "", None, []
    for e in events:
        for c in e.get("choices", []):
            d = c.get("delta", {})
            text += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            finish = c.get("finish_reason") or finish
            for t in (c.get("logprobs") or {}).get("content") or []:
                lps.append((t["token"], t["logprob"]))
    return text, reasoning, finish, lps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dsinfer")
    ap.add_argument("model")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--log", default="speculative-e2e.log")
    a = ap.parse_args()
    common = ["--max-model-len", "2048"]
    speculate = ["--speculative-tokens", str(a.k), "--draft-min-confidence", "0"]
    with open(os.path.join(a.model, "config.json")) as f:
        config = json.load(f)
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]  # V4.1: text_config
    maps = tempfile.mkdtemp(prefix="dsinfer-token-map-")
    atexit.register(shutil.rmtree, maps, True)
    every_third, bad = os.path.join(maps, "every-third.json"), os.path.join(maps, "bad.json")
    with open(every_third, "w") as f:
        json.dump(list(range(1, vocab, 3)), f)
    with open(bad, "w") as f:
        json.dump([1, 2, vocab], f)
    # A bad map: startup stops with the reason, before any port is served.
    r = subprocess.run([a.dsinfer, "serve", "--model", a.model, "--port", "0", "--threads", "1"]
                       + speculate + ["--speculative-token-map", bad],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "entry 2 (%d)" % vocab in r.stderr, \
        "a map with id %d was not refused with its entry named: %d %r" % (vocab, r.returncode, r.stderr[-500:])
    plain = Server(a.dsinfer, a.model, common, a.log, threads=1)
    spec = Server(a.dsinfer, a.model, common + speculate, a.log, threads=1)
    mapped = Server(a.dsinfer, a.model, common + speculate + ["--speculative-token-map", every_third],
                    a.log, threads=1)
    checks = 0

    def same(what, f):
        nonlocal checks
        want = f(plain)
        for name, server in (("speculation", spec), ("speculation from a token map", mapped)):
            got = f(server)
            assert want == got, "%s differs with %s:\n plain %r\n spec  %r" % (what, name, want, got)
        checks += 1
        return want

    same("chat", lambda s: chat_result(s.post("/v1/chat/completions", chat_body(0))))
    same("streamed chat", lambda s: stream_result(s.stream("/v1/chat/completions",
                                                            chat_body(1, stream=True))))
    same("completion of token ids", lambda s: (lambda c: (c["text"], c["logprobs"]["token_logprobs"]))(
        s.post("/v1/completions", {"model": "m", "prompt": [17, 400, 9, 1234, 77, 5], "max_tokens": 24,
                                   "temperature": 0, "logprobs": 1})["choices"][0]))
    # Without thinking the output is content, where stop strings apply: one from the middle of
    # the plain output ends both at the same place, with "stop".
    no_think = {"chat_template_kwargs": {"thinking": False}}
    answer = same("chat without thinking", lambda s: chat_result(
        s.post("/v1/chat/completions", chat_body(0, **no_think))))[0] or ""
    assert len(answer) >= 12, "too short an answer to cut: %r" % answer
    stop = answer[len(answer) // 2: len(answer) // 2 + 3]
    r = same("chat with a stop string", lambda s: chat_result(
        s.post("/v1/chat/completions", chat_body(0, stop=[stop], **no_think))))
    assert r[2] == "stop" and stop not in (r[0] or ""), \
        "the stop string %r did not stop the output: %r" % (stop, r[:3])
    # Concurrent requests: drafts and verify rows share steps with other sequences.
    def burst(s):
        out = [None] * 6
        def one(i):
            out[i] = chat_result(s.post("/v1/chat/completions", chat_body(2 + i, max_tokens=16)))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out
    same("6 concurrent chats", burst)
    counts = []
    for server in (spec, mapped):
        m = server.metrics()
        drafts = metric(m, "dsinfer:spec_decode_num_drafts_total")
        proposed = metric(m, "dsinfer:spec_decode_num_draft_tokens_total")
        accepted = metric(m, "dsinfer:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and proposed >= drafts, "no drafts verified: %s %s" % (drafts, proposed)
        assert 0 <= accepted <= proposed, "accepted %s of %s" % (accepted, proposed)
        counts.append("%d drafts, %d draft tokens, %d accepted" % (drafts, proposed, accepted))
    print("speculative e2e ok: %d checks equal with and without speculation (k=%d); %s; from the "
          "token map: %s" % (checks, a.k, counts[0], counts[1]))


if __name__ == "__main__":
    main()
