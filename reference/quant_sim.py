"""The official reference's fake quantization (spec §2.2-2.4), added to the fp32 transformers
model with hooks (oracle doc §4 hook points), for goldens of the engine with
Numerics{round_bf16=false, quantize_activations, kv_fp8_round_trip, indexer_fp4 = true}.

What is simulated (fp32 otherwise; no bf16 rounding anywhere):
  * act_quant (FP8 e4m3, power-of-two scale per block of 128 along the input dim) on the input of
    every FP8/FP4 linear: q_a_proj, q_b_proj, kv_proj, o_b_proj, indexer q_b_proj, shared
    experts, routed experts (w1/w3 input and the w2 input), MTP e_proj/h_proj. Not on o_a_proj
    (bf16 in the reference), compressor/indexer projections, weights_proj, router, head.
  * FP8 round trip (block 64) of the non-RoPE dims of the window KV (kv_norm output) and of the
    main compressors' rows (compressor kv_norm output); RoPE only touches the tail, so the
    order relative to RoPE does not matter.
  * Hadamard (butterfly, fp32, x n^-0.5) + FP4 round trip (block 32) of the indexer's q and
    compressed k, at the scorer's input (post-RoPE, as in the reference).
  * routed experts: the route weight multiplies the SwiGLU output BEFORE the act_quant of the w2
    input (reference order; transformers applies it after down_proj, which only commutes
    without quantization), so the experts' forward is replaced.
A last partial block (dims not a multiple of the block, e.g. moe_inter 96 or 48 nope dims) is
quantized as a shorter block: zero padding leaves its amax unchanged.
"""

import math
import os
import sys
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_codec_goldens import FP32_INV_448, FP32_INV_6, ceil_pow2_from_bits, e2m1_codes, e2m1_values  # noqa: E402


def _blocked(x: torch.Tensor, block: int):
    n = x.shape[-1]
    pad = (-n) % block
    xp = F.pad(x.float(), (0, pad)) if pad else x.float()
    return xp.reshape(*x.shape[:-1], (n + pad) // block, block), n


def fp8_round_trip(x: torch.Tensor, block: int) -> torch.Tensor:
    xb, n = _blocked(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = ceil_pow2_from_bits(amax * FP32_INV_448)
    q = (xb / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * s
    return q.reshape(*x.shape[:-1], -1)[..., :n].to(x.dtype)


def fp4_round_trip(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    xb, n = _blocked(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-126)
    s = ceil_pow2_from_bits(amax * FP32_INV_6)
    q = e2m1_values(e2m1_codes((xb / s).clamp(-6.0, 6.0))) * s
    return q.reshape(*x.shape[:-1], -1)[..., :n].to(x.dtype)


def hadamard_fp32(x: torch.Tensor) -> torch.Tensor:
    """Natural-order Walsh-Hadamard butterfly (a+b, a-b; strides 1, 2, 4, ...) in fp32, then
    times fp32(1/sqrt(n)) — the engine's and fast_hadamard_transform's fp32 arithmetic."""
    n = x.shape[-1]
    assert n & (n - 1) == 0
    y = x.float()
    h = 1
    while h < n:
        v = y.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2).reshape(*x.shape[:-1], n)
        h *= 2
    scale = 1.0 / torch.sqrt(torch.tensor(float(n), dtype=torch.float32))
    return (y * scale).to(x.dtype)


class QuantSim:
    """Installs the hooks on every DeepseekV4 module under `root` (a model or an MTP layer)."""

    def __init__(self, root, cfg, extra_fp8_linears=(), act_block: int = 128, act=True, kv=True, indexer=True):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        self.act_block = act_block
        nope = cfg.head_dim - int(round(cfg.head_dim * cfg.partial_rotary_factor))
        self.nope = nope
        self.handles = []
        for mod in root.modules():
            if isinstance(mod, m.DeepseekV4Attention):
                if act:
                    for lin in (mod.q_a_proj, mod.q_b_proj, mod.kv_proj, mod.o_b_proj):
                        self._act_quant(lin)
                if kv:
                    self.handles.append(mod.kv_norm.register_forward_hook(self._kv_round_trip))
                if mod.compressor is not None:
                    if kv:
                        self.handles.append(mod.compressor.kv_norm.register_forward_hook(self._kv_round_trip))
                    idx = getattr(mod.compressor, "indexer", None)
                    if idx is not None:
                        if act:
                            self._act_quant(idx.q_b_proj)
                        if indexer:
                            self.handles.append(idx.scorer.register_forward_pre_hook(self._indexer_fp4))
            elif isinstance(mod, m.DeepseekV4SparseMoeBlock) and act:
                for lin in (mod.shared_experts.gate_proj, mod.shared_experts.up_proj, mod.shared_experts.down_proj):
                    self._act_quant(lin)
                mod.experts.forward = types.MethodType(_make_expert_forward(act_block), mod.experts)
        for lin in extra_fp8_linears if act else ():
            self._act_quant(lin)

    def _act_quant(self, linear):
        block = self.act_block

        def pre(mod, args):
            return (fp8_round_trip(args[0], block),) + tuple(args[1:])

        self.handles.append(linear.register_forward_pre_hook(pre))

    def _kv_round_trip(self, mod, args, out):
        return torch.cat([fp8_round_trip(out[..., : self.nope], 64), out[..., self.nope :]], dim=-1)

    @staticmethod
    def _indexer_fp4(mod, args):
        q, k, hidden = args
        return fp4_round_trip(hadamard_fp32(q), 32), fp4_round_trip(hadamard_fp32(k), 32), hidden


def _make_expert_forward(act_block: int):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        x = fp8_round_trip(hidden_states, act_block)  # shared by all experts of a token
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            tok, slot = torch.where(top_k_index == e)
            if tok.numel() == 0:
                continue
            h = self._apply_gate(F.linear(x[tok], self.gate_up_proj[e])) * top_k_weights[tok, slot, None]
            out.index_add_(0, tok, F.linear(fp8_round_trip(h, act_block), self.down_proj[e]))
        return out

    return forward


def self_test() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 128, generator=g)
    sylv = torch.ones(1, 1, dtype=torch.float64)
    while sylv.shape[0] < 128:
        sylv = torch.cat([torch.cat([sylv, sylv], 1), torch.cat([sylv, -sylv], 1)], 0)
    ref = (x.double() @ sylv.T) * 128**-0.5
    assert (hadamard_fp32(x).double() - ref).abs().max() < 1e-5
    y = fp8_round_trip(x[:, :96], 128)
    assert torch.equal(fp8_round_trip(y, 128), y), "FP8 round trip must be idempotent"
    assert math.isclose(float(fp4_round_trip(torch.tensor([[6.0] + [0.0] * 31]))[0, 0]), 6.0)


if __name__ == "__main__":
    self_test()
    print("quant_sim self-test ok")
