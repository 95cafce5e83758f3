// Test runners for speculative decoding: ScriptedDraftRunner replaces the MTP block's draft
// logits by a script's (the reference continuation with scripted misses, or a target-derived
// distribution) while the real MTP block still runs, so that acceptance rates are controlled;
// NoSpeculationRunner is a runner without MTP drafting (the ModelRunner defaults).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "backend/model_runner.h"
#include "runtime/engine.h"

namespace dsinfer::testing {

// An engine on a tiny preset's weights: two threads and, unless `o` says otherwise, a 256 MiB KV
// budget; `runner` null: the CPU runner.
inline std::unique_ptr<runtime::Engine> MakeTestEngine(
    const std::string& preset, runtime::EngineOptions o,
    std::unique_ptr<backend::ModelRunner> runner = nullptr) {
  o.n_threads = 2;
  if (o.kv_cache_bytes == 0) o.kv_cache_bytes = int64_t{256} << 20;
  auto e = runtime::Engine::Create(PresetWeights(preset), o, std::move(runner));
  DSINFER_CHECK_MSG(e.ok(), e.status().ToString());
  return std::move(e).value();
}

// Requests submitted together, each's first sample collected, in order.
inline std::vector<Outcome> RunAll(runtime::Engine& engine,
                                   const std::vector<runtime::RequestParams>& reqs) {
  std::vector<std::shared_ptr<runtime::RequestStream>> streams;
  for (const auto& r : reqs) {
    auto s = engine.Submit(r);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) streams.push_back(*s);
  }
  std::vector<Outcome> out;
  for (auto& s : streams) out.push_back(Collect(*s)[0]);
  return out;
}

// n greedy requests of assorted prompt lengths (1 to 64 + n tokens) and max_tokens.
inline std::vector<runtime::RequestParams> Mixed(int n, int max_tokens, uint32_t seed,
                                                 int vocab = 1024) {
  std::vector<runtime::RequestParams> reqs;
  const int lens[] = {5, 40, 1, 64, 19, 7, 33, 12};
  for (int i = 0; i < n; ++i)
    reqs.push_back(Greedy(Ids(lens[i % 8] + i, seed + i, vocab), max_tokens - (i % 5)));
  return reqs;
}

// Every token and logprob equal (float ==: bit-identical logits give identical logprobs).
inline void ExpectSame(const std::vector<Outcome>& want, const std::vector<Outcome>& got,
                       const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].tokens, got[i].tokens) << what << ", request " << i;
    EXPECT_EQ(want[i].logprobs, got[i].logprobs) << what << ", request " << i;
  }
}

// Every call forwarded to `inner` (the part shared by the test runners).
class ForwardingRunner : public backend::ModelRunner {
 public:
  explicit ForwardingRunner(std::unique_ptr<backend::ModelRunner> inner)
      : inner_(std::move(inner)) {}
  using RunnerState = backend::RunnerState;
  std::string device() const override { return inner_->device(); }
  Result<std::unique_ptr<RunnerState>> NewState() override { return inner_->NewState(); }
  Result<std::unique_ptr<RunnerState>> Copy(const RunnerState& from) override {
    return inner_->Copy(from);
  }
  Result<std::unique_ptr<RunnerState>> Snapshot(const RunnerState& from) override {
    return inner_->Snapshot(from);
  }
  int64_t StateBytes(const RunnerState& s) const override { return inner_->StateBytes(s); }
  int64_t StateBytesAt(int64_t n) const override { return inner_->StateBytesAt(n); }
  int64_t PageBytesInUse() const override { return inner_->PageBytesInUse(); }
  Status UsePageAllocator(std::shared_ptr<backend::PageAllocator> p) override {
    return inner_->UsePageAllocator(std::move(p));
  }
  const model::StateLayout* layout() const override { return inner_->layout(); }
  int64_t DefaultStateBudget() const override { return inner_->DefaultStateBudget(); }
  Status ForwardBatch(std::span<backend::RunnerChunk> chunks) override {
    return inner_->ForwardBatch(chunks);
  }
  Status Truncate(RunnerState& s, int64_t n) override { return inner_->Truncate(s, n); }
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) override {
    inner_->ParallelFor(n, fn);
  }

 protected:
  std::unique_ptr<backend::ModelRunner> inner_;
};

class NoSpeculationRunner final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
};

class ScriptedDraftRunner final : public ForwardingRunner {
 public:
  // The draft logits [vocab] for the token after `context` (every token from position 0 to the
  // one the draft follows), or nullopt: the MTP block's own.
  using DraftFn = std::function<std::optional<std::vector<float>>(std::span<const int32_t> context,
                                                                  int64_t vocab)>;
  ScriptedDraftRunner(std::unique_ptr<backend::ModelRunner> inner, DraftFn fn)
      : ForwardingRunner(std::move(inner)), fn_(std::move(fn)) {}

