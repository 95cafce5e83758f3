// Shared by the CUDA test suites: opening device 0 or skipping with the reason, and reporting a
// conformance check.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "backend/cuda/conformance.h"
#include "backend/cuda/device.h"

namespace dsinfer::backend::cuda {

// Opens device 0, or explains why not (the caller GTEST_SKIPs with the reason).
inline std::unique_ptr<CudaDevice> OpenDevice(std::string* why) {
  auto dev = CudaDevice::Open(0);
  if (!dev.ok()) {
    *why = dev.status().message();
    return nullptr;
  }
  return std::move(dev).value();
}

#define DEVICE_OR_SKIP(dev)                                    \
  std::string skip_reason_;                                    \
  std::unique_ptr<CudaDevice> dev = OpenDevice(&skip_reason_); \
  if (!dev) GTEST_SKIP() << "no CUDA device: " << skip_reason_

inline void ExpectPass(const CheckResult& r) {
  EXPECT_TRUE(r.ok) << r.op << " " << r.shape << ": " << r.detail;
  std::printf("  %-28s %-50s budget share %.3g\n", r.op.c_str(), r.shape.c_str(), r.budget_share);
}

}  // namespace dsinfer::backend::cuda
