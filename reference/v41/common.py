"""Number formats, quantization round trips, config parsing and checkpoint reading for the
independent DeepSeek-V4.1 oracle (reference/v41). Written from the spec
(shared/reference/deepseek-v4-model.md §2, §14), not from any engine code.

Everything here works on torch tensors in a chosen compute dtype `ct` (float32 or float64).
"""

import hashlib
import json
import math
import os

import torch
from safetensors import safe_open

FP32_INV_448 = float(torch.tensor(1.0 / 448.0, dtype=torch.float32))  # the fp32 constant act_quant multiplies by
FP32_INV_6 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; 8..15 are the negatives


# ----------------------------------------------------------------------------------------------
# element codecs
# ----------------------------------------------------------------------------------------------


def _rne_f64(x: torch.Tensor, mbits: int, min_exp: int) -> torch.Tensor:
    """x (float64) rounded to nearest-even on a grid of mbits explicit mantissa bits with normal
    exponents >= min_exp (smaller values on the subnormal grid 2^(min_exp - mbits)); no overflow
    handling (the caller's cast does it). Every step is exact in float64: x / q and r * q scale by a
    power of two, torch.round is half-to-even."""
    _, e = torch.frexp(x)  # |x| = m 2^e, 0.5 <= m < 1
    q = torch.ldexp(torch.ones_like(x), torch.clamp(e - 1, min=min_exp) - mbits)
    return torch.round(x / q) * q


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to bfloat16 (RNE) and come back in x's dtype. torch casts float64 to bfloat16 through
    float32 (two roundings: a value within half an fp32 ulp of a bf16 midpoint lands on the midpoint
    and then goes to even, whichever side it was on), so float64 is rounded here first."""
    if x.dtype == torch.float64:
        x = _rne_f64(x, 7, -126)
    return x.to(torch.bfloat16).to(x.dtype)


def ceil_pow2(f: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 f) for positive normal fp32 f, from the bits (exponent + (mantissa != 0)), as the
    reference's act_quant computes its ue8m0 scale. Returns fp32."""
    f = f.to(torch.float32)
    bits = f.view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.pow(torch.tensor(2.0, dtype=torch.float64), exp.to(torch.float64)).to(torch.float32)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """Nearest e4m3fn value (RNE; caller clamps to +-448 first). Same dtype out. float64 is rounded
    here first: torch's float64 -> float8 cast goes through float32 (two roundings, as in bf16)."""
    if x.dtype == torch.float64:
        x = _rne_f64(x, 3, -6)
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def e2m1_round(a: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 value of a (|a| <= 6), ties to the even code. On the three grid segments the
    step is 0.5, 1, 2 and the even codes are the even multiples of the step, so round-half-even
    of a/step is exactly 'ties to even code'."""
    m = a.abs()
    step = torch.where(m < 2, torch.full_like(m, 0.5), torch.where(m < 4, torch.full_like(m, 1.0), torch.full_like(m, 2.0)))
    return torch.copysign(torch.round(m / step) * step, a)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Codes (uint8 0..15) of values already on the e2m1 grid."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32)
    mag = (v.abs().float().unsqueeze(-1) == grid).float().argmax(-1).to(torch.uint8)
    return mag | ((v < 0) | ((v == 0) & (torch.signbit(v)))).to(torch.uint8) << 3


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1_GRID + tuple(-g for g in E2M1_GRID), dtype=torch.float64)
    return grid[codes.long()]


def e8m0_decode(raw_u8: torch.Tensor) -> torch.Tensor:
    """2^(b - 127) in float64; byte 255 is NaN."""
    b = raw_u8.to(torch.int64)
    out = torch.pow(torch.tensor(2.0, dtype=torch.float64), (b - 127).to(torch.float64))
    return torch.where(b == 255, torch.full_like(out, float("nan")), out)


# ----------------------------------------------------------------------------------------------
# quantization round trips (spec §2.2, §2.3, §14.2). Input and output in the caller's dtype.
# ----------------------------------------------------------------------------------------------


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"last dim {n} is not a multiple of the quantization block {block}")
    return x.reshape(*x.shape[:-1], n // block, block)


def act_quant_fp8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP8 e4m3 with a power-of-two (ue8m0) scale per block along the last dim:
    s = 2^ceil(log2(max(amax, 1e-4) * fp32(1/448))), q = e4m3(clamp(x / s, +-448)), returns q * s.
    Used before every FP8/FP4 linear (as the GEMM input) and on the window KV (QAT round trip)."""
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = ceil_pow2(amax.float() * FP32_INV_448).to(x.dtype)
    q = e4m3_round((xb / s).clamp(-448.0, 448.0))
    return (q * s).reshape(x.shape)


def fp4_round_trip_e8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """E2M1 with a power-of-two scale per block: s = 2^ceil(log2(max(amax, 6*2^-126) * fp32(1/6))).
    Indexer queries and index keys (block 32, no Hadamard in V4.1)."""
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-126)
    s = ceil_pow2(amax.float() * FP32_INV_6).to(x.dtype)
    q = e2m1_round((xb / s).clamp(-6.0, 6.0))
    return (q * s).reshape(x.shape)


