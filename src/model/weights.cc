#include "model/weights.h"

#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstring>

#include "core/system_memory.h"
#include "io/json_file.h"
#include "model/engram.h"
#include "text/engram_token_map.h"
#include "text/tokenizer.h"

namespace dsinfer::model {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Walks every tensor the config implies, in the official order. The same walk produces the
// expected-tensor table and binds the weights, so the two cannot disagree.
class TensorWalker {
 public:
  virtual ~TensorWalker() = default;
  int fp8_block = 128;  // edge of the FP8 weights' square scale blocks (quantization_config)
  virtual void Plain(const std::string& name, std::vector<DType> dtypes, std::vector<int64_t> shape,
                     TensorView* out) = 0;
  virtual void Matrix(const std::string& prefix, WeightFormat format, int64_t rows, int64_t cols,
                      WeightMatrix* out) = 0;
};

void WalkHc(TensorWalker& w, const std::string& p, const std::string& kind, const ModelConfig& c,
            HcParams* hc) {
  int64_t rows = kind == "head" ? c.hc_mult : c.HcRows();
  std::string stem = kind == "head" ? p + "hc_head_" : p + "hc_" + kind + "_";
  w.Plain(stem + "fn", {DType::kF32}, {rows, int64_t{c.hc_mult} * c.hidden},
          hc ? &hc->fn : nullptr);
  w.Plain(stem + "base", {DType::kF32}, {rows}, hc ? &hc->base : nullptr);
  w.Plain(stem + "scale", {DType::kF32}, {kind == "head" ? 1 : 3}, hc ? &hc->scale : nullptr);
}

void WalkCompressor(TensorWalker& w, const std::string& p, int ratio, int d, bool overlap,
                    const ModelConfig& c, CompressorWeights* cw) {
  int64_t coff = overlap ? 2 : 1;
  w.Plain(p + "ape", {DType::kF32}, {ratio, coff * d}, cw ? &cw->ape : nullptr);
  w.Matrix(p + "wkv", WeightFormat::kBF16, coff * d, c.hidden, cw ? &cw->wkv : nullptr);
  w.Matrix(p + "wgate", WeightFormat::kBF16, coff * d, c.hidden, cw ? &cw->wgate : nullptr);
  w.Plain(p + "norm.weight", {DType::kBF16}, {d}, cw ? &cw->norm : nullptr);
}

// What every V4-family block has, V4 and V4.1 alike: the mHC mixers, the two norms and the
// attention's query, latent KV, output projections and sink (prefix p = "layers.N." / "mtp.N.").
void WalkBlockCommon(TensorWalker& w, const std::string& p, const ModelConfig& c,
                     LayerWeights* lw) {
  const int64_t d = c.hidden, hd = c.head_dim, h = c.n_heads;
  WalkHc(w, p, "attn", c, lw ? &lw->hc_attn : nullptr);
  WalkHc(w, p, "ffn", c, lw ? &lw->hc_ffn : nullptr);
  w.Plain(p + "attn_norm.weight", {DType::kBF16}, {d}, lw ? &lw->attn_norm : nullptr);
  w.Plain(p + "ffn_norm.weight", {DType::kBF16}, {d}, lw ? &lw->ffn_norm : nullptr);
  const std::string a = p + "attn.";
  w.Plain(a + "attn_sink", {DType::kF32}, {h}, lw ? &lw->attn_sink : nullptr);  // [h]
  w.Matrix(a + "wq_a", WeightFormat::kFp8Block, c.q_lora_rank, d, lw ? &lw->wq_a : nullptr);
  w.Plain(a + "q_norm.weight", {DType::kBF16}, {c.q_lora_rank}, lw ? &lw->q_norm : nullptr);
  w.Matrix(a + "wq_b", WeightFormat::kFp8Block, h * hd, c.q_lora_rank, lw ? &lw->wq_b : nullptr);
  w.Matrix(a + "wkv", WeightFormat::kFp8Block, hd, d, lw ? &lw->wkv : nullptr);
  w.Plain(a + "kv_norm.weight", {DType::kBF16}, {hd}, lw ? &lw->kv_norm : nullptr);
  w.Matrix(a + "wo_a", WeightFormat::kFp8Block, int64_t{c.o_groups} * c.o_lora_rank,
           h * hd / c.o_groups, lw ? &lw->wo_a : nullptr);
  w.Matrix(a + "wo_b", WeightFormat::kFp8Block, d, int64_t{c.o_groups} * c.o_lora_rank,
           lw ? &lw->wo_b : nullptr);
}

// The shared expert of a MoE block, V4 and V4.1 alike (prefix f = "layers.N.ffn.").
void WalkSharedExperts(TensorWalker& w, const std::string& f, const ModelConfig& c,
                       LayerWeights* lw) {
  if (c.n_shared_experts <= 0) return;
  const int64_t d = c.hidden;
  w.Matrix(f + "shared_experts.w1", WeightFormat::kFp8Block, c.moe_inter, d,
           lw ? &lw->shared.w1 : nullptr);
  w.Matrix(f + "shared_experts.w2", WeightFormat::kFp8Block, d, c.moe_inter,
           lw ? &lw->shared.w2 : nullptr);
  w.Matrix(f + "shared_experts.w3", WeightFormat::kFp8Block, c.moe_inter, d,
           lw ? &lw->shared.w3 : nullptr);
}

void WalkLayer(TensorWalker& w, const ModelConfig& c, int li, LayerWeights* lw) {
  bool mtp = li >= c.n_layers;
  std::string p =
      mtp ? "mtp." + std::to_string(li - c.n_layers) + "." : "layers." + std::to_string(li) + ".";
  int ratio = c.CompressRatio(li);
  int64_t d = c.hidden;
  if (lw) lw->layer_id = li, lw->compress_ratio = ratio;
  if (mtp) {
    w.Matrix(p + "e_proj", WeightFormat::kFp8Block, d, d, lw ? &lw->e_proj : nullptr);
    w.Matrix(p + "h_proj", WeightFormat::kFp8Block, d, d, lw ? &lw->h_proj : nullptr);
    w.Plain(p + "enorm.weight", {DType::kBF16}, {d}, lw ? &lw->enorm : nullptr);
    w.Plain(p + "hnorm.weight", {DType::kBF16}, {d}, lw ? &lw->hnorm : nullptr);
  }
  WalkBlockCommon(w, p, c, lw);
  const std::string a = p + "attn.";
  if (ratio > 0) {
    WalkCompressor(w, a + "compressor.", ratio, c.head_dim, ratio == 4, c,
                   lw ? &lw->compressor : nullptr);
  }
  if (ratio == 4) {
    std::string ix = a + "indexer.";
    w.Matrix(ix + "wq_b", WeightFormat::kFp8Block, int64_t{c.index_n_heads} * c.index_head_dim,
             c.q_lora_rank, lw ? &lw->indexer.wq_b : nullptr);
    w.Matrix(ix + "weights_proj", WeightFormat::kBF16, c.index_n_heads, d,
             lw ? &lw->indexer.weights_proj : nullptr);
    WalkCompressor(w, ix + "compressor.", 4, c.index_head_dim, true, c,
                   lw ? &lw->indexer.compressor : nullptr);
  }
  if (mtp) {
    w.Plain(p + "norm.weight", {DType::kBF16}, {d}, lw ? &lw->norm : nullptr);
    WalkHc(w, p, "head", c, lw ? &lw->hc_head : nullptr);
  }
  std::string f = p + "ffn.";
  WalkSharedExperts(w, f, c, lw);
  if (lw) lw->experts.resize(c.n_routed_experts);
  WeightFormat ef = c.experts_fp4 ? WeightFormat::kFp4Packed : WeightFormat::kFp8Block;
  for (int e = 0; e < c.n_routed_experts; ++e) {
    std::string ep = f + "experts." + std::to_string(e) + ".";
    w.Matrix(ep + "w1", ef, c.moe_inter, d, lw ? &lw->experts[e].w1 : nullptr);
    w.Matrix(ep + "w3", ef, c.moe_inter, d, lw ? &lw->experts[e].w3 : nullptr);
  }
  for (int e = 0; e < c.n_routed_experts; ++e) {
    std::string ep = f + "experts." + std::to_string(e) + ".";
    w.Matrix(ep + "w2", ef, d, c.moe_inter, lw ? &lw->experts[e].w2 : nullptr);
  }
  if (c.HashRouted(li)) {
    w.Plain(f + "gate.tid2eid", {DType::kI32, DType::kI64}, {c.vocab_size, c.n_experts_per_tok},
            lw ? &lw->tid2eid : nullptr);
  } else {
    w.Plain(f + "gate.bias", {DType::kF32}, {c.n_routed_experts}, lw ? &lw->gate_bias : nullptr);
  }
  w.Matrix(f + "gate", WeightFormat::kBF16, c.n_routed_experts, d, lw ? &lw->gate : nullptr);
}

// A V4.1 backbone layer or dSpark stage (reference/v41/LAYOUT.md, "Tensors").
void WalkLayerV41(TensorWalker& w, const ModelConfig& c, int li, LayerWeights* lw) {
  const bool stage = li >= c.n_layers;
  const int s = li - c.n_layers;
  const std::string p =
      stage ? "mtp." + std::to_string(s) + "." : "layers." + std::to_string(li) + ".";
  const int ratio = c.CompressRatio(li);
  const int64_t d = c.hidden, hd = c.head_dim;
  if (lw) lw->layer_id = li, lw->compress_ratio = ratio;
  if (stage && s == 0) {
    w.Matrix(p + "main_proj", WeightFormat::kFp8Block, d,
             d * static_cast<int64_t>(c.dspark.target_layer_ids.size()),
             lw ? &lw->dspark.main_proj : nullptr);
    w.Plain(p + "main_norm.weight", {DType::kBF16}, {d}, lw ? &lw->dspark.main_norm : nullptr);
  }
  WalkBlockCommon(w, p, c, lw);
  const std::string a = p + "attn.";
  const bool kv_source = !stage && c.IsKvSource(li);
  const bool index_source = !stage && c.IsIndexSource(li);
  if (kv_source) {
    // No ape and no overlap; ratio 1 has no gate (one row per token).
    const std::string cp = a + "compressor.";
    CompressorWeights* cw = lw ? &lw->compressor : nullptr;
    w.Matrix(cp + "wkv", WeightFormat::kBF16, hd, d, cw ? &cw->wkv : nullptr);
    if (ratio > 1) w.Matrix(cp + "wgate", WeightFormat::kBF16, hd, d, cw ? &cw->wgate : nullptr);
    w.Plain(cp + "norm.weight", {DType::kBF16}, {hd}, cw ? &cw->norm : nullptr);
    if (index_source) {
      w.Matrix(a + "indexer.wk", WeightFormat::kBF16, c.index_head_dim, hd,
               lw ? &lw->indexer.wk : nullptr);
      w.Plain(a + "indexer.k_norm.weight", {DType::kBF16}, {c.index_head_dim},
              lw ? &lw->indexer.k_norm : nullptr);
    }
  }
  if (index_source) {
    w.Matrix(a + "indexer.wq_b", WeightFormat::kFp8Block,
             int64_t{c.index_n_heads} * c.index_head_dim, c.q_lora_rank,
             lw ? &lw->indexer.wq_b : nullptr);
    w.Matrix(a + "indexer.weights_proj", WeightFormat::kBF16, c.index_n_heads, d,
             lw ? &lw->indexer.weights_proj : nullptr);
  }
  const int ej = stage ? -1 : c.engram.IndexOf(li);
  if (ej >= 0) {
    const EngramConfig& e = c.engram;
    const std::string ep = p + "engram.";
    EngramWeights* ew = lw ? &lw->engram : nullptr;
    w.Plain(ep + "embed.weight", {DType::kF8E4M3}, {e.num_embeddings[ej], e.head_dim},
            ew ? &ew->table : nullptr);
    w.Plain(ep + "embed.scale", {DType::kF8E8M0}, {e.num_embeddings[ej], e.head_dim / 32},
            ew ? &ew->table_scale : nullptr);
    w.Matrix(ep + "wkv", WeightFormat::kFp8Block, d * (c.hc_mult + 1),
             int64_t{e.RowsPerToken()} * e.head_dim, ew ? &ew->wkv : nullptr);
    w.Plain(ep + "q_weight", {DType::kBF16}, {c.hc_mult, d}, ew ? &ew->q_weight : nullptr);
    w.Plain(ep + "k_weight", {DType::kBF16}, {c.hc_mult, d}, ew ? &ew->k_weight : nullptr);
  }
  if (stage && s == c.n_mtp_layers - 1) {
    DsparkWeights* dw = lw ? &lw->dspark : nullptr;
    w.Plain(p + "norm.weight", {DType::kBF16}, {d}, lw ? &lw->norm : nullptr);
    w.Matrix(p + "markov_head.embed", WeightFormat::kBF16, c.vocab_size, c.dspark.markov_rank,
             dw ? &dw->markov_embed : nullptr);
    w.Matrix(p + "markov_head.head", WeightFormat::kBF16, c.vocab_size, c.dspark.markov_rank,
             dw ? &dw->markov_head : nullptr);
    w.Matrix(p + "confidence_head.proj", WeightFormat::kBF16, 1, d + c.dspark.markov_rank,
             dw ? &dw->confidence_proj : nullptr);
  }
  const std::string f = p + "ffn.";
  const int E = c.RoutedExperts(li);
  WalkSharedExperts(w, f, c, lw);
  if (lw) lw->experts.resize(E);
  for (int e = 0; e < E; ++e) {
    const std::string ep = f + "experts." + std::to_string(e) + ".";
    w.Matrix(ep + "w1", WeightFormat::kFp4Packed, c.moe_inter, d,
             lw ? &lw->experts[e].w1 : nullptr);
    w.Matrix(ep + "w3", WeightFormat::kFp4Packed, c.moe_inter, d,
             lw ? &lw->experts[e].w3 : nullptr);
  }
  for (int e = 0; e < E; ++e) {
    const std::string ep = f + "experts." + std::to_string(e) + ".";
    w.Matrix(ep + "w2", WeightFormat::kFp4Packed, d, c.moe_inter,
             lw ? &lw->experts[e].w2 : nullptr);
  }
  w.Plain(f + "gate.bias", {DType::kF32}, {E}, lw ? &lw->gate_bias : nullptr);
  if (c.vision) w.Plain(f + "gate.bias_vl", {DType::kF32}, {E}, lw ? &lw->gate_bias_vl : nullptr);
  w.Matrix(f + "gate", WeightFormat::kBF16, E, d, lw ? &lw->gate : nullptr);
}

void WalkModelV41(TensorWalker& w, const ModelConfig& c, ModelWeights* mw) {
  w.Plain("embed.weight", {DType::kBF16}, {c.vocab_size, c.hidden}, mw ? &mw->embed : nullptr);
  for (int li = 0; li < c.n_layers; ++li) WalkLayerV41(w, c, li, mw ? &mw->layers[li] : nullptr);
  w.Plain("norm.weight", {DType::kBF16}, {c.hidden}, mw ? &mw->norm : nullptr);
  w.Matrix("head", WeightFormat::kBF16, c.vocab_size, c.hidden, mw ? &mw->head : nullptr);
  for (int li = c.n_layers; li < c.n_layers + c.n_mtp_layers; ++li)
    WalkLayerV41(w, c, li, mw ? &mw->layers[li] : nullptr);
}

void WalkModel(TensorWalker& w, const ModelConfig& c, ModelWeights* mw) {
  w.fp8_block = c.weight_block;
  if (c.V41()) {
    WalkModelV41(w, c, mw);
    return;
  }
  w.Plain("embed.weight", {DType::kBF16}, {c.vocab_size, c.hidden}, mw ? &mw->embed : nullptr);
  for (int li = 0; li < c.n_layers; ++li) WalkLayer(w, c, li, mw ? &mw->layers[li] : nullptr);
  WalkHc(w, "", "head", c, mw ? &mw->hc_head : nullptr);
  w.Plain("norm.weight", {DType::kBF16}, {c.hidden}, mw ? &mw->norm : nullptr);
  w.Matrix("head", WeightFormat::kBF16, c.vocab_size, c.hidden, mw ? &mw->head : nullptr);
  for (int li = c.n_layers; li < c.n_layers + c.n_mtp_layers; ++li)
    WalkLayer(w, c, li, mw ? &mw->layers[li] : nullptr);
}

class SpecCollector : public TensorWalker {
 public:
  std::vector<TensorSpec> specs;
  void Plain(const std::string& name, std::vector<DType> dtypes, std::vector<int64_t> shape,
             TensorView*) override {
    specs.push_back({name, std::move(dtypes), std::move(shape)});
  }
  void Matrix(const std::string& prefix, WeightFormat format, int64_t rows, int64_t cols,
              WeightMatrix*) override {
    switch (format) {
      case WeightFormat::kF32:
        specs.push_back({prefix + ".weight", {DType::kF32}, {rows, cols}});
        break;
      case WeightFormat::kBF16:
        specs.push_back({prefix + ".weight", {DType::kBF16}, {rows, cols}});
        break;
      case WeightFormat::kFp8Block:
        specs.push_back({prefix + ".weight", {DType::kF8E4M3}, {rows, cols}});
        specs.push_back({prefix + ".scale",
                         {DType::kF8E8M0, DType::kF32},
                         {CeilDiv(rows, fp8_block), CeilDiv(cols, fp8_block)}});
        break;
      case WeightFormat::kFp4Packed:
        specs.push_back({prefix + ".weight", {DType::kI8, DType::kU8}, {rows, cols / 2}});
        specs.push_back({prefix + ".scale", {DType::kF8E8M0, DType::kF32}, {rows, cols / 32}});
        break;
    }
  }
};

// Binds views and records the first error (with the tensor and file named).
class Binder : public TensorWalker {
 public:
  explicit Binder(const io::Checkpoint& ckpt) : ckpt_(ckpt) {}
  Status status;

