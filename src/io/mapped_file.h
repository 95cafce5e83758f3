// A whole file's bytes, read-only in memory: a mapping of the page cache (zero-copy: pages are
// faulted in on first touch, so mapping a checkpoint costs address space, not resident memory),
// or, after CopyIntoMemory, a private copy in anonymous memory.
// Thread-compatible; the bytes are immutable and may be read from any thread.
//
// Caveat of every file mapping: if another process truncates the file while it is mapped,
// touching the lost pages raises SIGBUS. Checkpoints are treated as immutable while loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/cpu_topology.h"
#include "core/status.h"

namespace dsinfer::io {

class MappedFile {
 public:
  // Maps the regular file at `path` (an empty file gives size() == 0 and an empty bytes()).
  // Errors name the path and the system's errno text.
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Replaces the mapping by a copy of the bytes in private anonymous memory (2 MiB aligned,
  // transparent huge pages advised), read from the file by a few threads in 8 MiB chunks, then
  // made read-only. bytes() moves: call it before taking pointers into the file. Fails, keeping
  // the mapping, if the path no longer names the mapped file or it changed size. Why: kernels
  // streaming weights read anonymous memory faster than file pages (measured 16-20 % for a 1 GB
  // bf16 matrix on this project's VM, docs/PERF.md), and the copy cannot be truncated under the
  // process. Costs resident memory for the whole file. A no-op when already copied.
  // A chunk already in the page cache is read through it (a memory copy); any other chunk is
  // read with O_DIRECT, straight from the device into the copy, where the filesystem allows it:
  // a cold 12.8 GB checkpoint loaded in 5-6 s instead of 10-15 s, and it does not also fill the
  // page cache, which would double the checkpoint's footprint (docs/PERF.md, "Loading a
  // checkpoint").
  // cache_line_offset: the file offset to put on a 64-byte boundary (taken modulo 64), e.g. where
  // most of a checkpoint's tensor bytes start (SafetensorsFile::CopyIntoMemory). Tensors in a
  // safetensors file are only 8-byte aligned; read from an unaligned copy, every 64-byte vector
  // load of a weight row splits two cache lines (docs/PERF.md, 2026-12-05, eighth session). With
  // a nonzero shift each O_DIRECT chunk goes through an aligned bounce buffer.
  // placement: where the copy's pages go on a multi-node host (--numa; PlaceMemory before the
  // first byte is written, so the copying threads' own nodes do not decide); a refusal by the
  // kernel fails the copy.
  Status CopyIntoMemory(uint64_t cache_line_offset = 0, const MemoryPlacement& placement = {});
  static constexpr size_t kCopyChunkBytes = size_t{8} << 20;  // 2 to 64 MiB measured: 8 best
  bool copied() const { return copied_; }
  // How the copy's bytes were read: past the page cache (O_DIRECT) or through it.
  struct CopyStats {
    uint64_t direct_bytes = 0;
    uint64_t buffered_bytes = 0;
  };
  const CopyStats& copy_stats() const { return copy_stats_; }

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

  // Page-cache hints for a byte range (clamped to the file; rounded out to whole pages).
  // WillNeed starts asynchronous readahead, e.g. for the next layer's weights; DontNeed lets
  // the kernel drop pages already consumed (they are re-read from the file if touched again).
  // Hints never change the mapped contents; failures are reported but harmless to ignore.
  // After CopyIntoMemory there is no page cache behind the bytes and both are no-ops.
  Status AdviseWillNeed(uint64_t offset, uint64_t length) const;
  Status AdviseDontNeed(uint64_t offset, uint64_t length) const;
  // Random: a fault reads only its own page (no readahead), for tables read a row at a time
  // (V4.1's Engram tables, ~101 GB each, of which a token touches 24 rows).
  Status AdviseRandom(uint64_t offset, uint64_t length) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)),
        data_(data),
        size_(size),
        region_(const_cast<uint8_t*>(data)),
        region_size_(size) {}
  // Opens path_ again with `flags` (O_CLOEXEC added) and checks it is still the mapped file.
  Result<int> ReopenSameFile(int flags) const;
  Status Advise(uint64_t offset, uint64_t length, int advice, const char* advice_name) const;

  std::string path_;
  const uint8_t* data_ = nullptr;  // [size_] bytes, PROT_READ; nullptr when empty
  size_t size_ = 0;
  bool copied_ = false;
  CopyStats copy_stats_;
  // The region to munmap: the file mapping, or the anonymous one data_ lies in when copied.
  void* region_ = nullptr;
  size_t region_size_ = 0;
  // The mapped file's identity, so that CopyIntoMemory reads the same file.
  uint64_t device_ = 0, inode_ = 0;
};

}  // namespace dsinfer::io
