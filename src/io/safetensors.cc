// Safetensors header parsing and SafetensorsFile (the reading side; the writer is in
// safetensors_writer.cc, the directory loader in checkpoint.cc).
#include "io/safetensors.h"

#include <algorithm>
#include <array>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "io/json_file.h"

namespace dsinfer::io {
namespace {

using json = nlohmann::json;

// Real headers are a few MB even for 100k-tensor checkpoints; this bounds what a hostile length
// field can make us parse (Hugging Face's reader uses the same limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// A valid header nests 3 deep (object -> entry -> shape); leave room for unknown extra fields.
constexpr int kMaxHeaderDepth = 16;
constexpr uint64_t kMaxDim = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

std::string Quoted(const std::string& name) { return "'" + name + "'"; }

class HeaderErrors {
 public:
  explicit HeaderErrors(const std::string& source) : source_(source) {}
  Status File(const std::string& what) const {
    return InvalidArgument("safetensors " + source_ + ": " + what);
  }
  Status Tensor(const std::string& name, const std::string& what) const {
    return InvalidArgument("safetensors " + source_ + ": tensor " + Quoted(name) + ": " + what);
  }

 private:
  const std::string& source_;
};

// Reads a non-negative integer that fits u64 (JSON floats, negatives and values past u64 -
// which nlohmann stores as floats - are rejected).
bool ReadUnsigned(const json& value, uint64_t* out) {
  if (!value.is_number_unsigned()) return false;
  *out = value.get<uint64_t>();
  return true;
}

Result<TensorInfo> ParseEntry(const std::string& name, const json& entry, uint64_t data_size,
                              const HeaderErrors& errors) {
  if (!entry.is_object()) return errors.Tensor(name, "entry is not a JSON object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return errors.Tensor(name, "missing or non-string \"dtype\"");
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return errors.Tensor(name, "missing or non-array \"shape\"");
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return errors.Tensor(name, "\"data_offsets\" must be an array [begin, end]");
  }

  TensorInfo info;
  info.name = name;
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = DTypeFromSafetensorsName(dtype_name);
  if (!dtype) return errors.Tensor(name, "unknown dtype " + Quoted(dtype_name));
  info.dtype = *dtype;

  uint64_t numel = 1;
  info.shape.reserve(shape_it->size());
  for (const json& dim_value : *shape_it) {
    uint64_t dim = 0;
    if (!ReadUnsigned(dim_value, &dim) || dim > kMaxDim) {
      return errors.Tensor(name, "shape entries must be non-negative integers below 2^63");
    }
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      return errors.Tensor(name, "element count of the shape overflows 64 bits");
    }
    info.shape.push_back(static_cast<int64_t>(dim));
  }

  if (!ReadUnsigned((*offsets_it)[0], &info.data_begin) ||
      !ReadUnsigned((*offsets_it)[1], &info.data_end)) {
    return errors.Tensor(name, "data_offsets must be non-negative 64-bit integers");
  }
  if (info.data_begin > info.data_end) {
    return errors.Tensor(name, "data_offsets begin " + std::to_string(info.data_begin) +
                                   " is after end " + std::to_string(info.data_end));
  }
  if (info.data_end > data_size) {
    return errors.Tensor(name, "data_offsets end " + std::to_string(info.data_end) +
                                   " is past the data section (" + std::to_string(data_size) +
                                   " bytes)");
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(info.dtype)),
                             &expected_bytes)) {
    return errors.Tensor(name, "byte size of the shape overflows 64 bits");
  }
  if (expected_bytes != info.ByteSize()) {
    return errors.Tensor(name, "data_offsets span " + std::to_string(info.ByteSize()) +
                                   " bytes but shape x " + dtype_name + " needs " +
                                   std::to_string(expected_bytes));
  }
  return info;
}

Status ParseMetadata(const json& value, const HeaderErrors& errors,
                     std::map<std::string, std::string>* out) {
  if (!value.is_object()) return errors.File("__metadata__ must be an object of strings");
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!it.value().is_string()) {
      return errors.File("__metadata__ value for key " + Quoted(it.key()) + " is not a string");
    }
    (*out)[it.key()] = it.value().get<std::string>();
  }
  return Status::Ok();
}

