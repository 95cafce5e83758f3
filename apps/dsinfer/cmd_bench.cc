// dsinfer bench model: prefill and decode throughput on the CPU backend with the bandwidth
// roofline beside each figure (weight bytes a decode step must read / measured bandwidth).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "args.h"
#include "backend/cpu/cpu_model.h"
#include "commands.h"
#include "core/membw.h"
#include "model/weights.h"

namespace dsinfer::cli {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int64_t ViewBytes(const model::TensorView& t) {
  return t.valid() ? t.NumElements() * static_cast<int64_t>(DTypeSize(t.dtype)) : 0;
}
int64_t HcBytes(const model::HcParams& h) {
  return ViewBytes(h.fn) + ViewBytes(h.base) + ViewBytes(h.scale);
}

// Bytes one decode step must read besides the routed experts and the KV state: every dense
// weight once, the head, one embedding row per token (counted once).
int64_t DenseWeightBytes(const model::ModelWeights& w) {
  const auto& c = w.config();
  int64_t total = w.head.Bytes() + int64_t{c.hidden} * 2 + ViewBytes(w.norm) + HcBytes(w.hc_head);
  for (int li = 0; li < c.n_layers; ++li) {
    const auto& l = w.layers[li];
    total +=
        HcBytes(l.hc_attn) + HcBytes(l.hc_ffn) + ViewBytes(l.attn_norm) + ViewBytes(l.ffn_norm);
    total += l.wq_a.Bytes() + l.wq_b.Bytes() + l.wkv.Bytes() + l.wo_a.Bytes() + l.wo_b.Bytes();
    total += ViewBytes(l.q_norm) + ViewBytes(l.kv_norm) + ViewBytes(l.attn_sink);
    if (l.compressor.wkv.valid()) total += l.compressor.wkv.Bytes() + l.compressor.wgate.Bytes();
    if (l.indexer.wq_b.valid())
      total += l.indexer.wq_b.Bytes() + l.indexer.weights_proj.Bytes() +
               l.indexer.compressor.wkv.Bytes() + l.indexer.compressor.wgate.Bytes();
    total += l.gate.Bytes();
    if (l.shared.w1.valid())
      total += l.shared.w1.Bytes() + l.shared.w2.Bytes() + l.shared.w3.Bytes();
  }
  return total;
}

}  // namespace

