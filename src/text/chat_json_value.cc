#include "text/chat_json_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <system_error>

#include "text/utf8.h"

namespace dsinfer::text {
namespace {

constexpr int kMaxDepth = 128;  // serde_json's recursion limit

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<JsonValue> ParseDocument() {
    SkipWhitespace();
    JsonValue value;
    DSINFER_RETURN_IF_ERROR(ParseValue(0, &value));
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("trailing characters");
    return value;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  void SkipWhitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool Consume(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  Status ParseValue(int depth, JsonValue* out) {
    if (depth > kMaxDepth) return Error("nesting too deep");
    if (pos_ >= text_.size()) return Error("unexpected end");
    char c = text_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      out->kind = JsonValue::Kind::kString;
      return ParseString(&out->string_value);
    }
    if (Consume("true")) {
      out->kind = JsonValue::Kind::kBool;
      out->bool_value = true;
      return Status::Ok();
    }
    if (Consume("false")) {
      out->kind = JsonValue::Kind::kBool;
      return Status::Ok();
    }
    if (Consume("null")) {
      out->kind = JsonValue::Kind::kNull;
      return Status::Ok();
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    return Error("unexpected character");
  }

  Status ParseObject(int depth, JsonValue* out) {
    out->kind = JsonValue::Kind::kObject;
    ++pos_;
    SkipWhitespace();
    if (Consume("}")) return Status::Ok();
    while (true) {
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected object key");
      std::string key;
      DSINFER_RETURN_IF_ERROR(ParseString(&key));
      SkipWhitespace();
      if (!Consume(":")) return Error("expected ':'");
      SkipWhitespace();
      JsonValue value;
      DSINFER_RETURN_IF_ERROR(ParseValue(depth + 1, &value));
      bool replaced = false;
      for (auto& [existing_key, existing_value] : out->object) {
        if (existing_key == key) {
          existing_value = std::move(value);
          replaced = true;
          break;
        }
      }
      if (!replaced) out->object.emplace_back(std::move(key), std::move(value));
      SkipWhitespace();
      if (Consume("}")) return Status::Ok();
      if (!Consume(",")) return Error("expected ',' or '}'");
    }
  }

  Status ParseArray(int depth, JsonValue* out) {
    out->kind = JsonValue::Kind::kArray;
    ++pos_;
    SkipWhitespace();
    if (Consume("]")) return Status::Ok();
    while (true) {
      SkipWhitespace();
      JsonValue value;
      DSINFER_RETURN_IF_ERROR(ParseValue(depth + 1, &value));
      out->array.push_back(std::move(value));
      SkipWhitespace();
      if (Consume("]")) return Status::Ok();
      if (!Consume(",")) return Error("expected ',' or ']'");
    }
  }

  Status ParseHex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = text_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<uint32_t>(h - 'A' + 10);
      else
        return Error("bad hex digit");
    }
    *out = v;
    return Status::Ok();
  }

