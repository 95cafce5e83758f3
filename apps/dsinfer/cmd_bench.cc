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
int64_t HcBytes(const model::HcParams& h) { return ViewBytes(h.fn) + ViewBytes(h.base) + ViewBytes(h.scale); }

// Bytes one decode token must read: every dense weight once, K routed experts per layer, the
// head, one embedding row. (Compressed-KV and window reads are added separately.)
int64_t DecodeWeightBytes(const model::ModelWeights& w) {
  const auto& c = w.config();
  int64_t total = w.head.Bytes() + int64_t{c.hidden} * 2 + ViewBytes(w.norm) + HcBytes(w.hc_head);
  for (int li = 0; li < c.n_layers; ++li) {
    const auto& l = w.layers[li];
    total += HcBytes(l.hc_attn) + HcBytes(l.hc_ffn) + ViewBytes(l.attn_norm) + ViewBytes(l.ffn_norm);
    total += l.wq_a.Bytes() + l.wq_b.Bytes() + l.wkv.Bytes() + l.wo_a.Bytes() + l.wo_b.Bytes();
    total += ViewBytes(l.q_norm) + ViewBytes(l.kv_norm) + ViewBytes(l.attn_sink);
    if (l.compressor.wkv.valid()) total += l.compressor.wkv.Bytes() + l.compressor.wgate.Bytes();
    if (l.indexer.wq_b.valid())
      total += l.indexer.wq_b.Bytes() + l.indexer.weights_proj.Bytes() + l.indexer.compressor.wkv.Bytes() +
               l.indexer.compressor.wgate.Bytes();
    total += l.gate.Bytes();
    if (l.shared.w1.valid()) total += l.shared.w1.Bytes() + l.shared.w2.Bytes() + l.shared.w3.Bytes();
    const auto& e = l.experts[0];
    total += int64_t{c.n_experts_per_tok} * (e.w1.Bytes() + e.w2.Bytes() + e.w3.Bytes());
  }
  return total;
}

}  // namespace

int RunBench(int argc, char** argv) {
  const char* usage =
      "dsinfer bench model --model DIR [--prompt-len N] [--decode N] [--repeats N] [--threads N] [--csv FILE] "
      "[--numerics official|fp32-reference]";
  if (argc < 2 || std::strcmp(argv[1], "model") != 0) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  Args args;
  if (!args.Parse(argc - 1, argv + 1, {"model", "prompt-len", "decode", "repeats", "threads", "csv", "numerics"}, {}) ||
      !args.Has("model")) {
    std::fprintf(stderr, "dsinfer: %s\nusage: %s\n", args.error().c_str(), usage);
    return 2;
  }
  long long prompt_len = 256, decode = 16, repeats = 3, threads = 0;
  if (!args.GetInt("prompt-len", &prompt_len) || !args.GetInt("decode", &decode) ||
      !args.GetInt("repeats", &repeats) || !args.GetInt("threads", &threads) || prompt_len < 1 || decode < 1 ||
      repeats < 1) {
    std::fprintf(stderr, "dsinfer: %s\n", args.error().c_str());
    return 2;
  }
  backend::Numerics numerics = args.GetOr("numerics", "official") == "official" ? backend::Numerics::Official()
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
  std::fprintf(stderr, "memory bandwidth (read, median of 5): %.2f GB/s; copy %.2f GB/s\n", bw.read_gbps,
               bw.copy_gbps);
  auto cpu = backend::cpu::CpuModel::Create(**weights, numerics, pool);
  if (!cpu.ok()) return 1;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> dist(2, c.vocab_size - 1);
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = dist(rng);

  std::vector<double> prefill_s, decode_s;
  for (long long r = 0; r < repeats; ++r) {
    auto state = (*cpu)->NewSequence();
    backend::cpu::ForwardOutput out;
    auto t0 = std::chrono::steady_clock::now();
    if (!(*cpu)->Forward(*state, prompt, {}, &out).ok()) return 1;
    auto t1 = std::chrono::steady_clock::now();
    prefill_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    for (long long i = 0; i < decode; ++i) {
      int32_t tok[1] = {dist(rng)};
      auto d0 = std::chrono::steady_clock::now();
      if (!(*cpu)->Forward(*state, tok, {}, &out).ok()) return 1;
      decode_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count());
    }
  }
  const double prefill_tps = prompt_len / Median(prefill_s);
  const double decode_tps = 1.0 / Median(decode_s);
  const int64_t bytes = DecodeWeightBytes(**weights);
  const double roofline_tps = bw.read_gbps * 1e9 / bytes;
  std::printf("prefill: %lld tokens, %.2f tok/s (median of %lld)\n", prompt_len, prefill_tps, repeats);
  std::printf("decode:  %.3f tok/s at context %lld (median of %lld steps)\n", decode_tps, prompt_len,
              decode * repeats);
  std::printf("weight bytes read per decode token: %.1f MB; roofline %.2f tok/s at %.2f GB/s -> %.1f%% of roofline\n",
              bytes / 1e6, roofline_tps, bw.read_gbps, 100.0 * decode_tps / roofline_tps);
  if (auto csv = args.Get("csv")) {
    std::FILE* f = std::fopen(csv->c_str(), "w");
    if (!f) return 1;
    std::fprintf(f, "prompt_len,threads,bandwidth_gbps,prefill_tok_s,decode_tok_s,decode_bytes,roofline_tok_s,ratio\n");
    std::fprintf(f, "%lld,%d,%.3f,%.3f,%.4f,%lld,%.4f,%.4f\n", prompt_len, pool.size(), bw.read_gbps, prefill_tps,
                 decode_tps, static_cast<long long>(bytes), roofline_tps, decode_tps / roofline_tps);
    std::fclose(f);
  }
  return 0;
}

}  // namespace dsinfer::cli
