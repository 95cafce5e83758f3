// Helpers shared by the io tests: a per-test scratch directory and raw file builders, so tests
// can hand-craft hostile safetensors bytes that no well-behaved writer would produce.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dsinfer::io::testing {

// A fresh directory removed at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("dsinfer_io_") + (info ? info->name() : "test") + "_" +
                       std::to_string(::getpid());
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void WriteText(const std::string& path, const std::string& text) {
  WriteBytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// u64-LE length + header text + data bytes. `declared_length` overrides the length field.
inline std::vector<uint8_t> RawSafetensors(const std::string& header, size_t data_bytes,
                                           int64_t declared_length = -1) {
  uint64_t n = declared_length >= 0 ? static_cast<uint64_t>(declared_length) : header.size();
  // resize + memcpy rather than insert(): GCC 12 -O3 reports a false -Warray-bounds on the latter.
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i)
    out[8 + header.size() + i] = static_cast<uint8_t>(i * 7 + 1);
  return out;
}

}  // namespace dsinfer::io::testing
