// Random weight matrices in the checkpoint's stored formats, with their storage: the inputs of
// the CPU self-check (`dsinfer doctor`), the CUDA conformance suite and the kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/weights.h"

namespace dsinfer::backend {

// n values drawn from normal(0, stddev).
std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float stddev);

// A weight matrix and the bytes its view points into (moving keeps the view valid).
struct HostWeight {
  std::vector<uint8_t> data, scales;
  model::WeightMatrix view;
};

struct RandomWeightOptions {
  bool f32_scales = false;  // store the (power-of-two) scales as f32 instead of e8m0
  int scale_code_lo = 120;  // e8m0 scale codes drawn uniformly from [lo, hi]: 2^-7 .. 2^3
  int scale_code_hi = 130;
  // FP8 codes: uniform over all non-NaN codes (every corner: subnormals, both zeros, the largest
  // magnitudes), or as a trained checkpoint stores them: normal values scaled so that 4.5 sigma
  // maps to the e4m3 maximum (448), so subnormal codes are as rare as they are in real weights.
  bool fp8_trained_distribution = false;
  std::string name = "random.w";
  int fp8_block = 128;  // FP8 scale block edge: 128 (V4) or 32 (V4.1)
};

// [rows, cols] in `format`: f32/bf16 values normal(0, 0.05); FP8 e4m3 codes (see
// fp8_trained_distribution) with fp8_block x fp8_block block scales; FP4 e2m1 codes
// uniform with 1x32 block scales (cols a multiple of 32).
HostWeight RandomWeight(std::mt19937& rng, model::WeightFormat format, int64_t rows, int64_t cols,
                        const RandomWeightOptions& options = {});

}  // namespace dsinfer::backend
