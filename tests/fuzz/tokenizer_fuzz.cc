// libFuzzer target for the tokenizer (text/tokenizer.h). The first byte picks what the rest is:
//   even: text for the real V4 tokenizer (tests/fixtures/tokenizer/deepseek-v4). Encoding must
//         accept the text exactly when it is valid UTF-8 and give ids below vocab_size; valid text
//         must decode back to itself in both modes (plain text never yields an added token);
//         StreamingDetokenizer must give what Decode gives.
//   odd:  a tokenizer.json. Loading must give a status, never a crash or a hang (a file is user
//         input: it comes with the checkpoint); a file that loads must encode a few texts and
//         the input's own tail into ids it can decode, with the same stream rules.
// A broken rule aborts with the rule printed.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

using dsinfer::text::StreamingDetokenizer;
using dsinfer::text::Tokenizer;

[[noreturn]] void Broken(const char* rule) {
  std::fprintf(stderr, "broken rule: %s\n", rule);
  std::abort();
}

// Ids in range, Decode valid UTF-8, and the stream's pieces adding up to Decode. Returns the
// decoded text.
std::string CheckIds(const Tokenizer& tok, std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size() || tok.TokenBytes(id) == nullptr)
      Broken("an encoded id names no token");
  auto decoded = tok.Decode(ids);
  if (!decoded.ok()) Broken("Decode failed on ids Encode produced");
  if (!dsinfer::text::IsValidUtf8(*decoded)) Broken("Decode gave invalid UTF-8");
  StreamingDetokenizer stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.Next(id);
    if (!dsinfer::text::IsValidUtf8(piece)) Broken("a stream piece is invalid UTF-8");
    streamed += piece;
  }
  streamed += stream.Flush();
  if (streamed != *decoded) Broken("the stream differs from Decode");
  return *decoded;
}

// strict: the V4 file, where valid text must encode, plain text must not yield a special token
// and the ids must decode back to the text. Otherwise only invalid UTF-8 must be refused.
void CheckText(const Tokenizer& tok, std::string_view text, bool strict) {
  const bool valid = dsinfer::text::IsValidUtf8(text);
  for (bool allow_special : {false, true}) {
    auto ids = tok.Encode(text, allow_special);
    if (ids.ok() && !valid) Broken("Encode accepted invalid UTF-8");
    if (strict && !ids.ok() && valid) Broken("Encode refused valid UTF-8");
    if (!ids.ok()) continue;
    if (strict && !allow_special)
      for (int32_t id : *ids)
        if (tok.IsSpecial(id)) Broken("plain-text mode produced a special token");
    const std::string decoded = CheckIds(tok, *ids);
    if (strict && decoded != text) Broken("valid text did not decode back to itself");
  }
}

// Any ids, in range or not: Decode refuses the ones that name no token, the stream skips them,
// and over the ones that do the two agree.
void CheckAnyIds(const Tokenizer& tok, std::string_view bytes) {
  std::vector<int32_t> ids, known;
  for (size_t i = 0; i + 3 <= bytes.size() && ids.size() < 64; i += 3) {
    const int32_t id = static_cast<int32_t>((static_cast<uint8_t>(bytes[i]) << 16) |
                                            (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                                            static_cast<uint8_t>(bytes[i + 2])) -
                       (1 << 20);  // some negative, most past the vocabulary's end
    ids.push_back(id);
    if (tok.TokenBytes(id) != nullptr) known.push_back(id);
  }
  if (tok.Decode(ids).ok() != (known.size() == ids.size()))
    Broken("Decode accepted an unknown id or refused known ones");
  StreamingDetokenizer stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Next(id);
  streamed += stream.Flush();
  if (streamed != CheckIds(tok, known)) Broken("the stream over unknown ids differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    static const Tokenizer* v4 = [] {
      auto tok = Tokenizer::FromFile(std::string(DSINFER_SOURCE_DIR) +
                                     "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json");
      if (!tok.ok()) Broken("the V4 tokenizer fixture does not load");
      return new Tokenizer(std::move(tok).value());
    }();
    CheckText(*v4, rest, /*strict=*/true);
    if (data[0] % 4 == 2) CheckAnyIds(*v4, rest);
    return 0;
  }
  auto loaded = Tokenizer::FromJson(rest);
  if (!loaded.ok()) return 0;
  const Tokenizer& tok = *loaded;
  // Texts through a file that loads: its vocabulary and added tokens may be anything (a
  // vocabulary may lack bytes, two tokens may share an id), so the text need not encode or come
  // back, but whatever Encode gives must decode, and stream as it decodes.
  for (std::string_view text : {std::string_view("hello world"), std::string_view("ab|cd<x> \n"),
                                std::string_view("\xe4\xb8\xad\xf0\x9f\x98\x80")})
    CheckText(tok, text, /*strict=*/false);
  CheckText(tok, rest.substr(rest.size() - std::min<size_t>(rest.size(), 48)), false);
  return 0;
}
