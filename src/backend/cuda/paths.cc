#include "backend/cuda/paths.h"

#include <sstream>

namespace dsinfer::backend::cuda {

KernelPaths PathsFor(int sm_major, int sm_minor) {
  KernelPaths p;
  const int sm = sm_major * 10 + sm_minor;
  p.supported_arch = sm >= 80;
  p.fp8_tensor_cores = sm == 89 || sm_major >= 9;
  p.fp4_tensor_cores = sm_major == 10 || sm_major == 12;
  if (!p.supported_arch) {
    p.fp8_gemm = p.fp4_experts = p.other_ops =
        "none (sm_" + std::to_string(sm) + " is below sm_80, which CUDA 13 builds need)";
    return p;
  }
  // FP8 linears of the official numerics (activations quantized to e4m3 in front of them): the
  // tensor-core GEMM for 9+ tokens on every sm_80+ device, with the codes widened exactly to
  // fp16 (tc_gemm.cu; the FP8 MMA is built and conformance-checked but adds with fewer bits:
  // docs/NUMERICS.md). Decode batches of <= 8 tokens read each weight row once in a GEMV.
  p.fp8_gemm =
      "official numerics: tensor cores for 9+ tokens (e4m3 codes widened exactly to fp16, "
      "mma.sync m16n8k16, fp32 accumulation), 16-byte-load GEMV for <= 8 tokens; fp32-reference "
      "numerics: generic dequantizing kernels (fp32 FMA)";
  p.fp4_experts =
      "generic FP4 grouped GEMV / GEMM over routed tokens (fp32 FMA); a tensor-core grouped GEMM "
      "(e2m1 widened exactly to e4m3 in shared memory, 64-row tiles) is built and tested "
      "(test_cuda) but not the default until measured (gpu_model_bench --expert-gemm)";
  p.other_ops =
      "generic fp32 kernels: RMSNorm, RoPE, mHC, router, compressor pooling, indexer scores + "
      "top-k, sparse attention with sink";
  if (sm_major == 9) p.not_yet_used.push_back("FP8 wgmma tensor cores (sm_90a)");
  if (sm_major == 10) p.not_yet_used.push_back("tcgen05 FP8/FP4 tensor cores (sm_100a)");
  if (sm_major == 12) p.not_yet_used.push_back("FP4 mma.sync tensor cores (sm_120a)");
  p.not_yet_used.push_back(
      "routed FP4 experts on tensor cores by default (the mma.sync grouped GEMM awaits a "
      "measurement; native FP4 on sm_100 / sm_120)");
  return p;
}

std::vector<std::string> CompiledArchs() {
  std::vector<std::string> out;
#ifdef DSINFER_CUDA_ARCHS
  std::stringstream ss(DSINFER_CUDA_ARCHS);
  std::string a;
  while (std::getline(ss, a, ','))
    if (!a.empty()) out.push_back(a);
#endif
  return out;
}

bool CompiledFor(int sm_major, int sm_minor, const std::vector<std::string>& archs) {
  const int sm = sm_major * 10 + sm_minor;
  for (const std::string& a : archs) {
    std::string digits;
    for (char c : a) {
      if (c < '0' || c > '9') break;
      digits += c;
    }
    if (digits.empty()) continue;
    const int target = std::stoi(digits);
    const bool arch_specific = a.size() > digits.size() && a[digits.size()] == 'a';
    const bool virtual_only = a.find("-virtual") != std::string::npos;
    const bool has_ptx = virtual_only || a.find("-real") == std::string::npos;
    if (arch_specific) {
      if (target == sm) return true;
      continue;
    }
    if (target / 10 == sm_major && target <= sm && !virtual_only) return true;
    if (has_ptx && target <= sm) return true;  // PTX JIT-compiles forward
  }
  return false;
}

}  // namespace dsinfer::backend::cuda
