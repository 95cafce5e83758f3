// Byte-level BPE model: vocab + ranked merges, applied to one pre-token at a time with the same
// result as HF `tokenizers` (repeatedly merge the lowest-ranked adjacent pair, leftmost first).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace dsinfer::text {

// GPT-2 byte <-> character table used by ByteLevel: printable Latin-1 bytes map to themselves,
// the other 68 bytes to U+0100.. in byte order.
char32_t ByteToByteLevelChar(uint8_t byte);
// Inverse of ByteToByteLevelChar; -1 for characters outside the table.
int ByteLevelCharToByte(char32_t ch);

// The largest token id a tokenizer.json may use. Ids index dense tables (a string per id up to the
// largest), so a file naming id 2^31 - 1 asked for a 64 GiB table and overflowed the size
// computation (fuzz_tokenizer found the first); the largest vocabularies in use hold ~262K
// tokens, 16x under this.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;
// `id` is a JSON integer in [0, kMaxTokenId].
bool IsValidTokenId(const nlohmann::json& id);
// What a valid id is, for error messages: "an integer in [0, kMaxTokenId]".
std::string ValidTokenIdRule();

class BpeModel {
 public:
  // Vocab and merges as read from tokenizer.json, in file order.
  struct Tables {
    std::vector<std::pair<std::string, int32_t>> vocab;       // token -> id
    std::vector<std::pair<std::string, std::string>> merges;  // (left, right), rank = index
  };

  // `model` is the tokenizer.json "model" object (type BPE).
  static Result<BpeModel> FromJson(const nlohmann::json& model);
  // Same, with vocab and merges already extracted (the loader streams them out of the parse so
  // the multi-megabyte tables never become a JSON DOM); `model` supplies the other fields.
  static Result<BpeModel> FromTables(const nlohmann::json& model, Tables tables);
  // Converts one "merges" entry ("a b" or ["a", "b"]); false if it is neither.
  static bool ParseMerge(const nlohmann::json& entry, std::pair<std::string, std::string>* out);

  // Appends the ids of one pre-token given as raw bytes (the byte-level mapping is implicit).
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  // token string (byte-level characters) -> id, as in the vocab.
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct MergeEntry {
    uint64_t key = kEmptyKey;  // (left id << 32) | right id
    int32_t rank = 0;
    int32_t merged_id = 0;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};

  // Open-addressing lookup of the merge for an adjacent pair; nullptr if none.
  const MergeEntry* FindMerge(int32_t left, int32_t right) const {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    size_t slot = static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> merge_shift_);
    while (true) {
      const MergeEntry& e = merges_[slot];
      if (e.key == key) return &e;
      if (e.key == kEmptyKey) return nullptr;
      slot = (slot + 1) & (merges_.size() - 1);
    }
  }
  void InsertMerge(int32_t left, int32_t right, int32_t rank, int32_t merged_id);
  void MergeShort(std::vector<int32_t>* symbols) const;
  void MergeLong(std::vector<int32_t>* symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<MergeEntry> merges_;  // [power of two] open-addressing table
  int merge_shift_ = 64;            // 64 - log2(merges_.size())
  int32_t byte_ids_[256] = {};      // id of the single-byte token, -1 if the vocab lacks it
  bool ignore_merges_ = false;      // whole-word vocab hit skips merging (HF ignore_merges)
};

}  // namespace dsinfer::text
