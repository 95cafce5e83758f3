#include "backend/cuda/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/kernels.h"

namespace dsinfer::backend::cuda {

namespace {

// A trivial kernel's attributes tell whether this binary has code for the current device.
Status ProbeKernelImage() {
  return CudaStatus(ProbeKernelImageOnCurrentDevice(), "loading this binary's device code");
}

}  // namespace

double DeviceInfo::PeakMemoryGbps() const {
  return 2.0 * memory_clock_khz * 1e3 * (memory_bus_bits / 8.0) / 1e9;
}

double DeviceInfo::PeakFp32Tflops() const {
  // fp32 lanes per SM: 64 on sm_80 (A100); 128 on sm_86/89/90/100/120.
  int lanes = (sm_major == 8 && sm_minor == 0) ? 64 : 128;
  return 2.0 * lanes * sm_count * core_clock_khz * 1e3 / 1e12;
}

double DeviceInfo::PeakTensorTflops(bool fp8) const {
  // Dense fp16 FLOP per clock per SM with fp32 accumulation: A100 312 TF / (108 SMs x 1.41 GHz);
  // A40 / A10 (GA10x) 1024; L40S 181 TF / (142 x 2.52 GHz) = 512; H100 SXM 989 TF / (132 x
  // 1.83 GHz) = 4096; B200 2.25 PF / (148 x 1.97 GHz) ~ 8192; RTX PRO 6000 (GB202) 1024. FP8
  // doubles the rate where the hardware has it (sm_89+).
  int per_clock = 0;
  const int sm = Sm();
  if (sm == 80)
    per_clock = 2048;
  else if (sm_major == 8)
    per_clock = sm == 89 ? 512 : 1024;
  else if (sm_major == 9)
    per_clock = 4096;
  else if (sm_major == 10)
    per_clock = 8192;
  else if (sm_major == 12)
    per_clock = 1024;
  if (fp8) per_clock = sm >= 89 ? 2 * per_clock : 0;
  return static_cast<double>(per_clock) * sm_count * core_clock_khz * 1e3 / 1e12;
}

std::string CudaVersionString(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")");
}

Result<std::vector<DeviceInfo>> EnumerateDevices() {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::string why;
    if (driver == 0) {
      why = "no NVIDIA driver is loaded (libcuda not found)";
    } else if (err == cudaErrorInsufficientDriver) {
      why = "the driver (CUDA " + CudaVersionString(driver) + ") is older than the runtime (CUDA " +
            CudaVersionString(runtime) + ")";
    } else if (err != cudaSuccess) {
      why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    } else {
      why = "the driver reports no CUDA device";
    }
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible != nullptr) why += std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")";
    cudaGetLastError();  // clear the sticky error of the failed query
    return FailedPrecondition(why);
  }
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    DeviceInfo d;
    d.ordinal = i;
    d.driver_version = driver;
    d.runtime_version = runtime;
    cudaDeviceProp prop{};
    DSINFER_RETURN_IF_ERROR(
        CudaStatus(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties"));
    d.name = prop.name;
    d.sm_major = prop.major;
    d.sm_minor = prop.minor;
    d.sm_count = prop.multiProcessorCount;
    d.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    d.l2_bytes = prop.l2CacheSize;
    cudaDeviceGetAttribute(&d.memory_clock_khz, cudaDevAttrMemoryClockRate, i);
    cudaDeviceGetAttribute(&d.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, i);
    cudaDeviceGetAttribute(&d.core_clock_khz, cudaDevAttrClockRate, i);
    DSINFER_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(i), "cudaSetDevice"));
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      d.free_bytes = static_cast<int64_t>(free_b);
    Status image = ProbeKernelImage();
    d.has_kernel_image = image.ok();
    if (!image.ok()) d.kernel_image_error = image.message();
    cudaGetLastError();
    out.push_back(std::move(d));
  }
  return out;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(std::exchange(other.stream_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

void DeviceBuffer::Release() {
  // Stream-ordered: the memory returns to the device's pool after the work already queued on the
  // owning stream, so freeing never waits for the device and reuse never races that work.
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  ptr_ = nullptr;
  bytes_ = 0;
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::Open(int ordinal) {
  DSINFER_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, EnumerateDevices());
  if (ordinal < 0 || ordinal >= static_cast<int>(devices.size()))
    return InvalidArgument("no CUDA device " + std::to_string(ordinal) + " (" +
                           std::to_string(devices.size()) + " visible)");
  std::unique_ptr<CudaDevice> dev(new CudaDevice());
  dev->info_ = devices[ordinal];
  if (!dev->info_.has_kernel_image)
    return FailedPrecondition("device " + std::to_string(ordinal) + " (" + dev->info_.name +
                              ", sm_" + std::to_string(dev->info_.Sm()) +
                              "): this binary has no code for it; rebuild with "
                              "-DCMAKE_CUDA_ARCHITECTURES=" +
                              std::to_string(dev->info_.Sm()) + " (" +
                              dev->info_.kernel_image_error + ")");
  DSINFER_RETURN_IF_ERROR(dev->Activate());
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&dev->stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  // Buffers come from the device's stream-ordered pool (cudaMallocAsync), which keeps freed
  // memory for reuse instead of returning it at every synchronisation: a decode step allocates
  // and frees small index buffers per layer, and cudaMalloc / cudaFree (which synchronises) each
  // time cost more than the step's kernels (docs/PERF.md, GPU section).
  cudaMemPool_t pool = nullptr;
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetDefaultMemPool(&pool, ordinal), "cudaDeviceGetDefaultMemPool"));
  uint64_t keep_all = UINT64_MAX;
  DSINFER_RETURN_IF_ERROR(
      CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
                 "cudaMemPoolSetAttribute"));
  return dev;
}

