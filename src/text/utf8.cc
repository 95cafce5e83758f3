#include "text/utf8.h"

namespace dsinfer::text {
namespace {

// Number of bytes of `bytes` that form a valid prefix of one UTF-8 character; equals the full
// length when the character is complete. 0 means the first byte can never start a character.
// `complete` reports whether a full character was seen.
size_t ValidPrefixLength(std::string_view bytes, bool* complete) {
  *complete = false;
  if (bytes.empty()) return 0;
  const auto b0 = static_cast<uint8_t>(bytes[0]);
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= bytes.size()) return i;  // truncated: valid so far
    const auto b = static_cast<uint8_t>(bytes[i]);
    const uint8_t min = i == 1 ? lo : 0x80;
    const uint8_t max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return i;
  }
  *complete = true;
  return need;
}

}  // namespace

size_t WellFormedSequenceLength(std::string_view bytes) {
  bool complete = false;
  const size_t n = ValidPrefixLength(bytes, &complete);
  return complete ? n : 0;
}

std::optional<size_t> FindInvalidUtf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    // ASCII fast path: 8 bytes at a time.
    while (i + 8 <= bytes.size()) {
      uint64_t word = 0;
      for (size_t k = 0; k < 8; ++k)
        word |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i + k])) << (8 * k);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= bytes.size()) break;
    const size_t n = WellFormedSequenceLength(bytes.substr(i));
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool complete = false;
    const size_t n = ValidPrefixLength(bytes.substr(i), &complete);
    if (complete) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal ill-formed subpart (>= 1 byte)
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t StreamSafePrefixLength(std::string_view bytes) {
  // A held-back tail must start with a lead byte (lead bytes are never continuation bytes, so
  // the tail starts a new character in the whole-stream parse as well) and be a valid but
  // incomplete prefix running to the end of the buffer.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    const auto b = static_cast<uint8_t>(bytes[start]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking further back
    bool complete = false;
    const size_t len = ValidPrefixLength(bytes.substr(start), &complete);
    if (!complete && len == back) return start;
    return n;
  }
  return n;
}

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<uint8_t>(s[*pos]);
  const size_t n = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  char32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < n && *pos + i < s.size(); ++i) {
    cp = (cp << 6) | (static_cast<uint8_t>(s[*pos + i]) & 0x3F);
  }
  *pos += n;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace dsinfer::text
