// libFuzzer target for the UTF-8 helpers (text/utf8.h) and /proc/meminfo parsing
// (core/system_memory.h). Checks, for any bytes:
// - FindInvalidUtf8 and WellFormedSequenceLength agree: walking by sequence lengths reaches the
//   first invalid offset, or the end for valid input;
// - Utf8Lossy is valid UTF-8, the identity on valid input, and decodes back (NextCodePoint /
//   AppendUtf8 round trip);
// - StreamSafePrefixLength holds back at most 3 bytes, nothing of valid input, and converting the
//   safe prefix first never changes the conversion of the whole.
// - ParseMemAvailable never reads out of bounds and never returns a negative size.
// - ParseCpuList (sysfs cpulists, core/cpu_topology.h) returns ascending distinct ids in range,
//   and what it accepts formats (FormatCpuList) back into text that parses to the same list.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/cpu_topology.h"
#include "core/system_memory.h"
#include "text/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace text = dsinfer::text;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);

  const auto invalid = text::FindInvalidUtf8(bytes);
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t len = text::WellFormedSequenceLength(bytes.substr(pos));
    if (len == 0) break;
    if (len > 4 || pos + len > bytes.size()) std::abort();
    pos += len;
  }
  if (invalid.has_value() ? *invalid != pos : pos != bytes.size()) std::abort();

  const std::string lossy = text::Utf8Lossy(bytes);
  if (!text::IsValidUtf8(lossy)) std::abort();
  if (!invalid.has_value() && lossy != bytes) std::abort();
  std::string rebuilt;
  for (size_t at = 0; at < lossy.size();) {
    const size_t before = at;
    text::AppendUtf8(text::NextCodePoint(lossy, &at), &rebuilt);
    if (at <= before) std::abort();
  }
  if (rebuilt != lossy) std::abort();

  const size_t safe = text::StreamSafePrefixLength(bytes);
  if (safe > bytes.size() || bytes.size() - safe > 3) std::abort();
  if (!invalid.has_value() && safe != bytes.size()) std::abort();
  const std::string head = text::Utf8Lossy(bytes.substr(0, safe));
  if (lossy.compare(0, head.size(), head) != 0) std::abort();

  const auto available = dsinfer::ParseMemAvailable(bytes);
  if (available.has_value() && *available < 0) std::abort();

  const auto cpus = dsinfer::ParseCpuList(bytes);
  if (cpus.ok()) {
    for (size_t i = 0; i < cpus->size(); ++i)
      if ((*cpus)[i] < 0 || (*cpus)[i] > 65535 || (i > 0 && (*cpus)[i] <= (*cpus)[i - 1]))
        std::abort();
    const auto again = dsinfer::ParseCpuList(dsinfer::FormatCpuList(*cpus));
    if (!again.ok() || *again != *cpus) std::abort();
  }
  return 0;
}
