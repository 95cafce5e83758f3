#include "text/tokenizer_bpe.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>

#include "text/utf8.h"

namespace dsinfer::text {
namespace {

constexpr bool IsSelfMappedByte(int b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

std::string ByteLevelString(std::string_view bytes) {
  std::string out;
  for (char c : bytes) AppendUtf8(ByteToByteLevelChar(static_cast<uint8_t>(c)), &out);
  return out;
}

// byte -> byte-level character, built at compile time.
constexpr std::array<char32_t, 256> kByteToChar = [] {
  std::array<char32_t, 256> table{};
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    table[b] =
        IsSelfMappedByte(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_extra++);
  }
  return table;
}();

// byte-level character (all < 324) -> byte, -1 where unmapped.
constexpr std::array<int16_t, 324> kCharToByte = [] {
  std::array<int16_t, 324> table{};
  for (auto& v : table) v = -1;
  for (int b = 0; b < 256; ++b) table[kByteToChar[b]] = static_cast<int16_t>(b);
  return table;
}();

}  // namespace

char32_t ByteToByteLevelChar(uint8_t byte) { return kByteToChar[byte]; }

int ByteLevelCharToByte(char32_t ch) { return ch < kCharToByte.size() ? kCharToByte[ch] : -1; }

void BpeModel::InsertMerge(int32_t left, int32_t right, int32_t rank, int32_t merged_id) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  size_t slot = static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> merge_shift_);
  while (merges_[slot].key != kEmptyKey) {
    // A duplicated merge line: HF collects merges into a map, so the last occurrence wins.
    if (merges_[slot].key == key) break;
    slot = (slot + 1) & (merges_.size() - 1);
  }
  merges_[slot] = {key, rank, merged_id};
}

bool BpeModel::ParseMerge(const nlohmann::json& entry, std::pair<std::string, std::string>* out) {
  if (entry.is_string()) {
    const std::string& line = entry.get_ref<const std::string&>();
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) return false;
    *out = {line.substr(0, space), line.substr(space + 1)};
    return true;
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    *out = {entry[0].get<std::string>(), entry[1].get<std::string>()};
    return true;
  }
  return false;
}

bool IsValidTokenId(const nlohmann::json& id) {
  // get<int64_t> of an unsigned above INT64_MAX wraps negative, which the first test refuses.
  return id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= kMaxTokenId;
}

std::string ValidTokenIdRule() { return "an integer in [0, " + std::to_string(kMaxTokenId) + "]"; }

Result<BpeModel> BpeModel::FromJson(const nlohmann::json& model) {
  if (!model.is_object()) return InvalidArgument("tokenizer.json has no \"model\" object");
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return InvalidArgument("BPE model without a \"vocab\" object");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return InvalidArgument("BPE model without a \"merges\" array");
  }
  Tables tables;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!IsValidTokenId(id)) {
      return InvalidArgument("vocab entry " + token + " has no valid id (" + ValidTokenIdRule() +
                             ")");
    }
    tables.vocab.emplace_back(token, id.get<int32_t>());
  }
  for (const auto& entry : model["merges"]) {
    tables.merges.emplace_back();
    if (!ParseMerge(entry, &tables.merges.back())) {
      return InvalidArgument("merge " + std::to_string(tables.merges.size() - 1) +
                             " is neither \"a b\" nor [a, b]");
    }
  }
  return FromTables(model, std::move(tables));
}

