#include "model/demo_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "model/weights.h"

namespace dsinfer::model {
namespace {

// splitmix64: seeds and a small, fast, portable generator (identical output everywhere).
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Uniform() {
    return static_cast<float>(static_cast<int64_t>(Next() >> 40) - (1 << 23)) / (1 << 23);
  }
  // Approximately standard normal (Irwin-Hall of 4 uniforms, variance matched).
  float Normal() { return (Uniform() + Uniform() + Uniform() + Uniform()) * 0.8660254f; }
};

uint64_t HashName(const std::string& s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Standard deviation of a tensor's random values, chosen so activations keep unit scale
// through the network and logits have a useful spread (so greedy decoding is not tie-bound).
float InitStd(const std::string& name, const std::vector<int64_t>& shape, int hidden) {
  if (name == "embed.weight") return 1.0f;
  if (name == "head.weight") return 4.0f / std::sqrt(static_cast<float>(hidden));
  int64_t cols = shape.size() > 1 ? shape[1] : 1;
  if (EndsWith(name, "_fn")) return 1.0f / std::sqrt(static_cast<float>(cols));
  return 1.0f / std::sqrt(static_cast<float>(cols));
}

// Fills bytes for a plain (non-quantized) tensor.
std::vector<uint8_t> PlainTensor(const TensorSpec& spec, const ModelConfig& c, uint64_t seed,
                                 ThreadPool& pool) {
  int64_t n = 1;
  for (int64_t s : spec.shape) n *= s;
  DType dt = spec.dtypes[0];
  std::vector<uint8_t> bytes(n * DTypeSize(dt));
  const std::string& name = spec.name;
  if (EndsWith(name, "tid2eid")) {
    // Distinct experts per token, like a real hash table.
    SplitMix64 rng{HashName(name, seed)};
    int k = static_cast<int>(spec.shape[1]);
    std::vector<int32_t> perm(c.n_routed_experts);
    for (int64_t t = 0; t < spec.shape[0]; ++t) {
      for (int e = 0; e < c.n_routed_experts; ++e) perm[e] = e;
      for (int i = 0; i < k; ++i) {
        int j = i + static_cast<int>(rng.Next() % (c.n_routed_experts - i));
        std::swap(perm[i], perm[j]);
        std::memcpy(bytes.data() + (t * k + i) * 4, &perm[i], 4);
      }
    }
    return bytes;
  }
  float offset = 0.0f, spread = 0.0f;
  bool normal = false;
  if (EndsWith(name, "norm.weight") || EndsWith(name, "engram.q_weight") ||
      EndsWith(name, "engram.k_weight")) {
    offset = 1.0f, spread = 0.2f;
  } else if (EndsWith(name, "_scale")) {
    offset = 1.0f, spread = 0.5f;
  } else if (EndsWith(name, "_base")) {
    spread = 1.0f;
  } else if (EndsWith(name, "attn_sink")) {
    spread = 1.0f;
  } else if (EndsWith(name, ".ape")) {
    spread = 0.5f;
  } else if (EndsWith(name, "gate.bias")) {
    spread = 0.2f;
  } else {
    normal = true;
    spread = InitStd(name, spec.shape, c.hidden);
  }
  // Row blocks get their own seeds so generation parallelises deterministically.
  int64_t row_len = spec.shape.size() > 1 ? n / spec.shape[0] : n;
  int64_t n_rows = n / row_len;
  constexpr int64_t kRowsPerBlock = 256;
  pool.ParallelFor((n_rows + kRowsPerBlock - 1) / kRowsPerBlock, [&](int64_t blk) {
    SplitMix64 rng{HashName(name, seed) + static_cast<uint64_t>(blk) * 0x632be59bd9b4e019ull};
    int64_t end = std::min(n_rows, (blk + 1) * kRowsPerBlock) * row_len;
    for (int64_t i = blk * kRowsPerBlock * row_len; i < end; ++i) {
      float v = normal ? rng.Normal() * spread : offset + rng.Uniform() * spread;
      if (dt == DType::kBF16) {
        uint16_t b = F32ToBf16(v);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      } else {
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      }
    }
  });
  return bytes;
}

// FP8 block-quantized matrix: Gaussian values quantized per block x block tile (128 in V4, 32
// in V4.1) with a power-of-two e8m0 scale, exactly as the official checkpoints are stored.
void Fp8Matrix(const std::string& name, int64_t rows, int64_t cols, int64_t block, uint64_t seed,
               ThreadPool& pool, std::vector<uint8_t>* codes, std::vector<uint8_t>* scales) {
  int64_t srows = (rows + block - 1) / block, scols = (cols + block - 1) / block;
  codes->assign(rows * cols, 0);
  scales->assign(srows * scols, 127);
  float stdv = 1.0f / std::sqrt(static_cast<float>(cols));
  pool.ParallelFor(srows, [&](int64_t br) {
    SplitMix64 rng{HashName(name, seed) + static_cast<uint64_t>(br) * 0x632be59bd9b4e019ull};
    int64_t r0 = br * block, r1 = std::min(rows, r0 + block);
    std::vector<float> values((r1 - r0) * cols);
    for (auto& v : values) v = rng.Normal() * stdv;
    for (int64_t bc = 0; bc < scols; ++bc) {
      int64_t c0 = bc * block, c1 = std::min(cols, c0 + block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t cc = c0; cc < c1; ++cc)
          amax = std::max(amax, std::fabs(values[(r - r0) * cols + cc]));
      int e = CeilLog2FromBits(std::max(amax, 1e-30f) / 448.0f);
      e = std::clamp(e, -126, 127);
      (*scales)[br * scols + bc] = static_cast<uint8_t>(e + 127);
      float inv = std::ldexp(1.0f, -e);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t cc = c0; cc < c1; ++cc)
          (*codes)[r * cols + cc] =
              F32ToE4M3(std::clamp(values[(r - r0) * cols + cc] * inv, -448.0f, 448.0f));
    }
  });
}

// V4.1 Engram table [rows, cols]: e4m3 codes of unit-variance values with one e8m0 scale per row
// and 32 columns (spec §14.5). Rows in parallel blocks with their own seeds.
void EngramTable(const std::string& name, int64_t rows, int64_t cols, uint64_t seed,
                 ThreadPool& pool, std::vector<uint8_t>* codes, std::vector<uint8_t>* scales) {
  codes->assign(rows * cols, 0);
  scales->assign(rows * (cols / 32), 127);
  constexpr int64_t kRowsPerTask = 256;
  pool.ParallelFor((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    SplitMix64 rng{HashName(name, seed) + static_cast<uint64_t>(t) * 0x632be59bd9b4e019ull};
    std::vector<float> v(32);
    for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r) {
      for (int64_t b = 0; b < cols / 32; ++b) {
        float amax = 0.0f;
        for (float& x : v) amax = std::max(amax, std::fabs(x = rng.Normal()));
        const int e = std::clamp(CeilLog2FromBits(std::max(amax, 1e-30f) / 448.0f), -126, 127);
        (*scales)[r * (cols / 32) + b] = static_cast<uint8_t>(e + 127);
        for (int i = 0; i < 32; ++i)
          (*codes)[r * cols + b * 32 + i] =
              F32ToE4M3(std::clamp(std::ldexp(v[i], -e), -448.0f, 448.0f));
      }
    }
  });
}

