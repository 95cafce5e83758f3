// Safetensors reader and writer: round trips, exact output layout, writer misuse, and every
// class of malformed header (each error must name the file and, where there is one, the tensor).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <random>

#include "io_test_util.h"

namespace dsinfer::io {
namespace {

using testing::RawSafetensors;
using testing::ReadBytes;
using testing::ScratchDir;
using testing::WriteBytes;

constexpr DType kAllDTypes[] = {DType::kF32,    DType::kF64,    DType::kF16, DType::kBF16,
                                DType::kF8E4M3, DType::kF8E8M0, DType::kI8,  DType::kU8,
                                DType::kI16,    DType::kI32,    DType::kI64, DType::kBool};

std::vector<uint8_t> PatternBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

TEST(SafetensorsTest, RoundTripsEveryDtypeAndMetadata) {
  ScratchDir dir;
  std::vector<OwnedTensor> tensors;
  uint32_t seed = 1;
  for (DType dtype : kAllDTypes) {
    std::vector<int64_t> shape = {3, 5};
    tensors.push_back({"t." + std::string(SafetensorsName(dtype)), dtype, shape,
                       PatternBytes(15 * DTypeSize(dtype), seed++)});
  }
  tensors.push_back({"scalar", DType::kF32, {}, PatternBytes(4, 99)});
  tensors.push_back({"empty", DType::kBF16, {0, 7}, {}});
  tensors.push_back({"odd", DType::kU8, {3}, {1, 2, 3}});  // leaves later tensors unaligned
  tensors.push_back({"after_odd", DType::kI64, {2}, PatternBytes(16, 5)});
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "h\u00e9llo \"q\""}};
  const std::string path = dir.File("all.safetensors");
  Status written = WriteSafetensors(path, tensors, metadata);
  ASSERT_TRUE(written.ok()) << written.ToString();

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata(), metadata);
  EXPECT_EQ((*file)->tensors().size(), tensors.size());
  EXPECT_EQ((*file)->data_section_offset() % 8, 0u);
  EXPECT_EQ((*file)->file_size(), ReadBytes(path).size());
  for (const OwnedTensor& want : tensors) {
    const TensorInfo* info = (*file)->Find(want.name);
    ASSERT_NE(info, nullptr) << want.name;
    EXPECT_EQ(info->dtype, want.dtype) << want.name;
    EXPECT_EQ(info->shape, want.shape) << want.name;
    TensorRef ref = (*file)->Ref(*info);
    EXPECT_EQ(ref.info, info);
    EXPECT_EQ(*ref.file, path);
    EXPECT_EQ(std::vector<uint8_t>(ref.bytes.begin(), ref.bytes.end()), want.bytes) << want.name;
  }
  EXPECT_EQ((*file)->Find("absent"), nullptr);
  EXPECT_EQ((*file)->Find("scalar")->NumElements(), 1);
  EXPECT_EQ((*file)->Find("empty")->NumElements(), 0);
}

// The copy into memory puts the tensors holding most of the bytes on 64-byte boundaries: here
// an 8-byte and a 16-byte tensor first, then three 4 KiB ones (which share one offset modulo 64,
// 24 bytes past the small ones' start), and the bytes survive the shift.
TEST(SafetensorsTest, CopyIntoMemoryAlignsTheBulkOfTheTensors) {
  ScratchDir dir;
  const std::string path = dir.File("bulk.safetensors");
  std::vector<OwnedTensor> tensors = {{"a.small", DType::kU8, {8}, PatternBytes(8, 1)},
                                      {"b.small", DType::kU8, {16}, PatternBytes(16, 2)}};
  for (int i = 0; i < 3; ++i)
    tensors.push_back(
        {"c.big" + std::to_string(i), DType::kBF16, {2048}, PatternBytes(4096, 3 + i)});
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const uint64_t big_start = (*file)->data_section_offset() + 24;
  EXPECT_EQ((*file)->BulkTensorOffset(), big_start % 64);
  ASSERT_TRUE((*file)->CopyIntoMemory().ok());
  for (const OwnedTensor& want : tensors) {
    const TensorRef ref = (*file)->Ref(*(*file)->Find(want.name));
    EXPECT_EQ(std::vector<uint8_t>(ref.bytes.begin(), ref.bytes.end()), want.bytes) << want.name;
    if (want.name.starts_with("c.")) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(ref.bytes.data()) % 64, 0u) << want.name;
    }
  }
}