  Result<std::unique_ptr<RunnerState>> NewState() override {
    DSINFER_ASSIGN_OR_RETURN(auto s, inner_->NewState());
    history_[s.get()].clear();
    return s;
  }
  Result<std::unique_ptr<RunnerState>> Copy(const RunnerState& from) override {
    DSINFER_ASSIGN_OR_RETURN(auto s, inner_->Copy(from));
    history_[s.get()] = History(from);
    return s;
  }
  Result<std::unique_ptr<RunnerState>> Snapshot(const RunnerState& from) override {
    DSINFER_ASSIGN_OR_RETURN(auto s, inner_->Snapshot(from));
    history_[s.get()] = History(from);
    return s;
  }
  Status ForwardBatch(std::span<backend::RunnerChunk> chunks) override {
    for (const auto& c : chunks) {
      std::vector<int32_t> h = History(*c.state);
      h.insert(h.end(), c.tokens.begin(), c.tokens.end());
      history_[c.state] = std::move(h);
    }
    return inner_->ForwardBatch(chunks);
  }
  Status CheckSpeculation(int k) const override { return inner_->CheckSpeculation(k); }
  int64_t MtpTokens(const RunnerState& s) const override { return inner_->MtpTokens(s); }
  Status TruncateMtp(RunnerState& s, int64_t n) override { return inner_->TruncateMtp(s, n); }
  Status ForwardMtp(RunnerState& state, std::span<const float> hidden,
                    std::span<const int32_t> next, std::vector<float>* logits,
                    std::vector<float>* last_hidden) override {
    const int64_t m = inner_->MtpTokens(state), n = state.n_tokens();
    DSINFER_RETURN_IF_ERROR(inner_->ForwardMtp(state, hidden, next, logits, last_hidden));
    if (logits == nullptr) return Status::Ok();
    std::vector<int32_t>& ctx = chain_[&state];
    if (m + static_cast<int64_t>(next.size()) == n) ctx = History(state);  // a catch-up call
    ctx.push_back(next.back());  // chained calls add the previous draft
    if (auto scripted = fn_(ctx, static_cast<int64_t>(logits->size()))) *logits = *scripted;
    return Status::Ok();
  }

 private:
  std::vector<int32_t> History(const RunnerState& s) const {
    auto it = history_.find(&s);
    std::vector<int32_t> h = it == history_.end() ? std::vector<int32_t>{} : it->second;
    h.resize(static_cast<size_t>(s.n_tokens()), -1);  // rolled back, or unknown (-1)
    return h;
  }
  DraftFn fn_;
  std::map<const RunnerState*, std::vector<int32_t>> history_;  // tokens at positions 0..n-1
  std::map<const RunnerState*, std::vector<int32_t>> chain_;
};

// Drafts from the known greedy outputs of some requests: the reference's next token, except at
// a scripted fraction of positions (a hash of the position), where another token is proposed.
// Contexts of no reference get the MTP block's own drafts.
class ReferenceDrafts {
 public:
  ReferenceDrafts(const std::vector<runtime::RequestParams>& reqs, const std::vector<Outcome>& outs,
                  double miss_rate)
      : miss_rate_(miss_rate) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      std::vector<int32_t> seq = reqs[i].prompt;
      seq.insert(seq.end(), outs[i].tokens.begin(), outs[i].tokens.end());
      seqs_.push_back(std::move(seq));
    }
  }
  ScriptedDraftRunner::DraftFn Fn() const {
    return [seqs = seqs_, miss = miss_rate_](std::span<const int32_t> ctx,
                                             int64_t vocab) -> std::optional<std::vector<float>> {
      for (const auto& seq : seqs) {
        if (seq.size() <= ctx.size() || !std::equal(ctx.begin(), ctx.end(), seq.begin())) continue;
        int32_t token = seq[ctx.size()];
        const uint64_t h =
            (ctx.size() * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(ctx.back())) *
            0xbf58476d1ce4e5b9ull;
        if (static_cast<double>(h >> 11) * 0x1p-53 < miss)
          token = static_cast<int32_t>((token + 1 + (h >> 60)) % vocab);
        std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
        logits[token] = 30.0f;
        return logits;
      }
      return std::nullopt;
    };
  }

 private:
  std::vector<std::vector<int32_t>> seqs_;
  double miss_rate_;
};

}  // namespace dsinfer::testing
