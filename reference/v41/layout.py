"""The official DeepSeek-V4.1 checkpoint layout as a function of the config (LAYOUT.md in code).

expected_tensors(a) -> {name: (dtype, shape)} for the text model + dSpark stages (vision excluded;
see VISION_TENSORS_REAL). `python layout.py` checks it against the public census totals of the
released checkpoint (tensor count per class and bytes), which is how LAYOUT.md was verified.
"""

import json
import sys

DT_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1}


def _ceil32(n):
    return -(-n // 32)


def fp8(t, name, out_f, in_f):
    t[name + ".weight"] = ("F8_E4M3", [out_f, in_f])
    t[name + ".scale"] = ("F8_E8M0", [_ceil32(out_f), _ceil32(in_f)])


def fp4(t, name, out_f, in_f):
    t[name + ".weight"] = ("I8", [out_f, in_f // 2])
    t[name + ".scale"] = ("F8_E8M0", [out_f, in_f // 32])


def block(t, p, a, ratio, kv_src, ix_src, n_exp, vision):
    D, hd, hc = a["dim"], a["head_dim"], a["hc_mult"]
    H, q, G, o, inter = a["n_heads"], a["q_lora_rank"], a["o_groups"], a["o_lora_rank"], a["moe_inter_dim"]
    mix = (2 + hc) * hc
    t[p + "attn.attn_sink"] = ("F32", [H])
    fp8(t, p + "attn.wq_a", q, D)
    t[p + "attn.q_norm.weight"] = ("BF16", [q])
    fp8(t, p + "attn.wq_b", H * hd, q)
    fp8(t, p + "attn.wkv", hd, D)
    t[p + "attn.kv_norm.weight"] = ("BF16", [hd])
    fp8(t, p + "attn.wo_a", G * o, H * hd // G)
    fp8(t, p + "attn.wo_b", D, G * o)
    if kv_src:
        t[p + "attn.compressor.wkv.weight"] = ("BF16", [hd, D])
        if ratio > 1:
            t[p + "attn.compressor.wgate.weight"] = ("BF16", [hd, D])
        t[p + "attn.compressor.norm.weight"] = ("BF16", [hd])
    if ix_src:
        Hi, Di = a["index_n_heads"], a["index_head_dim"]
        fp8(t, p + "attn.indexer.wq_b", Hi * Di, q)
        t[p + "attn.indexer.weights_proj.weight"] = ("BF16", [Hi, D])
        if kv_src:
            t[p + "attn.indexer.wk.weight"] = ("BF16", [Di, hd])
            t[p + "attn.indexer.k_norm.weight"] = ("BF16", [Di])
    t[p + "attn_norm.weight"] = ("BF16", [D])
    t[p + "ffn_norm.weight"] = ("BF16", [D])
    for s in ("attn", "ffn"):
        t[p + f"hc_{s}_fn"] = ("F32", [mix, hc * D])
        t[p + f"hc_{s}_base"] = ("F32", [mix])
        t[p + f"hc_{s}_scale"] = ("F32", [3])
    t[p + "ffn.gate.weight"] = ("BF16", [n_exp, D])
    t[p + "ffn.gate.bias"] = ("F32", [n_exp])
    if vision:
        t[p + "ffn.gate.bias_vl"] = ("F32", [n_exp])
    for e in range(n_exp):
        fp4(t, p + f"ffn.experts.{e}.w1", inter, D)
        fp4(t, p + f"ffn.experts.{e}.w3", inter, D)
        fp4(t, p + f"ffn.experts.{e}.w2", D, inter)
    fp8(t, p + "ffn.shared_experts.w1", inter, D)
    fp8(t, p + "ffn.shared_experts.w3", inter, D)
    fp8(t, p + "ffn.shared_experts.w2", D, inter)


def expected_tensors(a: dict, vision: bool = False) -> dict:
    """a: parse_config() output. vision: the checkpoint has a vision tower (adds gate.bias_vl
    everywhere and image_start/end/newline; the vision.*/aligner.* tensors are not listed)."""
    t = {}
    D, V, hc = a["dim"], a["vocab_size"], a["hc_mult"]
    t["embed.weight"] = ("BF16", [V, D])
    t["head.weight"] = ("BF16", [V, D])
    t["norm.weight"] = ("BF16", [D])
    if vision:
        for n in ("image_start", "image_end", "image_newline"):
            t[n] = ("BF16", [D])
    ratios = a["compress_ratios"]
    eids = list(a.get("engram_layer_ids") or [])
    for layer in range(a["n_layers"]):
        block(t, f"layers.{layer}.", a, ratios[layer], layer in a["kv_source_layers"], layer in a["index_source_layers"], a["n_routed_experts"], vision)
        if layer in eids:
            rows = a["engram_num_embeddings"][eids.index(layer)]
            ed = a["engram_head_dim"]
            cols = (a["engram_max_ngram_size"] - 1) * a["engram_n_heads"] * ed
            p = f"layers.{layer}.engram."
            t[p + "embed.weight"] = ("F8_E4M3", [rows, ed])
            t[p + "embed.scale"] = ("F8_E8M0", [rows, ed // 32])
            fp8(t, p + "wkv", D * (hc + 1), cols)
            t[p + "q_weight"] = ("BF16", [hc, D])
            t[p + "k_weight"] = ("BF16", [hc, D])
    n_mtp = a.get("n_mtp_layers", 0) if a.get("dspark_block_size", 0) else 0
    for s in range(n_mtp):
        p = f"mtp.{s}."
        block(t, p, a, 0, False, False, a.get("dspark_n_routed_experts") or a["n_routed_experts"], vision)
        if s == 0:
            fp8(t, p + "main_proj", D, D * len(a["dspark_target_layer_ids"]))
            t[p + "main_norm.weight"] = ("BF16", [D])
        if s == n_mtp - 1:
            r = a["dspark_markov_rank"]
            t[p + "norm.weight"] = ("BF16", [D])
            t[p + "markov_head.embed.weight"] = ("BF16", [V, r])
            t[p + "markov_head.head.weight"] = ("BF16", [V, r])
            t[p + "confidence_head.proj.weight"] = ("BF16", [1, D + r])
    return t


# Public census of the released checkpoint (revision dba1be0a..., 96,085 tensors): tensor count and
# encoded bytes per class (third-party audit, see LAYOUT.md "Sources").
CENSUS_REAL = {
    "attention": (563, 5151556608),
    "backbone_or_other": (324, 158155200),
    "draft_mtp": (2401, 7932874632),
    "embedding_or_head": (2, 2647654400),
    "engram": (12, 203073076240),
    "routed_expert": (92160, 288777830400),
    "router": (120, 157409280),
    "shared_expert": (240, 1416960000),
    "vision": (263, 970506240),
}
VISION_TENSORS_REAL = 263

# The released text config (HF config.json text_config, verbatim values from third-party copies).
REAL_TEXT_CONFIG = {
    "model_type": "deepseek_v41_text", "vocab_size": 129280, "hidden_size": 5120, "moe_intermediate_size": 2304,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8, "hidden_act": "silu", "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20, "tie_word_embeddings": False, "max_position_embeddings": 1048576, "rope_theta": 10000,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 65536},
    "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6, "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5, "sliding_window": 128,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0], "compress_rope_theta": 160000,
    "kv_source_layer_ids": [2, 8, 14, 20], "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048, "candidate_block_size": 8, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
    "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682], "engram_max_ngram_size": 4,
    "engram_vocab_size": 16000000, "engram_n_heads": 8, "engram_head_dim": 256, "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092, "num_nextn_predict_layers": 3, "dspark_block_size": 5,
    "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128, "dspark_num_experts_per_tok": 3,
}


def classify(name: str) -> str:
    if name.startswith("mtp."):
        return "draft_mtp"
    if name in ("embed.weight", "head.weight"):
        return "embedding_or_head"
    if ".engram." in name:
        return "engram"
    if ".ffn.experts." in name:
        return "routed_expert"
    if ".ffn.shared_experts." in name:
        return "shared_expert"
    if ".ffn.gate." in name:
        return "router"
    if ".attn." in name:
        return "attention"
    return "backbone_or_other"


def check_real() -> dict:
    try:
        from .common import parse_config
    except ImportError:
        from common import parse_config
    a = parse_config({"text_config": REAL_TEXT_CONFIG})
    t = expected_tensors(a, vision=True)
    got = {}
    for name, (dt, shape) in t.items():
        n = 1
        for s in shape:
            n *= s
        c, b = got.get(classify(name), (0, 0))
        got[classify(name)] = (c + 1, b + n * DT_BYTES[dt])
    for cls, (count, nbytes) in CENSUS_REAL.items():
        if cls == "vision":
            continue
        assert got.get(cls) == (count, nbytes), (cls, got.get(cls), (count, nbytes))
    total = sum(c for c, _ in got.values()) + VISION_TENSORS_REAL
    assert total == 96085, total
    return {k: list(v) for k, v in sorted(got.items())}


if __name__ == "__main__":
    print(json.dumps(check_real()))
    print("layout matches the public census of the released checkpoint (count and bytes per class)", file=sys.stderr)
