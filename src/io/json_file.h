// Reading small JSON files (config.json, index files) with a size limit and errors that name
// the file and the parse position.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace dsinfer::io {

Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace dsinfer::io
