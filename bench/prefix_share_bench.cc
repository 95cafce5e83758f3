// KV memory of requests that share a long prefix: N requests with the same P-token prefix and a
// few tokens of their own are submitted together to the engine (CPU runner, prefix cache on);
// the engine's bytes in use are sampled while they run. Reported: the peak, and what one request
// alone holds at its end (so the peak can be read as "shared once" or "copied N times").
//   build/bench/prefix_share_bench --model DIR [--requests 16] [--prefix 8192] [--suffix 16]
//                                   [--max-tokens 8] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/engine.h"

namespace {

using dsinfer::runtime::Engine;
using dsinfer::runtime::EngineOptions;
using dsinfer::runtime::RequestParams;

std::vector<int32_t> Ids(int64_t n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(2, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const char* dir = nullptr;
  int requests = 16, suffix = 16, max_tokens = 8, threads = 2;
  int64_t prefix = 8192;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--requests")) requests = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--prefix")) prefix = std::max<int64_t>(1, std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--suffix")) suffix = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--max-tokens")) max_tokens = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--threads")) threads = std::max(1, std::atoi(argv[i + 1]));
  }
  if (dir == nullptr) {
    std::fprintf(stderr, "usage: prefix_share_bench --model DIR [--requests N --prefix P ...]\n");
    return 2;
  }
  auto weights = dsinfer::model::ModelWeights::Load(dir);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", weights.status().ToString().c_str());
    return 1;
  }
  const int vocab = (*weights)->config().vocab_size;
  std::mt19937 rng(7);
  const auto shared = Ids(prefix, vocab, rng);
  auto run = [&](int n, int64_t* peak_bytes) -> int {
    EngineOptions o;
    o.n_threads = threads;
    o.kv_cache_bytes = int64_t{16} << 30;
    auto engine = Engine::Create(**weights, o);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
      return 1;
    }
    // The prefix first, alone, so the cache holds it; then the n requests together.
    RequestParams warm;
    warm.prompt = shared;
    warm.max_tokens = 1;
    auto first = (*engine)->Submit(warm);
    if (!first.ok()) return 1;
    while (true) {
      auto ev = (*first)->Next();
      if (!ev || ev->finished) break;
    }
    std::vector<std::shared_ptr<dsinfer::runtime::RequestStream>> streams;
    for (int i = 0; i < n; ++i) {
      RequestParams p;
      p.prompt = shared;
      const auto own = Ids(suffix, vocab, rng);
      p.prompt.insert(p.prompt.end(), own.begin(), own.end());
      p.max_tokens = max_tokens;
      p.ignore_eos = true;
      auto s = (*engine)->Submit(p);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
        return 1;
      }
      streams.push_back(*s);
    }
    int64_t peak = 0;
    int done = 0;
    while (done < n) {
      peak = std::max(peak, (*engine)->Stats().kv_bytes_used);
      done = 0;
      for (auto& s : streams) done += s->n_finished() > 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (auto& s : streams)
        while (auto ev = s->Next(std::chrono::milliseconds(0))) {
        }
    }
    *peak_bytes = peak;
    return 0;
  };
  int64_t one = 0, all = 0;
  if (run(1, &one) != 0 || run(requests, &all) != 0) return 1;
  std::printf(
      "prefix %lld tokens, %d requests (+%d tokens each, %d generated): peak KV bytes in use "
      "%.2f MB with 1 request, %.2f MB with %d (%.2fx)\n",
      static_cast<long long>(prefix), requests, suffix, max_tokens, one / 1e6, all / 1e6, requests,
      static_cast<double>(all) / std::max<int64_t>(one, 1));
  return 0;
}
