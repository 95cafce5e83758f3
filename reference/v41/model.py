"""Independent PyTorch oracle of the DeepSeek-V4.1 forward (spec §14 on top of §1-13), CPU.

Two numerics:
  * "fp32"      the model's math with no rounding besides the compute dtype: no bf16 rounding, no
                FP8/FP4 simulation (weights are exact dequantized values).
  * "official"  the official reference's rounding, simulated: bf16 at the points the reference
                stores bf16 tensors, FP8 act_quant (block 32, ue8m0) before every FP8/FP4 linear,
                window KV FP8 round trip over all dims (block 32), compressed KV FP4 with E4M3 scales
                per 16, indexer q/k FP4 block 32 (no Hadamard), bf16 indexer scores, bf16 attention
                probabilities before P.V.
Compute dtype `ct` is float32 or float64 (for measuring the oracle's own rounding drift).

Semantics decided where the official code is ambiguous or quirky: docs/NUMERICS.md, "V4.1 oracle
assumptions". Every top-k breaks exact ties towards the lower index.

State is kept per sequence (full history, no ring buffers), so `forward(state, ids)` accepts any
chunk: one-shot prefill, ragged chunks and one-token decode all compute the same per-position math.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

try:
    from . import common as C
    from .engram import EngramHasher
except ImportError:
    import common as C
    from engram import EngramHasher


# ----------------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------------


class Weights:
    """Exact float64 values of every tensor the text forward needs, taken from a Checkpoint, plus the
    kind of each linear (fp8 / fp4 / bf16 / fp32) that decides its numerics."""

    def __init__(self, ckpt: "C.Checkpoint"):
        self.ckpt = ckpt
        self.a = ckpt.config
        self.t = {}

    def dense(self, name: str) -> torch.Tensor:
        if name not in self.t:
            self.t[name] = self.ckpt.get(name).to(torch.float64)
        return self.t[name]

    def fp8(self, prefix: str) -> torch.Tensor:
        key = prefix + ".weight"
        if key not in self.t:
            w = self.ckpt.get(key)
            if w.dtype != torch.float8_e4m3fn:
                raise ValueError(f"{key}: expected F8_E4M3, got {w.dtype}")
            self.t[key] = C.dequant_fp8_blocks(w, self.ckpt.get(prefix + ".scale"))
        return self.t[key]

    def fp4(self, prefix: str) -> torch.Tensor:
        key = prefix + ".weight"
        if key not in self.t:
            w = self.ckpt.get(key)
            if w.dtype not in (torch.int8, torch.uint8):
                raise ValueError(f"{key}: expected I8 packed FP4, got {w.dtype}")
            self.t[key] = C.dequant_fp4_packed(w, self.ckpt.get(prefix + ".scale"))
        return self.t[key]

    def engram_table(self, layer: int):
        p = f"layers.{layer}.engram.embed"
        return self.ckpt.get(p + ".weight"), self.ckpt.get(p + ".scale")


# ----------------------------------------------------------------------------------------------
# RoPE (§9): interleaved pairs on the last rope_head_dim dims; per-layer table
# ----------------------------------------------------------------------------------------------


def rope_angles(rd: int, positions: torch.Tensor, base: float, original_seq_len: int, factor: float, beta_fast, beta_slow) -> torch.Tensor:
    """fp32 angles [len(positions), rd/2] exactly as the reference forms them (fp32 freqs, YaRN ramp
    in fp32, torch.outer of fp32 positions)."""
    freqs = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    if original_seq_len > 0:

        def corr(rot):
            return rd * math.log(original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), rd - 1)
        ramp = ((torch.arange(rd // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return torch.outer(positions.to(torch.float32), freqs)


def apply_rope(x: torch.Tensor, ang: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [n, rd] or [n, heads, rd] rotated by ang [n, rd/2]: pairs (x[2i], x[2i+1]) times e^{+-i ang},
    cos/sin of the fp32 angles evaluated in x's dtype (the reference: complex64 polar)."""
    a = ang.to(x.dtype)
    cos, sin = torch.cos(a), torch.sin(a)
    if inverse:
        sin = -sin
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    xr = x.reshape(*x.shape[:-1], -1, 2)
    re, im = xr[..., 0], xr[..., 1]
    return torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).reshape(x.shape)


