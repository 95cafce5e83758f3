// Bit-exact checks of the scalar codecs (src/core/dtype.h) and the activation-quantization ops
// (src/core/quant.h) against torch dtype casts (fixtures: tests/fixtures/codec/, made by
// reference/make_codec_goldens.py; formulas and versions in its manifest.json).
//
// The core layer has no JSON dependency, so the fixtures are read with a minimal safetensors
// reader below; it only needs to handle the trusted fixture files (flat header, known dtypes).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"

namespace dsinfer {
namespace {

std::string FixturePath(const std::string& name) {
  return std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/codec/" + name;
}

// One tensor of a fixture file: dtype name as in the header, shape, raw little-endian bytes.
struct FixtureTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Minimal parser for the header JSON written by safetensors: an object of objects whose
// values are strings, integer arrays, or (in __metadata__) strings. Returns false on anything
// else, so a malformed fixture fails the test instead of being misread.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : s_(text) {}

  bool Parse(std::map<std::string, FixtureTensor>* out,
             std::map<std::string, std::array<uint64_t, 2>>* offsets) {
    if (!Eat('{')) return false;
    if (Peek() == '}') return Eat('}');
    do {
      std::string name;
      if (!String(&name) || !Eat(':') || !Eat('{')) return false;
      FixtureTensor t;
      std::array<uint64_t, 2> off{0, 0};
      if (Peek() != '}') {
        do {
          std::string key;
          if (!String(&key) || !Eat(':')) return false;
          if (Peek() == '"') {
            std::string value;
            if (!String(&value)) return false;
            if (key == "dtype") t.dtype = value;
          } else {
            std::vector<int64_t> values;
            if (!IntArray(&values)) return false;
            if (key == "shape") t.shape = values;
            if (key == "data_offsets") {
              if (values.size() != 2 || values[0] < 0 || values[1] < values[0]) return false;
              off = {static_cast<uint64_t>(values[0]), static_cast<uint64_t>(values[1])};
            }
          }
        } while (Eat(','));
      }
      if (!Eat('}')) return false;
      if (name != "__metadata__") {
        (*out)[name] = std::move(t);
        (*offsets)[name] = off;
      }
    } while (Eat(','));
    return Eat('}');
  }

 private:
  void SkipSpace() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  char Peek() {
    SkipSpace();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool Eat(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    size_t end = s_.find('"', pos_);  // fixture names contain no escapes
    if (end == std::string::npos) return false;
    *out = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out->find('\\') == std::string::npos;
  }
  bool IntArray(std::vector<int64_t>* out) {
    if (!Eat('[')) return false;
    if (Peek() == ']') return Eat(']');
    do {
      SkipSpace();
      size_t start = pos_;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ == start || pos_ - start > 18) return false;
      out->push_back(std::stoll(s_.substr(start, pos_ - start)));
    } while (Eat(','));
    return Eat(']');
  }

