#include "text/tokenizer.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "text/pretokenizer.h"
#include "text/tokenizer_bpe.h"
#include "text/utf8.h"

namespace dsinfer::text {
namespace {

using Json = nlohmann::json;

// Leftmost-longest literal matching over a set of token strings (what HF's added-vocabulary
// Aho-Corasick with MatchKind::LeftmostLongest computes), via a byte trie.
class LiteralMatcher {
 public:
  struct Match {
    size_t begin = 0;
    size_t end = 0;
    int32_t id = 0;
  };

  void Add(std::string_view literal, int32_t id) {
    if (literal.empty()) return;
    int32_t node = 0;
    for (char c : literal) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t child = Child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.push_back({});
        nodes_[node].children.push_back({byte, child});
      }
      node = child;
    }
    if (nodes_[node].token_id < 0) nodes_[node].token_id = id;  // first listed wins, as in HF
    first_byte_[static_cast<uint8_t>(literal[0])] = true;
  }

  bool empty() const { return nodes_.size() == 1; }

  // First match starting in [from, to) and ending by `to`; longest among those at that start.
  std::optional<Match> Find(std::string_view text, size_t from, size_t to) const {
    for (size_t i = from; i < to; ++i) {
      if (!first_byte_[static_cast<uint8_t>(text[i])]) continue;
      int32_t node = 0;
      std::optional<Match> best;
      for (size_t j = i; j < to; ++j) {
        node = Child(node, static_cast<uint8_t>(text[j]));
        if (node < 0) break;
        if (nodes_[node].token_id >= 0) best = Match{i, j + 1, nodes_[node].token_id};
      }
      if (best) return best;
    }
    return std::nullopt;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node index)
    int32_t token_id = -1;
  };
  int32_t Child(int32_t node, uint8_t byte) const {
    for (const auto& [b, child] : nodes_[node].children) {
      if (b == byte) return child;
    }
    return -1;
  }

  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<bool, 256> first_byte_{};
};

Status CheckNormalizer(const Json& normalizer) {
  if (normalizer.is_null()) return Status::Ok();
  if (normalizer.is_object() && normalizer.value("type", "") == "Sequence" &&
      normalizer.contains("normalizers") && normalizer["normalizers"].is_array() &&
      normalizer["normalizers"].empty()) {
    return Status::Ok();
  }
  return Unimplemented("normalizer " + normalizer.dump().substr(0, 200));
}

Status CheckDecoder(const Json& decoder) {
  if (decoder.is_object() && decoder.value("type", "") == "ByteLevel") return Status::Ok();
  if (decoder.is_object() && decoder.value("type", "") == "Sequence" &&
      decoder.contains("decoders") && decoder["decoders"].is_array() &&
      decoder["decoders"].size() == 1) {
    return CheckDecoder(decoder["decoders"][0]);
  }
  return Unimplemented("decoder " + decoder.dump().substr(0, 200) + " (only ByteLevel)");
}

// root[key] by reference (json::value() would copy the multi-megabyte model), null if absent.
const Json& Member(const Json& root, const char* key) {
  static const Json kNull;  // immutable
  auto it = root.find(key);
  return it == root.end() ? kNull : *it;
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return IoError("cannot read " + path);
  return buffer.str();
}

