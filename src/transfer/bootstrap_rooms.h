// sglang-router's prefill/decode hand-over (--pd-disaggregation): the router sends the same
// request to a prefill and a decode worker at once, both tagged with a bootstrap_room (a random
// 63-bit number), and nothing carries the prefill worker's answer to the decode worker. The
// prefill worker therefore publishes the descriptor of the state it holds (or the reason it has
// none) under the room, and the decode worker fetches it from there (server/disaggregation.cc
// serves and fetches it over HTTP).
//
// A room is taken once: the first Take gets it and removes it. An entry nobody takes is dropped
// after `ttl` (the held blob itself is released by KvTransferAgent's own deadline). Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "core/status.h"
#include "transfer/kv_transfer.h"

namespace dsinfer::transfer {

// What a room holds: the descriptor (nullopt: the prompt was too short to have a state, nothing
// travels) or the prefill worker's error.
using RoomEntry = Result<std::optional<TransferDescriptor>>;

struct BootstrapRoomStats {
  int64_t waiting_rooms = 0;  // published, not yet taken (now)
  int64_t published_total = 0;
  int64_t taken_total = 0;
  int64_t expired_total = 0;  // published, never taken before the ttl
};

class BootstrapRooms {
 public:
  using Clock = std::chrono::steady_clock;
  explicit BootstrapRooms(std::chrono::milliseconds ttl) : ttl_(ttl) {}

  // Publishes `entry` under `room`, waking a Take waiting for it. InvalidArgument when the room
  // is already published and not taken (two requests with one room: the second is refused).
  Status Publish(uint64_t room, RoomEntry entry);
  // Waits until `room` is published or `deadline`; takes it. nullopt at the deadline.
  std::optional<RoomEntry> Take(uint64_t room, Clock::time_point deadline);
  BootstrapRoomStats Stats() const;

 private:
  void DropExpiredLocked(Clock::time_point now);

  struct Published {
    RoomEntry entry;
    Clock::time_point expires;
  };
  const std::chrono::milliseconds ttl_;
  mutable std::mutex mu_;
  std::condition_variable published_cv_;
  std::map<uint64_t, Published> rooms_;  // guarded by mu_
  BootstrapRoomStats stats_;             // guarded by mu_ (waiting_rooms computed)
};

}  // namespace dsinfer::transfer
