#include "model/layer_plan.h"

namespace dsinfer::model {

namespace {

LayerPlan PlanV41(const ModelConfig& c, int li) {
  LayerPlan p;
  p.layer = li;
  p.attention = c.Attention(li);
  p.compress_ratio = c.CompressRatio(li);
  p.q_head_rms_norm = false;
  p.rope_yarn = p.compress_ratio > 0;
  p.window_quant = WindowQuant::kFp8All32;
  p.softmax_max_over_rows = true;
  p.compressed_quant = CompressedQuant::kFp4E4m3x16;
  p.single_pass_hc = true;
  // dSpark stages (spec §14.6) are window-only blocks on the MTP stream: their ring holds the
  // stage's KV of the projected target hidden states, one row per backbone position.
  p.mtp = li >= c.n_layers;
  p.draft_block = p.mtp;
  p.engram = p.mtp ? -1 : c.engram.IndexOf(li);
  p.index_hadamard = false;
  p.index_score_round_terms = true;
  if (p.compress_ratio == 0) return p;
  // CSA2 roles (spec §14.3): kv sources own the compressor whose rows every later layer of the
  // same ratio reads; index sources select, the other compressed layers reuse the selection.
  p.kv_source = c.KvSourceOf(li);
  p.owns_compressor = c.IsKvSource(li);
  if (p.owns_compressor) {
    p.compressor_gated = p.compress_ratio > 1;
    p.compressor_width = c.head_dim;
    p.stores_index_keys = c.IsIndexSource(li);
  }
  p.runs_indexer = c.IsIndexSource(li);
  p.reuses_selection = !p.runs_indexer;
  if (p.runs_indexer) {
    p.index_ratio = p.compress_ratio;
    p.index_key_layer = p.kv_source;
    p.candidate_source = li == c.candidate_source_layer;
    p.candidate_masked = c.candidate_source_layer >= 0 && li > c.candidate_source_layer;
  }
  return p;
}

}  // namespace

std::vector<LayerPlan> PlanLayers(const ModelConfig& c) {
  std::vector<LayerPlan> plans;
  if (c.V41()) {
    const int n = c.dspark.block_size > 0 ? c.n_layers + c.n_mtp_layers : c.n_layers;
    for (int li = 0; li < n; ++li) plans.push_back(PlanV41(c, li));
    return plans;
  }
  for (int li = 0; li < c.n_layers + c.n_mtp_layers; ++li) {
    LayerPlan p;
    p.layer = li;
    p.mtp = li >= c.n_layers;
    p.attention = c.Attention(li);
    p.compress_ratio = c.CompressRatio(li);
    // V4: every compressed layer owns its compressor and reads its own rows; CSA (ratio 4)
    // overlaps groups and runs the indexer, HCA (larger ratios) attends to every row.
    p.owns_compressor = p.compress_ratio > 0;
    p.compressor_overlap = p.attention == AttentionKind::kCompressedSparse;
    p.compressor_gated = p.owns_compressor;
    p.compressor_ape = p.owns_compressor;
    p.compressor_width = p.owns_compressor ? (p.compressor_overlap ? 2 : 1) * c.head_dim : 0;
    p.kv_source = p.owns_compressor ? li : -1;
    p.runs_indexer = p.attention == AttentionKind::kCompressedSparse;
    p.index_ratio = p.runs_indexer ? p.compress_ratio : 0;
    p.index_key_layer = p.runs_indexer ? li : -1;
    p.stores_index_keys = p.runs_indexer;
    p.index_compressor_width = p.runs_indexer ? 2 * c.index_head_dim : 0;
    p.q_head_rms_norm = true;
    p.rope_yarn = p.compress_ratio > 0;
    p.hash_routed = c.HashRouted(li);
    plans.push_back(p);
  }
  return plans;
}

}  // namespace dsinfer::model