// bos_token / eos_token of a tokenizer_config.json: a string or {"content": string}.
std::optional<std::string> ConfigTokenName(const Json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

struct Tokenizer::Impl {
  BpeModel bpe;
  PreTokenizer pre_tokenizer;
  LiteralMatcher raw_added;         // added tokens with normalized=false: matched first
  LiteralMatcher normalized_added;  // normalized=true: matched in the remaining gaps
  std::unordered_map<std::string, int32_t> added_ids;  // content -> id
  std::vector<std::string> token_bytes;                // [vocab_size] decoded bytes of each id
  std::vector<std::string> token_strings;              // [vocab_size] vocab / added spelling
  std::vector<uint8_t> token_kind;                     // [vocab_size] a Kind per id
  std::optional<int32_t> bos, eos;

  enum Kind : uint8_t { kNone = 0, kVocab = 1, kAdded = 2, kSpecial = 3 };

  Status EncodePlain(std::string_view text, Piece segment, RegexScratch* scratch,
                     std::vector<Piece>* pieces, std::vector<int32_t>* ids) const {
    pieces->clear();
    DSINFER_RETURN_IF_ERROR(pre_tokenizer.Split(text, segment, scratch, pieces));
    for (const Piece& p : *pieces) bpe.EncodeWord(text.substr(p.begin, p.end - p.begin), ids);
    return Status::Ok();
  }

  Status EncodeWithNormalizedAdded(std::string_view text, Piece segment, RegexScratch* scratch,
                                   std::vector<Piece>* pieces, std::vector<int32_t>* ids) const {
    size_t pos = segment.begin;
    while (auto m = normalized_added.Find(text, pos, segment.end)) {
      DSINFER_RETURN_IF_ERROR(
          EncodePlain(text, {static_cast<uint32_t>(pos), static_cast<uint32_t>(m->begin)}, scratch,
                      pieces, ids));
      ids->push_back(m->id);
      pos = m->end;
    }
    return EncodePlain(text, {static_cast<uint32_t>(pos), segment.end}, scratch, pieces, ids);
  }

  // `tables`: vocab/merges streamed out of the parse, if the file had them in the usual place.
  Status Build(const Json& root, std::optional<BpeModel::Tables> tables) {
    if (!root.is_object()) return InvalidArgument("tokenizer.json is not a JSON object");
    DSINFER_RETURN_IF_ERROR(CheckNormalizer(Member(root, "normalizer")));
    DSINFER_RETURN_IF_ERROR(CheckDecoder(Member(root, "decoder")));
    DSINFER_ASSIGN_OR_RETURN(pre_tokenizer, PreTokenizer::FromJson(Member(root, "pre_tokenizer")));
    if (!pre_tokenizer.byte_level()) {
      return Unimplemented("pre_tokenizer without ByteLevel (only byte-level BPE is supported)");
    }
    if (tables) {
      DSINFER_ASSIGN_OR_RETURN(bpe,
                               BpeModel::FromTables(Member(root, "model"), std::move(*tables)));
    } else {
      DSINFER_ASSIGN_OR_RETURN(bpe, BpeModel::FromJson(Member(root, "model")));
    }

    struct Added {
      std::string content;
      int32_t id;
      bool special;
    };
    std::vector<Added> added;
    if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
      if (!root["added_tokens"].is_array()) return InvalidArgument("added_tokens is not an array");
      for (const Json& t : root["added_tokens"]) {
        if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
            !t.contains("id") || !IsValidTokenId(t["id"])) {
          return InvalidArgument("added token without string content and a valid id (" +
                                 ValidTokenIdRule() + "): " + t.dump().substr(0, 200));
        }
        for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
          if (t.value(flag, false)) return Unimplemented(std::string("added token ") + flag);
        }
        const bool special = t.value("special", false);
        const bool normalized = t.value("normalized", !special);  // HF's default
        std::string content = t["content"].get<std::string>();
        if (!IsValidUtf8(content)) return InvalidArgument("added token content is not UTF-8");
        int32_t id = t["id"].get<int32_t>();
        // HF keeps the model's id for a token already in the vocab.
        if (auto it = bpe.vocab().find(content); it != bpe.vocab().end()) id = it->second;
        if (added_ids.count(content)) continue;
        added_ids.emplace(content, id);
        (normalized ? normalized_added : raw_added).Add(content, id);
        added.push_back({std::move(content), id, special});
      }
    }

    int32_t size = 0;
    for (const auto& [token, id] : bpe.vocab()) size = std::max(size, id + 1);
    for (const Added& a : added) size = std::max(size, a.id + 1);
    token_bytes.assign(size, std::string());
    token_strings.assign(size, std::string());
    token_kind.assign(size, kNone);
    auto decoded_bytes = [](const std::string& token) {
      // ByteLevel decoder: all characters through the byte table, else the token's own UTF-8.
      std::string bytes;
      if (!IsValidUtf8(token)) return token;
      for (size_t pos = 0; pos < token.size();) {
        const char32_t cp = NextCodePoint(token, &pos);
        const int byte = ByteLevelCharToByte(cp);
        if (byte < 0) return token;
        bytes.push_back(static_cast<char>(byte));
      }
      return bytes;
    };
    for (const auto& [token, id] : bpe.vocab()) {
      token_bytes[id] = decoded_bytes(token);
      token_strings[id] = token;
      token_kind[id] = kVocab;
    }
    for (const Added& a : added) {
      token_bytes[a.id] = decoded_bytes(a.content);
      token_strings[a.id] = a.content;
      token_kind[a.id] = a.special ? kSpecial : kAdded;
    }
    return Status::Ok();
  }

  std::optional<int32_t> Lookup(std::string_view token) const {
    if (auto it = added_ids.find(std::string(token)); it != added_ids.end()) return it->second;
    if (auto it = bpe.vocab().find(std::string(token)); it != bpe.vocab().end()) return it->second;
    return std::nullopt;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// Streams model.vocab and model.merges out of the parse (a parser callback that stores them and
// drops them from the DOM): building and freeing a 128k-entry JSON object costs more than all
// the rest of loading.
class TableExtractor {
 public:
  bool OnEvent(int depth, Json::parse_event_t event, Json& parsed) {
    using Event = Json::parse_event_t;
    if (event == Event::key && depth < static_cast<int>(path_.size())) {
      path_[depth] = parsed.get<std::string>();
      return true;
    }
    if (depth == 2 && path_[1] == "model") {
      vocab_seen_ |= event == Event::object_start && path_[2] == "vocab";
      merges_seen_ |= event == Event::array_start && path_[2] == "merges";
      return true;
    }
    if (depth != 3 || path_[1] != "model") return true;
    if (path_[2] == "vocab" && event == Event::value) {
      if (!IsValidTokenId(parsed)) {
        error_ = "vocab entry " + path_[3] + " has no valid id (" + ValidTokenIdRule() + ")";
      } else {
        tables_.vocab.emplace_back(std::move(path_[3]), parsed.get<int32_t>());
      }
      return false;
    }
    if (path_[2] == "merges" && (event == Event::value || event == Event::array_end)) {
      tables_.merges.emplace_back();
      if (!BpeModel::ParseMerge(parsed, &tables_.merges.back()) && error_.empty()) {
        error_ =
            "merge " + std::to_string(tables_.merges.size() - 1) + " is neither \"a b\" nor [a, b]";
      }
      return false;
    }
    return true;
  }

  const std::string& error() const { return error_; }
  // The tables, when both were found under "model" (otherwise the DOM path reports what's wrong).
  std::optional<BpeModel::Tables> TakeTables() {
    if (!vocab_seen_ || !merges_seen_) return std::nullopt;
    return std::move(tables_);
  }

 private:
  std::array<std::string, 4> path_;  // object key at each depth 0..3 on the current path
  BpeModel::Tables tables_;
  bool vocab_seen_ = false, merges_seen_ = false;
  std::string error_;
};

Result<Tokenizer> Tokenizer::FromJson(std::string_view json) {
  auto impl = std::make_unique<Impl>();
  try {
    TableExtractor extractor;
    const Json root = Json::parse(
        json.begin(), json.end(),
        [&extractor](int depth, Json::parse_event_t event, Json& parsed) {
          return extractor.OnEvent(depth, event, parsed);
        },
        /*allow_exceptions=*/false);
    if (root.is_discarded()) return InvalidArgument("tokenizer.json is not valid JSON");
    if (!extractor.error().empty()) return InvalidArgument(extractor.error());
    DSINFER_RETURN_IF_ERROR(impl->Build(root, extractor.TakeTables()));
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("malformed tokenizer.json: ") + e.what());
  }
  for (const char* name : {"<｜begin▁of▁sentence｜>", "<s>", "<|begin_of_text|>"}) {
    if (!impl->bos) impl->bos = impl->Lookup(name);
  }
  for (const char* name : {"<｜end▁of▁sentence｜>", "</s>", "<|end_of_text|>", "<|endoftext|>"}) {
    if (!impl->eos) impl->eos = impl->Lookup(name);
  }
  return Tokenizer(std::move(impl));
}

