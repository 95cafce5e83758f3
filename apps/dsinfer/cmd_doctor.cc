// dsinfer doctor [--json] [--time-budget S]: what this machine can run. CPU model and features,
// memory bandwidth, a self-check of the CPU backend's key ops against an fp64 reference and a
// GEMM probe against the CPU's stated peak; the binary's CUDA build, each GPU with the kernel
// paths that apply, the GPU conformance checks and probes, and a verdict per device. Work runs
// in stages, each timed; a stage that would start after the time budget is spent is skipped
// with the reason. Without a GPU it says why none was found (exit 0).
#include <cpuid.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "args.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/linear_amx.h"
#include "backend/cpu/peak.h"
#include "backend/cpu/selfcheck.h"
#include "commands.h"
#include "core/cpu_topology.h"
#include "core/membw.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "model/demo_model.h"
#include "model/weights.h"

#ifdef DSINFER_HAVE_CUDA
#include <cerrno>
#include <filesystem>

#include "backend/cuda/conformance.h"
#include "backend/cuda/device.h"
#include "backend/cuda/paths.h"
#include "backend/cuda/probe.h"
#endif

namespace dsinfer::cli {

namespace {

using nlohmann::json;

#ifdef DSINFER_HAVE_CUDA
// backend/cuda CheckForward on the tiny-a preset, written to a fresh temporary directory.
Result<backend::cuda::CheckResult> GpuForwardCheck(backend::cuda::CudaDevice& dev) {
  char tmpl[] = "/tmp/dsinfer-doctor-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return IoError(std::string("mkdtemp: ") + std::strerror(errno));
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  DSINFER_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetConfig("tiny-a"));
  ThreadPool pool(2);
  DSINFER_RETURN_IF_ERROR(model::WriteDemoModel(config, dir, model::DemoModelOptions{}, pool));
  DSINFER_ASSIGN_OR_RETURN(auto weights, model::ModelWeights::Load(dir));
  return backend::cuda::CheckForward(dev, *weights, 64, 11);
}
#endif

// Runs the doctor's stages under one wall-clock budget and records each stage's wall time, or
// why it was skipped, in stages() (the report's "stages" array).
class StageRunner {
 public:
  explicit StageRunner(double budget_s) : budget_s_(budget_s), start_(Clock::now()) {}
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double Remaining() const { return std::max(0.0, budget_s_ - Elapsed()); }
  // Runs fn unless the budget is spent (`always`: runs regardless, for the cheap stages the
  // report cannot do without); returns whether it ran.
  bool Run(const std::string& name, const std::function<void()>& fn, bool always = false) {
    json st = {{"name", name}};
    const double begin = Elapsed();
    if (begin >= budget_s_ && !always) {
      char why[128];
      std::snprintf(why, sizeof why, "time budget of %g s spent (%.1f s elapsed)", budget_s_,
                    begin);
      st["status"] = "skipped";
      st["wall_s"] = 0.0;
      st["reason"] = why;
      stages_.push_back(st);
      return false;
    }
    fn();
    st["status"] = "ran";
    st["wall_s"] = Elapsed() - begin;
    stages_.push_back(st);
    return true;
  }
  // Why a stage was skipped (the last record of that name).
  std::string SkipReason(const std::string& name) const {
    for (auto it = stages_.rbegin(); it != stages_.rend(); ++it)
      if ((*it)["name"] == name && (*it)["status"] == "skipped")
        return (*it)["reason"].get<std::string>();
    return "";
  }
  const json& stages() const { return stages_; }
  double budget_s() const { return budget_s_; }

