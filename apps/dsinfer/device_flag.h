// The --device flag of the engine-backed subcommands (serve) and of logits: "cpu", "cuda" (device
// 0) or "cuda:N", and the model runner it selects.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/model_runner.h"
#include "backend/numerics.h"
#include "core/cpu_topology.h"
#include "core/status.h"
#include "model/weights.h"

namespace dsinfer::cli {

// -1 for "cpu", the device ordinal for "cuda" / "cuda:N"; nullopt for anything else.
std::optional<int> ParseDevice(const std::string& s);

// The CPU runner with `cpu`'s threads and pins (CpuPlacementOrPrint) for ordinal -1, else the
// GPU runner on that device; FailedPrecondition when this binary has no CUDA backend.
Result<std::unique_ptr<backend::ModelRunner>> MakeRunner(int ordinal,
                                                         const model::ModelWeights& weights,
                                                         backend::Numerics numerics,
                                                         const CpuPlacement& cpu);

}  // namespace dsinfer::cli