// Pins the byte layout (compact JSON, __metadata__ first, declaration order, space padding to
// an 8-byte boundary): checkpoint hashes in golden manifests depend on it.
TEST(SafetensorsTest, WriterLayoutIsExact) {
  ScratchDir dir;
  const std::string path = dir.File("layout.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"b", DType::kF32, {2}, std::vector<uint8_t>(8, 1)},
                                {"a", DType::kBF16, {1, 1}, {7, 9}}},
                               {{"format", "pt"}})
                  .ok());
  std::vector<uint8_t> bytes = ReadBytes(path);
  const std::string expected_json =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"BF16\",\"shape\":[1,1],\"data_offsets\":[8,10]}}";
  std::string padded = expected_json;
  while ((padded.size() + 8) % 8 != 0) padded += ' ';
  std::vector<uint8_t> expected = RawSafetensors(padded, 0);
  expected.insert(expected.end(), 8, 1);
  expected.push_back(7);
  expected.push_back(9);
  EXPECT_EQ(bytes, expected);
}

TEST(SafetensorsTest, StreamingWriterChecksOrderAndSizes) {
  ScratchDir dir;
  {
    SafetensorsWriter w;
    ASSERT_TRUE(w.Declare("x", DType::kF32, {2}).ok());
    ASSERT_TRUE(w.Declare("y", DType::kI8, {3}).ok());
    EXPECT_EQ(w.DataBytes(), 11u);
    ASSERT_TRUE(w.Begin(dir.File("a.safetensors")).ok());
    Status st = w.Write("y", std::vector<uint8_t>(3));
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("expected 'x'"), std::string::npos) << st.message();
    // The writer is failed now: later calls keep failing.
    EXPECT_FALSE(w.Write("x", std::vector<uint8_t>(8)).ok());
    EXPECT_FALSE(w.Finish().ok());
  }
  {
    SafetensorsWriter w;
    ASSERT_TRUE(w.Declare("x", DType::kF32, {2}).ok());
    ASSERT_TRUE(w.Begin(dir.File("b.safetensors")).ok());
    Status st = w.Write("x", std::vector<uint8_t>(7));
    EXPECT_NE(st.message().find("has 7 bytes, declared 8"), std::string::npos) << st.message();
  }
  {
    SafetensorsWriter w;
    ASSERT_TRUE(w.Declare("x", DType::kF32, {2}).ok());
    ASSERT_TRUE(w.Declare("y", DType::kF32, {2}).ok());
    ASSERT_TRUE(w.Begin(dir.File("c.safetensors")).ok());
    ASSERT_TRUE(w.Write("x", std::vector<uint8_t>(8)).ok());
    Status st = w.Finish();
    EXPECT_NE(st.message().find("1 declared tensors were not written"), std::string::npos);
    // The unfinished file is rejected by the reader: its header promises bytes it lacks.
    auto reread = SafetensorsFile::Open(dir.File("c.safetensors"));
    ASSERT_FALSE(reread.ok());
    EXPECT_NE(reread.status().message().find("'y'"), std::string::npos);
  }
  {
    SafetensorsWriter w;
    ASSERT_TRUE(w.Declare("x", DType::kF32, {2}).ok());
    EXPECT_FALSE(w.Declare("x", DType::kF32, {1}).ok());
    EXPECT_FALSE(w.Declare("__metadata__", DType::kF32, {1}).ok());
    EXPECT_FALSE(w.Declare("neg", DType::kF32, {-1}).ok());
    EXPECT_FALSE(w.Declare("huge", DType::kF64, {int64_t{1} << 62, 8}).ok());
    EXPECT_FALSE(w.Declare(std::string("bad\xff utf8"), DType::kF32, {1}).ok());
    ASSERT_TRUE(w.Begin(dir.File("d.safetensors")).ok());
    EXPECT_FALSE(w.Declare("late", DType::kF32, {1}).ok());
    EXPECT_FALSE(w.Begin(dir.File("d2.safetensors")).ok());
    w.SetMetadata("late", "1");
    ASSERT_TRUE(w.Write("x", std::vector<uint8_t>(8)).ok());
    Status st = w.Finish();
    EXPECT_NE(st.message().find("SetMetadata() after Begin()"), std::string::npos);
  }
  {
    SafetensorsWriter w;
    EXPECT_FALSE(w.Write("x", {}).ok());
    EXPECT_FALSE(w.Finish().ok());
  }
}