 private:
  using Clock = std::chrono::steady_clock;
  double budget_s_;
  Clock::time_point start_;
  json stages_ = json::array();
};

json CpuReport(StageRunner& stages) {
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
    f["amx_bf16"] = (d7 >> 22) & 1;
    f["amx_tile"] = (d7 >> 24) & 1;
  }
  if (__get_cpuid_count(7, 1, &a71, &b, &c, &d)) {
    f["avx_vnni"] = (a71 >> 4) & 1;
    f["avx512_bf16"] = (a71 >> 5) & 1;
  }
  for (auto& [k, v] : f.items()) v = v.get<unsigned>() != 0;
  cpu["features"] = f;
  // What the matmuls of the official numerics run on here: AMX tiles (CPU, OS permission and
  // DSINFER_CPU_AMX all agree), else AVX-512 BF16 dot products (DSINFER_CPU_BF16DOT), else the
  // FP32 AVX2 kernels.
  cpu["matmul_kernel"] = backend::cpu::MachineMatMulKernel();
  // FP8/FP4 at one or two tokens: the AVX-512 kernels that compute the tile unit's exact results
  // (used only after matching the tiles bit for bit on this CPU).
  cpu["vector_kernels"] = backend::cpu::amx::VectorInUse();
  cpu["threads"] = std::thread::hardware_concurrency();
  // The CPUs this process may use and their NUMA nodes (core/cpu_topology.h): what --threads
  // defaults to and what --numa can place threads and weights on.
  const std::vector<int> allowed = AllowedCpus();
  cpu["allowed_cpus"] = FormatCpuList(allowed);
  if (Result<CpuTopology> topology = ReadCpuTopology("/sys", allowed); topology.ok()) {
    json nodes = json::array();
    for (const NumaNode& node : topology->nodes)
      nodes.push_back({{"id", node.id},
                       {"cpus", FormatCpuList(node.cpus)},
                       {"memory_bytes", node.memory_bytes}});
    cpu["numa_nodes"] = nodes;
    // The start CPU only picks isolate's node; distribute uses every node.
    const Result<CpuPlacement> distribute =
        PlanCpuPlacement(*topology, NumaPolicy::kDistribute, 0, allowed.empty() ? 0 : allowed[0]);
    if (distribute.ok()) cpu["numa_distribute"] = distribute->summary;
  } else {
    cpu["numa_error"] = topology.status().ToString();
  }
  cpu["ram_bytes"] =
      static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  ThreadPool pool(0);
  stages.Run("memory_bandwidth", [&] {
    BandwidthResult bw = MeasureMemoryBandwidth(pool, int64_t{256} << 20, 3, false);
    cpu["memory_read_gbps"] = bw.read_gbps;
  });

  // The arithmetic roof of the matmul kernels, measured (backend/cpu/peak.h): the fastest
  // multiply-add unit here on every thread at once, as `dsinfer bench model` sets steps against.
  stages.Run("cpu_compute_peak", [&] {
    const backend::cpu::ComputePeak peak =
        backend::cpu::MeasureComputePeak(pool, std::min(0.2, stages.Remaining()));
    cpu["compute_peak"] = {{"unit", backend::cpu::PeakUnitName(peak.unit)},
                           {"threads", pool.size()},
                           {"gflops", 2 * peak.gmacs}};
  });

  // Self-check of the CPU backend's key ops against fp64 (backend/cpu/selfcheck.h).
  int failed = -1;
  stages.Run("cpu_selfcheck", [&] {
    json checks = json::array();
    failed = 0;
    for (const backend::cpu::SelfCheckResult& r : backend::cpu::RunCpuSelfCheck(pool, 1234)) {
      failed += r.ok ? 0 : 1;
      checks.push_back({{"op", r.op},
                        {"shape", r.shape},
                        {"max_rel_err", r.max_rel_err},
                        {"relative_to", r.error_measure},
                        {"budget", r.budget},
                        {"pass", r.ok}});
    }
    cpu["selfcheck"] = {{"checks", checks}, {"failed", failed}};
  });

