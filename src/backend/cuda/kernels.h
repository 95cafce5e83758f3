// Launch wrappers of the CUDA kernels (kernels.cu). Raw device pointers; shapes in elements.
// They only enqueue work on `stream` and return the launch status; ownership, uploads and
// synchronisation are the callers' (ops.h). Generic kernels: correct on every sm_80+ device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsinfer::backend::cuda {

// A weight matrix [rows = out, cols = in] in device memory, in the checkpoint's stored format.
struct DeviceWeightView {
  enum class Format : uint8_t { kF32, kBF16, kFp8Block, kFp4Packed };
  Format format = Format::kF32;
  const uint8_t* data = nullptr;  // f32 / bf16 [rows, cols], e4m3 [rows, cols], e2m1 [rows, cols/2]
  const uint8_t* scales = nullptr;  // FP8: [ceil(rows/128), scale_cols]; FP4: [rows, scale_cols]
  bool scales_f32 = false;          // scales are f32 powers of two instead of e8m0 codes
  int64_t rows = 0, cols = 0, scale_cols = 0;
};

// cudaFuncGetAttributes on a trivial kernel: cudaErrorNoKernelImageForDevice when this binary
// has no code for the current device.
cudaError_t ProbeKernelImageOnCurrentDevice();

// y [m, rows] = x [m, cols] * W^T, fp32 accumulation; x and y are fp32.
cudaError_t LaunchMatMul(const DeviceWeightView& w, const float* x, int64_t m, float* y,
                         cudaStream_t stream);

// Tensor-core GEMM of the official numerics (tc_gemm.cu): y [m, rows] = A * W^T with A the
// activations as e4m3 codes [m, cols] and scales [m, ceil(cols / 128)] f32 (LaunchActQuantFp8),
// W FP8 block-scaled. Exact products, fp32 accumulation across MMAs (docs/NUMERICS.md).
enum class TcMma : uint8_t {
  kF16,  // codes widened exactly to fp16, m16n8k16 MMA: sm_80+
  kFp8,  // m16n8k32 e4m3 MMA: sm_89+ only
};
// W is FP8 block-scaled with 16-byte aligned rows (cols % 16 == 0).
bool TcMatMulApplies(const DeviceWeightView& w);
// K slices for m tokens on a device of sm_count SMs (>= 1): enough blocks to fill the device.
int TcMatMulSplits(const DeviceWeightView& w, int64_t m, int sm_count);
// splits > 1 needs partial: device f32 [splits, m, rows] scratch; codes 16-byte aligned.
cudaError_t LaunchTcMatMul(TcMma mma, const DeviceWeightView& w, const uint8_t* codes,
                           const float* scales, int64_t m, int splits, float* partial, float* y,
                           cudaStream_t stream);

// Tensor-core grouped GEMM of routed FP4 experts (tc_grouped.cu): y [grouped rows, rows], grouped
// row j of tile (expert, begin, count) = A[rows_of[j]] * W_expert^T, with A e4m3 codes [*, cols]
// and scales [*, cols / 128] f32 (LaunchActQuantFp8) and the e2m1 weights widened exactly to
// e4m3 in shared memory. experts: device array of FP4 views (rows x cols each, 16-byte aligned
// data); tiles: device int32 [n_tiles, 3] with count <= kTcGroupedTileRows; rows_of: device
// int32 [grouped rows]; codes 16-byte aligned.
inline constexpr int kTcGroupedTileRows = 64;
bool TcGroupedApplies(DeviceWeightView::Format format, int64_t rows, int64_t cols);
cudaError_t LaunchTcGroupedMatMul(TcMma mma, const DeviceWeightView* experts, const int32_t* tiles,
                                  int64_t n_tiles, const int32_t* rows_of, const uint8_t* codes,
                                  const float* scales, int64_t rows, int64_t cols, float* y,
                                  cudaStream_t stream);

// In place over `rows` rows of n: x = w * x * rsqrt(mean(x^2) + eps); weight f32 [n] or null.
cudaError_t LaunchRmsNorm(float* x, int64_t rows, int64_t n, const float* weight, float eps,
                          bool round_bf16, cudaStream_t stream);

// Rotates x[r * row_stride + offset + (0..2*half)) of each row r by positions[r] (interleaved
// pairs); inv_freq f32 [half].
cudaError_t LaunchRope(float* x, int64_t rows, int64_t row_stride, int64_t offset,
                       const int64_t* positions, const float* inv_freq, int half, bool inverse,
                       bool round_bf16, cudaStream_t stream);

// mHC (spec §4) for `tokens` tokens. H: [tokens, hc, hidden] f32; fn [(2+hc)*hc, hc*hidden] f32,
// base [(2+hc)*hc], scale [3]. Outputs x [tokens, hidden] and mix [tokens, 2*hc + hc*hc]
// (pre, post, comb with comb[j*hc + k]: source j -> destination k). dots: scratch
// [tokens, (2+hc)*hc + 1] f32.
struct HcShape {
  int hc = 4;
  int64_t hidden = 0;
  int sinkhorn_iters = 20;
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
};
cudaError_t LaunchHcPre(const HcShape& s, const float* fn, const float* base, const float* scale,
                        const float* H, int64_t tokens, float* dots, float* x, float* mix,
                        bool round_bf16, cudaStream_t stream);
