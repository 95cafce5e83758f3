// Typed, zero-copy views of a V4 checkpoint's tensors, bound and validated before the first
// token: every expected tensor is checked for presence, dtype and shape (errors name the tensor
// and the file). The views point into the mmapped shards; nothing is copied or dequantized here.
// Thread-compatible; immutable after Load.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace dsinfer::model {

// How a weight matrix [rows = out, cols = in] is stored.
enum class WeightFormat {
  kF32,        // [rows, cols] f32
  kBF16,       // [rows, cols] bf16
  kFp8Block,   // [rows, cols] e4m3 codes; scales [ceil(rows/B), ceil(cols/B)] (B = 128)
  kFp4Packed,  // [rows, cols/2] packed e2m1 pairs (low nibble = even col); scales [rows, cols/32]
};

// A 2-D weight matrix view. Scales are e8m0 codes or f32 powers of two (scale_dtype says which).
struct WeightMatrix {
  WeightFormat format = WeightFormat::kF32;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  DType scale_dtype = DType::kF8E8M0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t scale_cols = 0;  // row stride of the scale grid
  int block = 128;         // FP8: square block edge (V4 128, V4.1 32); FP4: K block (32)
  int block_shift = 7;     // log2(block)
  std::string name;

  bool valid() const { return data != nullptr; }
  // Scale for weight element (r, c) as fp32. Inline: the GEMV kernels ask once per 32 (FP4)
  // or 128 (FP8) weights, and an out-of-line call there cost ~6 % of a decode step.
  float Scale(int64_t r, int64_t c) const {
    int64_t idx = format == WeightFormat::kFp4Packed
                      ? r * scale_cols + (c >> 5)
                      : (r >> block_shift) * scale_cols + (c >> block_shift);
    if (scale_dtype == DType::kF32) {
      float v;
      std::memcpy(&v, scales + idx * 4, 4);
      return v;
    }
    return E8M0ToF32(scales[idx]);
  }
  int64_t Bytes() const;
  int64_t Elements() const { return rows * cols; }  // multiply-adds per token through it
  // Bytes of one row's codes (scales apart): 4, 2, 1 or 1/2 per element.
  int64_t RowBytes() const {
    return format == WeightFormat::kF32        ? cols * 4
           : format == WeightFormat::kBF16     ? cols * 2
           : format == WeightFormat::kFp8Block ? cols
                                               : cols / 2;
  }
};

// A plain tensor view (norm weights, hc params, ape, sinks, biases, tid2eid).
struct TensorView {
  const uint8_t* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string name;
  bool valid() const { return data != nullptr; }
  int64_t NumElements() const;
  float F32At(int64_t i) const;    // F32 / BF16 element as fp32
  int64_t IntAt(int64_t i) const;  // I32 / I64 element
};

struct HcParams {
  TensorView fn;     // [(2+hc)*hc, hc*hidden] f32 (hc_head: [hc, hc*hidden])
  TensorView base;   // [(2+hc)*hc] f32 (hc_head: [hc])
  TensorView scale;  // [3] f32 (hc_head: [1])
};

struct CompressorWeights {
  TensorView ape;      // [ratio, coff*d] f32
  WeightMatrix wkv;    // [coff*d, hidden] bf16 (run in fp32)
  WeightMatrix wgate;  // [coff*d, hidden] bf16 (run in fp32)
  TensorView norm;     // [d] bf16
};

struct IndexerWeights {
  WeightMatrix wq_b;             // [index_heads*index_head_dim, q_lora] fp8
  WeightMatrix weights_proj;     // [index_heads, hidden] bf16
  CompressorWeights compressor;  // V4: d = index_head_dim, overlap (coff = 2)
  // V4.1 kv sources that are index sources: keys = k_norm(wk(compressed latent)).
  WeightMatrix wk;    // [index_head_dim, head_dim] bf16
  TensorView k_norm;  // [index_head_dim] bf16
};

// V4.1 Engram module of a layer (spec §14.5). The table is read row by row where it lies (the
// real ones are ~101 GB each): never copied, never scanned whole.
struct EngramWeights {
  TensorView table;        // [rows, head_dim_e] e4m3 codes
  TensorView table_scale;  // [rows, head_dim_e / 32] e8m0, per row and 32 columns
  WeightMatrix wkv;        // [hidden * (hc + 1), rows_per_token * head_dim_e] fp8
  TensorView q_weight;     // [hc, hidden] bf16
  TensorView k_weight;     // [hc, hidden] bf16
  bool valid() const { return table.valid(); }
};

// V4.1 dSpark stage tensors (spec §14.6), run by backend/v4_forward.h's DsparkSeed / DsparkDraft.
struct DsparkWeights {
  WeightMatrix main_proj;        // stage 0: [hidden, hidden * targets] fp8
  TensorView main_norm;          // stage 0: [hidden] bf16
  WeightMatrix markov_embed;     // last stage: [vocab, markov_rank] bf16
  WeightMatrix markov_head;      // last stage: [vocab, markov_rank] bf16
  WeightMatrix confidence_proj;  // last stage: [1, hidden + markov_rank] bf16
};

struct ExpertWeights {
  WeightMatrix w1;  // [moe_inter, hidden] fp4 (or fp8)
  WeightMatrix w3;  // [moe_inter, hidden]
  WeightMatrix w2;  // [hidden, moe_inter]
  // Multiply-adds per token through the expert.
  int64_t Elements() const { return w1.Elements() + w2.Elements() + w3.Elements(); }
};

