# Target-based compile options shared by every dsinfer target.
add_library(dsinfer_options INTERFACE)
target_compile_options(dsinfer_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-missing-field-initializers>)
# GCC 12 reports false -Wrestrict positives inside libstdc++'s std::string operator+ at -O3
# (GCC bug 105329); the warning is disabled for GCC only.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(dsinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
if(DSINFER_WERROR)
  target_compile_options(dsinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(DSINFER_CUDA)
  # Device code: host-compiler warnings through nvcc; -Werror covers nvcc's own warnings too.
  target_compile_options(dsinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  if(DSINFER_WERROR)
    target_compile_options(dsinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endif()
if(DSINFER_NATIVE)
  target_compile_options(dsinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()
# No floating-point contraction: GCC fuses a * b + c into an FMA wherever it likes (even in ISO
# mode), and where it likes depends on inlining, so the same source gave different logits at -O3
# (Release) and -O2 (the sanitizer build). Every FMA the kernels want is an explicit intrinsic or
# std::fma; scalar code computes exactly what it says, in every build (docs/NUMERICS.md).
target_compile_options(dsinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
if(DSINFER_SANITIZE)
  # GCC's -Wmaybe-uninitialized misfires on Boost.Beast's optional<> internals once the
  # sanitizers change inlining; it stays on in the regular (-O3, -Werror) build.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(dsinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
  endif()
  target_compile_options(dsinfer_options INTERFACE -fsanitize=address,undefined
                         -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_link_options(dsinfer_options INTERFACE -fsanitize=address,undefined)
endif()
target_include_directories(dsinfer_options INTERFACE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(dsinfer_options INTERFACE Threads::Threads)

# dsinfer_layer(NAME DEPS...): a static library from src/NAME/**/*.cc, linked to DEPS only.
function(dsinfer_layer name)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*.cc)
  # backend/cuda is a separate library (src/backend/cuda/CMakeLists.txt), built only with CUDA.
  list(FILTER srcs EXCLUDE REGEX "_test\\.cc$|_fuzz\\.cc$|/src/backend/cuda/")
  if(NOT srcs)
    set(srcs ${PROJECT_SOURCE_DIR}/cmake/empty.cc)
  endif()
  add_library(dsinfer_${name} STATIC ${srcs})
  target_link_libraries(dsinfer_${name} PUBLIC dsinfer_options ${ARGN})
endfunction()
