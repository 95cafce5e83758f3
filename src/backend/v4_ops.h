// The operations of the DeepSeek-V4-family forward pass, shaped like the spec's steps (spec §3-§8),
// that the layer program (v4_forward.h) calls and every backend implements once: the CPU
// (backend/cpu/cpu_ops.h) and CUDA (backend/cuda/cuda_model.h). The program owns the order and
// the numerics' rounding points; an op owns its arithmetic, its memory (buffers live on the
// backend's device: the program only passes the pointers it got from Get) and the per-sequence
// state it touches.
//
// A step is bracketed by BeginStep (its sequences' rows and positions, its tokens); the ops that
// read or write sequence state act on those segments. Every buffer is row-major f32; shapes are
// in the comments as [rows, cols].
// Implementations are thread-compatible: one owner thread (the engine's).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/forward_types.h"
#include "core/status.h"

namespace dsinfer::backend {

// One sequence's rows in a step.
struct Segment {
  int64_t row = 0;        // first row in the step's flattened rows
  int64_t n = 0;          // its tokens in the step
  int64_t start_pos = 0;  // absolute position of its first token in the stream the step runs
                          // (the backbone's, or the MTP blocks' own)
  RunnerState* state = nullptr;
};

// Scratch buffers of a step; each backend keeps one growing buffer per slot. A slot holds one
// live value at a time (the program never asks for a slot whose value it still needs).
enum class Buf : uint8_t {
  kH,          // [T, hc, hidden] residual streams
  kX,          // [T, hidden] sub-layer input
  kY,          // [T, hidden] sub-layer output
  kMix,        // [T, MixFloats] mHC pre / post / comb
  kQr,         // [T, q_lora] query latent (also the indexer's input)
  kQ,          // [T, heads, head_dim]
  kKv,         // [T, head_dim] window KV rows of the step
  kO,          // [T, heads, head_dim] attention output
  kZ,          // [T, o_groups * o_lora]
  kA,          // [T, width] compressor projections
  kG,          // [T, width] compressor gate logits
  kRows,       // [rows, head_dim or index_head_dim] rows a compressor completed
  kQi,         // [T, index_heads, index_head_dim]
  kWts,        // [T, index_heads]
  kHeadIn,     // [rows, hc, hidden] streams of the rows that want logits
  kHeadY,      // [rows, hidden]
  kLogits,     // [rows, vocab]
  kMtpHidden,  // [T, hc, hidden] the main model's streams fed to MTP
  kMtpE,       // [T, hidden]
  // V4.1
  kMixFfn,      // [T, MixFloats] the FFN's mix: its pre is carried into the next layer (§14.4)
  kCarry,       // [T, hc] the pre carried into layer 0: one-hot [1, 0, ...]
  kLatent,      // [rows, head_dim] compressed rows before RoPE (the index keys' input)
  kIndexKeys,   // [rows, index_head_dim]
  kEngramRows,  // [T, rows_per_token * engram head_dim] the gathered table rows
  kEngramKv,    // [T, (hc + 1) * hidden] Engram keys (hc) and value
  kHeadPre,     // [rows, MixFloats] the carried mixes of the rows that want logits
  // V4.1 dSpark (spec §14.6)
  kTargetMean,   // [targets, T, hidden] the streams' mean entering each target layer
  kUniformPre,   // [T, hc] 1 / hc: the collapse that is that mean
  kDsparkIn,     // [T, targets * hidden] the main hidden states fed to the stages
  kMainX,        // [T, hidden] main_norm(main_proj(hidden))
  kMarkovEmbed,  // [rows, markov_rank]
  kMarkovBias,   // [rows, vocab]
  kConfidenceIn,  // [rows, hidden + markov_rank]
  kConfidence,    // [rows, 1]
  kCount
};

// A layer's weights an op reads (each backend maps them to its own copy).
enum class Weight : uint8_t {
  kWqA,
  kWqB,
  kWkv,
  kWoB,
  kCompressorWkv,
  kCompressorWgate,
  kIndexWqB,
  kIndexWeightsProj,
  kIndexCompressorWkv,
  kIndexCompressorWgate,
  kEProj,      // MTP
  kHProj,      // MTP
  kHead,       // the vocabulary projection (layer ignored)
  kIndexWk,    // V4.1 kv + index source: index keys from the compressed latent
  kEngramWkv,  // V4.1 Engram: keys and value from the table rows
  kMainProj,    // V4.1 dSpark stage 0: the target layers' hidden states to one row
  kMarkovHead,  // V4.1 dSpark last stage: [vocab, markov_rank], the Markov bias's projection
  kConfidence,  // V4.1 dSpark last stage: [1, hidden + markov_rank]
  // The rows of kHead / kMarkovHead at DraftVocabulary()'s ids [S, ...] (speculative drafting
  // with a draft vocabulary, model/draft_vocabulary.h).
  kDraftHead,
  kDraftMarkovHead,
};

// Norm weights (layer -1: the main head's final norm).
enum class Norm : uint8_t {
  kAttn,
  kFfn,
  kQ,
  kKv,
  kCompressor,
  kIndexCompressor,
  kE,
  kH,
  kFinal,
  kIndexKey,  // V4.1: k_norm of the index keys
  kMain,      // V4.1 dSpark stage 0: main_norm
};

enum class HcSite : uint8_t { kAttn, kFfn };
enum class Compressor : uint8_t { kKv, kIndex };

enum class LinearMode : uint8_t {
  kQuantized,  // the reference's FP8/FP4 linear: act quant (block act_block) in front of FP8 /
               // FP4 weights when the numerics quantize, fp32 accumulation, bf16 output when
               // the numerics round
  kFp32,       // fp32 input, fp32 accumulation, fp32 output (compressor, router gate, head)
};

// Which rows a RoPE over the step's positions rotates: one row per token, or per head of each
// token (the rows of [T, heads, dim]).
enum class RopeRows : uint8_t { kTokens, kHeads, kIndexHeads };

// Rows compressors completed in a step, sequence after sequence.
struct CompressedRows {
  int64_t n = 0;                     // rows in all
  std::vector<int64_t> per_segment;  // [segments] how many each sequence completed
  std::vector<int64_t> first_pos;    // [n] position of each row's first token (its RoPE)
};

// Per query row of the step: the compressed rows it attends to (ascending).
using Selection = std::vector<std::vector<int32_t>>;

// One lightning-indexer selection (spec §5.4, §14.3) for every query row of the step.
struct IndexerQuery {
  int layer = 0;               // the layer whose queries these are
  int key_layer = 0;           // the layer that stores the keys (V4: the same; V4.1: its kv source)
  int ratio = 0;               // the keys' compression ratio: row j is visible to query i iff
                               // j < (i + 1) / ratio
  const float* qi = nullptr;   // [T, index_heads, index_head_dim]
  const float* wts = nullptr;  // [T, index_heads]
  // V4.1 candidate pre-filter. candidate_blocks_out (the candidate source): receives per query
  // the candidate blocks (ascending): the newest block pinned, then the blocks with the highest
  // max score. candidate_blocks (later index sources): only rows of these blocks are chosen.
  int candidate_block_size = 0;
  int candidate_topk_blocks = 0;
  Selection* candidate_blocks_out = nullptr;
  const Selection* candidate_blocks = nullptr;
};

// Points the GPU backend times (phase timing for benchmarks); no-ops elsewhere.
enum class Phase : uint8_t { kStart, kAttentionDense, kAttentionPerSequence, kMoe, kHead };

class V4Ops {
 public:
  virtual ~V4Ops() = default;

