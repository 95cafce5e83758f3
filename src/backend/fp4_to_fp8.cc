#include "backend/fp4_to_fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace dsinfer::backend {

namespace {

constexpr int64_t kBlock = 128;
constexpr int64_t kFp4Block = 32;

// Source scale of (r, c) as an exponent e (scale = 2^e), or an error for NaN / non-powers of 2.
Result<int> ScaleExponent(const model::WeightMatrix& w, int64_t r, int64_t c) {
  int64_t idx = r * w.scale_cols + c / kFp4Block;
  if (w.scale_dtype == DType::kF8E8M0) {
    uint8_t code = w.scales[idx];
    if (code == 0xff)
      return InvalidArgument(w.name + ": NaN e8m0 scale at row " + std::to_string(r));
    return static_cast<int>(code) - 127;
  }
  if (w.scale_dtype != DType::kF32) return InvalidArgument(w.name + ": unsupported scale dtype");
  float s;
  std::memcpy(&s, w.scales + idx * 4, 4);
  int e = 0;
  float m = std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
  if (!(s > 0) || !std::isfinite(s) || m != 0.5f)
    return InvalidArgument(w.name + ": scale is not a positive power of two at row " +
                           std::to_string(r));
  return e - 1;
}

}  // namespace

model::WeightMatrix Fp8BlockWeight::View(const std::string& name) const {
  model::WeightMatrix m;
  m.format = model::WeightFormat::kFp8Block;
  m.data = codes.data();
  m.scales = scales.data();
  m.scale_dtype = DType::kF8E8M0;
  m.rows = rows;
  m.cols = cols;
  m.scale_cols = scale_cols;
  m.block = static_cast<int>(kBlock);
  m.name = name;
  return m;
}

Result<Fp8BlockWeight> ReblockFp4ToFp8(const model::WeightMatrix& w) {
  if (w.format != model::WeightFormat::kFp4Packed || w.cols % kFp4Block != 0)
    return InvalidArgument(w.name + ": FP4 -> FP8 re-blocking needs a packed FP4 matrix");
  Fp8BlockWeight out;
  out.rows = w.rows;
  out.cols = w.cols;
  out.scale_cols = (w.cols + kBlock - 1) / kBlock;
  const int64_t scale_rows = (w.rows + kBlock - 1) / kBlock;
  out.codes.resize(static_cast<size_t>(w.rows * w.cols));
  out.scales.resize(static_cast<size_t>(scale_rows * out.scale_cols));
  std::vector<int> exps(static_cast<size_t>(w.rows * (w.cols / kFp4Block)));  // [rows, cols/32]
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t kb = 0; kb < w.cols / kFp4Block; ++kb) {
      DSINFER_ASSIGN_OR_RETURN(int e, ScaleExponent(w, r, kb * kFp4Block));
      exps[r * (w.cols / kFp4Block) + kb] = e;
    }
  }
  for (int64_t br = 0; br < scale_rows; ++br) {
    const int64_t r0 = br * kBlock, r1 = std::min(w.rows, r0 + kBlock);
    for (int64_t bc = 0; bc < out.scale_cols; ++bc) {
      const int64_t c0 = bc * kBlock, c1 = std::min(w.cols, c0 + kBlock);
      int emax = -127;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; c += kFp4Block)
          emax = std::max(emax, exps[r * (w.cols / kFp4Block) + c / kFp4Block]);
      // e8m0 codes start at 2^-127; a block whose largest scale is below 2^-121 keeps 2^-127.
      const int eblock = std::max(emax - 6, -127);
      out.scales[br * out.scale_cols + bc] = static_cast<uint8_t>(eblock + 127);
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* packed = w.data + r * (w.cols / 2);
        for (int64_t c = c0; c < c1; ++c) {
          uint8_t byte = packed[c / 2];
          float v = E2M1ToF32((c & 1) ? (byte >> 4) : (byte & 0xf));
          int shift = exps[r * (w.cols / kFp4Block) + c / kFp4Block] - eblock;  // <= 6
          float target = std::ldexp(v, shift);                                  // exact in fp32
          // -0 (e2m1 code 8) becomes +0: the CPU's FP4 decoder yields +0 for it as well.
          uint8_t code = target == 0.0f ? uint8_t{0} : F32ToE4M3(target);
          if (E4M3ToF32(code) != target) ++out.inexact;
          out.codes[r * w.cols + c] = code;
        }
      }
    }
  }
  return out;
}

}  // namespace dsinfer::backend
