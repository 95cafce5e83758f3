// KV-cache events for KV-aware routers: what the engine's prefix cache holds, published over a
// ZeroMQ PUB socket in the wire format of vLLM's ZmqEventPublisher, which vllm-router's kv_aware
// policy subscribes to (observed with vllm-router 0.1.17, docs/SERVER.md "Scale-out"):
//   multipart [topic, seq as 8-byte big-endian, payload]
//   payload = msgpack [ts (float64), [event, ...], data_parallel_rank (0)]
//   event   = msgpack map tagged by "type":
//     {"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
//      "lora_id", "medium", "lora_name"}
//     {"type": "BlockRemoved", "block_hashes", "medium"}
//     {"type": "AllBlocksCleared"}
// libzmq carries the frames and msgpack-c encodes the payload; nothing here writes wire bytes.
//
// dsinfer's prefix cache holds snapshots of whole prefixes rather than fixed-size blocks. A
// snapshot of L tokens serves any prompt that starts with those tokens, so it is announced as
// the blocks [0, L / block_size) of its prefix: a block is stored when the first snapshot that
// covers it arrives and removed when the last one goes. Block hashes chain the previous block's
// hash with the block's ids (64-bit; subscribers use them as opaque keys for parents and
// removals and hash the token ids themselves to match requests).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/prefix_cache.h"

namespace dsinfer::server {

struct KvEventOptions {
  // Where the PUB socket binds: "tcp://127.0.0.1:5557"; "tcp://HOST:*" picks a free port.
  std::string bind_endpoint;
  std::string topic;                  // first frame of every message (vLLM's default: empty)
  int block_size = 16;                // tokens per announced block (vllm-router's default)
  size_t max_queued_batches = 65536;  // beyond this, new batches are dropped (and counted)
};

class KvEventPublisher final : public runtime::PrefixCacheObserver {
 public:
  static Result<std::shared_ptr<KvEventPublisher>> Start(KvEventOptions options);
  ~KvEventPublisher() override;  // sends what is queued (up to 1 s), then closes the socket

  // The bound endpoint, with the port the system picked: what subscribers connect to.
  const std::string& endpoint() const { return endpoint_; }
  const KvEventOptions& options() const { return options_; }
  int64_t batches_dropped() const;

  // runtime::PrefixCacheObserver, on the engine thread: encode and queue, never block on I/O.
  void OnStored(std::span<const int32_t> prefix) override;
  void OnRemoved(std::span<const int32_t> prefix) override;
  void OnCleared() override;

 private:
  KvEventPublisher(KvEventOptions options, void* context, void* socket, std::string endpoint);
  // Chained hashes of the whole blocks of `prefix`.
  std::vector<uint64_t> BlockHashes(std::span<const int32_t> prefix) const;
  void Enqueue(std::vector<char> payload);
  void SendLoop();

  KvEventOptions options_;
  void* context_ = nullptr;  // zmq context
  void* socket_ = nullptr;   // ZMQ_PUB, used by the sender thread only
  std::string endpoint_;

  // Engine-thread state: how many cached snapshots cover each announced block.
  std::unordered_map<uint64_t, int> block_refs_;

  mutable std::mutex mu_;  // guards queue_, stopping_, dropped_
  std::condition_variable cv_;
  std::deque<std::vector<char>> queue_;  // encoded payloads, oldest first
  bool stopping_ = false;
  int64_t dropped_ = 0;
  std::thread sender_;
};

}  // namespace dsinfer::server
