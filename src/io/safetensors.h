// Safetensors reading (zero-copy over MappedFile) and writing.
//
// Format: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__":
//   {..}}
// then the data section; offsets are relative to the start of the data section.
// The parser treats every byte as hostile: header length past the file, malformed JSON, unknown
// dtypes, negative/overflowing shapes, offsets outside the data section, byte size != product of
// shape * dtype size, and overlapping tensors are all errors naming the file and tensor.
// Gaps between tensors are allowed (only overlap is an error). Tensor bytes are 8-byte aligned
// only if the writer padded the header (ours and Hugging Face's do); read them with memcpy or
// check alignment before casting.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
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
  std::vector<int64_t> shape;  // validated: every dim >= 0, product * dtype size fits the file
  uint64_t data_begin = 0;     // relative to the data section
  uint64_t data_end = 0;
  int64_t NumElements() const;
  uint64_t ByteSize() const { return data_end - data_begin; }
};

// A view of one tensor's bytes inside a mapped file (or any memory the owner keeps alive).
struct TensorRef {
  const TensorInfo* info = nullptr;
  std::span<const uint8_t> bytes;
  const std::string* file = nullptr;  // for error messages
};

// Parses and validates a header. `file_size` is the whole file's size; `file_prefix` must hold
// at least the first 8 + header-length bytes. On success fills `metadata` (may be null) and
// `data_section_offset` (may be null; = 8 + header length); on error leaves them untouched.
// Tensors are returned sorted by name. Pure; fuzzed (tests/fuzz/).
Result<std::vector<TensorInfo>> ParseSafetensorsHeader(std::span<const uint8_t> file_prefix,
                                                       uint64_t file_size,
                                                       std::map<std::string, std::string>* metadata,
                                                       uint64_t* data_section_offset);
// Same, with errors naming `source` (the file path) instead of "<memory>".
Result<std::vector<TensorInfo>> ParseSafetensorsHeader(std::span<const uint8_t> file_prefix,
                                                       uint64_t file_size,
                                                       const std::string& source,
                                                       std::map<std::string, std::string>* metadata,
                                                       uint64_t* data_section_offset);

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  const std::string& path() const { return file_->path(); }
  uint64_t file_size() const { return file_->size(); }
  // For page-cache hints (MappedFile::AdviseWillNeed) over a tensor's file range.
  const MappedFile& mapped_file() const { return *file_; }
  // MappedFile::CopyIntoMemory: TensorRefs taken before point into the dropped mapping. The copy
  // puts on 64-byte boundaries the tensors that hold most of the bytes (BulkTensorOffset).
  Status CopyIntoMemory(const MemoryPlacement& placement = {}) {
    return file_->CopyIntoMemory(BulkTensorOffset(), placement);
  }
  // The file offset modulo 64 at which the most tensor bytes start (ties: the lowest). Tensors
  // are only 8-byte aligned in the format, but a checkpoint's large tensors have sizes that are
  // multiples of 64, so one shift of the copy aligns nearly all of them.
  uint64_t BulkTensorOffset() const;
  uint64_t data_section_offset() const { return data_offset_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  // `info` must be one of tensors() (checked).
  TensorRef Ref(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  std::unique_ptr<MappedFile> file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_offset_ = 0;
};

// A Hugging Face model directory's weights: model.safetensors.index.json + shards, or a single
// model.safetensors. Every tensor named in the index must exist in the shard it names.
// Shard names must be plain file names inside `dir` (no '/', no "..": an index cannot point
// outside the directory; symlinked shards, as in the HF cache, are fine). A tensor stored in a
// shard but absent from the weight map (or mapped to another shard) is an error, not a warning:
// such an index is stale or hand-edited, and which copy of the tensor is meant is unknowable.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  const std::string& dir() const { return dir_; }
  // nullptr info when absent.
  TensorRef Find(const std::string& name) const;
  // MappedFile::AdviseRandom over the tensor's bytes (a no-op for a copied shard); NotFound for
  // an unknown name.
  Status AdviseRandomAccess(const std::string& name) const;
  std::vector<std::string> TensorNames() const;  // sorted
  uint64_t TotalBytes() const;                   // sum of all shard file sizes
  // Every shard copied into anonymous memory (MappedFile::CopyIntoMemory), before any TensorRef
  // is taken: earlier ones point into the dropped mappings. On error some shards may be copied;
  // the checkpoint stays valid either way. placement: MappedFile::CopyIntoMemory's.
  Status CopyIntoMemory(const MemoryPlacement& placement = {});
  bool copied() const;                       // every shard copied
  MappedFile::CopyStats copy_stats() const;  // summed over the shards
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>> index_;
};

// Streaming writer: tensors are declared first (name, dtype, shape), then their bytes are written
// in declaration order, so multi-GB checkpoints never need to sit in memory.
// The header is compact JSON (__metadata__ first, then tensors in declaration order, offsets
// contiguous in that order) padded with spaces so the data section starts 8-byte aligned, as
// Hugging Face's writer does. After any error the writer is failed: the file is closed and
// later calls return errors. A file left unfinished declares more data than it holds, so
// readers reject it.
class SafetensorsWriter {
 public:
  SafetensorsWriter() = default;
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Declare all tensors before Begin(). Returns an error on duplicate names, negative dims,
  // "__metadata__" as a name, names that are not UTF-8, or sizes overflowing u64.
  Status Declare(const std::string& name, DType dtype, std::vector<int64_t> shape);
  // Before Begin(); a later call makes Finish() fail rather than being silently dropped.
  void SetMetadata(const std::string& key, const std::string& value);
  // Writes the header; afterwards call Write() once per declared tensor, in declaration order.
  Status Begin(const std::string& path);
  Status Write(const std::string& name, std::span<const uint8_t> bytes);
  // Writes the next declared tensor as zeros without writing them: the file gets a hole there
  // (sparse where the filesystem supports it), so huge all-zero tensors cost no disk.
  Status WriteZeros(const std::string& name);
  // Flushes and closes; reports write errors the buffered writes deferred (e.g. disk full).
  Status Finish();
  uint64_t DataBytes() const;

 private:
  Status Fail(Status status);

  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t n_bytes;
  };
  enum class State { kDeclaring, kWriting, kFinished, kFailed };
  std::vector<Pending> pending_;  // declaration order = data order
  std::set<std::string> declared_names_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
  bool metadata_after_begin_ = false;
  State state_ = State::kDeclaring;
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