  void Plain(const std::string& name, std::vector<DType> dtypes, std::vector<int64_t> shape,
             TensorView* out) override {
    if (!status.ok()) return;
    io::TensorRef ref;
    if (!Check(name, dtypes, shape, &ref)) return;
    out->data = ref.bytes.data();
    out->dtype = ref.info->dtype;
    out->shape = ref.info->shape;
    out->name = name;
  }

  void Matrix(const std::string& prefix, WeightFormat format, int64_t rows, int64_t cols,
              WeightMatrix* out) override {
    if (!status.ok()) return;
    SpecCollector one;
    one.fp8_block = fp8_block;
    one.Matrix(prefix, format, rows, cols, nullptr);
    io::TensorRef weight, scale;
    if (!Check(one.specs[0].name, one.specs[0].dtypes, one.specs[0].shape, &weight)) return;
    if (one.specs.size() > 1 &&
        !Check(one.specs[1].name, one.specs[1].dtypes, one.specs[1].shape, &scale))
      return;
    out->format = format;
    out->data = weight.bytes.data();
    out->rows = rows;
    out->cols = cols;
    out->name = prefix;
    if (scale.info) {
      out->scales = scale.bytes.data();
      out->scale_dtype = scale.info->dtype;
      out->scale_cols = scale.info->shape[1];
      out->block = format == WeightFormat::kFp4Packed ? 32 : fp8_block;
      out->block_shift = std::countr_zero(static_cast<unsigned>(out->block));
      // A scale code of 0xff (NaN) would poison every product of the block: reject at load.
      if (out->scale_dtype == DType::kF8E8M0) {
        for (uint8_t b : scale.bytes) {
          if (b == 0xff) {
            status = InvalidArgument("tensor '" + one.specs[1].name + "' in " + *scale.file +
                                     " contains a NaN e8m0 scale (0xff)");
            return;
          }
        }
      }
    }
  }

