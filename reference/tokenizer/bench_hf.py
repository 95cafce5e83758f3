#!/usr/bin/env python3
"""HF tokenizers counterpart of bench/tokenizer_bench.cc: same default text and tokenizer,
single-threaded encode (TOKENIZERS_PARALLELISM=false), median of N runs."""
import argparse
import json
import os
import statistics
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "tests/fixtures/tokenizer/deepseek-v4/tokenizer.json"))
    ap.add_argument("--text", default=None)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if args.text:
        text = open(args.text, "rb").read().decode("utf-8")
    else:
        with open(os.path.join(ROOT, "tests/fixtures/tokenizer/encode_corpus.jsonl"), encoding="utf-8") as f:
            text = "\n".join(json.loads(line)["text"] for line in f)
    tok = Tokenizer.from_file(args.tokenizer)
    size = len(text.encode("utf-8"))
    times, n = [], 0
    for _ in range(args.runs):
        start = time.perf_counter()
        n = len(tok.encode(text, add_special_tokens=False).ids)
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    print(f"HF tokenizers {__import__('tokenizers').__version__}: {size} bytes, {n} tokens, median of "
          f"{args.runs} runs {med:.4f} s: {size / med / 1e6:.2f} MB/s, {n / med:.0f} tokens/s")


if __name__ == "__main__":
    main()