  const std::string& s_;
  size_t pos_ = 0;
};

// Loads every tensor of a fixture file; fails the calling test (and returns empty) on error.
std::map<std::string, FixtureTensor> LoadFixture(const std::string& name) {
  std::map<std::string, FixtureTensor> tensors;
  std::ifstream in(FixturePath(name), std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.size() < 8) {
    ADD_FAILURE() << "missing or truncated fixture " << FixturePath(name);
    return {};
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[i];
  if (header_len > file.size() - 8) {
    ADD_FAILURE() << "bad header length in " << name;
    return {};
  }
  std::string header(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  std::map<std::string, std::array<uint64_t, 2>> offsets;
  if (!HeaderParser(header).Parse(&tensors, &offsets)) {
    ADD_FAILURE() << "unparsable header in " << name;
    return {};
  }
  const uint64_t data_size = file.size() - 8 - header_len;
  for (auto& [tensor_name, t] : tensors) {
    auto [begin, end] = offsets[tensor_name];
    if (end > data_size) {
      ADD_FAILURE() << tensor_name << " outside the data section of " << name;
      return {};
    }
    auto data = file.begin() + 8 + static_cast<std::ptrdiff_t>(header_len);
    t.bytes.assign(data + static_cast<std::ptrdiff_t>(begin),
                   data + static_cast<std::ptrdiff_t>(end));
  }
  return tensors;
}

// Typed copy of a fixture tensor; checks dtype and element count.
template <typename T>
std::vector<T> Values(const std::map<std::string, FixtureTensor>& file, const std::string& name,
                      const std::string& dtype, size_t want_count) {
  auto it = file.find(name);
  if (it == file.end()) {
    ADD_FAILURE() << "fixture tensor " << name << " missing";
    return {};
  }
  EXPECT_EQ(it->second.dtype, dtype) << name;
  if (it->second.bytes.size() != want_count * sizeof(T)) {
    ADD_FAILURE() << name << ": " << it->second.bytes.size() << " bytes, want "
                  << want_count * sizeof(T);
    return {};
  }
  std::vector<T> out(want_count);
  std::memcpy(out.data(), it->second.bytes.data(), it->second.bytes.size());
  return out;
}

int64_t Rows(const std::map<std::string, FixtureTensor>& file, const std::string& name) {
  auto it = file.find(name);
  return it == file.end() || it->second.shape.size() != 2 ? 0 : it->second.shape[0];
}

// Same value bit for bit (NaN payloads aside: any NaN equals any NaN).
bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

bool IsE4M3NaN(uint8_t code) { return (code & 0x7f) == 0x7f; }

class CodecGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    codecs_ = new std::map<std::string, FixtureTensor>(LoadFixture("codecs.safetensors"));
    ops_ = new std::map<std::string, FixtureTensor>(LoadFixture("ops.safetensors"));
  }
  static void TearDownTestSuite() {
    delete codecs_;
    delete ops_;
  }
  static const std::map<std::string, FixtureTensor>& codecs() { return *codecs_; }
  static const std::map<std::string, FixtureTensor>& ops() { return *ops_; }

 private:
  static std::map<std::string, FixtureTensor>* codecs_;
  static std::map<std::string, FixtureTensor>* ops_;
};
std::map<std::string, FixtureTensor>* CodecGolden::codecs_ = nullptr;
std::map<std::string, FixtureTensor>* CodecGolden::ops_ = nullptr;

TEST_F(CodecGolden, E4M3DecodeAllCodes) {
  auto want = Values<float>(codecs(), "e4m3_decode", "F32", 256);
  ASSERT_EQ(want.size(), 256u);
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(SameFloat(E4M3ToF32(static_cast<uint8_t>(c)), want[c])) << "code " << c;
}

TEST_F(CodecGolden, E4M3EncodeEveryBf16AfterClamp) {
  auto want = Values<uint8_t>(codecs(), "e4m3_encode_bf16", "U8", 65536);
  ASSERT_EQ(want.size(), 65536u);
  int mismatches = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    float x = Bf16ToF32(static_cast<uint16_t>(b));
    uint8_t got = F32ToE4M3(std::isnan(x) ? x : std::clamp(x, -448.0f, 448.0f));
    bool ok = std::isnan(x) ? IsE4M3NaN(got) && IsE4M3NaN(want[b]) : got == want[b];
    if (!ok && ++mismatches <= 10)
      ADD_FAILURE() << "bf16 0x" << std::hex << b << " (" << x << "): got 0x" << int{got}
                    << ", torch 0x" << int{want[b]};
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(CodecGolden, E4M3EncodeFp32EdgeValues) {
  auto in = codecs().count("e4m3_edge_in") ? codecs().at("e4m3_edge_in").bytes.size() / 4 : 0;
  ASSERT_GT(in, 1000u);
  auto x = Values<float>(codecs(), "e4m3_edge_in", "F32", in);
  auto want = Values<uint8_t>(codecs(), "e4m3_edge_code", "U8", in);
  ASSERT_EQ(want.size(), in);
  int mismatches = 0;
  for (size_t i = 0; i < in; ++i) {
    uint8_t got = F32ToE4M3(std::isnan(x[i]) ? x[i] : std::clamp(x[i], -448.0f, 448.0f));
    bool ok = std::isnan(x[i]) ? IsE4M3NaN(got) && IsE4M3NaN(want[i]) : got == want[i];
    if (!ok && ++mismatches <= 10)
      ADD_FAILURE() << "x = " << x[i] << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(x[i])
                    << "): got 0x" << int{got} << ", torch 0x" << int{want[i]};
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(CodecGolden, E8M0DecodeAllCodes) {
  auto want = Values<float>(codecs(), "e8m0_decode", "F32", 256);
  ASSERT_EQ(want.size(), 256u);
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(SameFloat(E8M0ToF32(static_cast<uint8_t>(c)), want[c])) << "code " << c;
}

TEST_F(CodecGolden, E2M1DecodeAndEncode) {
  auto grid = Values<float>(codecs(), "e2m1_decode", "F32", 16);
  ASSERT_EQ(grid.size(), 16u);
  for (int c = 0; c < 16; ++c)
    EXPECT_TRUE(SameFloat(E2M1ToF32(static_cast<uint8_t>(c)), grid[c])) << "code " << c;
  size_t n = codecs().count("e2m1_edge_in") ? codecs().at("e2m1_edge_in").bytes.size() / 4 : 0;
  ASSERT_GT(n, 1000u);
  auto x = Values<float>(codecs(), "e2m1_edge_in", "F32", n);
  auto want = Values<uint8_t>(codecs(), "e2m1_edge_code", "U8", n);
  ASSERT_EQ(want.size(), n);
  int mismatches = 0;
  for (size_t i = 0; i < n; ++i) {
    uint8_t got = F32ToE2M1(std::clamp(x[i], -6.0f, 6.0f));
    if (got != want[i] && ++mismatches <= 10)
      ADD_FAILURE() << "x = " << x[i] << ": got " << int{got} << ", reference " << int{want[i]};
  }
  EXPECT_EQ(mismatches, 0);
}

// The nearest grid value by exhaustive search over a format's non-negative values (ties to the
// even index), an oracle independent of the bit arithmetic in RoundToSmallFloatGrid.
float NearestOnGrid(float v, const std::vector<float>& grid) {
  float a = std::fabs(v);
  size_t best = 0;
  for (size_t i = 1; i < grid.size(); ++i) {
    double d_best = std::fabs(double{grid[best]} - a), d = std::fabs(double{grid[i]} - a);
    if (d < d_best || (d == d_best && i % 2 == 0)) best = i;
  }
  return std::copysign(grid[best], v);
}

// Every float whose top 15 mantissa bits vary with three low-bit patterns (all ties and their
// neighbours included), over every binade from below the smallest subnormal to the format's
// range, both signs: the grid rounding and the encoders agree with the search.
TEST(SmallFloatGrid, RoundingAndEncodersMatchANearestValueSearch) {
  std::vector<float> e4m3, e2m1;
  for (int c = 0; c < 0x7f; ++c) e4m3.push_back(E4M3ToF32(static_cast<uint8_t>(c)));
  for (int c = 0; c < 8; ++c) e2m1.push_back(E2M1ToF32(static_cast<uint8_t>(c)));
  int mismatches = 0;
  auto check = [&](float x, bool fp8) {
    float range = fp8 ? 448.0f : 6.0f;
    if (std::fabs(x) > range) return;
    float want = NearestOnGrid(x, fp8 ? e4m3 : e2m1);
    float got = fp8 ? RoundToE4M3(x) : RoundToE2M1(x);
    float via_code = fp8 ? E4M3ToF32(F32ToE4M3(x)) : E2M1ToF32(F32ToE2M1(x));
    if ((!SameFloat(got, want) || !SameFloat(via_code, want)) && ++mismatches <= 10)
      ADD_FAILURE() << (fp8 ? "e4m3" : "e2m1") << " x = " << x << " (bits 0x" << std::hex
                    << std::bit_cast<uint32_t>(x) << "): grid " << got << ", via code " << via_code
                    << ", search " << want;
  };
  for (int exponent = -14; exponent <= 8; ++exponent) {
    for (uint32_t top = 0; top < (1u << 15); ++top) {
      for (uint32_t low : {0u, 1u, 0xffu}) {
        uint32_t bits = (static_cast<uint32_t>(exponent + 127) << 23) | (top << 8) | low;
        float x = std::bit_cast<float>(bits);
        for (float signed_x : {x, -x}) {
          check(signed_x, true);
          if (exponent >= -3) check(signed_x, false);
        }
      }
    }
  }
  for (float x : {0.0f, -0.0f, 1e-45f, -1e-45f, 448.0f, -448.0f, 6.0f, -6.0f}) {
    check(x, true);
    check(x, false);
  }
  EXPECT_EQ(mismatches, 0);
}

// bf16 fixture rows as fp32 values.
std::vector<float> Bf16Rows(const std::map<std::string, FixtureTensor>& file,
                            const std::string& name, size_t count) {
  auto bits = Values<uint16_t>(file, name, "BF16", count);
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = Bf16ToF32(bits[i]);
  return out;
}

TEST_F(CodecGolden, ActQuantBlock128CodesAndScales) {
  const int64_t rows = Rows(ops(), "act_quant.x"), width = 512, block = 128;
  ASSERT_GE(rows, 16);
  auto x = Bf16Rows(ops(), "act_quant.x", rows * width);
  auto want_codes = Values<uint8_t>(ops(), "act_quant.codes", "U8", rows * width);
  auto want_scales = Values<float>(ops(), "act_quant.scales", "F32", rows * width / block);
  ASSERT_FALSE(x.empty() || want_codes.empty() || want_scales.empty());
  int bad_codes = 0, bad_scales = 0;
  std::vector<uint8_t> codes(width);
  std::vector<float> scales(width / block);
  for (int64_t r = 0; r < rows; ++r) {
    ActQuantFp8(x.data() + r * width, static_cast<int>(width), static_cast<int>(block),
                codes.data(), scales.data());
    for (int64_t i = 0; i < width; ++i) bad_codes += codes[i] != want_codes[r * width + i];
    for (int64_t b = 0; b < width / block; ++b) {
      if (!SameFloat(scales[b], want_scales[r * (width / block) + b]) && ++bad_scales <= 5)
        ADD_FAILURE() << "row " << r << " block " << b << ": scale " << scales[b] << ", torch "
                      << want_scales[r * (width / block) + b];
    }
  }
  EXPECT_EQ(bad_codes, 0);
  EXPECT_EQ(bad_scales, 0);
}

// Runs `op` on every row of `<prefix>.x` and compares the bf16 bits with `<prefix>.y`.
template <typename Op>
void CheckRoundTrip(const std::map<std::string, FixtureTensor>& ops, const std::string& prefix,
                    int64_t width, int64_t min_rows, Op op) {
  const int64_t rows = Rows(ops, prefix + ".x");
  ASSERT_GE(rows, min_rows) << prefix;
  auto x = Bf16Rows(ops, prefix + ".x", rows * width);
  auto want = Values<uint16_t>(ops, prefix + ".y", "BF16", rows * width);
  ASSERT_FALSE(x.empty() || want.empty());
  int mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> y(x.begin() + r * width, x.begin() + (r + 1) * width);
    op(y.data(), static_cast<int>(width));
    for (int64_t i = 0; i < width; ++i) {
      uint16_t got = F32ToBf16(y[i]), ref = want[r * width + i];
      if (got != ref && ++mismatches <= 10)
        ADD_FAILURE() << prefix << " row " << r << " elem " << i << ": input " << x[r * width + i]
                      << ", got " << Bf16ToF32(got) << ", torch " << Bf16ToF32(ref);
    }
  }
  EXPECT_EQ(mismatches, 0) << prefix;
}

TEST_F(CodecGolden, KvFp8RoundTripBlock64) {
  CheckRoundTrip(ops(), "kv_fp8", 448, 32, [](float* y, int n) { Fp8RoundTripInPlace(y, n, 64); });
}

TEST_F(CodecGolden, Fp4RoundTripBlock32) {
  CheckRoundTrip(ops(), "fp4", 128, 32, [](float* y, int n) { Fp4RoundTripInPlace(y, n, 32); });
}

TEST_F(CodecGolden, Hadamard128MatchesFloat64Sylvester) {
  CheckRoundTrip(ops(), "hadamard", 128, 64, [](float* y, int n) { HadamardInPlace(y, n, true); });
}

}  // namespace
}  // namespace dsinfer
