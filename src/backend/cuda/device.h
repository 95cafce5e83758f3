// CUDA device ownership for the CUDA backend. A CudaDevice owns one GPU's stream and hands out
// RAII device buffers; every piece of device state belongs to such an object (no file-level
// globals), so several GPUs are several CudaDevice objects. Thread-compatible: one owner thread
// per CudaDevice (the engine's), like the CPU backend's state.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsinfer::backend::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  int memory_clock_khz = 0;  // memory clock attribute (0 when the driver does not report it)
  int memory_bus_bits = 0;   // global memory bus width
  int core_clock_khz = 0;    // SM clock attribute
  int l2_bytes = 0;
  int driver_version = 0;          // e.g. 13000 = 13.0 (cudaDriverGetVersion)
  int runtime_version = 0;         // the statically linked cudart's version
  bool has_kernel_image = false;   // this binary carries code that runs on this device
  std::string kernel_image_error;  // why not, when !has_kernel_image

  int Sm() const { return sm_major * 10 + sm_minor; }
  // Theoretical DRAM bandwidth: 2 transfers per clock x bus width (GB/s, 1e9 bytes).
  double PeakMemoryGbps() const;
  // fp32 FMA peak of the CUDA cores (TFLOP/s): the roof of the generic (non-tensor-core) path.
  double PeakFp32Tflops() const;
  // Dense tensor-core peak (TFLOP/s) with fp32 accumulation, fp16 or FP8 inputs, from the
  // per-SM per-clock rates of the data-center part of each architecture (NVIDIA data sheets);
  // GeForce cards run fp32-accumulating MMAs at half that. 0 when unknown (or no FP8 MMA).
  double PeakTensorTflops(bool fp8) const;
};

// "13.0" from 13000.
std::string CudaVersionString(int version);

// Every visible device. An error (FailedPrecondition) says why there is none: no driver, a
// driver older than the runtime, no device, or CUDA_VISIBLE_DEVICES hiding them.
Result<std::vector<DeviceInfo>> EnumerateDevices();

// Turns a cudaError_t into a Status naming what failed.
Status CudaStatus(cudaError_t err, const char* what);

// Device memory from the device's stream-ordered pool; returned to it on destruction, after
// the work already queued on the device's stream. Must not outlive its CudaDevice. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  friend class CudaDevice;
  void Release();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;  // the owning device's stream: frees are ordered on it
};

class CudaDevice {
 public:
  // Opens device `ordinal`: makes it current, creates a non-blocking stream.
  static Result<std::unique_ptr<CudaDevice>> Open(int ordinal);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const DeviceInfo& info() const { return info_; }
  cudaStream_t stream() const { return stream_; }
  // Makes this device current on the calling thread (cheap; every op calls it).
  Status Activate() const;

  Result<DeviceBuffer> Alloc(size_t bytes);
  // Uploads host data into a new buffer (synchronises: `host` may be freed on return).
  Result<DeviceBuffer> Upload(const void* host, size_t bytes);
  // Uploads host data into a new buffer without draining the stream: the bytes are copied into
  // pinned staging memory first and the copy is queued behind the work already on the stream.
  // For per-step index lists on the hot path. Staging is reused after the next Synchronize
  // (which every copy back to the host does); when it is full, this synchronises first.
  Result<DeviceBuffer> UploadStaged(const void* host, size_t bytes);
  Status CopyToDevice(void* dst, const void* host, size_t bytes);
  Status CopyToHost(void* host, const void* src, size_t bytes);
  Status Memset(void* dst, int byte, size_t bytes);
  Status Synchronize();
  // Status of the last kernel launch on this thread (launch configuration errors).
  Status CheckLaunch(const char* kernel);

 private:
  CudaDevice() = default;
  DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  // Pinned host staging for UploadStaged: bytes [0, staging_used_) may still be read by queued
  // copies until the stream is synchronised.
  uint8_t* staging_ = nullptr;
  size_t staging_bytes_ = 0, staging_used_ = 0;
};

}  // namespace dsinfer::backend::cuda
