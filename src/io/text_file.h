// Writing small text files (JSON reports, config files) with an error that names the path.
#pragma once

#include <string>

#include "core/status.h"

namespace dsinfer::io {

// Writes `text` to `path` (truncating); IoError naming the path if it cannot be written whole.
Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace dsinfer::io
