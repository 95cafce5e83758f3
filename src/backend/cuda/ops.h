// The CUDA backend's ops over device buffers: weight upload from the mapped checkpoint and the
// generic kernels (kernels.h) with argument checks. Every call enqueues on the device's stream;
// results are ready after CudaDevice::Synchronize (or a CopyToHost).
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/device.h"
#include "backend/cuda/kernels.h"
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

}  // namespace dsinfer::backend::cuda
