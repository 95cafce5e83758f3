#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

namespace dsinfer::io {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr int kMaxJsonDepth = 16;

Status HeaderError(const std::string& file, const std::string& what) {
  return InvalidArgument("safetensors " + file + ": " + what);
}

}  // namespace

int64_t TensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<std::vector<TensorInfo>> ParseSafetensorsHeader(std::span<const uint8_t> prefix, uint64_t file_size,
                                                      std::map<std::string, std::string>* metadata,
                                                      uint64_t* data_section_offset) {
  const std::string file = "<header>";
  if (prefix.size() < 8 || file_size < 8) return HeaderError(file, "file shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > kMaxHeaderBytes) return HeaderError(file, "header length " + std::to_string(n) + " exceeds 100 MB");
  if (n > file_size - 8 || n > prefix.size() - 8)
    return HeaderError(file, "header length " + std::to_string(n) + " runs past the end of the file");
  const uint64_t data_size = file_size - 8 - n;
  std::string_view text(reinterpret_cast<const char*>(prefix.data() + 8), n);

  bool duplicate = false, too_deep = false;
  std::string duplicate_key;
  std::vector<std::set<std::string>> keys_at_depth(kMaxJsonDepth + 2);
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth > kMaxJsonDepth) {
      too_deep = true;
      return false;
    }
    if (event == nlohmann::json::parse_event_t::object_start) {
      keys_at_depth[depth + 1].clear();
    } else if (event == nlohmann::json::parse_event_t::key) {
      auto& seen = keys_at_depth[depth];
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) {
        duplicate = true;
        if (duplicate_key.empty()) duplicate_key = key;
      }
    }
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  if (too_deep) return HeaderError(file, "header JSON nested too deeply");
  if (j.is_discarded()) return HeaderError(file, "header is not valid JSON");
  if (duplicate) return HeaderError(file, "duplicate key '" + duplicate_key + "' in header");
  if (!j.is_object()) return HeaderError(file, "header must be a JSON object");

  std::vector<TensorInfo> tensors;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return HeaderError(file, "__metadata__ must be an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return HeaderError(file, "__metadata__ value for '" + m.key() + "' is not a string");
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return HeaderError(file, "tensor '" + name + "': " + what); };
    if (!v.is_object()) return bad("entry is not an object");
    auto dt = v.find("dtype");
    auto shape = v.find("shape");
    auto offsets = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad("missing dtype");
    if (shape == v.end() || !shape->is_array()) return bad("missing shape");
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2) return bad("data_offsets must be [begin, end]");
    TensorInfo info;
    info.name = name;
    auto dtype = DTypeFromSafetensorsName(dt->get<std::string>());
    if (!dtype) return bad("unsupported dtype '" + dt->get<std::string>() + "'");
    info.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 62) || __builtin_mul_overflow(numel, dim, &numel) || numel > (1ull << 62))
        return bad("shape has too many elements");
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : *offsets)
      if (!o.is_number_unsigned()) return bad("data_offsets must be non-negative integers");
    info.data_begin = (*offsets)[0].get<uint64_t>();
    info.data_end = (*offsets)[1].get<uint64_t>();
    if (info.data_begin > info.data_end) return bad("data_offsets begin > end");
    if (info.data_end > data_size)
      return bad("data_offsets end " + std::to_string(info.data_end) + " is past the data section (" +
                 std::to_string(data_size) + " bytes)");
    uint64_t want = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(info.dtype)), &want) ||
        want != info.data_end - info.data_begin)
      return bad("byte size " + std::to_string(info.data_end - info.data_begin) + " does not match shape x dtype (" +
                 std::to_string(want) + ")");
    tensors.push_back(std::move(info));
  }
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->data_begin < sorted[i - 1]->data_end && sorted[i]->data_begin != sorted[i]->data_end &&
        sorted[i - 1]->data_begin != sorted[i - 1]->data_end)
      return HeaderError(file, "tensors '" + sorted[i - 1]->name + "' and '" + sorted[i]->name + "' overlap");
  if (data_section_offset) *data_section_offset = 8 + n;
  return tensors;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  DSINFER_ASSIGN_OR_RETURN(f->file_, MappedFile::Open(path));
  auto parsed = ParseSafetensorsHeader(f->file_->bytes(), f->file_->size(), &f->metadata_, &f->data_offset_);
  if (!parsed.ok()) {
    std::string msg = parsed.status().message();
    auto pos = msg.find("<header>");
    if (pos != std::string::npos) msg.replace(pos, 8, path);
    return Status(parsed.status().code(), msg);
  }
  f->tensors_ = std::move(parsed).value();
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->by_name_[f->tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

TensorRef SafetensorsFile::Ref(const TensorInfo& info) const {
  auto bytes = file_->bytes().subspan(data_offset_ + info.data_begin, info.data_end - info.data_begin);
  return {&info, bytes, &file_->path()};
}

// ---- Checkpoint -------------------------------------------------------------------------------

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  auto ck = std::unique_ptr<Checkpoint>(new Checkpoint());
  ck->dir_ = dir;
  std::string index_path = dir + "/model.safetensors.index.json";
  auto index_file = MappedFile::Open(index_path);
  if (!index_file.ok()) {
    // A single-file checkpoint.
    DSINFER_ASSIGN_OR_RETURN(auto single, SafetensorsFile::Open(dir + "/model.safetensors"));
    ck->shards_.push_back(std::move(single));
    for (const auto& t : ck->shards_[0]->tensors()) ck->index_[t.name] = {0, &t};
    return ck;
  }
  auto bytes = (*index_file)->bytes();
  if (bytes.size() > (64u << 20)) return InvalidArgument(index_path + ": index larger than 64 MiB");
  nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(index_path + ": malformed JSON");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) return InvalidArgument(index_path + ": missing weight_map object");
  std::map<std::string, size_t> shard_of_file;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) return InvalidArgument(index_path + ": weight_map['" + it.key() + "'] is not a string");
    std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos ||
        shard == "." || shard == "..")
      return InvalidArgument(index_path + ": shard name '" + shard + "' must be a plain file name in " + dir);
    if (!shard_of_file.count(shard)) {
      DSINFER_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(dir + "/" + shard));
      shard_of_file[shard] = ck->shards_.size();
      ck->shards_.push_back(std::move(f));
    }
    size_t si = shard_of_file[shard];
    const TensorInfo* info = ck->shards_[si]->Find(it.key());
    if (info == nullptr)
      return NotFound(index_path + ": tensor '" + it.key() + "' is listed in shard " + shard + " but not present there");
    ck->index_[it.key()] = {si, info};
  }
  return ck;
}

