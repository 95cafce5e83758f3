// The device-side pieces of CudaModel shared by its two source files (cuda_model.cc: upload,
// sequence state, the step; cuda_layers.cc: attention, compressor, MoE). Not a public header.
#pragma once

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_model.h"

namespace dsinfer::backend::cuda {

struct DeviceHc {
  DeviceBuffer fn, base, scale;  // f32 [(2+hc)*hc, hc*hidden], [(2+hc)*hc], [3]
};

struct DeviceCompressor {
  DeviceWeight wkv, wgate;  // [coff*d, hidden] bf16
  DeviceBuffer ape;         // [ratio, coff*d] f32
  DeviceBuffer norm;        // [d] f32
};

struct CudaModel::DeviceLayer {
  int ratio = 0;
  DeviceHc hc_attn, hc_ffn;
  DeviceBuffer attn_norm, ffn_norm, q_norm, kv_norm, attn_sink;  // f32
  DeviceWeight wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<DeviceWeight> wo_a_groups;  // [o_groups] row slices of wo_a
  std::vector<DeviceBuffer> wo_a_copies;  // their f32 copies when not views
  DeviceCompressor compressor;
  DeviceWeight index_wq_b, index_weights_proj;
  DeviceCompressor index_compressor;
  DeviceBuffer inv_freq;  // [rope_dim / 2] f32 (cpu::RopeTable)
  // MoE
  DeviceWeight gate;
  DeviceBuffer gate_bias;  // [E] f32 (biased routing) or empty
  DeviceBuffer tid2eid;    // [vocab, K] int32 (hash routing) or empty
  DeviceWeight shared_w1, shared_w3, shared_w2;
  DeviceExpertSet w1, w3, w2;
};

// Device scratch reused by every layer and step (all work is ordered on the device's one
// stream). Each slot grows on demand and never shrinks.
struct CudaModel::Workspace {
  enum Slot {
    kH,
    kHsel,
    kX,
    kY,
    kMix,
    kDots,
    kQr,
    kQ,
    kKv,
    kO,
    kZ,
    kOg,
    kZg,
    kA,
    kG,
    kAall,
    kGall,
    kIa,
    kIg,
    kQi,
    kWts,
    kScores,
    kProbs,
    kLogits,
    kRouterLogits,
    kXq,
    kExpertGate,
    kExpertUp,
    kExpertDown,
    kSharedGate,
    kSharedUp,
    kSharedOut,
    kQuant,
    kHead,
    kNSlots
  };
  std::vector<DeviceBuffer> buffers = std::vector<DeviceBuffer>(kNSlots);

  Result<float*> Get(CudaDevice& dev, Slot s, int64_t n) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * 4;
    if (buffers[s].bytes() < bytes) {
      buffers[s] = DeviceBuffer();
      DSINFER_ASSIGN_OR_RETURN(buffers[s], dev.Alloc(bytes));
    }
    return buffers[s].as<float>();
  }
};

}  // namespace dsinfer::backend::cuda