TEST(SafetensorsTest, WriteSafetensorsRejectsWrongByteCountWithoutCreatingAFile) {
  ScratchDir dir;
  const std::string path = dir.File("bad.safetensors");
  Status st = WriteSafetensors(path, {{"w", DType::kBF16, {4}, std::vector<uint8_t>(7)}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'w' has 7 bytes, its shape needs 8"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsTest, WriterReportsUncreatableFile) {
  ScratchDir dir;
  const std::string path = dir.File("no/such/dir/x.safetensors");
  Status st = WriteSafetensors(path, {{"w", DType::kU8, {1}, {1}}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find(path), std::string::npos);
  EXPECT_NE(st.message().find("No such file or directory"), std::string::npos);
}

// /dev/full accepts open() and fails every write with ENOSPC: the disk-full case.
TEST(SafetensorsTest, WriterReportsDiskFull) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  for (size_t tensor_bytes : {size_t{16}, size_t{4} << 20}) {  // buffered and direct writes
    SafetensorsWriter w;
    ASSERT_TRUE(w.Declare("w", DType::kU8, {static_cast<int64_t>(tensor_bytes)}).ok());
    Status st = w.Begin("/dev/full");
    if (st.ok()) st = w.Write("w", std::vector<uint8_t>(tensor_bytes, 1));
    if (st.ok()) st = w.Finish();
    ASSERT_FALSE(st.ok()) << "disk full went unreported for " << tensor_bytes << " bytes";
    EXPECT_EQ(st.code(), StatusCode::kIoError);
    EXPECT_NE(st.message().find("/dev/full"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
  }
}

// Guards against quadratic header building or lookup (real shards hold ~10^5 tensors).
TEST(SafetensorsTest, ManyTensorsRoundTrip) {
  ScratchDir dir;
  constexpr int kCount = 50000;
  SafetensorsWriter w;
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(w.Declare("layers." + std::to_string(i) + ".w", DType::kU8, {1}).ok());
  }
  const std::string path = dir.File("many.safetensors");
  ASSERT_TRUE(w.Begin(path).ok());
  for (int i = 0; i < kCount; ++i) {
    uint8_t b = static_cast<uint8_t>(i);
    ASSERT_TRUE(w.Write("layers." + std::to_string(i) + ".w", {&b, 1}).ok());
  }
  ASSERT_TRUE(w.Finish().ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ((*file)->tensors().size(), static_cast<size_t>(kCount));
  const TensorInfo* info = (*file)->Find("layers.12345.w");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ((*file)->Ref(*info).bytes[0], static_cast<uint8_t>(12345));
}

// ---- malformed headers ----------------------------------------------------------------------

struct BadHeader {
  const char* label;
  std::string header;         // the JSON text
  size_t data_bytes;          // bytes after the header
  const char* expected;       // substring of the error
  const char* tensor;         // tensor the message must name, or nullptr
  int64_t declared_len = -1;  // overrides the u64 length field
};

std::vector<BadHeader> BadHeaders() {
  const std::string ok_entry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  return {
      {"length past file", R"({})", 0, "runs past the end of the file", nullptr, 50},
      {"length over 100MB", R"({})", 0, "exceeds the 100 MB limit", nullptr, 200ll << 20},
      {"not json", R"({"w": )", 8, "invalid JSON at byte", nullptr},
      {"trailing garbage", R"({} x)", 0, "invalid JSON", nullptr},
      {"empty header", "", 8, "invalid JSON", nullptr},
      {"top level array", R"([1,2])", 0, "not a JSON object", nullptr},
      {"entry not object", R"({"w": 5})", 0, "entry is not a JSON object", "w"},
      {"missing dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, "dtype", "w"},
      {"dtype not string", R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8, "dtype",
       "w"},
      {"unknown dtype", R"({"w":{"dtype":"F9","shape":[2],"data_offsets":[0,8]}})", 8,
       "unknown dtype 'F9'", "w"},
      {"missing shape", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8, "shape", "w"},
      {"shape not array", R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8, "shape",
       "w"},
      {"negative dim", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "non-negative integers", "w"},
      {"float dim", R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8,
       "non-negative integers", "w"},
      {"string dim", R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8,
       "non-negative integers", "w"},
      {"dim past int64",
       R"({"w":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", 0,
       "below 2^63", "w"},
      {"dim past u64",
       R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}})", 0,
       "non-negative integers", "w"},
      {"numel overflow",
       R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0,
       "overflows 64 bits", "w"},
      {"bytes overflow",
       R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
       "overflows 64 bits", "w"},
      {"missing offsets", R"({"w":{"dtype":"F32","shape":[2]}})", 8, "data_offsets", "w"},
      {"offsets arity", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}})", 16,
       "data_offsets", "w"},
      {"negative offset", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[-1,-1]}})", 8,
       "non-negative", "w"},
      {"offset not integer", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", 8,
       "non-negative", "w"},
      {"begin after end", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8,
       "is after end", "w"},
      {"end past data", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 7,
       "past the data section (7 bytes)", "w"},
      {"huge end",
       R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}})",
       8, "past the data section", "w"},
      {"size mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "span 8 bytes but shape x F32 needs 12", "w"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
       10, "overlap tensor 'a'", "b"},
      {"identical ranges",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       8, "overlap tensor 'a'", "b"},
      {"nested range",
       R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
       10, "overlap tensor 'a'", "b"},
      {"metadata not object", R"({"__metadata__":[1]})", 0, "__metadata__ must be an object",
       nullptr},
      {"metadata value not string", R"({"__metadata__":{"k":1}})", 0,
       "__metadata__ value for key 'k' is not a string", nullptr},
      {"duplicate tensor", "{\"w\":" + ok_entry + ",\"w\":" + ok_entry + "}", 8,
       "duplicate key 'w' in the top-level object", "w"},
      {"duplicate field", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"dtype":"U8"}})",
       8, "duplicate key 'dtype' in object 'w'", "w"},
      {"duplicate metadata key", R"({"__metadata__":{"k":"1","k":"2"}})", 0,
       "duplicate key 'k' in object '__metadata__'", nullptr},
      {"deep nesting",
       "{\"w\":{\"x\":" + std::string(200000, '[') + std::string(200000, ']') + "}}", 0,
       "nested deeper than", nullptr},
      {"invalid utf8 key", "{\"w\xff\":" + ok_entry + "}", 8, "invalid JSON", nullptr},
  };
}

