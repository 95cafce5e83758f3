#!/usr/bin/env python3
"""Checks a `dsinfer bench serve` JSON report against the server's /metrics histograms (stdlib
only). For TTFT and E2E: the histogram count equals the number of completed requests, and the
report's median lies in the bucket holding the server's median, give or take one bucket.
Usage: check_metrics.py REPORT.json METRICS.txt"""
import json
import re
import sys


def histograms(text):
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(dsinfer:\w+)_bucket\{le="([^"]+)"\} (\S+)$', line)
        if m:
            out.setdefault(m.group(1), []).append((float(m.group(2)), float(m.group(3))))
        m = re.match(r'^(dsinfer:\w+)_count (\S+)$', line)
        if m:
            out.setdefault(m.group(1) + "#count", float(m.group(2)))
    return out


def bucket_of(bounds, value):
    for i, le in enumerate(bounds):
        if value <= le:
            return i
    return len(bounds) - 1


def main():
    report = json.load(open(sys.argv[1]))
    h = histograms(open(sys.argv[2]).read())
    results = report["results"]
    completed = sum(r["completed"] for r in results)
    failures = []
    for name, key in (("dsinfer:time_to_first_token_seconds", "ttft_ms"),
                      ("dsinfer:e2e_request_latency_seconds", "e2e_ms")):
        count = h.get(name + "#count")
        if count != completed:
            failures.append(f"{name}: server count {count} != completed {completed}")
            continue
        buckets = sorted(h[name])
        bounds = [le for le, _ in buckets]
        server_median = next(i for i, (_, c) in enumerate(buckets) if c >= count / 2)
        # The server pools every level; the pooled median lies between the smallest and the
        # largest per-level median, so its bucket must lie within theirs, give or take one.
        level_buckets = [bucket_of(bounds, r[key]["median"] / 1e3) for r in results]
        lo, hi = min(level_buckets), max(level_buckets)
        ok = lo - 1 <= server_median <= hi + 1
        print(f"{name}: level median buckets {level_buckets}, server median bucket {server_median} "
              f"(le={bounds[server_median]}) {'ok' if ok else 'MISMATCH'}")
        if not ok:
            failures.append(f"{name}: server median bucket {server_median} outside [{lo}, {hi}] +- 1")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
