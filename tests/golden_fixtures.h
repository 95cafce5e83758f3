// Reading the committed transformers goldens (tests/fixtures/golden/<preset>, written by
// reference/make_goldens.py) and measuring logits against them; shared by the CPU golden suite
// (tests/backend/golden_test.cc) and the GPU one (tests/cuda/cuda_model_test.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "io/safetensors.h"

namespace dsinfer::testing {

// The source tree's fixtures; the environment variable DSINFER_SOURCE_DIR overrides the tree the
// binary was built from (test binaries built on one machine and run on another, as
// scripts/gpu-check.sh with DSINFER_GPU_CHECK_PREBUILT does).
inline std::string FixtureDir(const std::string& relative) {
  const char* env = std::getenv("DSINFER_SOURCE_DIR");
  const std::string root = env != nullptr && *env != '\0' ? env : DSINFER_SOURCE_DIR;
  return root + "/tests/fixtures/" + relative;
}
inline std::string GoldenFixtureDir(const std::string& preset) {
  return FixtureDir("golden/" + preset);
}

// A file's SHA-256 in hex (a regenerated checkpoint against the one a golden was made from).
inline std::string FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Sha256 h;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(buf.data()),
                                      static_cast<size_t>(in.gcount())));
  }
  return HexDigest(h.Finish());
}

// The tensor `name` of f as a vector of T (empty when absent).
template <typename T>
std::vector<T> ReadGoldenTensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo* info = f.Find(name);
  if (info == nullptr) return {};
  auto ref = f.Ref(*info);
  std::vector<T> out(ref.bytes.size() / sizeof(T));
  std::memcpy(out.data(), ref.bytes.data(), out.size() * sizeof(T));
  return out;
}

// One row of logits a against the reference b [n]: NMSE = |a - b|^2 / |b|^2, the largest
// |a - b| and that divided by max |b| (the golden budgets' quantities).
struct LogitsError {
  double nmse = 0, max_abs = 0, max_rel = 0;
};
inline LogitsError CompareLogits(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0, maxabs_b = 0, maxdiff = 0;
  for (int64_t v = 0; v < n; ++v) {
    const double d = static_cast<double>(a[v]) - b[v];
    num += d * d, den += static_cast<double>(b[v]) * b[v];
    maxabs_b = std::max(maxabs_b, std::fabs(static_cast<double>(b[v])));
    maxdiff = std::max(maxdiff, std::fabs(d));
  }
  return {num / std::max(den, 1e-30), maxdiff, maxdiff / std::max(maxabs_b, 1e-30)};
}

}  // namespace dsinfer::testing
