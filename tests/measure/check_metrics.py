#!/usr/bin/env python3
"""Checks a `dsinfer bench serve` JSON report against the server's own /metrics (stdlib only).
Each level carries the server's /metrics delta over that level ("server_metrics"), so every level is
checked against its own histograms, not the pooled ones:
  - TTFT and E2E histogram counts equal the level's completed requests, and the report's median lies
    within the buckets of that level's two middle server samples, give or take one bucket;
  - the server's request-success count equals the level's completed requests, its prefix-cache
    query count equals the level's prompt tokens, and its hits equal the cached tokens in usage;
  - with --no-cache-hits: prefix-cache hits are ~0 (<= 2% of the queried tokens), i.e. the
    synthetic prompts really differ across levels and requests.
With METRICS.txt (a final scrape) the pooled histogram counts must equal the total completed.
Usage: check_metrics.py REPORT.json [METRICS.txt] [--no-cache-hits]"""
import json
import re
import sys


def pooled_counts(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(dsinfer:\w+)_count (\S+)$', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def bucket_of(bounds, value):
    for i, le in enumerate(bounds):
        if value <= le:
            return i
    return len(bounds)  # the +Inf bucket


def bucket_reaching(hist, rank):
    """The first bucket whose cumulative count reaches `rank` (1-based order statistic)."""
    for i, (_, c) in enumerate(hist["buckets"]):
        if c >= rank:
            return i
    return len(hist["buckets"])


def median_bucket_range(hist):
    """Buckets of the two middle order statistics. The report's median interpolates between them
    (for an odd count they are one), so its bucket lies in this range; with bimodal latencies (cache
    hits and cold prefills) the two can sit buckets apart."""
    n = int(hist["count"])
    return bucket_reaching(hist, (n + 1) // 2), bucket_reaching(hist, n // 2 + 1)


def check_level(r, no_cache_hits, failures):
    name_of = f"level c={r['concurrency']}"
    sm = r.get("server_metrics")
    if sm is None:
        failures.append(f"{name_of}: no server_metrics ({r.get('server_metrics_error')})")
        return
    completed = r["completed"]
    for hname, key in (("dsinfer:time_to_first_token_seconds", "ttft_ms"),
                       ("dsinfer:e2e_request_latency_seconds", "e2e_ms")):
        h = sm["histograms"].get(hname)
        if h is None or h["count"] != completed:
            failures.append(f"{name_of} {hname}: server count {h and h['count']} != completed "
                            f"{completed}")
            continue
        bounds = [le for le, _ in h["buckets"]]
        lo, hi = median_bucket_range(h)
        ours = bucket_of(bounds, r[key]["median"] / 1e3)
        # +-1 bucket: the client's clock starts before the server's (connect, send, parse).
        ok = lo - 1 <= ours <= hi + 1
        print(f"{name_of} {hname}: report median bucket {ours}, server median buckets [{lo}, {hi}] "
              f"{'ok' if ok else 'MISMATCH'}")
        if not ok:
            failures.append(f"{name_of} {hname}: report median bucket {ours} outside server's "
                            f"[{lo}, {hi}] +- 1")
    c = sm["counters"]
    success = c.get("dsinfer:request_success_total")
    if success != completed:
        failures.append(f"{name_of}: server request_success delta {success} != completed {completed}")
    queries = c.get("dsinfer:prefix_cache_queries_total")
    hits = c.get("dsinfer:prefix_cache_hits_total")
    if queries != r["total_input_tokens"]:
        failures.append(f"{name_of}: prefix-cache queries {queries} != prompt tokens "
                        f"{r['total_input_tokens']}")
    print(f"{name_of}: requests {success}, prompt tokens {queries}, prefix-cache hits {hits}, "
          f"cached tokens in usage {r['total_cached_prompt_tokens']}")
    if hits != r["total_cached_prompt_tokens"]:
        failures.append(f"{name_of}: prefix-cache hits {hits} != cached tokens in usage "
                        f"{r['total_cached_prompt_tokens']}")
    if no_cache_hits and (hits is None or hits > 0.02 * max(queries or 0, 1)):
        failures.append(f"{name_of}: prefix-cache hits {hits} of {queries} tokens (expected ~0)")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    no_cache_hits = "--no-cache-hits" in sys.argv[1:]
    report = json.load(open(args[0]))
    results = report["results"]
    failures = []
    for r in results:
        check_level(r, no_cache_hits, failures)
    if len(args) > 1:
        pooled = pooled_counts(open(args[1]).read())
        completed = sum(r["completed"] for r in results)
        for name in ("dsinfer:time_to_first_token_seconds", "dsinfer:e2e_request_latency_seconds"):
            if pooled.get(name) != completed:
                failures.append(f"pooled {name}: count {pooled.get(name)} != completed {completed}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