// Packed FP4 expert matrix: random e2m1 codes with one e8m0 scale per 32 columns, chosen so the
// row has std ~ 1/sqrt(cols). Codes are drawn directly (not from floats) so the 12 GB bench
// preset is written in seconds.
void Fp4Matrix(const std::string& name, int64_t rows, int64_t cols, uint64_t seed, ThreadPool& pool,
               std::vector<uint8_t>* packed, std::vector<uint8_t>* scales) {
  packed->assign(rows * cols / 2, 0);
  scales->assign(rows * cols / 32, 0);
  // E[v^2] over the 16 e2m1 codes is 8.5625; pick 2^e nearest to target_std / sqrt(8.5625).
  float target = 1.0f / std::sqrt(static_cast<float>(cols)) / std::sqrt(8.5625f);
  int base_exp = static_cast<int>(std::lround(std::log2(target)));
  constexpr int64_t kRowsPerTask = 64;
  pool.ParallelFor((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    SplitMix64 rng{HashName(name, seed) + static_cast<uint64_t>(t) * 0x632be59bd9b4e019ull};
    int64_t r1 = std::min(rows, (t + 1) * kRowsPerTask);
    for (int64_t r = t * kRowsPerTask; r < r1; ++r) {
      uint8_t* row = packed->data() + r * cols / 2;
      for (int64_t i = 0; i < cols / 2; i += 8) {
        uint64_t bits = rng.Next();
        std::memcpy(row + i, &bits, std::min<int64_t>(8, cols / 2 - i));
      }
      for (int64_t b = 0; b < cols / 32; ++b) {
        int jitter =
            static_cast<int>(rng.Next() % 3) - 1;  // scales vary by block, as in real weights
        (*scales)[r * (cols / 32) + b] =
            static_cast<uint8_t>(std::clamp(base_exp + jitter + 127, 1, 254));
      }
    }
  });
}

}  // namespace

