#!/usr/bin/env python3
"""V4.1 golden logits from a checkpoint directory, computed by the independent oracle (model.py).

The checkpoint may come from any writer (reference/v41/write_tiny.py, or later
`dsinfer create-demo-model DIR --preset tiny-v41-*`): it must hold config.json (HF form or flat),
the safetensors shards (official layout, LAYOUT.md) and, when Engram is on, tokenizer.json (else the
V4.1 tokenizer is rebuilt from the repo's V4 tokenizer + tests/fixtures/v41/tokenizer_overlay.json).

Per prompt k (lengths PROMPT_LENGTHS, seeded random ids in [3, vocab)) the golden stores:
  p{k}.ids                    I32 [L]
  p{k}.positions              I32 [m]      positions whose logits are stored (subsampled)
  p{k}.logits.fp32            F32 [m, V]   one-shot logits, fp32-reference numerics
  p{k}.logits.official        F32 [m, V]   one-shot logits, official numerics (simulated in fp32)
  p{k}.greedy.{fp32,official} I32 [G]      greedy continuation: prefill, then one token per step
  p{k}.margin.{fp32,official} F32 [G]      top1 - top2 of the logits that chose each greedy token
  p{k}.first_unstable.{fp32,official} I32 [1]  first position where a perturbed run of the same
                                           numerics (fp64 one-shot, or fp32 ragged chunks + decode)
                                           differs from the stored one by NMSE > 1e-10 (= L if none):
                                           compare tightly before it, loosely from it on
Self-checks (manifest): fp32-vs-fp64 NMSE per numerics, chunked/decode vs one-shot, stats.

Usage: make_goldens.py --ckpt DIR --out tests/fixtures/v41/golden/NAME [--tokenizer PATH]
       make_goldens.py --preset tiny-v41-a --seed 1 --out ...   (writes the checkpoint with write_tiny)
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import model as M  # noqa: E402
import write_tiny  # noqa: E402
from engram import build_token_map, v41_tokenizer_json  # noqa: E402

PROMPT_LENGTHS = [1, 7, 33, 130, 300, 600]
GREEDY_STEPS = 12
POSITIONS_PER_PROMPT = 10
CHUNKS = [7, 1, 13, 64, 5, 2, 40, 1, 3]  # ragged prefill pieces (then one token at a time)
REPO = write_tiny.REPO


def load_token_map(ckpt_dir: str, tokenizer_path):
    from tokenizers import Tokenizer

    path = tokenizer_path or os.path.join(ckpt_dir, "tokenizer.json")
    if os.path.exists(path):
        tok, src = Tokenizer.from_file(path), path
    else:
        tok = Tokenizer.from_str(v41_tokenizer_json(write_tiny.V4_TOKENIZER, write_tiny.V41_OVERLAY))
        src = "repo V4 tokenizer + tests/fixtures/v41/tokenizer_overlay.json"
    tm, n, stats = build_token_map(tok)
    return tm, n, {"source": src, "classes": n, **stats}


def prompt_ids(k: int, length: int, vocab: int, salt: int):
    seed = 4100 + 100 * salt + k
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=g).tolist(), seed


def pick_positions(L: int, a: dict, seed: int, budget: int):
    W = a["window_size"]
    bs, kb = a["candidate_block_size"], a["candidate_topk_blocks"]
    must = {0, L - 1, 1, 2, W - 1, W, W + 1, 2 * W, kb * bs - 1, kb * bs, kb * bs + 1, 129, 299}
    chosen = sorted(p for p in must if 0 <= p < L)
    if len(chosen) > budget:
        inner = [p for p in chosen if p not in (0, L - 1)]
        step = len(inner) / (budget - 2)
        chosen = sorted({0, L - 1} | {inner[int(i * step)] for i in range(budget - 2)})
    g = torch.Generator().manual_seed(seed)
    rest = [p for p in torch.randperm(L, generator=g).tolist() if p not in chosen]
    return sorted(chosen + rest[: max(0, budget - len(chosen))])


def one_shot(oracle, ids):
    return oracle.forward(oracle.new_state(), ids)


def greedy(oracle, ids, steps):
    st = oracle.new_state()
    logits = oracle.forward(st, ids, all_logits=False)[-1]
    toks, margins = [], []
    for s in range(steps):
        top2 = torch.topk(logits.double(), 2)
        tok = int(torch.sort(-logits.double(), stable=True).indices[0])  # lower id on an exact tie
        toks.append(tok)
        margins.append(float(top2.values[0] - top2.values[1]))
        if s + 1 < steps:
            logits = oracle.forward(st, [tok], all_logits=False)[-1]
    return toks, margins


def chunked(oracle, ids, chunks, decode_tail):
    st, outs, i = oracle.new_state(), [], 0
    for c in chunks:
        if i >= len(ids) - decode_tail:
            break
        c = min(c, len(ids) - decode_tail - i)
        outs.append(oracle.forward(st, ids[i : i + c]))
        i += c
    while i < len(ids):
        outs.append(oracle.forward(st, ids[i : i + 1]))
        i += 1
    return torch.cat(outs)


def per_position_nmse(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref) ** 2).sum(-1) / (ref**2).sum(-1)


def git_head():
    try:
        return subprocess.check_output(["git", "-C", REPO, "rev-parse", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def make(ckpt_dir: str, out_dir: str, tokenizer, name: str, salt: int, command: str, writer: dict) -> dict:
    ck = C.Checkpoint(ckpt_dir)
    a = ck.config
    tm, ncls, tm_info = load_token_map(ckpt_dir, tokenizer)
    V = a["vocab_size"]
    oracles = {
        (num, dt): M.V41Oracle(ck, tm, ncls, num, dt)
        for num in ("fp32", "official")
        for dt in (torch.float32, torch.float64)
    }
    tensors, prompts = {}, []
    drift = {"fp32": [], "official": []}
    t_all = time.time()
    for k, L in enumerate(PROMPT_LENGTHS):
        t0 = time.time()
        ids, seed = prompt_ids(k, L, V, salt)
        pos = pick_positions(L, a, seed, POSITIONS_PER_PROMPT)
        p = f"p{k}."
        tensors[p + "ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[p + "positions"] = torch.tensor(pos, dtype=torch.int32)
        entry = {"k": k, "length": L, "id_seed": seed, "positions": pos}
        for num in ("fp32", "official"):
            o32, o64 = oracles[(num, torch.float32)], oracles[(num, torch.float64)]
            l32 = one_shot(o32, ids)
            l64 = one_shot(o64, ids)
            c32 = chunked(o32, ids, CHUNKS, decode_tail=20)
            nm = per_position_nmse(l32, l64)
            nm_chunk = per_position_nmse(c32, l32)
            agree = (l32.argmax(-1) == l64.argmax(-1)).float().mean().item()
            # positions from the first one where either perturbation (fp64 one-shot, fp32 ragged
            # chunks + decode) moves the logits by NMSE > 1e-10 on: a discontinuity (top-k near
            # tie, FP8/FP4 code, bf16 rounding) has flipped there in at least one perturbed run
            bad = ((nm > 1e-10) | (nm_chunk > 1e-10)).nonzero().flatten().tolist()
            drift[num].append({
                "length": L, "nmse_max": float(nm.max()), "nmse_median": float(nm.median()), "top1_agreement": agree,
                "first_position_over_1e-10": next(iter((nm > 1e-10).nonzero().flatten().tolist()), None),
                "fp32_chunked_vs_one_shot_nmse_max": float(nm_chunk.max()),
                "first_unstable": bad[0] if bad else None,
                "nmse_max_before_first_unstable": float(nm[: bad[0]].max()) if bad and bad[0] > 0 else (float(nm.max()) if not bad else None),
            })
            tensors[p + f"first_unstable.{num}"] = torch.tensor([bad[0] if bad else L], dtype=torch.int32)
            entry[f"first_unstable.{num}"] = bad[0] if bad else None
            tensors[p + f"logits.{num}"] = l32[pos].float().contiguous()
            toks, margins = greedy(o32, ids, GREEDY_STEPS)
            if toks[0] != int(l32[-1].argmax()) and margins[0] > 1e-4:
                raise AssertionError("greedy's first token differs from one-shot argmax")
            tensors[p + f"greedy.{num}"] = torch.tensor(toks, dtype=torch.int32)
            tensors[p + f"margin.{num}"] = torch.tensor(margins, dtype=torch.float32)
            entry[f"greedy_min_margin.{num}"] = min(margins)
        entry["seconds"] = round(time.time() - t0, 1)
        prompts.append(entry)
        print(f"[{name}] prompt {k} len {L}: {entry}", flush=True)

    # chunked prefill + decode vs one-shot, on the 130-token prompt (and the 600 one in fp64)
    checks = []
    for L in (130, 600):
        k = PROMPT_LENGTHS.index(L)
        ids, _ = prompt_ids(k, L, V, salt)
        for num in ("fp32", "official"):
            for dt in (torch.float64, torch.float32):
                if L == 600 and dt == torch.float32:
                    continue
                o = oracles[(num, dt)]
                ref = one_shot(o, ids)
                got = chunked(o, ids, CHUNKS, decode_tail=20)
                nm = per_position_nmse(got, ref)
                checks.append({
                    "length": L, "numerics": num, "dtype": str(dt).replace("torch.", ""),
                    "chunks": CHUNKS, "decode_tail": 20,
                    "nmse_max": float(nm.max()), "max_abs_diff": float((got - ref).abs().max()),
                    "bit_identical": bool(torch.equal(got, ref)),
                    "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
                })
                print(f"[{name}] chunked check {checks[-1]}", flush=True)
    stats = {f"{n}/{str(d).replace('torch.', '')}": o.stats for (n, d), o in oracles.items()}

    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"), metadata={"name": name})
    missing = sorted(set(ck.names()) - ck.used - {n for n in ck.names() if n.startswith("mtp.")})
    manifest = {
        "what": "DeepSeek-V4.1 logits from the independent oracle reference/v41/model.py (CPU)",
        "name": name,
        "oracle": "independent re-implementation of spec §14 (official V4.1 code not obtainable byte-identical; see reference/v41/README.md)",
        "official_reference_pinned": {
            "revision": "dba1be0a40aa45a94ad051997016db3960a90277",
            "model.py_sha256": "4e9ae23620edc8028ccc5d5fef552ab7fdc7dcd6f79608754fe9f67644056f65",
            "engram.py_sha256": "11f35ecbead8150c35aa002b3d180ef290b05a25afe883a11884f94d476d3897",
            "kernel.py_sha256": "1236c3507019ed176f5dba5e04bcea58867cf654818c6cf138ed4845398c2455",
            "used": False,
        },
        "checkpoint": {"dir_fingerprint_sha256": ck.fingerprint(), **writer},
        "checkpoint_tensors_not_read": missing,
        "config": a,
        "token_map": tm_info,
        "numerics": {
            "fp32": "no bf16 rounding, no FP8/FP4 simulation; exact dequantized weights; compute in fp32",
            "official": "bf16 at the reference's storage points, FP8 act_quant block 32 before FP8/FP4 linears, window KV FP8 "
            "block 32 over all dims, compressed KV FP4 e2m1 with E4M3 scales per 16, indexer q/k FP4 block 32 (ue8m0), "
            "bf16 indexer scores, bf16 attention probabilities before P.V; compute in fp32",
            "tie_break": "every top-k (indexer, candidate blocks, MoE gate, greedy) takes the lower index on exactly equal values",
        },
        "tensors": __doc__.split("Per prompt k")[1].split("Self-checks")[0].strip(),
        "prompt_lengths": PROMPT_LENGTHS,
        "greedy_steps": GREEDY_STEPS,
        "fp32_vs_fp64": drift,
        "chunked_vs_one_shot": checks,
        "oracle_stats": stats,
        "prompts": prompts,
        "command": command,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__, "safetensors": __import__("safetensors").__version__, "tokenizers": __import__("tokenizers").__version__},
        "host": {"platform": platform.platform(), "torch_num_threads": torch.get_num_threads()},
        "dsinfer_git_head": git_head(),
        "generated_at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - t_all, 1),
    }
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", help="checkpoint directory (any writer)")
    ap.add_argument("--preset", help="write this write_tiny.py preset to a temp dir instead")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    command = "python " + " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])
    if args.preset:
        salt = sorted(write_tiny.PRESETS).index(args.preset)
        with tempfile.TemporaryDirectory(prefix="v41-golden-") as tmp:
            write_tiny.write(tmp, args.preset, args.seed, tokenizer=False)
            writer = {"writer": "reference/v41/write_tiny.py", "preset": args.preset, "seed": args.seed, "write_command": f"reference/v41/write_tiny.py DIR --preset {args.preset} --seed {args.seed} --no-tokenizer"}
            make(tmp, args.out, args.tokenizer, args.name or args.preset, salt, command, writer)
    elif args.ckpt:
        name = args.name or os.path.basename(os.path.normpath(args.ckpt))
        salt = sorted(write_tiny.PRESETS).index(name) if name in write_tiny.PRESETS else 0  # same prompts as --preset
        make(args.ckpt, args.out, args.tokenizer, name, salt, command, {"writer": "given directory"})
    else:
        ap.error("--ckpt or --preset")
    return 0


if __name__ == "__main__":
    sys.exit(main())