  // The step's sequences and tokens (validated by the caller: non-empty, in the vocabulary,
  // positions consistent); T = tokens.size().
  virtual Status BeginStep(std::span<const Segment> segments, std::span<const int32_t> tokens) = 0;
  virtual Result<float*> Get(Buf buf, int64_t n_floats) = 0;

  // ---- dense, per row -------------------------------------------------------------------------
  // out [T, copies, hidden]: each step token's embedding row (bf16), copied `copies` times.
  virtual Status Embed(int copies, float* out) = 0;
  // mHC pre of `layer`'s site (spec §4.1): H [T, hc, hidden] -> x [T, hidden], mix [T, mix].
  virtual Status HcPre(int layer, HcSite site, const float* H, float* x, float* mix) = 0;
  // mHC post (spec §4.2): H[k] <- post_k y + sum_j comb[j][k] H[j], in place.
  virtual Status HcPost(const float* mix, const float* y, float* H) = 0;
  // mHC head (spec §4.3) of the main head (layer -1) or an MTP layer: H [rows, hc, hidden] ->
  // y [rows, hidden].
  virtual Status HcHead(int layer, const float* H, int64_t rows, float* y) = 0;
  // Single-pass mHC (spec §14.4): mix [T, mix] of `layer`'s site from H as HcPre, but the
  // input x [T, hidden] = sum_j carry[t][j] H[t][j] collapses H with the pre carried from the
  // previous sublayer (carry rows of carry_stride floats, the pre first).
  virtual Status HcPreCarried(int layer, HcSite site, const float* H, const float* carry,
                              int64_t carry_stride, float* x, float* mix) = 0;
  // y [rows, hidden] = sum_j pre[r][j] H[r][j] (the V4.1 head's input: no hc_head).
  virtual Status HcCollapse(const float* H, int64_t rows, const float* pre, int64_t pre_stride,
                            float* y) = 0;
  // RMSNorm of rows of `dim` with `layer`'s weight `norm` (layer -1: the main head's norm).
  virtual Status RmsNorm(int layer, Norm norm, float* x, int64_t rows, int64_t dim) = 0;
  // Unweighted RMS norm of each row (the per-head q norm of spec §5.1).
  virtual Status HeadRmsNorm(float* x, int64_t rows, int64_t dim) = 0;
  // The draft vocabulary (ascending token ids) whose rows kDraftHead / kDraftMarkovHead hold;
  // empty: drafts are computed over the whole vocabulary. Every backend says (pure virtual), so
  // a wrapper cannot silently hide it.
  virtual std::span<const int32_t> DraftVocabulary() const = 0;
  // y [rows, out] = x [rows, in] W^T for `layer`'s weight.
  virtual Status Linear(int layer, Weight weight, LinearMode mode, const float* x, int64_t rows,
                        float* y) = 0;
  // The grouped first output projection (spec §5.7): z [T, groups * o_lora], group g = wo_a's
  // rows of g times o's heads of g (bf16 weights, no activation quantization).
  virtual Status OutputProjectionA(int layer, const float* o, float* z) = 0;
  // RoPE (spec §9) with `layer`'s table on dims [offset, offset + rope_dim) of rows of width
  // `stride`, at the step's positions.
  virtual Status Rope(int layer, float* x, RopeRows rows, int64_t stride, int64_t offset,
                      bool inverse) = 0;
  // The same for rows at explicit positions (compressed rows: their group's first token).
  virtual Status RopeAt(int layer, float* x, std::span<const int64_t> positions, int64_t stride,
                        int64_t offset) = 0;
  // x = bf16(x * scale) (or x * scale without rounding when the numerics do not round).
  virtual Status ScaleRound(float* x, int64_t n, float scale) = 0;
  // The QAT round trips of spec §2.2 / §2.3 on dims [0, n) of rows of width `stride`.
  virtual Status Fp8RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) = 0;
  virtual Status Fp4RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) = 0;
  // V4.1's compressed KV round trip (spec §14.2): per block of `block` values, an e4m3 scale
  // s = e4m3(max(amax, 6 * 2^-9) / 6) and x <- e2m1(clamp(x / s, +-6)) * s.
  virtual Status Fp4E4m3RoundTrip(float* x, int64_t rows, int64_t n, int64_t stride, int block) = 0;
  // Hadamard-128 style transform of each row (spec §2.4), rounded when the numerics round.
  virtual Status Hadamard(float* x, int64_t rows, int64_t n) = 0;
  // X [T, hc, hidden] = round(X + e[t]) for every stream (the MTP block's input, spec §8).
  virtual Status AddToStreams(const float* e, float* X) = 0;

  // ---- sequence state --------------------------------------------------------------------------
  // Feeds the step's projections a, g [T, width] into each segment's compressor of `layer` and
  // pools every group that completes (spec §5.3): raw rows [n, d] into rows_out (which must hold
  // T / ratio + segments rows), before norm and RoPE. A compressor without a gate (g null, V4.1
  // ratio 1) completes one row per token: a itself.
  virtual Result<CompressedRows> CompressorPool(int layer, Compressor which, const float* a,
                                                const float* g, float* rows_out) = 0;
  // Appends finished rows [rows.n, d] (after norm, RoPE and the numerics' round trip) to each
  // segment's compressed rows or indexer keys of `layer`: visible to this step's queries after.
  virtual Status StoreCompressed(int layer, Compressor which, const CompressedRows& rows,
                                 const float* data) = 0;
  // The lightning indexer's selection (spec §5.4) over the keys of query.key_layer for each
  // query row of the step: every visible row when they are at most index_topk, else the top-k
  // of the scores (ties: the lower row), inside the candidate blocks when given (§14.3).
  virtual Result<Selection> IndexerSelect(const IndexerQuery& query) = 0;
  // Sparse attention with sink (spec §5.5-5.6): each query row of q [T, heads, head_dim] over its
  // window (the segment's ring before the step, then kv [T, head_dim]) and the compressed rows of
  // kv_layer: those in `selected`, or (selected null) all visible at `ratio`, or none (ratio 0).
  virtual Status SparseAttention(int layer, int kv_layer, int ratio, const float* q,
                                 const float* kv, const Selection* selected, float* o) = 0;
  // The step's window KV rows kv [T, head_dim] into each segment's ring of `layer`.
  virtual Status StoreWindow(int layer, const float* kv) = 0;

  // ---- dSpark (V4.1, spec §14.6) ---------------------------------------------------------------
  // A draft block's attention: each query row of q [T, heads, head_dim] attends (with the sink)
  // over its segment's whole ring of `layer` before the block (positions [start_pos - window,
  // start_pos)) and over every row of its own block in kv [T, head_dim]: no causal mask inside
  // the block, and nothing is stored.
  virtual Status DraftAttention(int layer, const float* q, const float* kv, float* o) = 0;
  // out [ids.size(), markov_rank]: the rows of `layer`'s Markov embedding (bf16 values).
  virtual Status MarkovEmbed(int layer, std::span<const int32_t> ids, float* out) = 0;

  // ---- Engram (V4.1, spec §14.5) ----------------------------------------------------------------
  // The step's n-gram table row ids for every Engram layer, from the tokens and each sequence's
  // previous token classes (which it then records for the next steps).
  virtual Status EngramBegin() = 0;
  // rows [T, rows_per_token * engram head_dim]: `layer`'s table rows of the step, dequantized
  // (e4m3 x e8m0 per 32: exact in bf16), read where the table lies.
  virtual Status EngramGather(int layer, float* rows) = 0;
  // The gated update of the streams H [T, hc, hidden] from kv [T, (hc + 1) * hidden] (hc keys,
  // then the value): H_j += sigmoid(signed sqrt of the normalised H_j . key_j) value.
  virtual Status EngramGate(int layer, const float* kv, float* H) = 0;

  // ---- MoE (spec §6) ---------------------------------------------------------------------------
  // The router: scores of x [T, hidden], experts by the token's tid2eid row (hash) or by top-k
  // of score + bias, weights normalised over the chosen; kept by the backend for Experts.
  virtual Status Route(int layer, bool hash, const float* x) = 0;
  // out [T, hidden]: the routed experts of the last Route plus the shared expert.
  virtual Status Experts(int layer, const float* x, float* out) = 0;

  // ---- transfers -------------------------------------------------------------------------------
  // dst [rows.size(), width] = src rows.
  virtual Status GatherRows(const float* src, std::span<const int64_t> rows, int64_t width,
                            float* dst) = 0;
  virtual Status Download(const float* src, int64_t n, float* host) = 0;
  virtual Status Upload(const float* host, int64_t n, float* dst) = 0;

  virtual Status Mark(Phase) { return Status::Ok(); }
};

}  // namespace dsinfer::backend