int RunBench(int argc, char** argv) {
  const char* usage =
      "dsinfer bench model --model DIR [--prompt-len N] [--decode N] [--repeats N] [--threads N] "
      "[--csv FILE] "
      "[--batch 1,4,16,64] [--numerics official|fp32-reference]";
  if (argc < 2 || std::strcmp(argv[1], "model") != 0) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  Args args;
  if (!args.Parse(
          argc - 1, argv + 1,
          {"model", "prompt-len", "decode", "repeats", "threads", "csv", "numerics", "batch"},
          {}) ||
      !args.Has("model")) {
    std::fprintf(stderr, "dsinfer: %s\nusage: %s\n", args.error().c_str(), usage);
    return 2;
  }
  long long prompt_len = 256, decode = 16, repeats = 3, threads = 0;
  if (!args.GetInt("prompt-len", &prompt_len) || !args.GetInt("decode", &decode) ||
      !args.GetInt("repeats", &repeats) || !args.GetInt("threads", &threads) || prompt_len < 1 ||
      decode < 1 || repeats < 1) {
    std::fprintf(stderr, "dsinfer: %s\n", args.error().c_str());
    return 2;
  }
  backend::Numerics numerics = args.GetOr("numerics", "official") == "official"
                                   ? backend::Numerics::Official()
                                   : backend::Numerics::Fp32Reference();
  auto weights = model::ModelWeights::Load(*args.Get("model"));
  if (!weights.ok()) {
    std::fprintf(stderr, "dsinfer: %s\n", weights.status().ToString().c_str());
    return 1;
  }
  const auto& c = (*weights)->config();
  ThreadPool pool(static_cast<int>(threads));
  std::fprintf(stderr, "model: %s\nthreads: %d, numerics: %s\n", c.Summary().c_str(), pool.size(),
               numerics.Name().c_str());
  BandwidthResult bw = MeasureMemoryBandwidth(pool);
  std::fprintf(stderr, "memory bandwidth (read, median of 5): %.2f GB/s; copy %.2f GB/s\n",
               bw.read_gbps, bw.copy_gbps);
  auto cpu = backend::cpu::CpuModel::Create(**weights, numerics, pool);
  if (!cpu.ok()) return 1;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> dist(2, c.vocab_size - 1);
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = dist(rng);

  std::vector<int32_t> batches;
  if (!ParseIdList(args.GetOr("batch", "1"), &batches)) {
    std::fprintf(stderr, "dsinfer: --batch must be a list like 1,4,16\n");
    return 2;
  }
  const int64_t dense = DenseWeightBytes(**weights);
  std::FILE* csv = nullptr;
  if (auto path = args.Get("csv")) {
    csv = std::fopen(path->c_str(), "w");
    if (!csv) return 1;
    std::fprintf(
        csv,
        "workload,batch,context,threads,bandwidth_gbps,tok_s,step_bytes,roofline_tok_s,ratio\n");
  }

  // Prefill: one sequence, whole prompt in one step (median of repeats).
  std::vector<double> prefill_s;
  std::unique_ptr<backend::cpu::SequenceState> prefilled;
  for (long long r = 0; r < repeats; ++r) {
    auto state = (*cpu)->NewSequence();
    backend::cpu::ForwardOutput out;
    auto t0 = std::chrono::steady_clock::now();
    if (!(*cpu)->Forward(*state, prompt, {}, &out).ok()) return 1;
    prefill_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    prefilled = std::move(state);
  }
  const double prefill_tps = prompt_len / Median(prefill_s);
  std::printf("prefill: %lld tokens in one step: %.2f tok/s (median of %lld)\n", prompt_len,
              prefill_tps, repeats);
  if (csv)
    std::fprintf(csv, "prefill,1,%lld,%d,%.3f,%.4f,,,\n", prompt_len, pool.size(), bw.read_gbps,
                 prefill_tps);

  // Decode at batch B: B sequences at the same context (copies of the prefilled state), each fed
  // its own random token per step, so routing differs per sequence as in real traffic. The
  // roofline of a step is the distinct bytes it must read (dense weights once, each routed
  // expert that got a token once, every sequence's KV state) over the measured bandwidth.
  for (int32_t B : batches) {
    if (B < 1) continue;
    std::vector<std::unique_ptr<backend::cpu::SequenceState>> states;
    for (int i = 0; i < B; ++i)
      states.push_back(std::make_unique<backend::cpu::SequenceState>(*prefilled));
    std::vector<double> step_s, step_bytes;
    std::vector<int32_t> toks(B);
    std::vector<backend::cpu::ForwardOutput> outs(B);
    std::vector<backend::cpu::SequenceChunk> chunks(B);
    for (long long step = 0; step < decode; ++step) {
      for (int i = 0; i < B; ++i) {
        toks[i] = dist(rng);
        chunks[i] = {states[i].get(), std::span<const int32_t>(&toks[i], 1), {}, &outs[i]};
      }
      auto t0 = std::chrono::steady_clock::now();
      if (!(*cpu)->ForwardBatch(chunks).ok()) return 1;
      step_s.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      const auto& st = (*cpu)->last_step_stats();
      step_bytes.push_back(static_cast<double>(dense + st.routed_expert_bytes + st.kv_bytes));
    }
    double tps = B / Median(step_s);
    double bytes = Median(step_bytes);
    double roof = B * bw.read_gbps * 1e9 / bytes;
    std::printf(
        "decode batch %3d at context %lld: %8.3f tok/s; step reads %.1f MB -> roofline %.3f tok/s: "
        "%.1f%%\n",
        B, prompt_len, tps, bytes / 1e6, roof, 100.0 * tps / roof);
    if (csv)
      std::fprintf(csv, "decode,%d,%lld,%d,%.3f,%.4f,%.0f,%.4f,%.4f\n", B, prompt_len, pool.size(),
                   bw.read_gbps, tps, bytes, roof, tps / roof);
  }
  if (csv) std::fclose(csv);
  return 0;
}

}  // namespace dsinfer::cli
