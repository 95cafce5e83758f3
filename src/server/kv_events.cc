#include "server/kv_events.h"

#include <msgpack.h>
#include <zmq.h>

#include <chrono>
#include <cstring>
#include <string_view>

namespace dsinfer::server {
namespace {

// splitmix64's finalizer over (previous hash, token): every id of the block and the whole
// prefix before it feed the block's hash.
uint64_t Mix(uint64_t h, uint64_t v) {
  uint64_t x = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// msgpack-c writes through this; the payload grows in a std::vector owned by the caller.
int AppendToVector(void* data, const char* buf, size_t len) {
  auto* out = static_cast<std::vector<char>*>(data);
  out->insert(out->end(), buf, buf + len);
  return 0;
}

class Packer {
 public:
  Packer() { msgpack_packer_init(&pk_, &bytes_, AppendToVector); }
  void Array(size_t n) { msgpack_pack_array(&pk_, n); }
  void Map(size_t n) { msgpack_pack_map(&pk_, n); }
  void Str(std::string_view s) {
    msgpack_pack_str(&pk_, s.size());
    msgpack_pack_str_body(&pk_, s.data(), s.size());
  }
  void Uint(uint64_t v) { msgpack_pack_uint64(&pk_, v); }
  void Int(int64_t v) { msgpack_pack_int64(&pk_, v); }
  void Double(double v) { msgpack_pack_double(&pk_, v); }
  void Nil() { msgpack_pack_nil(&pk_); }
  std::vector<char> Take() { return std::move(bytes_); }

 private:
  std::vector<char> bytes_;
  msgpack_packer pk_;
};

// [ts, [one event], data_parallel_rank]: the batch header every payload shares.
void BeginBatch(Packer& p) {
  p.Array(3);
  p.Double(UnixSeconds());
  p.Array(1);
}
void EndBatch(Packer& p) { p.Int(0); }

// vLLM names the tier its scheduler computes from "GPU"; vllm-router credits other media
// (host, external, disk) at a discount, so dsinfer's cache, which the engine restores from
// directly on whatever device it runs, reports that tier.
constexpr std::string_view kMedium = "GPU";

}  // namespace

Result<std::shared_ptr<KvEventPublisher>> KvEventPublisher::Start(KvEventOptions options) {
  if (options.block_size < 1) return InvalidArgument("KV events: block size must be >= 1");
  if (options.bind_endpoint.empty()) return InvalidArgument("KV events: no endpoint to bind");
  void* context = zmq_ctx_new();
  if (context == nullptr) return Internal(std::string("zmq_ctx_new: ") + zmq_strerror(zmq_errno()));
  void* socket = zmq_socket(context, ZMQ_PUB);
  if (socket == nullptr) {
    zmq_ctx_term(context);
    return Internal(std::string("zmq_socket: ") + zmq_strerror(zmq_errno()));
  }
  const int linger_ms = 1000;  // what is still queued at shutdown gets this long to leave
  const int hwm = 100000;      // vLLM's default high-water mark
  zmq_setsockopt(socket, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
  zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  if (zmq_bind(socket, options.bind_endpoint.c_str()) != 0) {
    std::string error = zmq_strerror(zmq_errno());
    zmq_close(socket);
    zmq_ctx_term(context);
    return InvalidArgument("KV events: cannot bind " + options.bind_endpoint + ": " + error);
  }
  char bound[256] = {};
  size_t bound_len = sizeof(bound);
  zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, bound, &bound_len);
  auto publisher = std::shared_ptr<KvEventPublisher>(
      new KvEventPublisher(std::move(options), context, socket, bound));
  KvEventPublisher* p = publisher.get();
  publisher->sender_ = std::thread([p] { p->SendLoop(); });
  return publisher;
}

KvEventPublisher::KvEventPublisher(KvEventOptions options, void* context, void* socket,
                                   std::string endpoint)
    : options_(std::move(options)),
      context_(context),
      socket_(socket),
      endpoint_(std::move(endpoint)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  zmq_close(socket_);
  zmq_ctx_term(context_);
}

int64_t KvEventPublisher::batches_dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

std::vector<uint64_t> KvEventPublisher::BlockHashes(std::span<const int32_t> prefix) const {
  const size_t block = static_cast<size_t>(options_.block_size);
  std::vector<uint64_t> hashes;
  hashes.reserve(prefix.size() / block);
  uint64_t h = 0x243f6a8885a308d3ull;
  for (size_t start = 0; start + block <= prefix.size(); start += block) {
    for (size_t i = start; i < start + block; ++i) h = Mix(h, static_cast<uint32_t>(prefix[i]));
    h = Mix(h, block);  // closes the block, so [a b][c d] and [a b c d] never share a hash
    hashes.push_back(h);
  }
  return hashes;
}

void KvEventPublisher::OnStored(std::span<const int32_t> prefix) {
  const std::vector<uint64_t> hashes = BlockHashes(prefix);
  // Blocks covered by an earlier snapshot come first along the chain (every snapshot that
  // covers block j + 1 covers block j), so the new ones are a suffix.
  size_t first_new = hashes.size();
  for (size_t j = 0; j < hashes.size(); ++j)
    if (block_refs_[hashes[j]]++ == 0 && first_new == hashes.size()) first_new = j;
  if (first_new == hashes.size()) return;
  const size_t block = static_cast<size_t>(options_.block_size);
  Packer p;
  BeginBatch(p);
  p.Map(8);
  p.Str("type");
  p.Str("BlockStored");
  p.Str("block_hashes");
  p.Array(hashes.size() - first_new);
  for (size_t j = first_new; j < hashes.size(); ++j) p.Uint(hashes[j]);
  p.Str("parent_block_hash");
  if (first_new == 0)
    p.Nil();
  else
    p.Uint(hashes[first_new - 1]);
  p.Str("token_ids");
  p.Array((hashes.size() - first_new) * block);
  for (size_t i = first_new * block; i < hashes.size() * block; ++i)
    p.Uint(static_cast<uint32_t>(prefix[i]));
  p.Str("block_size");
  p.Uint(block);
  p.Str("lora_id");
  p.Nil();
  p.Str("medium");
  p.Str(kMedium);
  p.Str("lora_name");
  p.Nil();
  EndBatch(p);
  Enqueue(p.Take());
}

void KvEventPublisher::OnRemoved(std::span<const int32_t> prefix) {
  const std::vector<uint64_t> hashes = BlockHashes(prefix);
  std::vector<uint64_t> gone;
  for (uint64_t h : hashes) {
    auto it = block_refs_.find(h);
    if (it == block_refs_.end()) continue;  // announced before a clear: already gone
    if (--it->second == 0) {
      gone.push_back(h);
      block_refs_.erase(it);
    }
  }
  if (gone.empty()) return;
  Packer p;
  BeginBatch(p);
  p.Map(3);
  p.Str("type");
  p.Str("BlockRemoved");
  p.Str("block_hashes");
  p.Array(gone.size());
  for (uint64_t h : gone) p.Uint(h);
  p.Str("medium");
  p.Str(kMedium);
  EndBatch(p);
  Enqueue(p.Take());
}

void KvEventPublisher::OnCleared() {
  block_refs_.clear();
  Packer p;
  BeginBatch(p);
  p.Map(1);
  p.Str("type");
  p.Str("AllBlocksCleared");
  EndBatch(p);
  Enqueue(p.Take());
}

void KvEventPublisher::Enqueue(std::vector<char> payload) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= options_.max_queued_batches) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(payload));
  }
  cv_.notify_one();
}

void KvEventPublisher::SendLoop() {
  uint64_t seq = 0;
  for (;;) {
    std::vector<char> payload;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and nothing left
      payload = std::move(queue_.front());
      queue_.pop_front();
    }
    unsigned char seq_bytes[8];
    for (int i = 0; i < 8; ++i) seq_bytes[i] = static_cast<unsigned char>(seq >> (56 - 8 * i));
    ++seq;
    // A PUB socket never blocks a send: past the high-water mark a slow subscriber loses
    // messages, which vLLM's subscribers detect by the sequence number.
    zmq_send(socket_, options_.topic.data(), options_.topic.size(), ZMQ_SNDMORE);
    zmq_send(socket_, seq_bytes, sizeof(seq_bytes), ZMQ_SNDMORE);
    zmq_send(socket_, payload.data(), payload.size(), 0);
  }
}

}  // namespace dsinfer::server
