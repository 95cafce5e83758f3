// Safetensors reading (zero-copy over MappedFile) and writing.
//
// Format: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
// then the data section; offsets are relative to the start of the data section.
// The parser treats every byte as hostile: header length past the file, malformed JSON, unknown
// dtypes, negative/overflowing shapes, offsets outside the data section, byte size != product of
// shape * dtype size, and overlapping tensors are all errors naming the file and tensor.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/mapped_file.h"

namespace dsinfer::io {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // relative to the data section
  uint64_t data_end = 0;
  int64_t NumElements() const;
};

// A view of one tensor's bytes inside a mapped file (or any memory the owner keeps alive).
struct TensorRef {
  const TensorInfo* info = nullptr;
  std::span<const uint8_t> bytes;
  const std::string* file = nullptr;  // for error messages
};

// Parses and validates a header. `file_size` is the whole file's size. Pure; fuzzed.
Result<std::vector<TensorInfo>> ParseSafetensorsHeader(std::span<const uint8_t> file_prefix,
                                                      uint64_t file_size,
                                                      std::map<std::string, std::string>* metadata,
                                                      uint64_t* data_section_offset);

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  TensorRef Ref(const TensorInfo& info) const;

 private:
  std::unique_ptr<MappedFile> file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_offset_ = 0;
};

// A Hugging Face model directory's weights: model.safetensors.index.json + shards, or a single
// model.safetensors. Every tensor named in the index must exist in the shard it names.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  const std::string& dir() const { return dir_; }
  // nullptr info when absent.
  TensorRef Find(const std::string& name) const;
  std::vector<std::string> TensorNames() const;
  uint64_t TotalBytes() const;  // sum of all shard file sizes

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>> index_;
};

// Streaming writer: tensors are declared first (name, dtype, shape), then their bytes are written
// in declaration order, so multi-GB checkpoints never need to sit in memory.
class SafetensorsWriter {
 public:
  // Declare all tensors before Begin(). Returns an error on duplicate names.
  Status Declare(const std::string& name, DType dtype, std::vector<int64_t> shape);
  void SetMetadata(const std::string& key, const std::string& value);
  // Writes the header; afterwards call Write() once per declared tensor, in declaration order.
  Status Begin(const std::string& path);
  Status Write(const std::string& name, std::span<const uint8_t> bytes);
  Status Finish();
  uint64_t DataBytes() const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t n_bytes;
  };
  std::vector<Pending> pending_;
  std::map<std::string, std::string> metadata_;
  size_t next_ = 0;
  std::FILE* out_ = nullptr;
  std::string path_;
};

// Writes a single-file safetensors with small in-memory tensors (fixtures, logits).
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
Status WriteSafetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace dsinfer::io