 private:
  bool Check(const std::string& name, const std::vector<DType>& dtypes,
             const std::vector<int64_t>& shape, io::TensorRef* ref) {
    *ref = ckpt_.Find(name);
    if (ref->info == nullptr) {
      status = NotFound("checkpoint " + ckpt_.dir() + " is missing tensor '" + name + "'");
      return false;
    }
    bool dtype_ok = false;
    for (DType d : dtypes) dtype_ok = dtype_ok || d == ref->info->dtype;
    if (!dtype_ok) {
      std::string want;
      for (DType d : dtypes)
        want += std::string(want.empty() ? "" : " or ") + std::string(SafetensorsName(d));
      status =
          InvalidArgument("tensor '" + name + "' in " + *ref->file + " has dtype " +
                          std::string(SafetensorsName(ref->info->dtype)) + ", expected " + want);
      return false;
    }
    if (ref->info->shape != shape) {
      auto fmt = [](const std::vector<int64_t>& s) {
        std::string out = "[";
        for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
        return out + "]";
      };
      status = InvalidArgument("tensor '" + name + "' in " + *ref->file + " has shape " +
                               fmt(ref->info->shape) + ", expected " + fmt(shape));
      return false;
    }
    return true;
  }
  const io::Checkpoint& ckpt_;
};

}  // namespace

