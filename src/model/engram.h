// Engram's n-gram hashing (spec §14.5), derived once from the config: the table primes and
// offsets, the per-layer multipliers (numpy's default_rng(10007 * layer) reproduced bit for
// bit: SeedSequence, PCG64, Lemire's bounded integers), and the 24 (in V4.1-Flash) table row
// ids of one position from its n-gram of token classes. The token classes come from the
// tokenizer (text/engram_token_map.h). Immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace dsinfer::model {

// The primes of every Engram layer, layer after layer, n-gram after n-gram, head after head:
// the distinct primes >= engram vocab_size in increasing order ((layers x RowsPerToken) of them).
std::vector<std::vector<int64_t>> EngramPrimes(const EngramConfig& e);
// Rows of each layer's table: the sum of its primes.
std::vector<int64_t> EngramTableRows(const EngramConfig& e);
// numpy.random.default_rng(seed).integers(0, high, size=n) for 0 < high < 2^63 (int64 draws).
std::vector<int64_t> NumpyIntegers(uint64_t seed, int64_t high, int n);
// The layer's odd multipliers [max_ngram_size]: 2 * integers(0, ((2^63 - 1) // classes) // 2) + 1
// with default_rng(10007 * layer).
std::vector<int64_t> EngramMultipliers(int layer, int64_t compressed_vocab_size, int n);

class EngramHasher {
 public:
  // Checks the config's engram_num_embeddings against the primes (a mismatch would index
  // another table than the checkpoint's).
  static Result<EngramHasher> Create(const EngramConfig& e);

  int n_layers() const { return static_cast<int>(multipliers_.size()); }
  int ngram() const { return ngram_; }
  int rows_per_token() const { return rows_per_token_; }
  const std::vector<int64_t>& primes(int j) const { return primes_[j]; }
  const std::vector<int64_t>& offsets(int j) const { return offsets_[j]; }
  const std::vector<int64_t>& multipliers(int j) const { return multipliers_[j]; }

  // Row ids [rows_per_token] of Engram layer j (its index in layer_ids) for one position whose
  // n-gram classes are tok [ngram]: tok[s] is the class s tokens back, already replaced by the
  // pad class where the n-gram is blocked (before the sequence, or past a dead position).
  void RowIds(int j, const int64_t* tok, int64_t* ids) const;

 private:
  int ngram_ = 0;
  int heads_ = 0;
  int rows_per_token_ = 0;
  std::vector<std::vector<int64_t>> primes_;       // [layers][rows_per_token]
  std::vector<std::vector<int64_t>> offsets_;      // [layers][rows_per_token] exclusive sums
  std::vector<std::vector<int64_t>> multipliers_;  // [layers][ngram]
};

// The n-gram classes of position p of a sequence (spec §14.5 step 2): tok[s] for s < n is
// classes[p - s], or pad_class once p - s < 0 or a dead position (class kDeadClass) has been
// passed (blocked stays blocked for larger s). classes is indexed by position.
inline constexpr int32_t kDeadClass = -1;
void NgramClasses(std::span<const int32_t> classes, int64_t p, int n, int32_t pad_class,
                  int64_t* tok);

}  // namespace dsinfer::model
