// The layout of one sequence's decode state (spec §10.2) and its byte formats, for every backend
// that keeps the state in memory it can address by byte (the CPU today).
//
// A state is two parts:
// - pages: fixed spans of `page_tokens` token positions (a multiple of 128 and of every
//   compression ratio) holding, for every layer that owns a compressor, the compressed KV rows
//   and the indexer keys produced by those positions. Pages are the part that grows with
//   context; they are shared copy-on-write between sequences and prefix-cache entries.
// - the boundary: per layer the window ring (the last window + rollback_tokens KV rows) and the
//   compressors' per-token projection history (enough to re-pool any group that is still open
//   after rolling back up to rollback_tokens tokens). Fixed size per sequence.
//
// Rows are stored in the exact formats their values already have in the numerics that wrote
// them (PackRow refuses a row it cannot hold exactly): FP8 e4m3 + e8m0 scale per 64 for the
// nope dims of KV rows with bf16 rope dims, FP4 e2m1 + e8m0 per 32 for indexer keys in the
// official numerics (V4.1: window rows FP8 over all dims per 32, compressed rows FP4 e2m1 with
// an e4m3 scale per 16); bf16 or f32 otherwise. Nothing is lost: unpacking gives the same bits.
// V4.1 with Engram adds one more boundary part: the token classes of the last n-gram positions.
//
// StateBlob* define the self-describing serialized form (Export / Import): header, token ids,
// page bytes, boundary bytes, SHA-256 over all of it.
// Pure functions and immutable value types; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "core/status.h"
#include "model/config.h"
#include "model/layer_plan.h"

namespace dsinfer::model {

// ---- row formats ----------------------------------------------------------------------------

enum class RowCodec : uint8_t {
  kF32 = 0,      // dim x f32
  kBf16 = 1,     // dim x bf16
  kFp8Nope = 2,  // leading `quantized` dims: e4m3 codes, one e8m0 scale per `block`; rest bf16
  kFp4 = 3,      // e2m1 pairs (low nibble = even dim), one e8m0 scale per `block`
  kFp4E4m3 = 4,  // e2m1 pairs, one e4m3 scale per `block` (V4.1 compressed KV, block 16)
};

struct RowFormat {
  RowCodec codec = RowCodec::kF32;
  int dim = 0;
  int quantized = 0;  // kFp8Nope: how many leading dims are on the FP8 grid
  int block = 0;      // kFp8Nope / kFp4: values per scale

  int64_t Bytes() const;
  std::string Describe() const;  // "fp8-nope(448/64)+bf16(64)", "f32(512)", ...
  bool operator==(const RowFormat&) const = default;
};

RowFormat F32Row(int dim);
RowFormat Bf16Row(int dim);
RowFormat Fp8NopeRow(int dim, int quantized, int block);
RowFormat Fp4Row(int dim, int block);
RowFormat Fp4E4m3Row(int dim, int block);

// Packs row [f.dim] f32 into out [f.Bytes()]. FailedPrecondition when a value is not exactly
// representable (a bug upstream, or a non-finite value from a broken checkpoint): the caller
// fails the step rather than store a different number.
Status PackRow(const RowFormat& f, const float* row, uint8_t* out);
// Unpacks in [f.Bytes()] into row [f.dim]: the packed values, bit for bit.
void UnpackRow(const RowFormat& f, const uint8_t* in, float* row);

// ---- state layout ---------------------------------------------------------------------------

struct StateLayoutOptions {
  int page_tokens = 128;     // a multiple of 128 and of every compression ratio
  int rollback_tokens = 16;  // how far Truncate can go back from the newest position
};

// One layer's part of the state.
struct LayerStateLayout {
  int layer = 0;
  bool mtp = false;    // an MTP block: its positions are the MTP stream's
  int ring_slots = 0;  // window KV rows kept: window + rollback_tokens (slot = pos % ring_slots)
  int compress_ratio = 0;  // the layer's own compressor (0: none)
  bool overlap = false;
  int kv_width = 0;        // compressor projection width (a and g+ape rows are this wide)
  int history_slots = 0;   // compressor projection rows kept (slot = pos % history_slots)
  int index_ratio = 0;     // index keys stored (0: none), one per index_ratio positions
  int index_width = 0;     // V4: the indexer compressor's projection width (V4.1: 0, none)
  int index_history_slots = 0;
  int64_t rows_per_page = 0;  // compressed KV rows per page (page_tokens / compress_ratio)
  int64_t keys_per_page = 0;  // indexer keys per page (page_tokens / index_ratio)
  int64_t page_rows_offset = 0;  // byte offsets of those rows and keys inside a page
  int64_t page_keys_offset = 0;
};

// Projection rows a compressor needs at position n to pool the group that is open there: the
// open group's tokens and, overlapping, the previous group's. Positions [first, n).
int64_t CompressorHistoryFirst(int64_t n, int ratio, bool overlap);

struct StateLayout {
  int page_tokens = 0;
  int rollback_tokens = 0;
  int window = 0;
  RowFormat kv_row;          // window ring rows
  RowFormat compressed_row;  // compressed KV rows (V4: the same format as kv_row)
  RowFormat index_key;       // indexer keys
  // V4.1 Engram: token classes kept per sequence (slot = pos % slots): the n-gram's previous
  // positions (max_ngram_size - 1) plus the rollback. 0 without Engram.
  int token_history_slots = 0;
  int token_history_needed = 0;  // max_ngram_size - 1
  int64_t token_classes = 0;     // classes are in [0, token_classes) (engram_compressed_vocab_size)
  std::vector<LayerStateLayout> layers;  // backbone, then MTP
  int64_t page_bytes = 0;

