# xgrammar's C++ core (Apache-2.0), the grammar engine behind structured outputs (src/grammar).
# scripts/install-deps.sh fetches its PyPI source distribution into the ignored .deps/ (or
# $DSINFER_DEPS_CACHE); this extracts it into the build tree (sha256 checked again) and builds the static
# library from its C++ sources alone: no Python/nanobind/TVM-FFI bindings, no tests. Its own
# warning flags are not ours (it is not linked to dsinfer_options: third-party code is not held
# to -Werror or instrumented by the sanitizer build).
set(DSINFER_XGRAMMAR_VERSION 0.2.8)
set(DSINFER_XGRAMMAR_SHA256 8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80)
if(DEFINED ENV{DSINFER_DEPS_CACHE})
  set(dsinfer_deps_cache $ENV{DSINFER_DEPS_CACHE})
else()
  set(dsinfer_deps_cache ${PROJECT_SOURCE_DIR}/.deps)
endif()
set(DSINFER_XGRAMMAR_ARCHIVE ${dsinfer_deps_cache}/xgrammar-${DSINFER_XGRAMMAR_VERSION}.tar.gz
    CACHE FILEPATH "xgrammar's PyPI sdist (scripts/install-deps.sh fetches it)")
if(NOT EXISTS ${DSINFER_XGRAMMAR_ARCHIVE})
  message(FATAL_ERROR "xgrammar ${DSINFER_XGRAMMAR_VERSION} source archive not found at "
                      "${DSINFER_XGRAMMAR_ARCHIVE}: run scripts/install-deps.sh")
endif()
file(SHA256 ${DSINFER_XGRAMMAR_ARCHIVE} xgrammar_archive_sha256)
if(NOT xgrammar_archive_sha256 STREQUAL DSINFER_XGRAMMAR_SHA256)
  message(FATAL_ERROR "${DSINFER_XGRAMMAR_ARCHIVE}: sha256 ${xgrammar_archive_sha256}, "
                      "expected ${DSINFER_XGRAMMAR_SHA256}")
endif()
set(xgrammar_root ${CMAKE_BINARY_DIR}/_deps/xgrammar-${DSINFER_XGRAMMAR_VERSION})
if(NOT EXISTS ${xgrammar_root}/include/xgrammar/xgrammar.h)
  file(ARCHIVE_EXTRACT INPUT ${DSINFER_XGRAMMAR_ARCHIVE} DESTINATION ${CMAKE_BINARY_DIR}/_deps)
endif()
file(GLOB xgrammar_sources ${xgrammar_root}/cpp/*.cc ${xgrammar_root}/cpp/support/*.cc
     ${xgrammar_root}/cpp/converter_ext/*.cc)
add_library(xgrammar STATIC ${xgrammar_sources})
set_target_properties(xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
target_include_directories(xgrammar PUBLIC ${xgrammar_root}/include)
target_include_directories(xgrammar SYSTEM PUBLIC ${xgrammar_root}/3rdparty/picojson
                                                  ${xgrammar_root}/3rdparty/dlpack/include)
target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0
                                           XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
# Its sources are built as its own release build is, whatever this tree's build type.
target_compile_options(xgrammar PRIVATE -O2 -w)
target_link_libraries(xgrammar PUBLIC Threads::Threads)
