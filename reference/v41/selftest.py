#!/usr/bin/env python3
"""Checks of the V4.1 oracle itself; each can fail. Run: .venv-ref/bin/python reference/v41/selftest.py

  1. Engram constants of spec §14.5 (first/last primes, multipliers, table rows = sum of primes).
  2. Layout: expected_tensors(real config) reproduces the public census of the released checkpoint
     (count and bytes per class, 96,085 tensors); every write_tiny preset holds exactly
     expected_tensors(its config), dtypes and shapes included.
  3. Codecs: e2m1 rounding equals a brute-force nearest-with-even-code search; the FP8 / FP4 weight
     encoders round-trip exactly through the dequantizers; act_quant's scale is the ceil power of two
     of amax*fp32(1/448) (checked against math.frexp); E4M3-scaled FP4 is idempotent; bf16 / e4m3
     rounding of float64 is one correct rounding (not torch's cast through float32).
  4. Model: one-shot == ragged chunks + decode in fp64 (both numerics); removing a feature (Engram,
     the candidate pre-filter, the newest-block pin) changes the logits, so the goldens exercise it;
     the Engram gate of an exactly-zero dot is sigmoid(0) (sign, not copysign).
  5. dSpark: main_hidden of ragged chunks == one-shot; seeding the rings in chunks == one row at a
     time; a draft is independent of the ring slots' order; it reads exactly the newest window_size
     ring rows (a row just outside the window changes nothing, the oldest one inside does), also
     once the ring has wrapped; the block is non-causal (the noise token moves row 0).
"""

import math
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import engram as E  # noqa: E402
import layout as LY  # noqa: E402
import model as M  # noqa: E402
import write_tiny as WT  # noqa: E402

DT = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e8m0fnu: "F8_E8M0", torch.int8: "I8"}