TEST(SafetensorsTest, MalformedHeadersAreErrorsNamingFileAndTensor) {
  ScratchDir dir;
  for (const BadHeader& c : BadHeaders()) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.File("bad.safetensors");
    WriteBytes(path, RawSafetensors(c.header, c.data_bytes, c.declared_len));
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    const std::string& msg = file.status().message();
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg.substr(0, 300);
    EXPECT_NE(msg.find(c.expected), std::string::npos) << msg.substr(0, 300);
    if (c.tensor != nullptr) {
      EXPECT_NE(msg.find("'" + std::string(c.tensor) + "'"), std::string::npos)
          << msg.substr(0, 300);
    }
  }
}

TEST(SafetensorsTest, AcceptsWhatTheFormatAllows) {
  // Gaps between tensors, empty tensors anywhere, unknown extra fields, HF-style padding,
  // an empty header object, and metadata-only files are all valid.
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
      R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[5,5]},)"
      R"("z":{"dtype":"U8","shape":[],"data_offsets":[9,10],"extra":{"k":[1]}},)"
      R"("__metadata__":{}}     )";
  std::vector<uint8_t> bytes = RawSafetensors(header, 10);
  std::map<std::string, std::string> metadata = {{"stale", "x"}};
  uint64_t data_offset = 0;
  auto parsed =
      ParseSafetensorsHeader(bytes, bytes.size(), "mem.safetensors", &metadata, &data_offset);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ((*parsed)[0].name, "a");  // sorted by name
  EXPECT_EQ((*parsed)[2].shape, std::vector<int64_t>{});
  EXPECT_TRUE(metadata.empty());
  EXPECT_EQ(data_offset, 8 + header.size());

  for (const std::string& ok :
       {std::string("{}"), std::string("{\"__metadata__\":{\"a\":\"b\"}}")}) {
    std::vector<uint8_t> raw = RawSafetensors(ok, 0);
    EXPECT_TRUE(ParseSafetensorsHeader(raw, raw.size(), nullptr, nullptr).ok()) << ok;
  }
}