// Empty tensors occupy no bytes and so overlap nothing, wherever their offsets point.
Status CheckNoOverlap(const std::vector<TensorInfo>& tensors, const HeaderErrors& errors) {
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const TensorInfo& t : tensors) {
    if (t.ByteSize() > 0) by_offset.push_back(&t);
  }
  // Stable, so of two identical ranges the later name is the one reported.
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const TensorInfo* a, const TensorInfo* b) {
                     return a->data_begin != b->data_begin ? a->data_begin < b->data_begin
                                                           : a->data_end < b->data_end;
                   });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    // Sorted by begin and pairwise disjoint so far, so prev has the largest end seen.
    if (cur.data_begin < prev.data_end) {
      return errors.Tensor(cur.name, "bytes [" + std::to_string(cur.data_begin) + ", " +
                                         std::to_string(cur.data_end) + ") overlap tensor " +
                                         Quoted(prev.name) + " [" +
                                         std::to_string(prev.data_begin) + ", " +
                                         std::to_string(prev.data_end) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

int64_t TensorInfo::NumElements() const {
  uint64_t n = 1;  // unsigned: a hand-built, unvalidated shape wraps instead of being UB
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return static_cast<int64_t>(n);
}

Result<std::vector<TensorInfo>> ParseSafetensorsHeader(std::span<const uint8_t> file_prefix,
                                                       uint64_t file_size,
                                                       std::map<std::string, std::string>* metadata,
                                                       uint64_t* data_section_offset) {
  return ParseSafetensorsHeader(file_prefix, file_size, "<memory>", metadata, data_section_offset);
}

Result<std::vector<TensorInfo>> ParseSafetensorsHeader(std::span<const uint8_t> file_prefix,
                                                       uint64_t file_size,
                                                       const std::string& source,
                                                       std::map<std::string, std::string>* metadata,
                                                       uint64_t* data_section_offset) {
  const HeaderErrors errors(source);
  if (file_size < 8) {
    return errors.File("file is " + std::to_string(file_size) +
                       " bytes, shorter than the 8-byte header length");
  }
  if (file_prefix.size() < 8) return errors.File("prefix shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_prefix[i];
  if (header_len > kMaxHeaderBytes) {
    return errors.File("header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len > file_size - 8) {
    return errors.File("header length " + std::to_string(header_len) +
                       " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  }
  if (header_len > file_prefix.size() - 8) {
    return errors.File("only " + std::to_string(file_prefix.size()) + " bytes given for a " +
                       std::to_string(header_len) + "-byte header");
  }
  const uint64_t data_size = file_size - 8 - header_len;
  std::string_view text(reinterpret_cast<const char*>(file_prefix.data() + 8), header_len);

  JsonParseLimits limits;
  limits.max_depth = kMaxHeaderDepth;
  Result<json> parsed = ParseJsonText(text, "safetensors " + source + ": header", limits);
  if (!parsed.ok()) return parsed.status();
  const json& header = *parsed;
  if (!header.is_object()) return errors.File("header is not a JSON object");

  try {
    std::map<std::string, std::string> parsed_metadata;
    std::vector<TensorInfo> tensors;
    tensors.reserve(header.size());
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        DSINFER_RETURN_IF_ERROR(ParseMetadata(it.value(), errors, &parsed_metadata));
        continue;
      }
      DSINFER_ASSIGN_OR_RETURN(TensorInfo info,
                               ParseEntry(it.key(), it.value(), data_size, errors));
      tensors.push_back(std::move(info));
    }
    DSINFER_RETURN_IF_ERROR(CheckNoOverlap(tensors, errors));
    if (metadata != nullptr) *metadata = std::move(parsed_metadata);
    if (data_section_offset != nullptr) *data_section_offset = 8 + header_len;
    return tensors;
  } catch (const std::exception& e) {  // get<>() type errors cannot happen after the checks
    return errors.File(std::string("malformed header: ") + e.what());
  }
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  DSINFER_ASSIGN_OR_RETURN(file->file_, MappedFile::Open(path));
  DSINFER_ASSIGN_OR_RETURN(file->tensors_,
                           ParseSafetensorsHeader(file->file_->bytes(), file->file_->size(), path,
                                                  &file->metadata_, &file->data_offset_));
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->by_name_[file->tensors_[i].name] = i;
  return file;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

uint64_t SafetensorsFile::BulkTensorOffset() const {
  std::array<uint64_t, 64> bytes_at{};  // [file offset % 64] tensor bytes starting there
  for (const TensorInfo& info : tensors_)
    bytes_at[(data_offset_ + info.data_begin) % 64] += info.ByteSize();
  return static_cast<uint64_t>(std::max_element(bytes_at.begin(), bytes_at.end()) -
                               bytes_at.begin());
}

TensorRef SafetensorsFile::Ref(const TensorInfo& info) const {
  // Guards against a TensorInfo from another file, whose offsets were validated elsewhere.
  DSINFER_CHECK_MSG(
      info.data_begin <= info.data_end && info.data_end <= file_->size() - data_offset_,
      "TensorInfo '" + info.name + "' lies outside " + path());
  std::span<const uint8_t> bytes =
      file_->bytes().subspan(data_offset_ + info.data_begin, info.ByteSize());
  return {&info, bytes, &file_->path()};
}

}  // namespace dsinfer::io
