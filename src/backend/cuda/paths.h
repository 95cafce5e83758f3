// Which kernel path of the CUDA backend applies to a compute capability, and what this binary
// was compiled for. Pure functions (no device needed), so `dsinfer doctor` and the tests can
// reason about devices they do not have.
#pragma once

#include <string>
#include <vector>

namespace dsinfer::backend::cuda {

struct KernelPaths {
  bool fp8_tensor_cores = false;  // the hardware has FP8 MMA (sm_89, sm_90, sm_100, sm_120)
  bool fp4_tensor_cores = false;  // the hardware has FP4 MMA (sm_100, sm_120)
  bool supported_arch = false;    // CUDA 13 and dsinfer target it (sm_80 and newer)
  // What dsinfer runs today on this device, per op family.
  std::string fp8_gemm;     // FP8 block-scaled linears
  std::string fp4_experts;  // routed FP4 experts
  std::string other_ops;    // norms, RoPE, mHC
  // Paths the hardware could use but this version does not implement yet (-> "degraded").
  std::vector<std::string> not_yet_used;
};

KernelPaths PathsFor(int sm_major, int sm_minor);

// The CMAKE_CUDA_ARCHITECTURES this library was compiled for ("90a", "80", ...).
std::vector<std::string> CompiledArchs();
// Whether one of them produces code that runs on sm_major.minor: an exact cubin ("90a" runs
// only on 9.0) or a cubin of the same major with a lower minor ("80" runs on 8.6, 8.9).
// PTX-only entries ("90-virtual") JIT-compile forward to any newer device.
bool CompiledFor(int sm_major, int sm_minor, const std::vector<std::string>& archs);

}  // namespace dsinfer::backend::cuda