TEST(SafetensorsTest, ShortPrefixIsAnErrorNotAnOverread) {
  std::vector<uint8_t> bytes = RawSafetensors(R"({"__metadata__":{"a":"b"}})", 0);
  // The caller claims a larger file but hands over only part of the header.
  std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + 12);
  auto parsed = ParseSafetensorsHeader(prefix, bytes.size(), nullptr, nullptr);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("<memory>"), std::string::npos);
  std::vector<uint8_t> tiny(bytes.begin(), bytes.begin() + 5);
  EXPECT_FALSE(ParseSafetensorsHeader(tiny, 100, nullptr, nullptr).ok());
}

// Cutting a valid file at any byte must be reported, never read past the end: every cut loses
// either header bytes or bytes the last tensor's offsets promise.
TEST(SafetensorsTest, EveryTruncationIsAnError) {
  ScratchDir dir;
  const std::string path = dir.File("full.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"a", DType::kBF16, {2, 2}, PatternBytes(8, 1)},
                                {"b", DType::kI32, {3}, PatternBytes(12, 2)},
                                {"c", DType::kU8, {0}, {}}},
                               {{"format", "pt"}})
                  .ok());
  const std::vector<uint8_t> full = ReadBytes(path);
  ASSERT_TRUE(SafetensorsFile::Open(path).ok());
  for (size_t cut = 0; cut < full.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    // An exact-size heap copy, so AddressSanitizer flags any read past the cut.
    std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut));
    EXPECT_FALSE(ParseSafetensorsHeader(prefix, prefix.size(), nullptr, nullptr).ok());
    const std::string cut_path = dir.File("cut.safetensors");
    WriteBytes(cut_path, prefix);
    auto file = SafetensorsFile::Open(cut_path);
    ASSERT_FALSE(file.ok());
    EXPECT_NE(file.status().message().find(cut_path), std::string::npos);
  }
}

