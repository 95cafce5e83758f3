#!/usr/bin/env python3
"""Independent fp32 CPU oracle: an official-layout DeepSeek-V4 checkpoint -> HF DeepseekV4ForCausalLM.

Approach B of docs (shared/reference/transformers-oracle.md §7): the renaming and the exact
dequantization (FP8 e4m3 x e8m0 128x128 blocks, packed FP4 e2m1 x e8m0 per 32) are done here,
independently of transformers' loader/quantizer, and the result is loaded with
`load_state_dict(strict=True)` so any naming drift in transformers fails loudly.

The MTP block (spec §8) has no transformers module; `MtpOracle` assembles it from transformers
components (a DeepseekV4DecoderLayer configured as a sliding-window, score-routed layer, a
DeepseekV4HyperHead, DeepseekV4RMSNorms and nn.Linears) loaded with the `mtp.0.*` tensors.

CLI:
  hf_oracle.py probe                  # print the version probe (asserts the features we rely on)
  hf_oracle.py check CHECKPOINT_DIR   # load strictly + incremental-vs-one-shot self-check
"""

import argparse
import copy
import inspect
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

PINNED = {"torch": "2.15.0", "transformers": "5.23.0", "safetensors": "0.8.0"}

# ---------------------------------------------------------------------------------------------
# Version probe
# ---------------------------------------------------------------------------------------------


def probe(strict_versions: bool = True) -> dict:
    """Checks the installed transformers has the DeepseekV4 behaviour the goldens rely on.

    Everything asserted here is a numerics difference between transformers releases (oracle
    doc §0); a mismatch means goldens made with this install would not be comparable.
    """
    import safetensors
    import transformers
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    versions = {
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "python": sys.version.split()[0],
    }
    if strict_versions:
        for name, want in PINNED.items():
            assert versions[name] == want, f"{name} {versions[name]} installed, goldens pin {want}"

    mlp_src = inspect.getsource(m.DeepseekV4MLP.forward)
    experts_src = inspect.getsource(m.DeepseekV4Experts._apply_gate)
    router_src = inspect.getsource(m.DeepseekV4TopKRouter.forward)
    hash_src = inspect.getsource(m.DeepseekV4HashRouter.forward)
    hc_src = inspect.getsource(m.DeepseekV4HyperConnection.forward)
    attn_src = inspect.getsource(m.eager_attention_forward)
    layer_src = inspect.getsource(m.DeepseekV4DecoderLayer.forward)
    pats = [p for t in get_checkpoint_conversion_mapping("deepseek_v4") for p in t.source_patterns]
    features = {
        "modeling_file": os.path.relpath(m.__file__, os.path.dirname(transformers.__file__)),
        # Official current revision clamps the shared expert too (spec §6, §13).
        "shared_expert_swiglu_clamp": "clamp(max=self.limit)" in mlp_src and "min=-self.limit" in mlp_src,
        "routed_expert_swiglu_clamp": "clamp(max=self.limit)" in experts_src and "min=-self.limit" in experts_src,
        "indexer_scorer_submodule": hasattr(m, "DeepseekV4IndexerScorer"),
        "conversion_mapping_has_scorer_rename": any("indexer\\.weights_proj" in p for p in pats),
        "mtp_keys_ignored_on_load": list(m.DeepseekV4PreTrainedModel._keys_to_ignore_on_load_unexpected),
        "has_mtp_module": any("NextN" in n or "Mtp" in n or "MTP" in n for n in dir(m)),
        "attention_sink_in_denominator": "sinks" in attn_src and "probs[..., :-1]" in attn_src,
        "topk_router_bias_selection_only": "scores + self.e_score_correction_bias" in router_src
        and "scores.gather" in router_src,
        "router_renormalises_with_1e-20": "1e-20" in router_src and "1e-20" in hash_src,
        "hash_router_uses_tid2eid": "tid2eid[input_ids" in hash_src,
        "sinkhorn_col_first_then_row_col": hc_src.find("dim=-2") < hc_src.find("for _ in range"),
        "hc_comb_applied_transposed": "transpose(-1, -2)" in layer_src,
        "route_weight_applied_after_down_proj": "F.linear(current, self.down_proj[expert_idx]) * top_k_weights"
        in inspect.getsource(m.DeepseekV4Experts.forward),
        "eager_only": not (m.DeepseekV4PreTrainedModel._supports_sdpa or m.DeepseekV4PreTrainedModel._supports_flash_attn),
        "activation_or_kv_fake_quant_in_forward": any(
            w in inspect.getsource(m) for w in ("act_quant", "float8_e4m3fn", "hadamard", "fp4_act_quant")
        ),
    }
    assert features["shared_expert_swiglu_clamp"], "this transformers lacks the shared-expert clamp (early 5.8.x?)"
    assert features["routed_expert_swiglu_clamp"]
    assert features["indexer_scorer_submodule"], "older indexer naming: the renaming below needs '.scorer' dropped"
    assert features["attention_sink_in_denominator"]
    assert features["topk_router_bias_selection_only"]
    assert features["hash_router_uses_tid2eid"]
    assert features["sinkhorn_col_first_then_row_col"]
    assert features["hc_comb_applied_transposed"]
    assert not features["has_mtp_module"], "transformers gained an MTP module: compare it with MtpOracle"
    assert not features["activation_or_kv_fake_quant_in_forward"]
    return {"versions": versions, "features": features}


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

