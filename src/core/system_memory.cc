#include "core/system_memory.h"

#include <unistd.h>

#include <charconv>
#include <fstream>
#include <iterator>
#include <string>

namespace dsinfer {
namespace {

// sysconf's page count `pages_name` (_SC_PHYS_PAGES, _SC_AVPHYS_PAGES) in bytes.
std::optional<int64_t> PagesInBytes(int pages_name) {
  const long pages = ::sysconf(pages_name), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::nullopt;
  return static_cast<int64_t>(pages) * page;
}

}  // namespace

std::optional<int64_t> TotalMemoryBytes() { return PagesInBytes(_SC_PHYS_PAGES); }

std::optional<int64_t> ParseMemAvailable(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  size_t at = 0;
  while (true) {  // the key at the start of a line
    at = meminfo.find(kKey, at);
    if (at == std::string_view::npos) return std::nullopt;
    if (at == 0 || meminfo[at - 1] == '\n') break;
    at += kKey.size();
  }
  std::string_view rest = meminfo.substr(at + kKey.size());
  const size_t digits = rest.find_first_not_of(' ');
  if (digits == std::string_view::npos) return std::nullopt;
  rest = rest.substr(digits);
  int64_t kib = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
  if (error != std::errc() || kib < 0 || kib > (int64_t{1} << 50)) return std::nullopt;
  const std::string_view unit = rest.substr(end - rest.data());
  if (unit.substr(0, 3) != " kB") return std::nullopt;
  return kib * 1024;
}

std::optional<int64_t> AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  if (in) {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (auto bytes = ParseMemAvailable(text)) return bytes;
  }
  return PagesInBytes(_SC_AVPHYS_PAGES);  // free pages only: an underestimate
}

}  // namespace dsinfer