def fp4_round_trip_e4m3(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """E2M1 with an E4M3 scale per block of 16 (compressed KV rows, §14.2):
    s = e4m3(max(amax, 6*2^-9) / 6) (fp32 division), q = e2m1(clamp(x / s, +-6)), returns q * s.
    x / s is an fp32 division (s is not a power of two)."""
    xb = _blocks(x, block).float()
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-9)
    s = e4m3_round(amax / 6.0)
    q = e2m1_round((xb / s).clamp(-6.0, 6.0))
    return (q * s).reshape(x.shape).to(x.dtype)


# ----------------------------------------------------------------------------------------------
# weight encoders (for write_tiny.py): exact inverses of the dequantizers below
# ----------------------------------------------------------------------------------------------


def quantize_fp8_blocks(w: torch.Tensor, block: int = 32):
    """[N, K] float -> (e4m3 codes as float8 tensor [N, K], e8m0 scale bytes uint8 [ceil(N/b), ceil(K/b)])
    with a power-of-two scale per block x block tile, s = 2^ceil(log2(amax / 448))."""
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    pad = torch.zeros(nb * block, kb * block, dtype=torch.float32)
    pad[:n, :k] = w.float()
    tiles = pad.reshape(nb, block, kb, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    s = torch.pow(2.0, exp)
    q = (tiles / s[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    codes = q.reshape(nb * block, kb * block)[:n, :k].contiguous()
    return codes, (exp + 127).to(torch.uint8)


def quantize_fp8_rows(w: torch.Tensor, block: int = 32):
    """[R, C] float -> (e4m3 codes [R, C], e8m0 bytes [R, C/block]): one scale per row block of 32
    columns (Engram embedding tables)."""
    r, c = w.shape
    g = w.float().reshape(r, c // block, block)
    amax = g.abs().amax(-1).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    q = (g / torch.pow(2.0, exp)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(r, c).contiguous(), (exp + 127).to(torch.uint8)


def quantize_fp4_packed(w: torch.Tensor, block: int = 32):
    """[N, K] float -> (packed int8 [N, K/2], low nibble = even column; e8m0 bytes [N, K/32])."""
    n, k = w.shape
    g = w.float().reshape(n, k // block, block)
    amax = g.abs().amax(-1).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    v = e2m1_round((g / torch.pow(2.0, exp)[..., None]).clamp(-6, 6)).reshape(n, k)
    codes = e2m1_codes(v)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed.contiguous(), (exp + 127).to(torch.uint8)


# ----------------------------------------------------------------------------------------------
# dequantizers (checkpoint -> exact float64 values)
# ----------------------------------------------------------------------------------------------


def raw_u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def dequant_fp8_blocks(codes: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """W = e4m3(code) * 2^(scale[r // 32, c // 32] - 127); scale must be [ceil(N/32), ceil(K/32)]."""
    n, k = codes.shape
    sb = e8m0_decode(raw_u8(scale))
    if tuple(sb.shape) != (-(-n // block), -(-k // block)):
        raise ValueError(f"FP8 scale shape {tuple(sb.shape)} is not [ceil({n}/{block}), ceil({k}/{block})]")
    full = sb.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return codes.to(torch.float64) * full


def dequant_fp4_packed(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    b = raw_u8(packed)
    n, half = b.shape
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(n, 2 * half)
    vals = e2m1_decode(codes)
    s = e8m0_decode(raw_u8(scale))
    block = (2 * half) // s.shape[1]
    return vals * s.repeat_interleave(block, 1)


def dequant_fp8_rows(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    r, c = codes.shape
    s = e8m0_decode(raw_u8(scale))
    return codes.to(torch.float64) * s.repeat_interleave(c // s.shape[1], 1)


# ----------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------

# HF config.json (text_config) key -> inference config key (ModelArgs field). Third-party copies of
# both released files agree on this mapping; see LAYOUT.md.
HF_TO_INFERENCE = {
    "hidden_size": "dim",
    "moe_intermediate_size": "moe_inter_dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_experts_per_tok": "n_activated_experts",
    "scoring_func": "score_func",
    "routed_scaling_factor": "route_scale",
    "qk_rope_head_dim": "rope_head_dim",
    "rms_norm_eps": "norm_eps",
    "sliding_window": "window_size",
    "kv_source_layer_ids": "kv_source_layers",
    "index_source_layer_ids": "index_source_layers",
    "candidate_source_layer_id": "candidate_source_layer",
    "engram_pad_token_id": "engram_pad_id",
    "num_nextn_predict_layers": "n_mtp_layers",
    "dspark_num_experts_per_tok": "dspark_n_activated_experts",
}

# ModelArgs defaults for fields a config may omit (the released configs carry the rest).
DEFAULTS = {
    "norm_eps": 1e-20,
    "hc_eps": 1e-6,
    "gate_temp": 1.0,
    "norm_topk_prob": True,
    "swiglu_limit": 0.0,
    "n_mtp_layers": 0,
    "candidate_source_layer": -1,
    "candidate_topk_blocks": 0,
    "candidate_block_size": 0,
    "engram_layer_ids": [],
    "engram_num_embeddings": [],
    "engram_pad_id": 2,
    "original_seq_len": 0,
    "rope_factor": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "route_scale": 1.0,
    "dspark_block_size": 0,
}


def parse_config(cfg: dict) -> dict:
    """Flat ModelArgs-style dict from either the HF config.json (nested text_config, `_ids` keys,
    rope_scaling) or the flat inference/config.json."""
    text = cfg.get("text_config") or cfg
    out = dict(DEFAULTS)
    for k, v in text.items():
        out[HF_TO_INFERENCE.get(k, k)] = v
    rope = text.get("rope_scaling")
    if rope:
        out["original_seq_len"] = rope.get("original_max_position_embeddings", 0)
        out["rope_factor"] = rope.get("factor", 1.0)
        out["beta_fast"] = rope.get("beta_fast", 32)
        out["beta_slow"] = rope.get("beta_slow", 1)
    for k in ("image_token_id",):
        if k in cfg:
            out[k] = cfg[k]
    validate_config(out)
    return out


def validate_config(a: dict) -> None:
    n = a["n_layers"]
    ratios = a["compress_ratios"]
    if len(ratios) < n:
        raise ValueError("compress_ratios must cover every backbone layer")
    if a["n_heads"] % a["o_groups"]:
        raise ValueError("n_heads must be a multiple of o_groups")
    kv, ix = set(a["kv_source_layers"]), set(a["index_source_layers"])
    source = index = None
    for i in range(n):
        if i in kv:
            source, index = i, None
        if i in ix:
            index = i
        if ratios[i] and (source is None or index is None or ratios[source] != ratios[i]):
            raise ValueError(f"layer {i} (ratio {ratios[i]}) has no compatible kv/index source")
    if not kv <= ix:
        raise ValueError("every kv source must also be an index source (its indexer owns the index keys)")
    c = a["candidate_source_layer"]
    if c >= 0 and c not in ix:
        raise ValueError("candidate_source_layer must be an index source")
    if len(a["engram_layer_ids"]) != len(a["engram_num_embeddings"]):
        raise ValueError("engram_layer_ids / engram_num_embeddings lengths differ")


def kv_source_of(a: dict, layer: int):
    src = [s for s in a["kv_source_layers"] if s <= layer]
    return max(src) if src else None


def index_source_of(a: dict, layer: int):
    src = [s for s in a["index_source_layers"] if s <= layer]
    return max(src) if src else None


# ----------------------------------------------------------------------------------------------
# checkpoint directory
# ----------------------------------------------------------------------------------------------


class Checkpoint:
    """Tensors of a safetensors checkpoint directory (index file or a single model.safetensors)."""

    def __init__(self, path: str):
        self.path = path
        with open(os.path.join(path, "config.json")) as f:
            self.raw_config = json.load(f)
        self.config = parse_config(self.raw_config)
        idx = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                self.weight_map = json.load(f)["weight_map"]
        else:
            files = sorted(p for p in os.listdir(path) if p.endswith(".safetensors"))
            self.weight_map = {}
            for fn in files:
                with safe_open(os.path.join(path, fn), "pt") as f:
                    for k in f.keys():
                        self.weight_map[k] = fn
        self._handles = {}
        self.used = set()

    def names(self):
        return list(self.weight_map)

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise KeyError(f"tensor {name} missing from checkpoint {self.path}")
        fn = self.weight_map[name]
        if fn not in self._handles:
            self._handles[fn] = safe_open(os.path.join(self.path, fn), "pt")
        self.used.add(name)
        return self._handles[fn].get_tensor(name)

    def fingerprint(self) -> dict:
        out = {}
        for fn in sorted(os.listdir(self.path)):
            full = os.path.join(self.path, fn)
            if os.path.isfile(full):
                out[fn] = sha256_file(full)
        return out


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def nmse(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    return float(((a - ref) ** 2).sum() / (ref**2).sum().clamp_min(1e-300))


def isprime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (bases 2..41)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in small:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


assert math.isclose(FP32_INV_448, 0.002232142957, rel_tol=1e-9)
