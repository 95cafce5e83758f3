#!/usr/bin/env python3
"""The disk KV tier on a real file system that fills up, then turns read-only (issue 34's faults).

Run by kv_tier_real_fs.sh inside a private mount namespace, with CACHE_DIR a small tmpfs (1 MiB:
a 1k-token prefix of the demo model is about 0.9 MB of entries). The kernel, not a test hook,
answers ENOSPC and EROFS:
  1. a cold reference (no tier; the hot prefix cache flushed before every request) gives every
     request's greedy tokens and logprobs;
  2. a server on the tmpfs serves four 1k-token prefixes: the disk fills (ENOSPC), the writes
     fail and are counted, no partial file is left, every output equals the cold one;
  3. the file system is remounted read-only under the running server: requests on the stored
     prefixes (from the RAM tier) and on new prefixes (whose writes now fail with EROFS) all
     equal the cold ones; the errors are counted;
  4. SIGTERM, and a new server starts on the read-only directory: it serves the prefixes that
     reached the disk from it (verified: no checksum failure), everything else cold, all outputs
     equal the cold ones.
Usage: kv_tier_real_fs.py DSINFER MODEL_DIR CACHE_DIR [--log FILE]. Loopback only; stdlib only."""
import argparse, os, random, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, metric  # noqa: E402  (the shared server wrapper and /metrics)

PREFIX = 1024

def prefix(p):
    return [random.Random(300 + p).randrange(10, 1000) for _ in range(PREFIX)]

def prompt(p, i):
    return prefix(p) + [random.Random(700 + 31 * p + i).randrange(10, 1000) for _ in range(16)]

def complete(server, p, i):
    r = server.post("/v1/completions", {"model": "m", "prompt": prompt(p, i), "max_tokens": 4,
                                         "temperature": 0, "logprobs": 1})
    c = r["choices"][0]
    return ((c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"]),
            r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))

def settled_metrics(server):
    """/metrics once the IO thread has finished: stores + store errors stop changing."""
    last = None
    for _ in range(100):
        m = server.metrics()
        now = (metric(m, "dsinfer:kv_tier_stores_total"),
               metric(m, "dsinfer:kv_tier_store_errors_total"))
        if now == last:
            return m
        last = now
        time.sleep(0.3)
    sys.exit("the disk tier's writes did not settle")

def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)
    print("ok:", what, flush=True)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dsinfer")
    ap.add_argument("model")
    ap.add_argument("cache_dir")
    ap.add_argument("--log", default="kv-tier-real-fs.log")
    a = ap.parse_args()
    # (prefix, tail) of each phase's requests: prefixes 0-3 fill the disk, 4-5 are new while
    # it is read-only.
    full = [(p, 0) for p in range(4)]
    read_only = [(p, 1) for p in range(4)] + [(4, 1), (5, 1)]
    restarted = [(p, 2) for p in range(6)]
    extra = ["--max-model-len", str(PREFIX + 64)]

    cold = Server(a.dsinfer, a.model, extra, a.log)
    reference = {}
    for key in full + read_only + restarted:
        cold.post("/flush_cache", {})
        reference[key] = complete(cold, *key)[0]
    cold.stop()

    store = extra + ["--kv-cache-dir", a.cache_dir, "--kv-cache-disk-gb", "1"]
    first = Server(a.dsinfer, a.model, store, a.log)
    for key in full:
        check(complete(first, *key)[0] == reference[key],
              "full disk: request %s equals cold" % (key,))
    m = settled_metrics(first)
    errors_full = metric(m, "dsinfer:kv_tier_store_errors_total")
    stores_full = metric(m, "dsinfer:kv_tier_stores_total")
    check(errors_full > 0, "full disk: %d writes failed with ENOSPC and were counted (%d stored)"
          % (errors_full, stores_full))
    check(stores_full > 0, "full disk: the entries that fit were stored")
    leftovers = [f for f in os.listdir(a.cache_dir) if not f.endswith(".kv")]
    check(not leftovers, "full disk: no partial or temporary file left (%s)" % leftovers)

    subprocess.run(["mount", "-o", "remount,ro", a.cache_dir], check=True)
    for key in read_only:
        first.post("/flush_cache", {})  # the hot cache is empty: a hit comes from the tiers
        got, cached = complete(first, *key)
        check(got == reference[key],
              "read-only: request %s equals cold (%d cached)" % (key, cached))
    m = settled_metrics(first)
    errors_ro = metric(m, "dsinfer:kv_tier_store_errors_total")
    check(errors_ro > errors_full, "read-only: %d more writes failed (EROFS), counted"
          % (errors_ro - errors_full))
    check(metric(m, "dsinfer:kv_tier_checksum_failures_total") == 0, "no checksum failure")
    first.stop()

    on_disk = len([f for f in os.listdir(a.cache_dir) if f.endswith(".kv")])
    second = Server(a.dsinfer, a.model, store, a.log)
    hits = 0
    for key in restarted:
        got, cached = complete(second, *key)
        check(got == reference[key], "restart on the read-only directory: request %s equals cold "
              "(%d cached)" % (key, cached))
        hits += cached > 0
    m = second.metrics()
    disk_hits = metric(m, 'dsinfer:kv_tier_hits_total{tier="disk"}')
    check(disk_hits > 0 and hits > 0, "restart: %d of %d entry files read back (%d requests hit)"
          % (disk_hits, on_disk, hits))
    check(metric(m, "dsinfer:kv_tier_checksum_failures_total") == 0,
          "restart: every entry read back verified")
    second.stop()
    print("kv tier on a real file system ok")

if __name__ == "__main__":
    main()
