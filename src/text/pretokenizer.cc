#include "text/pretokenizer.h"

#include <cctype>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

namespace dsinfer::text {

struct RegexScratch::Impl {
  pcre2_match_data* match_data = nullptr;  // one ovector pair is all we read
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;  // created only if the default 32 KiB stack runs out

  ~Impl() {
    if (match_data) pcre2_match_data_free(match_data);
    if (match_context) pcre2_match_context_free(match_context);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
  }
};

RegexScratch::RegexScratch() : impl_(std::make_unique<Impl>()) {
  impl_->match_data = pcre2_match_data_create(1, nullptr);
}
RegexScratch::~RegexScratch() = default;

struct CompiledRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() {
    if (code) pcre2_code_free(code);
  }
};

CompiledRegex::CompiledRegex(std::unique_ptr<Code> code) : code_(std::move(code)) {}
CompiledRegex::CompiledRegex(CompiledRegex&&) noexcept = default;
CompiledRegex& CompiledRegex::operator=(CompiledRegex&&) noexcept = default;
CompiledRegex::~CompiledRegex() = default;

Result<CompiledRegex> CompiledRegex::Compile(std::string_view pattern, bool literal) {
  // PCRE2_LITERAL cannot be combined with UTF/UCP in older PCRE2, so escape instead: a
  // backslash before any ASCII punctuation makes it literal; other bytes are literal already.
  std::string escaped;
  if (literal) {
    for (char c : pattern) {
      const auto b = static_cast<uint8_t>(c);
      if (b < 0x80 && !std::isalnum(b)) escaped.push_back('\\');
      escaped.push_back(c);
    }
    pattern = escaped;
  }
  const uint32_t options = PCRE2_UTF | PCRE2_UCP;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  auto code = std::make_unique<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                             &error_code, &error_offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return InvalidArgument("pre_tokenizer regex does not compile at offset " +
                           std::to_string(error_offset) + ": " +
                           reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation only: fall back to the interpreter if this build lacks it.
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  return CompiledRegex(std::move(code));
}

Status CompiledRegex::SplitIsolated(std::string_view text, Piece piece, RegexScratch* scratch,
                                    std::vector<Piece>* out) const {
  RegexScratch::Impl* s = scratch->impl();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
  const size_t length = piece.end - piece.begin;
  size_t pos = 0;
  size_t gap_start = 0;
  while (pos <= length) {
    int rc = code_->jit ? pcre2_jit_match(code_->code, subject, length, pos, PCRE2_NO_UTF_CHECK,
                                          s->match_data, s->match_context)
                        : pcre2_match(code_->code, subject, length, pos, PCRE2_NO_UTF_CHECK,
                                      s->match_data, s->match_context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && s->jit_stack == nullptr) {
      // Long pieces can need more than the default JIT stack; grow once and retry.
      s->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      s->match_context = pcre2_match_context_create(nullptr);
      if (s->jit_stack == nullptr || s->match_context == nullptr) {
        return ResourceExhausted("cannot allocate a PCRE2 JIT stack");
      }
      pcre2_jit_stack_assign(s->match_context, nullptr, s->jit_stack);
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return Internal(std::string("pre_tokenizer regex match failed: ") +
                      reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s->match_data);
    const size_t match_begin = ovector[0];
    const size_t match_end = ovector[1];
    if (match_end == match_begin) {
      // An empty match splits nothing; step over one character to guarantee progress.
      if (match_begin >= length) break;
      pos = match_begin + 1;
      while (pos < length && (static_cast<uint8_t>(subject[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (match_begin > gap_start) {
      out->push_back({static_cast<uint32_t>(piece.begin + gap_start),
                      static_cast<uint32_t>(piece.begin + match_begin)});
    }
    out->push_back({static_cast<uint32_t>(piece.begin + match_begin),
                    static_cast<uint32_t>(piece.begin + match_end)});
    gap_start = match_end;
    pos = match_end;
  }
  if (length > gap_start) {
    out->push_back({static_cast<uint32_t>(piece.begin + gap_start), piece.end});
  }
  return Status::Ok();
}

Result<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& config) {
  PreTokenizer pre;
  if (config.is_null()) return pre;
  DSINFER_RETURN_IF_ERROR(pre.AddStep(config));
  return pre;
}

Status PreTokenizer::AddStep(const nlohmann::json& step) {
  if (!step.is_object() || !step.contains("type") || !step["type"].is_string()) {
    return InvalidArgument("pre_tokenizer entry without a string \"type\"");
  }
  const std::string type = step["type"].get<std::string>();
  if (type == "Sequence") {
    if (!step.contains("pretokenizers") || !step["pretokenizers"].is_array()) {
      return InvalidArgument("Sequence pre_tokenizer without a \"pretokenizers\" array");
    }
    for (const auto& child : step["pretokenizers"]) DSINFER_RETURN_IF_ERROR(AddStep(child));
    return Status::Ok();
  }
  if (byte_level_) {
    // Steps after ByteLevel would see byte-level characters; no supported file does that.
    return Unimplemented("pre_tokenizer step after ByteLevel: " + type);
  }
  if (type == "Split") {
    const std::string behavior = step.value("behavior", "");
    if (behavior != "Isolated") return Unimplemented("Split behavior " + behavior);
    if (step.value("invert", false)) return Unimplemented("Split with invert=true");
    if (!step.contains("pattern") || !step["pattern"].is_object()) {
      return InvalidArgument("Split pre_tokenizer without a \"pattern\" object");
    }
    const auto& pattern = step["pattern"];
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      DSINFER_ASSIGN_OR_RETURN(auto regex,
                               CompiledRegex::Compile(pattern["Regex"].get<std::string>(), false));
      splits_.push_back(std::move(regex));
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      DSINFER_ASSIGN_OR_RETURN(auto regex,
                               CompiledRegex::Compile(pattern["String"].get<std::string>(), true));
      splits_.push_back(std::move(regex));
    } else {
      return InvalidArgument("Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    if (step.value("add_prefix_space", false)) {
      return Unimplemented("ByteLevel pre_tokenizer with add_prefix_space=true");
    }
    if (step.value("use_regex", true)) {
      return Unimplemented("ByteLevel pre_tokenizer with use_regex=true");
    }
    byte_level_ = true;
    return Status::Ok();
  }
  return Unimplemented("pre_tokenizer type " + type);
}

Status PreTokenizer::Split(std::string_view text, Piece segment, RegexScratch* scratch,
                           std::vector<Piece>* out) const {
  if (segment.end <= segment.begin) return Status::Ok();
  if (splits_.empty()) {
    out->push_back(segment);
    return Status::Ok();
  }
  // Ping-pong between two buffers: step k splits every piece produced by step k-1.
  std::vector<Piece> current{segment};
  std::vector<Piece> next;
  for (size_t k = 0; k < splits_.size(); ++k) {
    std::vector<Piece>* target = k + 1 == splits_.size() ? out : &next;
    if (target == &next) next.clear();
    for (const Piece& piece : current) {
      DSINFER_RETURN_IF_ERROR(splits_[k].SplitIsolated(text, piece, scratch, target));
    }
    if (target == &next) current.swap(next);
  }
  return Status::Ok();
}

}  // namespace dsinfer::text
