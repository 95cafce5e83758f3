// The paged sequence state (model/state_layout.h, backend/cpu/sequence_state.h):
// - rows stored packed come back bit for bit, and rows off the format's grid are refused;
// - Truncate: appending k tokens and rolling back continues exactly as never having appended,
//   at random cut points (inside compressor groups, across page boundaries, with the window
//   ring wrapped);
// - Export / Import: a state continues bit for bit in a fresh model (this process and a second
//   one); damaged blobs and blobs of another model, numerics, layout or tokens are refused and
//   build nothing;
// - pages are shared copy-on-write between copies, and snapshots keep only the boundary;
// - the packed layout's bytes per token for V4-Flash.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/cpu/cpu_model.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "model/layer_plan.h"
#include "model/state_layout.h"
#include "test_models.h"

namespace dsinfer::backend::cpu {
namespace {

std::vector<int32_t> RandomIds(int64_t n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(2, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

// Runs ids through the state in random chunks of 1..max_chunk; returns the logits of every
// position (each chunk asks for all of its rows).
std::vector<float> RunIds(CpuModel& m, SequenceState& s, std::span<const int32_t> ids,
                       std::mt19937& rng, int max_chunk = 40) {
  std::vector<float> all;
  std::uniform_int_distribution<int> chunk(1, max_chunk);
  for (size_t i = 0; i < ids.size();) {
    const size_t n = std::min<size_t>(chunk(rng), ids.size() - i);
    ForwardOutput out;
    Status st = m.Forward(s, ids.subspan(i, n), {.all_logits = true}, &out);
    EXPECT_TRUE(st.ok()) << st.ToString();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    i += n;
  }
  return all;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<CpuModel> Make(const model::ModelWeights& w, ThreadPool& pool, Numerics nm,
                               int rollback = 64, int page_tokens = 128) {
  CpuModel::Options o;
  o.layout.rollback_tokens = rollback;
  o.layout.page_tokens = page_tokens;
  auto m = CpuModel::Create(w, nm, pool, o);
  DSINFER_CHECK_MSG(m.ok(), m.status().ToString());
  return std::move(m).value();
}

// ---- row formats --------------------------------------------------------------------------------

TEST(RowCodecs, ValuesOnTheirGridComeBackBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int trial = 0; trial < 200; ++trial) {
    // A KV row as the official numerics leave it: bf16, the nope dims through the FP8 round trip.
    const int dim = 64 + 64 * (trial % 8), nope = dim - 16 * (1 + trial % 3);
    std::vector<float> row(static_cast<size_t>(dim));
    for (auto& v : row) v = RoundBf16(dist(rng) * std::ldexp(1.0f, trial % 20 - 10));
    if (trial % 7 == 0) std::fill(row.begin(), row.begin() + nope / 2, 0.0f);  // a zero block
    if (trial % 5 == 0) row[0] = -0.0f;
    Fp8RoundTripInPlace(row.data(), nope, 64);
    const model::RowFormat kv = model::Fp8NopeRow(dim, nope, 64);
    std::vector<uint8_t> packed(static_cast<size_t>(kv.Bytes()));
    ASSERT_TRUE(model::PackRow(kv, row.data(), packed.data()).ok()) << "trial " << trial;
    std::vector<float> back(row.size());
    model::UnpackRow(kv, packed.data(), back.data());
    ASSERT_TRUE(SameBits(row, back)) << "trial " << trial;
    // An indexer key: Hadamard, then the FP4 round trip over the whole row.
    std::vector<float> key(128);
    for (auto& v : key) v = RoundBf16(dist(rng));
    HadamardInPlace(key.data(), 128, true);
    Fp4RoundTripInPlace(key.data(), 128, 32);
    const model::RowFormat fp4 = model::Fp4Row(128, 32);
    ASSERT_EQ(fp4.Bytes(), 64 + 4);
    std::vector<uint8_t> packed4(static_cast<size_t>(fp4.Bytes()));
    ASSERT_TRUE(model::PackRow(fp4, key.data(), packed4.data()).ok()) << "trial " << trial;
    std::vector<float> back4(key.size());
    model::UnpackRow(fp4, packed4.data(), back4.data());
    ASSERT_TRUE(SameBits(key, back4)) << "trial " << trial;
  }
  EXPECT_EQ(model::Fp8NopeRow(512, 448, 64).Bytes(), 448 + 7 + 128);  // V4-Flash's 583 bytes
}

TEST(RowCodecs, ValuesOffTheGridAreRefused) {
  std::vector<float> row(64, 1.0f);
  std::vector<uint8_t> packed(256);
  row[3] = 1.0f + 1.0f / 64;  // not an e4m3 value at this block's scale
  EXPECT_FALSE(model::PackRow(model::Fp8NopeRow(64, 48, 64), row.data(), packed.data()).ok());
  row[3] = 1.0f;
  row[60] = 1.0f + 1.0f / 1024;  // a tail dim that is not bf16
  EXPECT_FALSE(model::PackRow(model::Fp8NopeRow(64, 48, 64), row.data(), packed.data()).ok());
  EXPECT_FALSE(model::PackRow(model::Bf16Row(64), row.data(), packed.data()).ok());
  row[60] = 1.0f;
  row[5] = INFINITY;  // no e4m3 code holds it
  EXPECT_FALSE(model::PackRow(model::Fp8NopeRow(64, 48, 64), row.data(), packed.data()).ok());
  row[5] = 1.0f;
  row[7] = 1.25f;  // between e2m1 values 1 and 1.5 at scale 1
  EXPECT_FALSE(model::PackRow(model::Fp4Row(64, 32), row.data(), packed.data()).ok());
}

// V4.1 (spec §14.2): window rows FP8 over all dims in blocks of 32; compressed rows FP4 e2m1
// with an e4m3 scale per 16 (the round trip's own scale is found again from the values).
TEST(RowCodecs, V41FormatsHoldTheirRoundTripsBitForBit) {
  std::mt19937 rng(41);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const model::RowFormat window = model::Fp8NopeRow(512, 512, 32);
  const model::RowFormat compressed = model::Fp4E4m3Row(512, 16);
  EXPECT_EQ(window.Bytes(), 512 + 16);
  EXPECT_EQ(compressed.Bytes(), 256 + 32);  // V4.1's compressed KV: 288 B per row
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<float> row(512);
    const float magnitude = std::ldexp(1.0f, trial % 40 - 25);  // down to e4m3's subnormal scales
    for (auto& v : row) v = RoundBf16(dist(rng) * magnitude);
    if (trial % 9 == 0) std::fill(row.begin() + 32, row.begin() + 64, 0.0f);  // zero blocks
    if (trial % 7 == 0) row[1] = -0.0f;
    std::vector<float> w = row, c = row;
    Fp8RoundTripInPlace(w.data(), 512, 32);
    Fp4E4m3RoundTripInPlace(c.data(), 512, 16);
    for (const auto& [f, v] : {std::pair{window, &w}, std::pair{compressed, &c}}) {
      std::vector<uint8_t> packed(static_cast<size_t>(f.Bytes()));
      ASSERT_TRUE(model::PackRow(f, v->data(), packed.data()).ok())
          << f.Describe() << " trial " << trial;
      std::vector<float> back(512);
      model::UnpackRow(f, packed.data(), back.data());
      ASSERT_TRUE(SameBits(*v, back)) << f.Describe() << " trial " << trial;
    }
  }
  // Off the grid: a block whose values no e4m3 scale puts on e2m1 (1 and 1.25 at any scale).
  std::vector<float> row(512, 0.0f);
  row[0] = 1.0f, row[1] = 1.25f;
  std::vector<uint8_t> packed(static_cast<size_t>(compressed.Bytes()));
  EXPECT_FALSE(model::PackRow(compressed, row.data(), packed.data()).ok());
}

// The e4m3-scaled FP4 round trip itself (docs/NUMERICS.md, V4.1 assumption 3).
TEST(RowCodecs, Fp4E4m3RoundTripFollowsItsFormula) {
  std::vector<float> x = {6.0f, 3.0f, 1.0f, 0.2f, -0.7f, 0.0f, 2.5f, -6.0f,
                          0.0f, 0.0f, 0.0f, 0.0f, 0.0f,  0.0f, 0.0f, 0.0f};
  Fp4E4m3RoundTripInPlace(x.data(), 16, 16);  // amax 6: s = 1
  EXPECT_EQ(x, (std::vector<float>{6, 3, 1, 0, -0.5f, 0, 2, -6, 0, 0, 0, 0, 0, 0, 0, 0}));
  std::vector<float> y(16, 0.0f);
  y[0] = 7.0f;  // s = e4m3(7 / 6) = 1.125; 7 / 1.125 = 6.22 -> 6 -> 6.75
  y[1] = 1.0f;  // 1 / 1.125 = 0.89 -> 1 -> 1.125
  Fp4E4m3RoundTripInPlace(y.data(), 16, 16);
  EXPECT_EQ(y[0], 6.75f);
  EXPECT_EQ(y[1], 1.125f);
  std::vector<float> tiny(16, 1e-6f);  // below the floor: s = 2^-9 (e4m3's smallest), all 0
  Fp4E4m3RoundTripInPlace(tiny.data(), 16, 16);
  EXPECT_EQ(tiny[0], 0.0f);
}

TEST(TopK, TiesGoToTheLowerIndexAndTheResultIsAscending) {
  const std::vector<float> s = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, -0.0f, 0.0f};
  EXPECT_EQ(TopK(s, 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(TopK(s, 4), (std::vector<int32_t>{1, 2, 3, 4}));
  const std::vector<float> zeros = {0.0f, -0.0f, 0.0f};  // -0 == +0: the lower index wins
  EXPECT_EQ(TopK(zeros, 1), (std::vector<int32_t>{0}));
  EXPECT_EQ(TopK(s, 10).size(), s.size());
  EXPECT_TRUE(TopK(s, 0).empty());
}

// ---- Truncate -------------------------------------------------------------------------------

struct Case {
  std::string preset;
  bool official;
};
class PagedState : public ::testing::TestWithParam<Case> {
 protected:
  Numerics nm() const { return GetParam().official ? Numerics::Official() : Numerics::Fp32Reference(); }
  const model::ModelWeights& weights() const {
    return dsinfer::testing::PresetWeights(GetParam().preset);
  }
};

TEST_P(PagedState, TruncateContinuesAsNeverHavingAppended) {
  ThreadPool pool(2);
  auto m = Make(weights(), pool, nm());
  const int vocab = m->config().vocab_size, W = m->config().window;
  std::mt19937 rng(11);
  // Cut points: inside a compressor group, one token before and after page boundaries, with the
  // ring wrapped many times; then random ones.
  std::vector<std::pair<int64_t, int64_t>> cuts = {{1, 5},     {3, 64},   {125, 6},  {127, 1},
                                                   {128, 64},  {130, 40}, {250, 63}, {255, 2},
                                                   {3 * W, 17}, {383, 64}};
  std::uniform_int_distribution<int64_t> n0_of(1, 420), k_of(1, 64);
  for (int i = 0; i < 8; ++i) cuts.push_back({n0_of(rng), k_of(rng)});
  for (auto [n0, k] : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(n0) + " after " + std::to_string(k) + " more");
    const auto prefix = RandomIds(n0, vocab, rng), extra = RandomIds(k, vocab, rng),
               next = RandomIds(30, vocab, rng);
    // Never appended: prefix, then next.
    auto fresh = m->NewSequence();
    RunIds(*m, *fresh, prefix, rng);
    const auto want = RunIds(*m, *fresh, next, rng);
    // Appended, rolled back, continued.
    auto s = m->NewSequence();
    RunIds(*m, *s, prefix, rng);
    RunIds(*m, *s, extra, rng);
    ASSERT_LE(s->rollback_floor(), n0);
    ASSERT_TRUE(m->Truncate(*s, n0).ok());
    EXPECT_EQ(s->n_tokens(), n0);
    EXPECT_LE(s->n_pages(), m->layout().PagesFor(n0));
    const auto got = RunIds(*m, *s, next, rng);
    ASSERT_TRUE(SameBits(got, want));
  }
}

TEST_P(PagedState, TruncateRefusesToGoPastItsFloorAndChangesNothing) {
  ThreadPool pool(2);
  auto m = Make(weights(), pool, nm(), /*rollback=*/8);
  std::mt19937 rng(3);
  auto s = m->NewSequence();
  RunIds(*m, *s, RandomIds(100, m->config().vocab_size, rng), rng);
  EXPECT_EQ(s->rollback_floor(), 92);
  const Status st = m->Truncate(*s, 91);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_NE(st.message().find("92"), std::string::npos) << st.message();
  EXPECT_EQ(s->n_tokens(), 100);
  EXPECT_FALSE(m->Truncate(*s, 101).ok());
  EXPECT_TRUE(m->Truncate(*s, 92).ok());
}

// ---- Export / Import ------------------------------------------------------------------------

TEST_P(PagedState, ExportImportContinuesBitForBitInAFreshModel) {
  ThreadPool pool(2);
  auto m = Make(weights(), pool, nm());
  auto fresh_model = Make(weights(), pool, nm());  // another instance: nothing shared but weights
  const int vocab = m->config().vocab_size;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int64_t> len_of(1, 400);
  for (int64_t n : {int64_t{1}, int64_t{128}, int64_t{129}, len_of(rng), len_of(rng), len_of(rng)}) {
    SCOPED_TRACE("length " + std::to_string(n));
    const auto ids = RandomIds(n, vocab, rng), next = RandomIds(25, vocab, rng);
    auto s = m->NewSequence();
    RunIds(*m, *s, ids, rng);
    auto blob = m->Export(*s, ids);
    ASSERT_TRUE(blob.ok()) << blob.status().ToString();
    auto imported = fresh_model->Import(*blob, ids);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    EXPECT_EQ((*imported)->n_tokens(), n);
    const auto want = RunIds(*m, *s, next, rng);
    ASSERT_TRUE(SameBits(RunIds(*fresh_model, **imported, next, rng), want));
    // A page range: the pages before it come from a state over the same tokens.
    if (n >= 128) {
      auto s2 = m->NewSequence();
      RunIds(*m, *s2, ids, rng);
      auto from_page1 = m->Export(*s2, ids, 1);
      ASSERT_TRUE(from_page1.ok());
      EXPECT_LT(from_page1->size(), blob->size());
      EXPECT_FALSE(fresh_model->Import(*from_page1, ids).ok());  // no base given
      auto base = fresh_model->NewSequence();
      RunIds(*fresh_model, *base, std::span(ids).subspan(0, 128), rng);
      auto joined = fresh_model->Import(*from_page1, ids, base.get());
      ASSERT_TRUE(joined.ok()) << joined.status().ToString();
      ASSERT_TRUE(SameBits(RunIds(*fresh_model, **joined, next, rng), want));
    }
  }
}

TEST_P(PagedState, DamagedOrForeignBlobsAreRefusedAndBuildNothing) {
  ThreadPool pool(2);
  auto m = Make(weights(), pool, nm());
  std::mt19937 rng(23);
  const auto ids = RandomIds(200, m->config().vocab_size, rng);
  auto s = m->NewSequence();
  RunIds(*m, *s, ids, rng);
  auto blob = m->Export(*s, ids);
  ASSERT_TRUE(blob.ok());
  const int64_t pages_before = m->pages().bytes_in_use();
  auto refused = [&](const CpuModel& model, std::span<const uint8_t> b,
                     std::span<const int32_t> tokens, const std::string& why) {
    auto r = model.Import(b, tokens);
    EXPECT_FALSE(r.ok()) << why;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << why;
      EXPECT_FALSE(r.status().message().empty());
    }
    EXPECT_EQ(m->pages().bytes_in_use(), pages_before) << why << ": pages were left behind";
  };
  // Truncated at many lengths, a flipped byte anywhere.
  for (size_t len : {size_t{0}, size_t{7}, size_t{40}, blob->size() / 2, blob->size() - 1})
    refused(*m, std::span(*blob).first(len), ids, "truncated to " + std::to_string(len));
  std::uniform_int_distribution<size_t> at(0, blob->size() - 1);
  for (int i = 0; i < 20; ++i) {
    std::vector<uint8_t> bad = *blob;
    const size_t k = at(rng);
    bad[k] ^= static_cast<uint8_t>(1u << (i % 8));
    refused(*m, bad, ids, "byte " + std::to_string(k) + " flipped");
  }
  // Other tokens than the caller continues from.
  std::vector<int32_t> other = ids;
  other[150] = other[150] == 5 ? 6 : 5;
  refused(*m, *blob, other, "other tokens");
  refused(*m, *blob, std::span(ids).first(199), "fewer tokens");
  // Another numerics mode, another page size, another model.
  auto other_numerics = Make(weights(), pool, GetParam().official ? Numerics::Fp32Reference()
                                                                  : Numerics::Official());
  refused(*other_numerics, *blob, ids, "other numerics");
  auto other_pages = Make(weights(), pool, nm(), 64, 256);
  refused(*other_pages, *blob, ids, "other page size");
  const auto& other_weights =
      dsinfer::testing::PresetWeights(GetParam().preset, /*seed=*/2);  // same shapes, other bytes
  auto other_model = Make(other_weights, pool, nm());
  refused(*other_model, *blob, ids, "other model");
}

// The second process: the parent writes a blob, the tokens to continue with and the logits they
// must give; this binary, started again with DSINFER_STATE_IMPORT_DIR, imports and compares.
TEST(PagedStateProcess, ImportInAnotherProcessContinuesBitForBit) {
  namespace fs = std::filesystem;
  const char* child = std::getenv("DSINFER_STATE_IMPORT_DIR");
  const auto& w = dsinfer::testing::PresetWeights("tiny-a");
  ThreadPool pool(2);
  auto m = Make(w, pool, Numerics::Official());
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
  };
  auto as = [](const std::vector<uint8_t>& b, auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    std::vector<T> v(b.size() / sizeof(T));
    std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
  };
  if (child != nullptr) {
    const fs::path dir = child;
    const auto ids = as(read(dir / "ids"), static_cast<int32_t*>(nullptr));
    const auto next = as(read(dir / "next"), static_cast<int32_t*>(nullptr));
    const auto want = as(read(dir / "logits"), static_cast<float*>(nullptr));
    auto s = m->Import(read(dir / "blob"), ids);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ForwardOutput out;
    ASSERT_TRUE(m->Forward(**s, next, {.all_logits = true}, &out).ok());
    ASSERT_TRUE(SameBits(out.logits, want));
    return;
  }
  std::mt19937 rng(29);
  const auto ids = RandomIds(333, w.config().vocab_size, rng);
  const auto next = RandomIds(21, w.config().vocab_size, rng);
  auto s = m->NewSequence();
  RunIds(*m, *s, ids, rng);
  auto blob = m->Export(*s, ids);
  ASSERT_TRUE(blob.ok());
  ForwardOutput out;
  ASSERT_TRUE(m->Forward(*s, next, {.all_logits = true}, &out).ok());
  const fs::path dir = dsinfer::testing::TestTempDir() + "/state_import";
  fs::create_directories(dir);
  auto write = [&](const char* name, const void* p, size_t n) {
    std::ofstream(dir / name, std::ios::binary).write(static_cast<const char*>(p), n);
  };
  write("blob", blob->data(), blob->size());
  write("ids", ids.data(), ids.size() * 4);
  write("next", next.data(), next.size() * 4);
  write("logits", out.logits.data(), out.logits.size() * 4);
  const std::string cmd = "DSINFER_STATE_IMPORT_DIR=" + dir.string() + " " +
                          fs::read_symlink("/proc/self/exe").string() +
                          " --gtest_filter=PagedStateProcess.* >" + (dir / "child.log").string() +
                          " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir / "child.log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("[  PASSED  ] 1 test"), std::string::npos) << text;
}