  Status ParseString(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return Status::Ok();
      }
      if (c < 0x20) return Error("control character in string");
      if (c != '\\') {
        size_t len = WellFormedSequenceLength(text_.substr(pos_));
        if (len == 0) return Error("invalid UTF-8");
        out->append(text_.substr(pos_, len));
        pos_ += len;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Error("truncated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t unit = 0;
          DSINFER_RETURN_IF_ERROR(ParseHex4(&unit));
          if (unit >= 0xDC00 && unit <= 0xDFFF) return Error("lone low surrogate");
          if (unit >= 0xD800 && unit <= 0xDBFF) {
            if (!Consume("\\u")) return Error("lone high surrogate");
            uint32_t low = 0;
            DSINFER_RETURN_IF_ERROR(ParseHex4(&low));
            if (low < 0xDC00 || low > 0xDFFF) return Error("bad surrogate pair");
            unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(static_cast<char32_t>(unit), out);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
  }

  Status ParseNumber(JsonValue* out) {
    size_t start = pos_;
    bool negative = Consume("-");
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') return Error("bad number");
    if (text_[pos_] == '0') {
      ++pos_;
      if (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9')
        return Error("leading zero");
    } else {
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    }
    bool is_float = false;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      is_float = true;
      ++pos_;
      size_t digits = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == digits) return Error("missing fraction digits");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      is_float = true;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      size_t digits = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == digits) return Error("missing exponent digits");
    }
    std::string_view literal = text_.substr(start, pos_ - start);
    const char* first = literal.data();
    const char* last = literal.data() + literal.size();
    if (!is_float) {
      // serde_json reads "-0" as the float -0.0, other integers as i64/u64 when they fit.
      if (negative) {
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(first, last, v);
        if (ec == std::errc() && ptr == last && v != 0) {
          out->kind = JsonValue::Kind::kInt;
          out->int_value = v;
          return Status::Ok();
        }
      } else {
        uint64_t v = 0;
        auto [ptr, ec] = std::from_chars(first, last, v);
        if (ec == std::errc() && ptr == last) {
          out->kind = JsonValue::Kind::kUInt;
          out->uint_value = v;
          return Status::Ok();
        }
      }
    }
    // strtod reports overflow as +-HUGE_VAL (serde: "number out of range", an error) and
    // underflow as a (signed) zero, which serde accepts.
    const std::string copy(literal);
    char* end = nullptr;
    double d = std::strtod(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size()) return Error("bad number");
    if (!std::isfinite(d)) return Error("number out of range");
    out->kind = JsonValue::Kind::kFloat;
    out->float_value = d;
    return Status::Ok();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// Shortest round-trip digits laid out per `style` (see FloatStyle).
void AppendFloat(double value, FloatStyle style, std::string* out) {
  if (value == 0) {
    out->append(std::signbit(value) ? "-0.0" : "0.0");
    return;
  }
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(result.ptr - buf));
  if (sci.front() == '-') {
    out->push_back('-');
    sci.remove_prefix(1);
  }
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits.push_back(c);
  int exponent = 0;
  std::string_view exp_text = sci.substr(e_pos + 1);
  bool exp_negative = exp_text.front() == '-';
  if (exp_text.front() == '-' || exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent);
  if (exp_negative) exponent = -exponent;
  const int length = static_cast<int>(digits.size());
  const int point = exponent + 1;  // value = 0.DIGITS * 10^point
  const int min_positional_point = style == FloatStyle::kPythonRepr ? -3 : -4;
  if (point >= length && point <= 16) {
    out->append(digits);
    out->append(static_cast<size_t>(point - length), '0');
    out->append(".0");
  } else if (point > 0 && point <= 16) {
    out->append(digits, 0, static_cast<size_t>(point));
    out->push_back('.');
    out->append(digits, static_cast<size_t>(point));
  } else if (point >= min_positional_point && point <= 0) {
    out->append("0.");
    out->append(static_cast<size_t>(-point), '0');
    out->append(digits);
  } else {
    out->push_back(digits[0]);
    if (length > 1) {
      out->push_back('.');
      out->append(digits, 1);
    }
    out->push_back('e');
    const int e = point - 1;
    out->push_back(e >= 0 ? '+' : '-');
    if (e < 0 && style == FloatStyle::kRyuPlus) {
      out->append(std::to_string(-e));
    } else {
      std::string magnitude = std::to_string(e < 0 ? -e : e);
      if (style == FloatStyle::kPythonRepr && magnitude.size() < 2) magnitude.insert(0, "0");
      out->append(magnitude);
    }
  }
}

void AppendValue(const JsonValue& value, FloatStyle style, std::string* out) {
  switch (value.kind) {
    case JsonValue::Kind::kNull:
      out->append("null");
      return;
    case JsonValue::Kind::kBool:
      out->append(value.bool_value ? "true" : "false");
      return;
    case JsonValue::Kind::kInt:
      out->append(std::to_string(value.int_value));
      return;
    case JsonValue::Kind::kUInt:
      out->append(std::to_string(value.uint_value));
      return;
    case JsonValue::Kind::kFloat:
      AppendFloat(value.float_value, style, out);
      return;
    case JsonValue::Kind::kString:
      out->push_back('"');
      AppendJsonEscaped(value.string_value, out);
      out->push_back('"');
      return;
    case JsonValue::Kind::kArray:
      out->push_back('[');
      for (size_t i = 0; i < value.array.size(); ++i) {
        if (i) out->append(", ");
        AppendValue(value.array[i], style, out);
      }
      out->push_back(']');
      return;
    case JsonValue::Kind::kObject:
      out->push_back('{');
      for (size_t i = 0; i < value.object.size(); ++i) {
        if (i) out->append(", ");
        out->push_back('"');
        AppendJsonEscaped(value.object[i].first, out);
        out->append("\": ");
        AppendValue(value.object[i].second, style, out);
      }
      out->push_back('}');
      return;
  }
}

}  // namespace

Result<JsonValue> ParseJson(std::string_view text) { return Parser(text).ParseDocument(); }

std::string StringifyPythonStyle(const JsonValue& value, FloatStyle floats) {
  std::string out;
  AppendValue(value, floats, &out);
  return out;
}

void AppendJsonEscaped(std::string_view text, std::string* out) {
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(ch);
        }
    }
  }
}

}  // namespace dsinfer::text