  // GEMM probe: achieved GFLOP/s of the fused bf16 MatMul vs the CPU's stated fp32 peak.
  stages.Run("cpu_gemm_probe", [&] {
    backend::cpu::CpuPeak peak = backend::cpu::DetectCpuPeak(
        f.value("avx512f", false), f.value("avx2", false) && f.value("fma", false));
    backend::cpu::GemmProbeResult probe =
        backend::cpu::RunCpuGemmProbe(pool, std::min(1.0, stages.Remaining()));
    cpu["gemm_probe"] = {{"shape", probe.shape},
                         {"threads", pool.size()},
                         {"seconds_median", probe.seconds},
                         {"repeats", probe.repeats},
                         {"gflops", probe.gflops},
                         {"peak_gflops", peak.gflops},
                         {"peak_share", probe.gflops / peak.gflops},
                         {"peak_derivation", peak.derivation},
                         {"peak_inputs",
                          {{"cores", peak.cores},
                           {"ghz", peak.ghz},
                           {"fp32_lanes", peak.fp32_lanes},
                           {"fma_units", peak.fma_units}}}};
  });

  if (failed < 0) {
    cpu["verdict"] = "unchecked";
    cpu["why"] = "self-check skipped: " + stages.SkipReason("cpu_selfcheck");
  } else if (failed > 0) {
    cpu["verdict"] = "unsupported";
    cpu["why"] = std::to_string(failed) + " CPU self-check(s) exceeded their error budget";
  } else {
    cpu["verdict"] = "supported";
    cpu["why"] = "every self-check within budget; the CPU backend is the reference";
  }
  return cpu;
}