_LAYER_TYPE_OF_RATIO = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def read_official_config(ckpt_dir: str) -> dict:
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        return json.load(f)


def hf_config(official: dict):
    """Builds DeepseekV4Config from the official config.json fields explicitly (not via the
    legacy-key mapping in its __post_init__, which `probe_config_parse` cross-checks)."""
    from transformers import DeepseekV4Config

    n_layers = official["num_hidden_layers"]
    ratios = official["compress_ratios"]
    assert len(ratios) == n_layers + official.get("num_nextn_predict_layers", 0), ratios
    csa = sorted({r for r in ratios[:n_layers] if r not in (0, 128)})
    assert csa in ([], [4]), f"transformers supports CSA ratio 4 and HCA ratio 128 only: {ratios}"
    rd = official["qk_rope_head_dim"]
    hd = official["head_dim"]
    rs = official["rope_scaling"]
    assert rs["type"] == "yarn"
    # transformers' yarn uses `factor` as given; the official reference too. Keep the pair
    # consistent so its validator does not warn and nobody wonders which one is used.
    assert official["max_position_embeddings"] == rs["factor"] * rs["original_max_position_embeddings"]
    cfg = DeepseekV4Config(
        vocab_size=official["vocab_size"],
        hidden_size=official["hidden_size"],
        moe_intermediate_size=official["moe_intermediate_size"],
        num_hidden_layers=n_layers,
        num_attention_heads=official["num_attention_heads"],
        num_key_value_heads=1,
        head_dim=hd,
        partial_rotary_factor=rd / hd,
        q_lora_rank=official["q_lora_rank"],
        o_groups=official["o_groups"],
        o_lora_rank=official["o_lora_rank"],
        n_routed_experts=official["n_routed_experts"],
        num_experts_per_tok=official["num_experts_per_tok"],
        n_shared_experts=official["n_shared_experts"],
        scoring_func=official["scoring_func"],
        norm_topk_prob=True,
        routed_scaling_factor=official["routed_scaling_factor"],
        swiglu_limit=official["swiglu_limit"],
        layer_types=[_LAYER_TYPE_OF_RATIO[r] for r in ratios[:n_layers]],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        mlp_layer_types=["hash_moe" if i < official["num_hash_layers"] else "moe" for i in range(n_layers)],
        sliding_window=official["sliding_window"],
        index_n_heads=official["index_n_heads"],
        index_head_dim=official["index_head_dim"],
        index_topk=official["index_topk"],
        hc_mult=official["hc_mult"],
        hc_sinkhorn_iters=official["hc_sinkhorn_iters"],
        hc_eps=official["hc_eps"],
        rms_norm_eps=official["rms_norm_eps"],
        rope_theta=official["rope_theta"],
        compress_rope_theta=official["compress_rope_theta"],
        max_position_embeddings=official["max_position_embeddings"],
        rope_parameters={
            "main": {"rope_type": "default", "rope_theta": float(official["rope_theta"]), "partial_rotary_factor": rd / hd},
            "compress": {
                "rope_type": "yarn",
                "rope_theta": float(official["compress_rope_theta"]),
                "partial_rotary_factor": rd / hd,
                "factor": float(rs["factor"]),
                "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
                "beta_fast": float(rs["beta_fast"]),
                "beta_slow": float(rs["beta_slow"]),
                "attention_factor": 1.0,
            },
        },
        num_nextn_predict_layers=official.get("num_nextn_predict_layers", 0),
        bos_token_id=official["bos_token_id"],
        eos_token_id=official["eos_token_id"],
        tie_word_embeddings=False,
        attention_bias=False,
        attn_implementation="eager",
    )
    return cfg


