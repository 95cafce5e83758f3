#include "backend/random_weights.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/dtype.h"

namespace dsinfer::backend {

std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

HostWeight RandomWeight(std::mt19937& rng, model::WeightFormat format, int64_t rows, int64_t cols,
                        const RandomWeightOptions& options) {
  const bool f32_scales = options.f32_scales;
  HostWeight h;
  model::WeightMatrix& v = h.view;
  v.format = format;
  v.rows = rows;
  v.cols = cols;
  v.name = options.name;
  std::uniform_int_distribution<int> byte(0, 255),
      scale_code(options.scale_code_lo, options.scale_code_hi);
  int64_t scale_rows = 0;
  switch (format) {
    case model::WeightFormat::kF32: {
      std::vector<float> f = RandomFloats(rng, rows * cols, 0.05f);
      h.data.resize(f.size() * 4);
      std::memcpy(h.data.data(), f.data(), h.data.size());
      break;
    }
    case model::WeightFormat::kBF16: {
      std::vector<float> f = RandomFloats(rng, rows * cols, 0.05f);
      h.data.resize(f.size() * 2);
      for (size_t i = 0; i < f.size(); ++i) {
        uint16_t b = F32ToBf16(f[i]);
        std::memcpy(h.data.data() + 2 * i, &b, 2);
      }
      break;
    }
    case model::WeightFormat::kFp8Block:
      h.data.resize(static_cast<size_t>(rows * cols));
      if (options.fp8_trained_distribution) {
        std::normal_distribution<float> value(0.0f, 448.0f / 4.5f);
        for (auto& b : h.data) b = F32ToE4M3(std::clamp(value(rng), -448.0f, 448.0f));
      } else {
        for (auto& b : h.data) {
          b = static_cast<uint8_t>(byte(rng));
          if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
        }
      }
      v.block = options.fp8_block;
      v.block_shift = std::countr_zero(static_cast<unsigned>(options.fp8_block));
      v.scale_cols = (cols + options.fp8_block - 1) / options.fp8_block;
      scale_rows = (rows + options.fp8_block - 1) / options.fp8_block;
      break;
    case model::WeightFormat::kFp4Packed:
      h.data.resize(static_cast<size_t>(rows * cols / 2));
      for (auto& b : h.data) b = static_cast<uint8_t>(byte(rng));
      v.block = 32;
      v.scale_cols = cols / 32;
      scale_rows = rows;
      break;
  }
  if (scale_rows > 0) {
    const int64_t n = scale_rows * v.scale_cols;
    v.scale_dtype = f32_scales ? DType::kF32 : DType::kF8E8M0;
    h.scales.resize(static_cast<size_t>(n * (f32_scales ? 4 : 1)));
    for (int64_t i = 0; i < n; ++i) {
      uint8_t code = static_cast<uint8_t>(scale_code(rng));
      if (f32_scales) {
        float s = E8M0ToF32(code);
        std::memcpy(h.scales.data() + 4 * i, &s, 4);
      } else {
        h.scales[i] = code;
      }
    }
  }
  v.data = h.data.data();
  v.scales = h.scales.empty() ? nullptr : h.scales.data();
  return h;
}

}  // namespace dsinfer::backend
