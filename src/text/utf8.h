// UTF-8 helpers for the tokenizer: strict validation, Rust-compatible lossy conversion (what HF
// `tokenizers` applies when decoding), and the split point used by streaming detokenization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsinfer::text {

// Length of the well-formed UTF-8 sequence starting at bytes[0], or 0 if it is ill-formed or
// truncated. Follows the Unicode "well-formed UTF-8 byte sequences" table (no overlongs, no
// surrogates, nothing above U+10FFFF).
size_t WellFormedSequenceLength(std::string_view bytes);

// Byte offset of the first ill-formed sequence, or nullopt if `bytes` is valid UTF-8.
std::optional<size_t> FindInvalidUtf8(std::string_view bytes);
inline bool IsValidUtf8(std::string_view bytes) { return !FindInvalidUtf8(bytes).has_value(); }

// Replaces each maximal ill-formed subpart with U+FFFD, exactly as Rust's
// String::from_utf8_lossy does (the Unicode "substitution of maximal subparts" practice).
std::string Utf8Lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that can be converted now without changing the result
// of converting the whole stream later: everything except a trailing sequence that is an
// incomplete-but-still-possible UTF-8 character (at most 3 bytes).
size_t StreamSafePrefixLength(std::string_view bytes);

// Decodes the character at *pos of valid UTF-8 `s` and advances *pos past it.
char32_t NextCodePoint(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `code_point` (must be a Unicode scalar value).
void AppendUtf8(char32_t code_point, std::string* out);

}  // namespace dsinfer::text
