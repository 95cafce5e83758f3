#include "model/engram.h"

#include <string>

namespace dsinfer::model {

namespace {

// 128-bit arithmetic of PCG64 (GCC / Clang extension; __extension__ keeps -Wpedantic quiet).
__extension__ typedef unsigned __int128 U128;

bool IsPrime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

// numpy's SeedSequence (bit_generator.pyx) for an integer entropy and no spawn key: the entropy
// as little-endian 32-bit words hashed into a pool of 4 words, then generate_state.
class SeedSequence {
 public:
  explicit SeedSequence(uint64_t seed) {
    std::vector<uint32_t> entropy;
    if (seed == 0) entropy.push_back(0);
    for (uint64_t n = seed; n > 0; n >>= 32) entropy.push_back(static_cast<uint32_t>(n));
    uint32_t hash_const = kInitA;
    auto hashmix = [&](uint32_t value) {
      value ^= hash_const;
      hash_const *= kMultA;
      value *= hash_const;
      value ^= value >> 16;
      return value;
    };
    auto mix = [](uint32_t x, uint32_t y) {
      uint32_t r = kMixMultL * x - kMixMultR * y;
      return r ^ (r >> 16);
    };
    for (size_t i = 0; i < kPool; ++i) pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0);
    for (size_t src = 0; src < kPool; ++src)
      for (size_t dst = 0; dst < kPool; ++dst)
        if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src]));
    for (size_t src = kPool; src < entropy.size(); ++src)
      for (size_t dst = 0; dst < kPool; ++dst) pool_[dst] = mix(pool_[dst], hashmix(entropy[src]));
  }
  // generate_state(n, uint64): 2n words, paired little-endian.
  std::vector<uint64_t> State64(int n) const {
    std::vector<uint64_t> out(static_cast<size_t>(n));
    uint32_t hash_const = kInitB;
    for (int i = 0; i < 2 * n; ++i) {
      uint32_t v = pool_[static_cast<size_t>(i) % kPool];
      v ^= hash_const;
      hash_const *= kMultB;
      v *= hash_const;
      v ^= v >> 16;
      out[i / 2] |= static_cast<uint64_t>(v) << (i % 2 == 0 ? 0 : 32);
    }
    return out;
  }

 private:
  static constexpr size_t kPool = 4;
  static constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
  static constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
  static constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
  uint32_t pool_[kPool] = {};
};

// numpy's PCG64 (XSL-RR 128/64), seeded from a SeedSequence as _pcg64.pyx does.
class Pcg64 {
 public:
  explicit Pcg64(const SeedSequence& seq) {
    const std::vector<uint64_t> v = seq.State64(4);
    const U128 init_state = (static_cast<U128>(v[0]) << 64) | v[1];
    const U128 init_seq = (static_cast<U128>(v[2]) << 64) | v[3];
    state_ = 0;
    inc_ = (init_seq << 1) | 1;
    Step();
    state_ += init_state;
    Step();
  }
  uint64_t Next64() {
    Step();
    const auto hi = static_cast<uint64_t>(state_ >> 64), lo = static_cast<uint64_t>(state_);
    const unsigned rot = static_cast<unsigned>(state_ >> 122);
    const uint64_t x = hi ^ lo;
    return rot == 0 ? x : (x >> rot) | (x << (64 - rot));
  }

 private:
  void Step() {
    const U128 mult = (static_cast<U128>(2549297995355413924ull) << 64) | 4865540595714422341ull;
    state_ = state_ * mult + inc_;
  }
  U128 state_ = 0, inc_ = 0;
};

}  // namespace

