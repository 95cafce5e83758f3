#!/usr/bin/env python3
"""V4.1 dSpark draft-head goldens, computed by the independent oracle (model.py), on a checkpoint the
engine writes (`dsinfer create-demo-model DIR --preset P --seed 1 --tokenizer ... --tokenizer-overlay ...`).

Sequence: a seeded prompt of L ids in [3, vocab) without the noise token, then S + 1 greedy tokens of
the oracle's main model in fp32 numerics. The SAME tokens are teacher-forced in both numerics.
Draft point j = 0..S-1: the backbone holds n_j = L + j positions, the dSpark rings were fed main_x of
all of them (one seeding of the prompt, then one row per step), the pending token is tokens[n_j] at
position n_j; the draft is oracle.dspark_draft(state, tokens[n_j], n_j) at temperature 0 (this is the
official forward_spec(tokens[n_j], main_hidden of n_j - 1, start_pos = n_j - 1)).

Tensors (dspark.safetensors); m = fp32 | official:
  tokens              I32 [L+S+1]   prompt, then the fp32 greedy continuation
  prompt_len          I32 [1]       L
  block_size          I32 [1]       B
  {m}.main_hidden     F32 [L+S, n_targets*dim]  mean over hc copies of the stream entering each target layer
  {m}.main_x          F32 [L+S, dim]            main_norm(main_proj(main_hidden)), what the rings are fed
  {m}.draft_x         F32 [S, B, dim]           hc_pre output of the last stage (before the stage norm)
  {m}.draft_ids       I32 [S, B]                output_ids[1..B] (argmax of the biased logits, lower id on ties)
  {m}.confidence      F32 [S, B]
  {m}.draft_logits    F32 [S, B, vocab]         logits WITH the Markov bias (vocab <= 4096 only), else
  {m}.draft_top_ids   I32 [S, B, 16]            top-16 of the biased logits, descending (lower id on ties)
  {m}.draft_top_logits F32 [S, B, 16]
  {m}.draft_logsumexp F32 [S, B]
  {m}.unstable        I32 [S]   first fragile row of each draft point (B if none): top-2 margin of the
                                biased logits < 1e-4*|top1|, or the same numerics computed in fp64 moves
                                that row (logits NMSE > 1e-10 or another id: a rounding discontinuity
                                flipped), or 0 when the ring rows it reads (main_x) already moved in fp64.
                                Compare tightly before it, loosely from it on (row i+1's Markov bias
                                reads id i).
  {m}.perturb_nmse    F32 [S]   NMSE of each point's biased logits, fp32 vs fp64 compute of the same
                                numerics (how far a rounding flip moved it: a tolerance scale)
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
from make_goldens import git_head, load_token_map  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER = "tests/fixtures/tokenizer/deepseek-v4/tokenizer.json"
OVERLAY = "tests/fixtures/v41/tokenizer_overlay.json"
FULL_LOGITS_MAX_VOCAB = 4096
TOP = 16
MARGIN_REL = 1e-4
PERTURB_NMSE = 1e-10
SEED_TRIES = 8


def sizes(preset: str, vocab: int):
    """(L, S): prompt length and number of draft points."""
    return (60, 12) if vocab > FULL_LOGITS_MAX_VOCAB or preset.startswith("demo") else (20, 24)


def prompt(L: int, vocab: int, noise: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < L:
        t = int(torch.randint(3, vocab, (1,), generator=g))
        if t != noise:
            out.append(t)
    return out


def greedy_tokens(oracle, ids, steps):
    """Prefill `ids`, then `steps` one-token decodes; returns steps + 1 continuation tokens."""
    st = oracle.new_state()
    logits = oracle.forward(st, ids, all_logits=False)[-1]
    toks = [M.V41Oracle.sample(logits, 0)]
    for _ in range(steps):
        logits = oracle.forward(st, [toks[-1]], all_logits=False)[-1]
        toks.append(M.V41Oracle.sample(logits, 0))
    return toks


def run(oracle, tokens, L, S):
    """Teacher-forced main forward over tokens[:L+S] (prompt in one chunk, then one token per step,
    as a serving loop does), ring seeding in the same rhythm, one draft per point."""
    st = oracle.new_state()
    oracle.forward(st, tokens[:L], all_logits=False)
    oracle.dspark_seed(st, st.main_hidden[:L], 0)
    drafts = []
    for j in range(S):
        n = L + j
        if j:
            oracle.forward(st, [tokens[n - 1]], all_logits=False)
            oracle.dspark_seed(st, st.main_hidden[n - 1 : n], n - 1)
        drafts.append(oracle.dspark_draft(st, tokens[n], n))
    oracle.forward(st, [tokens[L + S - 1]], all_logits=False)
    oracle.dspark_seed(st, st.main_hidden[L + S - 1 :], L + S - 1)
    return st, drafts


def first_moved(ck, tm, ncls, numerics, tokens):
    """First position whose main_x differs (NMSE > PERTURB_NMSE) between fp32 and fp64 compute."""
    mx = []
    for dt in (torch.float32, torch.float64):
        o = M.V41Oracle(ck, tm, ncls, numerics, dt)
        st = o.new_state()
        o.forward(st, tokens, all_logits=False)
        mx.append(o.dspark_seed(st, st.main_hidden, 0).double())
    nm = ((mx[0] - mx[1]) ** 2).sum(-1) / (mx[1] ** 2).sum(-1)
    bad = (nm > PERTURB_NMSE).nonzero().flatten().tolist()
    return bad[0] if bad else None


def top_sorted(logits, k):
    """Descending top-k with the lower id first on exact ties."""
    order = torch.sort(-logits.double(), dim=-1, stable=True).indices[..., :k]
    return order, logits.gather(-1, order)


def unstable_rows(drafts, drafts64, ring_moved, B):
    """Per draft point, the first fragile row (B if none): a top-2 margin under MARGIN_REL*|top1|,
    or the fp64 run of the same numerics moves that row's logits by NMSE > PERTURB_NMSE (a rounding
    discontinuity -- bf16, FP8/FP4 code, top-k near tie -- flipped upstream; `ring_moved` says the
    ring rows the point reads already moved, so the whole point is fragile)."""
    out, margins = [], []
    for d, d64, moved in zip(drafts, drafts64, ring_moved):
        first = 0 if moved else B
        for i in range(B):
            v, _ = torch.topk(d["logits"][i].double(), 2)
            margin = float(v[0] - v[1])
            margins.append(margin)
            nm = C.nmse(d["logits"][i], d64["logits"][i])
            if first == B and (margin < MARGIN_REL * abs(float(v[0])) or nm > PERTURB_NMSE or int(d["ids"][i]) != int(d64["ids"][i])):
                first = i
        out.append(first)
    return out, min(margins)


def make(ckpt_dir, out_dir, preset, command, writer):
    ck = C.Checkpoint(ckpt_dir)
    a = ck.config
    if not a.get("dspark_block_size") or not a.get("n_mtp_layers"):
        raise SystemExit(f"{ckpt_dir}: no dSpark stages in this checkpoint")
    tm, ncls, tm_info = load_token_map(ckpt_dir, None)
    if tm_info["source"].startswith(ckpt_dir):  # a temp dir: name it by role
        tm_info["source"] = "CKPT" + tm_info["source"][len(ckpt_dir):]
    V, B, noise = a["vocab_size"], a["dspark_block_size"], a["dspark_noise_token_id"]
    L, S = sizes(preset, V)
    t_all = time.time()
    # The official numerics have rounding discontinuities (bf16, FP8 codes, top-k near ties) that a
    # tiny random model hits often; a flip early in the backbone moves every later position. Take
    # the first prompt seed whose sequence runs through in both numerics with fp32 and fp64 compute
    # giving the same main_x (no flip), so most draft points can be compared tightly.
    seed_tries = []
    for k in range(SEED_TRIES):
        id_seed = 4700 + 10 * sum(map(ord, preset)) + k
        ids = prompt(L, V, noise, id_seed)
        tokens = ids + greedy_tokens(M.V41Oracle(ck, tm, ncls, "fp32", torch.float32), ids, S)
        moved = {m: first_moved(ck, tm, ncls, m, tokens[: L + S]) for m in ("fp32", "official")}
        seed_tries.append({"seed": id_seed, "first_position_main_x_moved_in_fp64": moved})
        print(f"[{preset}] prompt seed {id_seed}: {moved}", flush=True)
        if all(v is None for v in moved.values()):
            break
    else:
        best = max(seed_tries, key=lambda t: min(v if v is not None else L + S for v in t["first_position_main_x_moved_in_fp64"].values()))
        id_seed = best["seed"]
        ids = prompt(L, V, noise, id_seed)
        tokens = ids + greedy_tokens(M.V41Oracle(ck, tm, ncls, "fp32", torch.float32), ids, S)
    assert len(tokens) == L + S + 1
    T = {
        "tokens": torch.tensor(tokens, dtype=torch.int32),
        "prompt_len": torch.tensor([L], dtype=torch.int32),
        "block_size": torch.tensor([B], dtype=torch.int32),
    }
    info = {}
    full = V <= FULL_LOGITS_MAX_VOCAB
    for m in ("fp32", "official"):
        t0 = time.time()
        o32 = M.V41Oracle(ck, tm, ncls, m, torch.float32)
        st, dr = run(o32, tokens, L, S)
        o64 = M.V41Oracle(ck, tm, ncls, m, torch.float64)
        st64, dr64 = run(o64, tokens, L, S)
        T[f"{m}.main_hidden"] = st.main_hidden.float().contiguous()
        T[f"{m}.main_x"] = st.dspark_main_x.float().contiguous()
        T[f"{m}.draft_x"] = torch.stack([d["x"] for d in dr]).float().contiguous()
        T[f"{m}.draft_ids"] = torch.stack([d["ids"] for d in dr]).to(torch.int32)
        T[f"{m}.confidence"] = torch.stack([d["confidence"] for d in dr]).float().contiguous()
        lg = torch.stack([d["logits"] for d in dr]).float()
        if full:
            T[f"{m}.draft_logits"] = lg.contiguous()
        else:
            ti, tv = top_sorted(lg, TOP)
            T[f"{m}.draft_top_ids"] = ti.to(torch.int32).contiguous()
            T[f"{m}.draft_top_logits"] = tv.float().contiguous()
            T[f"{m}.draft_logsumexp"] = torch.logsumexp(lg.double(), -1).float().contiguous()
        mx_nm = ((st.dspark_main_x.double() - st64.dspark_main_x) ** 2).sum(-1) / (st64.dspark_main_x**2).sum(-1)
        moved = (mx_nm > PERTURB_NMSE).tolist()
        W = a["window_size"]
        ring_moved = [any(moved[max(0, L + j - W) : L + j]) for j in range(S)]
        unst, min_margin = unstable_rows(dr, dr64, ring_moved, B)
        T[f"{m}.unstable"] = torch.tensor(unst, dtype=torch.int32)
        T[f"{m}.perturb_nmse"] = torch.tensor([C.nmse(d["logits"], d64["logits"]) for d, d64 in zip(dr, dr64)], dtype=torch.float32)
        lg64 = torch.stack([d["logits"] for d in dr64])
        info[m] = {
            "unstable_points": {j: u for j, u in enumerate(unst) if u < B},
            "stable_points": sum(u == B for u in unst),
            "first_position_main_x_moved_in_fp64": next((i for i, v in enumerate(moved) if v), None),
            "min_top2_margin": min_margin,
            "fp32_vs_fp64": {
                "main_x_max_abs": float((st.dspark_main_x.double() - st64.dspark_main_x).abs().max()),
                "draft_logits_nmse": C.nmse(lg, lg64),
                "draft_logits_nmse_stable_rows": max(
                    [C.nmse(dr[j]["logits"][:u], dr64[j]["logits"][:u]) for j, u in enumerate(unst) if u > 0] or [0.0]),
                "draft_logits_max_abs": float((lg.double() - lg64).abs().max()),
                "confidence_max_abs": float((T[f"{m}.confidence"].double() - torch.stack([d["confidence"] for d in dr64])).abs().max()),
                "draft_ids_equal": bool(torch.equal(T[f"{m}.draft_ids"].long(), torch.stack([d["ids"] for d in dr64]))),
            },
            "draft_ids_equal_to_next_tokens_rate": float(
                np.mean([int(dr[j]["ids"][0]) == tokens[L + j + 1] for j in range(S)])
            ),
            "seconds": round(time.time() - t0, 1),
        }
        print(f"[{preset}] {m}: {info[m]}", flush=True)
    ag = (T["fp32.draft_ids"] == T["official.draft_ids"]).float().mean().item()

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "dspark.safetensors")
    save_file(T, path, metadata={"preset": preset})
    tensors_sha256 = C.sha256_file(path)
    manifest = {
        "what": "DeepSeek-V4.1 dSpark draft head (mtp.* stages) from the independent oracle reference/v41/model.py (CPU)",
        "preset": preset,
        "oracle": "independent re-implementation; dSpark semantics read (not copied) from the vendored official "
        "inference/model.py at HF revision dba1be0a40aa45a94ad051997016db3960a90277 (DSparkAttention, DSparkBlock, "
        "DSparkMarkovHead, DSparkConfidenceHead, Transformer.forward / forward_spec)",
        "checkpoint": {"sha256": ck.fingerprint(), **writer},
        "config": a,
        "token_map": tm_info,
        "L": L, "S": S, "B": B, "n_stages": a["n_mtp_layers"], "window_size": a["window_size"],
        "dspark_target_layer_ids": a["dspark_target_layer_ids"], "noise_token_id": noise,
        "prompt_id_seed": id_seed,
        "prompt_seed_tries": seed_tries,
        "continuation": "greedy of the oracle's main model in fp32 numerics (prefill, then one token per step); teacher-forced in both numerics",
        "draft_point_j": "backbone holds n_j = L + j positions, rings fed main_x of positions 0..n_j-1, pending token tokens[n_j] at "
        "position n_j, block rows at positions n_j..n_j+B-1; = official forward_spec(tokens[n_j], main_hidden[n_j-1], start_pos=n_j-1)",
        "temperature": 0,
        "numerics": {
            "fp32": "no bf16 rounding, no FP8/FP4 simulation; exact dequantized weights; compute in fp32",
            "official": "as the backbone's official mode (see golden manifests) plus: main_hidden bf16, main_proj FP8 act_quant, "
            "ring and block KV FP8 round trip over all dims (block 32), hc_pre output bf16, head / Markov head / "
            "confidence in fp32 on bf16 inputs",
            "tie_break": "argmax and top-k take the lower id on exactly equal values",
        },
        "tensors": __doc__.split("Tensors (dspark.safetensors); m = fp32 | official:")[1].strip(),
        "logits_stored": "full" if full else f"top-{TOP} + logsumexp (vocab {V} > {FULL_LOGITS_MAX_VOCAB})",
        "unstable_rule": f"first row with top-2 margin < {MARGIN_REL} * |top1| of the biased logits, or whose argmax differs "
        "from the same numerics in fp64 compute; B if none",
        "per_numerics": info,
        "fp32_vs_official_draft_id_agreement": ag,
        "command": command,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "safetensors": __import__("safetensors").__version__, "tokenizers": __import__("tokenizers").__version__},
        "host": {"platform": platform.platform(), "torch_num_threads": torch.get_num_threads()},
        "dsinfer_git_head": git_head(),
        "generated_at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - t_all, 1),
        "tensors_sha256": tensors_sha256,
    }
    # a hand-recorded cross-check with the official code (see the manifests) stays valid while the
    # checkpoint and the tensors are the same: carry it over, else drop it
    old_path = os.path.join(out_dir, "manifest.json")
    if os.path.exists(old_path):
        with open(old_path) as f:
            old = json.load(f)
        if "official_code_crosscheck" in old and old.get("checkpoint", {}).get("sha256") == manifest["checkpoint"]["sha256"] \
                and old.get("tensors_sha256") == manifest["tensors_sha256"]:
            manifest["official_code_crosscheck"] = old["official_code_crosscheck"]
    with open(old_path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"[{preset}] wrote {path} ({os.path.getsize(path)} bytes)", flush=True)
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsinfer", help="the built dsinfer binary (writes the checkpoint into a temp dir)")
    ap.add_argument("--ckpt", help="use this checkpoint directory instead (written by the same command)")
    ap.add_argument("--preset", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    command = "python " + " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])
    write = [f"create-demo-model", "DIR", "--preset", args.preset, "--seed", str(args.seed), "--tokenizer", TOKENIZER,
             "--tokenizer-overlay", OVERLAY]
    writer = {"writer": "dsinfer " + " ".join(write)}
    if args.ckpt:
        make(args.ckpt, args.out, args.preset, command, dict(writer, given_directory=True))
    elif args.dsinfer:
        with tempfile.TemporaryDirectory(prefix="v41-dspark-") as tmp:
            d = os.path.join(tmp, "ckpt")
            cmd = [args.dsinfer] + [d if w == "DIR" else (os.path.join(REPO, w) if w in (TOKENIZER, OVERLAY) else w) for w in write]
            subprocess.run(cmd, check=True)
            make(d, args.out, args.preset, command, writer)
    else:
        ap.error("--dsinfer or --ckpt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
