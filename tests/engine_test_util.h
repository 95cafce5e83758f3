// Driving an engine in tests: prompts of random ids, greedy requests with logprobs, and the
// collected outcome of each sample; shared by the CPU engine suite (tests/runtime/engine_test.cc)
// and the GPU one (tests/cuda/cuda_engine_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/engine.h"

namespace dsinfer::testing {

inline std::vector<int32_t> Ids(int n, uint32_t seed, int vocab = 1024) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(2, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  runtime::FinishReason reason = runtime::FinishReason::kNone;
  runtime::Usage usage;
};

// Collects samples 0 .. n-1 of a stream until each has finished (a finished event carrying an
// error fails the test).
inline std::vector<Outcome> Collect(runtime::RequestStream& stream, int n = 1) {
  std::vector<Outcome> out(n);
  int done = 0;
  while (done < n) {
    auto ev = stream.Next(std::chrono::milliseconds(120000));
    EXPECT_TRUE(ev.has_value()) << "timed out";
    if (!ev) break;
    Outcome& o = out[ev->index];
    o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    for (const auto& lp : ev->logprobs) o.logprobs.push_back(lp.logprob);
    o.usage = ev->usage;
    if (ev->finished) {
      if (ev->finish_reason == runtime::FinishReason::kError)
        ADD_FAILURE() << "request failed: " << ev->error.ToString();
      o.reason = ev->finish_reason;
      ++done;
    }
  }
  return out;
}

// Greedy, seeded, ignoring EOS, with the top-2 logprobs of every token.
inline runtime::RequestParams Greedy(std::vector<int32_t> prompt, int max_tokens) {
  runtime::RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0.0;
  p.sampling.has_seed = true;
  p.ignore_eos = true;
  p.top_logprobs = 2;
  return p;
}

}  // namespace dsinfer::testing
