// SafetensorsWriter and WriteSafetensors.
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace dsinfer::io {
namespace {

std::string ErrnoText() { return std::strerror(errno); }

// JSON string literal for `text`; throws nlohmann::json::type_error on invalid UTF-8.
std::string JsonString(const std::string& text) { return nlohmann::json(text).dump(); }

}  // namespace

SafetensorsWriter::~SafetensorsWriter() {
  if (out_ != nullptr) std::fclose(out_);
}

Status SafetensorsWriter::Fail(Status status) {
  if (out_ != nullptr) std::fclose(out_);
  out_ = nullptr;
  state_ = State::kFailed;
  return status;
}

Status SafetensorsWriter::Declare(const std::string& name, DType dtype,
                                  std::vector<int64_t> shape) {
  const std::string what = "SafetensorsWriter: tensor '" + name + "'";
  if (state_ != State::kDeclaring) return FailedPrecondition(what + " declared after Begin()");
  if (name == "__metadata__") return InvalidArgument(what + ": reserved name");
  try {
    (void)JsonString(name);
  } catch (const std::exception&) {
    return InvalidArgument(what + ": name is not valid UTF-8");
  }
  if (declared_names_.count(name) != 0) return InvalidArgument(what + " declared twice");
  uint64_t n_bytes = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument(what + ": negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(n_bytes, static_cast<uint64_t>(d), &n_bytes)) {
      return InvalidArgument(what + ": byte size overflows 64 bits");
    }
  }
  uint64_t new_total = 0;
  if (__builtin_add_overflow(data_bytes_, n_bytes, &new_total)) {
    return InvalidArgument(what + ": total data size overflows 64 bits");
  }
  data_bytes_ = new_total;
  declared_names_.insert(name);
  pending_.push_back({name, dtype, std::move(shape), n_bytes});
  return Status::Ok();
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  if (state_ != State::kDeclaring) {
    metadata_after_begin_ = true;
    return;
  }
  metadata_[key] = value;
}

uint64_t SafetensorsWriter::DataBytes() const { return data_bytes_; }

Status SafetensorsWriter::Begin(const std::string& path) {
  if (state_ != State::kDeclaring) {
    return FailedPrecondition("SafetensorsWriter: Begin(" + path + ") called twice");
  }
  path_ = path;
  // Built by hand rather than through nlohmann::ordered_json, whose insertion is linear per key
  // (quadratic for a 100k-tensor shard). Layout matches ordered_json's compact dump().
  std::string header = "{";
  try {
    if (!metadata_.empty()) header += "\"__metadata__\":" + nlohmann::json(metadata_).dump();
  } catch (const std::exception&) {
    return Fail(InvalidArgument("SafetensorsWriter: metadata for " + path + " is not valid UTF-8"));
  }
  uint64_t offset = 0;
  for (const Pending& p : pending_) {
    if (header.size() > 1) header += ',';
    header += JsonString(p.name);  // validated in Declare
    header += ":{\"dtype\":\"";
    header += SafetensorsName(p.dtype);
    header += "\",\"shape\":[";
    for (size_t i = 0; i < p.shape.size(); ++i) {
      if (i > 0) header += ',';
      header += std::to_string(p.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + p.n_bytes) + "]}";
    offset += p.n_bytes;
  }
  header += '}';
  // Pad with spaces (valid trailing JSON whitespace) so the data section starts 8-byte aligned.
  while ((8 + header.size()) % 8 != 0) header += ' ';

  out_ = std::fopen(path.c_str(), "wb");
  if (out_ == nullptr) return Fail(IoError("cannot create " + path + ": " + ErrnoText()));
  uint8_t length_bytes[8];
  const uint64_t header_len = header.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(header_len >> (8 * i));
  if (std::fwrite(length_bytes, 1, 8, out_) != 8 ||
      std::fwrite(header.data(), 1, header.size(), out_) != header.size()) {
    return Fail(IoError("cannot write the header of " + path + ": " + ErrnoText()));
  }
  state_ = State::kWriting;
  next_ = 0;
  return Status::Ok();
}

Status SafetensorsWriter::Write(const std::string& name, std::span<const uint8_t> bytes) {
  if (state_ != State::kWriting) {
    return FailedPrecondition("SafetensorsWriter: Write('" + name +
                              "') outside Begin()..Finish() or after an error");
  }
  if (next_ >= pending_.size()) {
    return Fail(FailedPrecondition("SafetensorsWriter: '" + name + "' written to " + path_ +
                                   " after all declared tensors"));
  }
  const Pending& expected = pending_[next_];
  if (expected.name != name) {
    return Fail(FailedPrecondition("SafetensorsWriter: got '" + name + "' for " + path_ +
                                   ", expected '" + expected.name + "' (declaration order)"));
  }
  if (bytes.size() != expected.n_bytes) {
    return Fail(InvalidArgument("SafetensorsWriter: tensor '" + name + "' for " + path_ + " has " +
                                std::to_string(bytes.size()) + " bytes, declared " +
                                std::to_string(expected.n_bytes)));
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), out_) != bytes.size()) {
    return Fail(IoError("cannot write tensor '" + name + "' to " + path_ + ": " + ErrnoText()));
  }
  ++next_;
  return Status::Ok();
}

