// Read-only memory mapping of a whole file. Zero-copy: pages are faulted in on first touch,
// so mapping a checkpoint costs address space, not resident memory.
// Thread-compatible; the mapping is immutable and may be read from any thread.
//
// Caveat of every file mapping: if another process truncates the file while it is mapped,
// touching the lost pages raises SIGBUS. Checkpoints are treated as immutable while loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

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

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

  // Page-cache hints for a byte range (clamped to the file; rounded out to whole pages).
  // WillNeed starts asynchronous readahead, e.g. for the next layer's weights; DontNeed lets
  // the kernel drop pages already consumed (they are re-read from the file if touched again).
  // Hints never change the mapped contents; failures are reported but harmless to ignore.
  Status AdviseWillNeed(uint64_t offset, uint64_t length) const;
  Status AdviseDontNeed(uint64_t offset, uint64_t length) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  Status Advise(uint64_t offset, uint64_t length, int advice, const char* advice_name) const;

  std::string path_;
  const uint8_t* data_ = nullptr;  // [size_] bytes, PROT_READ, MAP_PRIVATE; nullptr when empty
  size_t size_ = 0;
};

}  // namespace dsinfer::io
