#include "backend/cuda/ops.h"

namespace dsinfer::backend::cuda {

Result<DeviceWeight> UploadWeight(CudaDevice& dev, const model::WeightMatrix& w) {
  if (!w.valid()) return InvalidArgument("UploadWeight: empty weight " + w.name);
  DeviceWeight d;
  d.name = w.name;
  DeviceWeightView& v = d.view;
  v.rows = w.rows;
  v.cols = w.cols;
  v.scale_cols = w.scale_cols;
  v.scales_f32 = w.scale_dtype == DType::kF32;
  int64_t data_bytes = 0, scale_rows = 0;
  switch (w.format) {
    case model::WeightFormat::kF32:
      v.format = DeviceWeightView::Format::kF32;
      data_bytes = w.rows * w.cols * 4;
      break;
    case model::WeightFormat::kBF16:
      v.format = DeviceWeightView::Format::kBF16;
      data_bytes = w.rows * w.cols * 2;
      break;
    case model::WeightFormat::kFp8Block:
      v.format = DeviceWeightView::Format::kFp8Block;
      data_bytes = w.rows * w.cols;
      scale_rows = (w.rows + 127) / 128;
      break;
    case model::WeightFormat::kFp4Packed:
      if (w.cols % 32 != 0) return InvalidArgument(w.name + ": FP4 cols must be a multiple of 32");
      v.format = DeviceWeightView::Format::kFp4Packed;
      data_bytes = w.rows * w.cols / 2;
      scale_rows = w.rows;
      break;
  }
  DSINFER_ASSIGN_OR_RETURN(d.data, dev.Upload(w.data, static_cast<size_t>(data_bytes)));
  if (scale_rows > 0) {
    const int64_t scale_bytes = scale_rows * w.scale_cols * (v.scales_f32 ? 4 : 1);
    DSINFER_ASSIGN_OR_RETURN(d.scales, dev.Upload(w.scales, static_cast<size_t>(scale_bytes)));
  }
  v.data = d.data.as<const uint8_t>();
  v.scales = d.scales.as<const uint8_t>();
  return d;
}

Status MatMul(CudaDevice& dev, const DeviceWeight& w, const float* x, int64_t m, float* y) {
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchMatMul(w.view, x, m, y, dev.stream()), ("MatMul " + w.name).c_str());
}

Status RmsNormRows(CudaDevice& dev, float* x, int64_t rows, int64_t n, const float* weight,
                   double eps, bool round_bf16) {
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(
      LaunchRmsNorm(x, rows, n, weight, static_cast<float>(eps), round_bf16, dev.stream()),
      "RmsNorm");
}

Status ApplyRope(CudaDevice& dev, float* x, int64_t rows, int64_t row_stride, int64_t offset,
                 const int64_t* positions, const float* inv_freq, int half, bool inverse,
                 bool round_bf16) {
  if (offset + 2 * half > row_stride) return InvalidArgument("ApplyRope: rope dims past the row");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchRope(x, rows, row_stride, offset, positions, inv_freq, half, inverse,
                               round_bf16, dev.stream()),
                    "Rope");
}

Status HcPre(CudaDevice& dev, const HcShape& s, const float* fn, const float* base,
             const float* scale, const float* H, int64_t tokens, float* dots, float* x, float* mix,
             bool round_bf16) {
  if (s.hc < 1 || s.hc > 8) return InvalidArgument("HcPre: hc_mult must be 1..8");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(
      LaunchHcPre(s, fn, base, scale, H, tokens, dots, x, mix, round_bf16, dev.stream()), "HcPre");
}

Status HcPost(CudaDevice& dev, const HcShape& s, const float* mix, const float* a, float* H,
              int64_t tokens, bool round_bf16) {
  if (s.hc < 1 || s.hc > 8) return InvalidArgument("HcPost: hc_mult must be 1..8");
  DSINFER_RETURN_IF_ERROR(dev.Activate());
  return CudaStatus(LaunchHcPost(s, mix, a, H, tokens, round_bf16, dev.stream()), "HcPost");
}

}  // namespace dsinfer::backend::cuda