Result<Tokenizer> Tokenizer::FromFile(const std::string& tokenizer_json_path) {
  DSINFER_ASSIGN_OR_RETURN(std::string json, ReadFile(tokenizer_json_path));
  auto tok = FromJson(json);
  if (!tok.ok()) return tok.status().WithContext(tokenizer_json_path);
  const std::filesystem::path config_path =
      std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    DSINFER_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path.string()));
    const Json config = Json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_object()) {
      if (auto name = ConfigTokenName(config, "bos_token")) {
        if (auto id = tok->impl_->Lookup(*name)) tok->impl_->bos = id;
      }
      if (auto name = ConfigTokenName(config, "eos_token")) {
        if (auto id = tok->impl_->Lookup(*name)) tok->impl_->eos = id;
      }
    }
  }
  return tok;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool allow_special) const {
  if (text.size() >= UINT32_MAX) return InvalidArgument("text too long to tokenize (>= 4 GiB)");
  if (auto bad = FindInvalidUtf8(text)) {
    return InvalidArgument("text is not valid UTF-8 (ill-formed sequence at byte " +
                           std::to_string(*bad) + ")");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  RegexScratch scratch;
  std::vector<Piece> pieces;
  const Piece whole{0, static_cast<uint32_t>(text.size())};
  if (!allow_special) {
    DSINFER_RETURN_IF_ERROR(impl_->EncodePlain(text, whole, &scratch, &pieces, &ids));
    return ids;
  }
  // HF order: tokens with normalized=false split the raw text first; normalized ones are then
  // matched inside the remaining gaps (the normalizer is the identity for supported files).
  size_t pos = 0;
  while (auto m = impl_->raw_added.Find(text, pos, text.size())) {
    DSINFER_RETURN_IF_ERROR(impl_->EncodeWithNormalizedAdded(
        text, {static_cast<uint32_t>(pos), static_cast<uint32_t>(m->begin)}, &scratch, &pieces,
        &ids));
    ids.push_back(m->id);
    pos = m->end;
  }
  DSINFER_RETURN_IF_ERROR(impl_->EncodeWithNormalizedAdded(
      text, {static_cast<uint32_t>(pos), whole.end}, &scratch, &pieces, &ids));
  return ids;
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  return Decode(ids, /*skip_special_tokens=*/false);
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                      bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string* piece = TokenBytes(ids[i]);
    if (piece == nullptr) {
      return OutOfRange("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                        " names no token (vocab size " + std::to_string(vocab_size()) + ")");
    }
    if (skip_special_tokens && IsSpecial(ids[i])) continue;
    bytes += *piece;
  }
  return Utf8Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  return impl_->Lookup(token);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->token_kind.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

const std::string* Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->token_kind[id] == Impl::kNone) return nullptr;
  return &impl_->token_bytes[id];
}

const std::string* Tokenizer::TokenString(int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->token_kind[id] == Impl::kNone) return nullptr;
  return &impl_->token_strings[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->token_kind[id] == Impl::kSpecial;
}

bool Tokenizer::IsAddedToken(int32_t id) const {
  return id >= 0 && id < vocab_size() &&
         (impl_->token_kind[id] == Impl::kAdded || impl_->token_kind[id] == Impl::kSpecial);
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok) : tokenizer_(&tok) {}

std::string StreamingDetokenizer::Next(int32_t id) {
  const std::string* bytes = tokenizer_->TokenBytes(id);
  if (bytes == nullptr) return std::string();
  pending_ += *bytes;
  const size_t ready = StreamSafePrefixLength(pending_);
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsinfer::text
