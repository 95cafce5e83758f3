// Reading and writing small text files (JSON reports, config files, tokenizers) with an error
// that names the path.
#pragma once

#include <string>

#include "core/status.h"

namespace dsinfer::io {

// Writes `text` to `path` (truncating); IoError naming the path if it cannot be written whole.
Status WriteTextFile(const std::string& path, const std::string& text);
// The whole file; IoError naming the path if it cannot be read.
Result<std::string> ReadTextFile(const std::string& path);

}  // namespace dsinfer::io
