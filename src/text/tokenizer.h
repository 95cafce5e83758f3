// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json, token-for-token identical
// to HF `tokenizers` 0.23.3 for the DeepSeek V3/V4 files (see tests/fixtures/tokenizer/).
//
// Supported subset (anything else fails to load with Unimplemented, never silently differs):
//   normalizer: none or an empty Sequence; pre_tokenizer: Sequence of Split(Isolated, invert=false)
//   + ByteLevel(add_prefix_space=false, use_regex=false); model: BPE (merges "a b" or [a, b],
//   ignore_merges); decoder: ByteLevel; added_tokens with lstrip/rstrip/single_word all false.
//   The post_processor is ignored: Encode is HF encode(text, add_special_tokens=False).
//
// Thread-safety: immutable after loading; Encode/Decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsinfer::text {

class Tokenizer {
 public:
  // Reads an HF tokenizer.json. If a tokenizer_config.json sits in the same directory, its
  // bos_token/eos_token name the BOS/EOS tokens.
  static Result<Tokenizer> FromFile(const std::string& tokenizer_json_path);
  static Result<Tokenizer> FromJson(std::string_view json);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // allow_special=true: added tokens (special or not) written in the text are recognised, as HF
  // encode(text, add_special_tokens=False) does. allow_special=false: plain-text mode, the text
  // is pre-tokenized and BPE-encoded as if no added tokens existed (a user typing "<｜User｜>" gets
  // ordinary text tokens). Invalid UTF-8 -> InvalidArgument.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool allow_special) const;

  // HF decode(ids, skip_special_tokens=False): token strings are mapped back to bytes by the
  // ByteLevel decoder (tokens with characters outside the byte table, e.g. "<｜User｜>", pass
  // through as their UTF-8) and the bytes are converted lossily (ill-formed UTF-8 -> U+FFFD, as
  // Rust's from_utf8_lossy). The result is therefore always valid UTF-8. An id that names no
  // token -> OutOfRange (HF would silently drop it).
  Result<std::string> Decode(std::span<const int32_t> ids) const;
  // Same with skip_special_tokens: added tokens flagged "special" are left out.
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // Special/added token or regular vocab token (byte-level spelling, e.g. "Ġthe") -> id.
  std::optional<int32_t> TokenId(std::string_view token) const;
  // Largest id + 1 over vocab and added tokens (HF get_vocab_size(with_added_tokens=True)).
  int32_t vocab_size() const;
  // From tokenizer_config.json when present, else the conventional DeepSeek/Llama names.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  // The raw bytes a token decodes to (before the lossy UTF-8 conversion); nullptr if `id` names
  // no token. Used by StreamingDetokenizer.
  const std::string* TokenBytes(int32_t id) const;
  // The token as the tokenizer spells it (HF convert_ids_to_tokens: "Ġthe", "<｜User｜>");
  // nullptr if `id` names no token.
  const std::string* TokenString(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  // An added token (special or not: "<think>", the DSML markers, BOS/EOS), not a BPE vocab entry.
  // Structured outputs never let one stand for its text (the grammar sees it as no text).
  bool IsAddedToken(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// tokenizer_json with added tokens' contents replaced as overlay_json says
// ({"added_token_content": {"<id>": "<content>", ...}}; every id must be an added token): the V4.1
// tokenizer is V4's with tests/fixtures/v41/tokenizer_overlay.json applied. Returns the JSON text.
Result<std::string> ApplyAddedTokenOverlay(std::string_view tokenizer_json,
                                           std::string_view overlay_json);

// Turns a stream of ids into text pieces, each valid UTF-8: bytes of a character split across
// tokens are held back until the character completes. The concatenation of all Next() results
// and Flush() equals Tokenizer::Decode of the whole id sequence. Ids that name no token are
// ignored (Decode would report them as an error).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok);
  std::string Next(int32_t id);
  // Remainder at end of stream: an unfinished character becomes U+FFFD, as in Decode.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // undecided tail bytes, at most 3 (an incomplete character)
};

}  // namespace dsinfer::text
