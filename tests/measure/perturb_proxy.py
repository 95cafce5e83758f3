#!/usr/bin/env python3
"""An HTTP proxy in front of an OpenAI-compatible server that damages the logprobs it returns, so
that `dsinfer compare endpoints` can be shown to catch the damage (tests/measure/compare_e2e.sh).
Python standard library only.

Modes (applied to non-streaming /v1/completions and /v1/chat/completions responses):
  pass   forward unchanged
  noise  add noise of magnitude in [amplitude/2, amplitude] (random sign, one draw per token text,
         so the chosen token and its top-k entry move together) to every logprob at --position
  swap   replace the chosen token at --position by the lowest-ranked other top-k token (and its
         logprob): a greedy divergence that is not a near-tie
Only the --request-th generation request (0-based, counted in arrival order; -1: every request) is
damaged; --position -1 damages every position (noise only).
The proxy binds 127.0.0.1 on a free port and writes the port number to --port-file when ready.
"""
import argparse
import json
import os
import random
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


def positions_of(n, position):
    if position < 0:
        return list(range(n))
    return [position] if position < n else []


def noise_for(rng, texts, amplitude):
    return {t: rng.choice((-1, 1)) * rng.uniform(amplitude / 2, amplitude) for t in texts}


def damage_completion(lp, args, rng):
    tokens, values, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
    for p in positions_of(len(tokens), args.position):
        top = tops[p] or {}
        if args.mode == "noise":
            noise = noise_for(rng, set(top) | {tokens[p]}, args.amplitude)
            values[p] += noise[tokens[p]]
            tops[p] = {t: v + noise[t] for t, v in top.items()}
        elif args.mode == "swap":
            others = sorted((v, t) for t, v in top.items() if t != tokens[p])
            if others:
                values[p], tokens[p] = others[0]


def damage_chat(lp, args, rng):
    content = lp["content"]
    for p in positions_of(len(content), args.position):
        entry = content[p]
        top = entry.get("top_logprobs") or []
        if args.mode == "noise":
            noise = noise_for(rng, {e["token"] for e in top} | {entry["token"]}, args.amplitude)
            entry["logprob"] += noise[entry["token"]]
            for e in top:
                e["logprob"] += noise[e["token"]]
        elif args.mode == "swap":
            others = sorted((e["logprob"], e["token"]) for e in top if e["token"] != entry["token"])
            if others:
                entry["logprob"], entry["token"] = others[0]


def make_handler(args):
    lock = threading.Lock()
    counter = {"requests": 0}
    rng = random.Random(args.seed)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # quiet: the test prints what matters
            pass

        def forward(self, method):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() in ("content-type", "authorization", "accept")}
            req = urllib.request.Request(args.upstream + self.path, data=body, headers=headers,
                                         method=method)
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    status, payload = resp.status, resp.read()
                    ctype = resp.headers.get("Content-Type", "application/json")
            except urllib.error.HTTPError as e:
                status, payload = e.code, e.read()
                ctype = e.headers.get("Content-Type", "application/json")
            if method == "POST" and self.path in GENERATION_PATHS and status == 200:
                with lock:
                    index = counter["requests"]
                    counter["requests"] += 1
                    if args.mode != "pass" and args.request in (-1, index):
                        doc = json.loads(payload)
                        lp = doc["choices"][0]["logprobs"]
                        if self.path == "/v1/chat/completions":
                            damage_chat(lp, args, rng)
                        else:
                            damage_completion(lp, args, rng)
                        payload = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = True

        def do_GET(self):
            self.forward("GET")

        def do_POST(self):
            self.forward("POST")

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--mode", choices=("pass", "noise", "swap"), default="pass")
    ap.add_argument("--request", type=int, default=-1)
    ap.add_argument("--position", type=int, default=-1)
    ap.add_argument("--amplitude", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.mode == "swap" and args.position < 0:
        ap.error("swap needs --position >= 0")
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(args))
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)  # readers never see a partial file
    server.serve_forever()


if __name__ == "__main__":
    main()
