// What sampling one token costs on the engine thread, over a vocabulary of the V4 size: greedy,
// temperature alone, with top_p, with top_k, and the top-20 logprobs. Logits are Gaussian with a
// chosen spread (a flat spread keeps many candidates; a wide one few). Median of the repeats.
//   build/bench/sampler_bench [--vocab 129280] [--spread 3] [--repeats 7] [--draws 50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/sampler.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t vocab = 129280;
  double spread = 3.0;
  int repeats = 7, draws = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--vocab")) vocab = std::max<int64_t>(1, std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--spread")) spread = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--draws")) draws = std::max(1, std::atoi(argv[i + 1]));
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(spread));
  std::vector<float> logits(vocab);  // [vocab] fp32
  for (float& v : logits) v = normal(rng);
  struct Case {
    const char* name;
    double temperature, top_p;
    int top_k;
  };
  const Case cases[] = {{"greedy", 0.0, 1.0, 0},
                        {"temperature 0.8", 0.8, 1.0, 0},
                        {"temperature 0.8, top_p 0.95", 0.8, 0.95, 0},
                        {"temperature 0.8, top_k 50", 0.8, 1.0, 50}};
  std::printf("vocab %lld, logits N(0, %.1f), median of %d repeats of %d draws\n",
              static_cast<long long>(vocab), spread, repeats, draws);
  int64_t checksum = 0;
  for (const Case& c : cases) {
    dsinfer::runtime::SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.top_k = c.top_k;
    p.seed = 5;
    std::vector<double> per_draw;
    for (int r = 0; r < repeats; ++r) {
      const double t0 = Now();
      for (int d = 0; d < draws; ++d)
        checksum += dsinfer::runtime::Sample(logits, p, static_cast<uint64_t>(r * draws + d));
      per_draw.push_back((Now() - t0) / draws);
    }
    std::sort(per_draw.begin(), per_draw.end());
    std::printf("%-30s %8.3f ms per token\n", c.name, per_draw[per_draw.size() / 2] * 1e3);
  }
  std::vector<double> per_call;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = Now();
    for (int d = 0; d < draws; ++d) checksum += dsinfer::runtime::TopLogprobs(logits, 20)[0].first;
    per_call.push_back((Now() - t0) / draws);
  }
  std::sort(per_call.begin(), per_call.end());
  std::printf("%-30s %8.3f ms per token\n", "top 20 logprobs", per_call[per_call.size() / 2] * 1e3);
  std::printf("(checksum %lld)\n", static_cast<long long>(checksum));
  return 0;
}
