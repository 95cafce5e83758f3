// The engine's prefill/decode hooks (RequestParams::export_prompt_state / imported_state): a
// prefill engine exports the state of prompt[0, n - 1) on the request's first event; a second
// engine continuing from it generates exactly what one engine does alone (prompts ending
// mid-window, with the 16-slot window ring wrapped, and at several offsets modulo the 128-token
// page); bad combinations are refused, and a state of other tokens fails the request.
#include <gtest/gtest.h>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "runtime/engine.h"

namespace dsinfer::runtime {
namespace {

using dsinfer::testing::Collect;
using dsinfer::testing::Greedy;
using dsinfer::testing::Ids;
using dsinfer::testing::Outcome;

std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}) {
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");  // window 16
  o.n_threads = 2;
  o.kv_cache_bytes = int64_t{256} << 20;
  auto e = Engine::Create(w, o);
  DSINFER_CHECK_MSG(e.ok(), e.status().ToString());
  return std::move(e).value();
}

// Runs a prefill request (max_tokens 1) and returns the state its first event carried.
std::shared_ptr<const std::vector<uint8_t>> Prefill(Engine& engine, std::vector<int32_t> prompt) {
  RequestParams p = Greedy(std::move(prompt), 1);
  p.export_prompt_state = true;
  auto s = engine.Submit(p);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  std::shared_ptr<const std::vector<uint8_t>> blob;
  bool first = true;
  while (auto ev = (*s)->Next(std::chrono::milliseconds(60000))) {
    if (first) {
      EXPECT_TRUE(ev->export_status.ok()) << ev->export_status.ToString();
      blob = ev->exported_state;
      first = false;
    } else {
      EXPECT_EQ(ev->exported_state, nullptr);  // only the first event carries it
    }
    if (ev->finished) break;
  }
  return blob;
}

TEST(Disaggregation, ADecodeEngineContinuesTheExportedStateBitForBit) {
  auto colocated = MakeEngine(), prefill = MakeEngine(), decode = MakeEngine();
  for (int n : {5, 23, 128, 129, 130, 206, 300}) {
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens");
    const auto prompt = Ids(n, static_cast<uint32_t>(n));
    auto alone = colocated->Submit(Greedy(prompt, 12));
    ASSERT_TRUE(alone.ok());
    const Outcome want = Collect(**alone)[0];
    auto blob = Prefill(*prefill, prompt);
    ASSERT_NE(blob, nullptr);
    RequestParams p = Greedy(prompt, 12);
    p.imported_state = blob;
    auto continued = decode->Submit(p);
    ASSERT_TRUE(continued.ok()) << continued.status().ToString();
    const Outcome got = Collect(**continued)[0];
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    EXPECT_EQ(std::memcmp(got.logprobs.data(), want.logprobs.data(),
                          got.logprobs.size() * sizeof(float)),
              0);
    EXPECT_EQ(got.usage.cached_prompt_tokens, n - 1);  // computed on the prefill engine
  }
}

TEST(Disaggregation, BadCombinationsAreRefusedAndAForeignStateFailsTheRequest) {
  auto engine = MakeEngine();
  RequestParams p = Greedy(Ids(1, 1), 4);
  p.export_prompt_state = true;
  EXPECT_EQ(engine->Submit(p).status().code(), StatusCode::kInvalidArgument);
  EngineOptions no_cache;
  no_cache.enable_prefix_cache = false;
  p = Greedy(Ids(40, 1), 1);
  p.export_prompt_state = true;
  EXPECT_EQ(MakeEngine(no_cache)->Submit(p).status().code(), StatusCode::kInvalidArgument);

  auto blob = Prefill(*engine, Ids(40, 2));
  ASSERT_NE(blob, nullptr);
  p = Greedy(Ids(40, 2), 4);
  p.imported_state = blob;
  p.prompt_logprobs = 1;
  EXPECT_EQ(engine->Submit(p).status().code(), StatusCode::kInvalidArgument);
  // A state of other tokens: Import refuses it, the request fails with the reason.
  p = Greedy(Ids(40, 3), 4);
  p.imported_state = blob;
  auto s = engine->Submit(p);
  ASSERT_TRUE(s.ok());
  std::optional<StreamEvent> last;
  while (auto ev = (*s)->Next(std::chrono::milliseconds(60000))) {
    last = ev;
    if (ev->finished) break;
  }
  ASSERT_TRUE(last && last->finished);
  EXPECT_EQ(last->finish_reason, FinishReason::kError);
  EXPECT_NE(last->error.message().find("importing the prefilled state"), std::string::npos)
      << last->error.ToString();
  EXPECT_TRUE(last->tokens.empty());
}

}  // namespace
}  // namespace dsinfer::runtime