Status WriteDemoModel(const ModelConfig& config, const std::string& dir,
                      const DemoModelOptions& options, ThreadPool& pool) {
  DSINFER_RETURN_IF_ERROR(config.Validate());
  if (config.engram.enabled() && options.tokenizer_json.empty())
    return InvalidArgument(
        "this configuration has Engram layers, whose token map is built from the checkpoint's "
        "tokenizer: give one (create-demo-model --tokenizer FILE)");
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return IoError("cannot create directory " + dir + ": " + std::strerror(errno));

  std::vector<TensorSpec> specs = ExpectedTensors(config);
  auto spec_bytes = [](const TensorSpec& s) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    return static_cast<uint64_t>(n) * DTypeSize(s.dtypes[0]);
  };
  uint64_t total = 0;
  for (const auto& s : specs) total += spec_bytes(s);
  uint64_t shard_limit = options.max_shard_bytes;
  if (shard_limit == 0) shard_limit = total < (1ull << 30) ? total / 2 + 1 : (4ull << 30);

  // Assign tensors to shards; a matrix's scale always stays with its weight.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    bool is_scale = EndsWith(specs[i].name, ".scale");
    if (!is_scale && in_shard > 0 && in_shard + spec_bytes(specs[i]) > shard_limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += spec_bytes(specs[i]);
  }

  nlohmann::json weight_map = nlohmann::json::object();
  char shard_name[64];
  for (size_t si = 0; si < shards.size(); ++si) {
    std::snprintf(shard_name, sizeof(shard_name), "model-%05zu-of-%05zu.safetensors", si + 1,
                  shards.size());
    io::SafetensorsWriter writer;
    writer.SetMetadata("format", "pt");
    for (size_t i : shards[si]) {
      DSINFER_RETURN_IF_ERROR(writer.Declare(specs[i].name, specs[i].dtypes[0], specs[i].shape));
      weight_map[specs[i].name] = shard_name;
    }
    DSINFER_RETURN_IF_ERROR(writer.Begin(dir + "/" + shard_name));
    std::vector<uint8_t> pending_scale;
    for (size_t i : shards[si]) {
      const TensorSpec& s = specs[i];
      const bool engram_table =
          EndsWith(s.name, "engram.embed.weight") || EndsWith(s.name, "engram.embed.scale");
      if (engram_table && options.sparse_engram_tables) {
        DSINFER_RETURN_IF_ERROR(writer.WriteZeros(s.name));
        continue;
      }
      if (EndsWith(s.name, ".scale")) {
        DSINFER_RETURN_IF_ERROR(writer.Write(s.name, pending_scale));
        continue;
      }
      std::vector<uint8_t> bytes;
      DType dt = s.dtypes[0];
      bool has_scale = i + 1 < specs.size() && EndsWith(specs[i + 1].name, ".scale");
      if (engram_table) {
        EngramTable(s.name, s.shape[0], s.shape[1], options.seed, pool, &bytes, &pending_scale);
      } else if (dt == DType::kF8E4M3) {
        Fp8Matrix(s.name, s.shape[0], s.shape[1], config.weight_block, options.seed, pool, &bytes,
                  &pending_scale);
      } else if (dt == DType::kI8 && has_scale) {
        Fp4Matrix(s.name, s.shape[0], s.shape[1] * 2, options.seed, pool, &bytes, &pending_scale);
      } else {
        bytes = PlainTensor(s, config, options.seed, pool);
      }
      DSINFER_RETURN_IF_ERROR(writer.Write(s.name, bytes));
    }
    DSINFER_RETURN_IF_ERROR(writer.Finish());
  }

  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  DSINFER_RETURN_IF_ERROR(
      io::WriteTextFile(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  DSINFER_RETURN_IF_ERROR(io::WriteTextFile(dir + "/config.json", config.ToJson().dump(2) + "\n"));
  nlohmann::json gen = {{"bos_token_id", config.bos_token_id},
                        {"eos_token_id", config.eos_token_id},
                        {"do_sample", true},
                        {"temperature", 1.0},
                        {"top_p", 1.0}};
  DSINFER_RETURN_IF_ERROR(io::WriteTextFile(dir + "/generation_config.json", gen.dump(2) + "\n"));
  if (!options.tokenizer_json.empty())
    DSINFER_RETURN_IF_ERROR(io::WriteTextFile(dir + "/tokenizer.json", options.tokenizer_json));
  return Status::Ok();
}

}  // namespace dsinfer::model
