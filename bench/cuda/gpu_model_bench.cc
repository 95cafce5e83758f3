// The GPU forward (backend/cuda CudaModel) on a checkpoint: weight upload, prefill and decode
// throughput at each context and batch (that many sequences stepped together), beside the
// bandwidth roofline of the same device measured in the same run (the distinct bytes a decode
// step must read: dense weights once, each routed expert that got a token once, the KV rows
// attention reads; divided by the read probe's GB/s).
//
// Usage: gpu_model_bench --model DIR [--context 128,1024] [--batch 1] [--decode 16]
//                        [--repeats 3] [--numerics official|fp32-reference]
//                        [--fp8-gemm auto|generic|tensor-f16|tensor-fp8] [--phases 1]
// --phases 1 adds one more decode pass per (context, batch) with a synchronisation after each
// phase, and prints where a step's time goes (the timed passes above run without them).
// Prints one line per (context, repeat) and a median line per context. Exits 0 without a GPU
// (with the reason), 1 on a failure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/probe.h"
#include "model/weights.h"

namespace {

using namespace dsinfer;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::atoll(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, numerics_name = "official", fp8_gemm_name = "auto", expert_gemm_name = "auto";
  std::vector<int64_t> contexts = {128, 1024}, batches = {1};
  int decode = 16, repeats = 3;
  bool phases = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model"))
      dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--context"))
      contexts = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch"))
      batches = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--decode"))
      decode = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--repeats"))
      repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--numerics"))
      numerics_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--fp8-gemm"))
      fp8_gemm_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--expert-gemm"))
      expert_gemm_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--phases"))
      phases = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "gpu_model_bench: unknown flag %s\n", argv[i]);
      return 1;
    }
  }
  using backend::cuda::Fp8GemmPath;
  const std::pair<const char*, Fp8GemmPath> kPaths[] = {{"auto", Fp8GemmPath::kAuto},
                                                        {"generic", Fp8GemmPath::kGeneric},
                                                        {"tensor-f16", Fp8GemmPath::kTensorF16},
                                                        {"tensor-fp8", Fp8GemmPath::kTensorFp8}};
  const auto path_it = std::find_if(std::begin(kPaths), std::end(kPaths),
                                    [&](const auto& p) { return fp8_gemm_name == p.first; });
  using backend::cuda::ExpertGemmPath;
  const std::pair<const char*, ExpertGemmPath> kExpertPaths[] = {
      {"auto", ExpertGemmPath::kAuto},
      {"cuda-cores", ExpertGemmPath::kCudaCores},
      {"tensor", ExpertGemmPath::kTensor}};
  const auto expert_it = std::find_if(std::begin(kExpertPaths), std::end(kExpertPaths),
                                      [&](const auto& p) { return expert_gemm_name == p.first; });
  if (dir.empty() || contexts.empty() || batches.empty() || expert_it == std::end(kExpertPaths) ||
      *std::min_element(batches.begin(), batches.end()) < 1 ||
      (numerics_name != "official" && numerics_name != "fp32-reference") ||
      path_it == std::end(kPaths)) {
    std::fprintf(stderr,
                 "usage: gpu_model_bench --model DIR [--context 128,1024] [--batch 1] "
                 "[--decode 16] [--repeats 3] [--numerics official|fp32-reference] "
                 "[--fp8-gemm auto|generic|tensor-f16|tensor-fp8] "
                 "[--expert-gemm auto|cuda-cores|tensor] [--phases 1]\n");
    return 1;
  }
  const backend::Numerics numerics = numerics_name == "official"
                                         ? backend::Numerics::Official()
                                         : backend::Numerics::Fp32Reference();
  auto dev = backend::cuda::CudaDevice::Open(0);
  if (!dev.ok()) {
    std::printf("gpu_model_bench: no CUDA device: %s\n", dev.status().message().c_str());
    return 0;
  }
  auto weights = model::ModelWeights::Load(dir);
  if (!weights.ok()) {
    std::fprintf(stderr, "gpu_model_bench: %s\n", weights.status().ToString().c_str());
    return 1;
  }
  const auto& c = (*weights)->config();
  auto probe = backend::cuda::RunProbes(**dev);
  if (!probe.ok()) {
    std::fprintf(stderr, "gpu_model_bench: probe: %s\n", probe.status().ToString().c_str());
    return 1;
  }
  const auto t_up = Clock::now();
  auto m = backend::cuda::CudaModel::Create(**dev, **weights, numerics, path_it->second,
                                            expert_it->second);
  if (!m.ok()) {
    std::fprintf(stderr, "gpu_model_bench: %s\n", m.status().ToString().c_str());
    return 1;
  }
  const double upload_s = Seconds(t_up, Clock::now());
  const int64_t dense = model::DenseDecodeBytes(**weights);
  std::printf(
      "device %s: read probe %.0f GB/s (%.0f%% of the %.0f GB/s peak); model %s, %s "
      "numerics, FP8 GEMM %s, experts %s; %.2f GB on the device, uploaded in %.2f s\n",
      (*dev)->info().name.c_str(), probe->read_gbps, 100 * probe->read_gbps / probe->peak_gbps,
      probe->peak_gbps, dir.c_str(), numerics.Name().c_str(), path_it->first, expert_it->first,
      (*m)->weight_bytes() / 1e9, upload_s);
  std::printf("%8s %5s %6s %12s %12s %10s %12s %10s\n", "context", "batch", "rep", "prefill t/s",
              "decode t/s", "step ms", "roofline ms", "share");
  uint32_t x = 12345;
  auto next_id = [&] {
    x = x * 1664525u + 1013904223u;
    return static_cast<int32_t>(2 + (x >> 8) % static_cast<uint32_t>(c.vocab_size - 2));
  };
  for (int64_t ctx : contexts) {
    for (int64_t batch : batches) {
      std::vector<double> prefill_tps, decode_tps, step_ms, roof_ms;
      for (int r = 0; r < repeats; ++r) {
        // `batch` sequences prefilled together, then decoded together one token each per step.
        std::vector<std::unique_ptr<backend::cuda::CudaSequence>> seqs;
        std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
        std::vector<backend::ForwardOutput> outs(static_cast<size_t>(batch));
        std::vector<backend::cuda::CudaChunk> chunks;
        for (int64_t b = 0; b < batch; ++b) {
          auto seq = (*m)->NewSequence();
          if (!seq.ok()) {
            std::fprintf(stderr, "gpu_model_bench: %s\n", seq.status().ToString().c_str());
            return 1;
          }
          seqs.push_back(std::move(seq).value());
          prompts[b].resize(static_cast<size_t>(ctx));
          for (auto& id : prompts[b]) id = next_id();
        }
        for (int64_t b = 0; b < batch; ++b)
          chunks.push_back({seqs[b].get(), prompts[b], {}, &outs[b]});
        const auto t0 = Clock::now();
        Status st = (*m)->ForwardBatch(chunks);
        const double prefill_s = Seconds(t0, Clock::now());
        if (!st.ok()) {
          std::fprintf(stderr, "gpu_model_bench: prefill: %s\n", st.ToString().c_str());
          return 1;
        }
        std::vector<double> steps, bytes;
        std::vector<int32_t> step_ids(static_cast<size_t>(batch));
        for (int s = 0; s < decode; ++s) {
          for (int64_t b = 0; b < batch; ++b) {
            step_ids[b] = next_id();
            chunks[b].tokens = std::span<const int32_t>(&step_ids[b], 1);
          }
          const auto t1 = Clock::now();
          st = (*m)->ForwardBatch(chunks);
          steps.push_back(Seconds(t1, Clock::now()));
          if (!st.ok()) {
            std::fprintf(stderr, "gpu_model_bench: decode: %s\n", st.ToString().c_str());
            return 1;
          }
          const auto& ss = (*m)->last_step_stats();
          bytes.push_back(static_cast<double>(dense + ss.routed_expert_bytes + ss.kv_bytes));
        }
        if (phases && r == repeats - 1) {
          (*m)->EnablePhaseTiming(true);
          (*m)->ResetPhaseTimes();
          for (int s = 0; s < decode && st.ok(); ++s) {
            for (int64_t b = 0; b < batch; ++b) step_ids[b] = next_id();
            st = (*m)->ForwardBatch(chunks);
          }
          (*m)->EnablePhaseTiming(false);
          if (!st.ok()) {
            std::fprintf(stderr, "gpu_model_bench: decode: %s\n", st.ToString().c_str());
            return 1;
          }
          const auto& pt = (*m)->phase_times();
          const double k = 1e3 / decode;
          std::printf(
              "  phases per decode step (ms, synchronised): attention dense %.3f, "
              "attention per sequence %.3f, MoE %.3f, head %.3f\n",
              pt.attention_dense * k, pt.attention_per_sequence * k, pt.moe * k, pt.head * k);
        }
        const double step = Median(steps);
        const double roof = Median(bytes) / (probe->read_gbps * 1e9);
        prefill_tps.push_back(static_cast<double>(ctx * batch) / prefill_s);
        decode_tps.push_back(static_cast<double>(batch) / step);
        step_ms.push_back(step * 1e3);
        roof_ms.push_back(roof * 1e3);
        std::printf("%8lld %5lld %6d %12.1f %12.1f %10.3f %12.4f %9.2f%%\n",
                    static_cast<long long>(ctx), static_cast<long long>(batch), r,
                    prefill_tps.back(), decode_tps.back(), step_ms.back(), roof_ms.back(),
                    100 * roof / step);
      }
      std::printf("%8lld %5lld %6s %12.1f %12.1f %10.3f %12.4f %9.2f%%\n",
                  static_cast<long long>(ctx), static_cast<long long>(batch), "median",
                  Median(prefill_tps), Median(decode_tps), Median(step_ms), Median(roof_ms),
                  100 * Median(roof_ms) / Median(step_ms));
    }
  }
  return 0;
}
