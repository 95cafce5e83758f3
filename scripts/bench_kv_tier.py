#!/usr/bin/env python3
"""TTFT of one request cold vs restored from the RAM tier vs from the disk tier (issue 34).

For each prefix length: a new prefix is sent cold (nothing cached), then the same prefix with
another tail after the hot prefix cache is flushed (the RAM tier restores it), then, after a
restart of the server on the same directory, with a third tail (the disk tier restores it; the
page cache may hold the files unless --drop-caches works). TTFT = the latency of a max_tokens 1
request. Prints a Markdown table with the store's own read bandwidth (bytes read / seconds
reading and verifying, /metrics) and dd's O_DIRECT read bandwidth of the entry files.
Usage: bench_kv_tier.py DSINFER MODEL CACHE_DIR [--lengths 1024,4096] [--threads 2]
Loopback only."""
import argparse, atexit, glob, json, os, random, re, signal, socket, subprocess, sys, time, urllib.request

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

class Server:
    def __init__(self, a):
        self.port = free_port(); self.url = "http://127.0.0.1:%d" % self.port
        self.proc = subprocess.Popen(
            [a.dsinfer, "serve", "--model", a.model, "--host", "127.0.0.1", "--port", str(self.port),
             "--threads", str(a.threads), "--served-model-name", "m", "--kv-cache-dir", a.cache_dir,
             "--kv-cache-disk-gb", "8", "--kv-cache-ram-gb", "4"],
            stdout=subprocess.DEVNULL, stderr=open(a.log, "ab"))
        atexit.register(lambda: self.proc.poll() is None and self.proc.kill())
        for _ in range(3000):
            if self.proc.poll() is not None: sys.exit("server exited; see " + a.log)
            try: urllib.request.urlopen(self.url + "/ready", timeout=2); return
            except Exception: time.sleep(0.2)
        sys.exit("server not ready")
    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r: return json.loads(r.read() or b"{}")
    def metric(self, name):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "): return float(line.split()[-1])
        return 0.0
    def stop(self):
        self.proc.send_signal(signal.SIGTERM); self.proc.wait(timeout=600)

def ttft(server, ids):
    t0 = time.perf_counter()
    r = server.post("/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 1, "temperature": 0})
    dt = time.perf_counter() - t0
    return dt, r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)

def drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f: f.write("3\n")
        return True
    except OSError:
        return False

def dd_bandwidth(files):
    total, secs = 0, 0.0
    for f in files:
        out = subprocess.run(["dd", "if=" + f, "of=/dev/null", "bs=1M", "iflag=direct"],
                             capture_output=True, text=True).stderr
        m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out)
        if m: total += int(m.group(1)); secs += float(m.group(2))
    return total / secs / 1e9 if secs > 0 else float("nan")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dsinfer"); ap.add_argument("model"); ap.add_argument("cache_dir")
    ap.add_argument("--lengths", default="1024,4096"); ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log", default="/tmp/bench-kv-tier.log")
    ap.add_argument("--no-drop-caches", action="store_true",
                    help="keep the page cache (a big checkpoint would be read again after a drop)")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    rng = random.Random(7)
    prefixes = {n: [rng.randrange(10, 1000) for _ in range(n)] for n in lengths}
    tail = lambda k: [rng.randrange(10, 1000) for _ in range(8)]
    rows = {}
    s = Server(a)
    # A first request pages the weights in and warms the pools, so the first cold row measures
    # prefill and not start-up. Its tokens (all 5) share no 128-token page with the prefixes.
    s.post("/v1/completions", {"model": "m", "prompt": [5] * 16, "max_tokens": 1})
    for n in lengths:
        cold = ttft(s, prefixes[n] + tail(0))
        s.post("/flush_cache", {})
        ram = ttft(s, prefixes[n] + tail(1))
        rows[n] = [cold, ram]
    s.stop()
    dropped = False if a.no_drop_caches else drop_caches()
    s = Server(a)
    for n in lengths:
        rows[n].append(ttft(s, prefixes[n] + tail(2)))
    read_bytes = s.metric('dsinfer:kv_tier_hit_bytes_total{tier="disk"}')
    load_s = s.metric("dsinfer:kv_tier_load_seconds_total")
    s.stop()
    files = glob.glob(os.path.join(a.cache_dir, "*.kv"))
    print("| prefix | cold TTFT | RAM-tier hit | disk-tier hit | cached (RAM / disk) |")
    print("|---|---|---|---|---|")
    for n in lengths:
        (c, _), (r, rc), (d, dc) = rows[n]
        print("| %d | %.3f s | %.3f s | %.3f s | %d / %d |" % (n, c, r, d, rc, dc))
    print()
    print("disk tier: %d files, %.1f MB; the store read %.1f MB in %.3f s (%.2f GB/s, read + "
          "SHA-256 verify%s); dd O_DIRECT read of the files: %.2f GB/s" % (
              len(files), sum(os.path.getsize(f) for f in files) / 1e6, read_bytes / 1e6, load_s,
              read_bytes / load_s / 1e9 if load_s > 0 else float("nan"),
              ", page cache dropped" if dropped
              else ", page cache kept (--no-drop-caches)" if a.no_drop_caches
              else ", page cache NOT dropped (no permission)",
              dd_bandwidth(files)))

if __name__ == "__main__":
    main()