// ---- sharing ------------------------------------------------------------------------------

TEST_P(PagedState, CopiesSharePagesAndWritesCopyThem) {
  ThreadPool pool(2);
  auto m = Make(weights(), pool, nm());
  std::mt19937 rng(31);
  const int vocab = m->config().vocab_size;
  const auto ids = RandomIds(300, vocab, rng);
  auto a = m->NewSequence();
  RunIds(*m, *a, ids, rng);
  const int64_t one = m->pages().bytes_in_use();
  EXPECT_EQ(one, a->n_pages() * m->layout().page_bytes);
  auto b = a->Copy();
  auto snap = a->Snapshot();
  EXPECT_EQ(m->pages().bytes_in_use(), one);  // shared, not copied
  EXPECT_LT(snap->BoundaryBytes(), a->BoundaryBytes());
  // Both continue differently; each equals its own run from scratch, and only the written
  // (partial, shared) page was copied.
  const auto next_a = RandomIds(40, vocab, rng), next_b = RandomIds(40, vocab, rng);
  const auto got_a = RunIds(*m, *a, next_a, rng);
  const auto got_b = RunIds(*m, *b, next_b, rng);
  for (auto [next, got] : {std::pair{&next_a, &got_a}, std::pair{&next_b, &got_b}}) {
    auto fresh = m->NewSequence();
    RunIds(*m, *fresh, ids, rng);
    EXPECT_TRUE(SameBits(RunIds(*m, *fresh, *next, rng), *got));
  }
  // The snapshot restores to the state at 300 tokens.
  auto restored = snap->Copy();
  EXPECT_EQ(restored->rollback_floor(), 300);
  auto fresh = m->NewSequence();
  RunIds(*m, *fresh, ids, rng);
  EXPECT_TRUE(SameBits(RunIds(*m, *restored, next_a, rng), RunIds(*m, *fresh, next_a, rng)));
}

