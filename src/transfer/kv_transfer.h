// Prefill/decode KV transfer over UCX's ucp API (a side layer on core; the server uses it).
//
// The prefill worker Holds a sequence's exported state blob (model/state_layout.h) in memory
// registered with UCX (ucp_mem_map, its rkey packed) until the decode worker has pulled it or a
// deadline passes. The decode worker Pulls it with the descriptor the routers carried between
// them (kv_transfer_params): an active message asks the holder to keep the blob (it answers
// whether it still has it), a one-sided get (ucp_get_nbx) reads the bytes, the SHA-256 the
// holder computed is checked, and a last active message tells the holder to release the blob.
// The bulk bytes move only by the get; the active messages are 16 bytes each.
//
// Every UCX call runs on the agent's own thread (its worker progresses there, also serving the
// gets of remote pullers: TCP has no hardware one-sided access, so the holder's worker must
// progress). Hold / Pull / Stats are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsinfer::transfer {

// What the decode worker needs to pull one blob: travels as JSON in the routers' requests.
struct TransferDescriptor {
  std::string engine_id;       // the holder's --engine-id-like name (for logs and errors)
  std::string worker_address;  // the holder's packed ucp worker address, hex
  std::string rkey;            // the packed remote key of the blob's registration, hex
  uint64_t remote_address = 0;
  uint64_t length = 0;  // bytes
  std::string sha256;   // hex digest of the blob
  uint64_t handle = 0;  // the holder's id of the blob
};

struct TransferStats {
  int64_t held_blobs = 0;  // now
  int64_t held_bytes = 0;  // now
  int64_t holds_total = 0;
  int64_t released_pulled_total = 0;    // released when the puller said so
  int64_t released_deadline_total = 0;  // never pulled before the deadline
  int64_t pulls_total = 0;              // successful pulls
  int64_t pull_failures_total = 0;      // every failed pull, checksum mismatches included
  int64_t checksum_failures_total = 0;
  int64_t pulled_bytes_total = 0;
  double pull_seconds_total = 0.0;  // acquire + get + checksum of the successful pulls
};

struct TransferOptions {
  std::string engine_id = "dsinfer";
  // A held blob nobody pulls is released after this (a puller that acquired it gets as long
  // again from its acquire).
  std::chrono::milliseconds hold_deadline{std::chrono::seconds(60)};
  // How long a pull waits for the holder (acquire answer, get completion).
  std::chrono::milliseconds pull_timeout{std::chrono::seconds(30)};
  // Test hook: sees the pulled bytes before the checksum is checked (a test flips a byte).
  std::function<void(std::span<uint8_t>)> after_get_for_test;
};

class KvTransferAgent {
 public:
  // Initializes UCX (RMA + active messages + wakeup) and starts the agent's thread.
  static Result<std::unique_ptr<KvTransferAgent>> Create(TransferOptions options);
  ~KvTransferAgent();  // releases every held blob and stops the thread
  KvTransferAgent(const KvTransferAgent&) = delete;
  KvTransferAgent& operator=(const KvTransferAgent&) = delete;

  // Keeps `blob` (non-empty) registered until pulled or the deadline; returns its descriptor.
  Result<TransferDescriptor> Hold(std::vector<uint8_t> blob);
  // Reads the blob `d` describes from its holder and releases it there. Errors: NotFound (the
  // holder no longer has it), IoError (checksum mismatch; holder unreachable or too slow),
  // InvalidArgument (a malformed descriptor).
  Result<std::vector<uint8_t>> Pull(const TransferDescriptor& d);
  TransferStats Stats() const;

  struct Impl;

 private:
  explicit KvTransferAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsinfer::transfer