CudaDevice::~CudaDevice() {
  if (stream_ != nullptr) {
    cudaSetDevice(info_.ordinal);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (staging_ != nullptr) cudaFreeHost(staging_);
}

Status CudaDevice::Activate() const {
  return CudaStatus(cudaSetDevice(info_.ordinal), "cudaSetDevice");
}

Result<DeviceBuffer> CudaDevice::Alloc(size_t bytes) {
  DSINFER_RETURN_IF_ERROR(Activate());
  DeviceBuffer b;
  if (bytes == 0) return b;
  cudaError_t err = cudaMallocAsync(&b.ptr_, bytes, stream_);
  if (err != cudaSuccess) {
    cudaGetLastError();
    b.ptr_ = nullptr;
    return ResourceExhausted("cudaMallocAsync of " + std::to_string(bytes) + " bytes on device " +
                             std::to_string(info_.ordinal) + ": " + cudaGetErrorString(err));
  }
  b.bytes_ = bytes;
  b.stream_ = stream_;
  return b;
}

Result<DeviceBuffer> CudaDevice::Upload(const void* host, size_t bytes) {
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer b, Alloc(bytes));
  DSINFER_RETURN_IF_ERROR(CopyToDevice(b.data(), host, bytes));
  return b;
}

Result<DeviceBuffer> CudaDevice::UploadStaged(const void* host, size_t bytes) {
  DSINFER_ASSIGN_OR_RETURN(DeviceBuffer b, Alloc(bytes));
  if (bytes == 0) return b;
  const size_t need = (bytes + 255) & ~size_t{255};
  if (staging_used_ + need > staging_bytes_) {
    // Queued copies may still read the staging: drain them, then reuse (or grow) it.
    DSINFER_RETURN_IF_ERROR(Synchronize());
    if (need > staging_bytes_) {
      if (staging_ != nullptr) cudaFreeHost(staging_);
      staging_ = nullptr;
      staging_bytes_ = 0;
      const size_t grow = std::max(need, size_t{4} << 20);
      void* p = nullptr;
      DSINFER_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&p, grow), "cudaMallocHost staging"));
      staging_ = static_cast<uint8_t*>(p);
      staging_bytes_ = grow;
    }
  }
  uint8_t* slot = staging_ + staging_used_;
  std::memcpy(slot, host, bytes);
  staging_used_ += need;
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(b.data(), slot, bytes, cudaMemcpyHostToDevice, stream_), "staged H2D"));
  return b;
}

Status CudaDevice::CopyToDevice(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  DSINFER_RETURN_IF_ERROR(Activate());
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpy H2D"));
  // Pageable host memory: the copy may still read `host` after returning; synchronise so the
  // caller may free it (uploads happen at load, not on the hot path).
  return Synchronize();
}

Status CudaDevice::CopyToHost(void* host, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  DSINFER_RETURN_IF_ERROR(Activate());
  DSINFER_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpy D2H"));
  return Synchronize();
}

Status CudaDevice::Memset(void* dst, int byte, size_t bytes) {
  DSINFER_RETURN_IF_ERROR(Activate());
  return CudaStatus(cudaMemsetAsync(dst, byte, bytes, stream_), "cudaMemset");
}

Status CudaDevice::Synchronize() {
  DSINFER_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  staging_used_ = 0;  // every staged copy has completed
  return Status::Ok();
}

Status CudaDevice::CheckLaunch(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

}  // namespace dsinfer::backend::cuda
