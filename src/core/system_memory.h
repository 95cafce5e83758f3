// This machine's physical memory, as the kernel reports it. Pure queries, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace dsinfer {

// Installed physical memory in bytes; nullopt when the system does not say.
std::optional<int64_t> TotalMemoryBytes();

// Memory a new allocation can take without swapping: /proc/meminfo's MemAvailable (free memory
// plus the page cache and other memory the kernel can reclaim); nullopt when unavailable.
std::optional<int64_t> AvailableMemoryBytes();

// MemAvailable in bytes from the text of /proc/meminfo ("MemAvailable:   123 kB"); nullopt when
// the line is missing or malformed. Exposed for tests.
std::optional<int64_t> ParseMemAvailable(std::string_view meminfo);

}  // namespace dsinfer