struct LayerWeights {
  int layer_id = 0;  // 0..n_layers-1 backbone; n_layers.. MTP
  int compress_ratio = 0;
  HcParams hc_attn, hc_ffn;
  TensorView attn_norm;  // [hidden] bf16
  TensorView ffn_norm;   // [hidden] bf16
  // attention
  TensorView attn_sink;  // [heads] f32
  WeightMatrix wq_a;     // [q_lora, hidden] fp8
  TensorView q_norm;     // [q_lora] bf16
  WeightMatrix wq_b;     // [heads*head_dim, q_lora] fp8
  WeightMatrix wkv;      // [head_dim, hidden] fp8
  TensorView kv_norm;    // [head_dim] bf16
  WeightMatrix wo_a;     // [o_groups*o_lora, heads*head_dim/o_groups] fp8 (used as exact bf16)
  WeightMatrix wo_b;     // [hidden, o_groups*o_lora] fp8
  CompressorWeights compressor;  // ratio > 0 only
  IndexerWeights indexer;        // ratio == 4 only
  // MoE
  WeightMatrix gate;        // [experts, hidden] bf16 (run in fp32)
  TensorView gate_bias;     // [experts] f32 (score-routed layers)
  TensorView gate_bias_vl;  // V4.1 with a vision tower: [experts] f32 (image spans; unused)
  TensorView tid2eid;       // [vocab, experts_per_tok] i32/i64 (hash-routed layers)
  ExpertWeights shared;     // fp8
  std::vector<ExpertWeights> experts;
  // MTP only
  WeightMatrix e_proj, h_proj;    // [hidden, hidden] fp8
  TensorView enorm, hnorm, norm;  // [hidden] bf16
  HcParams hc_head;
  // V4.1
  EngramWeights engram;  // Engram layers only
  DsparkWeights dspark;  // dSpark stages only
};

// Where the weights live while the model runs.
enum class WeightResidency {
  kAuto,  // kCopy when the copy fits (ResolveWeightResidency), else kMap
  kMap,   // the files mmapped: starts at once, pages shared with the page cache
  kCopy,  // copied into anonymous memory at load (io::MappedFile::CopyIntoMemory): the kernels
          // stream it faster (docs/PERF.md), at the cost of the copy and resident memory
};
// "auto", "map", "copy"; nullopt for anything else.
std::optional<WeightResidency> ParseWeightResidency(std::string_view name);
std::string_view WeightResidencyName(WeightResidency residency);
// What Load does for `requested`, given the checkpoint's size, the memory the caller will need
// besides (reserve: e.g. the KV cache budget) and the memory available now (nullopt: unknown).
// kAuto copies when checkpoint + reserve fit in 90 % of the available memory (the rest for
// activations and the system), else maps, and maps when availability is unknown. kCopy fails
// with a clear error when checkpoint + reserve exceed the available memory. Pure.
Result<WeightResidency> ResolveWeightResidency(WeightResidency requested, uint64_t checkpoint_bytes,
                                               uint64_t reserve_bytes,
                                               std::optional<int64_t> available_bytes);

class ModelWeights {
 public:
  // Opens the checkpoint directory (config.json + safetensors), validates every tensor.
  // `reserve_bytes`: see ResolveWeightResidency. `placement`: where a copy's pages go (--numa;
  // mapped weights live in the page cache, which no placement reaches).
  static Result<std::unique_ptr<ModelWeights>> Load(
      const std::string& dir, WeightResidency residency = WeightResidency::kMap,
      uint64_t reserve_bytes = 0, const MemoryPlacement& placement = {});
  // Binds an already-open checkpoint against a config (used by tests).
  static Result<std::unique_ptr<ModelWeights>> Bind(const ModelConfig& config,
                                                    std::unique_ptr<io::Checkpoint> checkpoint);

  const ModelConfig& config() const { return config_; }
  const io::Checkpoint& checkpoint() const { return *checkpoint_; }
  // Whether the weights were copied into memory (WeightResidency::kCopy), else mmapped.
  bool copied() const { return checkpoint_->copied(); }

  TensorView embed;                  // [vocab, hidden] bf16
  WeightMatrix head;                 // [vocab, hidden] bf16 (fp32 logits)
  TensorView norm;                   // [hidden] bf16
  HcParams hc_head;                  // V4 only (V4.1 has no hc_head)
  std::vector<LayerWeights> layers;  // backbone then MTP (V4.1: dSpark stages)
  // V4.1 Engram: the class of every token id (text/engram_token_map.h), from the checkpoint's
  // tokenizer.json. [vocab_size]
  std::vector<int32_t> engram_token_map;
  // Tensors of the checkpoint that no expected tensor names and that were skipped on purpose
  // (V4.1's vision tower: text only for now).
  int64_t skipped_vision_tensors = 0;

 private:
  ModelConfig config_;
  std::unique_ptr<io::Checkpoint> checkpoint_;
};

// Bytes one decode step must read besides the routed experts and the KV state: every dense
// weight of the backbone once (attention, compressors, indexer, router gate, shared expert, mHC
// and norm parameters), the head, one embedding row. The roofline's fixed part (dsinfer bench).
int64_t DenseDecodeBytes(const ModelWeights& weights);

// One expected tensor of the official layout: name, accepted dtypes and shape.
struct TensorSpec {
  std::string name;
  std::vector<DType> dtypes;  // first = the dtype create-demo-model writes
  std::vector<int64_t> shape;
};
// Every tensor the config implies, in the official index order (per layer: non-expert tensors,
// experts, gate). Scales of FP8/FP4 matrices are listed right after their weights.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

}  // namespace dsinfer::model
