// The prefill/decode KV transfer (transfer/kv_transfer.h) over UCX on loopback (UCX_TLS=tcp):
// - a held blob is pulled bit for bit and released at the holder after the pull;
// - a flipped byte is caught by the checksum; a pulled (or expired) blob cannot be pulled again;
// - a blob nobody pulls is released at its deadline;
// - a malformed descriptor and an unreachable holder fail with clear errors;
// - a sequence's exported state, pulled into a fresh model, continues bit for bit: prompts ending
//   mid-window, with the window ring wrapped, and at several offsets modulo the page size (128).
#include "transfer/kv_transfer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "../backend/test_models.h"
#include "backend/cpu/cpu_model.h"

namespace dsinfer::transfer {
namespace {

using std::chrono::milliseconds;

// Loopback TCP only: what CI machines have (no RDMA), set before UCX reads its configuration.
const bool kTcpOnly = [] {
  setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  return true;
}();

std::unique_ptr<KvTransferAgent> Agent(const std::string& name, TransferOptions o = {}) {
  o.engine_id = name;
  auto agent = KvTransferAgent::Create(std::move(o));
  EXPECT_TRUE(agent.ok()) << agent.status().ToString();
  return agent.ok() ? std::move(agent).value() : nullptr;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// Polls until pred holds (the holder releases on its own thread), at most 5 s.
template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 500 && !pred(); ++i) std::this_thread::sleep_for(milliseconds(10));
  return pred();
}

TEST(KvTransfer, PullGetsTheBytesAndTheHolderReleasesThem) {
  auto prefill = Agent("prefill"), decode = Agent("decode");
  ASSERT_TRUE(prefill && decode);
  for (size_t n : {size_t{1}, size_t{4095}, size_t{1} << 20, (size_t{3} << 20) + 17}) {
    SCOPED_TRACE(n);
    const auto blob = RandomBytes(n, static_cast<uint32_t>(n));
    auto d = prefill->Hold(blob);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->length, n);
    EXPECT_EQ(prefill->Stats().held_blobs, 1);
    auto pulled = decode->Pull(*d);
    ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
    EXPECT_TRUE(*pulled == blob);
    EXPECT_TRUE(Eventually([&] { return prefill->Stats().held_blobs == 0; }));
    // Released: a second pull of the same descriptor is refused, not served stale memory.
    auto again = decode->Pull(*d);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kNotFound) << again.status().ToString();
  }
  const TransferStats p = prefill->Stats(), q = decode->Stats();
  EXPECT_EQ(p.holds_total, 4);
  EXPECT_EQ(p.released_pulled_total, 4);
  EXPECT_EQ(p.held_bytes, 0);
  EXPECT_EQ(q.pulls_total, 4);
  EXPECT_EQ(q.pull_failures_total, 4);  // the second pulls
  EXPECT_EQ(q.pulled_bytes_total, int64_t{1} + 4095 + (1 << 20) + (3 << 20) + 17);
}

TEST(KvTransfer, AFlippedByteFailsTheChecksum) {
  TransferOptions o;
  o.after_get_for_test = [](std::span<uint8_t> bytes) { bytes[bytes.size() / 2] ^= 0x10; };
  auto prefill = Agent("prefill"), decode = Agent("decode", o);
  ASSERT_TRUE(prefill && decode);
  auto d = prefill->Hold(RandomBytes(100000, 3));
  ASSERT_TRUE(d.ok());
  auto pulled = decode->Pull(*d);
  ASSERT_FALSE(pulled.ok());
  EXPECT_NE(pulled.status().message().find("SHA-256"), std::string::npos)
      << pulled.status().ToString();
  EXPECT_EQ(decode->Stats().checksum_failures_total, 1);
  EXPECT_EQ(decode->Stats().pulls_total, 0);
}

TEST(KvTransfer, ABlobNobodyPullsIsReleasedAtItsDeadline) {
  TransferOptions o;
  o.hold_deadline = milliseconds(200);
  auto prefill = Agent("prefill", o), decode = Agent("decode");
  ASSERT_TRUE(prefill && decode);
  auto d = prefill->Hold(RandomBytes(5000, 4));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(prefill->Stats().held_bytes, 5000);
  EXPECT_TRUE(Eventually([&] { return prefill->Stats().held_blobs == 0; }));
  EXPECT_EQ(prefill->Stats().released_deadline_total, 1);
  EXPECT_EQ(prefill->Stats().held_bytes, 0);
  auto late = decode->Pull(*d);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound);
}

TEST(KvTransfer, BadDescriptorsAndAGoneHolderFailClearly) {
  TransferOptions o;
  o.pull_timeout = milliseconds(1500);
  auto decode = Agent("decode", o);
  ASSERT_TRUE(decode);
  TransferDescriptor d;
  {
    auto prefill = Agent("prefill");
    ASSERT_TRUE(prefill);
    auto held = prefill->Hold(RandomBytes(64, 5));
    ASSERT_TRUE(held.ok());
    d = *held;
    TransferDescriptor bad = d;
    bad.rkey = "zz";
    auto r = decode->Pull(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    bad = d;
    bad.sha256 = "abc";
    EXPECT_EQ(decode->Pull(bad).status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(prefill->Hold({}).ok());
  }  // the holder is gone
  auto r = decode->Pull(d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().ToString();
}

// ---- a sequence's state across the transfer
// ------------------------------------------------------

std::vector<float> Step(backend::cpu::CpuModel& m, backend::cpu::SequenceState& s,
                        std::span<const int32_t> ids) {
  backend::ForwardOutput out;
  const Status st = m.Forward(s, ids, {.all_logits = true}, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out.logits;
}

TEST(KvTransfer, AnExportedStateContinuesBitForBitAfterThePull) {
  const model::ModelWeights& w = testing::PresetWeights("tiny-a");  // window 16, page 128
  ThreadPool pool(2);
  auto make = [&] {
    auto m = backend::cpu::CpuModel::Create(w, backend::Numerics::Official(), pool, {});
    DSINFER_CHECK_MSG(m.ok(), m.status().ToString());
    return std::move(m).value();
  };
  auto prefill_model = make(), decode_model = make();
  auto prefill = Agent("prefill"), decode = Agent("decode");
  ASSERT_TRUE(prefill && decode);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> token(2, w.config().vocab_size - 1);
  // The state of prompt[0, n - 1) travels (what a prefill worker exports); the decode side runs
  // the last prompt token and the rest. 9: mid-window; 23: the 16-slot ring wrapped; then
  // offsets 127, 0, 1 and 77 modulo the 128-token page.
  for (int n : {9, 23, 128, 129, 130, 206, 334}) {
    SCOPED_TRACE("prompt length " + std::to_string(n));
    std::vector<int32_t> ids(static_cast<size_t>(n) + 6);
    for (auto& id : ids) id = token(rng);
    const auto prefix = std::span<const int32_t>(ids).first(static_cast<size_t>(n - 1));
    const auto rest = std::span<const int32_t>(ids).subspan(static_cast<size_t>(n - 1));
    auto colocated = prefill_model->NewSequence();
    Step(*prefill_model, *colocated, prefix);
    auto blob = prefill_model->Export(*colocated, prefix);
    ASSERT_TRUE(blob.ok()) << blob.status().ToString();
    auto d = prefill->Hold(*blob);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    auto pulled = decode->Pull(*d);
    ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
    auto imported = decode_model->Import(*pulled, prefix);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    const auto want = Step(*prefill_model, *colocated, rest);
    const auto got = Step(*decode_model, **imported, rest);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace dsinfer::transfer
