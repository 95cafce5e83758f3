#include "model/state_layout.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/dtype.h"

namespace dsinfer::model {

namespace {

// e4m3 code -> value, made once from the codec (read-only after).
const std::array<float, 256>& E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = E4M3ToF32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

// The smallest power-of-two exponent e in [-127, 127] with amax <= max_code * 2^e (exactly:
// ldexp is exact), so every value of a block that is on some coarser power-of-two grid of the
// format is on this one too: re-quantizing with a scale no larger than the one that made the
// values loses nothing.
int BlockExponent(float amax, float max_code) {
  if (!(amax > 0.0f)) return -127;
  int k = 0;
  std::frexp(amax, &k);  // amax < 2^k
  int e = std::clamp(k - 10, -127, 127);
  while (e < 127 && std::ldexp(max_code, e) < amax) ++e;
  while (e > -127 && std::ldexp(max_code, e - 1) >= amax) --e;
  return e;
}

float Amax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

bool SameBits(const float* a, const float* b, int n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

}  // namespace

// ---- row formats ----------------------------------------------------------------------------

int64_t RowFormat::Bytes() const {
  switch (codec) {
    case RowCodec::kF32:
      return int64_t{dim} * 4;
    case RowCodec::kBf16:
      return int64_t{dim} * 2;
    case RowCodec::kFp8Nope:
      return quantized + (quantized + block - 1) / block + int64_t{dim - quantized} * 2;
    case RowCodec::kFp4:
    case RowCodec::kFp4E4m3:
      return dim / 2 + dim / block;
  }
  return 0;
}

std::string RowFormat::Describe() const {
  std::ostringstream os;
  switch (codec) {
    case RowCodec::kF32:
      os << "f32(" << dim << ")";
      break;
    case RowCodec::kBf16:
      os << "bf16(" << dim << ")";
      break;
    case RowCodec::kFp8Nope:
      os << "fp8-e4m3(" << quantized << ", scale per " << block << ")+bf16(" << dim - quantized
         << ")";
      break;
    case RowCodec::kFp4:
      os << "fp4-e2m1(" << dim << ", scale per " << block << ")";
      break;
    case RowCodec::kFp4E4m3:
      os << "fp4-e2m1(" << dim << ", e4m3 scale per " << block << ")";
      break;
  }
  return os.str();
}

RowFormat F32Row(int dim) { return {RowCodec::kF32, dim, 0, 0}; }
RowFormat Bf16Row(int dim) { return {RowCodec::kBf16, dim, 0, 0}; }
RowFormat Fp8NopeRow(int dim, int quantized, int block) {
  return {RowCodec::kFp8Nope, dim, quantized, block};
}
RowFormat Fp4Row(int dim, int block) { return {RowCodec::kFp4, dim, 0, block}; }
RowFormat Fp4E4m3Row(int dim, int block) { return {RowCodec::kFp4E4m3, dim, 0, block}; }

Status PackRow(const RowFormat& f, const float* row, uint8_t* out) {
  switch (f.codec) {
    case RowCodec::kF32:
      std::memcpy(out, row, static_cast<size_t>(f.dim) * 4);
      return Status::Ok();
    case RowCodec::kBf16:
      for (int i = 0; i < f.dim; ++i) {
        const uint16_t b = F32ToBf16(row[i]);
        std::memcpy(out + 2 * i, &b, 2);
      }
      break;
    case RowCodec::kFp8Nope: {
      uint8_t* codes = out;
      uint8_t* scales = out + f.quantized;
      uint8_t* tail = scales + (f.quantized + f.block - 1) / f.block;
      for (int b0 = 0, bi = 0; b0 < f.quantized; b0 += f.block, ++bi) {
        const int n = std::min(f.block, f.quantized - b0);
        const int e = BlockExponent(Amax(row + b0, n), 448.0f);
        scales[bi] = static_cast<uint8_t>(e + 127);
        for (int i = 0; i < n; ++i) codes[b0 + i] = F32ToE4M3(std::ldexp(row[b0 + i], -e));
      }
      for (int i = f.quantized; i < f.dim; ++i) {
        const uint16_t b = F32ToBf16(row[i]);
        std::memcpy(tail + 2 * (i - f.quantized), &b, 2);
      }
      break;
    }
    case RowCodec::kFp4: {
      uint8_t* scales = out + f.dim / 2;
      std::fill(out, out + f.dim / 2, uint8_t{0});
      for (int b0 = 0, bi = 0; b0 < f.dim; b0 += f.block, ++bi) {
        const int e = BlockExponent(Amax(row + b0, f.block), 6.0f);
        scales[bi] = static_cast<uint8_t>(e + 127);
        for (int i = 0; i < f.block; ++i) {
          const int d = b0 + i;
          const uint8_t code = F32ToE2M1(std::ldexp(row[d], -e));
          out[d / 2] |= static_cast<uint8_t>(d % 2 == 0 ? code : code << 4);
        }
      }
      break;
    }
    case RowCodec::kFp4E4m3: {
      // The round trip made each block q * s with s an e4m3 value and q on the e2m1 grid, so
      // s = amax / q_max for the block's largest |q|: try each e2m1 magnitude as q_max (largest
      // first) and keep the first e4m3 scale that holds every value of the block.
      uint8_t* scales = out + f.dim / 2;
      std::fill(out, out + f.dim / 2, uint8_t{0});
      static constexpr float kQmax[] = {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f};
      for (int b0 = 0, bi = 0; b0 < f.dim; b0 += f.block, ++bi) {
        const float amax = Amax(row + b0, f.block);
        uint8_t scale_code = F32ToE4M3(1.0f);
        if (amax > 0.0f) {
          for (float q : kQmax) {
            const float scale = amax / q;
            if (!(scale <= 448.0f) || RoundToE4M3(scale) != scale) continue;
            bool fits = true;
            for (int i = 0; i < f.block && fits; ++i) {
              const float c = row[b0 + i] / scale;
              fits = std::fabs(c) <= 6.0f && E2M1ToF32(F32ToE2M1(c)) * scale == row[b0 + i];
            }
            if (fits) {
              scale_code = F32ToE4M3(scale);
              break;
            }
          }
        }
        scales[bi] = scale_code;
        const float s = E4M3Table()[scale_code];
        for (int i = 0; i < f.block; ++i) {
          const int d = b0 + i;
          const uint8_t code = F32ToE2M1(row[d] / s);
          out[d / 2] |= static_cast<uint8_t>(d % 2 == 0 ? code : code << 4);
        }
      }
      break;
    }
  }
  // Every packed row is checked against the values it came from: a value off the format's grid
  // (or NaN / inf) would otherwise come back as another number.
  float back[8192];  // dims are bounded by ModelConfig::Validate (head_dim <= 8192)
  DSINFER_CHECK(f.dim <= 8192);
  UnpackRow(f, out, back);
  if (!SameBits(back, row, f.dim))
    return FailedPrecondition("a state row is not exactly representable as " + f.Describe() +
                              " (non-finite values, or values off the numerics' grid)");
  return Status::Ok();
}

void UnpackRow(const RowFormat& f, const uint8_t* in, float* row) {
  switch (f.codec) {
    case RowCodec::kF32:
      std::memcpy(row, in, static_cast<size_t>(f.dim) * 4);
      return;
    case RowCodec::kBf16:
      for (int i = 0; i < f.dim; ++i) {
        uint16_t b;
        std::memcpy(&b, in + 2 * i, 2);
        row[i] = Bf16ToF32(b);
      }
      return;
    case RowCodec::kFp8Nope: {
      const auto& e4m3 = E4M3Table();
      const uint8_t* scales = in + f.quantized;
      const uint8_t* tail = scales + (f.quantized + f.block - 1) / f.block;
      for (int b0 = 0, bi = 0; b0 < f.quantized; b0 += f.block, ++bi) {
        const int n = std::min(f.block, f.quantized - b0);
        const float s = E8M0ToF32(scales[bi]);
        for (int i = 0; i < n; ++i) row[b0 + i] = e4m3[in[b0 + i]] * s;
      }
      for (int i = f.quantized; i < f.dim; ++i) {
        uint16_t b;
        std::memcpy(&b, tail + 2 * (i - f.quantized), 2);
        row[i] = Bf16ToF32(b);
      }
      return;
    }
    case RowCodec::kFp4:
    case RowCodec::kFp4E4m3: {
      const uint8_t* scales = in + f.dim / 2;
      for (int b0 = 0, bi = 0; b0 < f.dim; b0 += f.block, ++bi) {
        const float s = f.codec == RowCodec::kFp4 ? E8M0ToF32(scales[bi]) : E4M3Table()[scales[bi]];
        for (int i = 0; i < f.block; ++i) {
          const int d = b0 + i;
          const uint8_t byte = in[d / 2];
          row[d] = E2M1ToF32(d % 2 == 0 ? byte & 0xf : byte >> 4) * s;
        }
      }
      return;
    }
  }
}

// ---- state layout ---------------------------------------------------------------------------

int64_t CompressorHistoryFirst(int64_t n, int ratio, bool overlap) {
  return (n / ratio) * ratio - (overlap ? ratio : 0);
}

int64_t StateLayout::FixedBytes() const {
  int64_t b = int64_t{token_history_slots} * 4;
  for (const LayerStateLayout& l : layers)
    b += l.ring_slots * kv_row.Bytes() + int64_t{l.history_slots} * 2 * l.kv_width * 4 +
         int64_t{l.index_history_slots} * 2 * l.index_width * 4;
  return b;
}

std::string StateLayout::Describe() const {
  std::ostringstream os;
  os << "pages of " << page_tokens << " tokens (" << page_bytes << " B, " << PageBytesPerToken()
     << " B/token), KV rows " << kv_row.Describe();
  if (compressed_row != kv_row) os << ", compressed rows " << compressed_row.Describe();
  os << ", index keys " << index_key.Describe() << ", boundary " << FixedBytes() << " B (window "
     << window << " + rollback " << rollback_tokens << ")";
  return os.str();
}

Result<StateLayout> MakeStateLayout(const ModelConfig& c, const std::vector<LayerPlan>& plans,
                                    RowFormat kv_row, RowFormat index_key,
                                    const StateLayoutOptions& options,
                                    std::optional<RowFormat> compressed_row) {
  const int P = options.page_tokens;
  if (P <= 0 || P % 128 != 0)
    return InvalidArgument("state layout: page_tokens must be a positive multiple of 128, got " +
                           std::to_string(P));
  if (options.rollback_tokens < 0 || options.rollback_tokens > 4096)
    return InvalidArgument("state layout: rollback_tokens must be in [0, 4096]");
  const RowFormat comp_row = compressed_row.value_or(kv_row);
  if (kv_row.dim != c.head_dim || comp_row.dim != c.head_dim || index_key.dim != c.index_head_dim)
    return InvalidArgument("state layout: row formats do not match head_dim / index_head_dim");
  StateLayout s;
  s.page_tokens = P;
  s.rollback_tokens = options.rollback_tokens;
  s.window = c.window;
  s.kv_row = kv_row;
  s.compressed_row = comp_row;
  s.index_key = index_key;
  if (c.engram.enabled()) {
    s.token_history_needed = c.engram.max_ngram_size - 1;
    s.token_history_slots = s.token_history_needed + options.rollback_tokens;
    s.token_classes = c.engram.compressed_vocab_size;
  }
  int64_t offset = 0;
  for (const LayerPlan& p : plans) {
    LayerStateLayout l;
    l.layer = p.layer;
    l.mtp = p.mtp;
    l.ring_slots = c.window + options.rollback_tokens;
    if (p.owns_compressor) {
      if (P % p.compress_ratio != 0)
        return InvalidArgument("state layout: page_tokens " + std::to_string(P) +
                               " is not a multiple of layer " + std::to_string(p.layer) +
                               "'s compression ratio " + std::to_string(p.compress_ratio));
      l.compress_ratio = p.compress_ratio;
      l.overlap = p.compressor_overlap;
      l.kv_width = p.compressor_width;
      // Open group (< ratio rows), the previous group when overlapping, and the rollback; a
      // compressor without a gate completes a row per token and keeps no history.
      l.history_slots = p.compressor_gated ? (p.compressor_overlap ? 2 : 1) * p.compress_ratio +
                                                 options.rollback_tokens
                                           : 0;
      l.rows_per_page = P / p.compress_ratio;
      l.page_rows_offset = offset;
      offset += l.rows_per_page * comp_row.Bytes();
    }
    if (p.stores_index_keys) {
      if (P % p.index_ratio != 0)
        return InvalidArgument("state layout: page_tokens is not a multiple of an index ratio");
      l.index_ratio = p.index_ratio;
      l.index_width = p.index_compressor_width;
      l.index_history_slots =
          p.index_compressor_width > 0 ? 2 * p.index_ratio + options.rollback_tokens : 0;
      l.keys_per_page = P / p.index_ratio;
      l.page_keys_offset = offset;
      offset += l.keys_per_page * index_key.Bytes();
    }
    s.layers.push_back(l);
  }
  s.page_bytes = offset;
  return s;
}

// ---- serialized state ------------------------------------------------------------------------

namespace {

constexpr char kMagic[8] = {'D', 'S', 'I', 'S', 'T', 'A', 'T', 'E'};

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  void Bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_->size();
    out_->resize(at + n);
    std::memcpy(out_->data() + at, p, n);
  }
  template <typename T>
  void Le(T v) {
    static_assert(std::endian::native == std::endian::little, "blobs are little-endian");
    Bytes(&v, sizeof(T));
  }
  void Str(const std::string& s) {
    Le<uint32_t>(static_cast<uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  void Row(const RowFormat& f) {
    Le<uint8_t>(static_cast<uint8_t>(f.codec));
    Le<int32_t>(f.dim);
    Le<int32_t>(f.quantized);
    Le<int32_t>(f.block);
  }

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool Bytes(void* p, size_t n) {
    if (n > in_.size() - at_) return false;
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
    return true;
  }
  template <typename T>
  bool Le(T* v) {
    return Bytes(v, sizeof(T));
  }
  bool Str(std::string* s, size_t max) {
    uint32_t n = 0;
    if (!Le(&n) || n > max || n > in_.size() - at_) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return true;
  }
  bool Row(RowFormat* f) {
    uint8_t codec = 0;
    if (!Le(&codec) || codec > static_cast<uint8_t>(RowCodec::kFp4E4m3)) return false;
    f->codec = static_cast<RowCodec>(codec);
    return Le(&f->dim) && Le(&f->quantized) && Le(&f->block) && f->dim > 0 && f->dim <= 8192 &&
           f->quantized >= 0 && f->quantized <= f->dim && f->block >= 0 && f->block <= f->dim;
  }
  size_t at() const { return at_; }

 private:
  std::span<const uint8_t> in_;
  size_t at_ = 0;
};

}  // namespace

std::vector<uint8_t> EncodeStateBlob(const StateBlobHeader& h, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out;
  out.reserve(256 + h.tokens.size() * 4 + payload.size() + 32);
  Writer w(&out);
  w.Bytes(kMagic, sizeof(kMagic));
  w.Le<uint32_t>(StateBlobHeader::kVersion);
  w.Bytes(h.model.data(), h.model.size());
  w.Str(h.numerics);
  w.Row(h.kv_row);
  w.Row(h.compressed_row);
  w.Row(h.index_key);
  w.Le<int32_t>(h.page_tokens);
  w.Le<int32_t>(h.window);
  w.Le<int32_t>(h.n_layers);
  w.Le<int64_t>(h.first_page);
  w.Le<int64_t>(h.end_pos);
  w.Le<int64_t>(h.mtp_end_pos);
  w.Le<int64_t>(static_cast<int64_t>(h.tokens.size()));
  w.Bytes(h.tokens.data(), h.tokens.size() * 4);
  w.Le<int64_t>(static_cast<int64_t>(payload.size()));
  w.Bytes(payload.data(), payload.size());
  const Sha256Digest digest = Sha256::Of(out);
  w.Bytes(digest.data(), digest.size());
  return out;
}

Result<DecodedStateBlob> DecodeStateBlob(std::span<const uint8_t> blob) {
  constexpr size_t kDigest = 32;
  if (blob.size() < sizeof(kMagic) + kDigest)
    return InvalidArgument("state blob: " + std::to_string(blob.size()) + " bytes is too short");
  if (std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0)
    return InvalidArgument("state blob: bad magic (not a dsinfer state)");
  // The checksum first: nothing of a damaged blob is interpreted.
  const auto body = blob.first(blob.size() - kDigest);
  const Sha256Digest want = Sha256::Of(body);
  if (std::memcmp(want.data(), blob.data() + body.size(), kDigest) != 0)
    return InvalidArgument("state blob: checksum mismatch (truncated or corrupted)");
  DecodedStateBlob d;
  StateBlobHeader& h = d.header;
  Reader r(body);
  char magic[8];
  uint32_t version = 0;
  if (!r.Bytes(magic, sizeof(magic)) || !r.Le(&version))
    return InvalidArgument("state blob: truncated header");
  if (version != 1 && version != StateBlobHeader::kVersion)
    return InvalidArgument("state blob: layout version " + std::to_string(version) +
                           ", this build reads versions 1 and " +
                           std::to_string(StateBlobHeader::kVersion));
  int64_t n_tokens = 0;
  if (!r.Bytes(h.model.data(), h.model.size()) || !r.Str(&h.numerics, 64) || !r.Row(&h.kv_row) ||
      (version >= 2 && !r.Row(&h.compressed_row)) || !r.Row(&h.index_key) ||
      !r.Le(&h.page_tokens) || !r.Le(&h.window) || !r.Le(&h.n_layers) || !r.Le(&h.first_page) ||
      !r.Le(&h.end_pos) || !r.Le(&h.mtp_end_pos) || !r.Le(&n_tokens))
    return InvalidArgument("state blob: truncated or malformed header");
  if (version == 1) h.compressed_row = h.kv_row;  // version 1 stored both in one format
  if (h.page_tokens <= 0 || h.window <= 0 || h.n_layers <= 0 || h.first_page < 0 ||
      h.end_pos < 0 || h.mtp_end_pos < 0 || h.mtp_end_pos > h.end_pos || n_tokens != h.end_pos ||
      h.first_page * h.page_tokens > h.end_pos ||
      static_cast<uint64_t>(n_tokens) * 4 > body.size() - r.at())
    return InvalidArgument("state blob: inconsistent header fields");
  h.tokens.resize(static_cast<size_t>(n_tokens));
  if (!r.Bytes(h.tokens.data(), h.tokens.size() * 4) || !r.Le(&h.payload_bytes))
    return InvalidArgument("state blob: truncated token ids");
  if (h.payload_bytes < 0 || static_cast<uint64_t>(h.payload_bytes) != body.size() - r.at())
    return InvalidArgument("state blob: payload length does not match the blob");
  d.payload = body.subspan(r.at());
  return d;
}

}  // namespace dsinfer::model
