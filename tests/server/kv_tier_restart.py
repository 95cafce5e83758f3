#!/usr/bin/env python3
"""The disk KV tier across a restart, through `dsinfer serve` (issue 34's acceptance).

A cold reference (the hot prefix cache flushed before every request) gives each request's greedy
tokens and logprobs; then a server with --kv-cache-dir serves the first half of the requests, is
stopped with SIGTERM, and a new one on the same directory serves the second half: every output
must equal the cold one exactly, and the first request of each shared prefix after the restart
must have >= 90 % of the prefix cached, read from the disk tier (/metrics).
Usage: kv_tier_restart.py DSINFER MODEL_DIR CACHE_DIR [--prefix N] [--requests N]
Loopback only; stdlib only."""
import argparse, os, random

from serve_util import Server, metric

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dsinfer")
    ap.add_argument("model")
    ap.add_argument("cache_dir")
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--log", default="kv-tier-restart.log")
    a = ap.parse_args()
    n_prefixes = 4
    prefixes = [[random.Random(100 + p).randrange(10, 1000) for _ in range(a.prefix)]
                for p in range(n_prefixes)]
    def prompt(i):
        tail = [random.Random(500 + i).randrange(10, 1000) for _ in range(16)]
        return prefixes[i % n_prefixes] + tail
    def complete(server, i):
        r = server.post("/v1/completions", {"model": "m", "prompt": prompt(i), "max_tokens": 4,
                                             "temperature": 0, "logprobs": 1})
        c = r["choices"][0]
        return (c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"],
                r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
    extra = ["--max-model-len", str(a.prefix + 64)]
    cold = Server(a.dsinfer, a.model, extra, a.log)
    reference = []
    for i in range(a.requests):
        cold.post("/flush_cache", {})
        reference.append(complete(cold, i)[:2])
    cold.stop()
    store = extra + ["--kv-cache-dir", a.cache_dir, "--kv-cache-disk-gb", "1"]
    half = a.requests // 2
    first = Server(a.dsinfer, a.model, store, a.log)
    for i in range(half):
        got = complete(first, i)
        assert got[:2] == reference[i], "request %d differs from cold: %r vs %r" % (i, got, reference[i])
    first.stop()
    files = [f for f in os.listdir(a.cache_dir) if f.endswith(".kv")]
    assert files, "no entry files after the first server"
    second = Server(a.dsinfer, a.model, store, a.log)
    for i in range(half, a.requests):
        got = complete(second, i)
        assert got[:2] == reference[i], "request %d differs from cold: %r vs %r" % (i, got, reference[i])
        if i < half + n_prefixes:
            assert got[2] >= 0.9 * a.prefix, "request %d: %d cached tokens of a %d-token prefix" % (
                i, got[2], a.prefix)
    m = second.metrics()
    disk_hits = metric(m, 'dsinfer:kv_tier_hits_total{tier="disk"}')
    failures = metric(m, "dsinfer:kv_tier_checksum_failures_total")
    second.stop()
    assert disk_hits > 0, "no disk-tier hits after the restart"
    assert failures == 0, "%d checksum failures" % failures
    print("kv tier restart ok: %d requests, %d-token prefixes, %d entry files, %d disk hits" % (
        a.requests, a.prefix, len(files), disk_hits))

if __name__ == "__main__":
    main()