  // Pages holding the rows of n_tokens positions (the last one possibly partial).
  int64_t PagesFor(int64_t n_tokens) const {
    return (n_tokens + page_tokens - 1) / page_tokens;
  }
  // Bytes of one sequence's boundary part (ring + projection history, full capacity).
  int64_t FixedBytes() const;
  // An upper bound of one sequence's bytes after n_tokens positions: boundary + pages.
  int64_t BytesAt(int64_t n_tokens) const {
    return FixedBytes() + PagesFor(n_tokens) * page_bytes;
  }
  // Page bytes per token of context (the marginal cost of context).
  double PageBytesPerToken() const { return static_cast<double>(page_bytes) / page_tokens; }
  std::string Describe() const;
};

// kv_row / index_key / compressed_row (default: kv_row): the storage formats the backend's
// numerics write (PackRow must hold them).
Result<StateLayout> MakeStateLayout(const ModelConfig& config, const std::vector<LayerPlan>& plans,
                                    RowFormat kv_row, RowFormat index_key,
                                    const StateLayoutOptions& options,
                                    std::optional<RowFormat> compressed_row = std::nullopt);

// ---- serialized state (Export / Import) ------------------------------------------------------

// What identifies the state a blob holds, checked in full on import.
struct StateBlobHeader {
  // 2: the compressed rows' format and the Engram token classes (V4.1); version 1 blobs (no
  // compressed_row: it was kv_row) are still read.
  static constexpr uint32_t kVersion = 2;
  Sha256Digest model{};  // model/fingerprint.h
  std::string numerics;  // "official", "fp32-reference"
  RowFormat kv_row, compressed_row, index_key;
  int page_tokens = 0;
  int window = 0;
  int n_layers = 0;           // layer layouts in the layout (backbone + MTP)
  int64_t first_page = 0;     // pages [first_page, PagesFor(end_pos)) are in the blob
  int64_t end_pos = 0;        // the state's length: the boundary is at this position
  int64_t mtp_end_pos = 0;    // MTP blocks' length
  std::vector<int32_t> tokens;  // [end_pos] the ids the state consumed
  int64_t payload_bytes = 0;  // page bytes + boundary bytes that follow the header
};

// header | payload | SHA-256 of both.
std::vector<uint8_t> EncodeStateBlob(const StateBlobHeader& header,
                                     std::span<const uint8_t> payload);
// Parses and verifies a blob (magic, version, lengths, checksum). The payload view points into
// `blob`. Every defect is an InvalidArgument naming it.
struct DecodedStateBlob {
  StateBlobHeader header;
  std::span<const uint8_t> payload;
};
Result<DecodedStateBlob> DecodeStateBlob(std::span<const uint8_t> blob);

}  // namespace dsinfer::model