std::vector<int64_t> NumpyIntegers(uint64_t seed, int64_t high, int n) {
  Pcg64 rng{SeedSequence(seed)};
  const uint64_t range = static_cast<uint64_t>(high) - 1;  // inclusive bound
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    if (range == 0) {
      out.push_back(0);
      continue;
    }
    // Lemire's bounded integers (numpy distributions.c, bounded_lemire_uint64 / _uint32): one
    // 64-bit draw per value for ranges above 32 bits.
    DSINFER_CHECK_MSG(range > 0xFFFFFFFFull, "NumpyIntegers: only ranges above 2^32");
    const uint64_t excl = range + 1;
    U128 m = static_cast<U128>(rng.Next64()) * excl;
    auto leftover = static_cast<uint64_t>(m);
    if (leftover < excl) {
      const uint64_t threshold = (UINT64_MAX - range) % excl;
      while (leftover < threshold) {
        m = static_cast<U128>(rng.Next64()) * excl;
        leftover = static_cast<uint64_t>(m);
      }
    }
    out.push_back(static_cast<int64_t>(m >> 64));
  }
  return out;
}

std::vector<int64_t> EngramMultipliers(int layer, int64_t compressed_vocab_size, int n) {
  const int64_t high = (INT64_MAX / compressed_vocab_size) / 2;
  std::vector<int64_t> m = NumpyIntegers(10007ull * static_cast<uint64_t>(layer), high, n);
  for (int64_t& v : m) v = 2 * v + 1;
  return m;
}

std::vector<std::vector<int64_t>> EngramPrimes(const EngramConfig& e) {
  std::vector<std::vector<int64_t>> out;
  int64_t candidate = e.vocab_size;  // the first prime searched is > vocab_size - 1
  for (size_t j = 0; j < e.layer_ids.size(); ++j) {
    out.emplace_back();
    for (int r = 0; r < e.RowsPerToken(); ++r) {
      while (!IsPrime(candidate)) ++candidate;
      out.back().push_back(candidate++);
    }
  }
  return out;
}

std::vector<int64_t> EngramTableRows(const EngramConfig& e) {
  std::vector<int64_t> rows;
  for (const auto& primes : EngramPrimes(e)) {
    int64_t sum = 0;
    for (int64_t p : primes) sum += p;
    rows.push_back(sum);
  }
  return rows;
}

Result<EngramHasher> EngramHasher::Create(const EngramConfig& e) {
  EngramHasher h;
  h.ngram_ = e.max_ngram_size;
  h.heads_ = e.n_heads;
  h.rows_per_token_ = e.RowsPerToken();
  h.primes_ = EngramPrimes(e);
  for (size_t j = 0; j < e.layer_ids.size(); ++j) {
    int64_t sum = 0;
    h.offsets_.emplace_back();
    for (int64_t p : h.primes_[j]) {
      h.offsets_.back().push_back(sum);
      sum += p;
    }
    if (j >= e.num_embeddings.size() || e.num_embeddings[j] != sum)
      return InvalidArgument(
          "config: engram_num_embeddings[" + std::to_string(j) +
          "] = " + (j < e.num_embeddings.size() ? std::to_string(e.num_embeddings[j]) : "missing") +
          ", but the hash tables of engram_vocab_size " + std::to_string(e.vocab_size) + " hold " +
          std::to_string(sum) + " rows");
    h.multipliers_.push_back(
        EngramMultipliers(e.layer_ids[j], e.compressed_vocab_size, e.max_ngram_size));
  }
  return h;
}

void EngramHasher::RowIds(int j, const int64_t* tok, int64_t* ids) const {
  const std::vector<int64_t>& m = multipliers_[j];
  const std::vector<int64_t>& p = primes_[j];
  const std::vector<int64_t>& off = offsets_[j];
  // Classes < 2^63 / classes and multipliers < 2^63 / classes: the products stay below 2^63,
  // and the xor of non-negative values is non-negative.
  int64_t rolling = tok[0] * m[0];
  for (int n = 1; n < ngram_; ++n) {
    rolling ^= tok[n] * m[n];
    for (int h = 0; h < heads_; ++h) {
      const int r = (n - 1) * heads_ + h;
      ids[r] = rolling % p[r] + off[r];
    }
  }
}

void NgramClasses(std::span<const int32_t> classes, int64_t p, int n, int32_t pad_class,
                  int64_t* tok) {
  bool blocked = false;
  for (int s = 0; s < n; ++s) {
    blocked = blocked || p < s || classes[p - s] == kDeadClass;
    tok[s] = blocked ? pad_class : classes[p - s];
  }
}

}  // namespace dsinfer::model