INSTANTIATE_TEST_SUITE_P(Presets, PagedState,
                         ::testing::Values(Case{"tiny-a", true}, Case{"tiny-a", false},
                                           Case{"tiny-c", true}, Case{"tiny-b", false},
                                           Case{"tiny-v41-a", true}, Case{"tiny-v41-b", false},
                                           Case{"tiny-v41-c", true}),
                         [](const auto& param_info) {
                           std::string n = param_info.param.preset +
                                           (param_info.param.official ? "_official" : "_fp32");
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// ---- memory ---------------------------------------------------------------------------------

// V4-Flash (spec §1): 43 layers of window / CSA / HCA and the MTP block.
model::ModelConfig V4Flash() {
  auto c = model::PresetConfig("bench");
  DSINFER_CHECK(c.ok());
  model::ModelConfig v = *c;
  v.n_layers = 43;
  v.n_mtp_layers = 1;
  v.compress_ratios = {0, 0};
  for (int li = 2; li < 43; ++li) v.compress_ratios.push_back(li % 2 == 0 ? 4 : 128);
  v.compress_ratios.push_back(0);
  return v;
}

TEST(StateLayout, PackedV4FlashStateIsAtMost3Point5KiBPerToken) {
  const model::ModelConfig c = V4Flash();
  const Numerics official = Numerics::Official();
  auto layout = model::MakeStateLayout(c, model::PlanLayers(c), KvRowFormat(c, official),
                                       IndexKeyFormat(c, official), {});
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  // 21 CSA layers: 32 rows of 583 B and 32 keys of 68 B per page; 20 HCA layers: 1 row.
  EXPECT_EQ(layout->page_bytes, 21 * (32 * 583 + 32 * 68) + 20 * 583);
  std::printf("V4-Flash packed state: %.1f B/token (%s)\n", layout->PageBytesPerToken(),
              layout->Describe().c_str());
  EXPECT_LE(layout->PageBytesPerToken(), 3.5 * 1024);
  // The fp32-reference numerics keep f32 rows: 4x the values' width, as before.
  const Numerics fp32 = Numerics::Fp32Reference();
  auto wide = model::MakeStateLayout(c, model::PlanLayers(c), KvRowFormat(c, fp32),
                                     IndexKeyFormat(c, fp32), {});
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->page_bytes, 21 * (32 * 2048 + 32 * 512) + 20 * 2048);
}

}  // namespace
}  // namespace dsinfer::backend::cpu