int64_t WeightMatrix::Bytes() const {
  switch (format) {
    case WeightFormat::kF32:
      return rows * cols * 4;
    case WeightFormat::kBF16:
      return rows * cols * 2;
    case WeightFormat::kFp8Block:
      return rows * cols + CeilDiv(rows, block) * CeilDiv(cols, block);
    case WeightFormat::kFp4Packed:
      return rows * cols / 2 + rows * cols / 32;
  }
  return 0;
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

float TensorView::F32At(int64_t i) const {
  if (dtype == DType::kBF16) {
    uint16_t b;
    std::memcpy(&b, data + 2 * i, 2);
    return Bf16ToF32(b);
  }
  float v;
  std::memcpy(&v, data + 4 * i, 4);
  return v;
}

int64_t TensorView::IntAt(int64_t i) const {
  if (dtype == DType::kI64) {
    int64_t v;
    std::memcpy(&v, data + 8 * i, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, data + 4 * i, 4);
  return v;
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config) {
  SpecCollector collector;
  WalkModel(collector, config, nullptr);
  return std::move(collector.specs);
}

namespace {

// V4.1 Engram: the token classes from the checkpoint's tokenizer.json (spec §14.5), and the
// tables' sizes checked against the hash primes.
Status BindEngramTokenMap(ModelWeights& mw) {
  const ModelConfig& c = mw.config();
  DSINFER_RETURN_IF_ERROR(EngramHasher::Create(c.engram).status());
  const std::string path = mw.checkpoint().dir() + "/tokenizer.json";
  if (::access(path.c_str(), R_OK) != 0)
    return NotFound("checkpoint " + mw.checkpoint().dir() +
                    " has Engram layers, whose token map is built from its tokenizer.json "
                    "(spec §14.5): there is none");
  DSINFER_ASSIGN_OR_RETURN(text::Tokenizer tokenizer, text::Tokenizer::FromFile(path));
  DSINFER_ASSIGN_OR_RETURN(text::EngramTokenMap map, text::BuildEngramTokenMap(tokenizer));
  if (map.classes != c.engram.compressed_vocab_size)
    return InvalidArgument(path + " gives " + std::to_string(map.classes) +
                           " Engram token classes, the config's engram_compressed_vocab_size is " +
                           std::to_string(c.engram.compressed_vocab_size));
  if (static_cast<int64_t>(map.class_of.size()) < c.vocab_size)
    return InvalidArgument(path + " has " + std::to_string(map.class_of.size()) +
                           " tokens, fewer than the model's vocab_size " +
                           std::to_string(c.vocab_size));
  map.class_of.resize(static_cast<size_t>(c.vocab_size));
  mw.engram_token_map = std::move(map.class_of);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> ModelWeights::Bind(
    const ModelConfig& config, std::unique_ptr<io::Checkpoint> checkpoint) {
  auto mw = std::unique_ptr<ModelWeights>(new ModelWeights());
  mw->config_ = config;
  mw->checkpoint_ = std::move(checkpoint);
  mw->layers.resize(config.n_layers + config.n_mtp_layers);
  Binder binder(*mw->checkpoint_);
  WalkModel(binder, config, mw.get());
  DSINFER_RETURN_IF_ERROR(binder.status);
  if (config.engram.enabled()) DSINFER_RETURN_IF_ERROR(BindEngramTokenMap(*mw));
  // Engram tables are read a row at a time (24 rows of one table per token, spec §14.5): no
  // readahead, or every row fault would read (and keep) the pages around it.
  for (const std::string& name : mw->checkpoint_->TensorNames())
    if (name.ends_with(".engram.embed.weight") || name.ends_with(".engram.embed.scale"))
      DSINFER_RETURN_IF_ERROR(mw->checkpoint_->AdviseRandomAccess(name));
  // V4.1's vision tower is not run (text only): its tensors are recognised and left alone.
  for (const std::string& name : mw->checkpoint_->TensorNames())
    if (name.rfind("vision.", 0) == 0 || name.rfind("aligner.", 0) == 0 || name == "image_start" ||
        name == "image_end" || name == "image_newline")
      ++mw->skipped_vision_tensors;
  // Hash routing reads tid2eid[token] as expert ids: validate them once so the forward pass
  // can index experts without bounds checks.
  for (const auto& layer : mw->layers) {
    if (!layer.tid2eid.valid()) continue;
    int64_t n = layer.tid2eid.NumElements();
    for (int64_t i = 0; i < n; ++i) {
      int64_t e = layer.tid2eid.IntAt(i);
      if (e < 0 || e >= config.n_routed_experts)
        return InvalidArgument("tensor '" + layer.tid2eid.name + "' holds expert id " +
                               std::to_string(e) + " outside [0, " +
                               std::to_string(config.n_routed_experts) + ")");
    }
  }
  return mw;
}

std::optional<WeightResidency> ParseWeightResidency(std::string_view name) {
  if (name == "auto") return WeightResidency::kAuto;
  if (name == "map") return WeightResidency::kMap;
  if (name == "copy") return WeightResidency::kCopy;
  return std::nullopt;
}

std::string_view WeightResidencyName(WeightResidency residency) {
  switch (residency) {
    case WeightResidency::kAuto:
      return "auto";
    case WeightResidency::kMap:
      return "map";
    case WeightResidency::kCopy:
      return "copy";
  }
  return "?";
}

Result<WeightResidency> ResolveWeightResidency(WeightResidency requested, uint64_t checkpoint_bytes,
                                               uint64_t reserve_bytes,
                                               std::optional<int64_t> available_bytes) {
  const auto gib = [](uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / double(int64_t{1} << 30));
    return std::string(text);
  };
  const uint64_t available = available_bytes ? static_cast<uint64_t>(*available_bytes) : 0;
  const uint64_t needed = checkpoint_bytes + reserve_bytes;
  switch (requested) {
    case WeightResidency::kMap:
      return WeightResidency::kMap;
    case WeightResidency::kAuto:
      return available_bytes && needed <= available / 10 * 9 ? WeightResidency::kCopy
                                                             : WeightResidency::kMap;
    case WeightResidency::kCopy:
      if (available_bytes && needed > available)
        return ResourceExhausted("copying the weights into memory needs " + gib(checkpoint_bytes) +
                                 " GiB (plus " + gib(reserve_bytes) + " GiB reserved), " +
                                 gib(available) +
                                 " GiB are available: map them instead (--weights map)");
      return WeightResidency::kCopy;
  }
  return WeightResidency::kMap;
}

Result<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& dir,
                                                         WeightResidency residency,
                                                         uint64_t reserve_bytes,
                                                         const MemoryPlacement& placement) {
  DSINFER_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromFile(dir + "/config.json"));
  DSINFER_ASSIGN_OR_RETURN(std::unique_ptr<io::Checkpoint> checkpoint, io::Checkpoint::Open(dir));
  DSINFER_ASSIGN_OR_RETURN(WeightResidency resolved,
                           ResolveWeightResidency(residency, checkpoint->TotalBytes(),
                                                  reserve_bytes, AvailableMemoryBytes()));
  // Before Bind: the views point into wherever the bytes are.
  if (resolved == WeightResidency::kCopy)
    DSINFER_RETURN_IF_ERROR(checkpoint->CopyIntoMemory(placement));
  DSINFER_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                           Bind(config, std::move(checkpoint)));
  if (weights->skipped_vision_tensors > 0)
    std::fprintf(stderr,
                 "dsinfer: %s: skipping the vision tower (%lld tensors vision.*, aligner.*, "
                 "image_*): text input only\n",
                 dir.c_str(), static_cast<long long>(weights->skipped_vision_tensors));
  return weights;
}

