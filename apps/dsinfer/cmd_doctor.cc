// dsinfer doctor [--json]: what this machine can run. CPU model and features, memory bandwidth,
// the binary's CUDA build, each GPU with the kernel paths that apply, the GPU conformance checks
// and probes, and a verdict per device. Without a GPU it says why none was found (exit 0).
#include <cpuid.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "args.h"
#include "commands.h"
#include "core/membw.h"
#include "core/thread_pool.h"

#ifdef DSINFER_HAVE_CUDA
#include "backend/cuda/conformance.h"
#include "backend/cuda/device.h"
#include "backend/cuda/paths.h"
#include "backend/cuda/probe.h"
#endif

namespace dsinfer::cli {

namespace {

using nlohmann::json;

json CpuReport() {
  json cpu;
  unsigned a = 0, b = 0, c = 0, d = 0;
  char brand[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    if (__get_cpuid(0x80000002 + i, &a, &b, &c, &d)) {
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
  }
  cpu["model"] = std::string(brand);
  json f;
  unsigned c1 = 0, d1 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0;
  if (__get_cpuid(1, &a, &b, &c1, &d1)) {
    f["fma"] = (c1 >> 12) & 1;
    f["f16c"] = (c1 >> 29) & 1;
  }
  if (__get_cpuid_count(7, 0, &a, &b7, &c7, &d7)) {
    f["avx2"] = (b7 >> 5) & 1;
    f["avx512f"] = (b7 >> 16) & 1;
    f["avx512bw"] = (b7 >> 30) & 1;
    f["avx512vl"] = (b7 >> 31) & 1;
    f["avx512_vnni"] = (c7 >> 11) & 1;
  }
  if (__get_cpuid_count(7, 1, &a71, &b, &c, &d)) {
    f["avx_vnni"] = (a71 >> 4) & 1;
    f["avx512_bf16"] = (a71 >> 5) & 1;
  }
  for (auto& [k, v] : f.items()) v = v.get<unsigned>() != 0;
  cpu["features"] = f;
  cpu["threads"] = std::thread::hardware_concurrency();
  cpu["ram_bytes"] =
      static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  ThreadPool pool(0);
  BandwidthResult bw = MeasureMemoryBandwidth(pool, int64_t{256} << 20, 3);
  cpu["memory_read_gbps"] = bw.read_gbps;
  cpu["verdict"] = "supported (the CPU backend is the reference implementation)";
  return cpu;
}

json GpuReport() {
  json gpu;
#ifndef DSINFER_HAVE_CUDA
  gpu["built_with_cuda"] = false;
  gpu["devices"] = json::array();
  gpu["no_gpu_reason"] = "this binary was built without the CUDA backend (DSINFER_CUDA=OFF)";
#else
  namespace cu = backend::cuda;
  gpu["built_with_cuda"] = true;
  gpu["compiled_archs"] = cu::CompiledArchs();
  gpu["devices"] = json::array();
  auto devices = cu::EnumerateDevices();
  if (!devices.ok()) {
    gpu["no_gpu_reason"] = "no GPU found: " + devices.status().message();
    return gpu;
  }
  for (const cu::DeviceInfo& info : *devices) {
    json d;
    d["ordinal"] = info.ordinal;
    d["name"] = info.name;
    d["sm"] = std::to_string(info.sm_major) + "." + std::to_string(info.sm_minor);
    d["memory_bytes"] = info.total_bytes;
    d["driver"] = cu::CudaVersionString(info.driver_version);
    d["runtime"] = cu::CudaVersionString(info.runtime_version);
    d["peak_memory_gbps"] = info.PeakMemoryGbps();
    cu::KernelPaths p = cu::PathsFor(info.sm_major, info.sm_minor);
    d["paths"] = {{"fp8_tensor_cores", p.fp8_tensor_cores},
                  {"fp4_tensor_cores", p.fp4_tensor_cores},
                  {"fp8_gemm", p.fp8_gemm},
                  {"fp4_experts", p.fp4_experts},
                  {"other_ops", p.other_ops},
                  {"not_yet_used", p.not_yet_used}};
    std::string verdict, why;
    auto dev = cu::CudaDevice::Open(info.ordinal);
    if (!p.supported_arch || !dev.ok()) {
      verdict = "unsupported";
      why = !p.supported_arch ? p.fp8_gemm : dev.status().message();
    } else {
      int failed = 0, total = 0;
      json checks = json::array();
      for (const cu::CheckResult& r : cu::RunConformance(**dev)) {
        ++total;
        if (!r.ok) {
          ++failed;
          checks.push_back({{"op", r.op}, {"shape", r.shape}, {"detail", r.detail}});
        }
      }
      d["conformance"] = {{"checks", total}, {"failed", failed}, {"failures", checks}};
      auto probe = cu::RunProbes(**dev);
      if (probe.ok()) {
        d["probe"] = {{"read_gbps", probe->read_gbps},
                      {"copy_gbps", probe->copy_gbps},
                      {"bandwidth_share", probe->read_gbps / std::max(1.0, probe->peak_gbps)},
                      {"gemm_tflops", probe->gemm_tflops},
                      {"gemm_shape", probe->gemm_shape},
                      {"peak_fp32_tflops", probe->peak_fp32_tflops}};
      }
      if (failed > 0) {
        verdict = "unsupported";
        why =
            std::to_string(failed) + " of " + std::to_string(total) + " conformance checks failed";
      } else if (!p.not_yet_used.empty()) {
        verdict = "degraded";
        why = "correct on the generic kernels; not yet using:";
        for (const auto& s : p.not_yet_used) why += " " + s + ";";
      } else {
        verdict = "supported";
      }
    }
    d["verdict"] = verdict;
    d["why"] = why;
    gpu["devices"].push_back(d);
  }
#endif
  return gpu;
}

}  // namespace

int RunDoctor(int argc, char** argv) {
  Args args;
  if (!args.Parse(argc, argv, {}, {"json"})) {
    std::fprintf(stderr, "doctor: %s\nusage: dsinfer doctor [--json]\n", args.error().c_str());
    return 2;
  }
  json report;
  report["cpu"] = CpuReport();
  report["gpu"] = GpuReport();
  if (args.Has("json")) {
    std::printf("%s\n", report.dump(2).c_str());
    return 0;
  }
  const json& cpu = report["cpu"];
  std::printf(
      "CPU: %s, %u threads, %.1f GB/s read\n  features:", cpu["model"].get<std::string>().c_str(),
      cpu["threads"].get<unsigned>(), cpu["memory_read_gbps"].get<double>());
  for (auto& [k, v] : cpu["features"].items())
    if (v.get<bool>()) std::printf(" %s", k.c_str());
  std::printf("\n  verdict: %s\n", cpu["verdict"].get<std::string>().c_str());
  const json& gpu = report["gpu"];
  if (gpu.contains("no_gpu_reason"))
    std::printf("GPU: %s\n", gpu["no_gpu_reason"].get<std::string>().c_str());
  for (const json& d : gpu["devices"])
    std::printf("GPU %d: %s (sm_%s): %s %s\n", d["ordinal"].get<int>(),
                d["name"].get<std::string>().c_str(), d["sm"].get<std::string>().c_str(),
                d["verdict"].get<std::string>().c_str(), d["why"].get<std::string>().c_str());
  return 0;
}

}  // namespace dsinfer::cli
