#include "model/layer_plan.h"

namespace dsinfer::model {

std::vector<LayerPlan> PlanLayers(const ModelConfig& c) {
  std::vector<LayerPlan> plans;
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
    p.compressor_width = p.owns_compressor ? (p.compressor_overlap ? 2 : 1) * c.head_dim : 0;
    p.kv_source = p.owns_compressor ? li : -1;
    p.runs_indexer = p.attention == AttentionKind::kCompressedSparse;
    p.index_ratio = p.runs_indexer ? p.compress_ratio : 0;
    p.index_compressor_width = p.runs_indexer ? 2 * c.index_head_dim : 0;
    p.q_head_rms_norm = true;
    p.rope_yarn = p.compress_ratio > 0;
    p.hash_routed = c.HashRouted(li);
    plans.push_back(p);
  }
  return plans;
}

}  // namespace dsinfer::model