Result<BpeModel> BpeModel::FromTables(const nlohmann::json& model, Tables tables) {
  if (!model.is_object()) return InvalidArgument("tokenizer.json has no \"model\" object");
  if (model.contains("type") && model["type"] != "BPE") {
    return Unimplemented("model type " + model["type"].dump() + " (only BPE is supported)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      return Unimplemented(std::string("BPE ") + key);
    }
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0) {
    return Unimplemented("BPE dropout");
  }
  if (model.value("byte_fallback", false)) return Unimplemented("BPE byte_fallback");
  BpeModel bpe;
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  bpe.vocab_.reserve(tables.vocab.size());
  for (auto& [token, id] : tables.vocab) bpe.vocab_.emplace(std::move(token), id);
  bool all_bytes = true;
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(ByteToByteLevelChar(static_cast<uint8_t>(b)), &ch);
    auto it = bpe.vocab_.find(ch);
    bpe.byte_ids_[b] = it == bpe.vocab_.end() ? -1 : it->second;
    all_bytes &= it != bpe.vocab_.end();
  }
  // A missing byte is dropped (HF with no unk token); an unk token would change that.
  if (!all_bytes && model.contains("unk_token") && !model["unk_token"].is_null()) {
    return Unimplemented("BPE unk_token with bytes missing from the vocab");
  }

  const auto& merges = tables.merges;
  size_t capacity = 1;
  int log2 = 0;
  while (capacity < merges.size() * 2 + 2) {
    capacity <<= 1;
    ++log2;
  }
  bpe.merges_.assign(capacity, MergeEntry{});
  bpe.merge_shift_ = 64 - log2;
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    joined.assign(left).append(right);
    auto l = bpe.vocab_.find(left);
    auto r = bpe.vocab_.find(right);
    auto merged = bpe.vocab_.find(joined);
    if (l == bpe.vocab_.end() || r == bpe.vocab_.end() || merged == bpe.vocab_.end()) {
      return InvalidArgument("merge " + std::to_string(rank) + " uses a token missing from vocab");
    }
    bpe.InsertMerge(l->second, r->second, static_cast<int32_t>(rank), merged->second);
  }
  return bpe;
}

// Words up to this many symbols use the quadratic-free rank array; longer ones the heap.
constexpr size_t kShortWordSymbols = 96;

void BpeModel::MergeShort(std::vector<int32_t>* symbols_ptr) const {
  std::vector<int32_t>& symbols = *symbols_ptr;
  // ranks[i]: rank of merging symbols[i] and symbols[i+1], INT32_MAX if no merge.
  int32_t ranks[kShortWordSymbols];
  int32_t merged[kShortWordSymbols];
  size_t n = symbols.size();
  auto refresh = [&](size_t i) {
    const MergeEntry* e = FindMerge(symbols[i], symbols[i + 1]);
    ranks[i] = e ? e->rank : INT32_MAX;
    merged[i] = e ? e->merged_id : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) refresh(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;  // strict: leftmost wins ties (same pair)
    }
    if (ranks[best] == INT32_MAX) break;
    symbols[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) symbols[i] = symbols[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best + 1 < n) refresh(best);
    if (best > 0) refresh(best - 1);
  }
  symbols.resize(n);
}

void BpeModel::MergeLong(std::vector<int32_t>* symbols_ptr) const {
  std::vector<int32_t>& symbols = *symbols_ptr;
  const size_t n = symbols.size();
  // Doubly linked list over positions; merged-away positions are marked dead (-2 in prev).
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  // (rank, left position): min-heap, so equal ranks pop leftmost first, as in HF.
  using Candidate = std::pair<int32_t, int32_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const MergeEntry* e = FindMerge(symbols[i], symbols[i + 1])) {
      heap.push({e->rank, static_cast<int32_t>(i)});
    }
  }
  while (!heap.empty()) {
    const auto [rank, pos] = heap.top();
    heap.pop();
    if (prev[pos] == -2 || next[pos] < 0) continue;  // dead, or no right neighbour now
    const int32_t right = next[pos];
    const MergeEntry* e = FindMerge(symbols[pos], symbols[right]);
    if (e == nullptr || e->rank != rank) continue;  // stale: the pair changed since the push
    symbols[pos] = e->merged_id;
    next[pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = pos;
    prev[right] = -2;
    if (prev[pos] >= 0) {
      if (const MergeEntry* l = FindMerge(symbols[prev[pos]], symbols[pos])) {
        heap.push({l->rank, prev[pos]});
      }
    }
    if (next[pos] >= 0) {
      if (const MergeEntry* r = FindMerge(symbols[pos], symbols[next[pos]])) {
        heap.push({r->rank, pos});
      }
    }
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(ByteLevelString(word));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  for (char c : word) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) symbols.push_back(id);
  }
  if (symbols.empty()) return;
  if (symbols.size() <= kShortWordSymbols) {
    MergeShort(&symbols);
  } else {
    MergeLong(&symbols);
  }
  out->insert(out->end(), symbols.begin(), symbols.end());
}

}  // namespace dsinfer::text
