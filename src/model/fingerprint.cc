#include "model/fingerprint.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace dsinfer::model {

Sha256Digest ModelFingerprint(const ModelWeights& weights) {
  Sha256 h;
  h.Update(weights.config().ToJson().dump());
  constexpr size_t kSample = 4096;
  for (const std::string& name : weights.checkpoint().TensorNames()) {
    const io::TensorRef ref = weights.checkpoint().Find(name);
    if (ref.info == nullptr) continue;
    h.Update(name);
    h.Update(SafetensorsName(ref.info->dtype));
    for (int64_t d : ref.info->shape)
      h.Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&d), sizeof(d)));
    const std::span<const uint8_t> b = ref.bytes;
    const uint64_t n = b.size();
    h.Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&n), sizeof(n)));
    const size_t k = std::min(kSample, b.size());
    h.Update(b.first(k));
    h.Update(b.subspan(b.size() / 2 - std::min(b.size() / 2, kSample / 2), k));
    h.Update(b.last(k));
  }
  return h.Finish();
}

}  // namespace dsinfer::model
