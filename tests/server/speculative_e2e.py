#!/usr/bin/env python3
"""Speculative decoding through `dsinfer serve`, against the same server without it.

Two servers on one checkpoint: plain, and --speculative-tokens K --draft-min-confidence 0 (every
draft proposed: V4's MTP block, V4.1's dSpark stages). Greedy requests through the OpenAI routes
must come back identical, text and logprobs: non-streamed and streamed chat, a completion of
token ids, a chat cut by a stop string taken from the plain output, and a burst of concurrent
requests (drafts and verify rows batched with other sequences). The speculating server's
/metrics must show drafts proposed, verified and accepted counts that add up.
Usage: speculative_e2e.py DSINFER MODEL_DIR [--k K] [--log FILE]. Loopback only; stdlib only."""
import argparse, threading

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
    plain = Server(a.dsinfer, a.model, common, a.log, threads=1)
    spec = Server(a.dsinfer, a.model, common + ["--speculative-tokens", str(a.k),
                                                "--draft-min-confidence", "0"], a.log, threads=1)
    checks = 0

    def same(what, f):
        nonlocal checks
        want, got = f(plain), f(spec)
        assert want == got, "%s differs with speculation:\n plain %r\n spec  %r" % (what, want, got)
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
    m = spec.metrics()
    drafts = metric(m, "dsinfer:spec_decode_num_drafts_total")
    proposed = metric(m, "dsinfer:spec_decode_num_draft_tokens_total")
    accepted = metric(m, "dsinfer:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and proposed >= drafts, "no drafts verified: %s %s" % (drafts, proposed)
    assert 0 <= accepted <= proposed, "accepted %s of %s" % (accepted, proposed)
    print("speculative e2e ok: %d checks equal with and without speculation (k=%d); %d drafts, "
          "%d draft tokens, %d accepted" % (checks, a.k, drafts, proposed, accepted))


if __name__ == "__main__":
    main()
