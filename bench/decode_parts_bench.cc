// Where a decode step's matmul time goes, on a real checkpoint: the bf16 head, the FP8 dense
// matrices of all layers (both at --tokens tokens, the batch), and six routed FP4 experts per
// layer at one token each, run the way CpuModel::Moe runs them (one expert per thread,
// single-threaded matmuls; at batch 16 most routed experts get one token). Each part is timed
// right after a read-bandwidth probe and reported as GB/s, as a share of that probe, and as
// multiply-adds per second, median of the repeats.
//   build/bench/decode_parts_bench --model /work/bench-model [--repeats 5] [--threads 2]
//                                  [--weights copy|map] [--tokens 1]
// Activations are FP8-rounded Gaussians (the official numerics quantize the inputs of FP8 and FP4
// matmuls), bf16-exact, so every matrix takes the kernels a decode step takes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/linear.h"
#include "core/membw.h"
#include "core/quant.h"
#include "model/weights.h"

namespace {

using dsinfer::model::WeightMatrix;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Part {
  const char* name;
  std::vector<double> seconds, shares;
  double bytes = 0;
  double macs = 0;  // multiply-adds of one run
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir, weights = "copy";
  int repeats = 5, threads = 2;
  int64_t tokens = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--threads")) threads = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--weights")) weights = argv[i + 1];
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::max<int64_t>(1, std::atoll(argv[i + 1]));
  }
  const auto residency = dsinfer::model::ParseWeightResidency(weights);
  if (dir.empty() || !residency) {
    std::fprintf(stderr,
                 "usage: decode_parts_bench --model DIR [--repeats N] [--threads N] "
                 "[--weights auto|map|copy] [--tokens N]\n");
    return 2;
  }
  auto loaded = dsinfer::model::ModelWeights::Load(dir, *residency);
  if (!loaded.ok()) {
    std::fprintf(stderr, "decode_parts_bench: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const dsinfer::model::ModelWeights& w = *loaded.value();
  const dsinfer::model::ModelConfig& c = w.config();
  dsinfer::ThreadPool pool(threads);
  // `tokens` rows of activations, each long enough for the widest input (q heads), FP8-rounded
  // per block. A matrix with fewer columns reads the first k values of each row's slot.
  int64_t widest = c.hidden;
  for (const auto& layer : w.layers)
    for (const WeightMatrix* m : {&layer.wq_b, &layer.wo_a, &layer.wo_b, &layer.shared.w2})
      widest = std::max(widest, m->cols);
  widest = (widest + c.act_block - 1) / c.act_block * c.act_block;
  // x: [tokens, widest]; y: [tokens, max(vocab, widest)]
  std::vector<float> x(tokens * widest), y(tokens * std::max<int64_t>(c.vocab_size, widest));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (int64_t off = 0; off < tokens * widest; off += c.act_block)
    dsinfer::Fp8RoundTripInPlace(x.data() + off, c.act_block, c.act_block);

  // The backbone layers only: MTP layers do not run in a plain decode step.
  const std::span<const dsinfer::model::LayerWeights> backbone(
      w.layers.data(), std::min(w.layers.size(), static_cast<size_t>(std::max(0, c.n_layers))));
  Part head{"bf16 head"}, dense{"fp8 dense, all layers"}, experts{"6 routed experts per layer"};
  std::vector<const WeightMatrix*> dense_mats;
  for (const auto& layer : backbone)
    for (const WeightMatrix* m :
         {&layer.wq_a, &layer.wq_b, &layer.wkv, &layer.wo_a, &layer.wo_b, &layer.indexer.wq_b,
          &layer.shared.w1, &layer.shared.w3, &layer.shared.w2})
      if (m->valid()) dense_mats.push_back(m);
  const int per_layer = std::min(6, c.n_experts_per_tok > 0 ? c.n_experts_per_tok : 6);
  auto timed = [&](Part& part, auto&& body) {
    const double gbps =
        dsinfer::MeasureMemoryBandwidth(pool, int64_t{256} << 20, 1, false).read_gbps;
    const double t0 = Now();
    part.bytes = body();
    const double dt = Now() - t0;
    part.seconds.push_back(dt);
    part.shares.push_back(gbps > 0 ? part.bytes / dt / 1e9 / gbps : 0.0);
  };
  for (int r = 0; r < repeats; ++r) {
    timed(head, [&] {
      dsinfer::backend::cpu::MatMul(w.head, x.data(), tokens, y.data(), pool);
      head.macs = static_cast<double>(tokens) * static_cast<double>(w.head.Elements());
      return static_cast<double>(w.head.Bytes());
    });
    timed(dense, [&] {
      double bytes = 0;
      dense.macs = 0;
      for (const WeightMatrix* m : dense_mats) {
        dsinfer::backend::cpu::MatMul(*m, x.data(), tokens, y.data(), pool);
        bytes += static_cast<double>(m->Bytes());
        dense.macs += static_cast<double>(tokens) * static_cast<double>(m->Elements());
      }
      return bytes;
    });
    timed(experts, [&] {
      double bytes = 0;
      experts.macs = 0;
      for (const auto& layer : backbone) {
        if (layer.experts.empty()) continue;
        const int64_t n_experts = static_cast<int64_t>(layer.experts.size());
        // Different experts every repeat (stride coprime to common expert counts), so none is
        // still cached from the last one.
        std::vector<int64_t> ids(per_layer);
        for (int u = 0; u < per_layer; ++u) ids[u] = (37 * u + 7 * r) % n_experts;
        pool.ParallelFor(per_layer, [&](int64_t u) {
          dsinfer::ThreadPool serial(1);
          const auto& e = layer.experts[ids[u]];
          std::vector<float> out(std::max(e.w1.rows, e.w2.rows));  // [n] of the widest
          dsinfer::backend::cpu::MatMul(e.w1, x.data(), 1, out.data(), serial);
          dsinfer::backend::cpu::MatMul(e.w3, x.data(), 1, out.data(), serial);
          dsinfer::backend::cpu::MatMul(e.w2, x.data(), 1, out.data(), serial);
        });
        for (int64_t id : ids) {
          const auto& e = layer.experts[id];
          bytes += static_cast<double>(e.w1.Bytes() + e.w2.Bytes() + e.w3.Bytes());
          experts.macs += static_cast<double>(e.w1.Elements() + e.w2.Elements() + e.w3.Elements());
        }
      }
      return bytes;
    });
  }
  std::printf(
      "decode matmuls, head and dense at %lld tokens, experts at one, %d threads, weights "
      "%s, median of %d\n",
      static_cast<long long>(tokens), threads, w.copied() ? "copied" : "mapped", repeats);
  double total = 0;
  for (const Part* p : {&head, &dense, &experts}) {
    const double s = Median(p->seconds);
    total += s;
    std::printf("%-28s %9.1f MB  %8.2f ms  %6.2f GB/s  %5.1f%% of the probe  %7.1f GMAC/s\n",
                p->name, p->bytes / 1e6, s * 1e3, s > 0 ? p->bytes / s / 1e9 : 0.0,
                100 * Median(p->shares), s > 0 ? p->macs / s / 1e9 : 0.0);
  }
  std::printf("%-28s %22.2f ms\n", "sum of the medians", total * 1e3);
  return 0;
}