// H[t, k] <- post_k * a[t] + sum_j comb[j][k] * H[t, j], in place; a: [tokens, hidden].
cudaError_t LaunchHcPost(const HcShape& s, const float* mix, const float* a, float* H,
                         int64_t tokens, bool round_bf16, cudaStream_t stream);

// The head's mHC reduction (ops.cc HcHead): y [tokens, hidden] = sum_j (sigmoid(m_j * scale[0]
// + base_j) + hc_eps) * H[t, j] with m the hc mixes of fn [hc, hc*hidden]; base [hc], scale [1].
// dots: scratch [tokens, hc + 1] f32.
cudaError_t LaunchHcHead(const HcShape& s, const float* fn, const float* base, const float* scale,
                         const float* H, int64_t tokens, float* dots, float* y, bool round_bf16,
                         cudaStream_t stream);

// Performance probes: sum of n floats (reads n*4 bytes; out: [1] f32, accumulated).
cudaError_t LaunchReadProbe(const float* x, int64_t n, float* out, cudaStream_t stream);

// ---- MoE, indexer, sparse attention (spec §5.4, §5.6, §6) --------------------------------------
inline constexpr int kRouterMaxK = 16;
inline constexpr int kRouterMaxExperts = 2048;  // 12 bytes of shared memory per expert (24 KiB)
// Router of `tokens` tokens from the gate's logits [tokens, n_experts] f32: scores
// sqrt(softplus(logit)); selection by tid2eid [vocab, top_k] int32 (hash layers; token_ids
// [tokens] int32) or by top-k of score + bias [n_experts] f32 (ties -> lower id); outputs
// chosen [tokens, top_k] int32 (-1 for an out-of-range token id or table entry) and weights
// [tokens, top_k] f32 = score / sum(chosen scores) * route_scale.
cudaError_t LaunchRouter(const float* logits, int64_t tokens, int n_experts, int top_k,
                         const float* bias, const int32_t* tid2eid, int64_t vocab,
                         const int32_t* token_ids, float route_scale, int32_t* chosen,
                         float* weights, cudaStream_t stream);

// Grouped rows per grouped-GEMM tile (each weight row is read once per tile).
inline constexpr int kGroupedTileRows = 8;
// y [grouped rows, rows] f32: grouped row j of tile (expert, begin, count) = x[row_token[j]] *
// W_expert^T. experts: device array of views (one format, rows x cols each); tiles: device
// int32 [n_tiles, 3] (expert, begin, count <= kGroupedTileRows); row_token: device int32
// [grouped rows]; x [*, cols] f32.
cudaError_t LaunchGroupedMatMul(DeviceWeightView::Format format, const DeviceWeightView* experts,
                                const int32_t* tiles, int64_t n_tiles, const int32_t* row_token,
                                const float* x, int64_t rows, int64_t cols, float* y,
                                cudaStream_t stream);

// Indexer scores: q [tokens, heads, head_dim], w [tokens, heads] (already scaled), keys
// [*, head_dim] f32; scores [tokens, max_keys] f32, written for j < n_vis[t] (int32 [tokens]).
cudaError_t LaunchIndexerScores(const float* q, const float* w, const float* keys,
                                const int32_t* n_vis, int64_t tokens, int heads, int head_dim,
                                int64_t max_keys, bool round_bf16, float* scores,
                                cudaStream_t stream);

// Per token t: the k largest of scores[t * stride + (0 .. n[t])) with ties to the lower index,
// ascending, into idx [tokens, k] int32 (-1 past min(n[t], k)).
cudaError_t LaunchTopK(const float* scores, int64_t tokens, int64_t stride, const int32_t* n, int k,
                       int32_t* idx, cudaStream_t stream);

// Sparse attention with sink: q [tokens, heads, head_dim], kv pool [*, head_dim] f32, per-token
// row lists offsets [tokens + 1] / rows [offsets[tokens]] int32, sink [heads] f32; probs scratch
// [heads, total_rows = offsets[tokens]] f32; out [tokens, heads, head_dim] f32.
inline constexpr int kAttnThreads = 128;
cudaError_t LaunchSparseAttention(const float* q, int64_t tokens, int heads, int head_dim,
                                  const float* kv, const int32_t* offsets, const int32_t* rows,
                                  int64_t total_rows, const float* sink, float scale,
                                  bool round_bf16, float* probs, float* out, cudaStream_t stream);

// Compressor pooling of n_groups complete groups of `ratio` tokens: a, g [n_groups * ratio,
// width] f32 (projections wkv x and wgate x of the groups' tokens, in order), ape [ratio, width];
// rows [n_groups, d] with d = overlap ? width / 2 : width. Overlap (CSA): group j's candidates
// are group j-1's first halves (for j = 0: prev_a / prev_score [ratio, width], the compressor
// state's previous group with ape already added, or none when null) and group j's second
// halves. Norm, RoPE and the FP8 round trip that follow are the RmsNorm / Rope ops.
cudaError_t LaunchCompressorPool(const float* a, const float* g, const float* ape, int64_t n_groups,
                                 int ratio, int width, bool overlap, const float* prev_a,
                                 const float* prev_score, float* rows, cudaStream_t stream);

}  // namespace dsinfer::backend::cuda
