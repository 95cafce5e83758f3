# CUDA backend switch and target architectures (src/backend/cuda, docs/SUPPORT.md).
#
# DSINFER_CUDA defaults to ON when CMake finds nvcc. The sanitizer build turns it off: nvcc's
# device code and ASan/UBSan instrumentation do not mix, and the ASan pass tests host code only.
#
# What each architecture enables (CUDA 13 targets; sm_70/sm_75 were dropped by CUDA 13):
#   arch   GPUs                         FP8 MMA  FP4 MMA  kernel paths in dsinfer
#   80     A100, A30                    no       no       generic GEMV / GEMM (fp32 FMA); official FP8
#                                                         linears of 9+ tokens: fp16 mma.sync on
#                                                         exactly widened e4m3 codes (tc_gemm.cu)
#   86     RTX 30xx, A10, A40           no       no       as 80
#   89     RTX 40xx, L4, L40S           yes      no       as 80; FP8 mma.sync built, not default yet
#   90a    H100, H200, GH200            yes      no       as 80 with FP8 mma.sync by default
#                                                         (measured); FP8 wgmma (later)
#   100a   B200, GB200                  yes      yes      as 89; tcgen05 FP8/FP4 (later)
#   120a   RTX 50xx, RTX PRO 6000       yes      yes      as 89; FP4 mma.sync (later)
# The "a" suffix builds architecture-specific code (wgmma / tcgen05 need it); such cubins run
# only on that exact major.minor. CI builds one architecture to stay fast; the `release` preset
# (CMakePresets.json) builds all six; scripts/gpu-check.sh builds the detected GPU's.
include(CheckLanguage)
check_language(CUDA)
set(dsinfer_cuda_default OFF)
if(CMAKE_CUDA_COMPILER AND NOT DSINFER_SANITIZE)
  set(dsinfer_cuda_default ON)
endif()
option(DSINFER_CUDA "Build the CUDA backend (src/backend/cuda)" ${dsinfer_cuda_default})
if(DSINFER_CUDA AND DSINFER_SANITIZE)
  message(STATUS "dsinfer: DSINFER_SANITIZE is on, so the CUDA backend is off")
  set(DSINFER_CUDA OFF CACHE BOOL "Build the CUDA backend (src/backend/cuda)" FORCE)
endif()
if(DSINFER_CUDA AND NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "DSINFER_CUDA=ON but no CUDA compiler was found (set CUDACXX)")
endif()

if(DSINFER_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # One architecture keeps CI's extra compile time small; Hopper is the primary target.
    set(CMAKE_CUDA_ARCHITECTURES 90a)
  endif()
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
  endif()
  enable_language(CUDA)
  # Device code includes only kernels.h; CMake 3.25 does not know nvcc 13's C++20 flag.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  if(DSINFER_CCACHE)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${DSINFER_CCACHE})
  endif()
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "dsinfer: CUDA backend on, architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
