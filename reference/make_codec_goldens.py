#!/usr/bin/env python3
"""Codec and quantization-op goldens (tests/fixtures/codec/), with torch dtype casts as the oracle.

codecs.safetensors
  e4m3_decode        F32 [256]     float(float8_e4m3fn code c), c = 0..255
  e4m3_encode_bf16   U8  [65536]   e4m3fn(clamp(float(bf16 bits b), -448, 448)), b = 0..65535
  e4m3_edge_in       F32 [n]       fp32 edge values (ties, subnormals, neighbours of grid points)
  e4m3_edge_code     U8  [n]       e4m3fn(clamp(x, -448, 448))
  e8m0_decode        F32 [256]     float(float8_e8m0fnu code c)
  e2m1_decode        F32 [16]      the e2m1 grid (see manifest: reference, not a torch cast)
  e2m1_edge_in       F32 [n]       fp32 values in [-7, 7] incl. every tie and grid neighbour
  e2m1_edge_code     U8  [n]       e2m1 code of clamp(x, -6, 6), RNE, ties to the even code
ops.safetensors (inputs are bf16 values; see manifest for the formulas)
  act_quant.x BF16 [R, 512]  -> act_quant.codes U8 [R, 512], act_quant.scales F32 [R, 4]   (block 128)
  kv_fp8.x    BF16 [R, 448]  -> kv_fp8.y BF16 [R, 448]                                      (block 64)
  fp4.x       BF16 [R, 128]  -> fp4.y BF16 [R, 128]                                         (block 32)
  hadamard.x  BF16 [R, 128]  -> hadamard.y BF16 [R, 128]
Rows mix N(0,1) data with all-zero, huge (near bf16 max), tiny (subnormal bf16) and mixed blocks.

Usage: make_codec_goldens.py --out tests/fixtures/codec
"""

import argparse
import datetime
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

SEED = 20261202
FP32_INV_448 = torch.tensor(1.0 / 448.0, dtype=torch.float32)
FP32_INV_6 = torch.tensor(1.0 / 6.0, dtype=torch.float32)
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)


# ---- scalar codecs --------------------------------------------------------------------------


def e4m3_codes(x: torch.Tensor) -> torch.Tensor:
    return x.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """RNE to the e2m1 grid after clamping to +-6; the grid spacing is 0.5 below 2, 1 in [2, 4),
    2 in [4, 6], and torch.round rounds half to even, so rounding |x|/spacing gives RNE with ties
    to the even code (codes are ordered by magnitude, and even codes sit on even multiples)."""
    a = x.float().abs().clamp(max=6.0)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    q = torch.round(a / step) * step
    code = torch.searchsorted(E2M1_GRID, q)
    assert torch.equal(E2M1_GRID[code], q)
    sign = torch.signbit(x.float()).to(torch.uint8) << 3
    return code.to(torch.uint8) | sign


