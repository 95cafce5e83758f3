// What config.cc (V4) and config_v41.cc (V4.1) share: typed field reads of config.json with
// errors naming the key, and the V4.1 parts of parsing, validation, ToJson and the presets.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace dsinfer::model::internal {

// Reads an optional field of the official config; type mismatches are errors naming the key.
template <typename T>
inline Status ReadField(const nlohmann::json& j, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required)
      return InvalidArgument(std::string("config.json: missing required field '") + key + "'");
    return Status::Ok();
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean())
      return InvalidArgument(std::string("config.json: '") + key + "' must be a boolean");
    *out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer())
      return InvalidArgument(std::string("config.json: '") + key + "' must be an integer");
    int64_t v = it->get<int64_t>();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max()))
      return InvalidArgument(std::string("config.json: '") + key + "' is out of range");
    *out = static_cast<T>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number())
      return InvalidArgument(std::string("config.json: '") + key + "' must be a number");
    *out = static_cast<T>(it->get<double>());
  } else {
    if (!it->is_string())
      return InvalidArgument(std::string("config.json: '") + key + "' must be a string");
    *out = it->get<std::string>();
  }
  return Status::Ok();
}

inline Status Positive(const char* name, int64_t v) {
  if (v <= 0)
    return InvalidArgument(std::string("config: ") + name + " must be positive, got " +
                           std::to_string(v));
  return Status::Ok();
}

// V4.1 (config_v41.cc).
bool LooksLikeV41(const nlohmann::json& j);
Result<ModelConfig> FromJsonV41(const nlohmann::json& j);
Status ValidateV41(const ModelConfig& c);
nlohmann::json ToJsonV41(const ModelConfig& c);
Result<ModelConfig> V41PresetConfig(const std::string& name);
std::vector<std::string> V41PresetNames();

}  // namespace dsinfer::model::internal
