#include "text/engram_token_map.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <unordered_map>

#include "text/utf8.h"

namespace dsinfer::text {

namespace {

// UTF-8 <-> UTF-16 for ICU (the input is valid UTF-8: it comes from the lossy decoder).
std::u16string ToUtf16(std::string_view s) {
  std::u16string out;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t cp = NextCodePoint(s, &pos);
    if (cp < 0x10000) {
      out.push_back(static_cast<char16_t>(cp));
    } else {
      out.push_back(static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF)));
    }
  }
  return out;
}

std::u32string ToCodePoints(const std::u16string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char16_t u = s[i];
    if (u >= 0xD800 && u < 0xDC00 && i + 1 < s.size() && s[i + 1] >= 0xDC00 && s[i + 1] < 0xE000) {
      out.push_back(0x10000 + ((static_cast<char32_t>(u) - 0xD800) << 10) + (s[i + 1] - 0xDC00));
      ++i;
    } else {
      out.push_back(u);
    }
  }
  return out;
}

Result<std::u16string> Normalize(const UNormalizer2* n, const std::u16string& in) {
  UErrorCode err = U_ZERO_ERROR;
  const auto* src = reinterpret_cast<const UChar*>(in.data());
  const int32_t len = unorm2_normalize(n, src, static_cast<int32_t>(in.size()), nullptr, 0, &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err))
    return Internal(std::string("ICU normalisation failed: ") + u_errorName(err));
  std::u16string out(static_cast<size_t>(len), u'\0');
  err = U_ZERO_ERROR;
  unorm2_normalize(n, src, static_cast<int32_t>(in.size()), reinterpret_cast<UChar*>(out.data()),
                   len, &err);
  if (U_FAILURE(err)) return Internal(std::string("ICU normalisation failed: ") + u_errorName(err));
  return out;
}

// Rust's char::to_lowercase of one code point (full case mapping without context), which HF
// tokenizers' Lowercase applies character by character. A lone character has no casing context,
// so ICU's root-locale full mapping of it is the same.
void AppendLower(char32_t cp, std::u32string* out) {
  UChar src[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, static_cast<UChar32>(cp));
  UChar dst[8];
  UErrorCode err = U_ZERO_ERROR;
  const int32_t len = u_strToLower(dst, 8, src, n, "", &err);
  if (U_FAILURE(err) || len > 8) {
    out->push_back(cp);
    return;
  }
  for (char32_t c : ToCodePoints(
           std::u16string(reinterpret_cast<const char16_t*>(dst), static_cast<size_t>(len))))
    out->push_back(c);
}

bool IsMark(char32_t cp) {
  const int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK;
}

}  // namespace

Result<std::string> EngramNormalize(std::string_view text) {
  if (!IsValidUtf8(text)) return InvalidArgument("EngramNormalize: input is not UTF-8");
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* nfkc = unorm2_getNFKCInstance(&err);
  const UNormalizer2* nfd = unorm2_getNFDInstance(&err);
  if (U_FAILURE(err)) return Internal(std::string("ICU normalizers: ") + u_errorName(err));
  DSINFER_ASSIGN_OR_RETURN(std::u16string s, Normalize(nfkc, ToUtf16(text)));
  DSINFER_ASSIGN_OR_RETURN(s, Normalize(nfd, s));
  // Strip marks, lowercase.
  std::u32string lowered;
  for (char32_t cp : ToCodePoints(s))
    if (!IsMark(cp)) AppendLower(cp, &lowered);
  // [ \t\r\n]+ -> " ".
  std::u32string collapsed;
  for (char32_t cp : lowered) {
    const bool ws = cp == U' ' || cp == U'\t' || cp == U'\r' || cp == U'\n';
    if (!ws) {
      collapsed.push_back(cp);
    } else if (collapsed.empty() || collapsed.back() != U' ') {  // every " " is a run's
      collapsed.push_back(U' ');
    }
  }
  // Strip Unicode whitespace at both ends, except that a lone " " is kept.
  if (collapsed != U" ") {
    size_t b = 0, e = collapsed.size();
    while (b < e && u_isUWhiteSpace(static_cast<UChar32>(collapsed[b]))) ++b;
    while (e > b && u_isUWhiteSpace(static_cast<UChar32>(collapsed[e - 1]))) --e;
    collapsed = collapsed.substr(b, e - b);
  }
  std::string out;
  for (char32_t cp : collapsed) AppendUtf8(cp, &out);
  return out;
}

Result<EngramTokenMap> BuildEngramTokenMap(const Tokenizer& tokenizer) {
  EngramTokenMap map;
  const int32_t n = tokenizer.vocab_size();
  map.class_of.assign(static_cast<size_t>(n), -1);
  std::unordered_map<std::string, int32_t> class_of_key;
  for (int32_t id = 0; id < n; ++id) {
    const std::string* raw = tokenizer.TokenString(id);
    if (raw == nullptr)
      return InvalidArgument("Engram token map: id " + std::to_string(id) +
                             " names no token (the tokenizer's ids must be contiguous)");
    const int32_t one[1] = {id};
    DSINFER_ASSIGN_OR_RETURN(std::string text, tokenizer.Decode(one, false));
    std::string key;
    if (text.find("\xEF\xBF\xBD") != std::string::npos) {  // U+FFFD: a partial character
      key = *raw;
    } else {
      DSINFER_ASSIGN_OR_RETURN(key, EngramNormalize(text));
      if (key.empty()) key = text;
    }
    auto [it, fresh] = class_of_key.emplace(std::move(key), static_cast<int32_t>(map.classes));
    if (fresh) ++map.classes;
    map.class_of[static_cast<size_t>(id)] = it->second;
  }
  return map;
}

}  // namespace dsinfer::text
