// Byte-level BPE model: vocab + ranked merges, applied to one pre-token at a time with the same
// result as HF `tokenizers` (repeatedly merge the lowest-ranked adjacent pair, leftmost first).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace dsinfer::text {

// GPT-2 byte <-> character table used by ByteLevel: printable Latin-1 bytes map to themselves,
// the other 68 bytes to U+0100.. in byte order.
char32_t ByteToByteLevelChar(uint8_t byte);
// Inverse of ByteToByteLevelChar; -1 for characters outside the table.
int ByteLevelCharToByte(char32_t ch);

class BpeModel {
 public:
  // `model` is the tokenizer.json "model" object (type BPE).
  static Result<BpeModel> FromJson(const nlohmann::json& model);

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
