#include "device_flag.h"

#ifdef DSINFER_HAVE_CUDA
#include "backend/cuda/cuda_runner.h"
#endif

namespace dsinfer::cli {

std::optional<int> ParseDevice(const std::string& s) {
  if (s == "cpu") return -1;
  if (s == "cuda") return 0;
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() < 9 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos)
    return std::stoi(s.substr(5));
  return std::nullopt;
}

Result<std::unique_ptr<backend::ModelRunner>> MakeRunner(int ordinal,
                                                         const model::ModelWeights& weights,
                                                         backend::Numerics numerics,
                                                         const CpuPlacement& cpu) {
  if (ordinal < 0) {
    backend::CpuRunnerOptions options;
    options.n_threads = cpu.n_threads;
    options.cpus = cpu.cpus;
    return backend::MakeCpuRunner(weights, numerics, options);
  }
#ifdef DSINFER_HAVE_CUDA
  return backend::cuda::MakeCudaRunner(ordinal, weights, numerics);
#else
  return FailedPrecondition(
      "--device cuda: this binary was built without the CUDA backend (DSINFER_CUDA=OFF)");
#endif
}

}  // namespace dsinfer::cli
