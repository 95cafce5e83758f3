// A checkpoint's identity for serialized sequence state: a blob written by one model (or
// numerics, or layout) must never be continued by another. SHA-256 over the validated config
// (its official JSON form) and, per tensor in name order, its name, dtype, shape and byte
// length plus a sample of its bytes (the first, middle and last 4 KiB): reading every byte of a
// 160 GB checkpoint would cost minutes at start-up, and two checkpoints of one shape that
// differ nowhere in those samples of any tensor are not a realistic accident.
#pragma once

#include "core/sha256.h"
#include "model/weights.h"

namespace dsinfer::model {

Sha256Digest ModelFingerprint(const ModelWeights& weights);

}  // namespace dsinfer::model