namespace {

int64_t ViewBytes(const TensorView& t) {
  return t.valid() ? t.NumElements() * static_cast<int64_t>(DTypeSize(t.dtype)) : 0;
}

int64_t HcBytes(const HcParams& h) {
  return ViewBytes(h.fn) + ViewBytes(h.base) + ViewBytes(h.scale);
}

}  // namespace

int64_t DenseDecodeBytes(const ModelWeights& w) {
  const auto& c = w.config();
  int64_t total = w.head.Bytes() + int64_t{c.hidden} * 2 + ViewBytes(w.norm) + HcBytes(w.hc_head);
  for (int li = 0; li < c.n_layers; ++li) {
    const auto& l = w.layers[li];
    total +=
        HcBytes(l.hc_attn) + HcBytes(l.hc_ffn) + ViewBytes(l.attn_norm) + ViewBytes(l.ffn_norm);
    total += l.wq_a.Bytes() + l.wq_b.Bytes() + l.wkv.Bytes() + l.wo_a.Bytes() + l.wo_b.Bytes();
    total += ViewBytes(l.q_norm) + ViewBytes(l.kv_norm) + ViewBytes(l.attn_sink);
    if (l.compressor.wkv.valid()) total += l.compressor.wkv.Bytes() + l.compressor.wgate.Bytes();
    if (l.indexer.wq_b.valid())
      total += l.indexer.wq_b.Bytes() + l.indexer.weights_proj.Bytes() +
               l.indexer.compressor.wkv.Bytes() + l.indexer.compressor.wgate.Bytes();
    total += l.gate.Bytes();
    if (l.shared.w1.valid())
      total += l.shared.w1.Bytes() + l.shared.w2.Bytes() + l.shared.w3.Bytes();
  }
  return total;
}

}  // namespace dsinfer::model