# ----------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------


class SequenceState:
    """Everything a sequence carries between forward calls (full history)."""

    def __init__(self, n_layers: int):
        self.ids: list[int] = []
        self.win_kv = [None] * n_layers  # [T, head_dim] per layer, post norm/RoPE/(FP8)
        self.comp_kv = {}  # kv source -> [rows, head_dim] post RoPE/(FP4)
        self.index_k = {}  # kv source -> [rows, index_head_dim] post RoPE/(FP4)
        self.pool_a = {}  # ratio>1 kv source -> [T, head_dim] fp32/ct projections (pooling inputs)
        self.pool_g = {}
        self.main_hidden = None  # [T, n_targets * dim]: dSpark inputs of every processed position
        self.dspark_main_x = None  # [T', dim] main_x of every position fed to the dSpark rings, in order
        self.dspark_kv = {}  # stage -> [T', head_dim] the stage's ring KV of those rows (full history)


class V41Oracle:
    def __init__(self, ckpt: "C.Checkpoint", token_map: np.ndarray, n_classes: int, numerics: str = "fp32", dtype=torch.float32):
        if numerics not in ("fp32", "official"):
            raise ValueError(numerics)
        self.a = a = ckpt.config
        self.w = Weights(ckpt)
        self.numerics = numerics
        self.official = numerics == "official"
        self.ct = dtype
        self.hasher = EngramHasher(a, token_map, n_classes) if a["engram_layer_ids"] else None
        self.n_layers = a["n_layers"]
        self.hc = a["hc_mult"]
        self.D = a["dim"]
        self.hd = a["head_dim"]
        self.rd = a["rope_head_dim"]
        self.eps = a["norm_eps"]
        self.stats = {"topk_ties_broken": 0, "candidate_rows_pruned": 0, "index_queries": 0}
        self.trace = None  # optional dict for debugging taps
        self.ring_order = None  # optional n -> permutation of the dSpark ring rows (self-check hook)

    # -- numerics helpers -------------------------------------------------------------------
    def bf(self, x):
        return C.bf16(x) if self.official else x

    def W(self, name):
        return self.w.dense(name).to(self.ct)

    def lin_fp8(self, x, prefix):
        w = self.w.fp8(prefix).to(self.ct)
        if self.official:
            x = C.act_quant_fp8(x, 32)
        return self.bf(x @ w.T)

    def lin_fp4(self, x, prefix):
        w = self.w.fp4(prefix).to(self.ct)
        if self.official:
            x = C.act_quant_fp8(x, 32)
        return self.bf(x @ w.T)

    def lin_bf16(self, x, name):
        return self.bf(x @ self.W(name).T)

    def rmsnorm(self, x, name):
        w = self.W(name)
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps)
        return self.bf(w * y)

    # -- mHC (§4, §14.4) --------------------------------------------------------------------
    def hc_mixes(self, H, prefix, layer):
        n = H.shape[0]
        v = H.reshape(n, -1)
        r = torch.rsqrt((v * v).mean(-1, keepdim=True) + self.eps)
        lp = self.lp(layer)
        m = (v @ self.W(f"{lp}.hc_{prefix}_fn").T) * r
        scale = self.W(f"{lp}.hc_{prefix}_scale")
        base = self.W(f"{lp}.hc_{prefix}_base")
        hc, heps = self.hc, self.a["hc_eps"]
        pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + heps
        post = 2 * torch.sigmoid(m[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
        comb = (m[:, 2 * hc :] * scale[2] + base[2 * hc :]).reshape(n, hc, hc)
        comb = torch.softmax(comb, dim=-1) + heps
        comb = comb / (comb.sum(-2, keepdim=True) + heps)
        for _ in range(self.a["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + heps)
            comb = comb / (comb.sum(-2, keepdim=True) + heps)
        return pre, post, comb

    def hc_pre(self, H, pre):
        return self.bf((pre.unsqueeze(-1) * H).sum(1))

    def hc_post(self, x, H, post, comb):
        # out_k = post_k * x + sum_j comb[j, k] * H_j
        return self.bf(post.unsqueeze(-1) * x.unsqueeze(1) + torch.einsum("njk,njd->nkd", comb, H))

    # -- rope tables --------------------------------------------------------------------------
    def ratio(self, layer):
        r = self.a["compress_ratios"]
        return r[layer] if layer < len(r) else 0  # dSpark stages (ids n_layers + s) are window-only

    def lp(self, layer):
        """Tensor prefix of block `layer`: backbone `layers.L`, dSpark stage s = layer - n_layers `mtp.s`."""
        return f"layers.{layer}" if layer < self.n_layers else f"mtp.{layer - self.n_layers}"

    def angles(self, layer, positions):
        a = self.a
        if self.ratio(layer):
            return rope_angles(self.rd, positions, a["compress_rope_theta"], a["original_seq_len"], a["rope_factor"], a["beta_fast"], a["beta_slow"])
        return rope_angles(self.rd, positions, a["rope_theta"], 0, 1.0, 32, 1)

    def rope_tail(self, x, ang, inverse=False):
        head, tail = x[..., : -self.rd], x[..., -self.rd :]
        return torch.cat([head, self.bf(apply_rope(tail, ang, inverse))], dim=-1)

    # -- top-k with the lower-index tie-break ---------------------------------------------------
    def topk_rows(self, scores, k_per_row):
        """scores [n, T] with -inf = not selectable (+inf = pinned, always selectable). Returns a
        list of ascending index tensors: per row the min(k, #selectable) highest scores, equal
        scores taken lower index first. A pinned (+inf) entry counts as selectable: counting only
        finite scores would drop the lowest block of the candidate pre-filter even when every
        reachable block fits the budget (SGLang's V4.1 candidate tests keep them all)."""
        order = torch.sort(-scores, dim=-1, stable=True).indices
        out = []
        for i in range(scores.shape[0]):
            selectable = int((scores[i] > float("-inf")).sum())
            k = min(k_per_row, selectable)
            sel = order[i, :k]
            if k and k < selectable:
                kth = scores[i, sel[-1]]
                if bool((scores[i] == kth).sum() > (scores[i, sel] == kth).sum()):
                    self.stats["topk_ties_broken"] += 1
            out.append(torch.sort(sel).values)
        return out

    # -- attention (§5, §14.2-14.3) -----------------------------------------------------------
    def compressor_rows(self, st, layer, x, pos):
        """New pre-RoPE latents completed by this chunk: list of (row index j, latent [hd])."""
        ratio = self.a["compress_ratios"][layer]
        p = f"layers.{layer}.attn.compressor"
        if ratio == 1:
            lat = self.rmsnorm(self.lin_bf16(x, p + ".wkv.weight"), p + ".norm.weight")
            return [(int(q), lat[i]) for i, q in enumerate(pos.tolist())]
        a_new = x @ self.W(p + ".wkv.weight").T  # fp32 in the reference (x.float() @ fp32 weights)
        g_new = x @ self.W(p + ".wgate.weight").T
        st.pool_a[layer] = a_new if st.pool_a.get(layer) is None else torch.cat([st.pool_a[layer], a_new])
        st.pool_g[layer] = g_new if st.pool_g.get(layer) is None else torch.cat([st.pool_g[layer], g_new])
        rows = []
        for q in pos.tolist():
            if (q + 1) % ratio == 0:
                j = (q + 1) // ratio - 1
                A, G = st.pool_a[layer][j * ratio : (j + 1) * ratio], st.pool_g[layer][j * ratio : (j + 1) * ratio]
                pooled = (A * torch.softmax(G, dim=0)).sum(0)
                rows.append((j, self.rmsnorm(self.bf(pooled), p + ".norm.weight")))
        return rows

    def attention(self, st, layer, x, pos):
        a, o = self.a, self.official
        n, Hn, hd, rd = x.shape[0], a["n_heads"], self.hd, self.rd
        pre = f"layers.{layer}.attn"
        ratio = a["compress_ratios"][layer]
        ang = self.angles(layer, pos)
        qr = self.rmsnorm(self.lin_fp8(x, pre + ".wq_a"), pre + ".q_norm.weight")
        q = self.lin_fp8(qr, pre + ".wq_b").reshape(n, Hn, hd)
        q = self.rope_tail(q, ang)  # V4.1: no per-head RMS rescale of q
        kv = self.rmsnorm(self.lin_fp8(x, pre + ".wkv"), pre + ".kv_norm.weight")
        kv = self.rope_tail(kv, ang)
        if o:
            kv = C.act_quant_fp8(kv, 32)  # FP8 round trip over all head_dim dims, RoPE tail included
        st.win_kv[layer] = kv if st.win_kv[layer] is None else torch.cat([st.win_kv[layer], kv])
        T = st.win_kv[layer].shape[0]
        W = a["window_size"]
        kpos = torch.arange(T)
        win_mask = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - W)  # [n, T]
        keys = [st.win_kv[layer]]
        masks = [win_mask]
        if ratio:
            src = C.kv_source_of(a, layer)
            isrc = C.index_source_of(a, layer)
            new_rows = self.compressor_rows(st, layer, x, pos) if layer == src else []
            if layer == isrc:
                sel = self.indexer(st, layer, x, qr, pos, new_rows)
                st.shared_topk = sel
            else:
                sel = st.shared_topk  # reuse what the latest index source published this forward
            if new_rows:
                js = [j for j, _ in new_rows]
                lat = torch.stack([r for _, r in new_rows])
                lat = self.rope_tail(lat, self.angles(layer, torch.tensor(js) * ratio))
                if o:
                    lat = C.fp4_round_trip_e4m3(lat, 16)
                prev = st.comp_kv.get(layer)
                assert (0 if prev is None else prev.shape[0]) == js[0]
                st.comp_kv[layer] = lat if prev is None else torch.cat([prev, lat])
            comp = st.comp_kv.get(src)
            if comp is not None and comp.shape[0]:
                cmask = torch.zeros(n, comp.shape[0], dtype=torch.bool)
                for i, s in enumerate(sel):
                    cmask[i, s] = True
                keys.append(comp)
                masks.append(cmask)
        K = torch.cat(keys)
        M = torch.cat(masks, dim=1)
        out = self.sparse_attn(q, K, M, self.W(pre + ".attn_sink"))
        return self.attn_out(out, ang, pre)

    def attn_out(self, out, ang, pre):
        """Inverse RoPE on the attention output, grouped wo_a, wo_b."""
        a, n = self.a, out.shape[0]
        out = self.rope_tail(out, ang, inverse=True)
        G = a["o_groups"]
        wo_a = self.w.fp8(pre + ".wo_a").to(self.ct)  # stored FP8; the reference runs it as bf16 (exact)
        wo_a = wo_a.reshape(G, a["o_lora_rank"], -1)
        z = self.bf(torch.einsum("ngd,grd->ngr", out.reshape(n, G, -1), wo_a))
        return self.lin_fp8(z.reshape(n, -1), pre + ".wo_b")

    def sparse_attn(self, q, K, M, sink):
        """q [n, H, hd], K [T, hd] (K = V), M [n, T] bool. Sink adds exp(sink - m) to the denominator."""
        scale = self.hd**-0.5
        logits = torch.einsum("nhd,td->nht", q, K) * scale
        logits = logits.masked_fill(~M[:, None, :], float("-inf"))
        m = logits.amax(-1, keepdim=True)
        p = torch.exp(logits - m)
        denom = p.sum(-1, keepdim=True) + torch.exp(sink[None, :, None] - m)
        if self.official:
            p = C.bf16(p)  # probabilities cast to bf16 before P.V (fp32 accumulation)
        return self.bf(torch.einsum("nht,td->nhd", p, K) / denom)

    def indexer(self, st, layer, x, qr, pos, new_rows):
        a, o = self.a, self.official
        ratio = a["compress_ratios"][layer]
        p = f"layers.{layer}.attn.indexer"
        Hi, Di = a["index_n_heads"], a["index_head_dim"]
        n = x.shape[0]
        if layer in a["kv_source_layers"] and new_rows:
            js = [j for j, _ in new_rows]
            lat = torch.stack([r for _, r in new_rows])
            k = self.rmsnorm(self.lin_bf16(lat, p + ".wk.weight"), p + ".k_norm.weight")
            k = self.rope_tail(k, self.angles(layer, torch.tensor(js) * ratio))
            if o:
                k = C.fp4_round_trip_e8m0(k, 32)
            prev = st.index_k.get(layer)
            st.index_k[layer] = k if prev is None else torch.cat([prev, k])
        owner = C.kv_source_of(a, layer)  # the index keys come from the latest kv source
        kc = st.index_k.get(owner)
        end = int(pos[-1]) + 1
        n_rows = end // ratio
        if n_rows == 0 or kc is None:
            return [torch.empty(0, dtype=torch.long) for _ in range(n)]
        kc = kc[:n_rows]
        qi = self.lin_fp8(qr, p + ".wq_b").reshape(n, Hi, Di)
        qi = self.rope_tail(qi, self.angles(layer, pos))
        if o:
            qi = C.fp4_round_trip_e8m0(qi, 32)
        w = self.bf(self.lin_bf16(x, p + ".weights_proj.weight") * (Di**-0.5 * Hi**-0.5))  # [n, Hi]
        s = self.bf(torch.einsum("nhd,td->nht", qi, kc))
        s = self.bf(torch.relu(s) * w[:, :, None])
        score = self.bf(s.sum(1))  # [n, T]
        vis = (pos + 1) // ratio  # rows j < vis[i] are visible to query i
        rows = torch.arange(n_rows)
        score = score.masked_fill(rows[None, :] >= vis[:, None], float("-inf"))
        self.stats["index_queries"] += n
        cs = a["candidate_source_layer"]
        if cs >= 0 and layer == cs:
            st.candidates = self.select_candidate_blocks(score, vis)
        elif 0 <= cs < layer:
            cand = st.candidates
            if cand.shape[1] < n_rows:  # defensive: candidates were computed this forward for these queries
                raise RuntimeError("candidate mask narrower than the index scores")
            before = torch.isfinite(score).sum()
            score = score.masked_fill(~cand[:, :n_rows], float("-inf"))
            self.stats["candidate_rows_pruned"] += int(before - torch.isfinite(score).sum())
        return self.topk_rows(score, a["index_topk"])

    def select_candidate_blocks(self, score, vis):
        """Level one (§14.3): block score = max over its bs positions; the block holding the query's
        newest visible position is pinned; keep the top candidate_topk_blocks blocks (lower block
        index first on ties); unreachable (-inf) blocks are never kept. Returns bool [n, T]."""
        a = self.a
        bs, kb = a["candidate_block_size"], a["candidate_topk_blocks"]
        n, T = score.shape
        nb = -(-T // bs)
        padded = torch.full((n, nb * bs), float("-inf"), dtype=score.dtype)
        padded[:, :T] = score
        blocks = padded.reshape(n, nb, bs).amax(-1)
        last = torch.div(vis - 1, bs, rounding_mode="floor")
        blocks = blocks.masked_fill(torch.arange(nb)[None, :] == last[:, None], float("inf"))
        keep = torch.zeros(n, nb, dtype=torch.bool)
        for i, sel in enumerate(self.topk_rows(blocks, kb)):
            keep[i, sel] = True
        return keep.repeat_interleave(bs, dim=1)[:, :T]

    # -- MoE (§6, §14.6) --------------------------------------------------------------------------
    def expert(self, x, prefix, fp4, weight=None):
        lin = self.lin_fp4 if fp4 else self.lin_fp8
        g = lin(x, prefix + ".w1")
        u = lin(x, prefix + ".w3")
        lim = self.a["swiglu_limit"]
        if lim > 0:
            u = u.clamp(-lim, lim)
            g = g.clamp(max=lim)
        h = F.silu(g) * u
        if weight is not None:
            h = weight * h
        return lin(self.bf(h), prefix + ".w2")

    def moe(self, layer, x):
        a = self.a
        p = f"{self.lp(layer)}.ffn"
        n_exp, k = a["n_routed_experts"], a["n_activated_experts"]
        if layer >= self.n_layers:  # dSpark stages have their own expert bank (official get_moe_config)
            n_exp, k = a.get("dspark_n_routed_experts") or n_exp, a.get("dspark_n_activated_experts") or k
        scores = (x @ self.W(p + ".gate.weight").T) / a["gate_temp"]
        if a["score_func"] == "sqrtsoftplus":
            scores = F.softplus(scores).sqrt()
        elif a["score_func"] == "sigmoid":
            scores = scores.sigmoid()
        else:
            scores = scores.softmax(-1)
        biased = scores + self.W(p + ".gate.bias")
        idx = torch.stack(self.topk_rows(biased, k)) if x.shape[0] else torch.empty(0, k, dtype=torch.long)
        # topk_rows returns ascending indices; selection is the top-k set, order irrelevant for the sum
        wts = scores.gather(1, idx)
        if a["norm_topk_prob"] and k > 1:
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * a["route_scale"]
        y = torch.zeros_like(x)
        for e in range(n_exp):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            y[tok] += self.expert(x[tok], f"{p}.experts.{e}", True, wts[tok, slot, None])
        y = y + self.expert(x, p + ".shared_experts", False)
        return self.bf(y)

    # -- Engram (§14.5) ------------------------------------------------------------------------
    def engram(self, layer, H, hash_ids):
        """H [n, hc, D]; hash_ids [n, cols] (rows of this layer's table)."""
        D, hc = self.D, self.hc
        wt, sc = self.w.engram_table(layer)
        rows = C.dequant_fp8_rows(wt[hash_ids.reshape(-1)], sc[hash_ids.reshape(-1)])
        rows = rows.to(self.ct).reshape(H.shape[0], -1)  # exact in bf16
        kv = self.lin_fp8(rows, f"layers.{layer}.engram.wkv")
        key = kv[:, : hc * D].reshape(-1, hc, D)
        value = kv[:, hc * D :]
        wqk = self.W(f"layers.{layer}.engram.q_weight") * self.W(f"layers.{layer}.engram.k_weight")
        rstd = torch.rsqrt((H * H).mean(-1) + self.eps) * torch.rsqrt((key * key).mean(-1) + self.eps)
        dot = (H * wqk * key).sum(-1) * rstd * D**-0.5
        # sign(dot), not copysign: an exactly-zero dot gives gate sigmoid(0) = 0.5 as in the official
        # `dot.abs().clamp_min(1e-6).sqrt() * dot.sign()` (copysign would give sigmoid(+-1e-3))
        gate = torch.sigmoid(dot.abs().clamp_min(1e-6).sqrt() * torch.sign(dot))
        return self.bf(H + gate.unsqueeze(-1) * value.unsqueeze(1))

    # -- one block (backbone layer or dSpark stage) ------------------------------------------------
    def block(self, layer, H, pre_mix, attn):
        """Single-pass mHC block: attention between hc_pre(pre_mix) and hc_post, then the FFN with the
        attention's own pre mix. Returns the new stream and the pre mix for the next block."""
        lp = self.lp(layer)
        attn_pre, attn_post, attn_comb = self.hc_mixes(H, "attn", layer)
        x = self.rmsnorm(self.hc_pre(H, pre_mix), f"{lp}.attn_norm.weight")
        H = self.hc_post(attn(x), H, attn_post, attn_comb)
        ffn_pre, ffn_post, ffn_comb = self.hc_mixes(H, "ffn", layer)
        x = self.rmsnorm(self.hc_pre(H, attn_pre), f"{lp}.ffn_norm.weight")
        H = self.hc_post(self.moe(layer, x), H, ffn_post, ffn_comb)
        return H, ffn_pre

    # -- forward ---------------------------------------------------------------------------------
    def new_state(self):
        return SequenceState(self.n_layers)

    @torch.inference_mode()
    def forward(self, st: SequenceState, ids, all_logits: bool = True) -> torch.Tensor:
        """Process `ids` appended to the sequence in `st`. Returns logits [len(ids), vocab] in ct
        (or only the last row when all_logits is False)."""
        a = self.a
        start = len(st.ids)
        st.ids.extend(int(t) for t in ids)
        n = len(ids)
        pos = torch.arange(start, start + n)
        hashes = None
        if self.hasher is not None:
            hashes = torch.from_numpy(self.hasher.hash_ids(st.ids)[start:])  # [n, n_layers, cols]
        h = self.W("embed.weight")[torch.tensor(list(ids), dtype=torch.long)]
        H = h.unsqueeze(1).repeat(1, self.hc, 1)
        pre_mix = torch.zeros(n, self.hc, dtype=self.ct)
        pre_mix[:, 0] = 1.0
        st.shared_topk = None
        targets = set(a.get("dspark_target_layer_ids") or []) if a.get("dspark_block_size") else set()
        hidden = []
        for layer in range(self.n_layers):
            if self.hasher is not None and layer in self.hasher.layer_ids:
                H = self.engram(layer, H, hashes[:, self.hasher.layer_ids.index(layer)])
            if layer in targets:
                # dSpark reads the stream ENTERING a target layer (after its Engram), averaged over
                # the hc copies; concatenated in layer order (the official loop order)
                hidden.append(self.bf(H.mean(1)))
            H, pre_mix = self.block(layer, H, pre_mix, lambda x, layer=layer: self.attention(st, layer, x, pos))
            if self.trace is not None:
                self.trace.setdefault(layer, []).append(H.clone())
        if hidden:
            mh = torch.cat(hidden, dim=-1)
            st.main_hidden = mh if st.main_hidden is None else torch.cat([st.main_hidden, mh])
        x = self.rmsnorm(self.hc_pre(H, pre_mix), "norm.weight")
        if not all_logits:
            x = x[-1:]
        return x @ self.W("head.weight").T

    # -- dSpark draft head (V4.1 speculative decoding, tensors mtp.{s}.*) ---------------------------
    # The official code keeps, per stage, a ring of window_size slots of KV made from main_x (one
    # row per committed position, RoPE at that position) and drafts block_size rows after the newest
    # committed position. Here the full history is kept and a draft takes the newest window_size
    # rows before its start: any chunking of the seeding gives the same rows, and the draft's
    # attention is a set operation over them (slot order cannot matter).

    def n_stages(self):
        a = self.a
        return a["n_mtp_layers"] if a.get("dspark_block_size") else 0

    def dspark_main_x(self, main_hidden):
        """main_x = main_norm(main_proj(main_hidden)) (stage 0's tensors; FP8 linear)."""
        mh = self.bf(main_hidden.to(self.ct))
        return self.rmsnorm(self.lin_fp8(mh, "mtp.0.main_proj"), "mtp.0.main_norm.weight")

    def dspark_ring_kv(self, stage, main_x, pos):
        """A stage's ring KV of main_x rows: kv_norm(wkv(.)), RoPE at their positions, FP8 round trip."""
        layer = self.n_layers + stage
        pre = f"mtp.{stage}.attn"
        kv = self.rmsnorm(self.lin_fp8(main_x, pre + ".wkv"), pre + ".kv_norm.weight")
        kv = self.rope_tail(kv, self.angles(layer, pos))
        return C.act_quant_fp8(kv, 32) if self.official else kv

    @torch.inference_mode()
    def dspark_seed(self, st: SequenceState, main_hidden_rows, first_pos: int) -> torch.Tensor:
        """Feed the rings with the main_hidden rows of positions first_pos.. (must continue exactly
        where the previous seeding stopped). Returns their main_x rows."""
        if not self.n_stages():
            raise ValueError("checkpoint has no dSpark stages (dspark_block_size 0 or no mtp layers)")
        have = 0 if st.dspark_main_x is None else st.dspark_main_x.shape[0]
        if first_pos != have:
            raise ValueError(f"dspark_seed: rings hold positions 0..{have - 1}, got rows from {first_pos}")
        n = main_hidden_rows.shape[0]
        mx = self.dspark_main_x(main_hidden_rows)
        pos = torch.arange(first_pos, first_pos + n)
        for s in range(self.n_stages()):
            kv = self.dspark_ring_kv(s, mx, pos)
            prev = st.dspark_kv.get(s)
            st.dspark_kv[s] = kv if prev is None else torch.cat([prev, kv])
        st.dspark_main_x = mx if st.dspark_main_x is None else torch.cat([st.dspark_main_x, mx])
        return mx

    def dspark_attention(self, st, stage, x, pos, start):
        """Window-only attention of the B block rows (positions start..start+B-1): every row sees the
        ring (positions max(0, start-W)..start-1) and ALL block rows (non-causal), with the sink.
        The block rows' own KV is never stored."""
        a = self.a
        layer = self.n_layers + stage
        pre = f"mtp.{stage}.attn"
        n, Hn = x.shape[0], a["n_heads"]
        ang = self.angles(layer, pos)
        qr = self.rmsnorm(self.lin_fp8(x, pre + ".wq_a"), pre + ".q_norm.weight")
        q = self.rope_tail(self.lin_fp8(qr, pre + ".wq_b").reshape(n, Hn, self.hd), ang)
        kv = self.rmsnorm(self.lin_fp8(x, pre + ".wkv"), pre + ".kv_norm.weight")
        kv = self.rope_tail(kv, ang)
        if self.official:
            kv = C.act_quant_fp8(kv, 32)
        ring = st.dspark_kv[stage][max(0, start - a["window_size"]) : start]
        if self.ring_order is not None:  # self-check hook: present the ring slots in another order
            ring = ring[self.ring_order(ring.shape[0])]
        K = torch.cat([ring, kv])
        M = torch.ones(n, K.shape[0], dtype=torch.bool)
        out = self.sparse_attn(q, K, M, self.W(pre + ".attn_sink"))
        return self.attn_out(out, ang, pre)

    @torch.inference_mode()
    def dspark_draft(self, st: SequenceState, token: int, start: int, temperature: float = 0.0, generator=None) -> dict:
        """Draft block_size tokens after the pending `token` at position `start` (the backbone holds
        positions 0..start-1 and the rings were fed all of them). Equals the official
        forward_spec(token, main_hidden of start-1, start-1). Returns ids [B] (output_ids[1..B]),
        logits [B, vocab] with the Markov bias, x [B, dim] (hc_pre output, pre-norm), confidence [B]."""
        a = self.a
        S, B = self.n_stages(), a["dspark_block_size"]
        if not S:
            raise ValueError("checkpoint has no dSpark stages")
        have = 0 if st.dspark_main_x is None else st.dspark_main_x.shape[0]
        if not 1 <= start <= have:
            raise ValueError(f"dspark_draft at {start}: the rings hold positions 0..{have - 1} (need 1 <= start <= {have})")
        ids = [int(token)] + [a["dspark_noise_token_id"]] * (B - 1)
        pos = torch.arange(start, start + B)
        H = self.W("embed.weight")[torch.tensor(ids)].unsqueeze(1).repeat(1, self.hc, 1)
        pre_mix = torch.zeros(B, self.hc, dtype=self.ct)
        pre_mix[:, 0] = 1.0
        for s in range(S):
            H, pre_mix = self.block(self.n_layers + s, H, pre_mix, lambda x, s=s: self.dspark_attention(st, s, x, pos, start))
        last = f"mtp.{S - 1}"
        x = self.hc_pre(H, pre_mix)
        logits = self.rmsnorm(x, last + ".norm.weight") @ self.W("head.weight").T  # main head, fp32 linear
        m_embed = self.W(last + ".markov_head.embed.weight")  # [vocab, rank], bf16 values
        m_head = self.W(last + ".markov_head.head.weight")  # [vocab, rank], run as an fp32 linear
        out, embeds = [int(token)], []
        for i in range(B):
            e = m_embed[out[i]]
            logits[i] = logits[i] + e @ m_head.T
            embeds.append(e)
            out.append(self.sample(logits[i], temperature, generator))
        conf = torch.cat([x, torch.stack(embeds)], dim=-1) @ self.W(last + ".confidence_head.proj.weight").T
        return {"ids": torch.tensor(out[1:], dtype=torch.long), "logits": logits, "x": x, "confidence": conf.squeeze(-1)}

    @staticmethod
    def sample(logits, temperature, generator=None):
        """Temperature 0: argmax, lower id on an exact tie. Otherwise the official Gumbel-max form
        (softmax(l / T) / Exp(1), argmax) with draws from `generator`."""
        if temperature == 0:
            return int(torch.sort(-logits, stable=True).indices[0])
        p = torch.softmax(logits.float() / max(temperature, 1e-5), dim=-1)
        e = torch.empty_like(p).exponential_(1, generator=generator)
        return int((p / e).argmax())