def spec_rope_inv_freq(base: float, rd: int, yarn: dict | None) -> torch.Tensor:
    """Spec §9 frequencies (float64 math, fp32 result), for cross-checking transformers' tables."""
    i = torch.arange(rd // 2, dtype=torch.float64)
    f = 1.0 / (base ** (2 * i / rd))
    if yarn is None:
        return f.float()

    def corr(n_rot):
        return rd * math.log(yarn["original_max_position_embeddings"] / (2 * math.pi * n_rot)) / (2 * math.log(base))

    low = max(math.floor(corr(yarn["beta_fast"])), 0)
    high = min(math.ceil(corr(yarn["beta_slow"])), rd - 1)
    ramp = ((i - low) / max(high - low, 1e-3)).clamp(0, 1)
    return (f / yarn["factor"] * ramp + f * (1 - ramp)).float()


def probe_config_parse(ckpt_dir: str, cfg) -> dict:
    """transformers' own parse of config.json must agree with our explicit mapping, and its
    RoPE tables must agree with the spec formula."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    auto = AutoConfig.from_pretrained(ckpt_dir)
    for field in ("layer_types", "mlp_layer_types", "compress_rates", "sliding_window", "head_dim", "index_topk"):
        assert getattr(auto, field) == getattr(cfg, field), (field, getattr(auto, field), getattr(cfg, field))
    assert abs(auto.partial_rotary_factor - cfg.partial_rotary_factor) < 1e-12
    official = read_official_config(ckpt_dir)
    rd = official["qk_rope_head_dim"]
    rot = DeepseekV4RotaryEmbedding(cfg)
    main_diff = (rot.main_inv_freq - spec_rope_inv_freq(official["rope_theta"], rd, None)).abs().max().item()
    comp_diff = (
        rot.compress_inv_freq - spec_rope_inv_freq(official["compress_rope_theta"], rd, official["rope_scaling"])
    ).abs().max().item()
    assert main_diff < 1e-7 and comp_diff < 1e-7, (main_diff, comp_diff)
    assert rot.main_attention_scaling == 1.0 and rot.compress_attention_scaling == 1.0
    return {
        "autoconfig_agrees": True,
        "rope_main_inv_freq_max_abs_diff_vs_spec": main_diff,
        "rope_compress_inv_freq_max_abs_diff_vs_spec": comp_diff,
        "rope_attention_scaling": 1.0,
    }


# ---------------------------------------------------------------------------------------------
# Checkpoint reading and exact dequantization
# ---------------------------------------------------------------------------------------------


def read_checkpoint(ckpt_dir: str) -> dict:
    from safetensors.torch import load_file

    with open(os.path.join(ckpt_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    raw = {}
    for shard in sorted(set(weight_map.values())):
        for k, v in load_file(os.path.join(ckpt_dir, shard)).items():
            assert weight_map.get(k) == shard, f"{k} in {shard} but the index says {weight_map.get(k)}"
            raw[k] = v
    missing = set(weight_map) - set(raw)
    assert not missing, f"index lists tensors absent from the shards: {sorted(missing)[:5]}"
    return raw


def e8m0_to_f32(s: torch.Tensor) -> torch.Tensor:
    """2^(code-127) from the raw bytes (independent of torch's float8_e8m0fnu decode)."""
    codes = s.view(torch.uint8).to(torch.int32)
    assert int(codes.max()) != 255, "e8m0 NaN scale in checkpoint"
    return torch.ldexp(torch.ones_like(codes, dtype=torch.float64), codes - 127).float()


_E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def dequant_fp8_block(w: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    rows, cols = w.shape
    assert s.shape == (math.ceil(rows / block), math.ceil(cols / block)), (w.shape, s.shape)
    scale = e8m0_to_f32(s).repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    return w.float() * scale  # e4m3 x 2^k is exact in fp32


def dequant_fp4_packed(w: torch.Tensor, s: torch.Tensor, block: int = 32) -> torch.Tensor:
    rows, half = w.shape
    cols = 2 * half
    assert s.shape == (rows, cols // block), (w.shape, s.shape)
    b = w.view(torch.uint8).to(torch.int64)
    vals = torch.stack([_E2M1[b & 15], _E2M1[b >> 4]], dim=-1).reshape(rows, cols)  # low nibble = even element
    return vals * e8m0_to_f32(s).repeat_interleave(block, 1)


def dequantize(raw: dict) -> dict:
    """Official tensors -> fp32 (or int64 for tid2eid), `.scale` companions folded in."""
    out = {}
    for k, v in raw.items():
        if k.endswith(".scale"):
            assert k[: -len(".scale")] + ".weight" in raw, f"orphan scale {k}"
            continue
        scale_key = k[: -len(".weight")] + ".scale" if k.endswith(".weight") else None
        if v.dtype == torch.float8_e4m3fn:
            out[k] = dequant_fp8_block(v, raw[scale_key])
        elif v.dtype == torch.int8 and ".experts." in k:
            out[k] = dequant_fp4_packed(v, raw[scale_key])
        elif k.endswith("tid2eid"):
            assert v.dtype in (torch.int32, torch.int64)
            out[k] = v.to(torch.int64)
        else:
            assert v.dtype in (torch.bfloat16, torch.float32), (k, v.dtype)
            assert scale_key is None or scale_key not in raw, f"unexpected scale for {k}"
            out[k] = v.float()
    return out


# ---------------------------------------------------------------------------------------------
# Official -> transformers names (our own table; strict loading verifies it)
# ---------------------------------------------------------------------------------------------

_TOP_LEVEL = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}

# Layer-relative official name -> layer-relative transformers name (everything except experts).
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
for _which in ("attn", "ffn"):
    for _part in ("fn", "base", "scale"):
        _LAYER[f"hc_{_which}_{_part}"] = f"{_which}_hc.{_part}"


def layer_state_dict(deq: dict, prefix: str, n_experts: int, consumed: set) -> dict:
    """HF layer-relative state dict of the official layer `prefix` ("layers.3." or "mtp.0.")."""
    sd = {}
    for off, hf in _LAYER.items():
        if prefix + off in deq:
            sd[hf] = deq[prefix + off]
            consumed.add(prefix + off)
    w = {}
    for e in range(n_experts):
        for name in ("w1", "w2", "w3"):
            key = f"{prefix}ffn.experts.{e}.{name}.weight"
            w[e, name] = deq[key]
            consumed.add(key)
    # gate_up_proj [E, 2I, D] = per expert cat(w1, w3) along the output dim; down_proj [E, D, I].
    sd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([w[e, "w1"], w[e, "w3"]], 0) for e in range(n_experts)])
    sd["mlp.experts.down_proj"] = torch.stack([w[e, "w2"] for e in range(n_experts)])
    return sd


def hf_state_dict(deq: dict, cfg) -> tuple[dict, set]:
    sd, consumed = {}, set()
    for off, hf in _TOP_LEVEL.items():
        sd[hf] = deq[off]
        consumed.add(off)
    for layer in range(cfg.num_hidden_layers):
        for k, v in layer_state_dict(deq, f"layers.{layer}.", cfg.n_routed_experts, consumed).items():
            sd[f"model.layers.{layer}.{k}"] = v
    return sd, consumed


class StableIndexerTopK:
    """Makes the lightning indexer's top-k deterministic on exact ties: lower entry index wins.

    Why: Σ_h w_h·ReLU(q_h·k) is exactly 0 whenever every head's ReLU is 0, so with few index
    heads many entries tie at 0, and torch.topk breaks ties by implementation detail (its
    one-shot and cached paths see different score widths and pick different zeros: measured
    logit differences up to 30% on tiny-a). The engine breaks ties by lower index; so does this.
    The hook only reorders among equal scores: it asserts the selected score multiset equals
    transformers' own choice, and counts the queries where the choice changed.
    """

    def __init__(self, model):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        self.tie_broken_queries = 0
        self.queries = 0
        for mod in model.modules():
            if isinstance(mod, m.DeepseekV4Indexer):
                mod.scorer.register_forward_hook(self._keep_scores)
                mod.register_forward_hook(self._reselect)

    @staticmethod
    def _keep_scores(scorer, args, output):
        scorer.last_scores = output

    def _reselect(self, indexer, args, output):
        position_ids = args[2]  # forward(hidden_states, q_residual, position_ids, past_key_values, layer_idx)
        scores = indexer.scorer.last_scores  # [B, S, T]
        n_entries = scores.shape[-1]
        if n_entries == 0:
            return output
        k = min(indexer.index_topk, n_entries)
        threshold = ((position_ids + 1) // indexer.compress_rate).unsqueeze(-1)  # [B, S, 1]
        visible = torch.arange(n_entries).view(1, 1, -1) < threshold
        masked = scores.masked_fill(~visible, float("-inf"))
        picks = torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :k]
        picks = torch.where(picks < threshold, picks, torch.full_like(picks, -1))

        def chosen(ix):
            vals = masked.gather(-1, ix.clamp_min(0)).masked_fill(ix < 0, float("-inf"))
            return vals.sort(dim=-1).values

        assert torch.equal(chosen(picks), chosen(output)), "stable top-k changed more than tie order"
        changed = (picks.sort(-1).values != output.sort(-1).values).any(-1)
        self.tie_broken_queries += int(changed.sum())
        self.queries += changed.numel()
        return picks


def load_model(ckpt_dir: str):
    """Returns (model, cfg, deq): model in fp32 eval mode with eager experts, loaded strictly,
    with the deterministic indexer tie-break installed (model.stable_topk holds its counters)."""
    from transformers import DeepseekV4ForCausalLM

    official = read_official_config(ckpt_dir)
    cfg = hf_config(official)
    deq = dequantize(read_checkpoint(ckpt_dir))
    sd, consumed = hf_state_dict(deq, cfg)
    leftover = [k for k in deq if k not in consumed and not k.startswith("mtp.")]
    assert not leftover, f"official tensors not mapped: {leftover[:8]}"
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(cfg).to(torch.float32).eval()
    model.load_state_dict(sd, strict=True)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "head tied to embed"
    model.stable_topk = StableIndexerTopK(model)
    return model, cfg, deq


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def one_shot_logits(model, ids: list[int], capture_streams: bool = False):
    """All-position fp32 logits [S, V] with no cache; optionally also the final stream state
    [S, hc_mult, hidden] (the input of hc_head, i.e. the MTP input H)."""
    captured = {}
    handle = None
    if capture_streams:
        handle = model.model.hc_head.register_forward_pre_hook(lambda mod, args: captured.setdefault("h", args[0]))
    try:
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        if handle is not None:
            handle.remove()
    logits = out.logits[0].float()
    return (logits, captured["h"][0].float()) if capture_streams else logits


@torch.no_grad()
def cached_run(model, cfg, ids: list[int], chunks: list[int]):
    """Feeds `ids` through a DynamicCache in chunks of the given sizes (then one token at a
    time); returns logits [S, V] for every position."""
    from transformers import DynamicCache

    cache = DynamicCache(config=cfg)
    out, pos = [], 0
    sizes = list(chunks)
    while pos < len(ids):
        n = sizes.pop(0) if sizes else 1
        n = min(n, len(ids) - pos)
        r = model(
            input_ids=torch.tensor([ids[pos : pos + n]]),
            position_ids=torch.arange(pos, pos + n).unsqueeze(0),
            past_key_values=cache,
            use_cache=True,
        )
        out.append(r.logits[0].float())
        pos += n
    return torch.cat(out)


@torch.no_grad()
def greedy(model, cfg, ids: list[int], n_steps: int):
    """Greedy continuation through the cache: prefill, then one token per step. Returns
    (tokens [n], margins [n]) where margins[s] = top1 - top2 of the logits that chose tokens[s]."""
    from transformers import DynamicCache

    cache = DynamicCache(config=cfg)
    r = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    logits = r.logits[0, -1].float()
    toks, margins = [], []
    pos = len(ids)
    for step in range(n_steps):
        top = torch.topk(logits, 2)
        tok = int(top.indices[0])
        toks.append(tok)
        margins.append(float(top.values[0] - top.values[1]))
        if step + 1 == n_steps:
            break
        r = model(
            input_ids=torch.tensor([[tok]]),
            position_ids=torch.tensor([[pos]]),
            past_key_values=cache,
            use_cache=True,
        )
        logits = r.logits[0, -1].float()
        pos += 1
    return toks, margins


def rel_max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


_RAGGED = [7, 1, 13, 64, 5, 130, 3]


def self_check(model, cfg, ids: list[int]) -> dict:
    """transformers' cached paths (prefill of a third then token-by-token decode; ragged chunked
    prefill) must equal its one-shot logits to fp32 rounding, or the oracle is inconsistent."""
    full = one_shot_logits(model, ids)
    n = len(ids)
    dec = cached_run(model, cfg, ids, [max(1, n // 3)])
    chunked = cached_run(model, cfg, ids, _RAGGED + [37] * (n // 37 + 1))
    res = {
        "length": n,
        "prefill_then_decode_max_rel_diff": rel_max_diff(dec, full),
        "ragged_chunks_max_rel_diff": rel_max_diff(chunked, full),
        "ragged_chunks": _RAGGED + [37, "..."],
    }
    assert res["prefill_then_decode_max_rel_diff"] < 1e-4, res
    assert res["ragged_chunks_max_rel_diff"] < 1e-4, res
    return res


def ragged_check(model, cfg, ids: list[int]) -> dict:
    """Cheaper variant for long prompts: ragged chunked prefill only."""
    full = one_shot_logits(model, ids)
    chunked = cached_run(model, cfg, ids, _RAGGED + [37] * (len(ids) // 37 + 1))
    res = {"length": len(ids), "ragged_chunks_max_rel_diff": rel_max_diff(chunked, full), "ragged_chunks": _RAGGED + [37, "..."]}
    assert res["ragged_chunks_max_rel_diff"] < 1e-4, res
    return res


# ---------------------------------------------------------------------------------------------
# MTP (spec §8), assembled from transformers components
# ---------------------------------------------------------------------------------------------


class MtpOracle:
    """mtp.0 as an HF DeepseekV4DecoderLayer (sliding window, score-routed, rope "main") plus
    enorm/hnorm/e_proj/h_proj/hc_head/norm, sharing the main model's embed and head.

    For a prompt ids[0..n-1] with main final streams H[0..n-1] (pre-hc_head), MTP position i
    (i = 0..n-2) takes H[i] and embed(ids[i+1]) and predicts ids[i+2]. The n-1 MTP positions
    form their own sequence (positions 0..n-2) with their own sliding window; no cache.
    """

    def __init__(self, model, cfg, deq: dict):
        from torch import nn
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        assert cfg.num_nextn_predict_layers >= 1
        self.cfg = cfg
        self.model = model
        mcfg = copy.deepcopy(cfg)
        li = cfg.num_hidden_layers
        mcfg.layer_types = list(cfg.layer_types) + ["sliding_attention"]
        mcfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["moe"]
        mcfg.num_hidden_layers = li + 1
        self.layer_idx = li
        D = cfg.hidden_size
        self.layer = m.DeepseekV4DecoderLayer(mcfg, li).float().eval()
        consumed = set()
        self.layer.load_state_dict(layer_state_dict(deq, "mtp.0.", cfg.n_routed_experts, consumed), strict=True)
        if hasattr(self.layer.mlp.experts, "experts_implementation"):
            pass
        self.enorm = m.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.hnorm = m.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.norm = m.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.e_proj = nn.Linear(D, D, bias=False)
        self.h_proj = nn.Linear(D, D, bias=False)
        self.hc_head = m.DeepseekV4HyperHead(cfg)
        extra = {
            "enorm.weight": (self.enorm, "weight"),
            "hnorm.weight": (self.hnorm, "weight"),
            "norm.weight": (self.norm, "weight"),
            "e_proj.weight": (self.e_proj, "weight"),
            "h_proj.weight": (self.h_proj, "weight"),
            "hc_head_fn": (self.hc_head, "hc_fn"),
            "hc_head_base": (self.hc_head, "hc_base"),
            "hc_head_scale": (self.hc_head, "hc_scale"),
        }
        with torch.no_grad():
            for off, (mod, attr) in extra.items():
                p = getattr(mod, attr)
                v = deq["mtp.0." + off]
                assert p.shape == v.shape, (off, p.shape, v.shape)
                p.copy_(v)
                consumed.add("mtp.0." + off)
        leftover = [k for k in deq if k.startswith("mtp.0.") and k not in consumed]
        assert not leftover, f"mtp tensors not used: {leftover}"

    def sliding_mask(self, n: int) -> torch.Tensor:
        """Additive [1, 1, n, n] mask: key k visible to query q iff q - W < k <= q (W keys incl. self)."""
        q = torch.arange(n).view(-1, 1)
        k = torch.arange(n).view(1, -1)
        ok = (k <= q) & (k > q - self.cfg.sliding_window)
        return torch.zeros(n, n).masked_fill(~ok, float("-inf")).view(1, 1, n, n)

    @torch.no_grad()
    def logits(self, ids: list[int], streams: torch.Tensor) -> torch.Tensor:
        """streams: [n, hc_mult, D] main final stream state. Returns [n-1, V]."""
        n = len(ids)
        nxt = torch.tensor([ids[1:]])
        e = self.enorm(self.model.model.embed_tokens(nxt))  # [1, n-1, D]
        hn = self.hnorm(streams[None, : n - 1])  # [1, n-1, hc, D], per stream
        x = self.e_proj(e).unsqueeze(2) + self.h_proj(hn)
        pos = torch.arange(n - 1).unsqueeze(0)
        pe = {"main": self.model.model.rotary_emb(e, position_ids=pos, layer_type="main")}
        x = self.layer(
            x,
            input_ids=nxt,
            position_embeddings=pe,
            position_ids=pos,
            attention_mask=self.sliding_mask(n - 1),
            past_key_values=None,
        )
        return self.model.lm_head(self.norm(self.hc_head(x)))[0].float()


@torch.no_grad()
def check_hf_mask_matches_ours(model, cfg, n: int) -> bool:
    """The hand-built MTP window mask must equal what transformers builds for the main model."""
    from transformers.masking_utils import create_sliding_window_causal_mask

    emb = torch.zeros(1, n, cfg.hidden_size)
    hf = create_sliding_window_causal_mask(
        config=cfg, inputs_embeds=emb, attention_mask=None, past_key_values=None, position_ids=torch.arange(n)[None]
    )
    ours = MtpOracle.sliding_mask(type("o", (), {"cfg": cfg})(), n)
    if hf.dtype == torch.bool:
        return bool(torch.equal(hf, ours == 0))
    return bool(torch.equal(hf == 0, ours == 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("probe")
    c = sub.add_parser("check")
    c.add_argument("ckpt")
    c.add_argument("--length", type=int, default=100)
    args = ap.parse_args()
    if args.cmd == "probe":
        print(json.dumps(probe(), indent=2))
        return 0
    model, cfg, _ = load_model(args.ckpt)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, cfg.vocab_size, (args.length,), generator=g).tolist()
    print(json.dumps({"config": probe_config_parse(args.ckpt, cfg), "self_check": self_check(model, cfg, ids)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
