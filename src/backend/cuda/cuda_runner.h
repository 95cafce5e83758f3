// The GPU forward as the engine's model runner (backend/model_runner.h): a CudaDevice and a
// CudaModel on it, sequence states in device memory, prefix-cache snapshots and n > 1 forks as
// device-to-device copies. The KV budget defaults to most of the device memory left after the
// weights.
#pragma once

#include <memory>

#include "backend/cuda/cuda_model.h"
#include "backend/model_runner.h"

namespace dsinfer::backend::cuda {

// Opens device `ordinal` and uploads the weights (FP8 GEMM path: the device's default).
Result<std::unique_ptr<ModelRunner>> MakeCudaRunner(int ordinal, const model::ModelWeights& weights,
                                                    Numerics numerics);

}  // namespace dsinfer::backend::cuda
