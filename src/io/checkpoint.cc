// Checkpoint: a Hugging Face model directory (index + shards, or a single model.safetensors).
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "io/json_file.h"
#include "io/safetensors.h"

namespace dsinfer::io {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// 0 if `path` exists, else the errno of stat().
int StatError(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? 0 : errno;
}

// A shard must name a file directly inside the checkpoint directory: an index is as untrusted
// as the shards and must not make us map "/etc/..." or "../../elsewhere".
bool IsPlainFileName(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  auto checkpoint = std::unique_ptr<Checkpoint>(new Checkpoint());
  checkpoint->dir_ = dir;
  if (int error = StatError(dir); error != 0) {
    return NotFound("checkpoint directory " + dir + ": " + std::strerror(error));
  }
  const std::string index_path = JoinPath(dir, kIndexName);
  const int index_error = StatError(index_path);
  if (index_error == ENOENT) {
    const std::string single_path = JoinPath(dir, kSingleName);
    if (StatError(single_path) == ENOENT) {
      return NotFound("checkpoint " + dir + ": neither " + kIndexName + " nor " + kSingleName +
                      " exists");
    }
    DSINFER_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> single,
                             SafetensorsFile::Open(single_path));
    checkpoint->shards_.push_back(std::move(single));
    for (const TensorInfo& t : checkpoint->shards_[0]->tensors()) {
      checkpoint->index_[t.name] = {0, &t};
    }
    return checkpoint;
  }

  DSINFER_ASSIGN_OR_RETURN(nlohmann::json index, ReadJsonFile(index_path));
  if (!index.is_object()) return InvalidArgument(index_path + ": not a JSON object");
  auto metadata = index.find("metadata");
  if (metadata != index.end() && !metadata->is_object() && !metadata->is_null()) {
    return InvalidArgument(index_path + ": \"metadata\" is not an object");
  }
  auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object()) {
    return InvalidArgument(index_path + ": missing \"weight_map\" object");
  }
  if (weight_map->empty()) return InvalidArgument(index_path + ": \"weight_map\" is empty");

  // Validate every entry before mapping anything, then open each shard once (sorted order, so
  // errors are deterministic).
  std::map<std::string, std::string> shard_of_tensor;
  std::set<std::string> shard_names;
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    if (!it.value().is_string()) {
      return InvalidArgument(index_path + ": weight_map entry for tensor '" + it.key() +
                             "' is not a string");
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!IsPlainFileName(shard)) {
      return InvalidArgument(index_path + ": tensor '" + it.key() + "' names shard '" + shard +
                             "', which is not a plain file name inside " + dir);
    }
    shard_of_tensor[it.key()] = shard;
    shard_names.insert(shard);
  }
  std::map<std::string, size_t> shard_slot;
  for (const std::string& shard : shard_names) {
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(JoinPath(dir, shard));
    if (!file.ok()) {
      return file.status().WithContext("checkpoint " + dir + " (shard '" + shard + "' listed in " +
                                       kIndexName + ")");
    }
    shard_slot[shard] = checkpoint->shards_.size();
    checkpoint->shards_.push_back(std::move(file).value());
  }
  for (const auto& [tensor, shard] : shard_of_tensor) {
    const size_t slot = shard_slot.at(shard);
    const TensorInfo* info = checkpoint->shards_[slot]->Find(tensor);
    if (info == nullptr) {
      return NotFound(index_path + ": tensor '" + tensor + "' is mapped to shard '" + shard +
                      "', which does not contain it");
    }
    checkpoint->index_[tensor] = {slot, info};
  }
  for (const auto& [shard, slot] : shard_slot) {
    for (const TensorInfo& t : checkpoint->shards_[slot]->tensors()) {
      auto mapped = shard_of_tensor.find(t.name);
      if (mapped == shard_of_tensor.end()) {
        return InvalidArgument(index_path + ": shard '" + shard + "' holds tensor '" + t.name +
                               "', which the weight_map does not list");
      }
      if (mapped->second != shard) {
        return InvalidArgument(index_path + ": shard '" + shard + "' holds tensor '" + t.name +
                               "', which the weight_map assigns to shard '" + mapped->second + "'");
      }
    }
  }
  return checkpoint;
}

TensorRef Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return {};
  return shards_[it->second.first]->Ref(*it->second.second);
}

Status Checkpoint::AdviseRandomAccess(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return NotFound("no tensor '" + name + "' in " + dir_);
  const SafetensorsFile& shard = *shards_[it->second.first];
  const TensorRef ref = shard.Ref(*it->second.second);
  const auto offset = static_cast<uint64_t>(ref.bytes.data() - shard.mapped_file().bytes().data());
  return shard.mapped_file().AdviseRandom(offset, ref.bytes.size());
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& entry : index_) names.push_back(entry.first);
  return names;
}

uint64_t Checkpoint::TotalBytes() const {
  uint64_t total = 0;
  for (const auto& shard : shards_) total += shard->file_size();
  return total;
}

Status Checkpoint::CopyIntoMemory(const MemoryPlacement& placement) {
  for (const auto& shard : shards_) DSINFER_RETURN_IF_ERROR(shard->CopyIntoMemory(placement));
  return Status::Ok();
}

MappedFile::CopyStats Checkpoint::copy_stats() const {
  MappedFile::CopyStats sum;
  for (const auto& shard : shards_) {
    const MappedFile::CopyStats& stats = shard->mapped_file().copy_stats();
    sum.direct_bytes += stats.direct_bytes;
    sum.buffered_bytes += stats.buffered_bytes;
  }
  return sum;
}

bool Checkpoint::copied() const {
  for (const auto& shard : shards_)
    if (!shard->mapped_file().copied()) return false;
  return true;
}

}  // namespace dsinfer::io
