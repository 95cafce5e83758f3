// Short performance probes for `dsinfer doctor`: achieved device memory bandwidth and GEMM
// throughput of the kernels dsinfer runs, as shares of the device's theoretical peaks.
#pragma once

#include <string>

#include "backend/cuda/device.h"

namespace dsinfer::backend::cuda {

struct ProbeResult {
  double read_gbps = 0;         // read kernel over a large buffer (GB/s, 1e9 bytes)
  double copy_gbps = 0;         // device-to-device cudaMemcpy, read + write bytes
  double peak_gbps = 0;         // DeviceInfo::PeakMemoryGbps
  double gemm_tflops = 0;       // the generic FP8 block-scaled MatMul at gemm_shape
  double peak_fp32_tflops = 0;  // the generic path's roof (CUDA-core fp32 FMA)
  std::string gemm_shape;
  std::string gemm_path;
  // The tensor-core GEMM (ops.h TcMatMul, act quant included) at gemm_shape, per MMA (FP8: 0
  // below sm_89), against the tensor peaks (DeviceInfo::PeakTensorTflops).
  double tc_f16_tflops = 0, tc_fp8_tflops = 0;
  double peak_tensor_f16_tflops = 0, peak_tensor_fp8_tflops = 0;
  // A decode batch (16 tokens) through the tensor-core GEMM: weight bytes per second (GB/s),
  // to compare with read_gbps.
  double tc_decode16_gbps = 0;
};

// About a second on a datacenter GPU.
Result<ProbeResult> RunProbes(CudaDevice& dev);

}  // namespace dsinfer::backend::cuda