def e2m1_codes_by_distance(x: torch.Tensor) -> torch.Tensor:
    """Second, independent formulation (nearest grid point, ties to even) for a self-check."""
    a = x.float().abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - E2M1_GRID).abs()  # [n, 8]
    best = d.min(-1, keepdim=True).values
    cand = d == best
    even = cand & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.float().argmax(-1), cand.float().argmax(-1))
    return code.to(torch.uint8) | (torch.signbit(x.float()).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    v = E2M1_GRID[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -v, v)


def ceil_pow2_from_bits(f: torch.Tensor) -> torch.Tensor:
    """2^(exponent_bits - 127 + (mantissa != 0)) for positive normal fp32 f (the reference's
    ue8m0 scale rounding)."""
    bits = f.float().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    assert int(((bits >> 23) & 0xFF).min()) > 0, "scale input not a normal fp32"
    return torch.ldexp(torch.ones_like(f, dtype=torch.float32), e)


# ---- ops (spec §2.2-2.4) --------------------------------------------------------------------


def blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    r, n = x.shape
    return x.float().reshape(r, n // block, block)


def act_quant(x: torch.Tensor, block: int = 128):
    xb = blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = ceil_pow2_from_bits(amax * FP32_INV_448)
    codes = (xb / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8).reshape(x.shape), s.squeeze(-1)


def kv_fp8_round_trip(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    codes, s = act_quant(x, block)
    vals = codes.view(torch.float8_e4m3fn).float().reshape(blocks(x, block).shape)
    return (vals * s.unsqueeze(-1)).reshape(x.shape).to(torch.bfloat16)


def fp4_round_trip(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    xb = blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-126)
    s = ceil_pow2_from_bits(amax * FP32_INV_6)
    q = e2m1_values(e2m1_codes((xb / s).clamp(-6.0, 6.0)))
    return (q * s).reshape(x.shape).to(torch.bfloat16)


def sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    return ((x.double() @ sylvester(n).T) * n**-0.5).to(torch.bfloat16)


# ---- inputs ---------------------------------------------------------------------------------


def e4m3_edge_values() -> torch.Tensor:
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0..448 ascending
    mids = (grid[1:] + grid[:-1]) / 2  # exact ties (fp32 holds them)
    vals = [grid, mids]
    for t in (mids, grid):
        b = t.view(torch.int32)
        vals += [(b + 1).view(torch.float32), (b - 1).view(torch.float32).clamp_min(0)]
    special = torch.tensor(
        [2.0**-10, 2.0**-11, 3 * 2.0**-11, 2.0**-9 * 1.5, 2.0**-30, 1e-45, 1.17549435e-38, 447.99, 448.0, 449.0,
         463.99, 464.0, 465.0, 1e6, 3.4e38, float("inf")],
        dtype=torch.float32,
    )
    pos = torch.cat(vals + [special])
    return torch.cat([pos, -pos, torch.tensor([float("nan")])])


def e2m1_edge_values() -> torch.Tensor:
    g = E2M1_GRID
    mids = (g[1:] + g[:-1]) / 2
    base = torch.cat([g, mids, torch.tensor([6.5, 7.0, 5.999, 0.2499, 0.2501, 1e-30, 1e-40])])
    b = base.view(torch.int32)
    near = torch.cat([(b + 1).view(torch.float32), (b - 1).clamp_min(0).view(torch.float32)])
    lin = torch.linspace(0, 7, 1401)
    pos = torch.cat([base, near, lin])
    return torch.cat([pos, -pos])


def op_rows(g: torch.Generator, rows: int, width: int, block: int, huge: float = 1e38) -> torch.Tensor:
    """bf16 rows: mostly N(0, sigma) with per-row sigma over many decades, plus special blocks
    (`huge` is the scale of the huge blocks; the Hadamard rows use 1e30 so that fp32 sums of
    128 elements, as every fp32 implementation computes them, cannot overflow)."""
    sig = torch.pow(10.0, torch.empty(rows, 1).uniform_(-6, 6, generator=g))
    x = torch.randn(rows, width, generator=g) * sig
    nb = width // block
    kinds = torch.randint(0, 8, (rows, nb), generator=g)
    for r in range(rows):
        for b in range(nb):
            sl = slice(b * block, (b + 1) * block)
            k = int(kinds[r, b])
            if k == 0:
                x[r, sl] = 0.0
            elif k == 1:  # huge: near bf16 max
                x[r, sl] = (torch.randn(block, generator=g) * huge).clamp(-3.3e38, 3.3e38)
            elif k == 2:  # tiny: bf16 subnormals and below the amax floors
                x[r, sl] = torch.randn(block, generator=g) * 1e-39
            elif k == 3:  # one outlier, the rest small (many codes flush to 0)
                x[r, sl] = torch.randn(block, generator=g) * 1e-3
                x[r, b * block + int(torch.randint(0, block, (1,), generator=g))] = 300.0
            elif k == 4:  # values exactly on scale boundaries (amax a power of two)
                x[r, sl] = torch.randn(block, generator=g)
                x[r, b * block] = 448.0 * 2.0 ** int(torch.randint(-20, 20, (1,), generator=g))
    x = x.to(torch.bfloat16)
    assert torch.isfinite(x.float()).all()
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)

    all_codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    bf16_all = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    e4m3_in = e4m3_edge_values()
    e2m1_in = e2m1_edge_values()
    e2m1_code = e2m1_codes(e2m1_in)
    assert torch.equal(e2m1_code, e2m1_codes_by_distance(e2m1_in)), "the two e2m1 references disagree"
    codecs = {
        "e4m3_decode": all_codes.view(torch.float8_e4m3fn).float(),
        "e4m3_encode_bf16": e4m3_codes(bf16_all.float()),
        "e4m3_edge_in": e4m3_in,
        "e4m3_edge_code": e4m3_codes(e4m3_in),
        "e8m0_decode": all_codes.view(torch.float8_e8m0fnu).float(),
        "e2m1_decode": e2m1_values(torch.arange(16, dtype=torch.uint8)),
        "e2m1_edge_in": e2m1_in,
        "e2m1_edge_code": e2m1_code,
    }
    save_file({k: v.contiguous() for k, v in codecs.items()}, os.path.join(args.out, "codecs.safetensors"))

    ops = {}
    x = op_rows(g, 48, 512, 128)
    ops["act_quant.x"], (ops["act_quant.codes"], ops["act_quant.scales"]) = x, act_quant(x, 128)
    x = op_rows(g, 96, 448, 64)
    ops["kv_fp8.x"], ops["kv_fp8.y"] = x, kv_fp8_round_trip(x, 64)
    x = op_rows(g, 128, 128, 32)
    ops["fp4.x"], ops["fp4.y"] = x, fp4_round_trip(x, 32)
    x = op_rows(g, 256, 128, 128, huge=1e30)
    x[:8] = op_rows(g, 8, 128, 32, huge=1e30)  # blocks of mixed magnitude inside one transform
    ops["hadamard.x"], ops["hadamard.y"] = x, hadamard(x)
    save_file({k: v.contiguous() for k, v in ops.items()}, os.path.join(args.out, "ops.safetensors"))

    import safetensors

    manifest = {
        "what": "codec and quantization-op goldens; oracle = torch dtype casts on CPU",
        "generated_at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__.split("+")[0], "safetensors": safetensors.__version__,
                     "python": sys.version.split()[0]},
        "seed": SEED,
        "regenerate": "/work/venvs/ref/bin/python reference/make_codec_goldens.py --out tests/fixtures/codec",
        "e4m3": "decode: code.view(float8_e4m3fn).float(); encode: x.float().clamp(-448, 448).to(float8_e4m3fn) "
        "(torch RNE). NaN input encodes to 0x7f/0xff (sign kept by torch).",
        "e8m0": "code.view(float8_e8m0fnu).float(): 2^(c-127); c=0 -> 2^-127 (fp32 subnormal); c=255 -> NaN",
        "e2m1": "torch 2.15 cannot cast to float4_e2m1fn_x2 on CPU ('copy_kernel not implemented'), so the "
        "reference is explicit: clamp |x| to 6, torch.round(|x|/spacing)*spacing with spacing 0.5/1/2 "
        "below 2/below 4/above (round half to even = ties to the even code), cross-checked against a "
        "nearest-grid-point search; sign bit 8 from signbit(x) (so -0 -> code 8)",
        "act_quant": "per row, per block of 128: amax = max(|x|, 1e-4); s = 2^ceil(log2(amax * fp32(1/448))) "
        "from the fp32 bits; codes = e4m3(clamp(x / s, -448, 448)); scales F32 = s",
        "kv_fp8": "block 64: y = bf16(float(e4m3(clamp(x / s, +-448))) * s), s as act_quant",
        "fp4": "block 32: amax = max(|x|, 6 * 2^-126); s = 2^ceil(log2(amax * fp32(1/6))); "
        "y = bf16(e2m1(clamp(x / s, +-6)) * s)",
        "hadamard": "y = bf16((x as float64) @ H128^T * 128^-0.5), H128 the Sylvester (natural order) matrix "
        "H_{2n} = [[H, H], [H, -H]] built explicitly in float64",
        "inputs": "bf16 rows: N(0, sigma) with sigma in 1e-6..1e6 per row; per block one of: all zero, huge "
        "(~1e38; ~1e30 for hadamard), tiny (~1e-39, subnormal), one outlier (300) among 1e-3 values, an exact 448*2^k element",
        "shapes": {k: list(v.shape) for k, v in {**codecs, **ops}.items()},
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}: {sum(os.path.getsize(os.path.join(args.out, p)) for p in os.listdir(args.out))} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
