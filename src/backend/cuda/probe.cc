#include "backend/cuda/probe.h"

#include <algorithm>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/ops.h"

namespace dsinfer::backend::cuda {

namespace {

// Times `fn` (enqueueing work on the stream) over `repeats` runs after one warm-up; best run.
template <typename Fn>
Result<double> BestSeconds(CudaDevice& dev, int repeats, Fn fn) {
  cudaEvent_t start, stop;
  DSINFER_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  DSINFER_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&stop), "cudaEventCreate"));
  double best = 1e30;
  Status st = fn();
  for (int i = 0; i < repeats && st.ok(); ++i) {
    cudaEventRecord(start, dev.stream());
    st = fn();
    cudaEventRecord(stop, dev.stream());
    if (!st.ok()) break;
    st = CudaStatus(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = std::min(best, ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!st.ok()) return st;
  return best;
}

}  // namespace

Result<ProbeResult> RunProbes(CudaDevice& dev) {
  ProbeResult p;
  const DeviceInfo& info = dev.info();
  p.peak_gbps = info.PeakMemoryGbps();
  p.peak_fp32_tflops = info.PeakFp32Tflops();
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  // Bandwidth: 1 GiB (or a quarter of free memory), far beyond any L2.
  size_t bytes = size_t{1} << 30;
  if (info.free_bytes > 0) bytes = std::min(bytes, static_cast<size_t>(info.free_bytes / 4));
  bytes &= ~size_t{4095};
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer buf, dev.Alloc(bytes));
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer sum, dev.Alloc(4));
  DSINFER_RETURN_IF_ERROR(dev.Memset(buf.data(), 0, bytes));
  DSINFER_RETURN_IF_ERROR(dev.Memset(sum.data(), 0, 4));
  const int64_t n = static_cast<int64_t>(bytes / 4);
  DSINFER_ASSIGN_OR_RETURN(double read_s, BestSeconds(dev, 5, [&] {
                             return CudaStatus(
                                 LaunchReadProbe(buf.as<float>(), n, sum.as<float>(), dev.stream()),
                                 "read probe");
                           }));
  p.read_gbps = bytes / read_s / 1e9;
  const size_t half = bytes / 2;
  DSINFER_ASSIGN_OR_RETURN(double copy_s, BestSeconds(dev, 5, [&] {
                             return CudaStatus(
                                 cudaMemcpyAsync(buf.as<uint8_t>() + half, buf.data(), half,
                                                 cudaMemcpyDeviceToDevice, dev.stream()),
                                 "copy probe");
                           }));
  p.copy_gbps = 2.0 * half / copy_s / 1e9;
  // GEMM: a checkpoint-sized FP8 block-scaled matrix (wo_b-like 4096 x 4096) at a prefill batch.
  const int64_t rows = 4096, cols = 4096, m = 512;
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));  // [rows, cols] e4m3
  for (auto& c : codes) c = static_cast<uint8_t>(rng() % 0x7e);
  std::vector<uint8_t> scales(static_cast<size_t>((rows / 128) * (cols / 128)), 120);
  model::WeightMatrix w;
  w.format = model::WeightFormat::kFp8Block;
  w.data = codes.data();
  w.scales = scales.data();
  w.rows = rows;
  w.cols = cols;
  w.scale_cols = cols / 128;
  w.name = "probe.fp8";
  DSINFER_ASSIGN_OR_RETURN(DeviceWeight dw, UploadWeight(dev, w));
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer x, dev.Alloc(static_cast<size_t>(m * cols) * 4));
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer y, dev.Alloc(static_cast<size_t>(m * rows) * 4));
  DSINFER_RETURN_IF_ERROR(dev.Memset(x.data(), 0, x.bytes()));
  DSINFER_ASSIGN_OR_RETURN(double gemm_s, BestSeconds(dev, 5, [&] {
                             return MatMul(dev, dw, x.as<float>(), m, y.as<float>());
                           }));
  p.gemm_tflops = 2.0 * m * rows * cols / gemm_s / 1e12;
  p.gemm_shape = "fp8 block-scaled m=512 n=4096 k=4096";
  p.gemm_path = "generic dequantizing GEMM (fp32 FMA)";
  // Tensor cores: random activations (the act quant runs inside, as in the model).
  std::vector<float> xs(static_cast<size_t>(m * cols));  // [m, cols]
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : xs) v = normal(rng);
  DSINFER_RETURN_IF_ERROR(dev.CopyToDevice(x.data(), xs.data(), xs.size() * 4));
  p.peak_tensor_f16_tflops = info.PeakTensorTflops(false);
  p.peak_tensor_fp8_tflops = info.PeakTensorTflops(true);
  for (TcMma mma : {TcMma::kF16, TcMma::kFp8}) {
    if (mma == TcMma::kFp8 && info.Sm() < 89) continue;
    DSINFER_ASSIGN_OR_RETURN(double tc_s, BestSeconds(dev, 5, [&] {
                               return TcMatMul(dev, dw, x.as<float>(), m, y.as<float>(), mma);
                             }));
    (mma == TcMma::kFp8 ? p.tc_fp8_tflops : p.tc_f16_tflops) = 2.0 * m * rows * cols / tc_s / 1e12;
  }
  const int64_t decode_m = 16;
  DSINFER_ASSIGN_OR_RETURN(double decode_s, BestSeconds(dev, 5, [&] {
                             return TcMatMul(dev, dw, x.as<float>(), decode_m, y.as<float>(),
                                             DefaultTcMma(info));
                           }));
  p.tc_decode16_gbps = static_cast<double>(rows * cols) / decode_s / 1e9;
  return p;
}

}  // namespace dsinfer::backend::cuda
