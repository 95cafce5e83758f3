#include "transfer/bootstrap_rooms.h"

#include <string>
#include <utility>

namespace dsinfer::transfer {

void BootstrapRooms::DropExpiredLocked(Clock::time_point now) {
  for (auto it = rooms_.begin(); it != rooms_.end();) {
    if (it->second.expires <= now) {
      it = rooms_.erase(it);
      ++stats_.expired_total;
    } else {
      ++it;
    }
  }
}

Status BootstrapRooms::Publish(uint64_t room, RoomEntry entry) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    DropExpiredLocked(now);
    if (rooms_.count(room) != 0)
      return InvalidArgument(
          "bootstrap_room " + std::to_string(room) +
          " is already published and not yet taken (each request needs its own room)");
    rooms_.emplace(room, Published{std::move(entry), now + ttl_});
    ++stats_.published_total;
  }
  published_cv_.notify_all();
  return Status::Ok();
}

std::optional<RoomEntry> BootstrapRooms::Take(uint64_t room, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    DropExpiredLocked(Clock::now());
    if (auto it = rooms_.find(room); it != rooms_.end()) {
      RoomEntry entry = std::move(it->second.entry);
      rooms_.erase(it);
      ++stats_.taken_total;
      return entry;
    }
    if (published_cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        rooms_.count(room) == 0)
      return std::nullopt;
  }
}

BootstrapRoomStats BootstrapRooms::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BootstrapRoomStats s = stats_;
  s.waiting_rooms = static_cast<int64_t>(rooms_.size());
  return s;
}

}  // namespace dsinfer::transfer