def check_codecs():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(20000, generator=g, dtype=torch.float64) * 3
    v = torch.cat([v, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 6.0, -6.0])])
    v = v.clamp(-6, 6)
    grid = torch.tensor(C.E2M1_GRID, dtype=torch.float64)
    d = (v.abs()[:, None] - grid[None, :]).abs()
    best = d.min(1, keepdim=True).values
    cand = (d == best)
    # among equally near grid points take the even code (index)
    idx = torch.where(cand, torch.arange(8)[None, :] % 2 == 0, False).float().argmax(1)
    idx = torch.where(cand.sum(1) == 1, cand.float().argmax(1), idx)
    want = torch.copysign(grid[idx], v)
    assert torch.equal(C.e2m1_round(v), want), "e2m1 rounding"
    w = torch.randn(70, 96, generator=g) * 0.3
    codes, s = C.quantize_fp8_blocks(w)
    deq = C.dequant_fp8_blocks(codes, s.view(torch.float8_e8m0fnu))
    codes2, s2 = C.quantize_fp8_blocks(deq.float())
    assert torch.equal(C.dequant_fp8_blocks(codes2, s2.view(torch.float8_e8m0fnu)), deq), "FP8 weight round trip"
    packed, s4 = C.quantize_fp4_packed(w[:, :64])
    deq4 = C.dequant_fp4_packed(packed, s4.view(torch.float8_e8m0fnu))
    p2, s42 = C.quantize_fp4_packed(deq4.float())
    # a block whose max rounds down to 3 re-encodes with half the scale: compare values, not codes
    assert torch.equal(C.dequant_fp4_packed(p2, s42.view(torch.float8_e8m0fnu)), deq4), "FP4 weight round trip"
    x = torch.randn(5, 64, generator=g) * 10
    q = C.act_quant_fp8(x, 32)
    for r in range(5):
        for b in range(2):
            blk = x[r, 32 * b : 32 * b + 32]
            f = float(torch.tensor(max(float(blk.abs().max()), 1e-4), dtype=torch.float32) * torch.tensor(C.FP32_INV_448))
            m, e = math.frexp(f)
            s = 2.0 ** (e - 1 if m == 0.5 else e)
            assert torch.equal(q[r, 32 * b : 32 * b + 32], (blk / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s)
    y = C.fp4_round_trip_e4m3(x, 16)
    assert torch.equal(C.fp4_round_trip_e4m3(y, 16), y), "E4M3-scaled FP4 idempotent"
    z = C.fp4_round_trip_e8m0(x, 32)
    assert torch.equal(C.fp4_round_trip_e8m0(z, 32), z)
    # float64 -> bf16 / e4m3 is one rounding: values 1e-9 (relative) either side of the midpoint
    # of two neighbours round to the nearer one (torch's own cast, through float32, lands on the
    # midpoint and goes to even for about half of them)
    for fmt, nxt_bits, rnd in ((torch.bfloat16, torch.int16, C.bf16), (torch.float8_e4m3fn, torch.int8, C.e4m3_round)):
        bits = torch.randint(0, 2 ** (torch.finfo(fmt).bits - 1) - 1, (20000,), generator=g)  # positive patterns
        lo = bits.to(nxt_bits).view(fmt).double()
        hi = (bits + 1).to(nxt_bits).view(fmt).double()  # next representable up in magnitude
        ok = torch.isfinite(lo) & torch.isfinite(hi) & (lo.abs() <= torch.finfo(fmt).max) & (hi.abs() <= torch.finfo(fmt).max)
        lo, hi = lo[ok], hi[ok]
        for rel in (-1e-9, 1e-9):
            v = (lo + hi) / 2 * (1 + rel)
            want = torch.where((v - lo).abs() < (hi - v).abs(), lo, hi)
            for sign in (1, -1):
                assert torch.equal(rnd(sign * v), sign * want), f"{fmt} rounding of float64"
    return "ok"


def check_layout(tmp):
    real = LY.check_real()
    for preset in WT.PRESETS:
        d = os.path.join(tmp, preset)
        WT.write(d, preset, 1, tokenizer=False)
        ck = C.Checkpoint(d)
        want = LY.expected_tensors(ck.config)
        got = {}
        for n in ck.names():
            t = ck.get(n)
            got[n] = (DT[t.dtype], list(t.shape))
        assert got == want, (preset, sorted(set(got) ^ set(want))[:10], [n for n in want if n in got and got[n] != want[n]][:5])
        flat = C.parse_config(json_load(os.path.join(d, "inference", "config.json")))
        hf = ck.config
        for k, v in flat.items():
            if k in ("dtype", "expert_dtype"):  # HF form: quantization_config
                continue
            assert hf.get(k) == v, (preset, k, hf.get(k), v)
    return real


def json_load(p):
    import json

    with open(p) as f:
        return json.load(f)


def check_model(tmp):
    from tokenizers import Tokenizer

    tm, n, _ = E.build_token_map(Tokenizer.from_str(E.v41_tokenizer_json(WT.V4_TOKENIZER, WT.V41_OVERLAY)))
    ck = C.Checkpoint(os.path.join(tmp, "tiny-v41-a"))
    ids = torch.randint(3, 512, (90,), generator=torch.Generator().manual_seed(7)).tolist()
    out = {}
    for num in ("fp32", "official"):
        o = M.V41Oracle(ck, tm, n, num, torch.float64)
        ref = o.forward(o.new_state(), ids)
        st = o.new_state()
        parts = [o.forward(st, ids[:11]), o.forward(st, ids[11:12]), o.forward(st, ids[12:70])]
        parts += [o.forward(st, [t]) for t in ids[70:]]
        got = torch.cat(parts)
        out[f"chunked_nmse.{num}"] = C.nmse(got, ref)
        assert out[f"chunked_nmse.{num}"] < 1e-24, out
        if num != "fp32":
            continue
        base = ref
        # Engram off
        o2 = M.V41Oracle(ck, tm, n, num, torch.float64)
        o2.hasher = None
        out["engram_effect_nmse"] = C.nmse(o2.forward(o2.new_state(), ids), base)
        # candidate pre-filter off
        o3 = M.V41Oracle(ck, tm, n, num, torch.float64)
        o3.a = dict(o3.a, candidate_source_layer=-1)
        out["prefilter_effect_nmse"] = C.nmse(o3.forward(o3.new_state(), ids), base)
        # no newest-block pin
        o4 = M.V41Oracle(ck, tm, n, num, torch.float64)
        orig = o4.select_candidate_blocks
        o4.select_candidate_blocks = lambda score, vis: orig(score, torch.full_like(vis, -10**9))
        out["pin_effect_nmse"] = C.nmse(o4.forward(o4.new_state(), ids), base)
        for k in ("engram_effect_nmse", "prefilter_effect_nmse", "pin_effect_nmse"):
            assert out[k] > 1e-6, (k, out[k])
    # Engram gate at an exactly-zero dot (an all-zero stream): sign(0) = 0, so gate = sigmoid(0) =
    # 1/2 and the stream becomes value / 2, as with the official `* dot.sign()` and in the engine.
    # fp32 numerics: official's bf16 rounding would hide sigmoid(1e-3) - 1/2 = 2.5e-4 here.
    o = M.V41Oracle(ck, tm, n, "fp32", torch.float64)
    layer = o.a["engram_layer_ids"][0]
    H0 = torch.zeros(1, o.hc, o.D, dtype=torch.float64)
    ids0 = torch.from_numpy(o.hasher.hash_ids([5, 6, 7]))[2:3, o.hasher.layer_ids.index(layer)]
    got = o.engram(layer, H0, ids0)
    rows = C.dequant_fp8_rows(*(t[ids0.reshape(-1)] for t in o.w.engram_table(layer))).to(torch.float64).reshape(1, -1)
    value = o.lin_fp8(rows, f"layers.{layer}.engram.wkv")[:, o.hc * o.D :]
    want = (0.5 * value).unsqueeze(1).expand_as(got)
    out["engram_zero_dot_max_err"] = float((got - want).abs().max())
    assert out["engram_zero_dot_max_err"] == 0.0, out
    return out


@torch.inference_mode()
def check_dspark(tmp):
    from tokenizers import Tokenizer

    tm, n, _ = E.build_token_map(Tokenizer.from_str(E.v41_tokenizer_json(WT.V4_TOKENIZER, WT.V41_OVERLAY)))
    ck = C.Checkpoint(os.path.join(tmp, "tiny-v41-a"))
    W = ck.config["window_size"]
    ids = torch.randint(3, 512, (3 * W,), generator=torch.Generator().manual_seed(11)).tolist()
    out = {}
    for num in ("fp32", "official"):
        o = M.V41Oracle(ck, tm, n, num, torch.float64)
        ref = o.new_state()
        o.forward(ref, ids)
        st = o.new_state()
        for a, b in ((0, 5), (5, 6), (6, 2 * W), (2 * W, 3 * W)):
            o.forward(st, ids[a:b])
        out[f"main_hidden_chunked_nmse.{num}"] = C.nmse(st.main_hidden, ref.main_hidden)
        one = o.new_state()
        o.dspark_seed(one, ref.main_hidden, 0)
        rows = o.new_state()
        for p in range(3 * W):
            o.dspark_seed(rows, ref.main_hidden[p : p + 1], p)
        out[f"seed_chunked_nmse.{num}"] = max(C.nmse(rows.dspark_main_x, one.dspark_main_x), C.nmse(rows.dspark_kv[0], one.dspark_kv[0]))
        for start in (W // 2, 2 * W + 3):  # ring still filling / wrapped
            base = o.dspark_draft(one, 42, start)
            o.ring_order = lambda k: torch.randperm(k, generator=torch.Generator().manual_seed(start))
            perm = o.dspark_draft(one, 42, start)
            o.ring_order = None
            out[f"ring_order_nmse.{num}.{start}"] = C.nmse(perm["logits"], base["logits"])
            kv = one.dspark_kv[0]
            if start > W:
                saved = kv[start - W - 1].clone()
                kv[start - W - 1] += 1.0
                out[f"outside_window_nmse.{num}"] = C.nmse(o.dspark_draft(one, 42, start)["logits"], base["logits"])
                kv[start - W - 1] = saved
            saved = kv[max(0, start - W)].clone()
            kv[max(0, start - W)] += 1.0
            out[f"oldest_in_window_nmse.{num}.{start}"] = C.nmse(o.dspark_draft(one, 42, start)["logits"], base["logits"])
            kv[max(0, start - W)] = saved
        row0 = o.dspark_draft(one, 42, W)["x"][0]
        o.a = dict(o.a, dspark_noise_token_id=(o.a["dspark_noise_token_id"] + 1) % 512)
        out[f"noise_token_row0_nmse.{num}"] = C.nmse(o.dspark_draft(one, 42, W)["x"][0], row0)
    for k, v in out.items():
        tight = k.startswith(("main_hidden_chunked", "seed_chunked", "ring_order", "outside_window"))
        assert (v < 1e-24) if tight else (v > 1e-8), (k, v)
    return out


def main():
    print("engram constants:", E.self_test())
    print("codecs:", check_codecs())
    with tempfile.TemporaryDirectory() as tmp:
        print("layout (real census per class):", check_layout(tmp))
        print("model:", check_model(tmp))
        print("dspark:", check_dspark(tmp))
    print("v41 oracle self-test ok")


if __name__ == "__main__":
    main()
