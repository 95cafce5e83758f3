// A small order-preserving JSON value used by prompt rendering. The renderer must reproduce
// deepseek-recipe byte for byte, which depends on details general JSON libraries do not keep:
// object key order with duplicate keys replaced in place, integers vs floats ("-0" is a float),
// strict RFC 8259 parsing (what serde_json accepts), and its Python-style printing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace dsinfer::text {

struct JsonValue {
  // Declared here, defined below the struct: the members hold JsonValue themselves, and clang
  // with libstdc++ 12 rejects the implicit definitions while the type is still incomplete.
  JsonValue();
  JsonValue(const JsonValue&);
  JsonValue(JsonValue&&) noexcept;
  JsonValue& operator=(const JsonValue&);
  JsonValue& operator=(JsonValue&&) noexcept;
  ~JsonValue();

  enum class Kind { kNull, kBool, kInt, kUInt, kFloat, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool bool_value = false;
  int64_t int_value = 0;    // kInt (negative integers that fit int64)
  uint64_t uint_value = 0;  // kUInt (non-negative integers that fit uint64)
  double float_value = 0;   // kFloat (finite)
  std::string string_value;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // insertion order, unique keys
};

inline JsonValue::JsonValue() = default;
inline JsonValue::JsonValue(const JsonValue&) = default;
inline JsonValue::JsonValue(JsonValue&&) noexcept = default;
inline JsonValue& JsonValue::operator=(const JsonValue&) = default;
inline JsonValue& JsonValue::operator=(JsonValue&&) noexcept = default;
inline JsonValue::~JsonValue() = default;

// Strict parse of a whole document (surrounding whitespace allowed). Rejects what serde_json
// rejects: trailing text, leading zeros, "1.", lone surrogates, raw control characters in
// strings, non-finite numbers, nesting deeper than 128. A duplicate key keeps its first
// position and takes the last value.
Result<JsonValue> ParseJson(std::string_view text);

// How floats are spelled. Both use the shortest round-trip digits.
enum class FloatStyle {
  kRyuPlus,     // V4: ryu's layout (positional for 1e-5 <= |x| < 1e16), "e+" for positive exponents
  kPythonRepr,  // V4.1: Python repr (positional for 1e-4 <= |x| < 1e16, exponent >= 2 digits)
};

// deepseek-recipe's stringify_python_style: separators ", " and ": ", non-ASCII written raw.
std::string StringifyPythonStyle(const JsonValue& value, FloatStyle floats);

// Appends `text` as the body of a JSON string (no quotes), escaping only '"', '\\' and control
// characters, the way serde_json does.
void AppendJsonEscaped(std::string_view text, std::string* out);

}  // namespace dsinfer::text
