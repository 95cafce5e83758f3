// The CUDA backend's ops over device buffers: weight upload from the mapped checkpoint and the
// generic kernels (kernels.h) with argument checks. Every call enqueues on the device's stream;
// results are ready after CudaDevice::Synchronize (or a CopyToHost).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/routing.h"
#include "model/weights.h"

namespace dsinfer::backend::cuda {

// A weight matrix copied to the device in its stored format (no dequantization at load).
struct DeviceWeight {
  DeviceBuffer data;    // as model::WeightMatrix::data
  DeviceBuffer scales;  // as model::WeightMatrix::scales (empty for f32/bf16)
  DeviceWeightView view;
  std::string name;
};

Result<DeviceWeight> UploadWeight(CudaDevice& dev, const model::WeightMatrix& w);

// y [m, w.rows] = x [m, w.cols] * W^T (device fp32 buffers).
Status MatMul(CudaDevice& dev, const DeviceWeight& w, const float* x, int64_t m, float* y);

// The official numerics' FP8 linear on tensor cores: y [m, w.rows] = ActQuantFp8(x) * W^T with
// blocks of 128, the same values as MatMul on the FP8 round trip of x (exact when x is on that
// grid already) summed in another order (kernels.h LaunchTcMatMul). Needs TcMatMulApplies(w).
Status TcMatMul(CudaDevice& dev, const DeviceWeight& w, const float* x, int64_t m, float* y,
                TcMma mma);
// Below this many tokens the decode GEMV (one read of each weight row for all tokens, 16-byte
// loads) is as fast and exact; the tensor-core path starts here.
inline constexpr int64_t kTcMinTokens = 9;
// The MMA TcMatMul uses on this device by default (docs/NUMERICS.md: the measured error of each).
TcMma DefaultTcMma(const DeviceInfo& info);
// Every MMA the tensor-core GEMMs can run on this device: fp16 always, FP8 from sm_89.
std::vector<TcMma> AvailableTcMmas(const DeviceInfo& info);

// In place over rows x n; weight: device f32 [n] or nullptr.
Status RmsNormRows(CudaDevice& dev, float* x, int64_t rows, int64_t n, const float* weight,
                   double eps, bool round_bf16);

// x: [rows, row_stride]; rotates dims [offset, offset + 2*half) of row r by positions[r] (device
// int64 [rows]); inv_freq: device f32 [half] (cpu::RopeTable::inv_freq).
Status ApplyRope(CudaDevice& dev, float* x, int64_t rows, int64_t row_stride, int64_t offset,
                 const int64_t* positions, const float* inv_freq, int half, bool inverse,
                 bool round_bf16);

// mHC pre / post (kernels.h HcShape for the layouts). dots: scratch [tokens, (2+hc)*hc + 1].
Status HcPre(CudaDevice& dev, const HcShape& s, const float* fn, const float* base,
             const float* scale, const float* H, int64_t tokens, float* dots, float* x, float* mix,
             bool round_bf16);
Status HcPost(CudaDevice& dev, const HcShape& s, const float* mix, const float* a, float* H,
              int64_t tokens, bool round_bf16);

// ---- MoE ----------------------------------------------------------------------------------------
// Router on the device (kernels.h LaunchRouter). logits [tokens, E], bias [E] or null, tid2eid
// [vocab, K] int32 or null, token_ids [tokens] int32, chosen [tokens, K] int32, weights
// [tokens, K] f32: all device pointers.
Status Route(CudaDevice& dev, const float* logits, int64_t tokens, int n_experts, int top_k,
             const float* bias, const int32_t* tid2eid, int64_t vocab, const int32_t* token_ids,
             float route_scale, int32_t* chosen, float* weights);

// The routed experts of one layer (w1, w3 or w2 of every expert: one format, one shape), with
// a device array of their views for the grouped GEMM.
struct DeviceExpertSet {
  std::vector<DeviceWeight> weights;  // [E]
  DeviceBuffer views;                 // DeviceWeightView [E]
  DeviceWeightView::Format format = DeviceWeightView::Format::kF32;
  int64_t rows = 0, cols = 0;
  bool data_16b_aligned = false;  // every expert's data (the tensor-core kernel's cp.async)
};
Result<DeviceExpertSet> UploadExperts(CudaDevice& dev,
                                      std::span<const model::WeightMatrix* const> experts);

// y [groups.slots.size(), experts.rows] (device f32): grouped row j = x[groups.tokens[j]] *
// W_e^T for the expert e whose range holds j (groups from GroupRoutedTokens on the host).
// x: device [x_rows, experts.cols]. Its index buffers are uploaded (a synchronising copy of host
// memory) and freed in stream order.
Status GroupedMatMul(CudaDevice& dev, const DeviceExpertSet& experts, const RoutedGroups& groups,
                     const float* x, int64_t x_rows, float* y);

// The same for FP4 experts on tensor cores (kernels.h LaunchTcGroupedMatMul), with x quantized
// to e4m3 codes first (the official numerics' act quant: x must already be its round trip for
// the result to match GroupedMatMul's within fp32 summation order).
bool TcGroupedApplies(const DeviceExpertSet& experts);
Status TcGroupedMatMul(CudaDevice& dev, const DeviceExpertSet& experts, const RoutedGroups& groups,
                       const float* x, int64_t x_rows, float* y, TcMma mma);

// ---- indexer and sparse attention
// ---------------------------------------------------------------- scores [tokens, max_keys]
// (device): scores[t, j] for j < n_vis[t] (host list, each <= max_keys and <= n_keys). q [tokens,
// heads, head_dim], w [tokens, heads], keys [n_keys, head_dim].
Status IndexerScores(CudaDevice& dev, const float* q, const float* w, const float* keys,
                     int64_t n_keys, std::span<const int32_t> n_vis, int heads, int head_dim,
                     int64_t max_keys, bool round_bf16, float* scores);
// idx [tokens, k] (device int32): top-k of each token's first n[t] scores (host list, each
// <= stride), ties -> lower index, ascending, -1 padded.
Status TopK(CudaDevice& dev, const float* scores, int64_t stride, std::span<const int32_t> n, int k,
            int32_t* idx);
// out [tokens, heads, head_dim] (device): sparse attention with sink over the row lists (host,
// every row < pool_rows) of the pool kv [pool_rows, head_dim].
Status SparseAttention(CudaDevice& dev, const float* q, int heads, int head_dim, const float* kv,
                       int64_t pool_rows, const SparseRowLists& lists, const float* sink,
                       float scale, bool round_bf16, float* out);

// Compressor pooling (kernels.h LaunchCompressorPool; device pointers, prev_* may be null).
Status CompressorPool(CudaDevice& dev, const float* a, const float* g, const float* ape,
                      int64_t n_groups, int ratio, int width, bool overlap, const float* prev_a,
                      const float* prev_score, float* rows);

}  // namespace dsinfer::backend::cuda
