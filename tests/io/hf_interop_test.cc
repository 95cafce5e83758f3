// Interop with Hugging Face's safetensors writer: tests/io/fixtures/hf_written.safetensors was
// written by safetensors 0.8.0 (reference/io/make_safetensors_fixture.py, see MANIFEST.json).
// Its layout differs from ours (tensors ordered by dtype alignment, metadata keys unsorted), so
// reading it checks the parser against a real producer, and rewriting it checks our writer keeps
// every byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace dsinfer::io {
namespace {

std::string FixturePath() {
  return std::string(DSINFER_SOURCE_DIR) + "/tests/io/fixtures/hf_written.safetensors";
}

template <typename T>
std::vector<T> Values(const SafetensorsFile& file, const std::string& name) {
  const TensorInfo* info = file.Find(name);
  if (info == nullptr) {
    ADD_FAILURE() << "missing " << name;
    return {};
  }
  std::span<const uint8_t> bytes = file.Ref(*info).bytes;
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// The generator's pattern: i * 0.5 - 3.
std::vector<float> Pattern(int n) {
  std::vector<float> out;
  for (int i = 0; i < n; ++i) out.push_back(static_cast<float>(i) * 0.5f - 3.0f);
  return out;
}

template <typename Code, typename Decode>
std::vector<float> Decoded(const SafetensorsFile& file, const std::string& name, Decode decode) {
  std::vector<float> out;
  for (Code c : Values<Code>(file, name)) out.push_back(decode(c));
  return out;
}

TEST(HfInteropTest, ReadsEveryDtypeWrittenByHuggingFace) {
  auto opened = SafetensorsFile::Open(FixturePath());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const SafetensorsFile& f = **opened;
  EXPECT_EQ(f.data_section_offset() % 8, 0u);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"},
                                                              {"made_by", "safetensors.torch"}}));
  EXPECT_EQ(f.tensors().size(), 14u);

  EXPECT_EQ(f.Find("f32")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values<float>(f, "f32"), Pattern(6));
  std::vector<double> f64 = Values<double>(f, "f64");
  ASSERT_EQ(f64.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f64[i], i * 0.5 - 3.0);
  EXPECT_EQ(f.Find("f16")->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(Decoded<uint16_t>(f, "f16", F16ToF32), Pattern(6));
  EXPECT_EQ(f.Find("bf16")->shape, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(Decoded<uint16_t>(f, "bf16", Bf16ToF32), Pattern(8));
  EXPECT_EQ(f.Find("f8_e4m3")->dtype, DType::kF8E4M3);
  EXPECT_EQ(Decoded<uint8_t>(f, "f8_e4m3", E4M3ToF32), Pattern(16));
  EXPECT_EQ(f.Find("f8_e8m0")->dtype, DType::kF8E8M0);
  std::vector<float> e8m0 = Decoded<uint8_t>(f, "f8_e8m0", E8M0ToF32);
  ASSERT_EQ(e8m0.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(e8m0[i], std::ldexp(1.0f, i - 7));

  EXPECT_EQ(Values<int8_t>(f, "i8"), (std::vector<int8_t>{-4, -3, -2, -1, 0, 1, 2, 3}));
  EXPECT_EQ(Values<uint8_t>(f, "u8"), (std::vector<uint8_t>{250, 251, 252, 253, 254, 255}));
  EXPECT_EQ(Values<int16_t>(f, "i16"), (std::vector<int16_t>{-3000, -2000, -1000, 0, 1000, 2000}));
  EXPECT_EQ(Values<int32_t>(f, "i32"), (std::vector<int32_t>{-200000, -100000, 0, 100000}));
  EXPECT_EQ(Values<int64_t>(f, "i64"),
            (std::vector<int64_t>{-(int64_t{1} << 40), -1, 0, int64_t{1} << 50}));
  EXPECT_EQ(f.Find("bool")->dtype, DType::kBool);
  EXPECT_EQ(Values<uint8_t>(f, "bool"), (std::vector<uint8_t>{1, 0, 0, 1, 1}));
  EXPECT_TRUE(f.Find("scalar")->shape.empty());
  EXPECT_EQ(Values<float>(f, "scalar"), std::vector<float>{2.5f});
  EXPECT_EQ(f.Find("empty")->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(f.Find("empty")->ByteSize(), 0u);
}

TEST(HfInteropTest, RewritingPreservesEveryTensor) {
  auto original = SafetensorsFile::Open(FixturePath());
  ASSERT_TRUE(original.ok()) << original.status().ToString();
  std::vector<OwnedTensor> tensors;
  for (const TensorInfo& t : (*original)->tensors()) {
    std::span<const uint8_t> bytes = (*original)->Ref(t).bytes;
    tensors.push_back({t.name, t.dtype, t.shape, {bytes.begin(), bytes.end()}});
  }
  testing::ScratchDir dir;
  const std::string path = dir.File("rewritten.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, (*original)->metadata()).ok());
  auto copy = SafetensorsFile::Open(path);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ((*copy)->metadata(), (*original)->metadata());
  ASSERT_EQ((*copy)->tensors().size(), tensors.size());
  for (const OwnedTensor& want : tensors) {
    const TensorInfo* info = (*copy)->Find(want.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, want.dtype);
    EXPECT_EQ(info->shape, want.shape);
    std::span<const uint8_t> got = (*copy)->Ref(*info).bytes;
    EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), want.bytes) << want.name;
  }
}

}  // namespace
}  // namespace dsinfer::io
