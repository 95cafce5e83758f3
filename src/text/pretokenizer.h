// Pre-tokenization as HF `tokenizers` does it for byte-level BPE files: a sequence of Split
// steps (regex or literal pattern, behavior "Isolated", invert=false) followed by ByteLevel
// (add_prefix_space=false, use_regex=false, which only maps bytes and does not split).
// Other behaviours are rejected at load time as Unimplemented rather than approximated.
//
// Pieces are byte ranges into the caller's text; nothing is copied. Each Split step runs its
// regex on one piece at a time, with the piece as the whole subject, so anchors and lookarounds
// see the piece boundaries exactly as HF's per-piece splitting does.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsinfer::text {

// A half-open byte range [begin, end) of the text being tokenized.
struct Piece {
  uint32_t begin = 0;
  uint32_t end = 0;
};

// Per-call matching state (PCRE2 match data, JIT stack). Not shared between threads; the
// compiled patterns it is used with are.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

  struct Impl;
  Impl* impl() { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// One compiled pattern (PCRE2, UTF + UCP, JIT when available).
class CompiledRegex {
 public:
  // literal=true treats `pattern` as a plain string (HF's {"String": ...} patterns).
  static Result<CompiledRegex> Compile(std::string_view pattern, bool literal);
  CompiledRegex(CompiledRegex&&) noexcept;
  CompiledRegex& operator=(CompiledRegex&&) noexcept;
  ~CompiledRegex();

  // Appends to `out` the pieces of `piece` after an Isolated split: each match and each
  // non-empty gap between matches, in order. `text` must be valid UTF-8.
  Status SplitIsolated(std::string_view text, Piece piece, RegexScratch* scratch,
                       std::vector<Piece>* out) const;

 private:
  struct Code;
  explicit CompiledRegex(std::unique_ptr<Code> code);
  std::unique_ptr<Code> code_;
};

class PreTokenizer {
 public:
  // `config` is the tokenizer.json "pre_tokenizer" value (may be null).
  static Result<PreTokenizer> FromJson(const nlohmann::json& config);

  // Splits text[segment] into pre-tokens appended to `out`. Reuses `scratch` buffers.
  Status Split(std::string_view text, Piece segment, RegexScratch* scratch,
               std::vector<Piece>* out) const;

  // Whether a ByteLevel step was present (the BPE model then works on bytes).
  bool byte_level() const { return byte_level_; }

 private:
  Status AddStep(const nlohmann::json& step);

  std::vector<CompiledRegex> splits_;  // applied in order, each to every piece of the previous
  bool byte_level_ = false;
};

}  // namespace dsinfer::text
