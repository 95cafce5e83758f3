// The device-side pieces of CudaModel shared by its two source files (cuda_model.cc: upload,
// sequence state, the step; cuda_layers.cc: attention, compressor, MoE). Not a public header.
#pragma once

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/routing.h"

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
  // MTP layers only
  DeviceWeight e_proj, h_proj;
  DeviceBuffer enorm, hnorm, norm;  // f32 [hidden]
  DeviceHc hc_head;                 // f32 [hc, hc*hidden], [hc], [1]
};

// The last Route's choices and the index lists the expert kernels read, built from them on the
// host and uploaded once (Experts).
struct CudaModel::Routing {
  int layer = -1;
  std::vector<int32_t> sel;  // [chosen [T, K] | weight bits [T, K]]
  RoutedGroups groups;
  DeviceBuffer lists;  // int32 words: token rows, row weights, row tokens, identity, tiles
  int64_t n_tiles = 0;
};

// Device scratch reused by every layer and step (all work is ordered on the device's one
// stream): one growing buffer per program buffer (v4_ops.h Buf), then the ops' own scratch.
// Each slot grows on demand and never shrinks.
struct CudaModel::Workspace {
  enum Slot {
    kDots = static_cast<int>(Buf::kCount),
    kAall,
    kGall,
    kScores,
    kProbs,
    kRouterLogits,
    kXq,
    kExpertGate,
    kExpertUp,
    kExpertDown,
    kSharedGate,
    kSharedUp,
    kSharedOut,
    kQuant,
    kOg,
    kZg,
    kNSlots
  };
  std::vector<DeviceBuffer> buffers = std::vector<DeviceBuffer>(kNSlots);

  Result<float*> Get(CudaDevice& dev, int s, int64_t n) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * 4;
    if (buffers[s].bytes() < bytes) {
      buffers[s] = DeviceBuffer();
      DSINFER_ASSIGN_OR_RETURN(buffers[s], dev.Alloc(bytes));
    }
    return buffers[s].as<float>();
  }
};

}  // namespace dsinfer::backend::cuda
