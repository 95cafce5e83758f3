#!/usr/bin/env python3
"""Write random-weight tiny DeepSeek-V4.1 checkpoints in the official layout (reference/v41/LAYOUT.md):
HF config.json (nested text_config, `_ids` keys), inference/config.json (flat ModelArgs keys),
safetensors shards + model.safetensors.index.json, generation_config.json and (optionally) the
V4.1 tokenizer.json.

  FP8 linears     F8_E4M3 [out, in] + F8_E8M0 scale [ceil(out/32), ceil(in/32)]
  routed experts  I8 packed FP4 [out, in/2] (low nibble = even column) + F8_E8M0 [out, in/32]
  Engram tables   F8_E4M3 [rows, head_dim] + F8_E8M0 [rows, head_dim/32]; rows = sum of the primes
  others          BF16 (norms, embed, head, gate, compressor/indexer bf16 linears, engram q/k weights),
                  F32 (hc_*, attn_sink, gate.bias)

Usage: write_tiny.py OUT_DIR --preset tiny-v41-a [--seed 1] [--no-tokenizer]
       write_tiny.py --list
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
from engram import find_primes, v41_tokenizer_json  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V4_TOKENIZER = os.path.join(REPO, "tests/fixtures/tokenizer/deepseek-v4/tokenizer.json")
V41_OVERLAY = os.path.join(REPO, "tests/fixtures/v41/tokenizer_overlay.json")

_BASE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 32,
    "o_lora_rank": 32,
    "o_groups": 2,
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
    "rope_theta": 10000,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 65536},
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "sliding_window": 16,
    "compress_rope_theta": 160000,
    "index_n_heads": 2,
    "index_head_dim": 32,
    "index_topk": 16,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "engram_max_ngram_size": 4,
    "engram_n_heads": 2,
    "engram_head_dim": 32,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,  # the real tokenizer's map, over all its ids
    "num_nextn_predict_layers": 1,
    "dspark_block_size": 3,
    "dspark_noise_token_id": 128799 % 512,
    "dspark_markov_rank": 32,
    "dspark_n_routed_experts": 4,
    "dspark_num_experts_per_tok": 2,
}

PRESETS = {
    # the real model's shape in miniature: SWA, ratio-2 encoder group, ratio-1 decoder group whose
    # first layer is kv source + candidate source, a later index source consuming the candidates
    "tiny-v41-a": dict(
        num_hidden_layers=8,
        compress_ratios=[0, 0, 2, 2, 1, 1, 1, 1, 0],
        kv_source_layer_ids=[2, 4],
        index_source_layer_ids=[2, 4, 6],
        candidate_source_layer_id=4,
        candidate_topk_blocks=6,
        candidate_block_size=4,
        engram_layer_ids=[1, 3],
        engram_vocab_size=61,
        dspark_target_layer_ids=[5, 6, 7],
    ),
    # two ratio-2 kv sources, gate_temp != 1, a short window, 3-grams with 3 heads
    "tiny-v41-b": dict(
        num_hidden_layers=10,
        compress_ratios=[0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 0],
        kv_source_layer_ids=[2, 4, 6],
        index_source_layer_ids=[2, 4, 6, 8],
        candidate_source_layer_id=6,
        candidate_topk_blocks=4,
        candidate_block_size=8,
        index_topk=8,
        sliding_window=8,
        gate_temp=0.8,
        engram_layer_ids=[1, 5],
        engram_max_ngram_size=3,
        engram_n_heads=3,
        engram_vocab_size=40,
        dspark_target_layer_ids=[8, 9],
    ),
    # Engram on layer 0 (before the first block), ratio 2 from layer 1, 16 experts top-3, a YaRN
    # ramp that matters at short positions, two consumers of the candidates
    "tiny-v41-c": dict(
        num_hidden_layers=6,
        compress_ratios=[0, 2, 2, 1, 1, 1, 0],
        kv_source_layer_ids=[1, 3],
        index_source_layer_ids=[1, 3, 4, 5],
        candidate_source_layer_id=3,
        candidate_topk_blocks=8,
        candidate_block_size=4,
        index_topk=24,
        sliding_window=32,
        n_routed_experts=16,
        num_experts_per_tok=3,
        rope_scaling={"rope_type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 256},
        engram_layer_ids=[0, 2],
        engram_vocab_size=53,
        dspark_target_layer_ids=[3, 4, 5],
    ),
}


def text_config(preset: str) -> dict:
    t = dict(_BASE)
    t.update(PRESETS[preset])
    t["model_type"] = "deepseek_v41_text"
    primes = find_primes(t["engram_layer_ids"], t["engram_max_ngram_size"], t["engram_n_heads"], t["engram_vocab_size"])
    t["engram_num_embeddings"] = [sum(p for per_n in layer for p in per_n) for layer in primes]
    bs, kb = t["candidate_block_size"], t["candidate_topk_blocks"]
    # With fewer kept candidate positions than index_topk the reference's torch.topk would pick
    # arbitrary masked (-inf) rows; the presets stay clear of that (see docs/NUMERICS.md).
    assert (kb - 1) * bs + 1 >= t["index_topk"], preset
    return t


def hf_config(preset: str) -> dict:
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": [32, 32],
            "scale_fmt": "ue8m0",
            "expert_dtype": "fp4",
        },
        "text_config": text_config(preset),
    }


def inference_config(hf: dict) -> dict:
    a = C.parse_config(hf)
    keys = [
        "vocab_size", "dim", "moe_inter_dim", "n_layers", "n_mtp_layers", "dspark_block_size", "dspark_noise_token_id",
        "dspark_target_layer_ids", "dspark_markov_rank", "dspark_n_routed_experts", "dspark_n_activated_experts", "n_heads",
        "n_routed_experts", "n_shared_experts", "n_activated_experts", "score_func", "route_scale", "swiglu_limit",
        "q_lora_rank", "head_dim", "rope_head_dim", "norm_eps", "o_groups", "o_lora_rank", "window_size",
        "kv_source_layers", "index_source_layers", "original_seq_len", "rope_theta", "rope_factor", "beta_fast",
        "beta_slow", "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer", "candidate_topk_blocks",
        "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "engram_layer_ids", "engram_vocab_size",
        "engram_num_embeddings", "engram_max_ngram_size", "engram_pad_id", "engram_compressed_vocab_size",
        "compress_rope_theta", "compress_ratios", "engram_n_heads", "engram_head_dim",
    ]
    out = {k: a[k] for k in keys}
    if a.get("gate_temp", 1.0) != 1.0:
        out["gate_temp"] = a["gate_temp"]
    out["dtype"], out["expert_dtype"] = "fp8", "fp4"
    return out


class Writer:
    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.t = {}
        self.shard2 = set()

    def randn(self, *shape, std=1.0):
        return torch.randn(*shape, generator=self.g) * std

    def bf16(self, name, value):
        self.t[name] = value.to(torch.bfloat16)

    def f32(self, name, value):
        self.t[name] = value.to(torch.float32)

    def norm(self, name, n):
        self.bf16(name, 1.0 + self.randn(n, std=0.1))

    def fp8(self, prefix, out_f, in_f, std=None):
        w = self.randn(out_f, in_f, std=std if std is not None else in_f**-0.5)
        codes, scale = C.quantize_fp8_blocks(w, 32)
        self.t[prefix + ".weight"] = codes
        self.t[prefix + ".scale"] = scale.view(torch.float8_e8m0fnu)

    def fp4(self, prefix, out_f, in_f):
        packed, scale = C.quantize_fp4_packed(self.randn(out_f, in_f, std=in_f**-0.5), 32)
        self.t[prefix + ".weight"] = packed
        self.t[prefix + ".scale"] = scale.view(torch.float8_e8m0fnu)

    def block(self, p, t, layer, ratio, kv_src, ix_src, n_exp, stage0=False):
        D, hd, hc = t["hidden_size"], t["head_dim"], t["hc_mult"]
        H, q, G, o = t["num_attention_heads"], t["q_lora_rank"], t["o_groups"], t["o_lora_rank"]
        mix = (2 + hc) * hc
        self.f32(p + "attn.attn_sink", self.randn(H, std=0.5))
        self.fp8(p + "attn.wq_a", q, D)
        self.norm(p + "attn.q_norm.weight", q)
        self.fp8(p + "attn.wq_b", H * hd, q)
        self.fp8(p + "attn.wkv", hd, D)
        self.norm(p + "attn.kv_norm.weight", hd)
        self.fp8(p + "attn.wo_a", G * o, H * hd // G)
        self.fp8(p + "attn.wo_b", D, G * o)
        if kv_src:
            self.bf16(p + "attn.compressor.wkv.weight", self.randn(hd, D, std=D**-0.5))
            if ratio > 1:
                self.bf16(p + "attn.compressor.wgate.weight", self.randn(hd, D, std=2 * D**-0.5))
            self.norm(p + "attn.compressor.norm.weight", hd)
        if ix_src:
            Hi, Di = t["index_n_heads"], t["index_head_dim"]
            self.fp8(p + "attn.indexer.wq_b", Hi * Di, q)
            self.bf16(p + "attn.indexer.weights_proj.weight", self.randn(Hi, D, std=D**-0.5))
            if kv_src:
                self.bf16(p + "attn.indexer.wk.weight", self.randn(Di, hd, std=hd**-0.5))
                self.norm(p + "attn.indexer.k_norm.weight", Di)
        self.norm(p + "attn_norm.weight", D)
        self.norm(p + "ffn_norm.weight", D)
        for s in ("attn", "ffn"):
            self.f32(p + f"hc_{s}_fn", self.randn(mix, hc * D, std=0.02))
            self.f32(p + f"hc_{s}_base", self.randn(mix, std=0.3))
            self.f32(p + f"hc_{s}_scale", 0.5 + self.randn(3, std=0.1).abs())
        self.bf16(p + "ffn.gate.weight", self.randn(n_exp, D, std=D**-0.5))
        self.f32(p + "ffn.gate.bias", self.randn(n_exp, std=0.05))
        inter = t["moe_intermediate_size"]
        for e in range(n_exp):
            self.fp4(p + f"ffn.experts.{e}.w1", inter, D)
            self.fp4(p + f"ffn.experts.{e}.w3", inter, D)
            self.fp4(p + f"ffn.experts.{e}.w2", D, inter)
        self.fp8(p + "ffn.shared_experts.w1", inter, D)
        self.fp8(p + "ffn.shared_experts.w3", inter, D)
        self.fp8(p + "ffn.shared_experts.w2", D, inter)

    def model(self, t):
        D, V, hc = t["hidden_size"], t["vocab_size"], t["hc_mult"]
        self.bf16("embed.weight", self.randn(V, D))
        self.bf16("head.weight", self.randn(V, D, std=D**-0.5))
        self.norm("norm.weight", D)
        ratios = t["compress_ratios"]
        primes = find_primes(t["engram_layer_ids"], t["engram_max_ngram_size"], t["engram_n_heads"], t["engram_vocab_size"])
        for layer in range(t["num_hidden_layers"]):
            self.block(f"layers.{layer}.", t, layer, ratios[layer], layer in t["kv_source_layer_ids"], layer in t["index_source_layer_ids"], t["n_routed_experts"])
            if layer in t["engram_layer_ids"]:
                li = t["engram_layer_ids"].index(layer)
                rows = sum(p for per_n in primes[li] for p in per_n)
                ed = t["engram_head_dim"]
                cols = (t["engram_max_ngram_size"] - 1) * t["engram_n_heads"] * ed
                codes, scale = C.quantize_fp8_rows(self.randn(rows, ed), 32)
                p = f"layers.{layer}.engram."
                self.t[p + "embed.weight"] = codes
                self.t[p + "embed.scale"] = scale.view(torch.float8_e8m0fnu)
                self.shard2.update({p + "embed.weight", p + "embed.scale"})
                self.fp8(p + "wkv", D * (hc + 1), cols)
                self.bf16(p + "q_weight", 1.0 + self.randn(hc, D, std=0.2))
                self.bf16(p + "k_weight", 1.0 + self.randn(hc, D, std=0.2))
        # dSpark stages (mtp.*): window-only blocks with their own expert bank; never run by the oracle
        n_mtp, n_layers = t["num_nextn_predict_layers"], t["num_hidden_layers"]
        for s in range(n_mtp):
            p = f"mtp.{s}."
            self.block(p, t, n_layers + s, 0, False, False, t["dspark_n_routed_experts"])
            if s == 0:
                self.fp8(p + "main_proj", D, D * len(t["dspark_target_layer_ids"]))
                self.norm(p + "main_norm.weight", D)
            if s == n_mtp - 1:
                r = t["dspark_markov_rank"]
                self.norm(p + "norm.weight", D)
                self.bf16(p + "markov_head.embed.weight", self.randn(V, r))
                self.bf16(p + "markov_head.head.weight", self.randn(V, r, std=r**-0.5))
                self.bf16(p + "confidence_head.proj.weight", self.randn(1, D + r, std=(D + r) ** -0.5))

    def save(self, out: str):
        names = sorted(self.t)
        shard_of = {n: ("model-00002-of-00002.safetensors" if n in self.shard2 else "model-00001-of-00002.safetensors") for n in names}
        total = 0
        for fn in sorted(set(shard_of.values())):
            part = {n: self.t[n].contiguous() for n in names if shard_of[n] == fn}
            save_file(part, os.path.join(out, fn), metadata={"format": "pt"})
            total += sum(v.numel() * v.element_size() for v in part.values())
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": shard_of}, f, indent=1, sort_keys=True)
            f.write("\n")


def write(out: str, preset: str, seed: int, tokenizer: bool = True) -> dict:
    os.makedirs(os.path.join(out, "inference"), exist_ok=True)
    hf = hf_config(preset)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "inference", "config.json"), "w") as f:
        json.dump(inference_config(hf), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 1.0, "top_p": 1.0}, f, indent=2)
        f.write("\n")
    w = Writer(seed)
    w.model(hf["text_config"])
    w.save(out)
    if tokenizer:
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            f.write(v41_tokenizer_json(V4_TOKENIZER, V41_OVERLAY))
    return hf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--preset", default="tiny-v41-a")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-tokenizer", action="store_true", help="leave tokenizer.json out (make_goldens then builds it from the repo's V4 tokenizer + overlay)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list or not args.out:
        print("\n".join(PRESETS))
        return 0
    write(args.out, args.preset, args.seed, not args.no_tokenizer)
    print(f"wrote {args.preset} (seed {args.seed}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