Status SafetensorsWriter::WriteZeros(const std::string& name) {
  if (state_ != State::kWriting || next_ >= pending_.size() || pending_[next_].name != name)
    return Write(name, {});  // the same errors as Write, in the same cases
  const uint64_t n = pending_[next_].n_bytes;
  if (n > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) ||
      ::fseeko(out_, static_cast<off_t>(n), SEEK_CUR) != 0)
    return Fail(IoError("cannot skip tensor '" + name + "' in " + path_ + ": " + ErrnoText()));
  ++next_;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (state_ != State::kWriting) {
    return FailedPrecondition("SafetensorsWriter: Finish() without a successful Begin()");
  }
  if (next_ != pending_.size()) {
    return Fail(FailedPrecondition("SafetensorsWriter: " + std::to_string(pending_.size() - next_) +
                                   " declared tensors were not written to " + path_ + " (next: '" +
                                   pending_[next_].name + "')"));
  }
  if (metadata_after_begin_) {
    return Fail(FailedPrecondition("SafetensorsWriter: SetMetadata() after Begin() for " + path_ +
                                   " (the header was already written)"));
  }
  // Buffered writes report a full disk only when flushed; fclose reports what fflush missed.
  if (std::fflush(out_) != 0) return Fail(IoError("cannot write " + path_ + ": " + ErrnoText()));
  // A trailing WriteZeros leaves the position past the end: extend the file to it (a hole).
  const off_t end = ::ftello(out_);
  if (end < 0 || ::ftruncate(::fileno(out_), end) != 0)
    return Fail(IoError("cannot size " + path_ + ": " + ErrnoText()));
  const int close_result = std::fclose(out_);
  out_ = nullptr;
  if (close_result != 0) return Fail(IoError("cannot close " + path_ + ": " + ErrnoText()));
  state_ = State::kFinished;
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer;
  for (const auto& [key, value] : metadata) writer.SetMetadata(key, value);
  for (const OwnedTensor& t : tensors) {
    DSINFER_RETURN_IF_ERROR(writer.Declare(t.name, t.dtype, t.shape));
  }
  // Check sizes before creating the file, so a caller's mistake leaves no partial file behind.
  // (Declare has already rejected shapes whose byte size overflows.)
  for (const OwnedTensor& t : tensors) {
    uint64_t want = DTypeSize(t.dtype);
    for (int64_t d : t.shape) want *= static_cast<uint64_t>(d);
    if (want != t.bytes.size()) {
      return InvalidArgument("WriteSafetensors(" + path + "): tensor '" + t.name + "' has " +
                             std::to_string(t.bytes.size()) + " bytes, its shape needs " +
                             std::to_string(want));
    }
  }
  DSINFER_RETURN_IF_ERROR(writer.Begin(path));
  for (const OwnedTensor& t : tensors) DSINFER_RETURN_IF_ERROR(writer.Write(t.name, t.bytes));
  return writer.Finish();
}

}  // namespace dsinfer::io
