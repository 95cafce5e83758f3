// libFuzzer target for ParseSafetensorsHeader. The first input byte picks the mode:
//   even: the rest is a whole file (length field, header, data) - exercises the length checks;
//   odd:  the rest is header JSON, wrapped with a correct length field and a 256-byte data
//         section - lets the fuzzer spend its time on the JSON and the tensor validation.
// Accepted headers must describe consistent, in-bounds, non-overlapping tensors; the target
// touches every tensor byte so AddressSanitizer sees any out-of-bounds range.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"

namespace {

constexpr size_t kSyntheticDataBytes = 256;

void CheckAccepted(const std::vector<dsinfer::io::TensorInfo>& tensors,
                   std::span<const uint8_t> file, uint64_t data_offset) {
  if (data_offset > file.size()) std::abort();
  const uint64_t data_size = file.size() - data_offset;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  volatile uint8_t sink = 0;
  for (const auto& t : tensors) {
    if (t.data_begin > t.data_end || t.data_end > data_size) std::abort();
    if (t.ByteSize() != static_cast<uint64_t>(t.NumElements()) * dsinfer::DTypeSize(t.dtype)) {
      std::abort();
    }
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
    }
    for (uint64_t i = t.data_begin; i < t.data_end; ++i) sink = sink + file[data_offset + i];
    if (t.ByteSize() > 0) ranges.emplace_back(t.data_begin, t.data_end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].second > ranges[i].first) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<uint8_t> file;
  if ((data[0] & 1) == 0) {
    file.assign(data + 1, data + size);
  } else {
    const uint64_t header_len = size - 1;
    file.resize(8 + header_len + kSyntheticDataBytes);
    for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(header_len >> (8 * i));
    std::copy(data + 1, data + size, file.begin() + 8);
    for (size_t i = 0; i < kSyntheticDataBytes; ++i) {
      file[8 + header_len + i] = static_cast<uint8_t>(i);
    }
  }
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;
  auto parsed =
      dsinfer::io::ParseSafetensorsHeader(file, file.size(), "fuzz", &metadata, &data_offset);
  if (parsed.ok()) {
    CheckAccepted(*parsed, file, data_offset);
  } else if (parsed.status().message().find("fuzz") == std::string::npos) {
    std::abort();  // every error must name its source
  }
  return 0;
}