json GpuReport(StageRunner& stages) {
  json gpu;
#ifndef DSINFER_HAVE_CUDA
  (void)stages;  // nothing to run without the CUDA backend
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
      const std::string conformance_stage = "gpu" + std::to_string(info.ordinal) + "_conformance";
      const bool checked = stages.Run(conformance_stage, [&] {
        json checks = json::array();
        for (const cu::CheckResult& r : cu::RunConformance(**dev)) {
          ++total;
          if (!r.ok) {
            ++failed;
            checks.push_back({{"op", r.op}, {"shape", r.shape}, {"detail", r.detail}});
          }
        }
        d["conformance"] = {{"checks", total}, {"failed", failed}, {"failures", checks}};
      });
      // The whole forward on a generated tiny checkpoint (written to a temporary directory and
      // removed after), GPU against CPU.
      bool forward_ok = true;
      stages.Run("gpu" + std::to_string(info.ordinal) + "_forward", [&] {
        auto check = GpuForwardCheck(**dev);
        if (!check.ok()) {
          d["forward"] = {{"error", check.status().message()}};
          forward_ok = false;
          return;
        }
        d["forward"] = {{"op", check->op},
                        {"shape", check->shape},
                        {"ok", check->ok},
                        {"budget_share", check->budget_share},
                        {"detail", check->detail}};
        forward_ok = check->ok;
      });
      stages.Run("gpu" + std::to_string(info.ordinal) + "_probe", [&] {
        auto probe = cu::RunProbes(**dev);
        if (!probe.ok()) {
          d["probe_error"] = probe.status().message();
          return;
        }
        d["probe"] = {{"read_gbps", probe->read_gbps},
                      {"copy_gbps", probe->copy_gbps},
                      {"bandwidth_share", probe->read_gbps / std::max(1.0, probe->peak_gbps)},
                      {"gemm_tflops", probe->gemm_tflops},
                      {"gemm_shape", probe->gemm_shape},
                      {"peak_fp32_tflops", probe->peak_fp32_tflops},
                      {"tc_f16_tflops", probe->tc_f16_tflops},
                      {"tc_fp8_tflops", probe->tc_fp8_tflops},
                      {"peak_tensor_f16_tflops", probe->peak_tensor_f16_tflops},
                      {"peak_tensor_fp8_tflops", probe->peak_tensor_fp8_tflops},
                      {"tc_decode16_gbps", probe->tc_decode16_gbps}};
      });
      if (!checked) {
        verdict = "unchecked";
        why = "conformance skipped: " + stages.SkipReason(conformance_stage);
      } else if (failed > 0) {
        verdict = "unsupported";
        why =
            std::to_string(failed) + " of " + std::to_string(total) + " conformance checks failed";
      } else if (!forward_ok) {
        verdict = "unsupported";
        why = "the GPU forward disagrees with the CPU's (or could not run): see \"forward\"";
      } else if (!p.not_yet_used.empty()) {
        verdict = "degraded";
        why = "every conformance check passes; not yet using:";
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
  constexpr const char* kUsage = "usage: dsinfer doctor [--json] [--time-budget SECONDS]";
  Args args;
  double budget_s = 60;
  if (!args.Parse(argc, argv, {"time-budget"}, {"json"}) ||
      !args.GetDouble("time-budget", &budget_s)) {
    std::fprintf(stderr, "doctor: %s\n%s\n", args.error().c_str(), kUsage);
    return 2;
  }
  if (!(budget_s >= 0) || !std::isfinite(budget_s)) {
    std::fprintf(stderr, "doctor: --time-budget must be a finite number of seconds >= 0\n%s\n",
                 kUsage);
    return 2;
  }
  StageRunner stages(budget_s);
  json report;
  report["cpu"] = CpuReport(stages);
  // Device enumeration is cheap and is the answer to "is there a GPU?": it always runs; the
  // conformance checks and probes inside are budgeted stages of their own.
  stages.Run(
      "gpu", [&] { report["gpu"] = GpuReport(stages); }, /*always=*/true);
  report["time_budget_s"] = budget_s;
  report["elapsed_s"] = stages.Elapsed();
  report["stages"] = stages.stages();
  if (args.Has("json")) {
    std::printf("%s\n", report.dump(2).c_str());
    return 0;
  }
  const json& cpu = report["cpu"];
  std::printf("CPU: %s, %u threads", cpu["model"].get<std::string>().c_str(),
              cpu["threads"].get<unsigned>());
  if (cpu.contains("memory_read_gbps"))
    std::printf(", %.1f GB/s read", cpu["memory_read_gbps"].get<double>());
  if (cpu.contains("numa_nodes")) {
    const json& nodes = cpu["numa_nodes"];
    std::printf("\n  CPUs this process may use: %s; NUMA nodes: %zu",
                cpu["allowed_cpus"].get<std::string>().c_str(), nodes.size());
    for (const json& node : nodes) {
      std::printf("\n    node %d: CPUs %s", node["id"].get<int>(),
                  node["cpus"].get<std::string>().empty()
                      ? "(none allowed)"
                      : node["cpus"].get<std::string>().c_str());
      if (node["memory_bytes"].get<int64_t>() >= 0)
        std::printf(", %.1f GiB", static_cast<double>(node["memory_bytes"].get<int64_t>()) /
                                      static_cast<double>(int64_t{1} << 30));
    }
    if (nodes.size() > 1)
      std::printf("\n  several nodes: serve with --numa distribute --weights copy (%s)",
                  cpu.value("numa_distribute", std::string("no plan")).c_str());
  } else if (cpu.contains("numa_error")) {
    std::printf("\n  NUMA topology unreadable: %s", cpu["numa_error"].get<std::string>().c_str());
  }
  std::printf("\n  features:");
  for (auto& [k, v] : cpu["features"].items())
    if (v.get<bool>()) std::printf(" %s", k.c_str());
  std::printf("\n  matmul kernel for the official numerics: %s%s\n",
              cpu["matmul_kernel"].get<std::string>().c_str(),
              cpu["vector_kernels"].get<bool>()
                  ? " (FP8/FP4 at 1-2 tokens: avx512-vector, tile-exact)"
                  : "");
  if (cpu.contains("compute_peak") && cpu["compute_peak"]["gflops"].get<double>() > 0) {
    const json& p = cpu["compute_peak"];
    std::printf("  measured multiply-add peak: %.1f GFLOP/s (%s, %d threads)\n",
                p["gflops"].get<double>(), p["unit"].get<std::string>().c_str(),
                p["threads"].get<int>());
  }
  if (cpu.contains("selfcheck")) {
    std::printf("  self-check vs fp64 (max error / budget):\n");
    for (const json& c : cpu["selfcheck"]["checks"])
      std::printf("    %-18s %-28s %9.3g / %-9.3g %s\n", c["op"].get<std::string>().c_str(),
                  c["shape"].get<std::string>().c_str(), c["max_rel_err"].get<double>(),
                  c["budget"].get<double>(), c["pass"].get<bool>() ? "pass" : "FAIL");
  }
  if (cpu.contains("gemm_probe")) {
    const json& g = cpu["gemm_probe"];
    std::printf("  GEMM probe: %.1f GFLOP/s (%s, %d threads) = %.1f%% of peak %.1f GFLOP/s\n",
                g["gflops"].get<double>(), g["shape"].get<std::string>().c_str(),
                g["threads"].get<int>(), 100.0 * g["peak_share"].get<double>(),
                g["peak_gflops"].get<double>());
    std::printf("    peak: %s\n", g["peak_derivation"].get<std::string>().c_str());
  }
  std::printf("  verdict: %s (%s)\n", cpu["verdict"].get<std::string>().c_str(),
              cpu["why"].get<std::string>().c_str());
  const json& gpu = report["gpu"];
  if (gpu.contains("no_gpu_reason"))
    std::printf("GPU: %s\n", gpu["no_gpu_reason"].get<std::string>().c_str());
  for (const json& d : gpu["devices"]) {
    std::printf("GPU %d: %s (sm_%s): %s %s\n", d["ordinal"].get<int>(),
                d["name"].get<std::string>().c_str(), d["sm"].get<std::string>().c_str(),
                d["verdict"].get<std::string>().c_str(), d["why"].get<std::string>().c_str());
    if (!d.contains("probe")) continue;
    const json& p = d["probe"];
    const auto share = [](double v, double peak) { return peak > 0 ? 100.0 * v / peak : 0.0; };
    std::printf("  memory: read %.0f GB/s = %.1f%% of %.0f GB/s\n", p["read_gbps"].get<double>(),
                100.0 * p["bandwidth_share"].get<double>(), d["peak_memory_gbps"].get<double>());
    std::printf(
        "  %s: generic %.1f TFLOP/s; tensor cores fp16 MMA %.1f (%.1f%% of %.0f), FP8 MMA "
        "%.1f (%.1f%% of %.0f); 16-token decode GEMM %.0f GB/s of weights\n",
        p["gemm_shape"].get<std::string>().c_str(), p["gemm_tflops"].get<double>(),
        p["tc_f16_tflops"].get<double>(),
        share(p["tc_f16_tflops"].get<double>(), p["peak_tensor_f16_tflops"].get<double>()),
        p["peak_tensor_f16_tflops"].get<double>(), p["tc_fp8_tflops"].get<double>(),
        share(p["tc_fp8_tflops"].get<double>(), p["peak_tensor_fp8_tflops"].get<double>()),
        p["peak_tensor_fp8_tflops"].get<double>(), p["tc_decode16_gbps"].get<double>());
  }
  std::printf("stages (budget %g s, %.1f s used):", budget_s, stages.Elapsed());
  for (const json& st : stages.stages()) {
    if (st["status"] == "ran")
      std::printf(" %s %.2fs;", st["name"].get<std::string>().c_str(), st["wall_s"].get<double>());
    else
      std::printf(" %s skipped;", st["name"].get<std::string>().c_str());
  }
  std::printf("\n");
  return 0;
}

}  // namespace dsinfer::cli
