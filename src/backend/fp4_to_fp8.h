// Exact FP4 -> FP8 re-blocking of routed-expert weights at load (spec §11.1, the `convert.py
// --expert-dtype fp8` scheme). GPUs without FP4 tensor cores (Hopper, Ada) then run routed
// experts through the FP8 block-scaled path.
//
// Input: packed e2m1 pairs [rows, cols/2] with per-row, per-32-column power-of-two scales.
// Output: e4m3 codes [rows, cols] with one e8m0 scale per 128x128 block. Each block's scale is
// 2^(Emax - 6), where Emax is the largest source exponent in the block; every FP4 value v with
// source exponent e becomes the e4m3 value v * 2^(e - Emax + 6). |v| <= 6 and the offset is at
// most 2^6, so magnitudes stay <= 384 < 448; the conversion is exact whenever no source scale in
// a block is more than 2^14 below the block's largest (e4m3 subnormals end at 2^-9). Blocks
// that violate this are converted with RNE and counted in `inexact`, never silently.
// Pure host code: the oracle for the device conversion and usable by any backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/weights.h"

namespace dsinfer::backend {

struct Fp8BlockWeight {
  std::vector<uint8_t> codes;   // [rows, cols] e4m3
  std::vector<uint8_t> scales;  // [ceil(rows/128), ceil(cols/128)] e8m0
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t scale_cols = 0;  // ceil(cols / 128)
  int64_t inexact = 0;     // elements whose value changed (0 = bit-exact re-blocking)

  // A kFp8Block view of this buffer (valid while *this lives and is not moved).
  model::WeightMatrix View(const std::string& name) const;
};

// Fails (InvalidArgument) on a matrix that is not kFp4Packed, a NaN scale code or a scale that
// is not a power of two.
Result<Fp8BlockWeight> ReblockFp4ToFp8(const model::WeightMatrix& w);

}  // namespace dsinfer::backend