// Seeded random mutations of a valid file: the parser must either reject the bytes or return
// tensors that are consistent and lie inside the buffer (ASan checks the reads).
TEST(SafetensorsTest, RandomHeaderMutationsNeverYieldOutOfBoundsTensors) {
  ScratchDir dir;
  const std::string path = dir.File("seed.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"embed", DType::kBF16, {4, 3}, PatternBytes(24, 3)},
                                {"norm", DType::kF32, {3}, PatternBytes(12, 4)},
                                {"scale", DType::kF8E8M0, {2, 1}, PatternBytes(2, 5)},
                                {"ids", DType::kI64, {2}, PatternBytes(16, 6)}},
                               {{"format", "pt"}})
                  .ok());
  const std::vector<uint8_t> seed = ReadBytes(path);
  const std::vector<std::string> tokens = {"0",
                                           "1",
                                           "-1",
                                           "8",
                                           "24",
                                           "1e3",
                                           "2.5",
                                           "18446744073709551615",
                                           "18446744073709551616",
                                           "9223372036854775808",
                                           "[",
                                           "]",
                                           "{",
                                           "}",
                                           ",",
                                           ":",
                                           "\"",
                                           "null",
                                           "true",
                                           "\"F32\"",
                                           "\"BF16\"",
                                           "\"dtype\"",
                                           "\"shape\"",
                                           "\"data_offsets\"",
                                           "\"__metadata__\"",
                                           "[0,0]",
                                           "[]",
                                           "\\u0000",
                                           "\xff",
                                           " "};
  std::mt19937_64 rng(20260212);
  constexpr int kMutations = 25000;
  int accepted = 0;
  for (int iter = 0; iter < kMutations; ++iter) {
    std::vector<uint8_t> bytes = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t header_end = 8 + std::min<size_t>(bytes.size() - 8, 400);
      const size_t pos = rng() % header_end;
      switch (rng() % 6) {
        case 0:  // flip a byte
          bytes[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:  // overwrite a byte
          bytes[pos] = static_cast<uint8_t>(rng());
          break;
        case 2:  // delete a short run
          bytes.erase(
              bytes.begin() + static_cast<ptrdiff_t>(pos),
              bytes.begin() + static_cast<ptrdiff_t>(std::min(bytes.size(), pos + 1 + rng() % 6)));
          break;
        case 3: {  // insert a JSON-ish token
          const std::string& t = tokens[rng() % tokens.size()];
          bytes.insert(bytes.begin() + static_cast<ptrdiff_t>(pos), t.begin(), t.end());
          break;
        }
        case 4: {  // replace a digit with a random number (offsets, dims)
          for (size_t p = pos; p < std::min(bytes.size(), header_end); ++p) {
            if (bytes[p] >= '0' && bytes[p] <= '9') {
              std::string n = std::to_string(rng() % 64);
              bytes.erase(bytes.begin() + static_cast<ptrdiff_t>(p));
              bytes.insert(bytes.begin() + static_cast<ptrdiff_t>(p), n.begin(), n.end());
              break;
            }
          }
          break;
        }
        case 5:  // perturb the length field
          bytes[rng() % 8] = static_cast<uint8_t>(rng());
          break;
      }
      if (bytes.size() < 8) break;
    }
    // Sometimes also cut the tail.
    if (rng() % 4 == 0 && !bytes.empty()) bytes.resize(rng() % bytes.size());
    std::map<std::string, std::string> metadata;
    uint64_t data_offset = 0;
    auto parsed = ParseSafetensorsHeader(bytes, bytes.size(), "mutant", &metadata, &data_offset);
    if (!parsed.ok()) {
      ASSERT_NE(parsed.status().message().find("mutant"), std::string::npos)
          << parsed.status().message();
      continue;
    }
    ++accepted;
    ASSERT_LE(data_offset, bytes.size());
    const uint64_t data_size = bytes.size() - data_offset;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    uint64_t checksum = 0;
    for (const TensorInfo& t : *parsed) {
      ASSERT_LE(t.data_begin, t.data_end);
      ASSERT_LE(t.data_end, data_size);
      ASSERT_EQ(t.ByteSize(), static_cast<uint64_t>(t.NumElements()) * DTypeSize(t.dtype));
      for (uint64_t i = t.data_begin; i < t.data_end; ++i) checksum += bytes[data_offset + i];
      if (t.ByteSize() > 0) ranges.push_back({t.data_begin, t.data_end});
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) ASSERT_LE(ranges[i - 1].second, ranges[i].first);
    (void)checksum;
  }
  std::printf("[ mutations ] %d mutants, %d accepted, %d rejected\n", kMutations, accepted,
              kMutations - accepted);
  // Both outcomes must occur, or the mutator is not exercising the parser.
  EXPECT_GT(accepted, 100);
  EXPECT_LT(accepted, kMutations - 1000);
}

}  // namespace
}  // namespace dsinfer::io