TensorRef Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return {};
  return shards_[it->second.first]->Ref(*it->second.second);
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : index_) names.push_back(name);
  return names;
}

uint64_t Checkpoint::TotalBytes() const {
  uint64_t total = 0;
  for (const auto& s : shards_) {
    for (const auto& t : s->tensors()) total += t.data_end - t.data_begin;
  }
  return total;
}

// ---- Writer -------------------------------------------------------------------------------------

Status SafetensorsWriter::Declare(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  if (out_ != nullptr) return FailedPrecondition("SafetensorsWriter: Declare after Begin");
  for (const auto& p : pending_)
    if (p.name == name) return InvalidArgument("SafetensorsWriter: duplicate tensor '" + name + "'");
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument("SafetensorsWriter: negative dimension in '" + name + "'");
    n *= static_cast<uint64_t>(d);
  }
  pending_.push_back({name, dtype, std::move(shape), n});
  return Status::Ok();
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

uint64_t SafetensorsWriter::DataBytes() const {
  uint64_t total = 0;
  for (const auto& p : pending_) total += p.n_bytes;
  return total;
}

Status SafetensorsWriter::Begin(const std::string& path) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& p : pending_) {
    header[p.name] = {{"dtype", std::string(SafetensorsName(p.dtype))}, {"shape", p.shape},
                      {"data_offsets", {offset, offset + p.n_bytes}}};
    offset += p.n_bytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // data section 8-byte aligned
  path_ = path;
  out_ = std::fopen(path.c_str(), "wb");
  if (out_ == nullptr) return IoError("cannot create " + path + ": " + std::strerror(errno));
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, out_) != 8 || std::fwrite(text.data(), 1, text.size(), out_) != text.size())
    return IoError("write failed for " + path + ": " + std::strerror(errno));
  next_ = 0;
  return Status::Ok();
}

Status SafetensorsWriter::Write(const std::string& name, std::span<const uint8_t> bytes) {
  if (out_ == nullptr) return FailedPrecondition("SafetensorsWriter: Write before Begin");
  if (next_ >= pending_.size() || pending_[next_].name != name)
    return FailedPrecondition("SafetensorsWriter: tensors must be written in declaration order (got '" + name + "')");
  if (bytes.size() != pending_[next_].n_bytes)
    return InvalidArgument("SafetensorsWriter: '" + name + "' has " + std::to_string(bytes.size()) +
                           " bytes, declared " + std::to_string(pending_[next_].n_bytes));
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), out_) != bytes.size())
    return IoError("write failed for " + path_ + ": " + std::strerror(errno));
  ++next_;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (out_ == nullptr) return FailedPrecondition("SafetensorsWriter: Finish before Begin");
  if (next_ != pending_.size()) {
    std::fclose(out_);
    out_ = nullptr;
    return FailedPrecondition("SafetensorsWriter: " + std::to_string(pending_.size() - next_) +
                              " declared tensors were not written to " + path_);
  }
  bool ok = std::fflush(out_) == 0;
  ok = (std::fclose(out_) == 0) && ok;
  out_ = nullptr;
  if (!ok) return IoError("cannot finish " + path_ + ": " + std::strerror(errno));
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w;
  for (const auto& [k, v] : metadata) w.SetMetadata(k, v);
  for (const auto& t : tensors) DSINFER_RETURN_IF_ERROR(w.Declare(t.name, t.dtype, t.shape));
  DSINFER_RETURN_IF_ERROR(w.Begin(path));
  for (const auto& t : tensors) DSINFER_RETURN_IF_ERROR(w.Write(t.name, t.bytes));
  return w.Finish();
}

}  // namespace dsinfer::io
